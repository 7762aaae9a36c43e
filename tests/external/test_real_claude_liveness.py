"""The real ``claude`` under the daemon: proof of life from its output, limits as waits (issue 16,
items 3, 5 and their share of 8).

The daemon runs the pinned ``claude`` through the ``claude-code`` preset against the scripted
model on 127.0.0.1 (``tests/support/scripted_model``), with a short ``stall_after``. The model's own
record says what the agent really did.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_clis import agent_cli
from daemon_harness import DaemonHarness, toml_list
from scripted_model import ScriptedModel, Workload, scripted_model

from tests.external.test_real_sessions import README_ARGS, STEPS, claude_env

pytestmark = pytest.mark.slow


def launcher(model: ScriptedModel, home: Path, **env: str) -> str:
    merged = {**claude_env(model, home), **env}
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in merged.items())
    return f"""
[launchers.claude]
preset = "claude-code"
program = "{agent_cli("claude")}"
args = {toml_list(README_ARGS)}
inherit_env = ["LANG"]
env = {{ {pairs} }}
stop_grace = "2s"
"""


class Run:
    """A daemon whose ``claude`` launcher talks to the scripted model; one task on :data:`STEPS`."""

    def __init__(self, root: Path, model: ScriptedModel, *, stall_after: str, max_attempts: int = 4,
                 **env: str) -> None:
        root.chmod(0o700)
        self.model = model
        self.work = root / "work"
        self.work.mkdir()
        home = root / "home"
        home.mkdir()
        self.h = DaemonHarness(root, extra=launcher(model, home, **env), stall_after=stall_after,
                               max_attempts=max_attempts)
        text = self.h.config_text().replace('default_launcher = "toy"', 'default_launcher = "claude"')
        self.h.write_config(text)

    def control(self, **controls: object) -> None:
        path = self.model.log_dir / "controls.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(controls))
        tmp.replace(path)

    def new(self, task: str) -> None:
        plan = [a for s in STEPS for a in ("--plan", s)]
        r = self.h.cli("new", task, "--task", "Fix the fallback path", "--intent", "Users get blank answers",
                       "--step", STEPS[0], "--next", STEPS[1], *plan, "--workdir", str(self.work))
        assert r.returncode == 0, r.stderr

    def record(self) -> list[dict[str, object]]:
        return self.model.brain.record.entries()

    def status(self, task: str) -> str:
        return self.h.baton(task).meta.status.value


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False) as m:
        yield m


class TestProofOfLife:
    """The agent's stream-json output is proof of life; a model that answers nothing is still noticed."""

    def test_working_agent_that_never_touches_is_not_stalled(self, tmp_path: Path, model: ScriptedModel) -> None:
        """The first step takes six silent working turns of `sleep 4` (no note, no touch): over
        stall_after (20s, room for claude's start on a loaded machine) between notes, with claude
        printing lines each turn; the later steps run without them (one long silence is the case,
        and each more cost the suite 24 s). One dispatch finishes the task (fails on c684e38:
        stopped as hung mid-step and dispatched again)."""
        run = Run(tmp_path, model, stall_after="20s")
        run.control(work_turns=6, work_sleep=4)
        try:
            run.h.start()
            run.new("worker")
            run.h.wait(lambda: any(e["event"] == "step_done" for e in run.record()), "the first step done",
                       timeout=400)
            run.control()  # read by the model at its next request
            run.h.wait(lambda: run.status("worker") == "done", "the task done by the agent", timeout=400)
            assert not run.h.events("worker", "stopped")
            assert len(run.h.events("worker", "dispatched")) == 1
            done = [e["step"] for e in run.record() if e["event"] == "step_done"]
            assert done == list(STEPS)
            notes = [e.ts for e in run.h.events("worker") if e.kind in ("launched", "updated", "touched")]
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(notes)]
            assert max(gaps, default=0) > 20, f"the notes came closer than stall_after: {gaps}"
        finally:
            run.h.close()

    def test_stuck_model_is_noticed(self, tmp_path: Path, model: ScriptedModel) -> None:
        """The model answers nothing (claude waits, printing nothing): the agent is stopped as hung with
        "no output" in the reason, and once the model answers again a successor finishes."""
        run = Run(tmp_path, model, stall_after="20s")
        run.control(hang=True)
        try:
            run.h.start()
            run.new("stuck")
            stopped = run.h.wait(lambda: run.h.events("stuck", "stopped"), "the stuck agent stopped", timeout=120)
            assert stopped[0].data["why"] == "hung" and "no output" in stopped[0].data["reason"]
            run.control()
            run.h.wait(lambda: run.status("stuck") == "done", "a successor to finish", timeout=300)
            assert len(run.h.events("stuck", "dispatched")) >= 2
        finally:
            run.h.close()


