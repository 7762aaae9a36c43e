"""Acting on a decision: settle an exit, wake, unblock, escalate and notify, restore a
dropped block, stop an agent, and the two-phase launch.

Every write is fenced (on the revision the decision saw, or on the epoch) so a write
that raced the look is refused by the store, never applied over it. Stopping an agent
(grace, then SIGKILL) and running notifiers happen in the worker pool; a stop's
successor is dispatched only once the agent is gone (the stop pokes the task).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from heartbeat.config.shape import LauncherConfig, expand_argv
from heartbeat.daemon.leased import LeasePart
from heartbeat.daemon.shared import Shared
from heartbeat.launchers.liveness import is_alive
from heartbeat.model import defaults
from heartbeat.model import policy as pol
from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Owner, OwnerKind, Status
from heartbeat.model.errors import Busy, Conflict, HeartbeatError, NotActive, NotFound
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.timeparse import utcnow
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.handoff import refused_done

if TYPE_CHECKING:
    from heartbeat.presets.common import ResultInfo, SessionPlan

__all__ = ["Actor", "StopMemory", "judge_result"]


@dataclass(slots=True)
class StopMemory:
    """A stop of one task's agent under way, and what to do once it has exited.

    Set by :meth:`Actor.start_stop` and cleared by the stop's worker thread or the settle,
    always under the look lock. Its intent (why, escalate after) is forgotten only once the
    exit is recorded: a settle refused by a racing write must not turn an escalation into a retry.
    """

    stopping: bool = False
    reason: str = ""
    why: pol.StallReason | None = None
    escalate_after: bool = False


class Actor:
    """Writes for decisions, and what acting must remember per task (under the look lock)."""

    def __init__(self, shared: Shared, lease: LeasePart | None) -> None:
        self.shared = shared
        self.lease = lease
        """The lease part on a store shared by many hosts (a launch is renewed from then on); None on the file store."""
        self.stops: dict[str, StopMemory] = {}
        """Per task: the stop under way (or the intent of the last one, until its exit is settled)."""
        self.spinning_reported: dict[str, datetime | None] = {}
        """Per task: the ``progress_at`` a spinning report was made for (reported once per stretch)."""
        self.escalation_notified: set[str] = set()
        """Tasks whose current escalation's notifiers this daemon ran (or checked the ledger for)."""
        self.dispatch_times: deque[float] = deque()
        """When each dispatch of the last minute was made (the per-minute budget; under the look lock)."""

    def forget(self, task_id: str) -> None:
        self.stops.pop(task_id, None)
        self.spinning_reported.pop(task_id, None)
        self.escalation_notified.discard(task_id)

    def is_stopping(self, task_id: str) -> bool:
        stop = self.stops.get(task_id)
        return stop is not None and stop.stopping

    def seed_budget(self, now: datetime, seconds: float) -> None:
        """Count the dispatches of the last minute from the ledger, so a restart does not relaunch
        everything (``seconds``: ``now`` on the clock :meth:`dispatched_last_minute` is given)."""
        since = now - timedelta(seconds=60)
        for event in self.shared.store.ledger.events(since=since, kinds=[EventKind.DISPATCHED]):
            self.dispatch_times.append(seconds - max(0.0, (now - event.ts).total_seconds()))

    def dispatched_last_minute(self, seconds: float) -> int:
        """Dispatches in the minute before ``seconds`` (:meth:`Shared.seconds`: the monotonic clock,
        so a wall clock stepped back does not hold the budget spent for the length of the step)."""
        while self.dispatch_times and seconds - self.dispatch_times[0] >= 60:
            self.dispatch_times.popleft()
        return len(self.dispatch_times)

    # -- the decision's act --------------------------------------------------------------

    def act(self, baton: Baton, d: pol.Decision, now: datetime, last_blocked: dict[str, Any], *,
            ran_for: float | None = None, ran_for_observed: bool = True) -> Baton | None:
        """Carry out a decision other than a dispatch; the baton as written, or None when nothing was.
        ``ran_for``: how long the agent has run, on the monotonic clock (the observation's);
        ``ran_for_observed`` False: only the wall clock said so (a first sight of a dead agent), so
        the record states no length.

        Raises the store's refusals (:class:`Busy`, :class:`Conflict`, ...) for the caller to judge.
        """
        a = pol.Action
        store = self.shared.store
        if d.action is a.SETTLE:
            return self.settle(baton, d, now, ran_for=ran_for, ran_for_observed=ran_for_observed)
        if d.action is a.WAKE:
            with store.edit(baton.id, expect_revision=baton.meta.revision, actor="daemon", now=now) as ed:
                ed.baton.meta.status = Status.ACTIVE
                ed.baton.meta.snooze_until = None
                ed.event(EventKind.WOKE)
            return ed.baton
        if d.action is a.UNBLOCK:
            gate = baton.meta.gate.spec() if baton.meta.gate else "human"
            new = tasks.unblock(store, baton.id, by=f"gate:{gate}", note=d.reason, gate_opened=gate)
            self.shared.gates.forget(baton.id)
            return new
        if d.action is a.ESCALATE:
            return self.escalate(baton, d.reason, now)
        if d.action is a.RESTORE_BLOCK:
            return self.restore_block(baton, last_blocked, now)
        if d.action is a.REPORT_SPINNING:
            self.spinning_reported[baton.id] = baton.meta.progress_at
            self.shared.record(Event(task=baton.id, kind=EventKind.SPINNING, ts=now, epoch=baton.meta.epoch, actor="daemon",
                                     data={"step": baton.step, "since": (baton.meta.progress_at or now).isoformat()}))
            return None
        if d.action in (a.STOP_THEN_DISPATCH, a.STOP_THEN_ESCALATE, a.STOP):
            self.start_stop(baton, d, now)
            return None
        return None

    def settle(self, baton: Baton, d: pol.Decision, now: datetime, *, ran_for: float | None = None,
               ran_for_observed: bool = True) -> Baton:
        """Record the exit of the task's agent: its code or signal, how long it ran (``ran_for``, on the
        monotonic clock: a wall clock stepped meanwhile must not record "after 2h" for a run of
        seconds; without it, from the baton's wall-clock start), what kind of end."""
        sh = self.shared
        meta = baton.meta
        owner = meta.owner
        obs_code = None
        obs_signal = None
        lease_lapsed = False
        launch_error = ""
        launcher = sh.launcher_named(owner.launcher) if owner else None
        if launcher is not None and owner is not None and owner.how == OwnerKind.DISPATCH:
            status = launcher.exit_status(owner, sh.layout.exit(baton.id, meta.epoch))
            if status is not None:
                obs_code, obs_signal = status.code, status.signal
                lease_lapsed, launch_error = status.lease_lapsed, status.launch_error
        lease_lapsed = lease_lapsed or (self.lease is not None and self.lease.stopped_for_lease(baton.id, meta.epoch))
        stop = self.stops.get(baton.id) or StopMemory()
        kind = d.exit_kind or pol.ExitKind.FAILED
        if launch_error and kind is pol.ExitKind.FAILED:  # its program never ran: not the agent's failure
            kind = pol.ExitKind.LAUNCH_FAILED
        if stop.why is pol.StallReason.INACTIVE:  # stopped because its task was no longer active: not a failed attempt
            kind = pol.ExitKind.FINISHED
        elif lease_lapsed and kind is not pol.ExitKind.FINISHED:  # stopped for its host's lease: not its own end
            kind = pol.ExitKind.LEASE_LAPSED
        started = (owner.started_at if owner else None) or meta.dispatched_at
        duration = ran_for if ran_for is not None else (now - started).total_seconds() if started else None
        if not ran_for_observed:  # a wall-clock difference across a possible step: not stated as fact
            duration = None
        progressed = kind is pol.ExitKind.SHIFT_END
        if kind is pol.ExitKind.LAUNCH_FAILED:
            reason = launch_error
        elif stop.reason:
            reason = f"stopped: {stop.reason}"
        elif kind is pol.ExitKind.LEASE_LAPSED:
            reason = "stopped by its shim: its host's lease lapsed unrenewed (the database out of reach, or the host paused)"
        elif obs_signal is not None:
            reason = f"killed by signal {obs_signal}"
        elif obs_code is not None:
            reason = f"exit {obs_code}"
        else:
            reason = d.reason
        info = self.result_of(baton)
        kind, reason, blocked_on = judge_result(info, kind, reason, owner.launcher if owner else "")
        if duration is not None and duration >= 1:
            from heartbeat.model.timeparse import format_duration

            reason = f"{reason} after {format_duration(duration)}"
        # An agent whose `done` was refused by a failed guarantee: the reason names the guarantee. Asked of
        # the ledger, never of ``baton.guarantees``: the baton a pass hands over is the scan's decision view,
        # which leaves the guarantees out (the refusal went unnamed whenever the exit was met by a pass).
        refused = refused_done(sh.store, baton.id, meta.epoch) if kind in (pol.ExitKind.IDLE, pol.ExitKind.FAILED) \
            else ""
        unnoted = self._unnoted_at_exit(baton)
        escalate = stop.escalate_after
        stop_why = stop.why
        stop_reason = stop.reason
        stop.stopping = False
        # The stop's intent (why, escalate after) is forgotten only once the exit is recorded: a
        # settle refused by a racing write must not turn a spinning agent's escalation into a retry.
        with sh.store.edit(baton.id, expect_revision=meta.revision, actor="daemon", now=now) as ed:
            m = ed.baton.meta
            m.owner = None
            m.ended_at = now
            # A run whose result says it failed counts as failed even with exit 0 (so backoff applies).
            m.last_exit = None if info is not None and info.is_error and obs_code == 0 else obs_code
            if info is not None and info.session_id:
                m.session = info.session_id
            if info is not None and info.resume_failed:
                m.session, m.session_resumes = "", 0
            ed.event(EventKind.EXITED, code=obs_code, signal=obs_signal, pid=owner.pid if owner else None,
                     duration_s=round(duration, 3) if duration is not None else None, progress=progressed,
                     kind=kind.value, **(info.event_data() if info is not None else {}), **unnoted,
                     **({"error": launch_error} if kind is pol.ExitKind.LAUNCH_FAILED else {}))
            if info is not None and info.cost_usd:  # capped: an agent's output must not make its baton unreadable
                m.cost_usd = min(round(m.cost_usd + info.cost_usd, 6), float(2**53))
            if kind is pol.ExitKind.RATE_LIMITED:
                self.wait_for_limit(ed, info, now)
            elif kind is pol.ExitKind.LEASE_LAPSED:
                m.attempt = max(0, m.attempt - 1)  # the host's outage, not the agent's failure
                m.last_exit = None
            else:
                m.wait_until = m.wait_since = None
                m.wait_reason, m.limit_hits = "", 0
            if kind is pol.ExitKind.LAUNCH_FAILED:
                count_launch_failure(m, reason)
            else:
                m.launch_failures = 0
            if kind is pol.ExitKind.IDLE:
                m.idle_resumes += 1
                m.last_failure = f"{refused} ({reason})" if refused else f"{pol.IDLE_FAILURE} ({reason})"
            elif kind is pol.ExitKind.FAILED:
                m.last_failure = f"{reason}; {refused}" if refused else reason
            elif kind is pol.ExitKind.NON_RETRYABLE and m.status is not Status.ACTIVE:
                m.last_failure = reason  # stopped already (by the agent or a human): keep their status and reason
            elif kind is pol.ExitKind.NON_RETRYABLE:
                ed.baton.blocked_on = blocked_on or f"the agent exited {obs_code}, which the launcher marks " \
                                                    "non-retryable: a human is needed"
                m.status = Status.BLOCKED
                m.gate = Gate(GateKind.HUMAN)
                m.blocked_at = now
                m.last_failure = reason
                ed.event(EventKind.BLOCKED, on=ed.baton.blocked_on, gate="human")
            if kind not in (pol.ExitKind.FINISHED, pol.ExitKind.RATE_LIMITED, pol.ExitKind.LAUNCH_FAILED) \
                    and m.status is Status.ACTIVE:
                ed.event(EventKind.STALLED, why=stop_why or d.stalled_why or pol.StallReason.EXITED)
        stop.reason = ""
        stop.why = None
        stop.escalate_after = False
        sh.running.pop(baton.id, None)
        sh.exits.forget(baton.id)
        sh.log.info("exited", task=baton.id, epoch=meta.epoch, attempt=meta.attempt, kind=kind.value,
                    code=obs_code, signal=obs_signal, reason=reason)
        new = ed.baton
        if escalate and new.meta.status is Status.ACTIVE:
            return self.escalate(new, stop_reason or d.reason, now)
        return new

    def wait_for_limit(self, ed: Any, info: ResultInfo | None, now: datetime) -> None:
        """A run refused by a rate or usage limit (inside the settle's edit): give back the attempt its
        dispatch counted and hold the task until the reset the CLI named (else its retry-after, else
        the backoff for this many limited runs in a row); :func:`policy.decide` waits or escalates."""
        from heartbeat.presets.common import parse_reset, unknown_reset_zone

        m = ed.baton.meta
        d = self.shared.config.daemon
        said = info.reason if info is not None else ""
        reset, retry_after = parse_reset(said, now)
        until = pol.limit_wait(ed.baton, reset, retry_after, now,
                               pol.Policy(backoff_initial=d.backoff_initial, backoff_max=d.backoff_max))
        source = "reset" if until == reset else "retry-after" if retry_after else "backoff"
        m.attempt = max(0, m.attempt - 1)
        m.wait_since = m.wait_since or now
        m.wait_until = until
        m.wait_reason = said or "rate limited"
        m.limit_hits += 1
        zone = unknown_reset_zone(said)  # a reset in no real zone is not read: said, not guessed
        ed.event(EventKind.RATE_LIMITED, until=until.isoformat(), source=source, hits=m.limit_hits,
                 reason=m.wait_reason, **({"unknown_zone": zone} if zone else {}))

    # -- escalating and notifying ----------------------------------------------------------

    def escalate(self, baton: Baton, reason: str, now: datetime) -> Baton:
        sh = self.shared
        with sh.store.edit(baton.id, expect_revision=baton.meta.revision, actor="daemon", now=now) as ed:
            ed.baton.meta.status = Status.ESCALATED
            ed.event(EventKind.ESCALATED, reason=reason)
        sh.log.warning("escalated", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                       reason=reason)
        self.escalation_notified.add(baton.id)
        self.notify(ed.baton, reason)
        return ed.baton

    def escalation_seen(self, baton: Baton) -> None:
        """At each look: an escalation this daemon has not notified yet (it escalated before a
        restart) gets the notifiers the ledger says never ran."""
        if baton.meta.status is not Status.ESCALATED:
            self.escalation_notified.discard(baton.id)
        elif baton.id not in self.escalation_notified:
            self.escalation_notified.add(baton.id)
            self.notify_if_lost(baton)

    def notify_if_lost(self, baton: Baton) -> None:
        """Run the notifiers an escalation never recorded: the daemon that escalated was stopped
        (SIGKILL, or SIGTERM with the notifier still queued) before they ran. At least once."""
        sh = self.shared
        if not sh.config.notify:
            return
        events = sh.store.ledger.events(baton.id, kinds=[EventKind.ESCALATED, EventKind.NOTIFIED])
        last = max((i for i, e in enumerate(events) if e.kind == EventKind.ESCALATED), default=None)
        if last is None:
            return
        done = {e.data.get("name") for e in events[last + 1:]}
        missing = [name for name in sh.config.notify if name not in done]
        if missing:
            reason = str(events[last].data.get("reason", ""))
            sh.log.warning("notify_resent", task=baton.id, epoch=baton.meta.epoch, notifiers=missing,
                           reason="the escalation's notifiers never reported (the daemon stopped first)")
            self.notify(baton, reason, names=missing)

    def notify(self, baton: Baton, reason: str, names: list[str] | None = None) -> None:
        """Run the ``[notify.*]`` commands in the worker pool; each records a ``notified`` event."""
        from heartbeat.system.commands import run_command

        sh = self.shared
        values = {"id": baton.id, "reason": reason, "status": baton.meta.status.value,
                  "epoch": baton.meta.epoch, "attempt": baton.meta.attempt}
        for name, nc in sh.config.notify.items():
            if names is not None and name not in names:
                continue
            argv = expand_argv(nc.command, values)

            def run(name: str = name, argv: list[str] = argv, timeout: float = nc.timeout) -> None:
                result = run_command(argv, timeout=timeout)
                sh.record(Event(task=baton.id, kind=EventKind.NOTIFIED, ts=utcnow(), epoch=baton.meta.epoch,
                                actor="daemon", data={"name": name, "code": result.code,
                                                      "error": result.error}))
                log = sh.log.info if result.ok else sh.log.error
                log("notified", task=baton.id, notifier=name, code=result.code, error=result.error,
                    output=result.output[-500:])

            sh.pool.submit(run)

    def restore_block(self, baton: Baton, last_blocked: dict[str, Any], now: datetime) -> Baton:
        """Hold blocked a task whose block a hand edit dropped (``last_blocked``: the ledger's block)."""
        sh = self.shared
        data = last_blocked
        on = str(data.get("on") or data.get("was_on") or "(restored: the block was removed by a hand edit)")
        try:
            gate = Gate.parse(str(data.get("gate") or "human"))
        except HeartbeatError:
            gate = Gate(GateKind.HUMAN)
        with sh.store.edit(baton.id, expect_revision=baton.meta.revision, actor="daemon", now=now) as ed:
            ed.baton.blocked_on = on
            ed.baton.meta.status = Status.BLOCKED
            ed.baton.meta.gate = gate
            ed.baton.meta.blocked_at = now
            ed.event(EventKind.BYPASS, was_on=on, gate=gate.spec(), on=on)
        sh.log.warning("bypass", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                       reason="a hand edit dropped the block; it is held blocked", blocked_on=on)
        return ed.baton

    # -- stopping --------------------------------------------------------------------------

    def start_stop(self, baton: Baton, d: pol.Decision, now: datetime) -> None:
        """Stop the task's agent in the worker pool (grace, then SIGKILL); the task is poked once it is gone."""
        sh = self.shared
        stop = self.stops.get(baton.id)
        if stop is None:
            stop = self.stops[baton.id] = StopMemory()
        if stop.stopping:
            return
        owner = baton.meta.owner
        if owner is None:
            return
        launcher = sh.launcher_named(owner.launcher)
        stop.stopping = True
        stop.reason = d.reason
        stop.why = d.stalled_why or pol.StallReason.HUNG
        stop.escalate_after = d.action is pol.Action.STOP_THEN_ESCALATE
        if d.stalled_why is pol.StallReason.SPINNING:
            sh.record(Event(task=baton.id, kind=EventKind.SPINNING, ts=now, epoch=baton.meta.epoch, actor="daemon",
                            data={"step": baton.step, "since": (baton.meta.progress_at or now).isoformat()}))
        lc = sh.config.launchers.get(owner.launcher)
        grace = lc.stop_grace if lc else defaults.STOP_GRACE
        why = pol.StallReason.HUNG if stop.why in (pol.StallReason.NEVER_WROTE, pol.StallReason.SILENT) else stop.why

        def run() -> None:
            gone = True
            try:
                if launcher is not None:
                    gone = bool(launcher.stop(owner, grace=grace))
                else:
                    from heartbeat.launchers.liveness import stop_process_group

                    gone = bool(stop_process_group(owner.pid or 0, owner.create_time, grace))
            except Exception as exc:  # a stop must never kill the worker thread
                sh.log.error("stop_failed", task=baton.id, error=repr(exc))
                gone = False
            sh.record(Event(task=baton.id, kind=EventKind.STOPPED, ts=utcnow(), epoch=baton.meta.epoch,
                            actor="daemon", data={"why": why, "pid": owner.pid, "gone": gone,
                                                  "reason": d.reason}))
            sh.log.info("stopped", task=baton.id, epoch=baton.meta.epoch, pid=owner.pid, why=why, gone=gone)
            with sh.lock:
                stop.stopping = False  # not gone: try again next look
                if not gone:
                    return
            sh.pokes.poke(baton.id)

        sh.log.warning("stopping", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                       pid=owner.pid, reason=d.reason)
        sh.pool.submit(run)

    # -- launching -------------------------------------------------------------------------

    def launch(self, task_id: str, launcher_name: str, decision: pol.Decision, decided: int, now: datetime) -> bool:
        """Dispatch a task admitted on revision ``decided``, in two phases; True once phase 1 is written.

        Phase 1 records the dispatch (new epoch, owner pending) before anything runs, so a
        daemon killed mid-launch finds it on restart and adopts the agent, never duplicates it.
        Phase 2 records who the agent is. Raises :class:`Busy` when phase 1 meets a held lock.

        Four steps: :meth:`_prepare` (the baton still dispatchable, the launcher known),
        :meth:`_claim` (phase 1), :meth:`_spawn` (the brief written, the agent started) and
        :meth:`_record` (phase 2).
        """
        ready = self._prepare(task_id, launcher_name, decided, now)
        if ready is None:
            return False
        baton, launcher = ready
        plan = self.session_plan(baton, self.shared.config.launchers.get(launcher_name))
        pending = self._claim(baton, launcher_name, decision, decided or baton.meta.revision, plan, now)
        if pending is None:
            return False
        self.dispatch_times.append(self.shared.seconds(now))
        owner = self._spawn(baton, pending, launcher, plan, now)
        if owner is not None:
            self._record(pending, owner, launcher_name, decision, now)
        return True

    def _prepare(self, task_id: str, launcher_name: str, decided: int, now: datetime) -> tuple[Baton, Any] | None:
        """The baton as the decision saw it (revision ``decided``, or its current one when 0) and
        its launcher; None when there is nothing to launch: the baton is unreadable or changed
        since (a block, a done: looked at again soon), or its launcher is not in the config
        (escalated)."""
        sh = self.shared
        launcher = sh.launchers.get(launcher_name)
        try:
            baton = sh.store.load(task_id)
        except HeartbeatError:
            return None
        decided = decided or baton.meta.revision
        if baton.meta.revision != decided or not dispatchable(baton):
            self.dispatch_aborted(task_id, baton)  # written since the decision (a block, a done)
            return None
        if launcher is None:
            self.escalate(baton, f"launcher {launcher_name!r} is not in the config", now)
            return None
        return baton, launcher

    def _claim(self, baton: Baton, launcher_name: str, decision: pol.Decision, decided: int, plan: SessionPlan,
               now: datetime) -> Baton | None:
        """Phase 1, fenced on revision ``decided``: a new epoch and attempt, the owner pending on this
        host, the session planned, and the ``dispatched`` event. The baton as written, or None when
        the write was refused (raced, or the disk failed: the next look tries again). Raises
        :class:`Busy` when the baton's lock is held."""
        sh = self.shared
        task_id = baton.id
        stalled = sh.store.ledger.events(task_id, kinds=[EventKind.STALLED, EventKind.DISPATCHED])
        stalled_at = stalled[-1].ts.isoformat() if stalled and stalled[-1].kind == EventKind.STALLED else None
        resume = baton.meta.dispatches > 0 or baton.meta.epoch > 0
        try:
            with sh.store.edit(task_id, expect_revision=decided, actor="daemon", now=now) as ed:
                m = ed.baton.meta
                if not dispatchable(ed.baton):
                    ed.cancel()
                    self.dispatch_aborted(task_id, ed.baton)
                    return None
                m.epoch += 1
                m.attempt += 1
                m.dispatches += 1
                m.dispatched_at = now
                m.owner = Owner(how=OwnerKind.DISPATCH, launcher=launcher_name, host=sh.host, started_at=now)
                m.session, m.session_resumes = plan.session, plan.resumes
                ed.event(EventKind.DISPATCHED, reason=decision.reason, attempt=m.attempt, launcher=launcher_name,
                         host=sh.host, resume=resume, stalled_at=stalled_at, pid=None, unit="", session=plan.session,
                         session_resumed=plan.resume)
        except (Conflict, NotFound, NotActive) as exc:
            sh.log.info("raced", task=task_id, action="dispatch", reason=str(exc))
            sh.pokes.poke(task_id)
            return None
        except Busy:
            raise
        except HeartbeatError as exc:  # the disk is full, the state dir unwritable: the next tick tries again
            sh.log.error("dispatch_failed", task=task_id, error=str(exc))
            return None
        return ed.baton

    def _unnoted_at_exit(self, baton: Baton) -> dict[str, Any]:
        """What the ended run did since its note, from its trail (:mod:`heartbeat.hotpath.trail`), for its
        ``exited`` event: the ledger (any host, the report) keeps the seam's unnoted work."""
        from heartbeat.reports.brief import unnoted_for

        found = unnoted_for(self.shared.config.state_dir, self.shared.store, baton)
        if found is None or found.epoch != baton.meta.epoch:
            return {}
        calls = list(found.calls)
        return {"unnoted": {"calls": len(calls) + found.cut, "unknown": found.unknown,
                            "last": [c.to_json() for c in calls[-defaults.TRAIL_BRIEF_CALLS:]]}}

    def _brief_text(self, baton: Baton, pending: Baton, plan: SessionPlan, now: datetime) -> str:
        """The brief ``pending``'s agent starts from: its upstreams' packages included, and for a
        resumed session a note of how the run before it (``baton``) ended. Warnings are logged."""
        from heartbeat.reports.brief import render_brief

        sh = self.shared
        upstream: tuple[dict[str, Any], ...] = ()
        if pending.after:
            from heartbeat.tasks.handoff import load_packages

            upstream = tuple(load_packages(sh.store, pending))
        from heartbeat.reports.brief import unnoted_for
        from heartbeat.tasks.needs import needs_lines

        unnoted = unnoted_for(sh.config.state_dir, sh.store, baton)
        brief = render_brief(pending, max_attempts=sh.config.daemon.max_attempts, now=now, upstream=upstream,
                             unnoted=unnoted.lines() if unnoted else (),
                             needs=needs_lines(sh.store, pending, downstreams=sh.downstreams_of(pending.id)))
        for warning in brief.warnings:
            sh.log.warning("brief_warning", task=pending.id, epoch=pending.meta.epoch, warning=warning)
        if not plan.resume:
            return brief.text
        from heartbeat.presets.registry import resume_note

        return resume_note(baton.meta.last_failure or f"exit {baton.meta.last_exit}") + brief.text

    def _spawn(self, baton: Baton, pending: Baton, launcher: Any, plan: SessionPlan, now: datetime) -> Owner | None:
        """Write the brief of ``pending`` (phase 1's baton; ``baton`` is the one before it, whose
        failure a resumed session is told of) and start its agent: who the agent is, or None when
        the launch failed (recorded as a failed exit, so the attempt counts)."""
        from heartbeat.launchers.base import LaunchRequest, write_private_file

        sh = self.shared
        task_id, epoch = pending.id, pending.meta.epoch
        layout = sh.layout
        brief_file = layout.brief(task_id, epoch)
        brief_text = self._brief_text(baton, pending, plan, now)
        request = LaunchRequest(
            task_id=task_id, epoch=epoch, attempt=pending.meta.attempt,
            workdir=pending.workdir or sh.config.state_dir, brief_text=brief_text, brief_file=brief_file,
            log_file=layout.log(task_id, epoch), exit_file=layout.exit(task_id, epoch),
            state_dir=sh.config.state_dir, config_path=sh.config.path,
            session=plan.session, resume=plan.resume,
        )
        step = f"cannot write the brief {brief_file}"  # what an OSError of the step in hand means
        try:  # logs/<id> is checked (no symlink, ours) before the brief is written in it
            write_private_file(brief_file, brief_text, state_dir=sh.config.state_dir, task=task_id)
            if self.lease is not None:  # before the agent starts: its shim stops it when the lease runs out
                step = "cannot write the lease file"
                request.lease_file = self.lease.lease_file(task_id, epoch)
                request.lease_ttl = self.lease.lease.ttl
            step = "cannot start the agent"
            owner: Owner = launcher.launch(request)
        except HeartbeatError as exc:
            self.launch_failed(pending, str(exc), now)
            return None
        except OSError as exc:
            self.launch_failed(pending, f"{step}: {exc.strerror or exc}", now)
            return None
        return owner

    def _record(self, pending: Baton, owner: Owner, launcher_name: str, decision: pol.Decision, now: datetime) -> None:
        """Phase 2: the agent runs; watch its exit, record who it is on the baton (fenced by epoch,
        not revision: the agent may have written already), count it running here, and have its
        lease renewed on a shared store."""
        sh = self.shared
        task_id, epoch = pending.id, pending.meta.epoch
        if not sh.exits.watch(task_id, owner) and sh.exits.started and owner.pid and not is_alive(owner):
            sh.pokes.poke_now(task_id)  # it ended before it could be watched: look again at once, not at the tick
        try:
            with sh.store.edit(task_id, epoch=epoch, actor="daemon") as ed:
                owner.how = OwnerKind.DISPATCH
                owner.launcher = launcher_name
                owner.started_at = owner.started_at or now
                ed.baton.meta.owner = owner
                if ed.baton.meta.touched_at is not None and ed.old.meta.touched_at == ed.old.meta.dispatched_at:
                    ed.baton.meta.dispatched_at = ed.now  # "never wrote since dispatch" counts from here
                ed.event(EventKind.LAUNCHED, pid=owner.pid, unit=owner.unit)
        except Busy as exc:
            # Someone holds the baton's lock: the new epoch (phase 1) guards the task, and the
            # shim's pid file lets the next look adopt the agent, as after a daemon crash here.
            sh.log.warning("dispatch_recorded_later", task=task_id, epoch=epoch, error=str(exc),
                           hint="the baton's lock is held; the agent is adopted from its pid file")
            sh.pokes.poke(task_id)
        except HeartbeatError as exc:
            sh.log.error("dispatch_unrecorded", task=task_id, epoch=epoch, error=str(exc))
        sh.running[task_id] = launcher_name
        if self.lease is not None:  # renewed from now on (the claim's lease covers it until then)
            self.lease.launched(task_id, epoch, owner)
        sh.log.info("dispatched", task=task_id, epoch=epoch, attempt=pending.meta.attempt,
                    reason=decision.reason, launcher=launcher_name, pid=owner.pid, unit=owner.unit)

    def dispatch_aborted(self, task_id: str, baton: Baton) -> None:
        """The baton changed between the decision and the dispatch write: no agent; look again soon."""
        sh = self.shared
        sh.log.info("raced", task=task_id, action="dispatch", status=baton.meta.status.value,
                    revision=baton.meta.revision, reason="the baton changed after the dispatch decision")
        sh.pokes.poke(task_id)

    def launch_failed(self, baton: Baton, error: str, now: datetime) -> None:
        sh = self.shared
        sh.log.error("launch_failed", task=baton.id, epoch=baton.meta.epoch, attempt=baton.meta.attempt,
                     reason=error)
        try:
            with sh.store.edit(baton.id, epoch=baton.meta.epoch, actor="daemon", now=now) as ed:
                ed.baton.meta.owner = None
                ed.baton.meta.ended_at = now
                ed.baton.meta.last_exit = None
                count_launch_failure(ed.baton.meta, error)
                ed.event(EventKind.EXITED, code=None, signal=None, pid=None, duration_s=0, progress=False,
                         kind=pol.ExitKind.LAUNCH_FAILED, error=error)
        except HeartbeatError:
            pass

    # -- what presets add ------------------------------------------------------------------

    def result_of(self, baton: Baton) -> ResultInfo | None:
        """What a preset launcher's output says about the run that just ended (None: no preset)."""
        sh = self.shared
        owner = baton.meta.owner
        lc = sh.config.launchers.get(owner.launcher) if owner is not None else None
        if lc is None or not lc.preset or owner is None or owner.how != OwnerKind.DISPATCH or sh.dry_run:
            return None
        from heartbeat.presets.registry import parse_result
        from heartbeat.presets.runcost import costed
        from heartbeat.system.safefile import read_log_ends

        log = sh.layout.log(baton.id, baton.meta.epoch)
        return costed(lc.preset, log, parse_result(lc.preset, read_log_ends(log)))

    def session_plan(self, baton: Baton, lc: LauncherConfig | None) -> SessionPlan:
        """The session of the next dispatch (:func:`heartbeat.presets.registry.plan_session`)."""
        from heartbeat.presets.common import PresetName
        from heartbeat.presets.registry import PRESETS, plan_session

        if lc is None:
            return plan_session("fresh", previous="", previous_resumes=0, retry=False)
        meta = baton.meta
        # The previous run failed (an error, a crash, a kill, a stop): resume it, even when its notes
        # moved the step and so reset the attempt count (a killed agent that made progress is the
        # case a resumed session serves best). A clean exit 0 ended the shift: fresh.
        retry = (meta.attempt > 0 or meta.dispatches > 0) and meta.last_exit != 0
        compactions = 0
        if lc.session == "resume" and retry and meta.session:
            compactions = sum(1 for e in self.shared.store.ledger.events(baton.id, kinds=[EventKind.COMPACTING])
                              if meta.session in (e.data.get("session_id"), e.data.get("session")))
        return plan_session(lc.session, previous=meta.session, previous_resumes=meta.session_resumes, retry=retry,
                            compactions=compactions, max_resumes=lc.max_resumes_per_session,
                            pins_session=PRESETS[PresetName(lc.preset)].pins_session if lc.preset else True)


