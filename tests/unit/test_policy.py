"""The decision, as a table: (baton, observation, now, policy) -> action, with no I/O and no sleeping."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Owner, Status
from heartbeat.model.policy import (
    Action,
    Capacity,
    ExitKind,
    Observation,
    Policy,
    admit,
    backoff_delay,
    classify_exit,
    decide,
    limit_wait,
    stands_until,
    waiting_text,
)
from heartbeat.store.memory import MemoryStore

T0 = datetime(2026, 11, 29, 6, 0, tzinfo=timezone.utc)
POLICY = Policy(stall_after=600, progress_after=3600, max_attempts=5, max_idle_resumes=3, backoff_initial=30,
                backoff_max=1800, max_runtime=4 * 3600, non_retryable_exit_codes=frozenset({3}))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def baton(status: Status = Status.ACTIVE, *, owner: bool = False, how: str = "dispatch", pid: int | None = 4242,
          dispatched: float | None = 0, touched: float | None = 0, progress: float | None = 0,
          attempt: int = 1, dispatches: int = 1, idle: int = 0, last_exit: int | None = None,
          ended: float | None = None, gate: Gate | None = None, snooze: float | None = None,
          started: float | None = 0) -> Baton:
    meta = Meta(id="t", status=status, attempt=attempt, dispatches=dispatches, idle_resumes=idle,
                last_exit=last_exit, epoch=dispatches,
                dispatched_at=None if dispatched is None else at(dispatched),
                touched_at=None if touched is None else at(touched),
                progress_at=None if progress is None else at(progress),
                ended_at=None if ended is None else at(ended),
                snooze_until=None if snooze is None else at(snooze),
                updated_at=at(0), gate=gate)
    if owner:
        meta.owner = Owner(pid=pid, create_time=1.0, how=how, launcher="agent",
                           started_at=None if started is None else at(started))
    return Baton(task="demo", step="step one", blocked_on="x" if status is Status.BLOCKED else "", meta=meta)


ALIVE = Observation(alive=True)
DEAD = Observation(alive=False)

LEFT_ACTIVE_AT_100 = Observation(alive=True, inactive_since=at(100))
"""The daemon first saw the task no longer active, its agent alive, 100 s after T0."""

# Every non-active status with a live dispatched agent: a grace to end on its own, then a stop.
INACTIVE_WITH_LIVE_AGENT = [
    row
    for status in (Status.BLOCKED, Status.DONE, Status.FAILED, Status.SNOOZED, Status.PAUSED, Status.ESCALATED)
    for row in (
        (f"{status.value} with a live agent, within the grace: left to end on its own",
         baton(status, owner=True, snooze=10_000 if status is Status.SNOOZED else None), LEFT_ACTIVE_AT_100,
         100 + POLICY.inactive_grace - 1, Action.NOTHING),
        (f"{status.value} with a live agent, past the grace: stopped, nothing dispatched",
         baton(status, owner=True, snooze=10_000 if status is Status.SNOOZED else None), LEFT_ACTIVE_AT_100,
         100 + POLICY.inactive_grace + 1, Action.STOP),
    )
]

# (name, baton, observation, now (seconds after T0), expected action)
TABLE = [
    ("fresh task, never dispatched", baton(owner=False, attempt=0, dispatches=0, dispatched=None), DEAD, 1,
     Action.DISPATCH),
    ("released: no owner, after a healthy shift", baton(owner=False, attempt=0, last_exit=0), DEAD, 5,
     Action.DISPATCH),
    ("running and recently touched", baton(owner=True, touched=500), ALIVE, 600, Action.NOTHING),
    ("stalled: the owner died (no exit code known)", baton(owner=True), DEAD, 60, Action.SETTLE),
    ("stalled: never wrote since dispatch", baton(owner=True, touched=0, dispatched=0), ALIVE, 601,
     Action.STOP_THEN_DISPATCH),
    ("hung: alive but silent past stall_after", baton(owner=True, touched=100, dispatched=0), ALIVE, 701,
     Action.STOP_THEN_DISPATCH),
    ("working: never touched but printing output within stall_after", baton(owner=True, touched=0, dispatched=0),
     Observation(alive=True, output_at=at(550)), 1100, Action.NOTHING),
    ("hung: silent in both note and output past stall_after", baton(owner=True, touched=100, dispatched=0),
     Observation(alive=True, output_at=at(90)), 701, Action.STOP_THEN_DISPATCH),
    ("hung: output stopped (a stuck model) though it printed before", baton(owner=True, touched=0, dispatched=0),
     Observation(alive=True, output_at=at(300)), 901, Action.STOP_THEN_DISPATCH),
    ("spinning: printing output, step unchanged past progress_after", baton(owner=True, touched=0, progress=0),
     Observation(alive=True, output_at=at(3690)), 3700, Action.STOP_THEN_ESCALATE),
    ("spinning: touching, step unchanged past progress_after", baton(owner=True, touched=3650, progress=0),
     ALIVE, 3700, Action.STOP_THEN_ESCALATE),
    ("ran past max_runtime", baton(owner=True, touched=4 * 3600, progress=4 * 3600 - 10), ALIVE, 4 * 3600 + 1,
     Action.STOP_THEN_DISPATCH),
    ("blocked, human gate: held even when 'open'", baton(Status.BLOCKED, gate=Gate(GateKind.HUMAN)),
     Observation(gate_open=True), 10, Action.NOTHING),
    ("blocked, file gate closed", baton(Status.BLOCKED, gate=Gate(GateKind.FILE, "/x")), DEAD, 10, Action.NOTHING),
    ("blocked, file gate open", baton(Status.BLOCKED, gate=Gate(GateKind.FILE, "/x")),
     Observation(gate_open=True), 10, Action.UNBLOCK),
    ("blocked, time gate open", baton(Status.BLOCKED, gate=Gate(GateKind.TIME, at(5).isoformat())),
     Observation(gate_open=True), 10, Action.UNBLOCK),
    ("blocked, task gate open", baton(Status.BLOCKED, gate=Gate(GateKind.TASK, "other")),
     Observation(gate_open=True), 10, Action.UNBLOCK),
    ("blocked, check gate closed", baton(Status.BLOCKED, gate=Gate(GateKind.CHECK, "ci")), DEAD, 10,
     Action.NOTHING),
    ("blocked, check gate open", baton(Status.BLOCKED, gate=Gate(GateKind.CHECK, "ci")),
     Observation(gate_open=True), 10, Action.UNBLOCK),
    ("blocked with a live agent, gate opened: unblocked, the agent kept",
     baton(Status.BLOCKED, owner=True, gate=Gate(GateKind.FILE, "/x")),
     Observation(alive=True, gate_open=True, inactive_since=at(100)), 200, Action.UNBLOCK),
    ("backoff not yet elapsed after a failed attempt", baton(attempt=2, last_exit=1, ended=100), DEAD, 110,
     Action.NOTHING),
    ("backoff elapsed", baton(attempt=2, last_exit=1, ended=100), DEAD, 100 + 76, Action.DISPATCH),
    ("attempts exhausted", baton(attempt=5, last_exit=1, ended=0), DEAD, 10_000, Action.ESCALATE),
    ("idle resumes exhausted", baton(attempt=3, idle=3, last_exit=0, ended=0), DEAD, 10, Action.ESCALATE),
    ("shift ended: exit 0 after progress, successor due at once", baton(attempt=0, last_exit=0, ended=100),
     DEAD, 100, Action.DISPATCH),
    ("snoozed until a later time", baton(Status.SNOOZED, snooze=1000), DEAD, 999, Action.NOTHING),
    ("snoozed, time reached: wake", baton(Status.SNOOZED, snooze=1000), DEAD, 1000, Action.WAKE),
    ("snoozed by a claimed agent still finishing its shift: left alone",
     baton(Status.SNOOZED, owner=True, how="claim", snooze=1000), LEFT_ACTIVE_AT_100, 2000, Action.NOTHING),
    ("done", baton(Status.DONE), DEAD, 10, Action.NOTHING),
    ("failed", baton(Status.FAILED), DEAD, 10, Action.NOTHING),
    ("paused", baton(Status.PAUSED), DEAD, 10, Action.NOTHING),
    ("escalated: nothing until retry", baton(Status.ESCALATED, attempt=9), DEAD, 10**6, Action.NOTHING),
    ("done, agent exited afterwards: settle its exit", baton(Status.DONE, owner=True), DEAD, 10, Action.SETTLE),
    ("a hand edit dropped the block", baton(), Observation(block_dropped=True), 10, Action.RESTORE_BLOCK),
    ("dispatch recorded, pid not yet known", baton(owner=True, pid=None, dispatched=0), DEAD, 5,
     Action.WAIT_LAUNCH),
    ("dispatch recorded, pid never came", baton(owner=True, pid=None, dispatched=0), DEAD, 31, Action.SETTLE),
    *INACTIVE_WITH_LIVE_AGENT,
    ("blocked, claimed agent past the grace: not the daemon's to stop", baton(Status.BLOCKED, owner=True, how="claim"),
     LEFT_ACTIVE_AT_100, 10_000, Action.NOTHING),
    ("blocked, agent within the grace but past max_runtime: stopped", baton(Status.BLOCKED, owner=True),
     Observation(alive=True, inactive_since=at(4 * 3600)), 4 * 3600 + 1, Action.STOP),
    ("claimed by a live interactive agent, quiet but within stall_after", baton(owner=True, how="claim",
     attempt=0, dispatches=0, dispatched=None, touched=0), ALIVE, 300, Action.NOTHING),
]


class TestDecisionTable:
    """Every row of the decision table gives exactly its action."""

    @pytest.mark.parametrize(("name", "b", "obs", "now", "expected"), TABLE, ids=[row[0] for row in TABLE])
    def test_row(self, name: str, b: Baton, obs: Observation, now: float, expected: Action) -> None:
        """The row's action comes out, with a reason to log."""
        decision = decide(b, obs, at(now), POLICY)
        assert decision.action is expected, decision.reason
        assert decision.reason

    def test_spinning_can_be_restart_or_report(self) -> None:
        """on_spinning=restart stops and re-dispatches; report only reports, once per episode."""
        b = baton(owner=True, touched=3650, progress=0)
        restart = decide(b, ALIVE, at(3700), replace(POLICY, on_spinning="restart"))
        assert restart.action is Action.STOP_THEN_DISPATCH
        report = replace(POLICY, on_spinning="report")
        assert decide(b, ALIVE, at(3700), report).action is Action.REPORT_SPINNING
        assert decide(b, Observation(alive=True, spinning_reported=True), at(3700), report).action is Action.NOTHING

    def test_inactive_stop_says_why_and_dispatches_nothing(self) -> None:
        """The stop of an agent whose task was blocked names the status and the grace, and wants no dispatch."""
        d = decide(baton(Status.BLOCKED, owner=True), LEFT_ACTIVE_AT_100, at(200), POLICY)
        assert d.action is Action.STOP
        assert d.reason.startswith("task blocked: agent still running after grace")
        within = decide(baton(Status.DONE, owner=True), LEFT_ACTIVE_AT_100, at(101), POLICY)
        assert within.action is Action.NOTHING

    def test_inactive_grace_counts_from_first_sight_when_unknown(self) -> None:
        """Without a recorded instant the grace starts now: a live agent is never stopped on the first look."""
        d = decide(baton(Status.BLOCKED, owner=True), ALIVE, at(10_000), POLICY)
        assert d.action is Action.NOTHING

    def test_hung_reason_names_the_silence(self) -> None:
        """A stop's reason says what was seen, so the log and the next brief explain it."""
        d = decide(baton(owner=True, touched=100, dispatched=0), ALIVE, at(701), POLICY)
        assert "silent" in d.reason and d.stalled_why == "silent"
        d = decide(baton(owner=True, touched=0, dispatched=0), ALIVE, at(601), POLICY)
        assert d.stalled_why == "never_wrote"

    def test_output_alone_is_proof_of_life(self) -> None:
        """An agent that prints but never touches is judged by its output: alive while it prints, silent
        (not "never wrote") once it stops, and "never wrote" only when it printed nothing at all."""
        b = baton(owner=True, touched=0, dispatched=0)
        for seconds in (599, 1200, 5000):
            obs = Observation(alive=True, output_at=at(seconds - 1))
            assert decide(b, obs, at(seconds), replace(POLICY, progress_after=10**6)).action is Action.NOTHING
        stopped = decide(b, Observation(alive=True, output_at=at(100)), at(701), POLICY)
        assert stopped.stalled_why == "silent" and "no output" in stopped.reason
        assert decide(b, Observation(alive=True), at(601), POLICY).stalled_why == "never_wrote"

    def test_output_printed_before_the_dispatch_was_recorded_is_still_output(self) -> None:
        """A dispatch's record (phase 2, after the launch) moves dispatched_at to its own time when the
        agent has not touched yet: what the agent printed in between is still its output, so it is
        stopped as silent, not as "never wrote nor printed" (seconds apart under load: two busy loops
        beside the suite's four workers; said "never wrote" before this fix)."""
        b = baton(owner=True, touched=0, dispatched=0)
        stopped = decide(b, Observation(alive=True, output_at=at(-5)), at(601), POLICY)
        assert stopped.stalled_why == "silent" and "no output" in stopped.reason


