"""`heartbeat report`: each handoff failure, induced on purpose, is counted exactly and alone.

The scenarios drive the real CLI with real agent processes: an agent is a sleeping child
process that claims the task with ``heartbeat claim ID --pid <its pid>`` and writes with
the epoch the claim printed. Events only the daemon emits (dispatched, exited, stalled,
spinning, escalated, bypass) are recorded into the same ledger with ``store.record``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from conftest import Result

from heartbeat import tasks
from heartbeat.baton import Owner
from heartbeat.ledger import Event
from heartbeat.report import METRIC_KEYS, build_report, task_metrics
from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore
from heartbeat.timeparse import utcnow

ZERO: dict[str, Any] = {**dict.fromkeys(METRIC_KEYS[:11], 0), "mean_time_to_resume_s": None, "duration_s": None}


class Seconds:
    """Matches a measured duration: a float, not negative, under two minutes (timing varies by machine)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and 0.0 <= other < 120.0

    def __repr__(self) -> str:
        return "<seconds>"


SECONDS = Seconds()


def expect(**counts: Any) -> dict[str, Any]:
    return {**ZERO, **counts}


class Agent:
    """A real process holding the task: claimed for its pid, writing with its epoch."""

    def __init__(self, hb: Callable[..., Result], task: str) -> None:
        self.hb = hb
        self.task = task
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        r = hb("claim", task, "--pid", str(self.proc.pid))
        assert r.code == 0, r.err
        self.epoch = int(r.out)

    def __call__(self, *args: str, code: int = 0) -> Result:
        r = self.hb(*args, env={"HEARTBEAT_TASK": self.task, "HEARTBEAT_EPOCH": str(self.epoch)})
        assert r.code == code, (args, r.code, r.err)
        return r

    def die(self) -> None:
        """Killed mid-task: no release, no goodbye."""
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agents(hb: Callable[..., Result]) -> Iterator[Callable[[str], Agent]]:
    started: list[Agent] = []

    def start(task: str = "t1") -> Agent:
        agent = Agent(hb, task)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.proc.kill()
        agent.proc.wait()


def report(hb: Callable[..., Result], *args: str) -> dict[str, Any]:
    r = hb("report", "--json", *args)
    assert r.code == 0, r.err
    doc: dict[str, Any] = json.loads(r.out)
    return doc


def metrics_of(hb: Callable[..., Result], task: str = "t1", *args: str) -> dict[str, Any]:
    tasks_by_id = {t["id"]: t for t in report(hb, *args)["tasks"]}
    found: dict[str, Any] = tasks_by_id[task]["metrics"]
    return found


def new(hb: Callable[..., Result], tmp_path: Path, *extra: str, task: str = "t1") -> None:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    r = hb("new", task, "--task", "Ship the fix", "--step", "a", "--next", "b", "--intent", "No blank answers",
           "--constraint", "Do not touch prod", "--workdir", str(work), *extra)
    assert r.code == 0, r.err


PLAN = ("--plan", "a", "--plan", "b", "--plan", "c", "--plan", "d")


def record(state_dir: Path, *events: Event) -> None:
    store = FileStore(str(state_dir))
    try:
        store.record(list(events))
    finally:
        store.close()


