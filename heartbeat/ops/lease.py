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
- **the agents' own stop** (:meth:`Lease.agent_deadlines`): the daemon's watch below cannot act
  when the daemon itself is killed, paused or wedged, so each agent's shim watches its lease too,
  through a small file the daemon writes before the launch and after every renewal that renewed
  the agent's epoch (``on_renewed``; no database connection per agent). The file says when to
  SIGTERM the agent (when this daemon would treat its leases as gone) and when to SIGKILL what
  is left (:data:`~heartbeat.model.defaults.LEASE_KILL_MARGIN` before the lease can expire in the
  database), on :func:`~heartbeat.launchers.shim.lease_clock` counted from the *start* of the
  renewal (the database's ``now()`` comes after it). A replacement elsewhere needs the lease
  expired, so it never runs beside the old agent.
- A daemon that cannot renew (the database is unreachable) dispatches nothing and takes
  nothing over; when its own leases are about to expire unrenewed it stops its agents
  (nobody may assume them alive any longer: another host will take their tasks); it says
  so once when the database goes away and once when it is back.

The file store has one host and needs none of this: the daemon builds a :class:`Lease`
only on a store that offers leases (:func:`for_store`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat.launchers.shim import lease_clock
from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Owner, Status, host_labels
from heartbeat.model.errors import HeartbeatError, StoreError
from heartbeat.model.ledger import EventKind
from heartbeat.model.policy import TAKEN_OVER
from heartbeat.store.base import Edit, HostRow, LeaseRow, Renewal, SharedStore, TakenOver

if TYPE_CHECKING:
    from heartbeat.store.base import Entry

__all__ = ["HostRow", "Lease", "LeaseRow", "TakenOver", "for_store", "host_labels", "lease_rows", "list_hosts",
           "resolve_host"]


def resolve_host(configured: str = "") -> str:
    """This daemon's host id: ``$HEARTBEAT_HOST``, else ``daemon.host``, else the hostname."""
    import socket

    return os.environ.get(defaults.HOST_ENV, "").strip() or configured.strip() or socket.gethostname()


def list_hosts(store: SharedStore) -> list[HostRow]:
    """Every daemon that ever renewed on this database, most recently renewed first."""
    return store.lease_hosts()


def lease_rows(store: SharedStore) -> dict[str, LeaseRow]:
    """Task id -> its owner host and lease, for every task that has a host."""
    return store.lease_rows()


def for_store(store: Any) -> bool:
    """Whether ``store`` is shared between hosts (and so needs leases): the PostgreSQL store."""
    return isinstance(store, SharedStore)


class Lease:
    """One daemon's leases on a shared store. See the module docstring.

    ``stop_agent(task_id, epoch, owner)`` stops a fenced agent of this host without writing
    anything (the daemon passes its launchers' ``stop``). Thread-safe: the renewal runs in a
    job of its own, beside the daemon's pass.
    """

    def __init__(self, store: SharedStore, *, host: str, labels: Sequence[str], ttl: float, capacity: int,
                 interval: float, log: Any, stop_agent: Callable[[str, int, Owner], None],
                 on_stood_down: Callable[[], None] = lambda: None,
                 on_renewed: Callable[[dict[str, int], float], None] = lambda renewed, at: None) -> None:
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
        self.on_renewed = on_renewed
        """Called after each successful renewal with {task id: epoch} of the dispatched tasks it
        renewed and the :func:`lease_clock` time the renewal started (for :meth:`agent_deadlines`)."""
        self._claimed_at: dict[str, float] = {}
        """Task id -> :func:`lease_clock` time its claim started (its lease lasts ttl from after it)."""
        self.started = datetime.now().astimezone()
        """With the pid, this daemon's identity in its host's row of ``heartbeat_hosts``."""
        self.stood_down = False
        """Another daemon with this host id took the host's row: this one acts no more."""
        self._take: tuple[bool, datetime | None] = (False, None)
        """(take the host's row over, the ``renewed_at`` it must still hold): set by :meth:`take_host`."""
        self._lock_state = "held"
        self._taking = False
        self._lock = threading.Lock()
        self._renewing = threading.Lock()
        """Held by the renewal in flight: one at a time (the loop's :meth:`acting` and the renewal job
        both renew; two at once doubled a loaded host's renewal work and so its delay)."""
        self._supervised: dict[str, tuple[int | None, Owner | None]] = {}
        """Task id -> (epoch, owner) of this host's agents; (None, None) for a task claimed and not yet dispatched."""
        self._renewed_at: float | None = None
        """Monotonic time at which the last successful renewal *started* (its leases last ttl from after it)."""
        self._attempted = time.monotonic()
        """Monotonic time the last renewal started (a watch that sees none for long fences without one)."""
        self._renewed_clock: float | None = None
        """:func:`lease_clock` time at which the last successful renewal started."""
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

    def renew(self, running: int | None = None, *, unless_since: float | None = None) -> bool:
        """One statement: renew this host's row and the lease of every task it supervises.

        Returns True when the database answered and the host's row is still this daemon's. A
        supervised task whose lease did not renew has moved on (taken over): its agent is
        stopped, nothing written for it. A host row that another daemon took makes this one
        stand down (:meth:`_stand_down`). One renewal at a time: a caller that saw the last
        renewal start at ``unless_since`` waits for the one in flight and renews only if none
        succeeded since.
        """
        with self._renewing:
            if unless_since is not None:
                with self._lock:
                    at = self._renewed_at
                if at is not None and at > unless_since:
                    return not self.stood_down
            return self._renew(running)

    def _renew(self, running: int | None) -> bool:
        if self.stood_down:
            return False
        started = time.monotonic()
        started_clock = lease_clock()
        self._attempt = started  # (before the lock's look: it may hang on a dead connection too)
        self._attempted = started
        self._keep_lock()
        with self._lock:
            supervised = dict(self._supervised)
        ids = list(supervised)
        take, seen = self._take
        renewal = Renewal(host=self.host, pid=os.getpid(), started=self.started, labels=self.labels,
                          capacity=self.capacity, running=len(supervised) if running is None else running,
                          ttl=self.ttl, ids=ids, epochs=[supervised[i][0] for i in ids], take=take, seen=seen)
        try:
            held, renewed_ids = self.store.renew_leases(renewal)
        except HeartbeatError as exc:
            self.unreachable(exc)
            return False
        finally:
            self._attempt = None
        if not held:
            self._stand_down()
            return False
        self._take = (False, None)
        renewed = set(renewed_ids)
        with self._lock:
            self._renewed_at = started
            self._renewed_clock = started_clock
            self._fenced_all = False
            for task_id in renewed:
                self._claimed_at.pop(task_id, None)
        if self._unreachable:
            self._unreachable = False
            self.log.info("store_reachable", host=self.host, renewed=len(renewed),
                          hint="leases renewed; dispatching again")
        agents = {t: e for t, (e, o) in supervised.items()
                  if t in renewed and e is not None and o is not None and o.how == "dispatch"}
        if agents:
            try:
                self.on_renewed(agents, started_clock)
            except Exception as exc:  # the agents' lease files must never break the renewal
                self.log.error("lease_files_failed", error=repr(exc))
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

    def agent_deadlines(self, started: float) -> tuple[float, float]:
        """(SIGTERM at, SIGKILL by) for an agent whose lease renewal (or claim) started at ``started``
        on :func:`lease_clock`: the SIGTERM when this daemon would treat the lease as gone, the
        SIGKILL a margin before the lease can expire in the database (and so before another host can
        take the task over)."""
        kill = started + self.ttl - min(defaults.LEASE_KILL_MARGIN, self.ttl / 10)
        return min(started + self._fence_after(), kill - min(defaults.LEASE_KILL_MARGIN, self.ttl / 10)), kill

    def launch_deadlines(self, task_id: str) -> tuple[float, float] | None:
        """The deadlines of an agent about to be launched for ``task_id``: from the start of its claim
        (or of the last renewal, whichever came later); None when this daemon holds no lease on it."""
        with self._lock:
            claimed, renewed = self._claimed_at.get(task_id), self._renewed_clock
            held = task_id in self._supervised
        if not held or (claimed is None and renewed is None):
            return None
        return self.agent_deadlines(max(t for t in (claimed, renewed) if t is not None))

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
            self.renew(unless_since=-math.inf if at is None else at)
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
            row = self.store.lease_host(self.host)
            if row is not None:
                pid, renewed_at, age, ttl = row.pid, row.renewed_at, row.age, row.lease_ttl
                mine = pid == os.getpid() and row.started_at == self.started
                if row.stopped_at is None and not mine and age <= ttl:
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
            self._take = (True, row.renewed_at if row is not None else None)
            self._taking = True
            try:
                self.renew()  # (the database out of reach: the renewal job takes the row later)
            finally:
                self._taking = False
            if self.stood_down:  # renewed by its daemon between our look and our take
                raise self._refusal(row.pid if row is not None else 0, 0.0)
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
            current = self.store.task_epochs(ids)
        except HeartbeatError:
            return  # not known: never stop an agent on a guess
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
        """The database did not answer: say so once (the recovery says so once too). Not while this
        daemon stops: its store closes under a renewal in flight, which is no outage."""
        if self._stop.is_set():
            return
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
        resumed_until = last
        while not self._stop.wait(min(self.interval, 1.0)):
            with self._lock:
                at = self._renewed_at
                fenced = self._fenced_all or self.stood_down
            now = time.monotonic()
            woke_late, last = now - last > min(self.interval, 1.0) + self.interval, now
            if woke_late:  # this whole process was paused: the renewal about to run (or in flight) answers first
                resumed_until = now + max(2 * self.interval, 1.0)
                continue
            if at is None or fenced or now < at + self._fence_after():
                continue
            # Past the deadline because renewals fail or hang, not because this whole process
            # was paused (then the next renewal, about to run, says which leases still hold).
            attempt = self._attempt
            if not self._unreachable and attempt is not None and now - attempt < self.interval:
                continue  # a renewal in flight answers first
            if not self._unreachable and attempt is None and (
                    now < resumed_until or now - self._attempted < max(2 * self.interval, 1.0)):
                continue  # one started a moment ago, or is about to after a pause: it answers first
            # (No renewal in flight nor started lately: whatever runs them is stuck elsewhere, e.g. the
            # renewal job in a takeover on a database that stopped answering right after the last renewal.)
            with self._lock:
                self._fenced_all = True
                lost = dict(self._supervised)
                self._supervised.clear()
            if not lost:
                continue  # nothing to stop: a renewal in flight says whether the database answers
            if not self._unreachable:  # renewals that hang, not fail: the outage is said here, once
                self.unreachable(StoreError(f"no answer from the database {self.store.label} for "
                                            f"{now - at:.1f}s"))
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
            self.renew(unless_since=-math.inf if at is None else at)
        return self.healthy()

    def claim(self, ids: Sequence[str], limit: int | None = None) -> list[str]:
        """Of the tasks this daemon decided to dispatch, the ones it now holds (in order)."""
        if not ids or not self._fresh():
            return []
        started = lease_clock()
        try:
            got = self.store.claim_leases(list(ids), host=self.host, labels=self.labels, ttl=self.ttl,
                                          limit=len(ids) if limit is None else max(0, limit))
        except StoreError as exc:
            self.unreachable(exc)
            return []
        with self._lock:  # renewed from now on: the launches of a batch may outlast the claim's lease
            for task_id in got:
                self._supervised.setdefault(task_id, (None, None))
                self._claimed_at[task_id] = started
        return [i for i in ids if i in got]

    def take_over(self, limit: int) -> list[TakenOver]:
        """Take over (up to ``limit``) tasks whose owner host's lease expired. One transaction."""
        if limit <= 0 or not self._fresh():
            return []
        try:
            taken = self.store.take_over_leases(host=self.host, labels=self.labels, ttl=self.ttl, limit=limit,
                                                change=self._taking_over)
        except StoreError as exc:
            self.unreachable(exc)
            return []
        for t in taken:
            self.log.warning("taken_over", task=t.task, epoch=t.epoch, from_host=t.from_host,
                             lease_age_s=round(t.lease_age, 1))
        return taken

    def _taking_over(self, ed: Edit, from_host: str, age: float) -> None:
        """What a takeover writes: the epoch moves on (the old agent is fenced), the owner is
        cleared, the ledger says ``taken_over`` (and ``stalled`` for an active task)."""
        meta = ed.baton.meta
        previous = meta.owner
        meta.owner = None
        meta.epoch += 1
        meta.ended_at = ed.now
        meta.last_exit = None
        if meta.status is Status.ACTIVE and previous is not None:  # a lost host is not its agent's failure
            meta.attempt = max(0, meta.attempt - 1)
        meta.last_failure = f"{TAKEN_OVER}host {from_host} stopped renewing its lease ({age:.0f}s ago)"
        ed.event(EventKind.TAKEN_OVER, from_host=from_host, to_host=self.host, lease_age_s=round(age, 3),
                 from_epoch=ed.old.meta.epoch, pid=previous.pid if previous is not None else None)
        if meta.status is Status.ACTIVE:
            ed.event(EventKind.STALLED, why="owner_dead")

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
            self.store.host_stopped(self.host, os.getpid(), self.started)
        except HeartbeatError:
            pass