class TestExitClassification:
    """How an agent's run ended decides what follows."""

    def test_exit_zero_after_progress_is_a_shift_end(self) -> None:
        """Exit 0 with progress since the dispatch: the successor is due at once, no attempt counted."""
        b = baton(owner=True, dispatched=0, progress=50, attempt=0)
        assert classify_exit(b, Observation(exit_code=0), POLICY) is ExitKind.SHIFT_END

    def test_exit_zero_without_progress_is_idle(self) -> None:
        """Exit 0 without progress is the confident resume from nowhere."""
        b = baton(owner=True, dispatched=10, progress=0, attempt=1)
        assert classify_exit(b, Observation(exit_code=0), POLICY) is ExitKind.IDLE

    def test_non_retryable_code_blocks(self) -> None:
        """A code the launcher names non-retryable needs a human."""
        assert classify_exit(baton(owner=True), Observation(exit_code=3), POLICY) is ExitKind.NON_RETRYABLE

    def test_signal_or_nonzero_is_a_failed_attempt(self) -> None:
        """A crash is a failed attempt."""
        assert classify_exit(baton(owner=True), Observation(exit_code=1), POLICY) is ExitKind.FAILED
        assert classify_exit(baton(owner=True), Observation(exit_signal=9), POLICY) is ExitKind.FAILED
        assert classify_exit(baton(owner=True), DEAD, POLICY) is ExitKind.FAILED


