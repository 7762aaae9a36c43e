"""Leases: daemons on many hosts sharing one PostgreSQL store, at most one agent per task.

Each daemon has a host id (``daemon.host``; ``$HEARTBEAT_HOST`` wins; default the
hostname). Liveness is local: only the daemon on the host that runs an agent judges it
(alive, exited, hung); the others see its task as *held by host H* and leave it alone for
as long as H's lease on it lasts. The lease lives in the task's row (``owner_host``,
``lease_expires``, in database time, so the hosts' clocks do not matter):

- **claim** (:meth:`Lease.claim`): the daemon takes the tasks it decided to dispatch with
  one ``SELECT ... FOR UPDATE SKIP LOCKED`` (two daemons never wait on, nor take, the same
  row) limited to its free capacity and to the tasks whose ``host_labels`` it offers
  (``daemon.labels``); it records itself as the owner host with a lease of ``lease_ttl``.
  The dispatch write that follows is still compare-and-set on the revision: the claim
  spreads the work, the revision and the epoch keep it single.
- **renew** (:meth:`Lease.renew`): every renewal tick, one statement renews the leases of
  every task this host supervises (fenced on its epoch and owner host) and this host's row
  in ``heartbeat_hosts``. A supervised task whose lease did not renew has been taken over:
  its agent is fenced (its writes are refused, exit 5) and is stopped here, with nothing
  written for it.
- **take over** (:meth:`Lease.take_over`): a task owned by an agent whose host's lease
  expired is taken by another daemon, within its capacity and labels, in one transaction:
  the epoch moves on (the old agent is fenced at once), the owner is cleared, the row's
  lease becomes this host's and the ledger says ``taken_over`` (from which host, the
  lease's age). The daemon's usual decision then dispatches it here.
- A daemon that cannot renew (the database is unreachable) dispatches nothing and takes
  nothing over; when its own leases are about to expire unrenewed it stops its agents
  (nobody may assume them alive any longer: another host will take their tasks); it says
  so once when the database goes away and once when it is back.

The file store has one host and needs none of this: the daemon builds a :class:`Lease`
only on a store that offers leases (:func:`for_store`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat import defaults
from heartbeat.baton import Baton, Owner, host_labels
from heartbeat.errors import HeartbeatError, StoreError
from heartbeat.ledger import EventKind
from heartbeat.store.base import SharedStore

if TYPE_CHECKING:
    from heartbeat.store.base import Entry
    from heartbeat.store.postgres import PostgresStore

__all__ = ["HostRow", "Lease", "LeaseRow", "TakenOver", "for_store", "host_labels", "lease_rows", "list_hosts",
           "resolve_host"]


def resolve_host(configured: str = "") -> str:
    """This daemon's host id: ``$HEARTBEAT_HOST``, else ``daemon.host``, else the hostname."""
    import socket

    return os.environ.get(defaults.HOST_ENV, "").strip() or configured.strip() or socket.gethostname()


@dataclass(frozen=True)
class TakenOver:
    """One task this daemon took over from a host whose lease expired."""

    task: str
    from_host: str
    lease_age: float
    """Seconds since the old host last renewed the lease."""
    epoch: int
    """The task's new epoch (the old agent's writes are refused from now on)."""


