"""The config: the example documents every key, and every mistake is `file:line: key: what`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from config_reference import undocumented
from conftest import ROOT, Result, clean_env

from heartbeat.config.load import find_config, load_config, parse_config, resolve_state_dir
from heartbeat.config.shape import (
    DaemonConfig,
    expand_argv,
)
from heartbeat.model import defaults
from heartbeat.model.errors import ConfigError

Hb = Callable[..., Result]


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


EXAMPLE = ROOT / "config" / "heartbeat.example.toml"


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """The example config, copied 0644 (a checkout under umask 002 would make it group-writable)."""
    path = tmp_path / "heartbeat.toml"
    shutil.copyfile(EXAMPLE, path)
    path.chmod(0o644)
    return path


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def _keys_with_comments(text: str) -> tuple[set[str], set[str]]:
    """(every key assigned in the file, the keys that have a comment right above or beside them)."""
    keys: set[str] = set()
    commented: set[str] = set()
    previous = ""
    for line in text.splitlines():
        stripped = line.strip()
        match = re.match(r"([A-Za-z0-9_-]+)\s*=", stripped)
        if match:
            keys.add(match.group(1))
            if previous.startswith("#") or "#" in stripped.split("=", 1)[1]:
                commented.add(match.group(1))
        previous = stripped
    return keys, commented


class TestExample:
    def test_load_config_accepts_it(self, example: Path) -> None:
        """The example config loads, with its launchers, notifier and check."""
        config = load_config(str(example))
        assert set(config.launchers) == {"agent", "sandboxed", "claude", "dry"}
        assert config.launchers["sandboxed"].options["slice"] == "agents.slice"
        assert config.launchers["agent"].inherit_env == ("PATH", "HOME", "LANG")
        assert set(config.notify) == {"ops"} and set(config.checks) == {"ci-green"}

    def test_every_launcher_in_it_can_be_built(self, example: Path) -> None:
        """Each example launcher passes its type's own option checks (systemd-run properties, null options)."""
        from heartbeat.launchers import make_launcher

        for launcher in load_config(str(example)).launchers.values():
            make_launcher(launcher, path=str(example))

    def test_check_config_accepts_it(self, hb: Hb, example: Path) -> None:
        """`check-config` on the example names the example agents that are not installed (exit 2), and
        accepts it once they are on PATH (its sandboxed launcher's absolute path aside)."""
        r = hb("--config", str(example), "check-config")
        assert r.code == 2, r.err
        assert "launchers.agent.command: 'my-agent' is not on PATH" in r.err
        assert "launchers.claude.program: 'claude' is not on PATH" in r.err
        bin_dir = example.parent / "bin"
        bin_dir.mkdir()
        for name in ("my-agent", "claude"):
            (bin_dir / name).write_text("#!/bin/sh\n")
            (bin_dir / name).chmod(0o755)
        r = hb("--config", str(example), "check-config", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
        assert r.err.splitlines() == [f"heartbeat: {example}: launchers.sandboxed.command: '/usr/local/bin/my-agent': "
                                      "no such file: install it there, or fix the path (every dispatch of this "
                                      "launcher would fail to launch)"], r.err

    def test_every_field_appears_in_it(self) -> None:
        """Every DaemonConfig, LauncherConfig (and per-type option) and command field is a key of the
        example, so the example cannot drift from the code."""
        missing = undocumented(EXAMPLE)
        assert not missing, f"config/heartbeat.example.toml does not document: {', '.join(missing)}"

    def test_every_key_has_a_comment(self) -> None:
        """Each key of the example is explained by a comment at least once."""
        keys, commented = _keys_with_comments(EXAMPLE.read_text())
        assert keys - commented == set()

    def test_daemon_values_are_the_defaults(self, example: Path) -> None:
        """The example's [daemon] shows the defaults, so it doubles as their reference."""
        assert load_config(str(example)).daemon == DaemonConfig()


class TestErrors:
    @pytest.mark.parametrize(("text", "expected"), [
        ('[daemon]\ntick = "30s"\ntik = "3s"\n', "{path}:3: daemon.tik: unknown key (known: backoff_initial,"),
        ('[daemon]\n\ntick = "3 parsecs"\n', "{path}:3: daemon.tick: bad duration '3 parsecs': use e.g. 250ms"),
        ('[daemon]\ntick = "0s"\n', "{path}:2: daemon.tick: must be more than zero"),
        ('[daemon]\nmax_attempts = 0\n', "{path}:2: daemon.max_attempts: must be at least 1"),
        ('[daemon]\nmax_attempts = "5"\n', "{path}:2: daemon.max_attempts: expected an integer"),
        ('[daemon]\nlog_format = "xml"\n', "{path}:2: daemon.log_format: must be one of auto, json, console"),
        ('[daemon]\nbackoff_initial = "1h"\nbackoff_max = "1m"\n', "{path}:3: daemon.backoff_max: must not be less"),
        ('[daemon]\nmax_cost_usd = -1\n', "{path}:2: daemon.max_cost_usd: must not be negative (0: no budget)"),
        ('[daemon]\nmax_cost_usd = "5$"\n', "{path}:2: daemon.max_cost_usd: expected an amount in USD"),
        ('[daemon]\nmax_cost_usd = nan\n', "{path}:2: daemon.max_cost_usd: expected an amount in USD"),
        ('[daemon]\nmax_limit_wait = "0s"\n', "{path}:2: daemon.max_limit_wait: must be more than zero"),
        ('[daemon]\ntick = \n', "{path}:2: not valid TOML"),
        ('[daemon]\n[daemon]\n', "{path}:2: not valid TOML"),
        ('colour = "red"\n',
         "{path}:1: colour: unknown key (known: checks, daemon, guards, handoff, hooks, http, launchers, notify, "
         "retention, store)"),
        ('[launchers.agent]\ntype = "exec"\n', "{path}:1: launchers.agent.command: missing (required)"),
        ('[launchers.agent]\ncommand = ["{id}", "x"]\n', "{path}:2: launchers.agent.command: the program"),
        ('[launchers.agent]\ncommand = ["a", "{secret}"]\n', "{path}:2: launchers.agent.command: unknown placeholder"),
        ('[launchers.agent]\ncommand = "my-agent --x"\n', "{path}:2: launchers.agent.command: expected a non-empty list"),
        ('[launchers.agent]\ncommand = ["a"]\nbrief = "mail"\n', "{path}:3: launchers.agent.brief: must be one of"),
        ('[launchers.agent]\ncommand = ["a"]\nenv = { A = 1 }\n', "{path}:3: launchers.agent.env: expected a table"),
        ('[launchers.agent]\ncommand = ["a"]\ninherit_env = "yes"\n', "{path}:3: launchers.agent.inherit_env:"),
        ('[launchers.agent]\ncommand = ["a"]\nnon_retryable_exit_codes = [0]\n', "{path}:3: launchers.agent."
                                                                              "non_retryable_exit_codes: expected"),
        ('[launchers.agent]\ncommand = ["a"]\nmax_runtime = "forever"\n', "{path}:3: launchers.agent.max_runtime:"),
        ('[launchers.agent]\ncommand = ["a"]\nslice = "x.slice"\n', "{path}:3: launchers.agent.slice: unknown key"),
        ('[launchers.Agent]\ncommand = ["a"]\n', "{path}:1: launchers.Agent: bad launcher name"),
        ('[daemon]\ndefault_launcher = "b"\n[launchers.a]\ncommand = ["a"]\n',
         "{path}:2: daemon.default_launcher: names launcher 'b', which is not configured (configured: a)"),
        ('[notify.ops]\ncommand = ["a"]\nretries = 3\n', "{path}:3: notify.ops.retries: unknown key"),
        ('[checks.ci]\ncommand = ["a", "{reason}"]\n', "{path}:2: checks.ci.command: unknown placeholder {{reason}}"),
        ('[checks.ci]\ncommand = ["a"]\ntimeout = -1\n', "{path}:3: checks.ci.timeout: duration out of range"),
    ])
    def test_mistakes_name_file_line_and_key(self, tmp_path: Path, text: str, expected: str) -> None:
        """Each mistake is one ConfigError line: `file:line: key: what` (exit 2)."""
        path = _write(tmp_path / "heartbeat.toml", text)
        with pytest.raises(ConfigError) as info:
            load_config(str(path))
        message = str(info.value)
        assert message.startswith(expected.format(path=path)), message
        assert "\n" not in message and info.value.exit_code == 2

    @pytest.mark.parametrize(("text", "fragment"), [
        ('[daemon]\ntik = "3s"\n', ":2: daemon.tik: unknown key"),
        ('[daemon]\ntick = "soon"\n', ":2: daemon.tick: bad duration 'soon'"),
        ('[daemon\n', ":1: not valid TOML"),
    ])
    def test_check_config_exits_2_with_the_line(self, hb: Hb, tmp_path: Path, text: str, fragment: str) -> None:
        """`check-config` prints the error as one line `heartbeat: file:line: ...` and exits 2."""
        path = _write(tmp_path / "bad.toml", text)
        r = hb("--config", str(path), "check-config")
        assert r.code == 2
        assert r.err.startswith(f"heartbeat: {path}{fragment}") and r.err.count("\n") == 1, r.err

    @pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
    def test_config_writable_by_others_is_refused(self, hb: Hb, tmp_path: Path, mode: int) -> None:
        """A config group or others can write to is refused (it picks the programs run), with the chmod fix."""
        path = _write(tmp_path / "heartbeat.toml", "[daemon]\n", mode)
        r = hb("--config", str(path), "check-config")
        assert r.code == 2
        assert f"is writable by others (mode {mode:04o})" in r.err and f"chmod go-w {path}" in r.err

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
    def test_a_token_others_can_read_is_refused(self, hb: Hb, tmp_path: Path, mode: int) -> None:
        """An [http] token in a config group or others can read (0644, the default umask's) is no secret:
        another local user reads it and then every baton through the status page (issue 17 item 1 by
        another door). Refused with the chmod fix; 0600, or the same file without a token, loads."""
        text = '[http]\nlisten = "127.0.0.1:8787"\ntoken = "s3cret-token"\n'
        path = _write(tmp_path / "heartbeat.toml", text, mode)
        r = hb("--config", str(path), "check-config")
        assert r.code == 2 and r.err.count("\n") == 1, r.err
        assert f"holds [http] token and is readable by others (mode {mode:04o})" in r.err
        assert f"chmod go-r {path}" in r.err and "s3cret" not in r.err
        assert hb("--config", str(_write(path, text, 0o600)), "check-config").code == 0
        assert hb("--config", str(_write(path, text.replace("s3cret-token", ""), mode)), "check-config",
                  env={"HEARTBEAT_WEB_TOKEN": "from-the-unit"}).code == 0

    def test_missing_and_special_files(self, hb: Hb, tmp_path: Path) -> None:
        """A config that is missing, a directory or a FIFO is a one-line exit 2, never a hang."""
        r = hb("--config", str(tmp_path / "nope.toml"), "check-config")
        assert r.code == 2 and "nope.toml: no such file" in r.err
        fifo = tmp_path / "fifo.toml"
        os.mkfifo(fifo)
        r = hb("--config", str(fifo), "check-config", timeout=20)
        assert r.code == 2 and "is not a regular file" in r.err

    def test_no_config_anywhere(self, tmp_path: Path) -> None:
        """With no config and no state dir, a command says where it looked and what to do."""
        if Path("/etc/heartbeat/heartbeat.toml").exists():
            pytest.skip("this machine has /etc/heartbeat/heartbeat.toml")
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "status"], env=clean_env(), cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        assert "no config found" in proc.stderr and "heartbeat init" in proc.stderr


