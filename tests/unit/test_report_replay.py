"""The report's replay of a ledger's events, in memory: each metric from events made by hand."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from heartbeat.model.ledger import Event
from heartbeat.reports.report import METRIC_KEYS, task_incidents, task_metrics
from heartbeat.store.memory import MemoryStore
from heartbeat.tasks import verbs as tasks

T0 = datetime(2026, 1, 5, 9, 0, 0, tzinfo=datetime.now().astimezone().tzinfo).astimezone()

ZERO: dict[str, Any] = {**dict.fromkeys(METRIC_KEYS[:13], 0), "mean_time_to_resume_s": None, "duration_s": None}


def expect(**counts: Any) -> dict[str, Any]:
    return {**ZERO, **counts}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(kind: str, t: float, epoch: int = 0, actor: str = "agent", **data: Any) -> Event:
    return Event(task="t1", kind=kind, ts=at(t), epoch=epoch, actor=actor, data=data)


def step(t: float, epoch: int, to: str, frm: str) -> Event:
    return ev("updated", t, epoch, changed=["step"], step=to, from_step=frm)


def done_items(t: float, epoch: int, *items: str) -> Event:
    return ev("updated", t, epoch, changed=["done"], done=list(items))


def baton(status: str = "active", plan: tuple[str, ...] = ()) -> Any:
    store = MemoryStore()
    b = tasks.new_task(store, "t1", task="T", step="a", plan=list(plan))
    from heartbeat.model.baton import Status

    b.meta.status = Status(status)
    return b


class TestReplay:
    def test_daemon_dispatches_exits_and_stall_give_time_to_resume(self) -> None:
        """Daemon starts count as dispatches; time to resume runs from `stalled` to the first agent write."""
        events = [
            ev("created", 0, actor="cli", task="T", step="a", status="active"),
            ev("dispatched", 1, 1, actor="daemon", attempt=1, resume=False),
            ev("updated", 2, 1, actor="daemon"),  # the daemon recording the owner: not the agent's write
            step(5, 1, "b", "a"),
            ev("exited", 20, 1, actor="daemon", code=1, signal=None, progress=True),
            ev("stalled", 20, 1, actor="daemon", why="exited"),
            ev("dispatched", 50, 2, actor="daemon", attempt=1, resume=True),
            ev("updated", 51, 2, actor="daemon"),
            ev("touched", 60, 2),
            step(70, 2, "c", "b"),
        ]
        assert task_metrics(events, baton()) == expect(dispatches=2, resumes=1, clean_resumes=1,
                                                       mean_time_to_resume_s=40.0)

    def test_waiting_on_purpose_is_not_counted_in_time_to_resume(self) -> None:
        """A snooze's wake (or an unblock) moves the start of the gap: only the resume itself is timed."""
        events = [
            ev("created", 0, 1, actor="cli", task="T", step="a", status="active"),
            step(5, 1, "b", "a"),
            ev("snoozed", 6, 1, until=at(3600).isoformat()),
            ev("exited", 7, 1, actor="daemon", code=0, signal=None, progress=True),
            ev("woke", 3600, 1, actor="daemon"),
            ev("dispatched", 3601, 2, actor="daemon"),
            step(3610, 2, "c", "b"),
        ]
        assert task_metrics(events, baton()) == expect(dispatches=2, resumes=1, clean_resumes=1,
                                                       mean_time_to_resume_s=10.0)

    def test_idle_resume_ended_by_exit(self) -> None:
        """A dispatched agent that exits without moving the step is an idle resume."""
        events = [
            ev("created", 0, 1, actor="cli", task="T", step="a", status="active"),
            step(5, 1, "b", "a"),
            ev("dispatched", 10, 2, actor="daemon"),
            ev("touched", 12, 2),
            ev("exited", 30, 2, actor="daemon", code=0, signal=None, progress=False),
            ev("dispatched", 40, 3, actor="daemon"),
            step(45, 3, "c", "b"),
        ]
        assert task_metrics(events, baton()) == expect(dispatches=3, resumes=2, clean_resumes=1, idle_resumes=1,
                                                       mean_time_to_resume_s=15.0)

    def test_daemon_bypass_event_counts_once_even_after_an_agent_walked_past(self) -> None:
        """An agent starting on a hand-unblocked task and the daemon's later `bypass` event are one bypass."""
        events = [
            ev("created", 0, 1, actor="cli", task="T", step="a", status="active"),
            ev("blocked", 1, 1, on="approval", gate="human"),
            ev("claimed", 5, 2, actor="cli", pid=2, previous_pid=1),
            ev("bypass", 6, 2, actor="daemon", was_on="approval", gate="human", on="approval"),
            ev("unblocked", 9, 2, actor="alice", by="alice"),
        ]
        assert task_metrics(events, baton()) == expect(dispatches=2, resumes=1, bypassed_blocks=1)

    def test_daemon_bypass_event_alone(self) -> None:
        """The daemon's `bypass` event is a bypassed block; the block it restores is lifted properly later."""
        events = [
            ev("created", 0, 0, actor="cli", task="T", step="a", status="blocked"),
            ev("bypass", 6, 0, actor="daemon", was_on="approval", gate="human", on="approval"),
            ev("unblocked", 9, 0, actor="alice", by="alice"),
            ev("dispatched", 10, 1, actor="daemon"),
        ]
        assert task_metrics(events, baton()) == expect(dispatches=1, bypassed_blocks=1)

    def test_skips_and_redos_against_the_plan(self) -> None:
        """Passed plan steps count as redone when returned to; never-touched plan steps jumped past as skipped."""
        plan = ("a", "b", "c", "d", "e")
        events = [
            ev("created", 0, 1, actor="cli", task="T", step="a", status="active"),
            step(1, 1, "b", "a"),
            step(2, 1, "d", "b"),   # skips c
            ev("claimed", 3, 2, actor="cli", pid=9, previous_pid=8),
            step(4, 2, "b", "d"),   # redo: b was passed
            step(5, 2, "e", "b"),   # c was already counted as skipped; d was current
        ]
        assert task_metrics(events, baton(plan=plan)) == expect(dispatches=2, resumes=1, redone_steps=1,
                                                                skipped_steps=1)

    def test_reclaim_by_the_same_process_is_not_a_new_start(self) -> None:
        """`claim` again by the agent that holds the task bumps the epoch but starts no one new."""
        events = [
            ev("created", 0, 0, actor="cli", task="T", step="a", status="active"),
            ev("claimed", 1, 1, actor="cli", pid=7, previous_pid=None),
            ev("claimed", 2, 2, actor="cli", pid=7, previous_pid=7),
            step(3, 2, "b", "a"),
        ]
        assert task_metrics(events, baton()) == expect(dispatches=1)

    def test_duration_of_a_finished_task(self) -> None:
        """duration_s runs from `created` to the last `done`/`failed`, for finished tasks only."""
        events = [
            ev("created", 0, 1, actor="cli", task="T", step="a", status="active"),
            ev("failed", 100, 1, reason="x"),
            ev("retried", 200, 1, actor="bob", by="bob"),
            ev("done", 250.5, 1, note=""),
        ]
        assert task_metrics(events, baton("done"))["duration_s"] == 250.5
        assert task_metrics(events, baton("active"))["duration_s"] is None

    def test_since_counts_what_happened_after_it_but_knows_earlier_starts(self) -> None:
        """With since, a start after it is still a resume (the first start came before); earlier ones not counted."""
        events = [
            ev("created", 0, 1, actor="cli", task="T", step="a", status="active"),
            ev("spinning", 5, 1, actor="daemon", step="a", since=at(0).isoformat()),
            step(6, 1, "b", "a"),
            ev("claimed", 100, 2, actor="cli", pid=2, previous_pid=1),
            step(110, 2, "a", "b"),
        ]
        assert task_metrics(events, baton(plan=("a", "b")), since=at(50)) == expect(
            dispatches=1, resumes=1, redone_steps=1)
        assert task_metrics(events, baton(plan=("a", "b"))) == expect(
            dispatches=2, resumes=1, redone_steps=1, spinning=1)


