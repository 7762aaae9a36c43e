"""The store contract, and the bookkeeping every store applies to every write.

A store keeps batons and their ledger. Everything above it (the CLI, the API, the
daemon, the report) talks to this interface only, so the file store, the in-memory
store and a PostgreSQL store are interchangeable. The rules every implementation must
keep, and that ``tests/integration/test_store_contract.py`` checks against each one:

- a write is atomic: a reader sees the old baton or the new one, never a mix;
- writes to one baton are serialized, and each bumps ``meta.revision`` by one;
- a write that names an expected revision, or an epoch, that has moved on is refused
  with :class:`~heartbeat.model.errors.Conflict` and changes nothing;
- writes opened with ``links`` run one at a time over the whole store (a cycle check inside
  one sees every other one whole);
- an invalid baton is reported, never deleted or overwritten;
- every write appends its events to the ledger;
- :meth:`Store.watch` reports every committed write by task id (or says writes may have
  been missed), so the daemon answers a write between ticks without knowing where or how
  the store keeps batons.

This protocol is the cut: the daemon, the CLI and the API use only what is declared here
(no path of one backend, no ``getattr`` for a backend's private shortcut).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from heartbeat.model.baton import HANDOFF_FIELDS, LIST_FIELDS, SCALAR_FIELDS, Baton
from heartbeat.model.errors import Conflict, HeartbeatError, UnsafePath
from heartbeat.model.ledger import Event, EventKind, Ledger
from heartbeat.model.timeparse import utcnow

__all__ = ["Entry", "Edit", "Store", "Unwatch", "Watching", "FileBacked", "PulseSink", "TextImport", "SharedStore",
           "Archiving",
           "HostRow", "LeaseRow", "Renewal", "TakenOver",
           "check_fence", "start_create", "finish_edit", "content_changes",
           "created_data", "continue_above", "fingerprint", "write_identity"]


@dataclass(slots=True)
class Entry:
    """One task as a listing sees it: its baton, or the error that makes it invalid."""

    id: str
    baton: Baton | None = None
    error: HeartbeatError | None = None
    path: str = ""


@dataclass
class Edit:
    """An open write to one baton, held under that baton's lock.

    Change ``baton`` in place; add events with :meth:`event`. When the edit closes
    without an exception the store writes the baton atomically, bumps its revision and
    appends the events (or one ``updated`` event naming the changed fields).
    """

    old: Baton
    baton: Baton
    now: datetime
    actor: str = ""
    touch: bool = False
    events: list[Event] = field(default_factory=list)
    cancelled: bool = False
    reader: Callable[[str], Baton] | None = field(default=None, repr=False)
    """How :meth:`load` reads another baton: inside this write's transaction on a database."""

    def load(self, task_id: str) -> Baton:
        """Another task's baton as this write sees it (a write opened with ``links`` sees every
        other such write whole: before it or after it)."""
        if self.reader is None:
            raise TypeError("this edit reads no other baton")
        return self.reader(task_id)

    def event(self, kind: str, /, **data: Any) -> None:
        """Record that this write is a ``kind`` event (blocked, unblocked, dispatched, ...)."""
        self.events.append(Event(task=self.old.id, kind=kind, ts=self.now, actor=self.actor, data=data))

    def cancel(self) -> None:
        """Leave the baton as it was: nothing is written, no event recorded."""
        self.cancelled = True


class Unwatch(Protocol):
    """Stops a :meth:`Store.watch`: no callback runs once it has returned (waits at most ``timeout`` s);
    :meth:`alive` says whether the feed still runs (a thread of its that died reports nothing more)."""

    def __call__(self, timeout: float = 5.0) -> None: ...

    def alive(self) -> bool: ...


class Watching:
    """What a store's :meth:`Store.watch` returns (an :class:`Unwatch`): ``stop`` to call, ``alive`` to ask."""

    def __init__(self, stop: Callable[[float], None], alive: Callable[[], bool] | None = None) -> None:
        self._stop = stop
        self._alive = alive

    def __call__(self, timeout: float = 5.0) -> None:
        self._stop(timeout)

    def alive(self) -> bool:
        return self._alive is None or self._alive()


