"""The loop: look → decide → act, over every task (a tick) or one poked task (evaluate).

A small loop class in the manner of huey's consumer: :meth:`Loop.tick` (one pass over
every baton; ``now`` is a parameter so tests never patch time) and :meth:`Loop.evaluate`
(one poked task); the service (:mod:`.service`) initializes, drives and shuts it down,
and builds it from its parts. Per task, a look is: observe (:mod:`.observe`) →
:func:`heartbeat.model.policy.decide` → act (:mod:`.act`). Dispatches of one pass are admitted
together (:func:`heartbeat.model.policy.admit`) so capacity and the per-minute budget are
respected, oldest-waiting first.

A pass skips the tasks whose last decision was "nothing" while their baton is unchanged
and their decision's time has not come; when the store says the whole scan is unchanged
(:attr:`heartbeat.store.base.Store.scan_unchanged`) and no quiet task is due, only the
others are looked at.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from heartbeat.config.shape import Config
from heartbeat.daemon.act import Actor
from heartbeat.daemon.answers import AnswerPart
from heartbeat.daemon.changes import ChangeFeed
from heartbeat.daemon.leased import LeasePart
from heartbeat.daemon.observe import EntryStatuses, Observer, StatusLookup
from heartbeat.daemon.overdue import OverdueQuestions
from heartbeat.daemon.shared import Shared
from heartbeat.daemon.vitals import VITALS_FILE, Vitals
from heartbeat.daemon.watch import Watcher
from heartbeat.launchers.liveness import note_boot_time
from heartbeat.model import defaults
from heartbeat.model import policy as pol
from heartbeat.model.baton import Baton, GateKind, Status
from heartbeat.model.errors import (
    Busy,
    Conflict,
    HeartbeatError,
    InvalidBaton,
    NotActive,
    NotFound,
    StoreError,
    StoreUnreachable,
    UnsafePath,
)
from heartbeat.model.knobs import knob_values
from heartbeat.model.ledger import Event, EventKind
from heartbeat.store.base import Entry
from heartbeat.system import systemd
from heartbeat.system.clock import StepWatch

__all__ = ["LookMemory", "Loop", "Want"]




@dataclass(slots=True)
class LookMemory:
    """What the loop remembers of one task between looks (under the look lock; never the truth)."""

    last_reason: str = ""
    """The last decision reason logged: a repeated one is not logged again at info level."""
    admission: str = ""
    """The last admission refusal logged (``waiting``), cleared when the task is admitted: a task
    queued at capacity says it waits once, not once per pass."""
    invalid_reported: str = ""
    """The error of an invalid baton already reported (once per error)."""
    quiet_entry: Entry | None = None
    """The scanned entry whose decision was "nothing"; while the scan returns this very entry
    (the file is unchanged) and ``quiet_until`` has not come, the task is not looked at again."""
    quiet_until: datetime | None = None
    quiet_status: str = ""
    lock_busy: bool = False
    """The daemon found the baton's lock held (and said so once); cleared by its next write."""
    measured_revision: int = 0
    """The baton revision whose write→decision latency was last measured (each write counts once)."""


class Want(NamedTuple):
    """A dispatch decision waiting for admission."""

    task_id: str
    launcher: str
    since: datetime
    decision: pol.Decision
    revision: int
    """The baton revision the decision was made on: the dispatch write is fenced on it."""


@dataclass
class _Partition:
    """The last full pass split in two: tasks to look at every time, and quiet ones (counted by status)."""

    active: list[Entry]
    quiet_counts: dict[str, int]
    quiet_end: datetime
    """The earliest time a quiet task's decision may change: a full pass is due then."""


