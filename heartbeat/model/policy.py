"""The decision: one pure function from (baton, liveness, now, policy) to an action.

Nothing here touches the disk, a process or the clock: the daemon observes the world,
calls :func:`decide` for each task and :func:`admit` once per tick to apply capacity and
the dispatch budget, then acts. That keeps the heart of the product testable with a
table of cases (``tests/unit/test_policy.py``) and no sleeping.

Vocabulary (DESIGN.md, "Ownership, progress, attempts"):

- *progress* is the step changing or ``done`` growing; the store resets
  ``meta.attempt`` and ``meta.idle_resumes`` when it sees progress;
- ``meta.attempt`` counts dispatches since the last progress, so a long task with many
  healthy shift changes never accumulates attempts;
- an agent that exits 0 after progress has ended its shift: its successor is due at once;
- one that exits 0 without progress is an *idle resume*; ``max_idle_resumes`` of them in a
  row escalate the task; ``max_attempts`` dispatches without progress escalate it too;
- a run refused by a rate or usage limit is a *wait*, not an attempt: the task holds until
  ``meta.wait_until`` (:func:`limit_wait`), and escalates only once the stretch of waiting
  passes ``max_limit_wait``; its runs' summed cost past ``max_cost_usd`` escalates it;
- *proof of life* is a write, a touch, or the agent's own output (``Observation.output_at``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import StrEnum

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, GateKind, OwnerKind, Status
from heartbeat.model.errors import BadInput
from heartbeat.model.knobs import PolicyKnobs
from heartbeat.model.timeparse import format_duration, parse_instant

__all__ = [
    "Action",
    "ExitKind",
    "StallReason",
    "Policy",
    "Observation",
    "Decision",
    "Admission",
    "decide",
    "classify_exit",
    "backoff_delay",
    "limit_wait",
    "waiting_text",
    "admit",
    "stands_until",
]


class Action(StrEnum):
    """What the daemon should do for a task this time round."""

    NOTHING = "nothing"
    SETTLE = "settle"  # the owner is gone: record how it ended, then decide again
    DISPATCH = "dispatch"
    STOP_THEN_DISPATCH = "stop-then-dispatch"
    STOP_THEN_ESCALATE = "stop-then-escalate"
    UNBLOCK = "unblock"
    WAKE = "wake"
    ESCALATE = "escalate"
    RESTORE_BLOCK = "restore-block"  # a hand edit dropped a block: put it back, record a bypass
    REPORT_SPINNING = "report-spinning"
    WAIT_LAUNCH = "wait-launch"  # a dispatch was recorded but its agent's pid is not yet known
    STOP = "stop"  # the task is no longer active but its agent still runs: stop it, dispatch nothing


class StallReason(StrEnum):
    """Why an agent counts as gone or is stopped (the ``why`` of ``stalled`` and ``stopped`` events)."""

    OWNER_DEAD = "owner_dead"  # its process is gone with no exit recorded (or the launch never reported one)
    EXITED = "exited"  # it exited (an exit status was recorded)
    SILENT = "silent"  # alive but no write, touch or output for stall_after
    NEVER_WROTE = "never_wrote"  # alive but no write and no output since its dispatch, for stall_after
    HUNG = "hung"  # stopped for not writing (silent or never_wrote, as the stop records it)
    MODEL_HUNG = "model_hung"  # alive, no tool call in flight (its trail), silent for hang_after: a wait on the model
    SPINNING = "spinning"  # alive and touching, but the step did not move for progress_after
    MAX_RUNTIME = "max_runtime"  # ran past its launcher's max_runtime
    INACTIVE = "inactive"  # its task is no longer active (blocked, done, snoozed, paused) past the grace


class ExitKind(StrEnum):
    """How an agent's run ended, as far as the retry policy is concerned."""

    SHIFT_END = "shift-end"  # exit 0 after progress: dispatch the successor now
    IDLE = "idle"  # exit 0 without progress: an idle resume
    FAILED = "failed"  # non-zero, signal, or vanished: a failed attempt, backoff applies
    NON_RETRYABLE = "non-retryable"  # the launcher says a human is needed
    RATE_LIMITED = "rate-limited"  # refused by a rate or usage limit: the task waits for it, no attempt spent
    LEASE_LAPSED = "lease-lapsed"  # stopped because its host's lease lapsed (an outage, a pause): no attempt spent
    LAUNCH_FAILED = "launch-failed"  # the agent never ran (no program, not executable, no workdir): its own
    # backoff and escalation count (``meta.launch_failures``), no attempt of the agent spent
    FINISHED = "finished"  # the task is done/failed/escalated (or the daemon stopped the agent of a task
    # that was no longer active): nothing follows, no attempt is counted as failed


