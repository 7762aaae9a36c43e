"""`heartbeat hooks install/uninstall`: what is baked in, what is recorded as written and taken back
(issue 24, item 6; issue 26, items 7, 11 and 14's `{}` stubs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env


def heartbeat(*args: str, cwd: Path, env: dict[str, str] | None = None,
              stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True, timeout=60,
                          cwd=str(cwd), env=clean_env(**(env or {})), input=stdin)


def settings(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def config(tmp_path: Path, work: Path) -> Path:
    """`heartbeat init`'s config (its state dir beside it) and a task working in ``work``."""
    r = heartbeat("init", str(tmp_path / "conf"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "conf" / "heartbeat.toml"
    r = heartbeat("--config", str(path), "new", "t1", "--task", "Fix the fallback", "--step", "Read the code",
                  "--intent", "Make the fallback path survive a restart", "--workdir", str(work), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return path


def run_installed_hook(settings_file: Path, event: dict[str, Any], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The SessionStart command the install wrote, run as Claude Code runs it: by the shell, in a
    terminal whose environment names no config and no state dir."""
    [command] = [h["command"] for g in settings(settings_file)["hooks"]["SessionStart"] for h in g["hooks"]]
    return subprocess.run(["/bin/sh", "-c", command], input=json.dumps(event), capture_output=True, text=True,
                          timeout=60, cwd=str(cwd), env=clean_env())


class TestInstallBakesWhatItResolved:
    """Run the README's way (`export HEARTBEAT_CONFIG=...`), install bakes that config into the hook."""

    def test_a_new_terminal_gets_the_brief(self, tmp_path: Path, work: Path, config: Path) -> None:
        """Installed with the config from $HEARTBEAT_CONFIG, the hook run with no variable at all (a new
        terminal) prints the task's brief. Before: it printed nothing, exit 0."""
        r = heartbeat("hooks", "install", "claude", "--dir", str(work), cwd=tmp_path,
                      env={"HEARTBEAT_CONFIG": str(config)})
        assert r.returncode == 0, r.stderr
        event = {"session_id": "s1", "cwd": str(work), "hook_event_name": "SessionStart", "source": "startup"}
        ran = run_installed_hook(work / ".claude" / "settings.json", event, cwd=work)
        assert ran.returncode == 0 and ran.stderr == "", ran.stderr
        context = json.loads(ran.stdout)["hookSpecificOutput"]["additionalContext"]
        assert "Make the fallback path survive a restart" in context
        assert f"--config {config}" in context  # the commands it gives work in that terminal too

    def test_the_state_dir_from_the_environment_is_baked_too(self, tmp_path: Path, work: Path,
                                                             config: Path) -> None:
        """$HEARTBEAT_STATE_DIR at install: the hook is given that state dir."""
        state = config.parent / "state"
        r = heartbeat("hooks", "install", "claude", "--dir", str(work), cwd=tmp_path,
                      env={"HEARTBEAT_STATE_DIR": str(state)})
        assert r.returncode == 0, r.stderr
        event = {"session_id": "s1", "cwd": str(work), "hook_event_name": "SessionStart", "source": "startup"}
        ran = run_installed_hook(work / ".claude" / "settings.json", event, cwd=work)
        assert "Make the fallback path survive a restart" in ran.stdout, ran.stderr

    def test_a_hook_with_no_config_says_so(self, tmp_path: Path, work: Path) -> None:
        """No config and no state dir anywhere: exit 0 (never break the agent), one stderr line saying so."""
        event = {"session_id": "s1", "cwd": str(work), "hook_event_name": "SessionStart", "source": "startup"}
        r = heartbeat("hook", "claude", cwd=work, stdin=json.dumps(event))
        assert r.returncode == 0 and r.stdout == ""
        assert r.stderr.startswith("heartbeat hook: no config found") and len(r.stderr.splitlines()) == 1, r.stderr

    def test_a_missing_state_dir_is_named(self, tmp_path: Path, work: Path) -> None:
        """A state dir that does not exist: named in one line, not created."""
        event = {"session_id": "s1", "cwd": str(work), "hook_event_name": "SessionStart", "source": "startup"}
        missing = tmp_path / "gone"
        r = heartbeat("hook", "claude", "--state-dir", str(missing), cwd=work, stdin=json.dumps(event))
        assert r.returncode == 0 and r.stdout == "" and not missing.exists()
        assert r.stderr == f"heartbeat hook: no state dir at {missing}: nothing to brief (a hook never creates one)\n"


class TestCodexAcceptsWhatIsWritten:
    """The real codex 0.171 reads the hooks install wrote without an error item about them."""

    def test_no_timeout_is_clamped(self, tmp_path: Path) -> None:
        """`codex exec` after `hooks install codex --user`: no "clamping SessionEnd hook timeout" error
        item (codex allows at most 3 s there; install wrote 30)."""
        from agent_clis import agent_cli
        from scripted_model import Workload, scripted_model
        from scripted_model.brain import Brain, Conversation, Reply
        from scripted_model.responses import codex_args
        from test_codex import BYPASS, codex_env

        class Idle(Brain):
            def decide(self, conv: Conversation) -> Reply:
                return Reply(text="Nothing to do.")

        tmp_path.chmod(0o700)
        for name in ("work", "home/.codex", "state"):
            (tmp_path / name).mkdir(parents=True)
        env = codex_env(tmp_path, HEARTBEAT_STATE_DIR=str(tmp_path / "state"))
        r = heartbeat("hooks", "install", "codex", "--user", "--dir", str(tmp_path / "work"), cwd=tmp_path,
                      env={k: v for k, v in env.items() if k.startswith(("HEARTBEAT_", "CODEX_HOME"))})
        assert r.returncode == 0, r.stderr
        with scripted_model(tmp_path / "model", Workload(steps=("s",)), sees_files=False,
                            wires=("responses",)) as model:
            model.brain.__class__ = Idle
            proc = subprocess.run([str(agent_cli("codex")), "exec", "--json", "--skip-git-repo-check", BYPASS,
                                   *codex_args(model.url), "hello"], stdin=subprocess.DEVNULL,
                                  cwd=str(tmp_path / "work"), env=env, capture_output=True, text=True, timeout=180)
        items = [json.loads(line).get("item", {}) for line in proc.stdout.splitlines() if line.startswith("{")]
        errors = [i.get("message", "") for i in items if i.get("type") == "error"]
        assert any("bypass-hook-trust" in e for e in errors), proc.stdout[-2000:]  # (codex read the hooks)
        assert not [e for e in errors if "hook" in e and "bypass-hook-trust" not in e], errors