class TestRateLimits:
    """A 429 from the API is a wait for the rate limit, not a failed attempt."""

    def test_rate_limited_runs_spend_no_attempt(self, tmp_path: Path, model: ScriptedModel) -> None:
        """Three 429s (claude told not to retry them itself) with max_attempts = 2: the task waits and
        finishes with no escalation, every dispatch attempt 1 (fails on c684e38: escalated after the
        second 429, "2 attempts without progress")."""
        run = Run(tmp_path, model, stall_after="60s", max_attempts=2, CLAUDE_CODE_MAX_RETRIES="0")
        run.control(rate_limit={"status": 429, "retry_after": 1, "times": 3})
        try:
            run.h.start()
            run.new("limited")
            run.h.wait(lambda: run.status("limited") in ("done", "escalated"), "the task to end", timeout=300)
            assert run.status("limited") == "done", run.h.events("limited", "escalated")
            limited = [e for e in run.h.events("limited", "exited") if e.data.get("kind") == "rate-limited"]
            assert len(limited) >= 2
            assert all(e.data.get("rate_limited") for e in limited)
            assert {e.data["attempt"] for e in run.h.events("limited", "dispatched")} == {1}
            assert [e["step"] for e in run.record() if e["event"] == "step_done"] == list(STEPS)
        finally:
            run.h.close()


class TestCutRunsAreCharged:
    """Issue 24 item 4 (b): a run stopped before its result line is charged what its stream carried."""

    def test_runs_always_cut_by_max_runtime_meet_the_budget(self, tmp_path: Path, model: ScriptedModel) -> None:
        """Each run works in silent `sleep 3` turns and is stopped at max_runtime (15s); the real claude,
        SIGTERMed, prints no result line. Each cut run is charged from its assistant messages' usage and
        max_cost_usd = 0.3 escalates the task (about $0.20 a run here), before max_attempts = 3 does (on
        4c852cf: nothing charged, escalated on "3 attempts without progress" instead)."""
        run = Run(tmp_path, model, stall_after="60s", max_attempts=3)
        run.h.write_config(run.h.config_text()
                           .replace('stop_grace = "2s"', 'stop_grace = "2s"\nmax_runtime = "15s"')
                           .replace('default_launcher = "toy"', 'default_launcher = "claude"\nmax_cost_usd = 0.3'))
        run.control(work_turns=50, work_sleep=3)
        try:
            run.h.start()
            run.new("cut")
            escalated = run.h.wait(lambda: run.h.events("cut", "escalated"), "the escalation", timeout=400)[0]
            assert escalated.data["reason"].startswith("cost budget spent: its runs cost $")
            exits = run.h.events("cut", "exited")
            assert len(exits) >= 2 and all(e.data.get("cost_source") == "usage" for e in exits)
            assert all(e.data.get("signal") == 15 or e.data.get("code") == 143 for e in exits)  # SIGTERMed
            assert run.h.baton("cut").meta.cost_usd >= 0.3
        finally:
            run.h.close()