class TestCleanTask:
    def test_clean_multi_resume_task_reports_zero_failures(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path
    ) -> None:
        """Three agents each pick up at the next step and hand over cleanly: 2 clean resumes, no failure."""
        new(hb, tmp_path, *PLAN)
        a1 = agents("t1")
        a1("add", "t1", "done", "a")
        a1("set", "t1", "step=b", "next_step=c")
        a1("release", "t1")
        a1.die()
        a2 = agents("t1")
        a2("verify", "t1")
        a2("add", "t1", "done", "b")
        a2("set", "t1", "step=c", "next_step=d")
        a2("release", "t1")
        a2.die()
        a3 = agents("t1")
        a3("set", "t1", "step=d")
        a3("add", "t1", "done", "c", "d")
        a3("done", "t1", "--note", "shipped")
        doc = report(hb)
        (task,) = doc["tasks"]
        assert task["metrics"] == expect(dispatches=3, resumes=2, clean_resumes=2,
                                         mean_time_to_resume_s=SECONDS, duration_s=SECONDS)
        assert task["score"] == 0 and task["incidents"] == []
        assert doc["totals"] == task["metrics"]

    def test_proper_unblock_is_not_a_bypass(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path
    ) -> None:
        """A block lifted by `unblock --by` before the next agent starts is no failure."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("block", "t1", "--on", "approval")
        a1.die()
        assert hb("unblock", "t1", "--by", "alice").code == 0
        a2 = agents("t1")
        a2("set", "t1", "step=b")
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, clean_resumes=1, mean_time_to_resume_s=SECONDS)


class TestEachFailure:
    def test_redone_step(self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path) -> None:
        """A successor that goes back to a step already recorded done counts one redone step."""
        new(hb, tmp_path, *PLAN)
        a1 = agents("t1")
        a1("add", "t1", "done", "a")
        a1("set", "t1", "step=b", "next_step=c")
        a1.die()
        a2 = agents("t1")
        a2("set", "t1", "step=a")  # fluent and wrong: it starts the task over
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, redone_steps=1)

    def test_skipped_step(self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path) -> None:
        """A successor that jumps past a plan step never done nor current counts one skipped step."""
        new(hb, tmp_path, *PLAN)
        a1 = agents("t1")
        a1("add", "t1", "done", "a")
        a1.die()
        a2 = agents("t1")
        a2("set", "t1", "step=c")  # b, the recovery step, is walked past
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, clean_resumes=1, skipped_steps=1)

    def test_bypassed_block_by_hand_edit(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path, state_dir: Path
    ) -> None:
        """A block dropped by editing the baton, then an agent taking the task, counts one bypassed block."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("block", "t1", "--on", "the customer's approval")
        a1.die()
        drop_block_by_hand(state_dir / "batons" / "t1.toml")
        a2 = agents("t1")
        a2("set", "t1", "step=b")
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, clean_resumes=1, bypassed_blocks=1)

    def test_bypassed_block_seen_only_in_the_baton(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path, state_dir: Path
    ) -> None:
        """A hand edit that dropped a block, with nothing after it in the ledger, is still one bypass."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("block", "t1", "--on", "approval")
        a1.die()
        drop_block_by_hand(state_dir / "batons" / "t1.toml")
        assert metrics_of(hb) == expect(dispatches=1, bypassed_blocks=1)

    def test_stale_resume_world_changed_across_the_gap(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path
    ) -> None:
        """A key file changed between the last write and the successor's first write counts one stale resume."""
        (tmp_path / "work").mkdir()
        (tmp_path / "work" / "config.yaml").write_text("retries: 1\n")
        new(hb, tmp_path, "--key-file", "config.yaml")
        a1 = agents("t1")
        a1("set", "t1", "step=b")
        a1.die()
        (tmp_path / "work" / "config.yaml").write_text("retries: 5\n")  # someone else moved the world
        a2 = agents("t1")
        a2("set", "t1", "step=c")  # acts on the old note without verifying
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, clean_resumes=1, stale_resumes=1)

    def test_stale_resume_said_by_verify(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path
    ) -> None:
        """A successor whose first verify says stale counts one stale resume (and only one)."""
        (tmp_path / "work").mkdir()
        (tmp_path / "work" / "config.yaml").write_text("retries: 1\n")
        new(hb, tmp_path, "--key-file", "config.yaml")
        a1 = agents("t1")
        a1("set", "t1", "step=b")
        a1.die()
        (tmp_path / "work" / "config.yaml").write_text("retries: 5\n")
        a2 = agents("t1")
        a2("verify", "t1", code=3)
        a2("verify", "t1", code=3)
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, stale_resumes=1)

    def test_verified_then_own_edits_is_not_stale(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path
    ) -> None:
        """A successor that verifies fresh and then edits a key file itself is not a stale resume."""
        (tmp_path / "work").mkdir()
        (tmp_path / "work" / "config.yaml").write_text("retries: 1\n")
        new(hb, tmp_path, "--key-file", "config.yaml")
        a1 = agents("t1")
        a1("set", "t1", "step=b")
        a1.die()
        a2 = agents("t1")
        a2("verify", "t1")
        (tmp_path / "work" / "config.yaml").write_text("retries: 3\n")  # its own work
        a2("set", "t1", "step=c")
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, clean_resumes=1)

    def test_idle_resume(self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path) -> None:
        """A successor that only touches and hands back, never moving the step, counts one idle resume."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("set", "t1", "step=b")
        a1("release", "t1")
        a1.die()
        a2 = agents("t1")
        a2("touch", "t1")
        a2("release", "t1")
        a2.die()
        assert metrics_of(hb) == expect(dispatches=2, resumes=1, idle_resumes=1, mean_time_to_resume_s=SECONDS)

    def test_spinning(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path, state_dir: Path
    ) -> None:
        """A `spinning` event (the daemon's: alive, touching, step not moving) counts one spinning episode."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("touch", "t1")
        record(state_dir, Event(task="t1", kind="spinning", ts=utcnow(), epoch=a1.epoch, actor="daemon",
                                data={"step": "a", "since": utcnow().isoformat()}))
        assert metrics_of(hb) == expect(dispatches=1, spinning=1)

    def test_escalation(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path, state_dir: Path
    ) -> None:
        """An `escalated` event (the daemon's: attempts exhausted) counts one escalation."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("set", "t1", "step=b")
        a1.die()
        now = utcnow()
        record(state_dir,
               Event(task="t1", kind="exited", ts=now, epoch=a1.epoch, actor="daemon",
                     data={"code": 1, "signal": None, "duration_s": 1.0, "progress": True, "pid": a1.proc.pid}),
               Event(task="t1", kind="escalated", ts=now, epoch=a1.epoch, actor="daemon",
                     data={"reason": "5 attempts without progress"}))
        assert metrics_of(hb) == expect(dispatches=1, escalations=1)

    def test_time_to_resume_and_duration(
        self, hb: Callable[..., Result], agents: Callable[[str], Agent], tmp_path: Path
    ) -> None:
        """Time to resume runs from the release to the successor's first write; duration from created to done."""
        new(hb, tmp_path)
        a1 = agents("t1")
        a1("set", "t1", "step=b")
        a1("release", "t1")
        a1.die()
        a2 = agents("t1")
        a2("set", "t1", "step=c")
        a2("done", "t1")
        doc = report(hb)
        metrics = doc["tasks"][0]["metrics"]
        assert metrics == expect(dispatches=2, resumes=1, clean_resumes=1, mean_time_to_resume_s=SECONDS,
                                 duration_s=SECONDS)
        events = {e["kind"]: e["ts"] for e in json.loads(hb("log", "t1", "--json").out)["events"]}
        created, done = datetime.fromisoformat(events["created"]), datetime.fromisoformat(events["done"])
        assert metrics["duration_s"] == pytest.approx((done - created).total_seconds(), abs=0.002)
        assert 0 < metrics["mean_time_to_resume_s"] < metrics["duration_s"]


def drop_block_by_hand(path: Path) -> None:
    """What a person (or an agent) editing the TOML does: status back to active, block text gone."""
    doc = tomllib.loads(path.read_text())
    doc["blocked_on"] = ""
    doc["meta"]["status"] = "active"
    doc["meta"].pop("gate", None)
    doc["meta"].pop("blocked_at", None)
    path.write_text(tomli_w.dumps(doc))


# -- the replay, on synthesized ledgers with exact times ------------------------------------------------------


T0 = datetime(2026, 1, 5, 9, 0, 0, tzinfo=datetime.now().astimezone().tzinfo).astimezone()


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
    from heartbeat.baton import Status

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


class TestRendering:
    def test_worst_first_and_totals(self, state_dir: Path) -> None:
        """The report sorts tasks by failure score, worst first; totals sum the counts."""
        store = FileStore(str(state_dir))
        try:
            for task_id in ("good", "bad", "worse"):
                tasks.new_task(store, task_id, task="T", step="a")
                tasks.claim(store, task_id, Owner(pid=1, host="h"), alive=False)
            now = utcnow()
            store.record([Event(task="bad", kind="spinning", ts=now, data={"step": "a"}),
                          Event(task="worse", kind="escalated", ts=now, data={"reason": "r"})])
            rep = build_report(store)
        finally:
            store.close()
        assert [t.id for t in rep.tasks] == ["worse", "bad", "good"]
        assert [t.score for t in rep.tasks] == [5, 2, 0]
        assert rep.totals == expect(dispatches=3, spinning=1, escalations=1)
        text = rep.render_text()
        lines = text.splitlines()
        assert lines[1].split()[:3] == ["TASK", "STATUS", "SCORE"]
        assert [line.split()[0] for line in lines[2:5]] == ["worse", "bad", "good"]
        assert any(line.startswith("TOTAL (3)") for line in lines)
        assert "worse: escalations: r" in text

    def test_cli_text_and_since(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """`heartbeat report` prints the table; `--since` in the future leaves nothing; a bad time is exit 2."""
        new(hb, tmp_path)
        r = hb("report")
        assert r.code == 0 and r.out.splitlines()[2].startswith("t1 ")
        later = (utcnow() + timedelta(hours=1)).isoformat()
        assert report(hb, "--since", later)["tasks"] == []
        assert "no handoffs to report since" in hb("report", "--since", later).out
        assert hb("report", "--since", "yesterday-ish").code == 2


@pytest.mark.slow
class TestWithTheDaemon:
    def test_daemon_driven_handoffs_are_counted(self, tmp_path: Path) -> None:
        """A real daemon: shift-changing agents resume cleanly, a crashing one escalates, a spinning one is
        stopped and escalated, a hand-dropped block is a bypass; the report counts exactly that per task."""
        from daemon_harness import TOY, DaemonHarness, toml_list

        tmp_path.chmod(0o700)
        launchers = f"""
[launchers.shifts]
type = "exec"
command = {toml_list([*TOY, "--step-time", "0.05", "--steps-per-shift", "1"])}

[launchers.crash]
type = "exec"
command = {toml_list([*TOY, "--mode", "exit:1"])}

[launchers.spin]
type = "exec"
command = {toml_list([*TOY, "--mode", "spin", "--step-time", "0.4"])}
stop_grace = "500ms"
"""
        # progress_after is the spinner's clock, and every agent's: 1 s judged a slow start on a loaded machine
        # (the worker's first step) as spinning; 4 s still escalates the spinner well inside the wait.
        h = DaemonHarness(tmp_path, max_attempts=2, progress_after="4s", extra=launchers)
        try:
            h.start()
            h.new("worker", "--launcher", "shifts", plan=3)
            h.new("doomed", "--launcher", "crash")
            h.new("spinner", "--launcher", "spin")
            h.new("held", "--blocked-on", "legal review")
            path = h.state / "batons" / "held.toml"
            drop_block_by_hand(path)
            h.wait(lambda: h.events("held", "bypass"), "the daemon to see the bypass")
            h.wait(lambda: h.baton("worker").meta.status.value == "done", "the worker to finish", timeout=60)
            h.wait(lambda: h.baton("doomed").meta.status.value == "escalated", "the escalation", timeout=60)
            h.wait(lambda: h.baton("spinner").meta.status.value == "escalated", "the spinner's escalation", timeout=60)
            r = h.cli("report", "--json")
            assert r.returncode == 0, r.stderr
            by_id = {t["id"]: t["metrics"] for t in json.loads(r.stdout)["tasks"]}
        finally:
            h.close()
        assert by_id["worker"] == expect(dispatches=3, resumes=2, clean_resumes=2, mean_time_to_resume_s=SECONDS,
                                         duration_s=SECONDS)
        assert by_id["doomed"] == expect(dispatches=2, resumes=1, idle_resumes=1, escalations=1)
        assert by_id["spinner"] == expect(dispatches=1, spinning=1, escalations=1)
        assert by_id["held"] == expect(bypassed_blocks=1)
