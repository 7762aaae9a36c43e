"""The Claude Code plugin in this repository (.claude-plugin/marketplace.json, plugins/heartbeat/), installed
into a temp HOME with the real ``claude plugin`` commands and run headless against the scripted model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import clean_env

from tests.integration.test_hooks import seam_events

REPO = Path(__file__).resolve().parents[2]
TOOLS = "mcp__plugin_heartbeat_heartbeat__"
"""How claude 2.1.332 names the plugin's MCP tools: ``mcp__plugin_<plugin>_<server>__<tool>``."""


def _claude(claude: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(claude), *args], text=True, capture_output=True, env=env, timeout=180,
                          stdin=subprocess.DEVNULL)


def _session(claude: Path, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    proc = subprocess.run([str(claude), "-p", "--output-format", "stream-json", "--verbose"], input="hello",
                          text=True, capture_output=True, cwd=str(cwd), env=env, timeout=240)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1].get("type") == "result", f"exit {proc.returncode}: {proc.stderr[-800:]}"
    assert lines[-1]["is_error"] is False, lines[-1]
    return lines


class TestClaudePlugin:
    """``claude plugin marketplace add <repo>`` + ``claude plugin install heartbeat@heartbeat``: the next
    session is briefed by the plugin's SessionStart hook and offered the plugin's MCP tools; ``claude plugin
    marketplace remove heartbeat`` takes all of it away in one step."""

    def test_install_brief_and_remove_in_one_step(self, tmp_path: Path) -> None:
        from agent_clis import agent_cli
        from scripted_model import Workload, scripted_model
        from scripted_model.brain import Brain, Conversation, Reply

        class Idle(Brain):
            def decide(self, conv: Conversation) -> Reply:
                return Reply(text="Nothing to do.")

        claude = agent_cli("claude")
        state = tmp_path / "st"
        state.mkdir(mode=0o700)
        work = tmp_path / "work"
        work.mkdir()
        hb = [sys.executable, "-m", "heartbeat", "--state-dir", str(state)]
        assert subprocess.run([*hb, "new", "t1", "--task", "Fix the fallback", "--step", "Read the code",
                               "--intent", "Make the fallback path survive a restart", "--workdir", str(work)],
                              env=clean_env(), capture_output=True, timeout=60).returncode == 0
        home = tmp_path / "home"
        home.mkdir()
        # the plugin's hooks run `heartbeat` from PATH, as a person's pipx or venv install puts it there
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = clean_env(HOME=str(home), PATH=path, HEARTBEAT_STATE_DIR=str(state),
                        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
        env = {k: v for k, v in env.items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))
               or k == "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"}
        before = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--ignored"],
                                capture_output=True, text=True).stdout

        added = _claude(claude, env, "plugin", "marketplace", "add", "--json", str(REPO))
        assert added.returncode == 0, added.stdout + added.stderr
        assert json.loads(added.stdout.splitlines()[-1])["marketplace"] == "heartbeat"
        installed = _claude(claude, env, "plugin", "install", "--json", "heartbeat@heartbeat")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert json.loads(installed.stdout.splitlines()[-1])["outcome"] == "ok"

        with scripted_model(tmp_path / "model", Workload(steps=("s",)), wires=("anthropic",)) as model:
            model.brain.__class__ = Idle
            on = {**env, "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-scripted"}
            lines = _session(claude, work, on)
            [response] = [line for line in lines if line.get("subtype") == "hook_response"
                          and line.get("hook_event") == "SessionStart"]
            assert response["exit_code"] == 0, response
            # what reached the model: the brief in the messages, heartbeat's MCP tools among the tools
            assert model.bodies and any("Make the fallback path survive a restart" in json.dumps(b)
                                        for b in model.bodies)
            # claude 2.1.332 defers MCP tools: their names reach the model in a system message, not in `tools`
            assert f"{TOOLS}status" in json.dumps(model.bodies) and f"{TOOLS}set" in json.dumps(model.bodies)
            session = lines[-1]["session_id"]
            assert ("session_started", "startup") in [(k, d.get("source")) for k, d in seam_events(state)
                                                      if d.get("session_id") == session]

            removed = _claude(claude, env, "plugin", "marketplace", "remove", "heartbeat")
            assert removed.returncode == 0, removed.stdout + removed.stderr
            settings = json.loads((home / ".claude" / "settings.json").read_text())
            assert "heartbeat" not in json.dumps(settings), settings
            listed = json.loads(_claude(claude, env, "plugin", "list", "--json").stdout)
            assert not [p for p in listed if "heartbeat" in p["id"]], listed
            # the CLI keeps the copy it ran from until its own clean-up, marked as orphaned, and runs none of it
            cached = home / ".claude" / "plugins" / "cache" / "heartbeat"
            assert all((v / ".orphaned_at").exists() for v in cached.glob("*/*")) if cached.exists() else True

            model.bodies.clear()
            after = _session(claude, work, on)
        assert not [line for line in after if str(line.get("hook_name", "")).startswith("SessionStart")]
        assert model.bodies and not any("Make the fallback path survive a restart" in json.dumps(b)
                                        for b in model.bodies)
        assert TOOLS not in json.dumps(model.bodies)
        assert not [d for _, d in seam_events(state) if d.get("session_id") == after[-1]["session_id"]]
        assert subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--ignored"],
                              capture_output=True, text=True).stdout == before  # the repository is only read