@dataclass(frozen=True)
class Policy(PolicyKnobs):
    """What :func:`decide` reads: every knob of :class:`~heartbeat.model.knobs.PolicyKnobs` (the
    ones ``[daemon]`` sets), the launcher's own and the constants; the daemon builds one per launcher."""

    max_runtime: float | None = None
    non_retryable_exit_codes: frozenset[int] = frozenset()
    launch_timeout: float = defaults.LAUNCH_TIMEOUT


@dataclass(frozen=True)
class Observation:
    """What the daemon saw of the world at the edge, for one task."""

    alive: bool = False
    """The owner's process (pid + create time, or its unit) is running."""
    exit_code: int | None = None
    """The owner's exit code, when it is gone and the launcher recorded one."""
    exit_signal: int | None = None
    gate_open: bool = False
    """For a blocked task: its gate has opened (file exists, time reached, task done, check passed)."""
    block_dropped: bool = False
    """The ledger's last word on this task is ``blocked`` but the baton is no longer blocked."""
    spinning_reported: bool = False
    """A ``spinning`` event was already recorded for this episode."""
    inactive_since: datetime | None = None
    """For a task that is not active but whose owner is alive: when the daemon first saw it so
    (the grace before the agent is stopped counts from here; None means "just now")."""
    upstream_pending: tuple[str, ...] = ()
    """Upstreams (``after``) not done yet: an active task without an agent waits for them."""
    output_at: datetime | None = None
    """When the running agent last printed anything (its log's mtime, once the log is not empty):
    its own output is proof of life as a touch is; None when it printed nothing or cannot be seen."""
    # The durations that stop agents and escalate tasks, as the daemon measured them on the
    # monotonic clock (heartbeat.daemon.ages): a stepped wall clock must never kill or escalate.
    # None: measured from the baton's timestamps against ``now`` (a table test's clock never steps).
    running_for: float | None = None
    """Seconds since the agent started (``owner.started_at``, else ``dispatched_at``): ``max_runtime``."""
    silent_for: float | None = None
    """Seconds since its last proof of life (``touched_at``, ``dispatched_at`` or ``output_at``): ``stall_after``."""
    unchanged_for: float | None = None
    """Seconds since the step last moved (``progress_at``, or the start): ``progress_after``."""
    dispatched_for: float | None = None
    """Seconds since ``dispatched_at``: a launch's timeout."""
    inactive_for: float | None = None
    """Seconds since ``inactive_since``: ``inactive_grace``."""
    tool_running: bool | None = None
    """The agent's trail (its hooks) shows a tool call in flight (True) or none (False, a wait on
    the model); None when it keeps no trail (the hooks are not wired in)."""
    trail_at: datetime | None = None
    """When the agent's trail last moved (a call started or ended): proof of life as output is."""


@dataclass(frozen=True)
class Decision:
    """The action for one task, with the reason the log and ledger record."""

    action: Action
    reason: str
    exit_kind: ExitKind | None = None
    not_before: datetime | None = None
    """For a dispatch held back by backoff: when it becomes due."""
    stalled_why: StallReason | None = None
    """owner_dead | silent | never_wrote | exited: why the previous agent counts as gone."""


def _ago(now: datetime, then: datetime | None) -> float:
    return (now - then).total_seconds() if then is not None else float("inf")


def _age(measured: float | None, now: datetime, then: datetime | None) -> float:
    """The daemon's measure of a duration when it has one, else ``now - then``."""
    return measured if measured is not None else _ago(now, then)


def classify_exit(baton: Baton, obs: Observation, policy: Policy) -> ExitKind:
    """How the owner's run ended: shift end, idle, failed or non-retryable."""
    meta = baton.meta
    if meta.status in (Status.DONE, Status.FAILED, Status.ESCALATED):
        return ExitKind.FINISHED
    if obs.exit_code is not None and obs.exit_code in policy.non_retryable_exit_codes:
        return ExitKind.NON_RETRYABLE
    if obs.exit_code == 0 and obs.exit_signal is None:
        progressed = (
            meta.progress_at is not None
            and meta.dispatched_at is not None
            and meta.progress_at >= meta.dispatched_at
        )
        if progressed or meta.attempt == 0:
            # attempt == 0 with a dispatch behind it means the store reset it on progress
            return ExitKind.SHIFT_END
        return ExitKind.IDLE
    return ExitKind.FAILED


