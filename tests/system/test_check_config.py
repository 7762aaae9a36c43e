"""`check-config` fails the commonest mistakes, and `heartbeat doctor` checks what only the running
user can (issue 26, item 9): exit 2 naming the program or the extra and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env


def config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "heartbeat.toml"
    path.write_text(f'[daemon]\nstate_dir = {json.dumps(str(tmp_path / "state"))}\ndefault_launcher = "a"\n{body}')
    path.chmod(0o600)
    return path


def check(path: Path, *, block: str = "", command: str = "check-config", **env: str) -> subprocess.CompletedProcess[str]:
    """``heartbeat --config PATH check-config`` (``block``: a module made unimportable first)."""
    code = (f"import sys; sys.modules[{block!r}] = None; " if block else "") + \
        f"from heartbeat.cli.main import main; raise SystemExit(main(['--config', {str(path)!r}, {command!r}]))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=clean_env(**env), cwd=str(path.parent))


class TestCheckConfigFails:
    def test_a_program_not_on_path(self, tmp_path: Path) -> None:
        r = check(config(tmp_path, '[launchers.a]\ncommand = ["no-such-agent-xyz", "{id}"]\n'))
        assert r.returncode == 2, r
        assert f"heartbeat: {tmp_path / 'heartbeat.toml'}: launchers.a.command: 'no-such-agent-xyz' is not on PATH: " \
               "install it, give its absolute path" in r.stderr
        assert r.stdout == ""

    def test_a_program_path_that_does_not_exist(self, tmp_path: Path) -> None:
        r = check(config(tmp_path, f'[launchers.a]\ncommand = ["{tmp_path}/agent"]\n'))
        assert r.returncode == 2 and f"'{tmp_path}/agent': no such file" in r.stderr, r

    def test_a_preset_program_is_named_as_program(self, tmp_path: Path) -> None:
        r = check(config(tmp_path, '[launchers.a]\npreset = "claude-code"\nprogram = "/opt/nowhere/claude"\n'))
        assert r.returncode == 2 and "launchers.a.program: '/opt/nowhere/claude': no such file" in r.stderr, r

    def test_the_programs_path_from_the_launchers_env_is_searched(self, tmp_path: Path) -> None:
        (tmp_path / "bin").mkdir()
        agent = tmp_path / "bin" / "my-agent"
        agent.write_text("#!/bin/sh\n")
        agent.chmod(0o755)
        r = check(config(tmp_path, f'[launchers.a]\ncommand = ["my-agent"]\nenv = {{ PATH = "{tmp_path}/bin" }}\n'))
        assert r.returncode == 0, r.stderr

    def test_http_listen_without_a_token(self, tmp_path: Path) -> None:
        body = '[launchers.a]\ncommand = ["/bin/true"]\n[http]\nlisten = "127.0.0.1:8787"\n'
        r = check(config(tmp_path, body))
        assert r.returncode == 2 and "http.listen: '127.0.0.1:8787' is TCP and no token is set" in r.stderr, r
        assert "or listen on unix:web.sock" in r.stderr
        assert check(config(tmp_path, body), HEARTBEAT_WEB_TOKEN="t0k3n").returncode == 0
        assert check(config(tmp_path, body.replace("127.0.0.1:8787", "unix:web.sock"))).returncode == 0

    @pytest.mark.parametrize(("block", "body", "extra"), [
        ("starlette", '[http]\nlisten = "unix:web.sock"\n', "web"),
        ("psycopg", '[store]\nurl = "postgresql://heartbeat@/heartbeat"\n', "postgres"),
    ])
    def test_a_feature_whose_extra_is_missing(self, tmp_path: Path, block: str, body: str, extra: str) -> None:
        """[http] without the web extra, a PostgreSQL url without the postgres extra: the pip line that adds it."""
        r = check(config(tmp_path, '[launchers.a]\ncommand = ["/bin/true"]\n' + body), block=block)
        assert r.returncode == 2, r
        assert f"needs the {extra} extra ({block} not installed)" in r.stderr
        assert f"-m pip install -e '{Path(__file__).resolve().parents[2]}[{extra}]'" in r.stderr

    def test_a_config_without_mistakes_is_ok(self, tmp_path: Path) -> None:
        r = check(config(tmp_path, '[launchers.a]\ncommand = ["/bin/true"]\n'))
        assert r.returncode == 0 and r.stdout.startswith("ok: "), r


class TestDoctor:
    def test_a_missing_program_and_a_stopped_daemon_fail(self, tmp_path: Path) -> None:
        """The config's mistake, the state dir, a daemon whose pid is gone: one line each, exit 1."""
        path = config(tmp_path, '[launchers.a]\ncommand = ["no-such-agent-xyz"]\n')
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        dead = subprocess.Popen(["true"])
        dead.wait()
        (state / "daemon.json").write_text(json.dumps({"pid": dead.pid, "started_at": 1.0, "last_tick_at": 2.0}))
        r = check(path, command="doctor")
        assert r.returncode == 1, r
        lines = r.stdout.splitlines()
        assert lines[0].startswith("FAIL  config ") and "'no-such-agent-xyz' is not on PATH" in lines[0]
        assert f"ok    state dir {state}: user {os.geteuid()} can read and write it" in lines
        assert any(line.startswith(f"FAIL  daemon: not running (pid {dead.pid} stopped ") for line in lines), lines

    def test_a_fifo_planted_as_the_projects_claude_settings_does_not_hang_it(self, tmp_path: Path) -> None:
        """A workdir's ``.claude/settings.json`` that is a FIFO is passed over at once (it used to be
        opened with a blocking ``open()``, which waits for a writer for ever)."""
        path = config(tmp_path, '[launchers.a]\ncommand = ["/bin/true"]\n')
        (tmp_path / ".claude").mkdir()
        os.mkfifo(tmp_path / ".claude" / "settings.json")
        code = f"from heartbeat.cli.main import main; raise SystemExit(main(['--config', {str(path)!r}, 'doctor']))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                           env=clean_env(), cwd=str(tmp_path))
        assert r.returncode == 0, r
        assert "hooks:" in r.stdout, r.stdout

    def test_all_well(self, tmp_path: Path) -> None:
        r = check(config(tmp_path, '[launchers.a]\ncommand = ["/bin/true"]\n'), command="doctor")
        assert r.returncode == 0, r
        assert "can create it" in r.stdout and "daemon: none has run" in r.stdout
