"""The clock: ``heartbeat run``.

A small loop class in the manner of huey's consumer: :meth:`Daemon.initialize`,
:meth:`Daemon.tick` (one pass over every baton; ``now`` is a parameter so tests never
patch time), :meth:`Daemon.shutdown`. :meth:`Daemon.serve` adds what a service needs:
APScheduler ticking every ``tick`` (coalesced, one instance at a time), a watchdog
observer that re-evaluates a changed baton within a fraction of a second, signal
handlers that only set flags (SIGHUP reloads, SIGTERM/SIGINT stop), and systemd
notifications (READY, WATCHDOG from the tick, STATUS with counts by state).

Per task, every look is: observe (liveness, exit status, gate) → :func:`policy.decide`
→ act. Dispatches of one pass are admitted together (:func:`policy.admit`) so capacity
and the per-minute budget are respected, oldest-waiting first. Stopping an agent (grace,
then SIGKILL) runs in the background; its successor is dispatched once it is gone, so
there is at most one agent per task at every instant.

Stopping the daemon leaves agents running; a restarted daemon re-adopts them from
their batons (owner pid + create time) instead of launching duplicates.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from heartbeat import policy as pol
from heartbeat import systemd, tasks
from heartbeat.baton import Baton, Gate, GateKind, Owner, Status
from heartbeat.config import Config, LauncherConfig, expand_argv, load_config
from heartbeat.errors import Busy, Conflict, HeartbeatError, InvalidBaton, NotActive, NotFound, UnsafePath
from heartbeat.gates import GateEvaluator
from heartbeat.ledger import Event
from heartbeat.liveness import this_host
from heartbeat.metrics import VITALS_FILE, Vitals
from heartbeat.store.base import Entry, Store
from heartbeat.timeparse import utcnow

if TYPE_CHECKING:
    from heartbeat.presets import ResultInfo, SessionPlan

__all__ = ["Daemon", "run_from_cli"]

_BLOCK_KINDS = ("created", "blocked", "unblocked", "bypass")


@dataclass
class _TaskMemory:
    """What the daemon remembers of a task between looks (never the source of truth)."""

    block_checked: tuple[int, str, str] | None = None
    block_dropped: bool = False
    last_blocked: dict[str, Any] = field(default_factory=dict)
    spinning_reported_for: datetime | None = None
    invalid_reported: str = ""
    stopping: bool = False
    stop_reason: str = ""
    stop_why: str = ""
    escalate_after_stop: bool = False
    escalation_notified: bool = False
    """This daemon ran (or checked the ledger for) the notifiers of the task's current escalation."""
    skip_block_seed: bool = False
    """The first pass's block seed no longer speaks for this task: it was consulted once, or the
    daemon wrote the baton since it was loaded (its own unblock or restore is newer than the seed)."""
    last_reason: str = ""
    quiet_entry: Entry | None = None
    """The scanned entry whose decision was "nothing"; while the scan returns this very entry
    (the file is unchanged) and ``quiet_until`` has not come, the task is not looked at again."""
    quiet_until: datetime | None = None
    quiet_status: str = ""
    lock_busy: bool = False
    """The daemon found the baton's lock held (and said so once); cleared by its next write."""
    decided_revision: int = 0
    """The baton revision the last dispatch decision was made on: the dispatch write is fenced on it."""
    inactive_seen: tuple[str, int, datetime] | None = None
    """(status, epoch, first seen): when the daemon first saw the task not active with its agent alive."""
    measured_revision: int = 0
    """The baton revision whose write→decision latency was last measured (each write counts once)."""