class TestBackoff:
    """Retries wait exponentially longer, with jitter, up to the cap."""

    def test_grows_and_caps(self) -> None:
        """Each failed attempt roughly doubles the wait; none exceeds backoff_max."""
        delays = [backoff_delay("t", n, POLICY) for n in range(1, 12)]
        assert 22.5 <= delays[0] <= 37.5
        assert delays[1] > delays[0] and delays[2] > delays[1]
        assert max(delays) <= POLICY.backoff_max

    def test_jitter_differs_between_tasks_and_is_deterministic(self) -> None:
        """Tasks that failed together do not come back together; the same task gets the same wait."""
        waits = {backoff_delay(f"task-{i}", 3, POLICY) for i in range(20)}
        assert len(waits) > 10
        assert backoff_delay("a", 3, POLICY) == backoff_delay("a", 3, POLICY)

    def test_no_backoff_before_a_failure(self) -> None:
        """A fresh or healthy task is not held back."""
        assert backoff_delay("t", 0, POLICY) == 0


class TestAdmission:
    """Capacity and the dispatch budget hold dispatches back, oldest-waiting first, dropping none."""

    def test_capacity_full(self) -> None:
        """With every slot taken, nothing is admitted and each waiting task says why."""
        out = admit([("a", "agent", at(0)), ("b", "agent", at(1))], Capacity(running=4, max_concurrent=4))
        assert [a.admitted for a in out] == [False, False]
        assert "capacity full" in out[0].reason

    def test_oldest_first_within_capacity(self) -> None:
        """One free slot goes to the task that has waited longest."""
        out = admit([("new", "agent", at(50)), ("old", "agent", at(1))], Capacity(running=3, max_concurrent=4))
        assert [(a.task_id, a.admitted) for a in out] == [("old", True), ("new", False)]

    def test_budget_exhausted(self) -> None:
        """Past dispatches_per_minute, the rest wait for the next minute."""
        wanting = [(f"t{i}", "agent", at(i)) for i in range(5)]
        out = admit(wanting, Capacity(max_concurrent=100, dispatched_last_minute=28, dispatches_per_minute=30))
        assert sum(a.admitted for a in out) == 2
        assert "budget" in out[-1].reason

    def test_per_launcher_limit(self) -> None:
        """A launcher's own max_concurrent is honoured while others still have room."""
        out = admit([("a", "gpu", at(0)), ("b", "cpu", at(1))],
                    Capacity(max_concurrent=10, running_by_launcher={"gpu": 1}, launcher_limits={"gpu": 1}))
        assert [(a.task_id, a.admitted) for a in out] == [("a", False), ("b", True)]