@dataclass(frozen=True)
class HostRow:
    """One daemon as ``heartbeat hosts`` shows it."""

    host: str
    pid: int
    labels: tuple[str, ...]
    capacity: int
    running: int
    lease_ttl: float
    started_at: datetime
    renewed_at: datetime
    stopped_at: datetime | None
    age: float
    """Seconds since its last renewal (database time)."""

    @property
    def state(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        return "live" if self.age <= self.lease_ttl else "lost"


@dataclass(frozen=True)
class LeaseRow:
    """A task's lease as ``heartbeat status`` shows it."""

    host: str
    left: float | None
    """Seconds until the lease expires (negative: expired, its agent not yet taken over); None when
    no lease is held (none was ever renewed, or it lapsed on a task with no agent)."""


def _fetch(store: PostgresStore, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    """The rows of one statement run in a transaction of its own (committed: a write sticks)."""
    with store._conn() as conn:
        rows = conn.execute(sql, params).fetchall()
        conn.commit()
    return rows


def list_hosts(store: PostgresStore) -> list[HostRow]:
    """Every daemon that ever renewed on this database, most recently renewed first."""
    rows = _fetch(
        store,
        "SELECT host, pid, labels, capacity, running, lease_ttl, started_at, renewed_at, stopped_at, "
        "extract(epoch FROM now() - renewed_at)::float8 FROM heartbeat_hosts ORDER BY renewed_at DESC, host",
    )
    return [HostRow(host=r[0], pid=r[1], labels=tuple(r[2]), capacity=r[3], running=r[4], lease_ttl=r[5],
                    started_at=r[6], renewed_at=r[7], stopped_at=r[8], age=max(0.0, r[9])) for r in rows]


def lease_rows(store: PostgresStore) -> dict[str, LeaseRow]:
    """Task id -> its owner host and lease, for every task that has a host."""
    rows = _fetch(
        store,
        "SELECT id, owner_host, CASE WHEN owned OR lease_expires > now() "
        "THEN extract(epoch FROM lease_expires - now())::float8 END FROM heartbeat_batons WHERE owner_host <> ''",
    )
    return {r[0]: LeaseRow(host=r[1], left=r[2]) for r in rows}


def for_store(store: Any) -> bool:
    """Whether ``store`` is shared between hosts (and so needs leases): the PostgreSQL store."""
    return isinstance(store, SharedStore)


_RENEW = """
WITH host AS (
    INSERT INTO heartbeat_hosts AS h (host, pid, labels, capacity, running, lease_ttl, started_at, renewed_at)
    VALUES (%(me)s, %(pid)s, %(labels)s, %(capacity)s, %(running)s, %(ttl)s, %(started)s, now())
    ON CONFLICT (host) DO UPDATE SET pid = EXCLUDED.pid, labels = EXCLUDED.labels, capacity = EXCLUDED.capacity,
        running = EXCLUDED.running, lease_ttl = EXCLUDED.lease_ttl, started_at = EXCLUDED.started_at,
        renewed_at = now(), stopped_at = NULL
    WHERE (h.pid = EXCLUDED.pid AND h.started_at = EXCLUDED.started_at)
       OR (%(take)s AND h.renewed_at IS NOT DISTINCT FROM %(seen)s::timestamptz)
    RETURNING 1
), renewed AS (
    UPDATE heartbeat_batons b
    SET lease_expires = now() + %(ttl)s * interval '1 second', lease_renewed = now()
    FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS s(id, epoch)
    WHERE b.id = s.id AND (s.epoch IS NULL OR b.epoch = s.epoch) AND b.owner_host = %(me)s
      AND EXISTS (SELECT 1 FROM host)
    RETURNING b.id
)
SELECT EXISTS (SELECT 1 FROM host), array(SELECT id FROM renewed)
"""
"""Renew this daemon's host row and its tasks' leases, in one statement. The host row is this
daemon's only while it holds this daemon's identity (pid and start time): once another daemon
with the same host id took the row over, nothing renews and this daemon stands down. ``take``
(the first renewal, after :meth:`Lease.take_host`) takes the row over, compare-and-set on the
``renewed_at`` last seen."""

_HOST_ROW = """
SELECT pid, started_at, renewed_at, stopped_at, lease_ttl, extract(epoch FROM now() - renewed_at)::float8
FROM heartbeat_hosts WHERE host = %(me)s
"""

_CLAIM = """
WITH c AS (
    SELECT id FROM heartbeat_batons
    WHERE id = ANY(%(ids)s::text[]) AND status = 'active' AND NOT owned
      AND (lease_expires IS NULL OR lease_expires < now() OR owner_host = %(me)s)
      AND host_labels <@ %(labels)s::text[]
    ORDER BY array_position(%(ids)s::text[], id)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE heartbeat_batons b
SET owner_host = %(me)s, lease_expires = now() + %(ttl)s * interval '1 second', lease_renewed = now()
FROM c WHERE b.id = c.id
RETURNING b.id
"""

_EXPIRED = """
SELECT id, body, owner_host, extract(epoch FROM now() - coalesce(lease_renewed, lease_expires))::float8
FROM heartbeat_batons
WHERE owned AND owner_host <> %(me)s AND lease_expires < now() AND host_labels <@ %(labels)s::text[]
ORDER BY lease_expires
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""


class Lease:
    """One daemon's leases on a shared store. See the module docstring.

    ``stop_agent(task_id, epoch, owner)`` stops a fenced agent of this host without writing
    anything (the daemon passes its launchers' ``stop``). Thread-safe: the renewal runs in a
    job of its own, beside the daemon's pass.
    """

    def __init__(self, store: PostgresStore, *, host: str, labels: Sequence[str], ttl: float, capacity: int,
                 interval: float, log: Any, stop_agent: Callable[[str, int, Owner], None],
                 on_stood_down: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.host = host
        self.labels = sorted(set(labels))
        self.ttl = ttl
        self.capacity = capacity
        self.interval = interval
        self.log = log
        self.stop_agent = stop_agent
        self.on_stood_down = on_stood_down
        """Called once (from the thread that found it) when this daemon stands down."""
        self.started = datetime.now().astimezone()
        """With the pid, this daemon's identity in its host's row of ``heartbeat_hosts``."""
        self.stood_down = False
        """Another daemon with this host id took the host's row: this one acts no more."""
        self._take: tuple[bool, datetime | None] = (False, None)
        """(take the host's row over, the ``renewed_at`` it must still hold): set by :meth:`take_host`."""
        self._lock_state = "held"
        self._taking = False
        self._lock = threading.Lock()
        self._supervised: dict[str, tuple[int | None, Owner | None]] = {}
        """Task id -> (epoch, owner) of this host's agents; (None, None) for a task claimed and not yet dispatched."""
        self._renewed_at: float | None = None
        """Monotonic time at which the last successful renewal *started* (its leases last ttl from after it)."""
        self._unreachable = False
        self._attempt: float | None = None
        """Monotonic start of the renewal in flight (None: none is)."""
        self._fenced_all = False
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    # -- what this host supervises ------------------------------------------------------

    def observe(self, entries: Iterable[Entry]) -> None:
        """After a full scan: the tasks whose agent this host runs are the ones it renews."""
        if not self.acting():  # (a pass resumed after a pause: its scan may be older than the pause)
            return
        found: dict[str, tuple[int | None, Owner | None]] = {}
        for entry in entries:
            baton = entry.baton
            if baton is not None and baton.meta.owner is not None and baton.meta.owner.host == self.host:
                found[entry.id] = (baton.meta.epoch, baton.meta.owner)
        with self._lock:
            moved = {t: v for t, v in self._supervised.items() if t not in found}
            self._supervised = found
        # A task that left this host since the last scan: ended (its agent is gone) or taken
        # over (its agent is fenced). Renew would miss it now, so judge it here.
        for task_id, (epoch, owner) in moved.items():
            self._fence(task_id, epoch, owner, why="the task moved on to another epoch or host")

    def supervise(self, task_id: str, epoch: int, owner: Owner) -> None:
        """A dispatch of this host: renew its lease from now on."""
        with self._lock:
            self._supervised[task_id] = (epoch, owner)

    def running(self) -> int:
        with self._lock:
            return len(self._supervised)

    # -- renewal -------------------------------------------------------------------------

    def renew(self, running: int | None = None) -> bool:
        """One statement: renew this host's row and the lease of every task it supervises.

        Returns True when the database answered and the host's row is still this daemon's. A
        supervised task whose lease did not renew has moved on (taken over): its agent is
        stopped, nothing written for it. A host row that another daemon took makes this one
        stand down (:meth:`_stand_down`).
        """
        if self.stood_down:
            return False
        self._keep_lock()
        with self._lock:
            supervised = dict(self._supervised)
        ids = list(supervised)
        started = time.monotonic()
        self._attempt = started
        take, seen = self._take
        params = {"me": self.host, "pid": os.getpid(), "labels": self.labels, "capacity": self.capacity,
                  "running": len(supervised) if running is None else running, "ttl": self.ttl,
                  "started": self.started, "ids": ids, "epochs": [supervised[i][0] for i in ids],
                  "take": take, "seen": seen}
        try:
            rows = _fetch(self.store, _RENEW, params)
        except HeartbeatError as exc:
            self.unreachable(exc)
            return False
        finally:
            self._attempt = None
        held, renewed_ids = rows[0] if rows else (False, [])
        if not held:
            self._stand_down()
            return False
        self._take = (False, None)
        renewed = set(renewed_ids)
        with self._lock:
            self._renewed_at = started
            self._fenced_all = False
        if self._unreachable:
            self._unreachable = False
            self.log.info("store_reachable", host=self.host, renewed=len(renewed),
                          hint="leases renewed; dispatching again")
        for task_id in ids:
            if task_id not in renewed:
                with self._lock:
                    current = self._supervised.get(task_id)
                    if current != supervised[task_id]:
                        continue  # re-dispatched meanwhile: the newer epoch is renewed next time
                    del self._supervised[task_id]
                epoch, owner = supervised[task_id]
                self._fence(task_id, epoch, owner, why="its lease did not renew: another host holds the task")
        return True

    def healthy(self) -> bool:
        """Whether this daemon's leases are safely held: renewed recently enough to act on."""
        with self._lock:
            at = self._renewed_at
        return at is not None and not self._unreachable and not self.stood_down \
            and time.monotonic() < at + self._fence_after()

    def acting(self) -> bool:
        """Whether this daemon may act on its host's tasks at all: it holds the host's row (renewing
        first when the last renewal is older than the renewal interval, as after a pause)."""
        if self.stood_down:
            return False
        with self._lock:
            at = self._renewed_at
        if at is None or time.monotonic() - at > self.interval:
            self.renew()
        return not self.stood_down and not self._take[0]

    # -- the host's identity ---------------------------------------------------------------

    def take_host(self, *, sleep: Callable[[float], None] = time.sleep) -> None:
        """Become the daemon of this host id, before acting (the first renewal).

        The host's row in ``heartbeat_hosts`` says which daemon is the host: its pid and start
        time. A row that is free (none, stopped, older than its ``lease_ttl``) is taken at once.
        A row another daemon renewed recently may be a daemon that died a moment ago, or a live
        one whose lock connection died (the advisory lock of :meth:`PostgresStore.claim_daemon`
        was free for us): wait, and refuse (:class:`StoreError`) as soon as it is renewed again,
        or take it once it is ``lease_ttl`` old (by then a live daemon that could not renew has
        stopped its agents, as any host does).
        """
        first: datetime | None = None
        while True:
            rows = _fetch(self.store, _HOST_ROW, {"me": self.host})
            row = rows[0] if rows else None
            if row is not None:
                pid, started_at, renewed_at, stopped_at, ttl, age = row
                mine = pid == os.getpid() and started_at == self.started
                if stopped_at is None and not mine and age <= ttl:
                    if first is None:
                        first = renewed_at
                        self.log.warning("host_busy", host=self.host, pid=pid, renewed_s_ago=round(age, 1),
                                         wait_s=round(ttl - age, 1),
                                         reason="another daemon with this host id renewed the host's row "
                                                "recently: waiting until it is lease_ttl old; refused if "
                                                "it renews")
                    elif renewed_at != first:
                        raise self._refusal(pid, age)
                    sleep(max(0.05, min(1.0, ttl / 20)))
                    continue
            self._take = (True, row[2] if row is not None else None)
            self._taking = True
            try:
                self.renew()  # (the database out of reach: the renewal job takes the row later)
            finally:
                self._taking = False
            if self.stood_down:  # renewed by its daemon between our look and our take
                raise self._refusal(row[0] if row is not None else 0, 0.0)
            return

    def _refusal(self, pid: int, age: float) -> StoreError:
        return StoreError(
            f"another heartbeat daemon with host id {self.host!r} (pid {pid}) is running on the database "
            f"{self.store.label}: it renewed the host's lease {age:.1f}s ago; give each daemon its own "
            "daemon.host (or $HEARTBEAT_HOST)")

    def _stand_down(self) -> None:
        """Another daemon with this host id took the host's row: act no more. An agent whose task is
        still at the epoch this daemon started it in is left alone (the successor supervises it); one
        whose task moved on meanwhile is fenced, supervised by nobody: it is stopped, as any host
        stops its fenced agents. Nothing is written."""
        with self._lock:
            if self.stood_down:
                return
            self.stood_down = True
            self._fenced_all = True
            left = dict(self._supervised)
            self._supervised.clear()
        if self._taking:
            return  # take_host refuses with one line
        self.log.error("host_taken", host=self.host, pid=os.getpid(), tasks=sorted(left),
                       reason="another daemon with this host id took the host's row: this daemon stops "
                              "acting, leaves its agents to that daemon and exits")
        self._fence_moved(left)
        self.on_stood_down()

    def _fence_moved(self, left: dict[str, tuple[int | None, Owner | None]]) -> None:
        ids = [task_id for task_id, (epoch, _) in left.items() if epoch is not None]
        if not ids:
            return
        try:
            rows = _fetch(self.store, "SELECT id, epoch FROM heartbeat_batons WHERE id = ANY(%(ids)s)", {"ids": ids})
        except HeartbeatError:
            return  # not known: never stop an agent on a guess
        current = {r[0]: int(r[1]) for r in rows}
        for task_id in ids:
            epoch, owner = left[task_id]
            if task_id in current and current[task_id] != epoch:
                self._fence(task_id, epoch, owner, why="the task moved on while this daemon was displaced",
                            standing_down=True)

    def _keep_lock(self) -> None:
        """Re-check the database lock of this host id; say once when it is lost and when it is back."""
        state = self.store.keep_daemon_lock()
        if state == "lost" and self._lock_state != "lost":
            self.log.warning("host_lock_lost", host=self.host,
                             hint="its database connection ended and the lock could not be taken back: "
                                  "this daemon goes on while the host's row is its own, and retries")
        elif state == "retaken":
            self.log.info("host_lock_retaken", host=self.host, hint="its database connection had ended")
        if state:
            self._lock_state = state

    def _fence_after(self) -> float:
        """Seconds after a renewal's start at which this host treats its leases as gone: one
        renewal interval before they expire in the database, so its agents stop before another
        host may take their tasks over."""
        return max(self.ttl / 2, self.ttl - self.interval)

    def unreachable(self, exc: BaseException) -> None:
        """The database did not answer: say so once (the recovery says so once too)."""
        if not self._unreachable:
            self._unreachable = True
            self.log.error("store_unreachable", host=self.host, error=str(exc),
                           hint="no dispatch and no takeover until the leases renew; agents stop when they expire")

    def start_watch(self) -> None:
        """A thread that stops this host's agents when its leases expire unrenewed (the renewal
        itself may hang on a database that stopped answering)."""
        self._watch = threading.Thread(target=self._watch_loop, name="heartbeat-lease-watch", daemon=True)
        self._watch.start()

    def _watch_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(min(self.interval, 1.0)):
            with self._lock:
                at = self._renewed_at
                fenced = self._fenced_all or self.stood_down
            now = time.monotonic()
            woke_late, last = now - last > min(self.interval, 1.0) + self.interval, now
            if woke_late:  # this whole process was paused: a renewal in flight since then answers first
                continue
            if at is None or fenced or now < at + self._fence_after():
                continue
            # Past the deadline because renewals fail or hang, not because this whole process
            # was paused (then the next renewal, about to run, says which leases still hold).
            attempt = self._attempt
            if not self._unreachable and (attempt is None or now - attempt < self.interval):
                continue
            with self._lock:
                self._fenced_all = True
                lost = dict(self._supervised)
                self._supervised.clear()
            self.log.error("leases_expired", host=self.host, tasks=sorted(lost),
                           reason=f"not renewed for {self._fence_after():.1f}s: this host's agents are stopped; "
                                  "another host may take their tasks over")
            for task_id, (epoch, owner) in lost.items():
                self._fence(task_id, epoch, owner, why="this host could not renew its lease")

    def _fence(self, task_id: str, epoch: int | None, owner: Owner | None, *, why: str,
               standing_down: bool = False) -> None:
        if self.stood_down and not standing_down:
            return  # the successor supervises this host's agents: only _fence_moved may stop one
        if owner is None or epoch is None:
            return  # claimed, never dispatched: no agent to stop
        if owner.how != "dispatch":
            return  # a claimed agent (a person's session) is fenced by its epoch, never killed
        try:
            self.stop_agent(task_id, epoch, owner)
        except Exception as exc:  # a stop must never break the renewal
            self.log.error("fence_failed", task=task_id, epoch=epoch, error=repr(exc))
            return
        self.log.debug("fence_checked", task=task_id, epoch=epoch, why=why)

    # -- claim and takeover ---------------------------------------------------------------

    def _fresh(self) -> bool:
        """Healthy, renewing first when the last renewal is older than the renewal interval (a
        long pass, or ``run --once`` with no renewal job): act only on leases known to hold."""
        with self._lock:
            at = self._renewed_at
        if at is None or time.monotonic() - at > self.interval:
            self.renew()
        return self.healthy()

    def claim(self, ids: Sequence[str], limit: int | None = None) -> list[str]:
        """Of the tasks this daemon decided to dispatch, the ones it now holds (in order)."""
        if not ids or not self._fresh():
            return []
        params = {"ids": list(ids), "me": self.host, "labels": self.labels, "ttl": self.ttl,
                  "limit": len(ids) if limit is None else max(0, limit)}
        try:
            got = {r[0] for r in _fetch(self.store, _CLAIM, params)}
        except StoreError as exc:
            self.unreachable(exc)
            return []
        with self._lock:  # renewed from now on: the launches of a batch may outlast the claim's lease
            for task_id in got:
                self._supervised.setdefault(task_id, (None, None))
        return [i for i in ids if i in got]

    def take_over(self, limit: int) -> list[TakenOver]:
        """Take over (up to ``limit``) tasks whose owner host's lease expired. One transaction."""
        if limit <= 0 or not self._fresh():
            return []
        from heartbeat.store import postgres as pg

        taken: list[TakenOver] = []
        try:
            with self.store._conn() as conn, conn.transaction():
                rows = conn.execute(_EXPIRED, {"me": self.host, "labels": self.labels, "limit": limit}).fetchall()
                for task_id, body, from_host, age in rows:
                    done = self._take_one(conn, pg, task_id, body, from_host, float(age or 0.0))
                    if done is not None:
                        taken.append(done)
        except StoreError as exc:
            self.unreachable(exc)
            return []
        for t in taken:
            self.log.warning("taken_over", task=t.task, epoch=t.epoch, from_host=t.from_host,
                             lease_age_s=round(t.lease_age, 1))
        return taken

    def _take_one(self, conn: Any, pg: Any, task_id: str, body: str, from_host: str, age: float) -> TakenOver | None:
        from heartbeat.baton import Status, parse_baton
        from heartbeat.ledger import Event
        from heartbeat.store.base import Edit, continue_above, finish_edit
        from heartbeat.timeparse import utcnow

        try:
            old = parse_baton(body, path=f"{self.store.label}:{task_id}", expected_id=task_id)
        except HeartbeatError:
            return None  # an unreadable row is reported by the scan, never rewritten here
        now = utcnow()
        ed = Edit(old=old, baton=old.copy(), now=now, actor="daemon")
        meta = ed.baton.meta
        previous = meta.owner
        meta.owner = None
        meta.epoch += 1
        meta.ended_at = now
        meta.last_exit = None
        meta.last_failure = f"host {from_host} stopped renewing its lease ({age:.0f}s ago)"
        ed.event("taken_over", from_host=from_host, to_host=self.host, lease_age_s=round(age, 3),
                 from_epoch=old.meta.epoch, pid=previous.pid if previous is not None else None)
        if meta.status is Status.ACTIVE:
            ed.event(EventKind.STALLED, why="owner_dead")
        events: list[Event] = finish_edit(ed, world=False)  # nothing but bookkeeping changes: no world to fingerprint
        continue_above(ed, events, pg.highest_revision(conn, task_id))
        cur = conn.execute(
            "UPDATE heartbeat_batons SET body = %s, status = %s, revision = %s, epoch = %s, owned = false, "
            "owner_host = %s, lease_expires = now() + %s * interval '1 second', lease_renewed = now(), "
            "written_at = now() WHERE id = %s AND revision = %s",
            (self.store._body(ed.baton), meta.status.value, meta.revision, meta.epoch, self.host, self.ttl,
             task_id, old.meta.revision),
        )
        if cur.rowcount != 1:
            return None
        pg.append_events(conn, events)
        conn.execute("SELECT pg_notify(%s, %s)", (pg.CHANNEL, task_id))
        return TakenOver(task=task_id, from_host=from_host, lease_age=age, epoch=meta.epoch)

    # -- what the daemon's looks need ----------------------------------------------------

    def held_elsewhere(self, baton: Baton) -> str:
        """Why this daemon must not judge ``baton`` (its agent runs on another host), or ""."""
        owner = baton.meta.owner
        if owner is None or not owner.host or owner.host == self.host:
            return ""
        return f"held by host {owner.host}: its daemon supervises the agent"

    def owner_host(self, task_id: str) -> str:
        """The host whose daemon holds or last held ``task_id`` (as the last scan read it)."""
        return self.store.owner_hosts.get(task_id, "")

    def close(self) -> None:
        """Stop the watch and mark this host stopped (its leases run out on their own: the
        agents it leaves running are re-adopted if it comes back within ``lease_ttl``)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        try:
            with self.store._conn() as conn:
                conn.execute("UPDATE heartbeat_hosts SET stopped_at = now() "
                             "WHERE host = %s AND pid = %s AND started_at = %s",
                             (self.host, os.getpid(), self.started))
                conn.commit()
        except HeartbeatError:
            pass