class Daemon:
    """The decision loop over one store. See the module docstring."""

    def __init__(
        self,
        config: Config,
        *,
        store: Store | None = None,
        dry_run: bool = False,
        log: Any = None,
    ) -> None:
        self.config = config
        self.dry_run = dry_run
        self.store: Store = store if store is not None else _open_store(config, claim=not dry_run)
        if hasattr(self.store, "lock_wait"):  # a held baton lock must not stall every task
            from heartbeat import defaults

            self.store.lock_wait = defaults.DAEMON_LOCK_WAIT
        self.log = log if log is not None else _logger()
        self.host = this_host()
        self._lock = threading.RLock()
        self._memory: dict[str, _TaskMemory] = {}
        self._dispatch_times: deque[datetime] = deque()
        self._running: dict[str, str] = {}  # task id -> launcher name, for live dispatched agents
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="heartbeat-worker")
        self.gates = GateEvaluator(config.checks, self._pool)
        self.launchers: dict[str, Any] = {}
        self._build_launchers()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._staged_config: Config | None = None
        self._wake = threading.Condition()
        self._pending: dict[str, float] = {}
        self._gate_paths: dict[str, set[str]] = {}
        self._observer: Any = None
        self._watched_dirs: dict[str, Any] = {}
        self._watch_lock = threading.Lock()  # the tick's thread and the watcher's both update the watches
        self._scheduler: Any = None
        self._block_seed: dict[str, Event] | None = None
        self._policies: dict[str, pol.Policy] = {}
        self._partition: _Partition | None = None
        self.counts: dict[str, int] = {}
        self.ticks = 0
        if hasattr(self.store.ledger, "on_unreadable"):  # a corrupt row is skipped, and logged once
            self.store.ledger.on_unreadable = lambda row, why: self.log.warning(
                "ledger_row_unreadable", row=row, error=why, hint="the row is skipped; the ledger is not changed")
        self.vitals = Vitals.start()
        self.vitals_dir: str | None = None
        """Where :meth:`tick` writes the vitals for ``/metrics`` (set by :meth:`serve`; tests leave it unset)."""

    # -- life cycle --------------------------------------------------------------------

    def _build_launchers(self) -> None:
        from heartbeat.launchers import make_launcher

        launchers: dict[str, Any] = {}
        for name, lc in self.config.launchers.items():
            if self.dry_run:
                lc = LauncherConfig(name=name, type="null", command=lc.command,
                                    non_retryable_exit_codes=lc.non_retryable_exit_codes)
            launchers[name] = make_launcher(lc)
        self.launchers = launchers

    def initialize(self, now: datetime | None = None) -> None:
        """Seed the dispatch budget from the ledger, so a restart does not relaunch everything at once."""
        now = now or utcnow()
        since = now - timedelta(seconds=60)
        for event in self.store.ledger.events(since=since, kinds=["dispatched"]):
            self._dispatch_times.append(event.ts)
        self.log.info("started", state_dir=self.config.state_dir, tick=self.config.daemon.tick,
                      launchers=sorted(self.launchers), dry_run=self.dry_run, pid=os.getpid())

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop the scheduler and watcher; agents keep running (they are re-adopted on the next start).

        Waits at most ``timeout`` seconds (default :meth:`stop_grace`) for a look in progress
        to finish, never for ever: a thread stuck in a tick must not keep the daemon from
        stopping. Returns False when one is still stuck (the store is then left open to it).
        """
        deadline = time.monotonic() + (self.stop_grace() if timeout is None else timeout)
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._scheduler is not None:
            try:
                self._scheduler.shutdown(wait=False)  # a stuck tick is waited for below, bounded
            except Exception:  # the scheduler may already be stopped
                pass
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.gates.close()
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self.log.error("shutdown_stuck", pid=os.getpid(),
                           reason="a look is still running after the grace; stopping without it")
            return False
        try:
            self.store.close()
        finally:
            self._lock.release()
        self.log.info("stopped", pid=os.getpid())
        return True

    def stop_grace(self) -> float:
        """How long a stop may wait for work in flight: the longest ``stop_grace`` of the launchers."""
        from heartbeat import defaults

        return max((lc.stop_grace for lc in self.config.launchers.values()), default=defaults.STOP_GRACE)

    # -- one pass ------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> dict[str, int]:
        """Look at every task once; returns counts by status (and ``running``)."""
        started = time.monotonic()
        with self._lock:
            if self._staged_config is not None:  # a SIGHUP during the previous pass
                self._apply_config(self._staged_config)
            now = now or utcnow()
            for launcher in self.launchers.values():
                launcher.reap()
            entries = self.store.scan()
            statuses = _EntryStatuses(entries)
            running_batons: list[Baton] = []
            wants: list[tuple[str, str, datetime, pol.Decision]] = []
            gate_paths: dict[str, set[str]] = {}
            seen: set[str] = set()
            if self.ticks == 0:
                self._block_seed = self._load_block_seed()
            # Fast path: no file changed since the last full pass and no quiet task's time has
            # come, so only the tasks that were not quiet need a look.
            part = self._partition
            fast = part is not None and bool(getattr(self.store, "scan_unchanged", False)) and now < part.quiet_end
            if fast:
                assert part is not None
                loop_entries, counts = part.active, dict(part.quiet_counts)
            else:
                loop_entries, counts = entries, {}
            quiet_counts: dict[str, int] = {}
            active: list[Entry] = []
            quiet_end = pol.FOREVER
            for entry in loop_entries:
                mem = self._memory.get(entry.id)
                if mem is not None and mem.quiet_entry is entry and mem.quiet_until is not None \
                        and now < mem.quiet_until:
                    counts[mem.quiet_status] = counts.get(mem.quiet_status, 0) + 1
                    if not fast:
                        seen.add(entry.id)
                        quiet_counts[mem.quiet_status] = quiet_counts.get(mem.quiet_status, 0) + 1
                        quiet_end = min(quiet_end, mem.quiet_until)
                    continue
                if not fast:
                    seen.add(entry.id)
                    active.append(entry)
                try:
                    status, want = self._look(entry, now, statuses)
                except Exception as exc:  # one task's trouble must not stop the others being served
                    self.log.exception("task_failed", task=entry.id, error=repr(exc))
                    status, want = "error", None
                counts[status] = counts.get(status, 0) + 1
                if want is not None:
                    wants.append(want)
                baton = entry.baton
                if baton is not None and entry.id in self._running:
                    running_batons.append(baton)  # (a quiet task never has a live agent)
                if baton is not None and baton.meta.status is Status.BLOCKED and baton.meta.gate is not None \
                        and baton.meta.gate.kind is GateKind.FILE and baton.meta.gate.target:
                    gate_paths.setdefault(baton.meta.gate.target, set()).add(entry.id)
            if not fast:
                for gone in set(self._memory) - seen:
                    del self._memory[gone]
                    self._running.pop(gone, None)
                self._partition = _Partition(active, quiet_counts, quiet_end)
            self._dispatch(wants, now)
            from heartbeat.launchers.base import cap_running_logs  # an agent printing without end

            for task_id, epoch, size in cap_running_logs(self.config.state_dir, self.config.launchers,
                                                         running_batons, self._running):
                self.log.warning("log_capped", task=task_id, epoch=epoch, size=size)
            counts["running"] = len(self._running)
            self.counts = counts
            self._gate_paths = gate_paths
            self._block_seed = None
            self.ticks += 1
        self._update_gate_watches()
        systemd.notify("WATCHDOG=1", f"STATUS={systemd.status_line(counts)}")
        seconds = time.monotonic() - started
        self.vitals.tick_done(seconds)
        self._save_vitals()
        self.log.debug("tick", tasks=len(entries), seconds=round(seconds, 4), **counts)
        return counts

    def _save_vitals(self) -> None:
        if self.vitals_dir is None:
            return
        try:
            self.vitals.save(self.vitals_dir)
        except OSError as exc:  # metrics are a report: a full disk must not stop the clock
            self.log.warning("vitals_write_failed", file=VITALS_FILE, error=str(exc))

    def evaluate(self, task_id: str, now: datetime | None = None) -> None:
        """Look at one task now (the watcher's path); dispatch it if due and admitted."""
        with self._lock:
            if self._staged_config is not None:
                self._apply_config(self._staged_config)
            now = now or utcnow()
            try:
                baton = self.store.load(task_id)
                entry = Entry(id=task_id, baton=baton)
            except NotFound:
                return
            except HeartbeatError as exc:
                entry = Entry(id=task_id, error=exc)
            if entry.baton is not None:
                self._measure_latency(entry.baton, now)
            statuses = _StatusLookup(self.store)
            _, want = self._look(entry, now, statuses)
            if want is not None:
                self._dispatch([want], now)
            gate = entry.baton.meta.gate if entry.baton is not None else None
            if gate is not None and gate.kind is GateKind.FILE and gate.target \
                    and task_id not in self._gate_paths.get(gate.target, set()):
                self._gate_paths.setdefault(gate.target, set()).add(task_id)
                watch_new_gate = True
            else:
                watch_new_gate = False
        if watch_new_gate:
            self._update_gate_watches()

    def _measure_latency(self, baton: Baton, now: datetime) -> None:
        """Observe write→decision latency once per revision: from the write (its updated/touched
        time) to this look, which the watcher started because the file changed."""
        mem = self._memory.setdefault(baton.id, _TaskMemory())
        if baton.meta.revision == mem.measured_revision:
            return
        mem.measured_revision = baton.meta.revision
        written = max((t for t in (baton.meta.updated_at, baton.meta.touched_at) if t is not None), default=None)
        if written is not None:
            self.vitals.latency_seconds.observe((utcnow() - written).total_seconds())

    def _look(
        self, entry: Entry, now: datetime, statuses: Any
    ) -> tuple[str, tuple[str, str, datetime, pol.Decision] | None]:
        mem = self._memory.setdefault(entry.id, _TaskMemory())
        if entry.baton is None:
            error = str(entry.error)
            if mem.invalid_reported != error:
                mem.invalid_reported = error
                self.log.error("invalid_baton", task=entry.id, error=error)
                self._record(Event(task=entry.id, kind="invalid", ts=now, actor="daemon", data={"error": error}))
            return "invalid", None
        mem.invalid_reported = ""
        baton = entry.baton
        if baton.meta.status is not Status.ESCALATED:
            mem.escalation_notified = False
        elif not mem.escalation_notified:
            mem.escalation_notified = True
            self._notify_if_lost(baton)
        for _ in range(4):  # settle / wake / unblock change the baton; then look again
            decision = self._decide(baton, mem, now, statuses)
            if decision.action in (pol.Action.NOTHING, pol.Action.WAIT_LAUNCH):
                if baton is entry.baton and not mem.stopping:
                    mem.quiet_entry = entry
                    mem.quiet_until = pol.stands_until(baton, decision)
                    mem.quiet_status = baton.meta.status.value
                if decision.reason != mem.last_reason:
                    self.log.debug("decision", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                                   action=decision.action.value, reason=decision.reason)
                    mem.last_reason = decision.reason
                break
            mem.last_reason = decision.reason
            self.log.info("decision", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                          action=decision.action.value, reason=decision.reason)
            if decision.action in (pol.Action.DISPATCH,):
                mem.decided_revision = baton.meta.revision
                launcher = baton.launcher or self.config.daemon.default_launcher
                since = baton.meta.ended_at or baton.meta.updated_at or now
                return baton.meta.status.value, (baton.id, launcher, since, decision)
            try:
                new = self._act(baton, decision, mem, now)
            except Busy as exc:
                self._lock_busy(baton.id, mem, decision.action.value, exc)
                break
            except (Conflict, NotFound, NotActive, InvalidBaton, UnsafePath) as exc:
                # Someone wrote the baton (or broke it: the next look reports it invalid)
                # between our look and our act: look again next time.
                self.log.info("raced", task=baton.id, action=decision.action.value, reason=str(exc))
                break
            mem.lock_busy = False
            if new is None:
                break
            mem.skip_block_seed = True  # our own write (an unblock, a restore) is newer than the seed
            baton = new
        return baton.meta.status.value, None

    def _decide(self, baton: Baton, mem: _TaskMemory, now: datetime, statuses: Any) -> pol.Decision:
        obs = self._observe(baton, mem, now, statuses)
        return pol.decide(baton, obs, now, self._policy(baton))

    def _policy(self, baton: Baton) -> pol.Policy:
        name = baton.launcher or self.config.daemon.default_launcher
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = self._make_policy(name)
        return policy

    def _make_policy(self, launcher: str) -> pol.Policy:
        d = self.config.daemon
        lc = self.config.launchers.get(launcher)
        return pol.Policy(
            stall_after=d.stall_after,
            progress_after=d.progress_after,
            max_attempts=d.max_attempts,
            max_idle_resumes=d.max_idle_resumes,
            backoff_initial=d.backoff_initial,
            backoff_max=d.backoff_max,
            max_runtime=lc.max_runtime if lc else None,
            non_retryable_exit_codes=frozenset(lc.non_retryable_exit_codes) if lc else frozenset(),
            on_spinning=d.on_spinning,
            launch_timeout=10.0,
            inactive_grace=d.inactive_grace,
        )

    # -- observing -------------------------------------------------------------------------

    def _observe(self, baton: Baton, mem: _TaskMemory, now: datetime, statuses: Any) -> pol.Observation:
        meta = baton.meta
        alive = False
        exit_code: int | None = None
        exit_signal: int | None = None
        owner = meta.owner
        if owner is not None:
            if mem.stopping:
                alive = True  # a stop is under way: treat as alive until it reports
            else:
                launcher = self._launcher_for(owner)
                if owner.pid is None and not owner.unit and owner.how == "dispatch":
                    adopted = self._adopt_pending(baton)
                    alive = adopted is not None
                    if adopted is not None:
                        owner = adopted
                elif launcher is not None and owner.how == "dispatch":
                    alive = bool(launcher.alive(owner))
                    if not alive:
                        status = launcher.exit_status(owner, self._exit_file(baton.id, meta.epoch))
                        if status is not None:
                            exit_code, exit_signal = status.code, status.signal
                else:
                    from heartbeat.liveness import is_alive

                    alive = is_alive(owner, host=self.host)
            if alive and owner.how == "dispatch":
                self._running[baton.id] = owner.launcher or baton.launcher or self.config.daemon.default_launcher
            else:
                self._running.pop(baton.id, None)
        else:
            self._running.pop(baton.id, None)
        gate_open = False
        if meta.status is Status.BLOCKED and meta.gate is not None:
            gate_open = self.gates.is_open(baton.id, meta.gate, now, workdir=baton.workdir,
                                           task_status=statuses.get)
        block_dropped = False
        if meta.status in (Status.ACTIVE, Status.SNOOZED, Status.PAUSED):
            # Keyed on more than the revision: a hand edit can change the file and keep the revision.
            key = (meta.revision, meta.status.value, baton.blocked_on)
            if mem.block_checked != key:
                if mem.block_checked is None and self._block_seed is not None and not mem.skip_block_seed:
                    mem.skip_block_seed = True
                    latest = self._block_seed.get(baton.id)
                else:
                    found = self.store.ledger.events(baton.id, kinds=_BLOCK_KINDS)
                    latest = found[-1] if found else None
                mem.block_checked = key
                held = latest is not None and (latest.kind in ("blocked", "bypass") or (
                    latest.kind == "created" and latest.data.get("status") == Status.BLOCKED.value))
                mem.block_dropped = held
                mem.last_blocked = dict(latest.data) if held and latest is not None else {}
                if held and latest is not None and latest.kind == "created":
                    mem.last_blocked = {"on": latest.data.get("blocked_on", ""), "gate": latest.data.get("gate")}
            block_dropped = mem.block_dropped
        else:
            mem.block_checked = None
        spinning_reported = mem.spinning_reported_for is not None and mem.spinning_reported_for == meta.progress_at
        inactive_since: datetime | None = None
        if alive and meta.status is not Status.ACTIVE:
            seen = mem.inactive_seen
            if seen is None or seen[:2] != (meta.status.value, meta.epoch):
                seen = mem.inactive_seen = (meta.status.value, meta.epoch, now)
            inactive_since = seen[2]
        else:
            mem.inactive_seen = None
        pending: tuple[str, ...] = ()
        if baton.after and meta.status is Status.ACTIVE and owner is None:
            from heartbeat.handoff import pending_upstreams

            pending = tuple(pending_upstreams(baton, statuses.get))
        return pol.Observation(alive=alive, exit_code=exit_code, exit_signal=exit_signal, gate_open=gate_open,
                               block_dropped=block_dropped, spinning_reported=spinning_reported,
                               inactive_since=inactive_since, upstream_pending=pending)

    def _load_block_seed(self) -> dict[str, Event]:
        """The latest block-related event of every task, in one query: the first pass over
        thousands of batons must not ask the ledger once per task."""
        latest: dict[str, Event] = {}
        for event in self.store.ledger.events(kinds=_BLOCK_KINDS):
            latest[event.task] = event
        return latest

    def _launcher_for(self, owner: Owner) -> Any:
        return self.launchers.get(owner.launcher) if owner.launcher else None

    def _log_dir(self, task_id: str) -> str:
        return os.path.join(self.config.state_dir, "logs", task_id)

    def _exit_file(self, task_id: str, epoch: int) -> str:
        return os.path.join(self._log_dir(task_id), f"{epoch}.exit")

    def _result_of(self, baton: Baton) -> ResultInfo | None:
        """What a preset launcher's output says about the run that just ended (None: no preset)."""
        owner = baton.meta.owner
        lc = self.config.launchers.get(owner.launcher) if owner is not None else None
        if lc is None or not lc.preset or owner is None or owner.how != "dispatch" or self.dry_run:
            return None
        from heartbeat.presets import parse_result, read_log_tail

        return parse_result(lc.preset, read_log_tail(os.path.join(self._log_dir(baton.id),
                                                                  f"{baton.meta.epoch}.log")))

    def _session_plan(self, baton: Baton, lc: LauncherConfig | None) -> SessionPlan:
        """The session of the next dispatch (:func:`heartbeat.presets.plan_session`)."""
        from heartbeat.presets import PRESETS, PresetName, plan_session

        if lc is None:
            return plan_session("fresh", previous="", previous_resumes=0, retry=False)
        meta = baton.meta
        retry = meta.attempt > 0 and meta.last_exit != 0
        compactions = 0
        if lc.session == "resume" and retry and meta.session:
            compactions = sum(1 for e in self.store.ledger.events(baton.id, kinds=["compacting"])
                              if meta.session in (e.data.get("session_id"), e.data.get("session")))
        return plan_session(lc.session, previous=meta.session, previous_resumes=meta.session_resumes, retry=retry,
                            compactions=compactions, max_resumes=lc.max_resumes_per_session,
                            pins_session=PRESETS[PresetName(lc.preset)].pins_session if lc.preset else True)

    def _adopt_pending(self, baton: Baton) -> Owner | None:
        """A dispatch whose pid never reached the baton (the daemon died mid-launch): find its agent
        through the pid file the launcher's shim writes, and record it."""
        from heartbeat.safefile import read_regular

        path = os.path.join(self._log_dir(baton.id), f"{baton.meta.epoch}.pid")
        try:
            data = json.loads(read_regular(path, 4096))  # a FIFO there is refused, never waited on
            pid, create_time = int(data["pid"]), float(data["create_time"])
        except UnsafePath as exc:
            self.log.warning("file_refused", task=baton.id, path=path, error=exc.message)
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        owner = Owner(pid=pid, create_time=create_time, host=self.host,
                      launcher=baton.meta.owner.launcher if baton.meta.owner else "", how="dispatch",
                      started_at=baton.meta.dispatched_at)
        from heartbeat.liveness import is_alive

        if not is_alive(owner, host=self.host):
            return None
        try:
            with self.store.edit(baton.id, epoch=baton.meta.epoch, actor="daemon") as ed:
                ed.baton.meta.owner = owner
                ed.event("adopted", pid=pid)
        except HeartbeatError:
            return None
        self.log.info("adopted", task=baton.id, epoch=baton.meta.epoch, pid=pid)
        return owner

    # -- acting ----------------------------------------------------------------------------

    def _act(self, baton: Baton, d: pol.Decision, mem: _TaskMemory, now: datetime) -> Baton | None:
        a = pol.Action
        if d.action is a.SETTLE:
            return self._settle(baton, d, mem, now)
        if d.action is a.WAKE:
            with self.store.edit(baton.id, expect_revision=baton.meta.revision, actor="daemon", now=now) as ed:
                ed.baton.meta.status = Status.ACTIVE
                ed.baton.meta.snooze_until = None
                ed.event("woke")
            return ed.baton
        if d.action is a.UNBLOCK:
            gate = baton.meta.gate.spec() if baton.meta.gate else "human"
            new = tasks.unblock(self.store, baton.id, by=f"gate:{gate}", note=d.reason, gate_opened=gate)
            self.gates.forget(baton.id)
            return new
        if d.action is a.ESCALATE:
            return self._escalate(baton, d.reason, now)
        if d.action is a.RESTORE_BLOCK:
            return self._restore_block(baton, mem, now)
        if d.action is a.REPORT_SPINNING:
            mem.spinning_reported_for = baton.meta.progress_at
            self._record(Event(task=baton.id, kind="spinning", ts=now, epoch=baton.meta.epoch, actor="daemon",
                               data={"step": baton.step, "since": (baton.meta.progress_at or now).isoformat()}))
            return None
        if d.action in (a.STOP_THEN_DISPATCH, a.STOP_THEN_ESCALATE, a.STOP):
            self._start_stop(baton, d, mem, now)
            return None
        return None

    def _settle(self, baton: Baton, d: pol.Decision, mem: _TaskMemory, now: datetime) -> Baton:
        meta = baton.meta
        owner = meta.owner
        obs_code = None
        obs_signal = None
        launcher = self._launcher_for(owner) if owner else None
        if launcher is not None and owner is not None and owner.how == "dispatch":
            status = launcher.exit_status(owner, self._exit_file(baton.id, meta.epoch))
            if status is not None:
                obs_code, obs_signal = status.code, status.signal
        kind = d.exit_kind or pol.ExitKind.FAILED
        if mem.stop_why == "inactive":  # stopped because its task was no longer active: not a failed attempt
            kind = pol.ExitKind.FINISHED
        started = (owner.started_at if owner else None) or meta.dispatched_at
        duration = (now - started).total_seconds() if started else None
        progressed = kind is pol.ExitKind.SHIFT_END
        if mem.stop_reason:
            reason = f"stopped: {mem.stop_reason}"
        elif obs_signal is not None:
            reason = f"killed by signal {obs_signal}"
        elif obs_code is not None:
            reason = f"exit {obs_code}"
        else:
            reason = d.reason
        info = self._result_of(baton)
        kind, reason, blocked_on = _judge_result(info, kind, reason, owner.launcher if owner else "")
        if duration is not None and duration >= 1:
            from heartbeat.timeparse import format_duration

            reason = f"{reason} after {format_duration(duration)}"
        escalate = mem.escalate_after_stop
        stop_why = mem.stop_why
        stop_reason = mem.stop_reason
        mem.stopping = False
        # The stop's intent (why, escalate after) is forgotten only once the exit is recorded: a
        # settle refused by a racing write must not turn a spinning agent's escalation into a retry.
        with self.store.edit(baton.id, expect_revision=meta.revision, actor="daemon", now=now) as ed:
            m = ed.baton.meta
            m.owner = None
            m.ended_at = now
            # A run whose result says it failed counts as failed even with exit 0 (so backoff applies).
            m.last_exit = None if info is not None and info.is_error and obs_code == 0 else obs_code
            if info is not None and info.session_id:
                m.session = info.session_id
            if info is not None and info.resume_failed:
                m.session, m.session_resumes = "", 0
            ed.event("exited", code=obs_code, signal=obs_signal, pid=owner.pid if owner else None,
                     duration_s=round(duration, 3) if duration is not None else None, progress=progressed,
                     kind=kind.value, **(info.event_data() if info is not None else {}))
            if kind is pol.ExitKind.IDLE:
                m.idle_resumes += 1
                m.last_failure = f"ended without moving the step ({reason})"
            elif kind is pol.ExitKind.FAILED:
                m.last_failure = reason
            elif kind is pol.ExitKind.NON_RETRYABLE and m.status is not Status.ACTIVE:
                m.last_failure = reason  # stopped already (by the agent or a human): keep their status and reason
            elif kind is pol.ExitKind.NON_RETRYABLE:
                ed.baton.blocked_on = blocked_on or f"the agent exited {obs_code}, which the launcher marks " \
                                                    "non-retryable: a human is needed"
                m.status = Status.BLOCKED
                m.gate = Gate(GateKind.HUMAN)
                m.blocked_at = now
                m.last_failure = reason
                ed.event("blocked", on=ed.baton.blocked_on, gate="human")
            if kind is not pol.ExitKind.FINISHED and m.status is Status.ACTIVE:
                ed.event("stalled", why=stop_why or d.stalled_why or "exited")
        mem.stop_reason = ""
        mem.stop_why = ""
        mem.escalate_after_stop = False
        self._running.pop(baton.id, None)
        self.log.info("exited", task=baton.id, epoch=meta.epoch, attempt=meta.attempt, kind=kind.value,
                      code=obs_code, signal=obs_signal, reason=reason)
        new = ed.baton
        if escalate and new.meta.status is Status.ACTIVE:
            return self._escalate(new, stop_reason or d.reason, now)
        return new

    def _escalate(self, baton: Baton, reason: str, now: datetime) -> Baton:
        with self.store.edit(baton.id, expect_revision=baton.meta.revision, actor="daemon", now=now) as ed:
            ed.baton.meta.status = Status.ESCALATED
            ed.event("escalated", reason=reason)
        self.log.warning("escalated", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                         reason=reason)
        self._memory.setdefault(baton.id, _TaskMemory()).escalation_notified = True
        self._notify(ed.baton, reason)
        return ed.baton

    def _notify_if_lost(self, baton: Baton) -> None:
        """Run the notifiers an escalation never recorded: the daemon that escalated was stopped
        (SIGKILL, or SIGTERM with the notifier still queued) before they ran. At least once."""
        if not self.config.notify:
            return
        events = self.store.ledger.events(baton.id, kinds=["escalated", "notified"])
        last = max((i for i, e in enumerate(events) if e.kind == "escalated"), default=None)
        if last is None:
            return
        done = {e.data.get("name") for e in events[last + 1:]}
        missing = [name for name in self.config.notify if name not in done]
        if missing:
            reason = str(events[last].data.get("reason", ""))
            self.log.warning("notify_resent", task=baton.id, epoch=baton.meta.epoch, notifiers=missing,
                             reason="the escalation's notifiers never reported (the daemon stopped first)")
            self._notify(baton, reason, names=missing)

    def _notify(self, baton: Baton, reason: str, names: list[str] | None = None) -> None:
        from heartbeat.commands import run_command

        values = {"id": baton.id, "reason": reason, "status": baton.meta.status.value,
                  "epoch": baton.meta.epoch, "attempt": baton.meta.attempt}
        for name, nc in self.config.notify.items():
            if names is not None and name not in names:
                continue
            argv = expand_argv(nc.command, values)

            def run(name: str = name, argv: list[str] = argv, timeout: float = nc.timeout) -> None:
                result = run_command(argv, timeout=timeout)
                self._record(Event(task=baton.id, kind="notified", ts=utcnow(), epoch=baton.meta.epoch,
                                   actor="daemon", data={"name": name, "code": result.code,
                                                         "error": result.error}))
                log = self.log.info if result.ok else self.log.error
                log("notified", task=baton.id, notifier=name, code=result.code, error=result.error,
                    output=result.output[-500:])

            self._pool.submit(run)

    def _restore_block(self, baton: Baton, mem: _TaskMemory, now: datetime) -> Baton:
        data = mem.last_blocked
        on = str(data.get("on") or data.get("was_on") or "(restored: the block was removed by a hand edit)")
        try:
            gate = Gate.parse(str(data.get("gate") or "human"))
        except HeartbeatError:
            gate = Gate(GateKind.HUMAN)
        with self.store.edit(baton.id, expect_revision=baton.meta.revision, actor="daemon", now=now) as ed:
            ed.baton.blocked_on = on
            ed.baton.meta.status = Status.BLOCKED
            ed.baton.meta.gate = gate
            ed.baton.meta.blocked_at = now
            ed.event("bypass", was_on=on, gate=gate.spec(), on=on)
        mem.block_checked = None
        self.log.warning("bypass", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                         reason="a hand edit dropped the block; it is held blocked", blocked_on=on)
        return ed.baton

    def _start_stop(self, baton: Baton, d: pol.Decision, mem: _TaskMemory, now: datetime) -> None:
        if mem.stopping:
            return
        owner = baton.meta.owner
        if owner is None:
            return
        launcher = self._launcher_for(owner)
        mem.stopping = True
        mem.stop_reason = d.reason
        mem.stop_why = d.stalled_why or "hung"
        mem.escalate_after_stop = d.action is pol.Action.STOP_THEN_ESCALATE
        if d.stalled_why == "spinning":
            self._record(Event(task=baton.id, kind="spinning", ts=now, epoch=baton.meta.epoch, actor="daemon",
                               data={"step": baton.step,
                                     "since": (baton.meta.progress_at or now).isoformat()}))
        lc = self.config.launchers.get(owner.launcher)
        grace = lc.stop_grace if lc else 10.0
        why = {"never_wrote": "hung", "silent": "hung"}.get(mem.stop_why, mem.stop_why)

        def stop() -> None:
            gone = True
            try:
                if launcher is not None:
                    gone = bool(launcher.stop(owner, grace=grace))
                else:
                    from heartbeat.liveness import stop_process_group

                    gone = bool(stop_process_group(owner.pid or 0, owner.create_time, grace))
            except Exception as exc:  # a stop must never kill the worker thread
                self.log.error("stop_failed", task=baton.id, error=repr(exc))
                gone = False
            self._record(Event(task=baton.id, kind="stopped", ts=utcnow(), epoch=baton.meta.epoch,
                               actor="daemon", data={"why": why, "pid": owner.pid, "gone": gone,
                                                     "reason": d.reason}))
            self.log.info("stopped", task=baton.id, epoch=baton.meta.epoch, pid=owner.pid, why=why, gone=gone)
            with self._lock:
                if not gone:
                    mem.stopping = False  # try again next look
                    return
                mem.stopping = False
            self.poke(baton.id)

        self.log.warning("stopping", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                         pid=owner.pid, reason=d.reason)
        self._pool.submit(stop)

    def _dispatch(self, wants: list[tuple[str, str, datetime, pol.Decision]], now: datetime) -> None:
        if not wants:
            return
        while self._dispatch_times and (now - self._dispatch_times[0]).total_seconds() >= 60:
            self._dispatch_times.popleft()
        by_launcher: dict[str, int] = {}
        for launcher in self._running.values():
            by_launcher[launcher] = by_launcher.get(launcher, 0) + 1
        capacity = pol.Capacity(
            running=len(self._running),
            running_by_launcher=by_launcher,
            max_concurrent=self.config.daemon.max_concurrent,
            launcher_limits={n: lc.max_concurrent for n, lc in self.config.launchers.items()},
            dispatched_last_minute=len(self._dispatch_times),
            dispatches_per_minute=self.config.daemon.dispatches_per_minute,
        )
        decisions = {w[0]: w[3] for w in wants}
        launchers = {w[0]: w[1] for w in wants}
        for adm in pol.admit([(w[0], w[1], w[2]) for w in wants], capacity):
            mem = self._memory.setdefault(adm.task_id, _TaskMemory())
            if not adm.admitted:
                if mem.last_reason != adm.reason:
                    self.log.info("waiting", task=adm.task_id, reason=adm.reason)
                    mem.last_reason = adm.reason
                continue
            self._launch(adm.task_id, launchers[adm.task_id], decisions[adm.task_id], now)

    def _launch(self, task_id: str, launcher_name: str, decision: pol.Decision, now: datetime) -> None:
        launcher = self.launchers.get(launcher_name)
        try:
            baton = self.store.load(task_id)
        except HeartbeatError:
            return
        decided = self._memory.setdefault(task_id, _TaskMemory()).decided_revision or baton.meta.revision
        if baton.meta.revision != decided or not _dispatchable(baton):
            self._dispatch_aborted(task_id, baton)  # written since the decision (a block, a done)
            return
        if launcher is None:
            self._escalate(baton, f"launcher {launcher_name!r} is not in the config", now)
            return
        from heartbeat.brief import render_brief
        from heartbeat.launchers.base import LaunchRequest, write_private_file

        stalled = self.store.ledger.events(task_id, kinds=["stalled", "dispatched"])
        stalled_at = stalled[-1].ts.isoformat() if stalled and stalled[-1].kind == "stalled" else None
        resume = baton.meta.dispatches > 0 or baton.meta.epoch > 0
        plan = self._session_plan(baton, self.config.launchers.get(launcher_name))
        # Phase 1: record the dispatch (new epoch, owner pending) before anything runs, so a
        # daemon killed mid-launch finds the dispatch on restart and adopts, not duplicates.
        try:
            with self.store.edit(task_id, expect_revision=decided, actor="daemon", now=now) as ed:
                m = ed.baton.meta
                if not _dispatchable(ed.baton):
                    ed.cancel()
                    self._dispatch_aborted(task_id, ed.baton)
                    return
                m.epoch += 1
                m.attempt += 1
                m.dispatches += 1
                m.dispatched_at = now
                m.owner = Owner(how="dispatch", launcher=launcher_name, host=self.host, started_at=now)
                m.session, m.session_resumes = plan.session, plan.resumes
                ed.event("dispatched", reason=decision.reason, attempt=m.attempt, launcher=launcher_name,
                         resume=resume, stalled_at=stalled_at, pid=None, unit="", session=plan.session,
                         session_resumed=plan.resume)
        except (Conflict, NotFound, NotActive) as exc:
            self.log.info("raced", task=task_id, action="dispatch", reason=str(exc))
            self.poke(task_id)
            return
        except Busy as exc:
            self._lock_busy(task_id, self._memory.setdefault(task_id, _TaskMemory()), "dispatch", exc)
            return
        except HeartbeatError as exc:  # the disk is full, the state dir unwritable: the next tick tries again
            self.log.error("dispatch_failed", task=task_id, error=str(exc))
            return
        pending = ed.baton
        self._memory.setdefault(task_id, _TaskMemory()).lock_busy = False
        epoch = pending.meta.epoch
        self._dispatch_times.append(now)
        log_dir = self._log_dir(task_id)
        upstream: tuple[dict[str, Any], ...] = ()
        if pending.after:
            from heartbeat.handoff import load_packages

            upstream = tuple(load_packages(self.store, pending))
        brief = render_brief(pending, max_attempts=self.config.daemon.max_attempts, now=now, upstream=upstream)
        for warning in brief.warnings:
            self.log.warning("brief_warning", task=task_id, epoch=epoch, warning=warning)
        brief_file = os.path.join(log_dir, f"{epoch}.brief.md")
        brief_text = brief.text
        if plan.resume:
            from heartbeat.presets import resume_note

            how = baton.meta.last_failure or f"exit {baton.meta.last_exit}"
            brief_text = resume_note(how) + brief_text
        try:  # logs/<id> is checked (no symlink, ours) before the brief is written in it
            write_private_file(brief_file, brief_text, state_dir=self.config.state_dir, task=task_id)
        except HeartbeatError as exc:
            self._launch_failed(pending, str(exc), now)
            return
        except OSError as exc:
            self._launch_failed(pending, f"cannot write the brief {brief_file}: {exc.strerror or exc}", now)
            return
        request = LaunchRequest(
            task_id=task_id, epoch=epoch, attempt=pending.meta.attempt,
            workdir=pending.workdir or self.config.state_dir, brief_text=brief_text, brief_file=brief_file,
            log_file=os.path.join(log_dir, f"{epoch}.log"), exit_file=self._exit_file(task_id, epoch),
            state_dir=self.config.state_dir, config_path=self.config.path,
            session=plan.session, resume=plan.resume,
        )
        try:
            owner = launcher.launch(request)
        except HeartbeatError as exc:
            self._launch_failed(pending, str(exc), now)
            return
        except OSError as exc:
            self._launch_failed(pending, f"cannot start the agent: {exc.strerror or exc}", now)
            return
        # Phase 2: the agent runs; record who it is. The agent may have written already
        # (same epoch), so this is fenced by epoch, not by revision.
        try:
            with self.store.edit(task_id, epoch=epoch, actor="daemon") as ed:
                owner.how = "dispatch"
                owner.launcher = launcher_name
                owner.started_at = owner.started_at or now
                ed.baton.meta.owner = owner
                if ed.baton.meta.touched_at is not None and ed.old.meta.touched_at == ed.old.meta.dispatched_at:
                    ed.baton.meta.dispatched_at = ed.now  # "never wrote since dispatch" counts from here
                ed.event("launched", pid=owner.pid, unit=owner.unit)
        except Busy as exc:
            # Someone holds the baton's lock: the new epoch (phase 1) guards the task, and the
            # shim's pid file lets the next look adopt the agent, as after a daemon crash here.
            self.log.warning("dispatch_recorded_later", task=task_id, epoch=epoch, error=str(exc),
                             hint="the baton's lock is held; the agent is adopted from its pid file")
            self.poke(task_id)
        except HeartbeatError as exc:
            self.log.error("dispatch_unrecorded", task=task_id, epoch=epoch, error=str(exc))
        self._running[task_id] = launcher_name
        self.log.info("dispatched", task=task_id, epoch=epoch, attempt=pending.meta.attempt,
                      reason=decision.reason, launcher=launcher_name, pid=owner.pid, unit=owner.unit)

    def _lock_busy(self, task_id: str, mem: _TaskMemory, action: str, exc: Busy) -> None:
        """Another writer holds the baton's lock: skip the task until its next look, saying so once."""
        if not mem.lock_busy:
            mem.lock_busy = True
            self.log.warning("baton_locked", task=task_id, action=action, error=str(exc),
                             hint="skipped until its next look; the other tasks are served meanwhile")
        mem.quiet_entry = None

    def _dispatch_aborted(self, task_id: str, baton: Baton) -> None:
        """The baton changed between the decision and the dispatch write: no agent; look again soon."""
        self.log.info("raced", task=task_id, action="dispatch", status=baton.meta.status.value,
                      revision=baton.meta.revision, reason="the baton changed after the dispatch decision")
        self.poke(task_id)

    def _launch_failed(self, baton: Baton, error: str, now: datetime) -> None:
        self.log.error("launch_failed", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                       reason=error)
        try:
            with self.store.edit(baton.id, epoch=baton.meta.epoch, actor="daemon", now=now) as ed:
                ed.baton.meta.owner = None
                ed.baton.meta.ended_at = now
                ed.baton.meta.last_exit = None
                ed.baton.meta.last_failure = f"launch failed: {error}"
                ed.event("exited", code=None, signal=None, pid=None, duration_s=0, progress=False, kind="failed",
                         error=error)
        except HeartbeatError:
            pass

    def _record(self, event: Event) -> None:
        try:
            self.store.record([event])
        except HeartbeatError as exc:
            self.log.error("ledger_write_failed", task=event.task, kind=event.kind, error=str(exc))

    # -- serving: scheduler, watcher, signals ----------------------------------------------

    def poke(self, task_id: str) -> None:
        """Ask for ``task_id`` to be looked at soon (debounced), off the tick."""
        with self._wake:
            self._pending[task_id] = time.monotonic()
            self._wake.notify()

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception as exc:  # the clock must keep ticking whatever one pass hit
            self.log.exception("tick_failed", error=repr(exc))

    def _safe_gc(self) -> None:
        """The ``[retention]`` job: in the scheduler's pool beside the tick, never inside it."""
        from heartbeat.retention import run_gc

        try:
            store = _open_store(self.config, claim=False)  # its own: the tick's store caches scans, not thread-safe
            try:
                result = run_gc(store, self.config.retention, now=utcnow())
            finally:
                store.close()
            self.log.info("gc", removed_files=len(result.removed_files), removed_bytes=result.removed_bytes,
                          archived=len(result.archived), folded_rows=sum(result.folded.values()),
                          skipped=len(result.skipped), archive=result.archive_file)
        except Exception as exc:  # a failed gc is logged and retried next time; the clock is unaffected
            self.log.exception("gc_failed", error=repr(exc))

    def _watch_worker(self) -> None:
        from heartbeat import defaults

        debounce = defaults.WATCH_DEBOUNCE
        while not self._stop.is_set():
            with self._wake:
                if not self._pending:
                    self._wake.wait(timeout=5.0)
                    continue
                now_m = time.monotonic()
                ready = [t for t, at in self._pending.items() if now_m - at >= debounce]
                if not ready:
                    wait = min(debounce - (now_m - at) for at in self._pending.values())
                    self._wake.wait(timeout=max(wait, 0.001))
                    continue
                for task_id in ready:
                    del self._pending[task_id]
            for task_id in ready:
                try:
                    self.evaluate(task_id)
                except Exception as exc:
                    self.log.exception("evaluate_failed", task=task_id, error=repr(exc))

    def _start_watcher(self) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        daemon = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type not in ("created", "modified", "moved", "closed", "deleted"):
                    return
                for raw in (event.src_path, getattr(event, "dest_path", "")):
                    path = os.fsdecode(raw) if raw else ""
                    if path:
                        daemon._on_path(path)

        self._handler = Handler()
        self._observer = Observer()
        self._observer.schedule(self._handler, self.store_batons_dir(), recursive=False)
        self._observer.start()

    def store_batons_dir(self) -> str:
        return os.path.join(self.config.state_dir, "batons")

    def _on_path(self, path: str) -> None:
        directory, name = os.path.split(path)
        if directory == self.store_batons_dir():
            if name.startswith(".") or not name.endswith(".toml"):
                return
            self.poke(name[:-5])
            return
        for task_id in list(self._gate_paths.get(path, ())):  # a look may add to it meanwhile
            self.poke(task_id)

    def _update_gate_watches(self) -> None:
        if self._observer is None:
            return
        with self._watch_lock:
            self._update_gate_watches_locked()

    def _update_gate_watches_locked(self) -> None:
        with self._lock:  # the watcher's look adds gate paths while the tick's thread gets here
            gate_paths = {path: set(ids) for path, ids in self._gate_paths.items()}
        wanted = {os.path.dirname(p) for p in gate_paths}
        wanted = {d for d in wanted if os.path.isdir(d) and d != self.store_batons_dir()}
        for directory in set(self._watched_dirs) - wanted:
            try:
                self._observer.unschedule(self._watched_dirs.pop(directory))
            except (KeyError, ValueError):
                pass
        for directory in wanted - set(self._watched_dirs):
            try:
                self._watched_dirs[directory] = self._observer.schedule(self._handler, directory, recursive=False)
            except OSError as exc:
                self.log.warning("gate_watch_failed", directory=directory, error=str(exc))
                continue
            self.log.debug("watching", directory=directory)
            # A gate file created before the watch existed raised no event: look once more now.
            for path, task_ids in gate_paths.items():
                if os.path.dirname(path) == directory:
                    for task_id in task_ids:
                        self.poke(task_id)

    def reload(self) -> bool:
        """Re-read the config (SIGHUP). An invalid new config is logged and the old one kept."""
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            new = load_config(self.config.path)
        except HeartbeatError as exc:
            self.log.error("reload_failed", error=str(exc), keeping=self.config.path)
            systemd.notify("READY=1")
            return False
        if new.state_dir != self.config.state_dir:
            self.log.error("reload_failed", error="state_dir cannot change on reload; restart the daemon",
                           keeping=self.config.path)
            systemd.notify("READY=1")
            return False
        old_tick = self.config.daemon.tick
        # A pass in progress holds the lock (a first pass over a backlog can take seconds on a
        # loaded machine): the valid config is then staged and the next pass starts with it,
        # so a SIGHUP is answered at once instead of after the pass.
        if self._lock.acquire(blocking=False):
            try:
                self._apply_config(new)
            finally:
                self._lock.release()
            staged = False
        else:
            self._staged_config = new
            staged = True
        if self._scheduler is not None and new.daemon.tick != old_tick:
            self._scheduler.reschedule_job("tick", trigger="interval", seconds=new.daemon.tick)
        self.log.info("reloaded", config=new.path, tick=new.daemon.tick, launchers=sorted(new.launchers),
                      staged=staged)
        systemd.notify("READY=1")
        return True

    def _apply_config(self, new: Config) -> None:
        """Swap in a reloaded config (under the lock, between passes)."""
        self._staged_config = None
        self.config = new
        self._policies = {}
        self._partition = None
        self._build_launchers()
        for mem in self._memory.values():
            mem.quiet_entry = None  # decisions may differ under the new config
        self.gates.checks = dict(new.checks)

    def serve(self) -> int:
        """Run until SIGTERM/SIGINT: the scheduler ticks, the watcher reacts, SIGHUP reloads."""
        from apscheduler.schedulers.background import BackgroundScheduler

        # Handlers only set flags; the main thread, waiting on ``signalled``, does the work.
        signalled = threading.Event()

        def on_term(signum: int, _frame: Any) -> None:
            self._stop.set()
            signalled.set()

        def on_hup(_signum: int, _frame: Any) -> None:
            self._reload.set()
            signalled.set()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)
        self.vitals_dir = self.config.state_dir
        self.initialize()
        self._start_watcher()
        web = self._start_web()
        worker = threading.Thread(target=self._watch_worker, name="heartbeat-watch", daemon=True)
        worker.start()
        self._scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self._scheduler.add_job(self._safe_tick, "interval", seconds=self.config.daemon.tick, id="tick",
                                next_run_time=datetime.now().astimezone())
        retention = self.config.retention
        if retention.enabled and not self.dry_run and hasattr(self.store, "logs_dir"):
            self._scheduler.add_job(self._safe_gc, "interval", seconds=retention.every, id="gc",
                                    next_run_time=datetime.now().astimezone() + timedelta(
                                        seconds=min(retention.every, 300.0)))
        systemd.notify("READY=1", "STATUS=started")
        self._scheduler.start()
        interval = systemd.watchdog_interval()
        if interval is not None and interval / 2 < self.config.daemon.tick:
            self.log.warning("watchdog_shorter_than_tick", watchdog_s=interval, tick=self.config.daemon.tick,
                             hint="set WatchdogSec= to more than twice the tick")
        while not self._stop.is_set():
            signalled.wait(timeout=5.0)
            signalled.clear()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                self.reload()
        systemd.notify("STOPPING=1")
        if web is not None:
            web.should_exit = True
        deadline = time.monotonic() + self.stop_grace()
        clean = self.shutdown(timeout=self.stop_grace())
        _exit_if_stuck(clean, deadline, self.log)
        return 0

    def _start_web(self) -> Any:
        """The status page and /metrics in a thread, when ``[http] listen`` is set (the clock runs either way)."""
        http = self.config.http
        if not http.listen:
            return None
        try:
            from heartbeat import web

            token = http.token or os.environ.get("HEARTBEAT_WEB_TOKEN", "")
            host, port = web.parse_listen(http.listen, what="[http] listen")
            web.check_exposure(host, token)
            app = web.build_app(_open_store(self.config, claim=False), state_dir=self.config.state_dir, token=token,
                                max_attempts=self.config.daemon.max_attempts,
                                default_launcher=self.config.daemon.default_launcher, vitals=self.vitals)
            server, _, url = web.start_in_thread(app, host, port)
        except ImportError as exc:
            self.log.error("http_failed", error=f"{exc}: install heartbeat[web] for [http]")
            return None
        except HeartbeatError as exc:
            self.log.error("http_failed", error=str(exc))
            return None
        self.log.info("http_serving", url=url, token=bool(token), pid=os.getpid())
        return server