class Store(Protocol):
    """A place batons live. See the module docstring for the rules."""

    ledger: Ledger
    scan_unchanged: bool
    """Whether the last :meth:`scan` returned exactly the entries of the one before it (the same
    objects, nothing added, removed or rewritten). A store that cannot tell cheaply says False."""
    reads: int
    """How many batons the scans of this store have read and parsed since it was opened: a pass
    over a quiet store adds none (the daemon logs each pass's share as the tick's ``read``)."""

    def create(self, baton: Baton, *, actor: str = "", now: datetime | None = None) -> Baton:
        """Write a new baton (revision 1) and its ``created`` event; :class:`AlreadyExists` if taken."""

    def load(self, task_id: str) -> Baton:
        """Read and validate one baton; :class:`NotFound` or :class:`InvalidBaton`."""

    def edit(
        self,
        task_id: str,
        *,
        expect_revision: int | None = None,
        epoch: int | None = None,
        actor: str = "",
        touch: bool = False,
        now: datetime | None = None,
        links: bool = False,
    ) -> AbstractContextManager[Edit]:
        """Lock one baton, check the fence, yield an :class:`Edit`, write it on a clean exit.

        ``links``: the write changes which tasks come after which (``after``). It also holds the
        store's one links lock, so such writes run one at a time (on every host sharing the store)
        and a cycle check inside, reading with :meth:`Edit.load`, sees every other one whole."""

    def scan(self, only: Collection[str] | None = None) -> list[Entry]:
        """Every task, valid or not, sorted by id. Cheap when little changed since the last scan.

        ``only`` names the tasks a change notification reported since the last scan: a store
        may then look at those alone and give every other task back as the last scan saw it
        (the caller vouches that nothing else changed), or ignore it and look at everything."""

    def record(self, events: list[Event]) -> None:
        """Append events that come with no baton write (an agent's exit, an invalid baton found)."""

    def watch(self, callback: Callable[[str | None], None]) -> Unwatch:
        """Call ``callback(task_id)`` after each write to a baton (by anyone), from a thread of the
        store's; ``callback(None)`` when writes may have been missed (rescan everything). The
        callback must be quick and thread-safe. Returns the function that stops the watch."""

    def close(self) -> None:
        """Release files, connections and locks."""


# -- capabilities: what only some stores can do. Code outside store/ asks with isinstance,
# never with getattr/hasattr (tests/unit/test_layers.py::TestStoreCut checks that).


@runtime_checkable
class FileBacked(Protocol):
    """A store whose batons are files (the file store): a baton's text is the file's bytes."""

    lock_wait: float
    """Seconds a write waits for a baton's lock before it gives up (the daemon waits less than an agent)."""

    def path_of(self, task_id: str) -> str:
        """The baton file of ``task_id``."""


@runtime_checkable
class PulseSink(Protocol):
    """A store whose agents' touches may be pulses (:mod:`heartbeat.hotpath.pulse`): the file store."""

    def arm_pulse(self, task_id: str, epoch: int) -> bool:
        """After an agent's own write at ``epoch``: let its next touches be pulses. False: not armed."""

    def pulse(self, task_id: str, epoch: int) -> bool:
        """An agent's touch at ``epoch`` as a pulse, when one is armed for the baton as it is now.
        False, having changed nothing: the touch must be written."""


@runtime_checkable
class UnlandedWrites(Protocol):
    """A store whose events go in before their baton (the file store: a write killed between the two
    leaves events of a baton that never landed, until the task's next write removes them)."""

    def unlanded_ids(self, task_id: str) -> set[int]:
        """The ids of ``task_id``'s events whose baton write has not landed (crashed or in flight)."""


@runtime_checkable
class TextImport(Protocol):
    """A store that takes a baton's text as it is (``heartbeat import`` and ``migrate``)."""

    def put_text(self, task_id: str, text: str) -> bool:
        """Store ``text`` as the baton of ``task_id`` unless one exists; whether it was stored."""


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