def _jitter(task_id: str, attempt: int) -> float:
    """A deterministic value in [0, 1) per task and attempt: spreads retries without randomness in tests."""
    digest = hashlib.blake2b(f"{task_id}:{attempt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


def backoff_delay(task_id: str, attempt: int, policy: Policy) -> float:
    """Seconds to wait before dispatch number ``attempt + 1`` after ``attempt`` failed ones.

    Exponential from ``backoff_initial``, capped at ``backoff_max``, with ±25% jitter so
    tasks that failed together do not come back together.
    """
    if attempt <= 0 or policy.backoff_initial <= 0:
        return 0.0
    base = min(policy.backoff_max, policy.backoff_initial * 2 ** min(attempt - 1, 30))
    return min(policy.backoff_max, base * (0.75 + 0.5 * _jitter(task_id, attempt)))


def limit_wait(baton: Baton, reset: datetime | None, retry_after: float | None, now: datetime,
               policy: Policy) -> datetime:
    """Until when a task whose run was refused by a rate or usage limit waits: the reset the CLI
    named (when it is still ahead), else ``retry_after`` seconds, else the backoff for this many
    limited runs in a row (``meta.limit_hits`` before this one, plus one)."""
    if reset is not None and reset > now:
        return reset
    if retry_after is not None and retry_after > 0:
        return now + timedelta(seconds=min(retry_after, 10 * 365 * 86400.0))
    return now + timedelta(seconds=backoff_delay(baton.id, baton.meta.limit_hits + 1, policy))


def waiting_text(baton: Baton, now: datetime) -> str:
    """"waiting for the rate limit until T" while a limit holds the task (no agent), else ``""``."""
    meta = baton.meta
    if meta.wait_until is None or meta.owner is not None or meta.status is not Status.ACTIVE or now >= meta.wait_until:
        return ""
    return f"waiting for the rate limit until {meta.wait_until.isoformat(timespec='seconds')}"


def decide(baton: Baton, obs: Observation, now: datetime, policy: Policy) -> Decision:
    """The one decision per task per look. See the module docstring for the vocabulary."""
    meta = baton.meta
    status = meta.status
    owner = meta.owner

    # A block dropped by a hand edit is put back before anything else can happen.
    if obs.block_dropped and status in (Status.ACTIVE, Status.SNOOZED, Status.PAUSED):
        return Decision(Action.RESTORE_BLOCK, "the block was removed by editing the baton, not by unblock or a gate")

    # An owner recorded but not yet known by pid: a dispatch is (or was) in flight.
    if owner is not None and owner.how == OwnerKind.DISPATCH and owner.pid is None and not owner.unit:
        if _age(obs.dispatched_for, now, meta.dispatched_at) < policy.launch_timeout:
            return Decision(Action.WAIT_LAUNCH, "launch in progress")
        return Decision(Action.SETTLE, "the launch never reported a process", exit_kind=ExitKind.FAILED,
                        stalled_why=StallReason.OWNER_DEAD)

    # The owner is gone: settle its exit first (record it, clear the owner), then decide again.
    if owner is not None and not obs.alive:
        kind = classify_exit(baton, obs, policy)
        if obs.exit_code is not None or obs.exit_signal is not None:
            how = f"exit {obs.exit_code}" if obs.exit_signal is None else f"killed by signal {obs.exit_signal}"
            why = StallReason.EXITED
        else:
            how, why = "its process is gone", StallReason.OWNER_DEAD
        return Decision(Action.SETTLE, f"agent ended ({how})", exit_kind=kind, stalled_why=why)

    # No longer active, yet its agent runs: a grace to end on its own, then it is stopped.
    if status is not Status.ACTIVE and owner is not None and obs.alive and not _gate_opened(baton, obs):
        return _judge_inactive(baton, obs, now, policy)

    if status in (Status.DONE, Status.FAILED):
        return Decision(Action.NOTHING, f"task {status.value}")
    if status is Status.ESCALATED:
        return Decision(Action.NOTHING, "escalated: waiting for `heartbeat retry`")
    if status is Status.PAUSED:
        return Decision(Action.NOTHING, "paused")

    if status is Status.BLOCKED:
        if _gate_opened(baton, obs) and meta.gate is not None:
            return Decision(Action.UNBLOCK, f"gate {meta.gate.spec()} opened")
        return Decision(Action.NOTHING, f"blocked on: {baton.blocked_on or '(no reason given)'}")

    if status is Status.SNOOZED:
        if meta.snooze_until is not None and now < meta.snooze_until:
            return Decision(Action.NOTHING, f"snoozed until {meta.snooze_until.isoformat()}",
                            not_before=meta.snooze_until)
        return Decision(Action.WAKE, "snooze ended")

    # Active from here on.
    if owner is not None and obs.alive:
        return _judge_running(baton, obs, now, policy)

    if obs.upstream_pending:  # its brief would lack the upstream packages: never dispatch it early
        return Decision(Action.NOTHING, f"waiting for upstream {', '.join(obs.upstream_pending)}")

    return _due(baton, now, policy)


def _gate_opened(baton: Baton, obs: Observation) -> bool:
    """A blocked task whose (non-human) gate has opened: it is unblocked, not its agent stopped."""
    gate = baton.meta.gate
    return baton.meta.status is Status.BLOCKED and obs.gate_open and gate is not None \
        and gate.kind is not GateKind.HUMAN


def _judge_inactive(baton: Baton, obs: Observation, now: datetime, policy: Policy) -> Decision:
    """A live owner on a task that is blocked, snoozed, paused, done, failed or escalated.

    It may have written that status itself and be exiting, or will notice at its next
    ``heartbeat verify`` (exit 4): it gets ``inactive_grace`` from when the daemon first saw
    the task so, then it is stopped (no successor, the status untouched). ``max_runtime``
    still applies meanwhile. An agent the daemon did not start (``claim``) is never stopped
    for this: it may be a person's interactive session that simply carries on.
    """
    meta = baton.meta
    owner = meta.owner
    assert owner is not None
    what = f"task {meta.status.value}"
    if owner.how != OwnerKind.DISPATCH:
        return Decision(Action.NOTHING, f"{what}; its claimed agent is left to end on its own")
    started = owner.started_at or meta.dispatched_at
    if policy.max_runtime is not None and _age(obs.running_for, now, started) > policy.max_runtime:
        return Decision(Action.STOP, f"{what}: agent ran past max_runtime ({format_duration(policy.max_runtime)})",
                        stalled_why=StallReason.INACTIVE)
    since = obs.inactive_since or now
    if _age(obs.inactive_for, now, since) >= policy.inactive_grace:
        return Decision(Action.STOP, f"{what}: agent still running after grace "
                        f"({format_duration(policy.inactive_grace)})", stalled_why=StallReason.INACTIVE)
    return Decision(Action.NOTHING, f"{what}; its agent may end on its own until "
                    f"{(since + timedelta(seconds=policy.inactive_grace)).isoformat()}")


def _judge_running(baton: Baton, obs: Observation, now: datetime, policy: Policy) -> Decision:
    meta = baton.meta
    owner = meta.owner
    assert owner is not None
    started = owner.started_at or meta.dispatched_at
    if policy.max_runtime is not None and owner.how == OwnerKind.DISPATCH \
            and _age(obs.running_for, now, started) > policy.max_runtime:
        return Decision(Action.STOP_THEN_DISPATCH, f"ran past max_runtime ({format_duration(policy.max_runtime)})",
                        exit_kind=ExitKind.FAILED, stalled_why=StallReason.MAX_RUNTIME)
    # Proof of life is the note (a write or a touch) or the agent's own output, whichever is later.
    last_signal = max((t for t in (meta.touched_at, meta.dispatched_at, obs.output_at, obs.trail_at) if t is not None),
                      default=None)
    silent = _age(obs.silent_for, now, last_signal)
    if obs.tool_running is False and 0 < policy.hang_after < policy.stall_after and silent > policy.hang_after:
        # The trail shows no tool running: the agent waits on its model, and nothing came back.
        return Decision(Action.STOP_THEN_DISPATCH, f"hung model: no tool call in flight and silent (no note, "
                        f"no output, no call) for {format_duration(silent)} (hang_after "
                        f"{format_duration(policy.hang_after)})", exit_kind=ExitKind.FAILED,
                        stalled_why=StallReason.MODEL_HUNG)
    if silent > policy.stall_after:
        # Any output at all is this agent's: its log is the epoch's own, created empty at the dispatch.
        # (Compared with dispatched_at it was not: a dispatch's record moves dispatched_at past the
        # launch, and output printed in between read as "never printed" — seconds of it under load.)
        never = meta.dispatched_at is not None and obs.output_at is None and all(
            t is None or t <= meta.dispatched_at for t in (meta.touched_at, obs.trail_at))
        why = StallReason.NEVER_WROTE if never else StallReason.SILENT
        text = "never wrote nor printed anything since its dispatch" if never \
            else "alive but silent (no note, no output)"
        return Decision(Action.STOP_THEN_DISPATCH, f"hung: {text} for {format_duration(silent)}",
                        exit_kind=ExitKind.FAILED, stalled_why=why)
    since_progress = _age(obs.unchanged_for, now,
                          max((t for t in (meta.progress_at, started) if t is not None), default=None))
    if since_progress > policy.progress_after:
        text = f"spinning: alive and touching, step unchanged for {format_duration(since_progress)}"
        if policy.on_spinning == "escalate":
            return Decision(Action.STOP_THEN_ESCALATE, text, exit_kind=ExitKind.FAILED, stalled_why=StallReason.SPINNING)
        if policy.on_spinning == "restart":
            return Decision(Action.STOP_THEN_DISPATCH, text, exit_kind=ExitKind.FAILED, stalled_why=StallReason.SPINNING)
        if not obs.spinning_reported:
            return Decision(Action.REPORT_SPINNING, text)
    return Decision(Action.NOTHING, "running")


def _due(baton: Baton, now: datetime, policy: Policy) -> Decision:
    """An active task with no live owner: dispatch it, hold it back (backoff), or escalate it."""
    meta = baton.meta
    last = f"; last: {meta.last_failure}" if meta.last_failure else ""
    if meta.idle_resumes >= policy.max_idle_resumes:
        why = "" if meta.last_failure.startswith(IDLE_FAILURE) else last  # e.g. a done refused by a guarantee
        return Decision(Action.ESCALATE, f"{meta.idle_resumes} agents in a row ended without moving the step{why}")
    if meta.attempt >= policy.max_attempts:
        return Decision(Action.ESCALATE, f"{meta.attempt} attempts without progress{last}")
    if policy.max_cost_usd > 0 and meta.cost_usd >= policy.max_cost_usd:
        return Decision(Action.ESCALATE, f"cost budget spent: its runs cost ${meta.cost_usd:.2f} "
                        f"(max_cost_usd ${policy.max_cost_usd:.2f})")
    if meta.wait_until is not None and now < meta.wait_until:
        waited = _ago(meta.wait_until, meta.wait_since or now)
        said = f": {meta.wait_reason}" if meta.wait_reason else ""
        if waited > policy.max_limit_wait:
            return Decision(Action.ESCALATE, f"rate limited until {meta.wait_until.isoformat(timespec='seconds')}, "
                            f"past max_limit_wait ({format_duration(policy.max_limit_wait)}){said}")
        return Decision(Action.NOTHING, waiting_text(baton, now) + said, not_before=meta.wait_until)
    if meta.last_exit is None and meta.last_failure.startswith(TAKEN_OVER):  # a lost host's: at once, no backoff
        return Decision(Action.DISPATCH, meta.last_failure)
    if meta.launch_failures > 0:
        return _launch_retry(baton, now, policy)
    if meta.dispatches == 0:
        return Decision(Action.DISPATCH, "new task, no agent yet")
    if meta.attempt > 0 and meta.last_exit != 0:
        ended = meta.ended_at or meta.dispatched_at or meta.updated_at
        delay = backoff_delay(baton.id, meta.attempt, policy)
        due_at = ended + timedelta(seconds=delay) if ended is not None else now
        if now < due_at:
            return Decision(Action.NOTHING, f"backing off {format_duration(delay)} after attempt {meta.attempt}",
                            not_before=due_at)
        return Decision(Action.DISPATCH, f"retry after a failed attempt ({meta.last_failure or 'agent gone'})")
    if meta.last_exit is None and meta.last_failure.startswith(REOPENED):  # sent back by a downstream
        return Decision(Action.DISPATCH, meta.last_failure)
    if meta.last_exit == 0 and meta.attempt == 0:
        return Decision(Action.DISPATCH, "the previous agent ended its shift")
    if meta.last_exit == 0:
        return Decision(Action.DISPATCH, "the previous agent ended without progress (idle resume)")
    return Decision(Action.DISPATCH, "no live agent holds the task")


def _launch_retry(baton: Baton, now: datetime, policy: Policy) -> Decision:
    """A task whose last launches never ran its agent: back off on their count, escalate after
    ``max_attempts`` of them in a row (a missing program rarely installs itself)."""
    meta = baton.meta
    n = meta.launch_failures
    said = meta.last_failure.removeprefix(LAUNCH_FAILURE)
    if n >= policy.max_attempts:
        return Decision(Action.ESCALATE, f"{n} launches in a row never started the agent: {said}")
    delay = backoff_delay(baton.id, n, policy)
    ended = meta.ended_at or meta.dispatched_at or meta.updated_at
    due_at = ended + timedelta(seconds=delay) if ended is not None else now
    if now < due_at:
        return Decision(Action.NOTHING, f"{LAUNCH_FAILING}{said} (retry {n + 1}/{policy.max_attempts} "
                        f"in {format_duration(_ago(due_at, now))})", not_before=due_at)
    return Decision(Action.DISPATCH, f"retry after a failed launch ({said})")


LAUNCH_FAILURE = "launch failed: "
"""How ``last_failure`` begins after a launch that never ran the agent."""

LAUNCH_FAILING = "launch failing: "
"""How the reason of a task held back by failed launches begins (status, the page, the log)."""

TAKEN_OVER = "taken over: "
"""How ``last_failure`` begins on a task taken over from a lost host (dispatched at once, no attempt spent)."""

REOPENED = "reopened by "
"""How ``last_failure`` begins on a finished task a downstream's ``verify`` sent back to work."""

IDLE_FAILURE = "ended without moving the step"
"""How ``last_failure`` begins after a plain idle resume (nothing more to say about it)."""

FOREVER = datetime.max.replace(tzinfo=timezone.utc)
"""A time no decision waits for: "until the baton changes"."""


def stands_until(baton: Baton, decision: Decision) -> datetime | None:
    """Until when a "nothing" decision holds if the baton does not change: the daemon need not
    look at the task again before then. None means "look every time" (it depends on a live
    process, a file, another task or a check)."""
    meta = baton.meta
    if decision.action is not Action.NOTHING or meta.owner is not None:
        return None
    if meta.status in (Status.DONE, Status.FAILED, Status.ESCALATED, Status.PAUSED):
        return FOREVER
    if meta.status is Status.BLOCKED:
        gate = meta.gate
        if gate is None or gate.kind is GateKind.HUMAN:
            return FOREVER
        if gate.kind is GateKind.TIME:
            try:
                return parse_instant(gate.target)
            except BadInput:
                return None
        return None
    return decision.not_before


@dataclass(frozen=True)
class Admission:
    """The outcome of :func:`admit` for one task that wanted a dispatch."""

    task_id: str
    admitted: bool
    reason: str


@dataclass
class Capacity:
    """What is free this tick: global and per-launcher agent slots, and the dispatch budget."""

    running: int = 0
    running_by_launcher: Mapping[str, int] = field(default_factory=dict)
    max_concurrent: int = defaults.MAX_CONCURRENT
    launcher_limits: Mapping[str, int | None] = field(default_factory=dict)
    dispatched_last_minute: int = 0
    dispatches_per_minute: int = defaults.DISPATCHES_PER_MINUTE


def admit(wanting: Sequence[tuple[str, str, datetime]], capacity: Capacity) -> list[Admission]:
    """Pick which due dispatches go ahead: oldest-waiting first, within slots and budget.

    ``wanting`` holds (task id, launcher, waiting since). Those left out wait for a
    later tick; none is dropped.
    """
    running = capacity.running
    by_launcher = dict(capacity.running_by_launcher)
    budget = capacity.dispatches_per_minute - capacity.dispatched_last_minute
    out: list[Admission] = []
    for task_id, launcher, _since in sorted(wanting, key=lambda w: (w[2], w[0])):
        limit = capacity.launcher_limits.get(launcher)
        if budget <= 0:
            out.append(Admission(task_id, False, f"dispatch budget spent ({capacity.dispatches_per_minute}/min)"))
        elif running >= capacity.max_concurrent:
            out.append(Admission(task_id, False, f"capacity full ({capacity.max_concurrent} agents running)"))
        elif limit is not None and by_launcher.get(launcher, 0) >= limit:
            out.append(Admission(task_id, False, f"launcher {launcher} full ({limit} agents running)"))
        else:
            out.append(Admission(task_id, True, "admitted"))
            running += 1
            budget -= 1
            by_launcher[launcher] = by_launcher.get(launcher, 0) + 1
    return out