class TestLongTask:
    """A long task with many healthy shift changes is never escalated for them."""

    def test_fifty_shifts_with_progress(self) -> None:
        """Dispatch, progress, exit 0 — fifty times — keeps attempt at zero and always dispatches."""
        store = MemoryStore()
        b = Baton(task="long", step="step 0", meta=Meta(id="long"))
        store.create(b, now=at(0))
        clock = 0.0
        for shift in range(50):
            clock += 10
            with store.edit("long", now=at(clock)) as ed:  # what the daemon's dispatch writes
                m = ed.baton.meta
                m.epoch += 1
                m.attempt += 1
                m.dispatches += 1
                m.dispatched_at = at(clock)
                m.owner = Owner(pid=100 + shift, create_time=1.0, how="dispatch", launcher="agent",
                                started_at=at(clock))
            clock += 60
            with store.edit("long", now=at(clock)) as ed:  # the agent makes progress
                ed.baton.step = f"step {shift + 1}"
            clock += 5
            current = store.load("long")
            assert decide(current, Observation(alive=True), at(clock), POLICY).action is Action.NOTHING
            ended = decide(current, Observation(exit_code=0), at(clock), POLICY)
            assert ended.action is Action.SETTLE and ended.exit_kind is ExitKind.SHIFT_END
            with store.edit("long", now=at(clock)) as ed:  # the daemon settles the exit
                ed.baton.meta.owner = None
                ed.baton.meta.last_exit = 0
                ed.baton.meta.ended_at = at(clock)
            after = decide(store.load("long"), DEAD, at(clock), POLICY)
            assert after.action is Action.DISPATCH, after.reason
        assert store.load("long").meta.dispatches == 50
        assert store.load("long").meta.attempt == 0