class TestTheTrailAndTheBlock:
    """Issue 25: what the ledger's notes do not show, counted from the seams and the block."""

    def test_steps_noted_done_while_blocked_are_counted(self) -> None:
        """A person blocks the task while a step is in flight; the agent notes two steps done before it
        stops: two `done_while_blocked` (fails on 4c852cf: BYPASS 0 and nothing else counted either)."""
        events = [ev("created", 0, step="a"), ev("dispatched", 1, 1, actor="daemon"),
                  ev("blocked", 2, 1, actor="person", on="legal"),
                  done_items(3, 1, "a"), step(4, 1, "b", "a"), done_items(5, 1, "a", "b"),
                  ev("unblocked", 6, 1, actor="person"), done_items(7, 1, "a", "b", "c")]
        m = task_metrics(events, baton())
        assert m["done_while_blocked"] == 2 and m["bypassed_blocks"] == 0

    def test_unnoted_calls_at_a_seam_are_charged_to_it(self) -> None:
        """An `exited` event carrying its run's unnoted calls (the daemon read its trail): counted, the
        unknown outcome named in the incident."""
        unnoted = {"calls": 3, "unknown": 1, "last": [{"tool": "Bash", "what": "pay --invoice 2", "outcome": "unknown"}]}
        events = [ev("created", 0, step="a"), ev("dispatched", 1, 1, actor="daemon"),
                  ev("exited", 9, 1, actor="daemon", code=None, signal=9, unnoted=unnoted)]
        m = task_metrics(events, baton())
        assert m["unnoted_calls"] == 3
        [incident] = [i for i in task_incidents(events, baton())[1] if i["metric"] == "unnoted_calls"]
        assert "pay --invoice 2" in incident["detail"] and "epoch 1" in incident["detail"]
