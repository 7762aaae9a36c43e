"""`heartbeat hooks install/uninstall`: what is baked in, what is recorded as written and taken back
(issue 24, item 6; issue 26, items 7, 11 and 14's `{}` stubs)."""

from __future__ import annotations

import json
import os
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


class TestUninstallTakesBackExactlyWhatWasWritten:
    """Uninstall removes what install recorded writing, never a person's own, and no `{}` is left behind."""

    def test_a_persons_own_rules_stay(self, tmp_path: Path, work: Path) -> None:
        """A person's `Bash(heartbeat show:*)` in settings.json and `Bash(heartbeat brief:*)` in
        settings.local.json (install's rule too, but there before it): install and uninstall leave both
        files byte for byte as they were. Before: uninstall deleted both rules."""
        claude = work / ".claude"
        claude.mkdir()
        settings, local = claude / "settings.json", claude / "settings.local.json"
        settings.write_text(json.dumps({"permissions": {"allow": ["Bash(heartbeat show:*)", "Bash(ls:*)"]}}))
        local.write_text(json.dumps({"permissions": {"allow": ["Bash(heartbeat brief:*)"]}}))
        before = settings_of(settings), settings_of(local)
        state = tmp_path / "st"
        for action in ("install", "uninstall"):
            r = heartbeat("--state-dir", str(state), "hooks", action, "claude", "--dir", str(work), cwd=tmp_path)
            assert r.returncode == 0, r.stderr
        assert (settings_of(settings), settings_of(local)) == before
        assert sorted(p.name for p in claude.iterdir()) == ["settings.json", "settings.local.json"]

    @pytest.mark.parametrize("agent", ["claude", "codex"])
    def test_files_install_created_are_removed(self, tmp_path: Path, work: Path, agent: str) -> None:
        """Into a directory with none of the files: uninstall removes every file install created (no `{}`
        stubs, no record left). Before: settings.json, settings.local.json, .mcp.json (hooks.json) stayed `{}`."""
        extra = ["--mcp"] if agent == "claude" else []
        args = ("--state-dir", str(tmp_path / "st"), "hooks")
        r = heartbeat(*args, "install", agent, "--dir", str(work), *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert heartbeat(*args, "uninstall", agent, "--dir", str(work), cwd=tmp_path).returncode == 0
        left = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
        assert left == [], left

    def test_a_file_a_person_wrote_into_after_install_stays(self, tmp_path: Path, work: Path) -> None:
        """A file install created that a person then added to is kept, with what they added."""
        args = ("--state-dir", str(tmp_path / "st"), "hooks")
        assert heartbeat(*args, "install", "claude", "--dir", str(work), cwd=tmp_path).returncode == 0
        settings = work / ".claude" / "settings.json"
        settings.write_text(json.dumps({**settings_of(settings), "model": "sonnet"}))
        assert heartbeat(*args, "uninstall", "claude", "--dir", str(work), cwd=tmp_path).returncode == 0
        assert settings_of(settings) == {"model": "sonnet"}

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root: install run as root on a person's files")
    def test_install_as_root_keeps_a_persons_owner_and_mode(self, tmp_path: Path, work: Path) -> None:
        """Root installs into a person's project: their settings file keeps its owner and mode, and the files
        install creates belong to them too. Before: settings.json became root's."""
        claude = work / ".claude"
        claude.mkdir()
        settings = claude / "settings.json"
        settings.write_text("{}\n")
        settings.chmod(0o640)
        for path in (work, claude, settings):
            os.chown(path, 1234, 1234)
        r = heartbeat("--state-dir", str(tmp_path / "st"), "hooks", "install", "claude", "--dir", str(work),
                      "--mcp", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        st = settings.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 1234, 0o640)
        for created in (claude / "settings.local.json", work / ".mcp.json"):
            assert (created.stat().st_uid, created.stat().st_gid) == (1234, 1234), created

    def test_a_directory_where_the_settings_file_goes_is_named(self, tmp_path: Path, work: Path) -> None:
        """`.claude/settings.json` is a directory: one line naming the path, exit 2. Before: 'heartbeat: 3:
        Is a directory', exit 1."""
        (work / ".claude" / "settings.json").mkdir(parents=True)
        for action in ("install", "uninstall"):
            r = heartbeat("--state-dir", str(tmp_path / "st"), "hooks", action, "claude", "--dir", str(work),
                          cwd=tmp_path)
            assert r.returncode == 2, r.stderr
            assert r.stderr == (f"heartbeat: {work}/.claude/settings.json: a directory, not a settings file; "
                                "left untouched\n")


def settings_of(path: Path) -> Any:
    return json.loads(path.read_text())


def test_a_config_that_is_not_there_is_not_baked_in(tmp_path: Path, work: Path) -> None:
    """$HEARTBEAT_CONFIG naming no file: install refuses in one line (exit 2) and writes nothing, rather than
    baking in a config every hook would then fail to read."""
    r = heartbeat("hooks", "install", "claude", "--dir", str(work), cwd=tmp_path,
                  env={"HEARTBEAT_CONFIG": str(tmp_path / "nope.toml")})
    assert r.returncode == 2 and "$HEARTBEAT_CONFIG names" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (work / ".claude").exists()