class TestLookup:
    def test_search_order(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """--config, then $HEARTBEAT_CONFIG, then ./heartbeat.toml."""
        monkeypatch.chdir(tmp_path)
        assert find_config("/explicit.toml", env={"HEARTBEAT_CONFIG": "/env.toml"}) == "/explicit.toml"
        assert find_config(None, env={"HEARTBEAT_CONFIG": "/env.toml"}) == "/env.toml"
        _write(tmp_path / "heartbeat.toml", "")
        assert find_config(None, env={}) == str(tmp_path / "heartbeat.toml")

    def test_state_dir_resolution(self, tmp_path: Path) -> None:
        """--state-dir wins; then --config's state_dir; then $HEARTBEAT_STATE_DIR; a relative state_dir is
        relative to its config file."""
        (tmp_path / "conf").mkdir()
        config = _write(tmp_path / "conf" / "hb.toml", '[daemon]\nstate_dir = "state"\n')
        env = {"HEARTBEAT_STATE_DIR": str(tmp_path / "from-env"), "HEARTBEAT_CONFIG": str(config)}
        assert resolve_state_dir(str(tmp_path / "flag"), str(config), env=env) == str(tmp_path / "flag")
        assert resolve_state_dir(None, str(config), env=env) == str(tmp_path / "conf" / "state")
        assert resolve_state_dir(None, None, env=env) == str(tmp_path / "from-env")
        assert resolve_state_dir(None, None, env={"HEARTBEAT_CONFIG": str(config)}) == str(tmp_path / "conf" / "state")

    def test_defaults_without_sections(self) -> None:
        """An empty config is valid and means every default."""
        config = parse_config("", path="/etc/heartbeat/heartbeat.toml")
        assert config.daemon == DaemonConfig() and config.daemon.tick == defaults.TICK
        assert config.launchers == {} and config.notify == {} and config.checks == {}


class TestExpandArgv:
    def test_placeholders_stay_inside_their_argument(self) -> None:
        """A value with spaces, quotes or shell syntax stays one argument, verbatim."""
        argv = expand_argv(["agent", "--task", "{id}", "--note={reason}"], {"id": "a b; rm -rf /", "reason": "$(x)"})
        assert argv == ["agent", "--task", "a b; rm -rf /", "--note=$(x)"]

    def test_literal_braces_and_unknown_names(self) -> None:
        """`{{`/`}}` are literal braces; a name with no value expands to nothing."""
        assert expand_argv(["x", "{{id}}", "{{{id}}}", "{missing}"], {"id": 7}) == ["x", "{id}", "{7}", ""]


class TestPolicyKnobs:
    def test_every_policy_knob_is_set_from_the_config_by_its_name(self, tmp_path: Path) -> None:
        """A ``[daemon]`` knob of the policy is one entry (``heartbeat.model.knobs``): the config's field
        and the policy's of the same name; the loop copies them all, the launcher's and the constants aside."""
        from dataclasses import fields

        from heartbeat.daemon import Daemon
        from heartbeat.model import policy as pol
        from heartbeat.model.knobs import KNOBS

        assert {f.name for f in fields(pol.Policy)} == {*(k.name for k in KNOBS), "max_runtime",
                                                        "non_retryable_exit_codes", "launch_timeout"}
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        config = parse_config(f"""
[daemon]
state_dir = {json.dumps(str(state))}
default_launcher = "agent"
stall_after = "7m"
progress_after = "3h"
max_attempts = 9
max_idle_resumes = 4
backoff_initial = "11s"
backoff_max = "13m"
on_spinning = "report"
inactive_grace = "17s"
max_limit_wait = "5h"
max_cost_usd = 2.5
[launchers.agent]
type = "null"
max_runtime = "2h"
non_retryable_exit_codes = [3]
""", path=str(tmp_path / "heartbeat.toml"))
        d = Daemon(config, dry_run=True)
        try:
            policy = d.loop._make_policy("agent")
        finally:
            d.store.close()
        assert policy == pol.Policy(stall_after=420, progress_after=10800, max_attempts=9, max_idle_resumes=4,
                                    backoff_initial=11, backoff_max=780, on_spinning="report", inactive_grace=17,
                                    max_limit_wait=18000, max_cost_usd=2.5, max_runtime=7200,
                                    non_retryable_exit_codes=frozenset({3}))