class TestStandsUntil:
    """A quiet task is not looked at again until its decision could change."""

    def test_finished_and_human_blocked_stand_forever(self) -> None:
        """Done, escalated and human-blocked tasks change only when their baton does."""
        for b in (baton(Status.DONE), baton(Status.ESCALATED), baton(Status.BLOCKED, gate=Gate(GateKind.HUMAN))):
            d = decide(b, DEAD, at(10), POLICY)
            assert stands_until(b, d) is not None and stands_until(b, d) > at(10**9)

    def test_snooze_and_backoff_stand_until_their_time(self) -> None:
        """A snoozed task is due at its wake time; a backing-off task at the end of its backoff."""
        snoozed = baton(Status.SNOOZED, snooze=1000)
        assert stands_until(snoozed, decide(snoozed, DEAD, at(10), POLICY)) == at(1000)
        backing = baton(attempt=2, last_exit=1, ended=100)
        d = decide(backing, DEAD, at(110), POLICY)
        assert stands_until(backing, d) == d.not_before and d.not_before > at(110)

    def test_anything_with_a_process_or_a_gate_to_poll_is_looked_at_every_time(self) -> None:
        """Live owners, file/check/task gates: the world can change without the baton changing."""
        running = baton(owner=True, touched=500)
        assert stands_until(running, decide(running, ALIVE, at(600), POLICY)) is None
        for gate in (Gate(GateKind.FILE, "/x"), Gate(GateKind.CHECK, "ci"), Gate(GateKind.TASK, "o")):
            b = baton(Status.BLOCKED, gate=gate)
            assert stands_until(b, decide(b, DEAD, at(10), POLICY)) is None
        timed = baton(Status.BLOCKED, gate=Gate(GateKind.TIME, at(500).isoformat()))
        assert stands_until(timed, decide(timed, DEAD, at(10), POLICY)) == at(500)


def limited(*, until: float, since: float, hits: int = 1, reason: str = "API Error: Request rejected (429)",
            cost: float = 0.0, attempt: int = 0) -> Baton:
    """A task whose last run was refused by a rate limit, holding until ``until`` (seconds after T0)."""
    b = baton(attempt=attempt, last_exit=1, ended=since)
    b.meta.wait_until, b.meta.wait_since, b.meta.limit_hits, b.meta.wait_reason = at(until), at(since), hits, reason
    b.meta.cost_usd = cost
    return b