@dataclass(frozen=True)
class TakenOver:
    """One task a daemon took over from a host whose lease expired."""

    task: str
    from_host: str
    lease_age: float
    """Seconds since the old host last renewed the lease."""
    epoch: int
    """The task's new epoch (the old agent's writes are refused from now on)."""


@dataclass(frozen=True)
class Renewal:
    """One renewal of a daemon's host row and of the leases of the tasks it supervises."""

    host: str
    pid: int
    started: datetime
    """With ``pid``, the daemon's identity in its host's row."""
    labels: list[str]
    capacity: int
    running: int
    ttl: float
    ids: list[str]
    epochs: list[int | None]
    """The epoch each of ``ids`` must still be at (None: claimed, not yet dispatched)."""
    take: bool = False
    """Take the host's row over from another daemon, compare-and-set on ``seen``."""
    seen: datetime | None = None


@runtime_checkable
class SharedStore(Protocol):
    """A store shared by daemons on many hosts (the PostgreSQL store): leases decide who runs a task."""

    owner_hosts: dict[str, str]
    """Task id -> the host whose daemon holds its lease, as of the last scan."""

    def claim_daemon(self, host: str = "") -> None:
        """Claim the store for this host's one daemon; :class:`~heartbeat.model.errors.DaemonRunning` if taken."""

    label: str
    """The database as a person may read it (no password)."""

    def baton_text(self, task_id: str) -> str:
        """The baton's text as the store keeps it."""

    def daemon_backends(self) -> list[int]:
        """The server pids of the sessions holding any host's daemon lock: empty when no daemon runs on it."""

    def keep_daemon_lock(self) -> str:
        """Re-check (and re-take) the lock of :meth:`claim_daemon`: ``held``, ``retaken``, ``lost`` or ``""``."""

    # Leases (the SQL in store/pg_leases.py; the policy, when to renew, take over or stand down,
    # in heartbeat/ops/lease.py). Each runs in a transaction of its own; StoreError when unreachable.

    def lease_hosts(self) -> list[HostRow]:
        """Every daemon that ever renewed on this store, most recently renewed first."""

    def lease_host(self, host: str) -> HostRow | None:
        """The row of host id ``host``, or None."""

    def lease_rows(self) -> dict[str, LeaseRow]:
        """Task id -> its owner host and lease, for every task that has a host."""

    def renew_leases(self, renewal: Renewal) -> tuple[bool, list[str]]:
        """(whether the host's row is this daemon's, the ids whose lease renewed), in one statement."""

    def claim_leases(self, ids: list[str], *, host: str, labels: list[str], ttl: float, limit: int) -> set[str]:
        """Of ``ids`` (active, unowned, unleased or leased here, labels offered), the ones now leased to ``host``."""

    def take_over_leases(self, *, host: str, labels: list[str], ttl: float, limit: int,
                         change: Callable[[Edit, str, float], None]) -> list[TakenOver]:
        """Take (up to ``limit``) owned tasks whose owner host's lease expired, in one transaction;
        ``change(ed, from_host, lease_age)`` says what the takeover writes in each baton."""

    def task_epochs(self, ids: list[str]) -> dict[str, int]:
        """Task id -> its current epoch, for those of ``ids`` that exist."""

    def host_stopped(self, host: str, pid: int, started: datetime) -> None:
        """Mark the row of host ``host`` stopped, if it is still the daemon (``pid``, ``started``)'s."""