class Loop:
    """The decision loop over one store. See the module docstring.

    Given its parts by the service (:class:`~heartbeat.daemon.service.Daemon`), which starts
    and stops them; the loop only looks, decides and acts."""

    def __init__(
        self,
        shared: Shared,
        *,
        observer: Observer,
        actor: Actor,
        answers: AnswerPart,
        watcher: Watcher,
        lease: LeasePart | None,
        changes: ChangeFeed,
        vitals: Vitals,
        overdue: OverdueQuestions,
        on_step: Callable[[float], None],
    ) -> None:
        self.shared = shared
        self.store = shared.store
        """The daemon's store (the same object as ``shared.store``: it is never swapped)."""
        self.log = shared.log
        self.clock = shared.clock
        self.observer = observer
        self.actor = actor
        self.answers = answers
        """The upstreams' answering runs: questions sent, watched, settled (:mod:`.answers`)."""
        self.watcher = watcher
        self.lease = lease
        """Leases on a store shared by daemons on many hosts (:mod:`.leased`); None on the file store."""
        self.overdue = overdue
        """Escalates the questions across the seam nobody answered within ``question_wait``."""
        self.changes = changes
        """Which tasks the watcher reported since the last pass, and when a pass sweeps every baton."""
        self.steps = StepWatch(self.clock)
        """Notices the wall clock stepping (each pass, and the service's main thread between passes)."""
        self._on_step = on_step
        """Told each wall-clock step seen (the service re-arms its scheduler's jobs)."""
        self.memory: dict[str, LookMemory] = {}
        """Per task (under the look lock)."""
        self._staged_config: Config | None = None
        self._policies: dict[str, pol.Policy] = {}
        self._partition: _Partition | None = None
        self._statuses: EntryStatuses | None = None
        """The tasks' statuses in the last scan that changed (built when first asked), kept with
        ``shared.downstreams`` while the scans find the same entries."""
        self.counts: dict[str, int] = {}
        self.ticks = 0
        log = self.log
        if hasattr(self.store.ledger, "on_unreadable"):  # a corrupt row is skipped, and logged once
            self.store.ledger.on_unreadable = lambda row, why: log.warning(
                "ledger_row_unreadable", row=row, error=why, hint="the row is skipped; the ledger is not changed")
        self.vitals = vitals
        """The daemon's vitals (the lease part counts into the same), written for ``/metrics`` (:meth:`Vitals.save_due`)."""
        self.vitals_dir: str | None = None
        """Where :meth:`tick` writes the vitals for ``/metrics`` (set by ``serve``; tests leave it unset)."""
        self._status_counts: dict[str, int] | None = None
        self._status_text = ""
        """The last pass's counts and the ``STATUS=`` line built from them (built again only when they change)."""

    def stage_config(self, new: Config) -> None:
        """A reload that came during a pass: the next look starts with ``new`` (:meth:`apply_config`)."""
        self._staged_config = new

    def apply_config(self, new: Config) -> None:
        """Swap in a reloaded config (under the look lock, between passes)."""
        self._staged_config = None
        self.shared.config = new
        self._policies = {}
        self._partition = None
        self.shared.build_launchers()
        for mem in self.memory.values():
            mem.quiet_entry = None  # decisions may differ under the new config
        self.shared.gates.checks = dict(new.checks)
        if self.lease is not None:
            self.lease.reconfigure()
        self.changes.sweep_every = new.daemon.sweep_every

    def _forget(self, task_id: str) -> None:
        """A task no longer in the store: every part drops its record of it."""
        self.memory.pop(task_id, None)
        self.observer.forget(task_id)
        self.actor.forget(task_id)
        self.shared.running.pop(task_id, None)
        self.shared.exits.forget(task_id)

    def _mem(self, task_id: str) -> LookMemory:
        mem = self.memory.get(task_id)
        if mem is None:
            mem = self.memory[task_id] = LookMemory()
        return mem

    # -- one pass ------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> dict[str, int]:
        """Look at every task once; returns counts by status (and ``running``).

        ``now`` (tests) stands for the wall clock and the monotonic one alike; without it the
        pass reads both from :attr:`clock`. A pass: its start (:meth:`_begin_pass`), the look at
        the store (:meth:`_scan`), the look and decision per task (:meth:`_look_at_tasks`), the
        dispatches admitted together (:meth:`dispatch`), then its end (:meth:`_end_pass`)."""
        started = time.monotonic()
        reads = self.store.reads
        with self.shared.lock:
            now = self._begin_pass(now)
            if self.lease is not None and not self.lease.acting():  # displaced by a daemon of our host id
                return {}
            only, entries, statuses = self._scan(now)
            counts, wants, running_batons, gate_paths = self._look_at_tasks(entries, statuses, now)
            self.dispatch(wants, now)
            self._answer(entries, now)
            self.overdue.pass_(entries, now)
            self._end_pass(counts, running_batons, gate_paths)
        self.watcher.update_gate_watches()
        self._report_pass(counts, started, reads=self.store.reads - reads, tasks=len(entries), sweep=only is None)
        return counts

    def _begin_pass(self, now: datetime | None) -> datetime:
        """A reload staged during the last pass, the clock's steps, this pass's time, the launchers' reaping."""
        if self._staged_config is not None:  # a SIGHUP during the previous pass
            self.apply_config(self._staged_config)
        self.check_clock()
        self.watcher.check()  # (a store feed whose thread died: every tick sweeps from now on)
        self.shared.look_mono = self.clock.monotonic() if now is None else None
        now = now or self.clock.now()
        for launcher in self.shared.launchers.values():
            launcher.reap()
        return now

    def _scan(self, now: datetime) -> tuple[set[str] | None, list[Entry], EntryStatuses]:
        """Look at the store: the tasks reported changed (None: a sweep), the scan's entries, their statuses."""
        if self.lease is not None:  # a dead host's tasks: taken over here, then looked at in this pass
            self.lease.before_pass()
        # Between sweeps only the batons the watcher reported are stat'ed (see heartbeat.daemon.changes).
        only = self.changes.take(now.timestamp())
        entries = self.store.scan(only=only)
        if self._statuses is None or not self.store.scan_unchanged:  # a quiet pass walks no list of every task
            self._index(entries)
        statuses = self._statuses
        assert statuses is not None
        if self.lease is not None:
            self.lease.after_scan(entries)
        if self.ticks == 0:
            self.observer.load_block_seed()
        return only, entries, statuses

    def _look_at_tasks(self, entries: list[Entry], statuses: EntryStatuses, now: datetime) -> tuple[
            dict[str, int], list[Want], list[Baton], dict[str, set[str]]]:
        """Look at and decide on every task that is not quiet (acting on all but dispatches): the
        counts by status, the dispatches wanted, the batons with a live agent, the gate files."""
        sh = self.shared
        running_batons: list[Baton] = []
        wants: list[Want] = []
        gate_paths: dict[str, set[str]] = {}
        seen: set[str] = set()
        # Fast path: nothing changed in the store since the last full pass and no quiet
        # task's time has come, so only the tasks that were not quiet need a look.
        part = self._partition
        fast = part is not None and self.store.scan_unchanged and now < part.quiet_end
        if fast:
            assert part is not None
            loop_entries, counts = part.active, dict(part.quiet_counts)
        else:
            loop_entries, counts = entries, {}
        quiet_counts: dict[str, int] = {}
        active: list[Entry] = []
        quiet_end = pol.FOREVER
        for entry in loop_entries:
            mem = self.memory.get(entry.id)
            if mem is not None and mem.quiet_entry is entry and mem.quiet_until is not None \
                    and now < mem.quiet_until:
                counts[mem.quiet_status] = counts.get(mem.quiet_status, 0) + 1
                if not fast:
                    seen.add(entry.id)
                # (on the fast path: a task that turned quiet since the last pass moves out of ``active``)
                quiet_counts[mem.quiet_status] = quiet_counts.get(mem.quiet_status, 0) + 1
                quiet_end = min(quiet_end, mem.quiet_until)
                continue
            if not fast:
                seen.add(entry.id)
            active.append(entry)
            try:
                status, want = self.look(entry, now, statuses)
            except StoreUnreachable as exc:  # the database out of reach mid-act (a session it closed): an outage,
                self._load_failed(entry.id, exc)  # told once; the task is looked at again next pass
                status, want = "error", None
            except Exception as exc:  # one task's trouble must not stop the others being served
                self.log.exception("task_failed", task=entry.id, error=repr(exc))
                status, want = "error", None
            counts[status] = counts.get(status, 0) + 1
            if want is not None:
                wants.append(want)
            baton = entry.baton
            if baton is not None and entry.id in sh.running:
                running_batons.append(baton)  # (a quiet task never has a live agent)
            if baton is not None and baton.meta.status is Status.BLOCKED and baton.meta.gate is not None \
                    and baton.meta.gate.kind is GateKind.FILE and baton.meta.gate.local:
                gate_paths.setdefault(baton.meta.gate.local, set()).add(entry.id)
        if not fast:
            known = set(self.memory) | set(self.observer.memory) | set(self.actor.stops) | set(sh.running)
            for gone in known - seen:
                self._forget(gone)
            self._partition = _Partition(active, quiet_counts, quiet_end)
        else:
            assert part is not None
            for status, n in part.quiet_counts.items():
                quiet_counts[status] = quiet_counts.get(status, 0) + n
            self._partition = _Partition(active, quiet_counts, min(quiet_end, part.quiet_end))
        return counts, wants, running_batons, gate_paths

    def _answer(self, entries: list[Entry], now: datetime) -> None:
        """The questions to upstreams: their answering runs started, watched and settled."""
        try:
            self.answers.look(entries, now)
        except Exception as exc:  # the questions' trouble must not stop the pass
            self.log.exception("answers_failed", error=repr(exc))

    def _end_pass(self, counts: dict[str, int], running_batons: list[Baton], gate_paths: dict[str, set[str]]) -> None:
        """Cap the logs of agents printing without end; the pass's counts and gate files kept."""
        sh = self.shared
        from heartbeat.launchers.base import cap_running_logs  # an agent printing without end

        for task_id, epoch, size in cap_running_logs(sh.config.state_dir, sh.config.launchers,
                                                     running_batons, sh.running):
            self.log.warning("log_capped", task=task_id, epoch=epoch, size=size)
        counts["running"] = len(sh.running)
        self.counts = counts
        self.watcher.set_gate_paths(gate_paths)
        self.observer.block_seed = None
        self.ticks += 1

    def _report_pass(self, counts: dict[str, int], started: float, *, reads: int, tasks: int, sweep: bool) -> None:
        """Tell systemd's watchdog, the vitals and the debug log that a pass finished."""
        if systemd.listening():  # (outside systemd no status line is built: an idle pass's largest part)
            if counts != self._status_counts:
                self._status_counts, self._status_text = dict(counts), f"STATUS={systemd.status_line(counts)}"
            systemd.notify("WATCHDOG=1", self._status_text)
        seconds = time.monotonic() - started
        self.vitals.tick_done(seconds)
        self.save_vitals()
        self.log.debug("tick", tasks=tasks, read=reads, sweep=sweep, seconds=round(seconds, 4), **counts)

    def check_clock(self) -> float | None:
        """Say in the log when the wall clock stepped (either way, by how much); the step, or None.

        Nothing the daemon decides changes with it: durations are measured on the monotonic
        clock (:mod:`heartbeat.daemon.ages`). Wall-clock instants (a snooze's end, a ``time:``
        gate, a backoff's end) keep their meaning as times of day."""
        step = self.steps.check()
        note_boot_time()  # (a step moves the boot time psutil's create times are counted from)
        if step is not None:
            self.log.warning("clock_stepped", direction="back" if step < 0 else "forward",
                             seconds=round(abs(step), 3), wall_now=self.clock.now().isoformat(),
                             hint="durations are measured on the monotonic clock; times of day follow the wall clock")
            self._on_step(step)
        return step

    def save_vitals(self, *, final: bool = False) -> None:
        """The vitals written when due (:meth:`Vitals.save_due`); at the daemon's stop (``final``) always."""
        if self.vitals_dir is None:
            return
        try:
            if final:
                self.vitals.save(self.vitals_dir, now=self.clock.monotonic())
            else:
                self.vitals.save_due(self.vitals_dir, self.clock.monotonic())
        except OSError as exc:  # metrics are a report: a full disk must not stop the clock
            self.log.warning("vitals_write_failed", file=VITALS_FILE, error=str(exc))

    def evaluate(self, task_id: str, now: datetime | None = None) -> None:
        """Look at one task now (the watcher's path); dispatch it if due and admitted. A task
        found done has its downstreams looked at too: their gates open on the ``done``, not on
        the next tick."""
        with self.shared.lock:
            if self._staged_config is not None:
                self.apply_config(self._staged_config)
            self.shared.look_mono = self.clock.monotonic() if now is None else None
            now = now or self.clock.now()
            if self.lease is not None and not self.lease.acting():  # displaced by a daemon of our host id
                return
            baton, watch_new_gate = self._evaluate_one(task_id, now)
            if baton is not None and baton.meta.status is Status.DONE:
                for downstream in sorted(self.shared.downstreams.get(task_id, ())):
                    watch_new_gate = self._evaluate_one(downstream, now)[1] or watch_new_gate
        if watch_new_gate:
            self.watcher.update_gate_watches()

    def _evaluate_one(self, task_id: str, now: datetime) -> tuple[Baton | None, bool]:
        """Look at one task (under the look lock): its baton as loaded, and whether a new gate file is watched."""
        try:
            baton = self.store.load(task_id)
            entry = Entry(id=task_id, baton=baton)
        except NotFound:
            return None, False
        except StoreError as exc:  # the store out of reach (or a lock held): an outage, not an invalid baton
            self._load_failed(task_id, exc)
            return None, False
        except HeartbeatError as exc:
            entry = Entry(id=task_id, error=exc)
        if entry.baton is not None:
            self._measure_latency(entry.baton)
            for upstream in _waits_on(entry.baton):
                self.shared.downstreams.setdefault(upstream, set()).add(task_id)
        _, want = self.look(entry, now, StatusLookup(self.store))
        if want is not None:
            self.dispatch([want], now)
        gate = entry.baton.meta.gate if entry.baton is not None else None
        watch_new_gate = gate is not None and gate.kind is GateKind.FILE and bool(gate.local) \
            and self.watcher.add_gate_path(gate.local, task_id)
        return entry.baton, watch_new_gate

    def _load_failed(self, task_id: str, exc: StoreError) -> None:
        """A look whose baton could not be loaded: on a shared store the lease part says the outage
        once (and once when it is over); the task is looked at again at the next poke or pass."""
        if self.lease is not None and not isinstance(exc, Busy):
            self.lease.unreachable(exc)
        else:
            self.log.debug("look_deferred", task=task_id, error=str(exc))

    def _index(self, entries: list[Entry]) -> None:
        """A scan found entries other than the last one's: who waits on whom, and their statuses, anew."""
        self._statuses = EntryStatuses(entries)
        index: dict[str, set[str]] = {}
        for entry in entries:
            if entry.baton is not None:
                for upstream in _waits_on(entry.baton):
                    index.setdefault(upstream, set()).add(entry.id)
        self.shared.downstreams = index

    def _measure_latency(self, baton: Baton) -> None:
        """Observe write→decision latency once per revision: from the write (its updated/touched
        time) to this look, which the watcher started because the baton changed."""
        mem = self._mem(baton.id)
        if baton.meta.revision == mem.measured_revision:
            return
        mem.measured_revision = baton.meta.revision
        written = max((t for t in (baton.meta.updated_at, baton.meta.touched_at) if t is not None), default=None)
        if written is not None:
            self.vitals.latency_seconds.observe((self.clock.now() - written).total_seconds())

    # -- one task: look → decide → act --------------------------------------------------

    def look(self, entry: Entry, now: datetime, statuses: Any) -> tuple[str, Want | None]:
        """Look at one task, act on what is decided; its status, and a dispatch wanted (for admission)."""
        mem = self._mem(entry.id)
        if entry.baton is None:
            error = str(entry.error)
            if mem.invalid_reported != error:
                mem.invalid_reported = error
                self.log.error("invalid_baton", task=entry.id, error=error)
                self.shared.record(Event(task=entry.id, kind=EventKind.INVALID, ts=now, actor="daemon",
                                         data={"error": error}))
            return "invalid", None
        mem.invalid_reported = ""
        baton = entry.baton
        if self.lease is not None and not self.lease.acting():  # (a pass resumed after a pause checks again)
            return baton.meta.status.value, None
        held = self.lease.held_elsewhere(baton) if self.lease is not None else ""
        if held:  # liveness is local: the host running the agent judges it, while its lease lasts
            if held != mem.last_reason:
                self.log.debug("decision", task=baton.id, epoch=baton.meta.epoch, action="nothing", reason=held)
                mem.last_reason = held
            return baton.meta.status.value, None
        self.actor.escalation_seen(baton)
        for _ in range(4):  # settle / wake / unblock change the baton; then look again
            obs, decision = self.decide(baton, now, statuses)
            if decision.action in (pol.Action.NOTHING, pol.Action.WAIT_LAUNCH):
                if baton is entry.baton and not self.actor.is_stopping(baton.id):
                    mem.quiet_entry = entry
                    mem.quiet_until = pol.stands_until(baton, decision)
                    mem.quiet_status = baton.meta.status.value
                if decision.reason != mem.last_reason:
                    self.log.debug("decision", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                                   action=decision.action.value, reason=decision.reason)
                    mem.last_reason = decision.reason
                break
            if decision.action is pol.Action.DISPATCH and mem.admission and decision.reason == mem.last_reason:
                pass  # a queued task's dispatch decision, unchanged since it was logged with its ``waiting``
            else:
                self.log.info("decision", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                              action=decision.action.value, reason=decision.reason)
            mem.last_reason = decision.reason
            if decision.action is pol.Action.DISPATCH:
                launcher = baton.launcher or self.shared.config.daemon.default_launcher
                since = baton.meta.ended_at or baton.meta.updated_at or now
                return baton.meta.status.value, Want(baton.id, launcher, since, decision, baton.meta.revision)
            try:
                new = self.actor.act(baton, decision, now, self.observer.last_blocked(baton.id),
                                     ran_for=obs.running_for,
                                     ran_for_observed=self.observer.ages.observed(baton.id, "started"))
            except Busy as exc:
                self._lock_busy(baton.id, mem, decision.action.value, exc)
                break
            except (Conflict, NotFound, NotActive, InvalidBaton, UnsafePath) as exc:
                # Someone wrote the baton (or broke it: the next look reports it invalid)
                # between our look and our act: look again next time.
                self.log.info("raced", task=baton.id, action=decision.action.value, reason=str(exc))
                break
            mem.lock_busy = False
            if decision.action is pol.Action.RESTORE_BLOCK:
                self.observer.block_restored(baton.id)
            if new is None:
                break
            self.observer.wrote(baton.id)  # our own write (an unblock, a restore) is newer than the seed
            baton = new
        return baton.meta.status.value, None

    def decide(self, baton: Baton, now: datetime, statuses: Any) -> tuple[pol.Observation, pol.Decision]:
        """What the daemon sees of the task, and what it decides from that."""
        obs = self.observer.observe(baton, now, statuses, stopping=self.actor.is_stopping(baton.id),
                                    spinning_reported_for=self.actor.spinning_reported.get(baton.id),
                                    mono=self.shared.look_mono)
        return obs, pol.decide(baton, obs, now, self.policy(baton))

    def policy(self, baton: Baton) -> pol.Policy:
        name = baton.launcher or self.shared.config.daemon.default_launcher
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = self._make_policy(name)
        return policy

    def _make_policy(self, launcher: str) -> pol.Policy:
        """The policy of one launcher's tasks: every knob ``[daemon]`` sets (:mod:`heartbeat.model.knobs`;
        a new one needs no line here), the launcher's own, and the constants."""
        lc = self.shared.config.launchers.get(launcher)
        return pol.Policy(
            **knob_values(self.shared.config.daemon),
            max_runtime=lc.max_runtime if lc else None,
            non_retryable_exit_codes=frozenset(lc.non_retryable_exit_codes) if lc else frozenset(),
            launch_timeout=defaults.LAUNCH_TIMEOUT,
        )

    def _lock_busy(self, task_id: str, mem: LookMemory, action: str, exc: Busy) -> None:
        """Another writer holds the baton's lock: skip the task until its next look, saying so once."""
        if not mem.lock_busy:
            mem.lock_busy = True
            self.log.warning("baton_locked", task=task_id, action=action, error=str(exc),
                             hint="skipped until its next look; the other tasks are served meanwhile")
        mem.quiet_entry = None

    # -- admission -----------------------------------------------------------------------

    def dispatch(self, wants: list[Want], now: datetime) -> None:
        """Admit this pass's dispatches together (capacity, budget, oldest first) and launch them."""
        if not wants:
            return
        sh = self.shared
        by_launcher: dict[str, int] = {}
        for launcher in sh.running.values():
            by_launcher[launcher] = by_launcher.get(launcher, 0) + 1
        capacity = pol.Capacity(
            running=len(sh.running),
            running_by_launcher=by_launcher,
            max_concurrent=self.shared.config.daemon.max_concurrent,
            launcher_limits={n: lc.max_concurrent for n, lc in self.shared.config.launchers.items()},
            dispatched_last_minute=self.actor.dispatched_last_minute(sh.seconds(now)),
            dispatches_per_minute=self.shared.config.daemon.dispatches_per_minute,
        )
        by_id = {w.task_id: w for w in wants}
        admissions = pol.admit([(w.task_id, w.launcher, w.since) for w in wants], capacity)
        claimed = None
        if self.lease is not None:  # a shared store: only what this host's claim took (SKIP LOCKED)
            claimed = self.lease.claimed([a.task_id for a in admissions if a.admitted])
        for adm in admissions:
            mem = self._mem(adm.task_id)
            if not adm.admitted:
                if mem.admission != adm.reason:
                    self.log.info("waiting", task=adm.task_id, reason=adm.reason)
                    mem.admission = adm.reason
                continue
            mem.admission = ""
            if claimed is not None and adm.task_id not in claimed:
                self.log.debug("not_claimed", task=adm.task_id,
                               reason="another host holds it, its host_labels are not this host's, or no lease")
                continue
            want = by_id[adm.task_id]
            try:
                if self.actor.launch(adm.task_id, want.launcher, want.decision, want.revision, now):
                    mem.lock_busy = False
            except Busy as exc:
                self._lock_busy(adm.task_id, mem, "dispatch", exc)


def _waits_on(baton: Baton) -> list[str]:
    """The tasks whose ``done`` may let ``baton`` go, and the upstreams whose briefs say what it needs:
    the targets of its ``after:``/``task:`` gate while blocked, and its ``after`` whatever its state."""
    meta = baton.meta
    gated = meta.gate.target.split(",") if meta.status is Status.BLOCKED and meta.gate is not None \
        and meta.gate.kind in (GateKind.AFTER, GateKind.TASK) else ()
    return list(dict.fromkeys([*(t for t in gated if t), *baton.after]))
