"""Real sessions: the real ``claude`` CLI runs whole agent loops against the scripted model.

The daemon launches the pinned ``claude`` through the ``claude-code`` preset with the
README's config; ``claude`` sends its Messages API requests to the scripted model on
127.0.0.1 (``tests/scripted_model``), runs the tool calls it answers with (``Write``,
``Bash``: the real ``heartbeat`` commands against the real state dir), fires its hooks and
resumes its sessions. What the agent did is read from the model's own record (built from
the tool results the CLI sent back), independent of heartbeat's ledger.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_clis import agent_cli
from daemon_harness import DaemonHarness, toml_list
from scripted_model import ScriptedModel, Workload, scripted_model, step_file

pytestmark = pytest.mark.slow

STEPS = ("Survey the module", "Write the fix", "Run the tests")
README_ARGS = ["--model", "sonnet", "--permission-mode", "acceptEdits"]
"""The README's Claude Code launcher args."""
BIN = Path(sys.executable).parent
"""Where this venv's ``heartbeat`` is: on the agent's PATH, as an installed heartbeat is."""


def claude_env(model: ScriptedModel, home: Path) -> dict[str, str]:
    """The agent's environment: the scripted model as the API, a throwaway HOME, no other traffic."""
    return {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-scripted-model",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def claude_launcher(model: ScriptedModel, home: Path, *, args: list[str], session: str = "fresh") -> str:
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in claude_env(model, home).items())
    return f"""
[launchers.claude]
preset = "claude-code"
program = "{agent_cli("claude")}"
args = {toml_list(args)}
session = "{session}"
inherit_env = ["LANG"]
env = {{ {env} }}
"""


class Session:
    """A scripted model, a workdir and a daemon whose ``claude`` launcher talks to the model."""

    def __init__(self, root: Path, model: ScriptedModel, *, args: list[str], session: str = "fresh") -> None:
        root.chmod(0o700)
        self.model = model
        self.work = root / "work"
        self.work.mkdir()
        home = root / "home"
        home.mkdir()
        # claude never touches: only its notes are proof of life, so stall_after is generous
        self.h = DaemonHarness(root, extra=claude_launcher(model, home, args=args, session=session),
                               stall_after="180s", max_attempts=4)

    def new(self, task: str, *extra: str) -> None:
        plan = [a for s in STEPS for a in ("--plan", s)]
        r = self.h.cli("new", task, "--task", "Fix the fallback path", "--intent", "Users get blank answers",
                       "--step", STEPS[0], "--next", STEPS[1], *plan, "--workdir", str(self.work),
                       "--launcher", "claude", *extra)
        assert r.returncode == 0, r.stderr

    def control(self, **controls: Any) -> None:
        path = self.model.log_dir / "controls.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(controls))
        os.replace(tmp, path)

    def record(self) -> list[dict[str, Any]]:
        return self.model.brain.record.entries()

    def status(self, task: str) -> str:
        return self.h.baton(task).meta.status.value


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False) as m:
        yield m