def _judge_result(info: ResultInfo | None, kind: pol.ExitKind, reason: str, launcher: str) -> tuple[pol.ExitKind, str, str]:
    """The exit kind and reason once a preset's result is read, and the block reason of a
    non-retryable one: a result that says it failed is a failed attempt even after exit 0."""
    if info is None or kind is pol.ExitKind.FINISHED:
        return kind, reason, ""
    if info.non_retryable:
        said = info.reason or "an authentication error"
        return (pol.ExitKind.NON_RETRYABLE, f"{reason}: {said}",
                f"launcher {launcher} reports: {said} (not retryable: a human is needed)")
    if info.is_error and kind in (pol.ExitKind.SHIFT_END, pol.ExitKind.IDLE, pol.ExitKind.FAILED):
        return pol.ExitKind.FAILED, f"{reason}: {info.reason or 'the agent reported an error'}", ""
    return kind, reason, ""


@dataclass
class _Partition:
    """The last full pass split in two: tasks to look at every time, and quiet ones (counted by status)."""

    active: list[Entry]
    quiet_counts: dict[str, int]
    quiet_end: datetime
    """The earliest time a quiet task's decision may change: a full pass is due then."""


class _EntryStatuses:
    """``task:ID`` gates during a pass: the statuses of this pass's entries, indexed on first use
    (most passes have no task gate to open, and indexing thousands of entries is not free)."""

    def __init__(self, entries: list[Entry]) -> None:
        self._entries = entries
        self._index: dict[str, Status] | None = None

    def get(self, task_id: str) -> Status | None:
        if self._index is None:
            self._index = {e.id: e.baton.meta.status for e in self._entries if e.baton is not None}
        return self._index.get(task_id)


