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
SERVER = "plugin:heartbeat:heartbeat"
"""And the server, in ``claude mcp list``."""


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

    def installed(self, tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
        """The claude CLI, the state dir (task t1), its workdir and the env of a HOME with the plugin installed."""
        from agent_clis import agent_cli

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
        added = _claude(claude, env, "plugin", "marketplace", "add", "--json", str(REPO))
        assert added.returncode == 0, added.stdout + added.stderr
        assert json.loads(added.stdout.splitlines()[-1])["marketplace"] == "heartbeat"
        installed = _claude(claude, env, "plugin", "install", "--json", "heartbeat@heartbeat")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        assert json.loads(installed.stdout.splitlines()[-1])["outcome"] == "ok"
        return claude, state, work, env

    def test_install_brief_and_remove_in_one_step(self, tmp_path: Path) -> None:
        from scripted_model import Workload, scripted_model
        from scripted_model.brain import Brain, Conversation, Reply

        class Idle(Brain):
            def decide(self, conv: Conversation) -> Reply:
                return Reply(text="Nothing to do.")

        before = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--ignored"],
                                capture_output=True, text=True).stdout
        claude, state, work, env = self.installed(tmp_path)

        with scripted_model(tmp_path / "model", Workload(steps=("s",)), wires=("anthropic",)) as model:
            model.brain.__class__ = Idle
            on = {**env, "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-scripted"}
            lines = _session(claude, work, on)
            [response] = [line for line in lines if line.get("subtype") == "hook_response"
                          and line.get("hook_event") == "SessionStart"]
            assert response["exit_code"] == 0, response
            # what reached the model: the brief in the messages
            assert model.bodies and any("Make the fallback path survive a restart" in json.dumps(b)
                                        for b in model.bodies)
            # the plugin's MCP server: `claude mcp list` starts it and says it answered (whether a -p run
            # offers its tools depends on it starting before the first request, so not asserted there)
            servers = _claude(claude, env, "mcp", "list")
            assert f"{SERVER}: heartbeat mcp - ✔ Connected" in servers.stdout, servers.stdout + servers.stderr
            session = lines[-1]["session_id"]
            assert ("session_started", "startup") in [(k, d.get("source")) for k, d in seam_events(state)
                                                      if d.get("session_id") == session]

            removed = _claude(claude, env, "plugin", "marketplace", "remove", "heartbeat")
            assert removed.returncode == 0, removed.stdout + removed.stderr
            settings = json.loads((Path(env["HOME"]) / ".claude" / "settings.json").read_text())
            assert "heartbeat" not in json.dumps(settings), settings
            listed = json.loads(_claude(claude, env, "plugin", "list", "--json").stdout)
            assert not [p for p in listed if "heartbeat" in p["id"]], listed
            # the CLI keeps the copy it ran from until its own clean-up, marked as orphaned, and runs none of it
            cached = Path(env["HOME"]) / ".claude" / "plugins" / "cache" / "heartbeat"
            assert all((v / ".orphaned_at").exists() for v in cached.glob("*/*")) if cached.exists() else True

            model.bodies.clear()
            after = _session(claude, work, on)
        assert not [line for line in after if str(line.get("hook_name", "")).startswith("SessionStart")]
        assert model.bodies and not any("Make the fallback path survive a restart" in json.dumps(b)
                                        for b in model.bodies)
        assert TOOLS not in json.dumps(model.bodies)
        assert SERVER not in _claude(claude, env, "mcp", "list").stdout
        assert not [d for _, d in seam_events(state) if d.get("session_id") == after[-1]["session_id"]]
        assert subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--ignored"],
                              capture_output=True, text=True).stdout == before  # the repository is only read

    def test_a_bound_sessions_own_commands_need_no_rule(self, tmp_path: Path) -> None:
        """A plugin carries no permission rules: the hook approves the bound task's own command (here
        ``heartbeat set t1``, as the brief spells it) and nothing else, so headless ``claude -p``, which
        refuses every Bash command no rule allows, runs the one and refuses the other."""
        from scripted_model import Workload, scripted_model
        from scripted_model.brain import Brain, Call, Conversation, Reply

        claude, state, work, env = self.installed(tmp_path)
        mine = 'heartbeat set t1 step="Written through the plugin"'
        other = "touch elsewhere"

        class Writes(Brain):
            def decide(self, conv: Conversation) -> Reply:
                done = {c.command for c in conv.calls}
                for command in (mine, other):
                    if command not in done:
                        return Reply(calls=(Call(id=f"c{len(done)}", kind="shell", command=command),))
                return Reply(text="Noted.")

        with scripted_model(tmp_path / "model", Workload(steps=("s",)), wires=("anthropic",)) as model:
            model.brain.__class__ = Writes
            lines = _session(claude, work, {**env, "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-scripted",
                                            "HEARTBEAT_TASK": "t1"})
        show = subprocess.run([sys.executable, "-m", "heartbeat", "--state-dir", str(state), "show", "t1", "--json"],
                              env=clean_env(), capture_output=True, text=True, timeout=60)
        assert json.loads(show.stdout)["step"] == "Written through the plugin", show.stdout + show.stderr
        denied = [d.get("tool_input", {}).get("command") for d in lines[-1].get("permission_denials", [])]
        assert denied == [other] and not (work / "elsewhere").exists(), lines[-1]