@runtime_checkable
class Archiving(Protocol):
    """A store that moves finished tasks out of its live records into an archive it reads back
    (``heartbeat gc``): both the file store and the PostgreSQL store. :mod:`heartbeat.ops.retention`
    decides what goes (old enough, no live task depends on it) and builds the records
    (:func:`heartbeat.store.archive.make_record`); the store does the moving, atomically per task."""

    def gc_lock(self, *, dry_run: bool = False) -> AbstractContextManager[None]:
        """Held for a whole gc: one gc at a time over this store, on every host sharing it.
        :class:`~heartbeat.model.errors.GcBusy` when another holds it; a dry run takes none."""

    def archive_text(self, task_id: str) -> bytes | None:
        """The baton's bytes as the archive keeps them; None when there is no readable one."""

    def task_files(self, task_id: str) -> list[tuple[int, str, int]]:
        """``(epoch, path, bytes)`` of the task's epoch files (logs, briefs, exits) this store
        keeps; empty for a store whose logs live on each host (PostgreSQL)."""

    def prune_files(self, task_id: str, paths: list[str]) -> list[tuple[str, int]]:
        """Remove these of :meth:`task_files`; ``(path, bytes)`` of those that went."""

    def write_archive(self, name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
        """Store a new archive ``name`` holding ``records`` durably, read it back and check it
        record by record; ``(where, bytes)``. :class:`~heartbeat.model.errors.StoreError`, nothing
        archived, when it cannot."""

    def retire(self, task_id: str, raw: bytes, events: list[Event], summary: Event) -> tuple[str, int]:
        """Under the task's lock: if its baton is still ``raw`` and its ledger (``archived`` marks
        aside) still exactly ``events``, replace those rows by ``summary`` and remove the baton
        and its files, all or nothing. ``(why not, "" when retired; bytes of files freed)``."""

    def archived_tasks(self) -> dict[str, tuple[Baton | None, list[Event]]]:
        """Every task an ``archived`` mark names: its archived baton (None if it no longer
        parses) and archived events, in order (:func:`heartbeat.store.archive.resolve_marks`)."""

    def archive_names(self) -> list[str]:
        """The names of the archives this store holds, oldest first (``heartbeat export`` and
        ``migrate`` carry them: :mod:`heartbeat.ops.transfer`)."""

    def archive_records(self, name: str) -> list[dict[str, Any]]:
        """The records of the archive ``name``, in order; :class:`~heartbeat.model.errors.StoreError`
        when it is not held, or damaged."""


def check_fence(current: Baton, *, expect_revision: int | None, epoch: int | None) -> None:
    """Refuse a write whose expected revision or epoch has moved on."""
    meta = current.meta
    if expect_revision is not None and expect_revision != meta.revision:
        raise Conflict(
            f"expected revision {expect_revision} but the baton is at revision {meta.revision}: "
            "re-read it and apply your change again",
            task=meta.id,
        )
    if epoch is not None and epoch != meta.epoch:
        if epoch < meta.epoch:
            raise Conflict(
                f"epoch {epoch} has been superseded by epoch {meta.epoch}: another agent holds this task now",
                task=meta.id,
            )
        raise Conflict(f"epoch {epoch} is ahead of the baton's epoch {meta.epoch}", task=meta.id)


def created_data(baton: Baton) -> dict[str, Any]:
    """The data of a ``created`` event: enough to know, later, that the task started blocked."""
    data: dict[str, Any] = {"task": baton.task, "step": baton.step, "status": baton.meta.status.value}
    if baton.blocked_on:
        data["blocked_on"] = baton.blocked_on
        data["gate"] = baton.meta.gate.spec() if baton.meta.gate else "human"
    if baton.meta.world:
        data["world"] = dict(baton.meta.world)
    return data


def content_changes(old: Baton, new: Baton) -> list[str]:
    """The top-level fields (and unknown keys) whose value differs between two batons."""
    changed = [name for name in (*SCALAR_FIELDS, *LIST_FIELDS, *HANDOFF_FIELDS) if getattr(old, name) != getattr(new, name)]
    for key in sorted(set(old.extra) | set(new.extra)):
        if old.extra.get(key) != new.extra.get(key):
            changed.append(key)
    return changed


def made_progress(old: Baton, new: Baton) -> bool:
    """Progress is the step changing, ``done`` growing or a question asked across the seam (the
    agent did what it should with a gap: the run that asks and ends its turn is not idle); a
    touch is not progress."""
    return new.step != old.step or len(new.done) > len(old.done) or len(new.questions) > len(old.questions)


def start_create(baton: Baton, now: datetime, *, world: bool = True) -> Baton:
    """The baton a create writes (before the store sets its revision): a copy with its times
    stamped and, unless ``world`` is False (the memory store: no files), its world fingerprinted."""
    new = baton.copy()
    meta = new.meta
    meta.created_at = meta.updated_at = meta.touched_at = meta.progress_at = now
    if world:
        meta.world = fingerprint(new)
    return new


def finish_edit(ed: Edit, *, world: bool = True) -> list[Event]:
    """Apply the bookkeeping of a write and return the events to record.

    Bumps the revision, stamps times, resets the attempt counters on progress and
    re-fingerprints the world (not on a bare touch: a touch says "still on this step";
    never when ``world`` is False: the memory store has no files).
    """
    old, new, now = ed.old, ed.baton, ed.now
    meta = new.meta
    meta.id = old.meta.id
    meta.revision = old.meta.revision + 1
    meta.touched_at = now
    changed = content_changes(old, new)
    if changed or not ed.touch:
        meta.updated_at = now
    if made_progress(old, new):
        meta.progress_at = now
        meta.attempt = 0
        meta.idle_resumes = 0
    # The world is re-fingerprinted only when the note itself changes. A touch or a
    # bookkeeping write (claim, dispatch, owner, block/unblock) keeps the old fingerprints,
    # so a world that changed across a handoff still reads as stale to the successor's verify.
    if world and any(name != "blocked_on" for name in changed):
        meta.world = fingerprint(new)
    events = ed.events
    if not events:
        kind = EventKind.TOUCHED if ed.touch and not changed else EventKind.UPDATED
        events = [Event(task=meta.id, kind=kind, ts=now, actor=ed.actor)]
    if meta.world != old.meta.world:
        events[0].data.setdefault("world", dict(meta.world))  # report: stale resumes from the ledger
    for event in events:
        event.epoch = meta.epoch
        event.revision = meta.revision
        if changed and event.kind not in (EventKind.TOUCHED, EventKind.CREATED):
            event.data.setdefault("changed", changed)
        if "step" in changed:
            event.data.setdefault("step", new.step)
            event.data.setdefault("from_step", old.step)
        if "done" in changed:
            event.data.setdefault("done", new.done[len(old.done):] if new.done[: len(old.done)] == old.done else new.done)
    return events


def write_identity(baton: Baton) -> str:
    """Which write produced this baton, as the ledger's pending-write check compares it."""
    meta = baton.meta
    return f"{meta.revision}@{meta.touched_at.isoformat() if meta.touched_at else ''}"


def continue_above(ed: Edit, events: list[Event], highest: int) -> None:
    """A baton whose revision is below the highest its ledger recorded was restored from an older
    copy: its write continues above that revision (no two histories of one revision) and says so
    with a ``restored`` event. A block the old copy lacks is then a bypass, held by the daemon."""
    if highest < ed.baton.meta.revision:
        return
    found = ed.old.meta.revision
    ed.baton.meta.revision = highest + 1
    events.insert(0, Event(task=ed.old.id, kind=EventKind.RESTORED, ts=ed.now, actor=ed.actor, epoch=ed.baton.meta.epoch,
                           data={"found_revision": found, "highest_revision": highest,
                                 "status": ed.old.meta.status.value}))
    for event in events:
        event.revision = highest + 1


def fingerprint(baton: Baton) -> dict[str, str]:
    """The baton's world, as every store that writes batons takes it; a key file escaping
    the workdir is refused naming the task. (The in-memory store takes none: no files.)"""
    from heartbeat.system.world import fingerprint_world  # not on a touch's path: hashlib loads OpenSSL

    try:
        return fingerprint_world(baton.workdir, baton.key_files)
    except UnsafePath as exc:
        exc.task = exc.task or baton.meta.id
        raise


def now_or(now: datetime | None) -> datetime:
    return now if now is not None else utcnow()