class _StatusLookup:
    """``task:ID`` gates outside a full pass: look the other task up in the store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, task_id: str) -> Status | None:
        try:
            return self.store.load(task_id).meta.status
        except HeartbeatError:
            return None


def _exit_if_stuck(clean: bool, deadline: float, log: Any) -> None:
    """End the process now when a thread is still stuck at ``deadline`` (the interpreter would
    wait for it at exit for ever): SIGTERM stops the daemon within the stop grace, whatever hangs."""
    # Every thread, daemon or not: the interpreter joins the pools' workers at exit whatever their flag.
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
    if clean and not stuck:
        return
    from heartbeat.commands import kill_running

    killed = kill_running()  # a check or notifier the abandoned threads ran must not outlive us
    log.error("exit_abandoning_threads", threads=stuck, commands_killed=killed, pid=os.getpid())
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _dispatchable(baton: Baton) -> bool:
    """What a dispatch decision saw and its write must still find: active (so not blocked, done,
    snoozed or paused, and with no gate to wait on) and no owner."""
    return baton.meta.status is Status.ACTIVE and baton.meta.owner is None


def _open_store(config: Config, *, claim: bool = True) -> Store:
    from heartbeat.store import URL_ENV, open_store, store_url

    url = store_url(config.store.url)
    store = open_store(config.state_dir, url)
    if url:
        from heartbeat.store.files import ensure_private_dir

        os.environ[URL_ENV] = url  # the launchers pass it on: agents write to the same database
        # Agents' logs still live in the state dir; the file watcher watches an empty batons/
        # (the tick's scan sees the database's writes; Store.watch is for the daemon split).
        ensure_private_dir(config.state_dir)
        ensure_private_dir(os.path.join(config.state_dir, "batons"), what="batons dir")
        claim_daemon = getattr(store, "claim_daemon", None)
        if claim and claim_daemon is not None:
            try:
                claim_daemon()  # one daemon per database until leased daemons exist
            except BaseException:
                store.close()
                raise
    return store


def _logger() -> Any:
    from heartbeat.logging import get_logger

    return get_logger("heartbeat.daemon")


def run_from_cli(args: Any) -> int:
    """``heartbeat run [--dry-run] [--once]``."""
    from heartbeat.config import find_config
    from heartbeat.errors import ConfigError
    from heartbeat.logging import configure

    path = find_config(args.config)
    if path is None:
        raise ConfigError("no config found (tried --config, $HEARTBEAT_CONFIG, ./heartbeat.toml, "
                          "/etc/heartbeat/heartbeat.toml): run `heartbeat init`")
    config = load_config(path)
    lock_fd = hold_daemon_lock(config.state_dir)  # --once and --dry-run too: they dispatch (or decide) as well
    try:
        configure(fmt=config.daemon.log_format, level=config.daemon.log_level)
        daemon = Daemon(config, dry_run=args.dry_run)
        if args.once:
            daemon.initialize()
            daemon.tick()
            daemon._pool.shutdown(wait=True)
            daemon.store.close()
            return 0
        return daemon.serve()
    finally:
        os.close(lock_fd)


def hold_daemon_lock(state_dir: str) -> int:
    """Take ``<state_dir>/daemon.lock`` (an flock held until the returned descriptor is closed) or
    raise :class:`DaemonRunning` naming the holder's pid: two clocks on one state dir would both
    dispatch, past ``max_concurrent`` and into each other's tasks."""
    import errno
    import fcntl
    import stat

    from heartbeat.errors import DaemonRunning, StoreError, UnsafePath
    from heartbeat.store.files import ensure_private_dir

    ensure_private_dir(state_dir)
    path = os.path.join(state_dir, "daemon.lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath("is a symbolic link; heartbeat does not follow links in its state dir",
                             path=path) from None
        raise StoreError(f"cannot open the daemon lock: {exc.strerror}", path=path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath("is not a regular file (a FIFO, device or directory)", path=path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise DaemonRunning(f"another daemon (pid {holder}) is running on this state dir; "
                                "one daemon per state dir", path=state_dir) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
