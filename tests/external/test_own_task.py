"""An agent the daemon launched writes only its own task (issue 24, item 2).

The daemon gives each agent ``HEARTBEAT_TASK`` and ``HEARTBEAT_EPOCH``; the epoch fences only that
task. Before this, two tasks sharing a workdir let one task's agent record its steps into the other's
``done``, unfenced, through a permission rule for any task. The refusal lives in the CLI itself (and
in the relay and the MCP server, which write for an agent): no permission rule talks it around.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Result, clean_env

from heartbeat.store.files import FileStore
from heartbeat.tasks import write


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def two(hb: Callable[..., Result], work: Path) -> dict[str, str]:
    """Tasks a and b in one workdir; the environment of a's agent at a's current epoch."""
    for task in ("a", "b"):
        r = hb("new", task, "--task", f"Task {task}", "--step", "Start", "--workdir", str(work))
        assert r.code == 0, r.err
    r = hb("claim", "a", "--pid", str(os.getpid()), "--force")
    assert r.code == 0, r.err
    return {"HEARTBEAT_TASK": "a", "HEARTBEAT_EPOCH": r.out.strip()}


FOREIGN_WRITES = [
    ("set", "b", "step=Stolen"),
    ("add", "b", "done", "a's step"),
    ("touch", "b"),
    ("done", "b"),
    ("block", "b", "--on", "me"),
    ("snooze", "b", "--for", "1h"),
    ("fail", "b", "--reason", "x"),
    ("claim", "b", "--pid", str(os.getpid()), "--force"),
    ("release", "b"),
    ("unblock", "b", "--by", "ann"),
    ("retry", "b", "--by", "ann"),
]


class TestTheCli:
    """`heartbeat` itself refuses, in one line and exit 2, a write to another task from a launched agent."""

    @pytest.mark.parametrize("argv", FOREIGN_WRITES, ids=[a[0] for a in FOREIGN_WRITES])
    def test_a_write_to_another_task_is_refused(self, hb: Callable[..., Result], state_dir: Path,
                                                two: dict[str, str], argv: tuple[str, ...]) -> None:
        """Every command that changes a task, on b from a's agent: exit 2, one line naming both tasks,
        b's baton byte for byte as it was and nothing in its ledger."""
        baton = state_dir / "batons" / "b.toml"
        before = baton.read_bytes()
        events = len(FileStore(str(state_dir)).ledger.events("b"))
        r = hb(*argv, env=two)
        assert r.code == 2, (r.code, r.err)
        assert r.err.startswith("heartbeat: b: refused: this agent was launched for task 'a'"), r.err
        assert len(r.err.splitlines()) == 1
        assert baton.read_bytes() == before
        assert len(FileStore(str(state_dir)).ledger.events("b")) == events

    def test_its_own_task_and_reads_of_others_are_answered(self, hb: Callable[..., Result],
                                                           two: dict[str, str]) -> None:
        """a's agent writes a; it may still read b (show, brief, verify), as an upstream's agent's work is read."""
        assert hb("add", "a", "done", "step one", env=two).code == 0
        assert hb("set", "a", "step=Two", env=two).code == 0
        for argv in (("show", "b"), ("brief", "b"), ("verify", "b")):
            r = hb(*argv, env=two)
            assert r.code == 0, (argv, r.err)

    def test_a_person_is_not_an_agent(self, hb: Callable[..., Result], two: dict[str, str]) -> None:
        """A person's shell (no variables) and a session bound by hand (HEARTBEAT_TASK only) write any task."""
        assert hb("add", "b", "done", "by hand").code == 0
        assert hb("add", "b", "done", "bound by hand", env={"HEARTBEAT_TASK": "a"}).code == 0


class TestTheRelay:
    """A write the daemon's relay runs for an agent is refused the same way (the caller's variables)."""

    def test_a_relayed_write_to_another_task_is_refused(self, state_dir: Path, two: dict[str, str]) -> None:
        store = FileStore(str(state_dir))
        try:
            before = store.load("b")
            code, message = write.relayed(store, write.Write("add", "b", field="done", values=("x",)), two)
            assert code == 2 and message.startswith("heartbeat: b: refused: this agent was launched for task 'a'")
            assert store.load("b").done == before.done
            assert write.relayed(store, write.Write("add", "a", field="done", values=("x",)), two) == (0, "")
        finally:
            store.close()


class TestTheMcpServer:
    """The MCP server an agent's CLI starts inherits its variables: its writes are fenced the same way."""

    def test_a_tool_write_to_another_task_is_refused(self, hb: Callable[..., Result], state_dir: Path,
                                                     two: dict[str, str]) -> None:
        import anyio
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        params = StdioServerParameters(command=sys.executable, args=["-m", "heartbeat", "mcp"],
                                       env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), **two))
        before = json.loads(hb("show", "b", "--json").out)

        async def main() -> Any:
            with anyio.fail_after(60):
                async with Client(params) as c:
                    writes = [await c.call_tool("add", {"id": "b", "field": "done", "values": ["x"]}),
                              await c.call_tool("set", {"id": "b", "fields": {"step": "x"}}),
                              await c.call_tool("done", {"id": "b"})]
                    reads = [await c.call_tool("show", {"id": "b"}), await c.call_tool("verify", {"id": "b"})]
                    return writes, reads

        writes, reads = anyio.run(main)
        for r in writes:
            text = "".join(getattr(c, "text", "") for c in r.content)
            assert r.is_error and "launched for task 'a'" in text and text.endswith("(exit 2)"), text
        assert not any(r.is_error for r in reads)
        assert json.loads(hb("show", "b", "--json").out) == before


