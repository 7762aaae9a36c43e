"""Looking at one task: liveness, exit status, gates, adoption and bypass detection.

:meth:`Observer.observe` turns a baton and the world around it into the plain
:class:`~heartbeat.model.policy.Observation` the pure decision reads. It writes only to adopt
an agent whose pid never reached its baton (the daemon died mid-launch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from heartbeat.daemon.ages import Ages
from heartbeat.daemon.leased import LeasePart
from heartbeat.daemon.shared import Shared
from heartbeat.hotpath.trail import activity
from heartbeat.launchers.liveness import output_at, process_age
from heartbeat.model import defaults
from heartbeat.model import policy as pol
from heartbeat.model.baton import Baton, GateKind, Owner, OwnerKind, Status
from heartbeat.model.errors import HeartbeatError, NotFound, UnsafePath
from heartbeat.model.ledger import Event, EventKind
from heartbeat.store.base import UnlandedWrites

__all__ = ["BLOCK_KINDS", "BlockMemory", "Observer"]

BLOCK_KINDS = (EventKind.CREATED, EventKind.BLOCKED, EventKind.UNBLOCKED, EventKind.BYPASS)
"""The ledger events that say whether a task is (or was last) held blocked."""


@dataclass(slots=True)
class BlockMemory:
    """What observing remembers of one task between looks (under the look lock; never the truth).

    The ledger's word on a block is read once per baton state, not once per look, and an
    agent still alive on a task that is no longer active is timed from when it was first seen.
    """

    checked: tuple[int, str, str] | None = None
    """(revision, status, blocked_on) the ledger was last consulted for; None: ask again."""
    dropped: bool = False
    """The ledger says the task is blocked, yet the baton is not: a hand edit dropped the block."""
    last_blocked: dict[str, Any] = field(default_factory=dict)
    """The data of that block's event, to restore it from."""
    skip_seed: bool = False
    """The first pass's block seed no longer speaks for this task: it was consulted once, or the
    daemon wrote the baton since it was loaded (its own unblock or restore is newer than the seed)."""
    inactive_seen: tuple[str, int, datetime, float] | None = None
    """(status, epoch, first seen, first seen on the monotonic clock): when the daemon first saw
    the task not active with its agent alive."""
    missing_upstreams: tuple[str, ...] = ()
    """The upstreams holding the task that do not exist, as last reported (once per change)."""


_NO_AGES: dict[str, float | None] = {"started": None, "signal": None, "progress": None, "dispatched": None}
"""The ages of a task without an owner: none is read (only an owned task's decisions use them)."""