def judge_result(info: ResultInfo | None, kind: pol.ExitKind, reason: str, launcher: str) -> tuple[pol.ExitKind, str, str]:
    """The exit kind and reason once a preset's result is read, and the block reason of a
    non-retryable one: a result that says it failed is a failed attempt even after exit 0."""
    if info is None or kind is pol.ExitKind.FINISHED:
        return kind, reason, ""
    if info.non_retryable:
        said = info.reason or "an authentication error"
        return (pol.ExitKind.NON_RETRYABLE, f"{reason}: {said}",
                f"launcher {launcher} reports: {said} (not retryable: a human is needed)")
    if info.rate_limited and kind in (pol.ExitKind.SHIFT_END, pol.ExitKind.IDLE, pol.ExitKind.FAILED):
        return pol.ExitKind.RATE_LIMITED, f"{reason}: {info.reason or 'rate limited'}", ""
    if info.is_error and kind in (pol.ExitKind.SHIFT_END, pol.ExitKind.IDLE, pol.ExitKind.FAILED):
        return pol.ExitKind.FAILED, f"{reason}: {info.reason or 'the agent reported an error'}", ""
    return kind, reason, ""


def count_launch_failure(meta: Meta, error: str) -> None:
    """A launch that never ran the agent: give back the attempt its dispatch counted (the agent did
    not fail) and count it among the launches failing in a row, which back off and escalate alone."""
    meta.attempt = max(0, meta.attempt - 1)
    meta.launch_failures += 1
    meta.last_failure = f"{pol.LAUNCH_FAILURE}{error}"


def dispatchable(baton: Baton) -> bool:
    """What a dispatch decision saw and its write must still find: active (so not blocked, done,
    snoozed or paused, and with no gate to wait on) and no owner."""
    return baton.meta.status is Status.ACTIVE and baton.meta.owner is None