class TestLimits:
    """A rate or usage limit is a wait, not a failure; a cost budget escalates with the spend named."""

    LIMIT_TABLE = [
        ("before the reset: waits, never dispatches", limited(until=3600, since=0), 1800, Action.NOTHING),
        ("at the reset: dispatches", limited(until=3600, since=0), 3600, Action.DISPATCH),
        ("a reset past max_limit_wait: escalates", limited(until=7 * 3600, since=0), 60, Action.ESCALATE),
        ("a stretch of waits past max_limit_wait: escalates", limited(until=6 * 3600 + 10, since=0, hits=9),
         6 * 3600, Action.ESCALATE),
        ("the attempts it did not spend do not escalate", limited(until=3600, since=0, attempt=4), 3600,
         Action.DISPATCH),
    ]

    @pytest.mark.parametrize(("name", "b", "now", "expected"), LIMIT_TABLE, ids=[row[0] for row in LIMIT_TABLE])
    def test_row(self, name: str, b: Baton, now: float, expected: Action) -> None:
        """Each limit row gives its action."""
        policy = replace(POLICY, max_limit_wait=6 * 3600)
        assert decide(b, DEAD, at(now), policy).action is expected

    def test_the_wait_says_until_when_and_stands_until_then(self) -> None:
        """The decision names the reset, and the daemon need not look again before it."""
        b = limited(until=3600, since=0, reason="You've hit your limit · resets 7am (UTC)")
        d = decide(b, DEAD, at(10), POLICY)
        assert d.reason.startswith(f"waiting for the rate limit until {at(3600).isoformat(timespec='seconds')}")
        assert "resets 7am" in d.reason
        assert d.not_before == at(3600) and stands_until(b, d) == at(3600)

    def test_escalation_names_the_longest_wait_and_the_limit(self) -> None:
        """Past max_limit_wait the escalation says so, with what the CLI said."""
        d = decide(limited(until=8 * 3600, since=0, reason="weekly limit reached"), DEAD, at(5),
                   replace(POLICY, max_limit_wait=6 * 3600))
        assert "max_limit_wait (6h)" in d.reason and "weekly limit reached" in d.reason

    def test_limit_wait_prefers_the_reset_then_retry_after_then_backoff(self) -> None:
        """The CLI's reset when it is ahead; else its retry-after; else the backoff for the hits so far."""
        b = baton()
        assert limit_wait(b, at(900), 30, at(0), POLICY) == at(900)
        assert limit_wait(b, at(-5), 30, at(0), POLICY) == at(30)  # a reset already past is no wait
        assert limit_wait(b, None, None, at(0), POLICY) == at(backoff_delay("t", 1, POLICY))
        b.meta.limit_hits = 4
        assert limit_wait(b, None, None, at(0), POLICY) == at(backoff_delay("t", 5, POLICY))

    def test_waiting_text_only_while_the_wait_holds(self) -> None:
        """Status and the page show the wait only before the reset and with no agent running."""
        b = limited(until=100, since=0)
        assert waiting_text(b, at(50)) == f"waiting for the rate limit until {at(100).isoformat(timespec='seconds')}"
        assert waiting_text(b, at(100)) == ""
        b.meta.owner = Owner(pid=1, how="dispatch")
        assert waiting_text(b, at(50)) == ""

    def test_cost_budget_escalates_with_the_spend_named(self) -> None:
        """Once the task's runs cost max_cost_usd, it is escalated, saying what was spent; 0 is no budget."""
        b = baton(attempt=0, last_exit=0, ended=0)
        b.meta.cost_usd = 5.25
        d = decide(b, DEAD, at(10), replace(POLICY, max_cost_usd=5.0))
        assert d.action is Action.ESCALATE and "$5.25" in d.reason and "max_cost_usd $5.00" in d.reason
        assert decide(b, DEAD, at(10), replace(POLICY, max_cost_usd=6.0)).action is Action.DISPATCH
        assert decide(b, DEAD, at(10), replace(POLICY, max_cost_usd=0.0)).action is Action.DISPATCH