class Observer:
    """Observations of tasks, and the per-task :class:`BlockMemory` they need."""

    def __init__(self, shared: Shared, lease: LeasePart | None) -> None:
        self.shared = shared
        self.lease = lease
        """The lease part on a store shared by many hosts (a gate is evaluated by one host); None on the file store."""
        self.memory: dict[str, BlockMemory] = {}
        """Per task (under the look lock)."""
        self.block_seed: dict[str, Event] | None = None
        """During the first pass only: the latest block event of every task, from one query."""
        self.ages = Ages()
        """The ages of each task's timestamps on the monotonic clock (:mod:`.ages`)."""

    def forget(self, task_id: str) -> None:
        self.memory.pop(task_id, None)
        self.ages.forget(task_id)

    def _mem(self, task_id: str) -> BlockMemory:
        mem = self.memory.get(task_id)
        if mem is None:
            mem = self.memory[task_id] = BlockMemory()
        return mem

    def wrote(self, task_id: str) -> None:
        """The daemon wrote this baton (an unblock, a restore): the block seed is older than it."""
        self._mem(task_id).skip_seed = True

    def block_restored(self, task_id: str) -> None:
        """A dropped block was restored: ask the ledger again at the next look."""
        self._mem(task_id).checked = None

    def last_blocked(self, task_id: str) -> dict[str, Any]:
        return self._mem(task_id).last_blocked

    def load_block_seed(self) -> None:
        """The latest block-related event of every task, in one query: the first pass over
        thousands of batons must not ask the ledger once per task."""
        latest: dict[str, Event] = {}
        for event in self.shared.store.ledger.events(kinds=BLOCK_KINDS):
            latest[event.task] = event
        self.block_seed = latest

    def observe(
        self, baton: Baton, now: datetime, statuses: Any, *, stopping: bool, spinning_reported_for: datetime | None,
        mono: float | None = None,
    ) -> pol.Observation:
        """What the decision needs to know of ``baton`` now (``stopping``: a stop of its agent is under way;
        ``mono``: now on the monotonic clock, which the durations decisions act on are measured on;
        None: ``now``'s, a clock that never steps)."""
        mono = now.timestamp() if mono is None else mono
        sh = self.shared
        mem = self._mem(baton.id)
        meta = baton.meta
        alive = False
        exit_code: int | None = None
        exit_signal: int | None = None
        output: datetime | None = None
        trail_at: datetime | None = None
        tool_running: bool | None = None
        owner = meta.owner
        if owner is not None:
            if stopping:
                alive = True  # a stop is under way: treat as alive until it reports
            else:
                launcher = sh.launcher_named(owner.launcher)
                if owner.pid is None and not owner.unit and owner.how == OwnerKind.DISPATCH:
                    adopted = self.adopt_pending(baton)
                    alive = adopted is not None
                    if adopted is not None:
                        owner = adopted
                elif launcher is not None and owner.how == OwnerKind.DISPATCH:
                    alive = bool(launcher.alive(owner))
                    if not alive:
                        status = launcher.exit_status(owner, sh.layout.exit(baton.id, meta.epoch))
                        if status is not None:
                            exit_code, exit_signal = status.code, status.signal
                else:
                    from heartbeat.launchers.liveness import is_alive

                    alive = is_alive(owner, host=sh.host)
            if alive and owner.how == OwnerKind.DISPATCH:
                sh.running[baton.id] = owner.launcher or baton.launcher or sh.config.daemon.default_launcher
                sh.exits.watch(baton.id, owner)
                if meta.status is Status.ACTIVE and not stopping:  # the agent's own output is proof of life
                    output = output_at(sh.layout.log(baton.id, meta.epoch), now.timestamp())
                    trail_at, tool_running = activity(sh.layout.trail(baton.id, meta.epoch))
            else:
                sh.running.pop(baton.id, None)
        else:
            sh.running.pop(baton.id, None)
        gate_open = False
        if meta.status is Status.BLOCKED and meta.gate is not None and (
                self.lease is None or self.lease.gate_here(baton.id, meta.gate)):  # a file/check gate: one host's
            gate_open = sh.gates.is_open(baton.id, meta.gate, now, workdir=baton.workdir,
                                         task_status=statuses.get, questions=baton.questions)
        block_dropped = False
        if meta.status in (Status.ACTIVE, Status.SNOOZED, Status.PAUSED):
            # Keyed on more than the revision: a hand edit can change the file and keep the revision.
            key = (meta.revision, meta.status.value, baton.blocked_on)
            if mem.checked != key:
                if mem.checked is None and self.block_seed is not None and not mem.skip_seed:
                    mem.skip_seed = True
                    latest = self.block_seed.get(baton.id)
                else:
                    found = sh.store.ledger.events(baton.id, kinds=BLOCK_KINDS)
                    latest = found[-1] if found else None
                mem.checked = key
                held = _holds_block(latest)
                if held and latest is not None and isinstance(sh.store, UnlandedWrites):
                    # The ledger's word of a write whose baton never landed (its writer killed before
                    # the rename, or still in flight) is no block: a bypass of it would accuse a human.
                    unlanded = sh.store.unlanded_ids(baton.id)
                    if latest.id in unlanded:
                        found = [e for e in sh.store.ledger.events(baton.id, kinds=BLOCK_KINDS)
                                 if e.id not in unlanded]
                        latest = found[-1] if found else None
                        held = _holds_block(latest)
                mem.dropped = held
                mem.last_blocked = dict(latest.data) if held and latest is not None else {}
                if held and latest is not None and latest.kind == EventKind.CREATED:
                    mem.last_blocked = {"on": latest.data.get("blocked_on", ""), "gate": latest.data.get("gate")}
            block_dropped = mem.dropped
        else:
            mem.checked = None
        spinning_reported = spinning_reported_for is not None and spinning_reported_for == meta.progress_at
        inactive_since: datetime | None = None
        inactive_for: float | None = None
        if alive and meta.status is not Status.ACTIVE:
            seen = mem.inactive_seen
            if seen is None or seen[:2] != (meta.status.value, meta.epoch):
                seen = mem.inactive_seen = (meta.status.value, meta.epoch, now, mono)
            inactive_since, inactive_for = seen[2], max(0.0, mono - seen[3])
        else:
            mem.inactive_seen = None
        ages = self._ages(baton, owner, output, trail_at, alive, now, mono)
        pending: tuple[str, ...] = ()
        if baton.after and meta.status is Status.ACTIVE and owner is None:
            from heartbeat.tasks.handoff import pending_upstreams

            pending = tuple(pending_upstreams(baton, statuses.get))
        self._report_missing(baton, pending, statuses, now, mem)
        return pol.Observation(alive=alive, exit_code=exit_code, exit_signal=exit_signal, gate_open=gate_open,
                               block_dropped=block_dropped, spinning_reported=spinning_reported,
                               inactive_since=inactive_since, upstream_pending=pending,
                               output_at=output, running_for=ages["started"], silent_for=ages["signal"],
                               unchanged_for=ages["progress"], dispatched_for=ages["dispatched"],
                               inactive_for=inactive_for, tool_running=tool_running, trail_at=trail_at)

    def _ages(self, baton: Baton, owner: Owner | None, output: datetime | None, trail_at: datetime | None,
              alive: bool, now: datetime, mono: float) -> dict[str, float | None]:
        """The ages of the stamps the decisions about an owned task read (:mod:`.ages`); none without an owner."""
        meta = baton.meta
        if owner is None:
            self.ages.unowned(baton.id, mono)
            return _NO_AGES
        started = owner.started_at or meta.dispatched_at
        return self.ages.measure(baton.id, {
            "started": started,
            # proof of life: a write, a touch, the agent's own output (its log's mtime) or a tool call (its trail)
            "signal": max((t for t in (meta.touched_at, meta.dispatched_at, output, trail_at) if t is not None),
                          default=None),
            "progress": max((t for t in (meta.progress_at, started) if t is not None), default=None),
            "dispatched": meta.dispatched_at,
        }, now, mono, bound=process_age(owner, host=self.shared.host) if alive else None)

    def _report_missing(self, baton: Baton, pending: tuple[str, ...], statuses: Any, now: datetime,
                        mem: BlockMemory) -> None:
        """A task held by an upstream that does not exist (its baton removed, or a hand-written
        ``after``) would wait forever in silence: log it and record an ``upstream_missing`` event,
        once each time the set of missing upstreams changes."""
        gate = baton.meta.gate
        held: tuple[str, ...] = pending
        if baton.meta.status is Status.BLOCKED and gate is not None and gate.kind in (GateKind.AFTER, GateKind.TASK):
            held = tuple(t for t in gate.target.split(",") if t)
        missing = tuple(t for t in held if statuses.get(t) is None and not statuses.exists(t))
        created = baton.meta.created_at
        if missing and created is not None and (now - created).total_seconds() < defaults.UPSTREAM_MISSING_GRACE:
            return  # a pipeline writes its downstreams before their upstreams: not missing, not yet written
        if missing == mem.missing_upstreams:
            return
        mem.missing_upstreams = missing
        if missing:
            sh = self.shared
            sh.log.warning("upstream_missing", task=baton.id, upstreams=list(missing))
            sh.record(Event(task=baton.id, kind=EventKind.UPSTREAM_MISSING, ts=now, epoch=baton.meta.epoch,
                            revision=baton.meta.revision, actor="daemon", data={"upstreams": list(missing)}))

    def adopt_pending(self, baton: Baton) -> Owner | None:
        """A dispatch whose pid never reached the baton (the daemon died mid-launch): find its agent
        through the pid file the launcher's shim writes, and record it."""
        from heartbeat.system.safefile import read_regular

        sh = self.shared
        path = sh.layout.pid(baton.id, baton.meta.epoch)
        try:
            data = json.loads(read_regular(path, 4096))  # a FIFO there is refused, never waited on
            pid, create_time = int(data["pid"]), float(data["create_time"])
        except UnsafePath as exc:
            sh.log.warning("file_refused", task=baton.id, path=path, error=exc.message)
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        owner = Owner(pid=pid, create_time=create_time, host=sh.host,
                      launcher=baton.meta.owner.launcher if baton.meta.owner else "", how=OwnerKind.DISPATCH,
                      started_at=baton.meta.dispatched_at)
        from heartbeat.launchers.liveness import is_alive

        if not is_alive(owner, host=sh.host):
            return None
        try:
            with sh.store.edit(baton.id, epoch=baton.meta.epoch, actor="daemon") as ed:
                ed.baton.meta.owner = owner
                ed.event(EventKind.ADOPTED, pid=pid)
        except HeartbeatError:
            return None
        sh.log.info("adopted", task=baton.id, epoch=baton.meta.epoch, pid=pid)
        return owner


