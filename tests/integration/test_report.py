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

from heartbeat.model.baton import Owner
from heartbeat.model.ledger import Event
from heartbeat.model.timeparse import utcnow
from heartbeat.reports.report import build_report
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks
from tests.unit.test_report_replay import expect


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


class Seconds:
    """Matches a measured duration: a float, not negative, under two minutes (timing varies by machine)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and 0.0 <= other < 120.0

    def __repr__(self) -> str:
        return "<seconds>"


SECONDS = Seconds()


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