def test_the_cli_refuses_before_the_store_is_opened(tmp_path: Path) -> None:
    """The refusal needs no store: an agent pointed at a state dir that does not exist is still refused
    (exit 2), and no state dir is created for it."""
    missing = tmp_path / "nowhere"
    proc = subprocess.run([sys.executable, "-m", "heartbeat", "add", "b", "done", "x"], capture_output=True,
                          text=True, timeout=60, env=clean_env(HEARTBEAT_STATE_DIR=str(missing), HEARTBEAT_TASK="a",
                                                               HEARTBEAT_EPOCH="1", HEARTBEAT_RELAY="off"))
    assert proc.returncode == 2 and "launched for task 'a'" in proc.stderr, proc.stderr
    assert not missing.exists()


class TestRealClaude:
    """The real `claude -p` (2.1.332), run as the daemon runs it (the claude-code preset's per-task
    --allowedTools, HEARTBEAT_TASK/EPOCH of task a) in a workdir a and b share, after `hooks install
    claude --dir`: the scripted model tells it to record a step into b, then into a."""

    def run(self, tmp_path: Path, state_dir: Path, work: Path, env: dict[str, str]) -> list[str]:
        """Run the session; the tool results the CLI sent back, in order."""
        from agent_clis import agent_cli
        from scripted_model import Workload, scripted_model
        from scripted_model.brain import Brain, Conversation, Reply, shell_call
        from test_real_sessions import README_ARGS, claude_env

        from heartbeat.presets.claude import claude_allow_rules

        class Thief(Brain):
            def decide(self, conv: Conversation) -> Reply:
                if not conv.tools:
                    return Reply(text="OK")
                done = len(conv.calls)
                if done == 0:
                    return Reply(calls=(shell_call("toolu_steal", "heartbeat add b done stolen"),))
                if done == 1:
                    return Reply(calls=(shell_call("toolu_mine", "heartbeat add a done mine"),))
                return Reply(text="Done.")

        home = tmp_path / "home"
        home.mkdir()
        with scripted_model(tmp_path / "model", Workload(steps=("s",)), wires=("anthropic",)) as model:
            model.brain.__class__ = Thief
            run_env = {**clean_env(), **claude_env(model, home), "HEARTBEAT_STATE_DIR": str(state_dir), **env}
            run_env = {k: v for k, v in run_env.items() if not k.startswith("CLAUDE_CODE_") or k.endswith("_TRAFFIC")}
            proc = subprocess.run([str(agent_cli("claude")), "-p", "--output-format", "stream-json", "--verbose",
                                   "--allowedTools", ",".join(claude_allow_rules("a")), *README_ARGS],
                                  input="go", text=True, capture_output=True, cwd=str(work), env=run_env, timeout=240)
            lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            assert lines and lines[-1].get("type") == "result", f"exit {proc.returncode}: {proc.stderr[-800:]}"
            return [json.dumps(c.get("content")) for line in lines if line.get("type") == "user"
                    for c in line.get("message", {}).get("content", []) if isinstance(c, dict)
                    and c.get("type") == "tool_result"]

    def test_an_installed_workdir_gives_no_rule_for_another_task(
            self, hb: Callable[..., Result], tmp_path: Path, state_dir: Path, work: Path,
            two: dict[str, str]) -> None:
        """The install's rules for any task are read-only now: `heartbeat add b ...` needs an approval
        a headless run cannot give, and b's done stays empty; a's own write lands."""
        assert hb("--state-dir", str(state_dir), "hooks", "install", "claude", "--dir", str(work)).code == 0
        results = self.run(tmp_path, state_dir, work, two)
        assert len(results) == 2 and "approval" in results[0], results
        store = FileStore(str(state_dir))
        assert store.load("b").done == [] and store.load("a").done == ["mine"]

    def test_a_rule_for_any_task_is_no_way_around_the_cli(
            self, hb: Callable[..., Result], tmp_path: Path, state_dir: Path, work: Path,
            two: dict[str, str]) -> None:
        """Even a person's own `Bash(heartbeat add:*)` (any task) in settings.local.json: claude runs the
        command and `heartbeat` itself refuses it in one line; b's done stays empty."""
        local = work / ".claude" / "settings.local.json"
        local.parent.mkdir()
        local.write_text(json.dumps({"permissions": {"allow": ["Bash(heartbeat add:*)"]}}))
        results = self.run(tmp_path, state_dir, work, two)
        assert len(results) == 2 and "launched for task 'a'" in results[0] and "Exit code 2" in results[0], results
        store = FileStore(str(state_dir))
        assert store.load("b").done == [] and store.load("a").done == ["mine"]