class EntryStatuses:
    """``task:ID`` gates during a pass: the statuses of this pass's entries, indexed on first use
    (most passes have no task gate to open, and indexing thousands of entries is not free)."""

    def __init__(self, entries: list[Any]) -> None:
        self._entries = entries
        self._index: dict[str, Status] | None = None
        self._ids: set[str] | None = None

    def get(self, task_id: str) -> Status | None:
        if self._index is None:
            self._index = {e.id: e.baton.meta.status for e in self._entries if e.baton is not None}
        return self._index.get(task_id)

    def exists(self, task_id: str) -> bool:
        """A baton of that id is in this pass, readable or not."""
        if self._ids is None:
            self._ids = {e.id for e in self._entries}
        return task_id in self._ids


class StatusLookup:
    """``task:ID`` gates outside a full pass: look the other task up in the store."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get(self, task_id: str) -> Status | None:
        try:
            return self.store.load(task_id).meta.status
        except HeartbeatError:
            return None

    def exists(self, task_id: str) -> bool:
        try:
            self.store.load(task_id)
        except NotFound:
            return False
        except HeartbeatError:
            return True
        return True


def _holds_block(latest: Event | None) -> bool:
    """Whether the ledger's latest block-related event of a task says it is held blocked."""
    return latest is not None and (latest.kind in (EventKind.BLOCKED, EventKind.BYPASS) or (
        latest.kind == EventKind.CREATED and latest.data.get("status") == Status.BLOCKED.value))