class TestTheAgentKeepsItsNote:
    """Issue 16: with the README's config, every heartbeat command the agent ran was refused headless."""

    def test_readme_config_finishes_a_task_and_allows_nothing_else(self, tmp_path: Path, model: ScriptedModel) -> None:
        """acceptEdits (the README's args): the agent reads its baton, notes each step and finishes the
        task; commands that are not heartbeat's own on this task are still refused (fails on c684e38:
        every heartbeat command refused with 'This command requires approval', the task never done)."""
        s = Session(tmp_path, model, args=README_ARGS)
        pwned = s.work / "pwned"
        write = "python3 -c \"open('pwned', 'w')\""  # acceptEdits itself allows touch, mkdir, ... in the workdir
        probes = [
            "heartbeat done other-task --note x",
            "heartbeat show real1",
            f'heartbeat add real done "x" && {write}',
            f"heartbeat touch real; {write}",
            f"heartbeat touch real | {write}",
            f'heartbeat set real step="$({write})"',
            "heartbeat show $HEARTBEAT_TASK",
            write,
        ]
        s.control(probes=probes)
        try:
            s.h.start()
            s.new("real")
            s.h.wait(lambda: s.status("real") == "done", "the task done by the agent", timeout=240)
            record = s.record()
            notes = [e for e in record if e["event"] == "note" and e["command"] not in probes]
            assert notes[0]["command"] == "heartbeat show real --json"
            assert [e["command"] for e in notes if e["error"]] == []
            assert [e["step"] for e in record if e["event"] == "step_done"] == list(STEPS)
            baton = s.h.baton("real")
            assert baton.done == list(STEPS)
            refused = {e["command"] for e in record if e["event"] == "refused"}
            assert refused == set(probes), [e for e in record if e["event"] in ("refused", "shell")]
            assert not pwned.exists()
            assert len(s.h.events("real", "dispatched")) == 1
        finally:
            s.h.close()

    def test_default_permission_mode_keeps_the_note_too(self, tmp_path: Path, model: ScriptedModel) -> None:
        """Default mode (no --permission-mode): the CLI refuses the agent's Write, and the agent's
        heartbeat commands still go through: it reads its baton and blocks the task, naming why
        (fails on c684e38: the show and the block are refused too, and the task stays active)."""
        s = Session(tmp_path, model, args=["--model", "sonnet"])
        try:
            s.h.start()
            s.new("real")
            s.h.wait(lambda: s.status("real") == "blocked", "the agent's own block", timeout=240)
            baton = s.h.baton("real")
            assert baton.blocked_on == f"the CLI refused to write {step_file(0)}"
            # the model learns how its last command went from the CLI's next request
            notes = s.h.wait(lambda: [e["command"] for e in s.record() if e["event"] == "note"][1:] and
                             [e for e in s.record() if e["event"] == "note"], "the block in the model's record")
            assert [(e["command"], e["error"]) for e in notes] == [
                ("heartbeat show real --json", False),
                (f'heartbeat block real --on "the CLI refused to write {step_file(0)}"', False)]
            record = s.record()
            assert [e["kind"] for e in record if e["event"] == "refused"] == ["write"]
        finally:
            s.h.close()


class TestKilledMidTask:
    """SIGKILL mid-step: the successor finishes, redoing at most the step in flight (by the model's record)."""

    @pytest.mark.parametrize("session", ["fresh", "resume"])
    def test_successor_finishes_redoing_at_most_the_step_in_flight(
            self, tmp_path: Path, model: ScriptedModel, session: str) -> None:
        """The model holds its answer after step 2's file is written and before its note; the agent is
        killed there. The successor (a fresh session from the brief, or the same session resumed) ends
        the task with every step done once, except step 2 at most twice."""
        s = Session(tmp_path, model, args=README_ARGS, session=session)
        s.control(hold_after_step=2)
        try:
            s.h.start()
            s.new("real")
            s.h.wait(lambda: any(e["event"] == "held" for e in s.record()), "the model holding step 2", timeout=180)
            [first] = s.h.events("real", "dispatched")
            groups = s.h.live_agents("real")["real"]
            s.control()  # the successor gets answers
            for pgid in groups:
                os.killpg(pgid, signal.SIGKILL)
            s.h.wait(lambda: s.status("real") == "done", "the successor finishing", timeout=240)
            done = [e["step"] for e in s.record() if e["event"] == "step_done"]
            assert set(done) == set(STEPS)
            assert [st for st in STEPS if done.count(st) > 1] in ([], [STEPS[1]])
            assert done.count(STEPS[1]) <= 2 and all(done.count(st) == 1 for st in (STEPS[0], STEPS[2]))
            dispatched = s.h.events("real", "dispatched")
            assert len(dispatched) == 2
            second = dispatched[1].data
            if session == "resume":
                assert second["session"] == first.data["session"] and "resume" in second["reason"] + second.get(
                    "session_why", "")
            else:
                assert second["session"] != first.data["session"]
            assert s.h.baton("real").done == list(STEPS)
        finally:
            s.h.close()
