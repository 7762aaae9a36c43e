"""Why a task is not running: one state word and one line, from the baton alone.

``heartbeat status``, ``status --json``, the status page and the metrics all say it the same
way, so an operator sees at a glance a task that cannot start ("launch failing: cannot start
'my-agent': No such file or directory (retry 3/5 in 60s)"), one backing off, one waiting for
a rate limit or an upstream, one a lost host left behind. It is the decision the daemon would
take for an active task without an agent (:func:`heartbeat.model.policy.decide`), read without the
daemon: nothing here touches a process or the disk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from heartbeat.config.shape import Config
from heartbeat.model import policy as pol
from heartbeat.model.baton import Baton, OwnerKind, Status
from heartbeat.model.knobs import knob_values
from heartbeat.tasks.handoff import pending_upstreams

__all__ = ["State", "Why", "why", "policy_for", "shown_step", "FAILING_STATES", "HELD_STATES"]


class State(StrEnum):
    """What a task is doing, or why it is not running (``status --json``'s ``state``)."""

    RUNNING = "running"  # an agent holds it
    CLAIMED = "claimed"  # a session someone started themselves holds it (``claim``)
    LAUNCHING = "launching"  # dispatched; its agent's pid is not known yet
    DUE = "due"  # active, no agent: the daemon dispatches it at its next look (or when capacity frees)
    TAKEN_OVER = "taken-over"  # a lost host's task, taken over by a live daemon: dispatched at once
    LAUNCH_FAILING = "launch-failing"  # its last launches never started the agent
    BACKING_OFF = "backing-off"  # its agent failed; the retry waits the backoff
    ESCALATING = "escalating"  # out of attempts: the daemon escalates it at its next look
    RATE_LIMITED = "rate-limited"  # a rate or usage limit holds it until a time
    WAITING_UPSTREAM = "waiting-upstream"  # an upstream (``after``) is not done
    BLOCKED = "blocked"
    SNOOZED = "snoozed"
    PAUSED = "paused"
    ESCALATED = "escalated"
    DONE = "done"
    FAILED = "failed"


FAILING_STATES = frozenset({State.LAUNCH_FAILING, State.BACKING_OFF, State.ESCALATING})
"""The states the page shows as failing (red/amber badges) and the metrics count as failing."""


HELD_STATES = (State.TAKEN_OVER, State.LAUNCH_FAILING, State.BACKING_OFF, State.ESCALATING, State.RATE_LIMITED,
               State.WAITING_UPSTREAM, State.DUE)
"""The states of an active task without an agent (``heartbeat_tasks_held``'s ``state``)."""


@dataclass(frozen=True)
class Why:
    """A task's state and the line that says it (``""`` for a plainly running agent)."""

    state: State
    text: str


def shown_step(baton: Baton) -> str:
    """The step a task's row shows (``status``, the page): a done task's last finished step, what it
    ended on, rather than the step it was made with; else its step."""
    if baton.meta.status is Status.DONE and baton.done:
        return str(baton.done[-1])
    return str(baton.step)


def policy_for(config: Config | None) -> pol.Policy:
    """The knobs the daemon applies (every one ``[daemon]`` sets; the defaults without a config)."""
    if config is None:
        return pol.Policy()
    return pol.Policy(**knob_values(config.daemon))


def why(baton: Baton, now: datetime, policy: pol.Policy,
        status_of: Callable[[str], Status | None] | None = None) -> Why:
    """The state of ``baton`` at ``now`` and why (see the module docstring). ``status_of`` looks
    up an upstream's status (None: upstreams are not checked)."""
    meta = baton.meta
    owner = meta.owner
    status = meta.status
    if owner is not None:
        if owner.how == OwnerKind.DISPATCH and owner.pid is None and not owner.unit:
            if meta.launch_failures:  # a retry of launches that failed is not yet a healthy launch
                return _launch_failing(baton, policy, "launching")
            return Why(State.LAUNCHING, "launch in progress")
        if owner.how != OwnerKind.DISPATCH:
            return Why(State.CLAIMED, f"claimed by pid {owner.pid}" if owner.pid else "claimed")
        return Why(State.RUNNING, "" if status is Status.ACTIVE else f"task {status.value}; its agent is ending")
    if status is Status.BLOCKED:
        from heartbeat.tasks.questions import waiting_on

        waiting = waiting_on(baton)
        if waiting is not None:  # "waiting on q1 to build, 12m"
            return Why(State.BLOCKED, waiting.describe(now))
    if status is not Status.ACTIVE:
        text = {Status.BLOCKED: f"blocked on: {baton.blocked_on or '(no reason given)'}",
                Status.ESCALATED: f"escalated: {meta.last_failure or 'see `heartbeat log`'}; "
                                  f"`heartbeat retry {baton.id} --by NAME` re-arms it",
                Status.SNOOZED: f"snoozed until {meta.snooze_until.isoformat(timespec='seconds')}"
                                if meta.snooze_until else "snoozed",
                Status.PAUSED: f"paused: `heartbeat resume {baton.id}` resumes it",
                Status.FAILED: f"failed: {meta.last_failure}" if meta.last_failure else "failed"}.get(status, "")
        return Why(State(status.value), text)
    if status_of is not None and baton.after:
        pending = pending_upstreams(baton, status_of)
        if pending:
            return Why(State.WAITING_UPSTREAM, f"waiting for upstream {', '.join(pending)}")
    if meta.last_exit is None and meta.last_failure.startswith(pol.TAKEN_OVER):
        return Why(State.TAKEN_OVER, f"{meta.last_failure}; dispatching")
    d = pol.decide(baton, pol.Observation(), now, policy)
    if d.action is pol.Action.ESCALATE:
        return Why(State.ESCALATING, f"escalating: {d.reason}")
    if d.action is pol.Action.NOTHING:
        if meta.launch_failures:
            return Why(State.LAUNCH_FAILING, d.reason)
        if meta.wait_until is not None and now < meta.wait_until:
            return Why(State.RATE_LIMITED, d.reason)
        return Why(State.BACKING_OFF, f"{d.reason}: {meta.last_failure}" if meta.last_failure else d.reason)
    if meta.launch_failures:  # its backoff is over: the next look tries again
        return _launch_failing(baton, policy, "now")
    return Why(State.DUE, f"due: {d.reason}")


def _launch_failing(baton: Baton, policy: pol.Policy, when: str) -> Why:
    """A task whose last launches failed, its next retry ``when`` ("now", or "launching")."""
    meta = baton.meta
    return Why(State.LAUNCH_FAILING, f"{pol.LAUNCH_FAILING}{meta.last_failure.removeprefix(pol.LAUNCH_FAILURE)} "
                                     f"(retry {meta.launch_failures + 1}/{policy.max_attempts} {when})")
