"""Launchers: real toy agents, real process groups and signals, and a fake systemd.

The contract classes run against every launcher type: ``exec`` for real, ``systemd-run``
against a fake ``systemd-run``/``systemctl`` pair put first on PATH (there is no systemd
PID 1 here: the fake records its argv and starts the command in the background the way a
transient service would), and ``null`` where the contract applies to a pretend agent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import wait_for

from heartbeat.config.load import parse_config
from heartbeat.config.shape import LauncherConfig
from heartbeat.launchers import BUILTIN, make_launcher, resolve
from heartbeat.launchers.base import (
    ExitStatus,
    Launcher,
    LaunchError,
    LaunchRequest,
    build_argv,
    build_env,
    kill_now,
    read_exit_file,
)
from heartbeat.launchers.exec import ExecLauncher
from heartbeat.launchers.liveness import identify, is_alive, stop_process_group
from heartbeat.launchers.null import FAKE_PID_BASE, NullLauncher
from heartbeat.launchers.shim import group_members
from heartbeat.launchers.systemd_run import SystemdRunLauncher
from heartbeat.model.baton import Owner
from heartbeat.model.errors import ConfigError
from heartbeat.system.systemd import PLUMBING_ENV

HOSTILE = "; rm -rf / $(touch pwned) `touch pwned2` $HOME ${PATH} %n\nsecond line 'q' \"dq\" \\"
"""A baton value that would do damage if it ever reached a shell or systemd's expansion."""

SHIM_PATH = str(Path(__file__).resolve().parents[2] / "heartbeat" / "launchers" / "shim.py")

# The toy agent: reports what it got, then behaves as TOY_MODE says.
AGENT = textwrap.dedent('''
    import json, os, signal, subprocess, sys, time
    mode, _, arg = os.environ.get("TOY_MODE", "exit:0").partition(":")
    data = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
            "pid": os.getpid(), "pgid": os.getpgid(0)}
    how = os.environ.get("TOY_BRIEF", "")
    if how == "stdin":
        data["brief"] = sys.stdin.read()
    elif how == "file":
        data["brief"] = open(os.environ["HEARTBEAT_BRIEF"]).read()
    elif how == "arg":
        data["brief"] = sys.argv[-1]
    print("toy agent says hello", flush=True)
    print("toy agent complains", file=sys.stderr, flush=True)
    sleeper = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(1)"
    if mode == "noteterm":  # a SIGTERM handler that acts: it leaves a file beside the report
        def noted(signum, frame):
            open(os.environ["TOY_REPORT"] + ".term", "w").close()
            os._exit(0)
        signal.signal(signal.SIGTERM, noted)
    if mode in ("stubborn", "spawn"):
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        data["child"] = subprocess.Popen([sys.executable, "-c", sleeper]).pid
    report = os.environ["TOY_REPORT"]
    tmp = f"{report}.{os.getpid()}.tmp"  # agents launched together share the report: one temp file each
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, report)
    if mode == "exit":
        sys.exit(int(arg))
    if mode == "signal":
        os.kill(os.getpid(), int(arg))
    if mode == "wait":
        while not os.path.exists(os.environ["TOY_RELEASE"]):
            time.sleep(0.01)
        sys.exit(int(arg))
    if mode == "spawn":
        sys.exit(0)
    while True:
        time.sleep(1)
''')

FAKE_SYSTEMD_RUN = textwrap.dedent('''
    import json, os, re, subprocess, sys
    state = os.environ["FAKE_SYSTEMD_DIR"]
    args = sys.argv[1:]
    with open(os.path.join(state, "calls.jsonl"), "a") as f:
        f.write(json.dumps({"prog": "systemd-run", "argv": args, "env": dict(os.environ)}) + "\\n")
    props, setenv, unit, cmd, i = {}, [], None, None, 0
    while i < len(args):
        a = args[i]
        if a == "--":
            cmd = args[i + 1:]
            break
        if a == "-p":
            key, _, value = args[i + 1].partition("=")
            props[key] = value
            i += 2
            continue
        if a.startswith("--unit="):
            unit = a[len("--unit="):]
        elif a.startswith("--setenv="):
            setenv.append(a[len("--setenv="):])
        elif a not in ("--collect", "--quiet", "--user") and not a.startswith(("--slice=", "--description=")):
            sys.exit(f"fake systemd-run: unknown option {a}")
        i += 1
    record = os.path.join(state, unit + ".json")
    if os.path.exists(record):
        sys.exit(f"Failed to start transient service unit: Unit {unit}.service already exists.")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    for item in setenv:
        name, eq, value = item.partition("=")
        env[name] = value if eq else os.environ[name]
    def expand(arg):  # what systemd does to a service's command line: $$ -> $, $VAR/${VAR} -> value
        return re.sub(r"\\$\\$|\\$\\{(\\w+)\\}|\\$(\\w+)",
                      lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1) or m.group(2), ""), arg)
    def stream(spec, mode):
        kind, _, path = spec.partition(":")
        return open(path, mode) if path else subprocess.DEVNULL
    proc = subprocess.Popen([expand(a) for a in cmd], cwd=props["WorkingDirectory"], env=env,
                            stdin=stream(props.get("StandardInput", ""), "rb"),
                            stdout=stream(props.get("StandardOutput", ""), "ab"),
                            stderr=stream(props.get("StandardError", ""), "ab"), start_new_session=True)
    with open(record, "w") as f:
        json.dump({"pid": proc.pid, "props": props}, f)
''')

FAKE_SYSTEMCTL = textwrap.dedent('''
    import json, os, signal, sys, time
    from heartbeat.launchers.shim import group_members
    state = os.environ["FAKE_SYSTEMD_DIR"]
    args = sys.argv[1:]
    with open(os.path.join(state, "calls.jsonl"), "a") as f:
        f.write(json.dumps({"prog": "systemctl", "argv": args}) + "\\n")
    if args[0] == "--user":
        args = args[1:]
    verb, unit = args[0], args[-1]
    try:
        with open(os.path.join(state, unit + ".json")) as f:
            info = json.load(f)
    except FileNotFoundError:
        info = None
    def running():
        return bool(info) and bool(group_members(info["pid"]))
    if verb == "is-active":
        print("active" if running() else "inactive")
        sys.exit(0 if running() else 3)
    if verb == "show":
        print(info["pid"] if running() else 0)
        sys.exit(0)
    if verb == "stop":
        if info is None:
            sys.exit(f"Failed to stop {unit}.service: Unit {unit}.service not loaded.")
        pgid = info["pid"]
        timeout = float(info["props"]["TimeoutStopSec"].removesuffix("ms")) / 1000
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)
        while group_members(pgid):
            time.sleep(0.01)
        sys.exit(0)
    if verb == "kill" and "--signal=SIGKILL" in args:
        if info is not None:
            os.killpg(info["pid"], signal.SIGKILL)
        sys.exit(0)
    sys.exit(f"fake systemctl: unknown verb {verb}")
''')


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie, or no process at all)."""
    return identify(pid) is None


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class FakeSystemd:
    """A fake ``systemd-run``/``systemctl`` pair on PATH; ``calls()`` are their recorded invocations."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.state = root / "units"
        self.bin.mkdir(parents=True)
        self.state.mkdir()
        for name, body in (("systemd-run", FAKE_SYSTEMD_RUN), ("systemctl", FAKE_SYSTEMCTL)):
            path = self.bin / name
            path.write_text(f"#!{sys.executable}\n{body}")
            path.chmod(0o755)

    def calls(self, prog: str | None = None) -> list[dict[str, Any]]:
        path = self.state / "calls.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [r for r in rows if prog is None or r["prog"] == prog]


@pytest.fixture
def fake_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSystemd:
    fake = FakeSystemd(tmp_path / "fake-systemd")
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_SYSTEMD_DIR", str(fake.state))
    return fake


@dataclass
class Kit:
    """One launcher under test, the toy agent's files, and a way to let waiting agents finish."""

    kind: str
    launcher: Launcher
    root: Path
    owners: list[Owner] = field(default_factory=list)
    clock: list[float] = field(default_factory=lambda: [0.0])

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    def request(self, *, task: str = "t1", epoch: int = 1, workdir: str | None = None, session: str = "",
                brief: str = "# Brief\nintent: test\n") -> LaunchRequest:
        logs = self.state / "logs" / task
        return LaunchRequest(
            task_id=task, epoch=epoch, attempt=2, workdir=str(self.root / "work") if workdir is None else workdir,
            brief_text=brief, brief_file=str(logs / f"{epoch}.brief.md"), log_file=str(logs / f"{epoch}.log"),
            exit_file=str(logs / f"{epoch}.exit"), state_dir=str(self.state), config_path=str(self.root / "hb.toml"),
            session=session,
        )

    def launch(self, req: LaunchRequest | None = None) -> tuple[Owner, LaunchRequest]:
        req = req or self.request()
        owner = self.launcher.launch(req)
        self.owners.append(owner)
        return owner, req

    def release(self) -> None:
        """Let agents in ``wait`` mode exit (for null: move its clock past the runtime)."""
        (self.root / "release").touch()
        self.clock[0] += 1000.0

    def agent_report(self) -> dict[str, Any]:
        wait_for(self.report.exists, message="the toy agent's report")
        data: dict[str, Any] = read_json(self.report)
        return data


def make_config(kind: str, kit_root: Path, *, mode: str = "wait:0", extra_env: dict[str, str] | None = None,
                command: tuple[str, ...] | None = None, **overrides: Any) -> LauncherConfig:
    env = {"TOY_MODE": mode, "TOY_REPORT": str(kit_root / "report.json"), "TOY_RELEASE": str(kit_root / "release")}
    env.update(extra_env or {})
    if command is None:
        script = kit_root / "agent.py"
        script.write_text(AGENT)  # a file: the code's braces would read as placeholders in an argument
        command = (sys.executable, str(script), "--task={id}", "{session}", "{brief_file}", "epoch={epoch}",
                   "attempt={attempt}", "{state_dir}", "{workdir}", "{{literal}}")
    values: dict[str, Any] = {"name": f"toy-{kind}", "type": kind, "command": command, "env": env,
                              "stop_grace": 0.5}
    if kind == "null":
        code = int(mode.partition(":")[2] or 0) if mode.startswith(("wait", "exit")) else 0
        values["options"] = {"exit_code": code, "runtime": "10s"}
    values.update(overrides)
    return LauncherConfig(**values)


@pytest.fixture
def make_kit(tmp_path: Path, request: pytest.FixtureRequest,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Kit]]:
    """Build a :class:`Kit` for a launcher kind; everything it launched is stopped afterwards.

    Depends on ``monkeypatch`` so the fake systemd stays on PATH until the kits are torn down.
    """
    kits: list[Kit] = []

    def build(kind: str, **config: Any) -> Kit:
        root = tmp_path / f"kit{len(kits)}"
        (root / "work").mkdir(parents=True)
        (root / "state").mkdir(mode=0o700)
        if kind == "systemd-run":
            request.getfixturevalue("fake_systemd")
        cfg = make_config(kind, root, **config)
        kit = Kit(kind, make_launcher(cfg), root)
        if isinstance(kit.launcher, NullLauncher):
            kit.launcher.clock = lambda: kit.clock[0]
        kits.append(kit)
        return kit

    yield build
    for kit in kits:
        for owner in kit.owners:
            kit.launcher.stop(owner, grace=0)
            if kit.kind != "null" and owner.pid is not None:  # whatever the launcher did, leave nothing behind
                stop_process_group(owner.pid, owner.create_time, 0)
        kit.launcher.reap()


ALL_KINDS = ["exec", "systemd-run", "null"]
REAL_KINDS = ["exec", "systemd-run"]


class TestContract:
    """What every launcher promises the daemon, including the null one."""

    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_launch_returns_owner(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """launch() returns an owner naming the launcher, the host, how it started and when."""
        kit = make_kit(kind)
        owner, _ = kit.launch()
        assert owner.pid is not None and owner.pid > 0
        assert owner.launcher == f"toy-{kind}"
        assert owner.how == "dispatch"
        assert owner.host
        assert isinstance(owner.started_at, datetime) and owner.started_at.tzinfo is not None
        if kind == "systemd-run":
            assert owner.unit == "heartbeat-t1-1"
        if kind == "null":
            assert owner.pid >= FAKE_PID_BASE
        else:
            assert owner.create_time is not None

    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_alive_until_exit_then_exit_code(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """alive() holds while the agent runs and exit_status() is None; after it exits, the code is known."""
        kit = make_kit(kind, mode="wait:3")
        owner, req = kit.launch()
        if kind != "null":
            kit.agent_report()
        assert kit.launcher.alive(owner)
        assert kit.launcher.exit_status(owner, req.exit_file) is None
        kit.release()
        wait_for(lambda: not kit.launcher.alive(owner), message="the agent to exit")
        status = wait_for(lambda: kit.launcher.exit_status(owner, req.exit_file), message="an exit status")
        assert isinstance(status, ExitStatus)
        assert (status.code, status.signal) == (3, None)
        assert status.ended_at is not None

    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_stop_ends_agent(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """stop() returns True and the agent is no longer alive."""
        kit = make_kit(kind, mode="wait:0")
        owner, _ = kit.launch()
        if kind != "null":
            kit.agent_report()
        assert kit.launcher.stop(owner, grace=2.0) is True
        assert not kit.launcher.alive(owner)

    @pytest.mark.parametrize("kind", ALL_KINDS)
    def test_reap_with_nothing_running(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """reap() is safe to call at any time, before or after launches."""
        kit = make_kit(kind, mode="exit:0")
        kit.launcher.reap()
        owner, _ = kit.launch()
        wait_for(lambda: not kit.launcher.alive(owner) or kind == "null", message="the agent to exit")
        kit.launcher.reap()


class TestRealAgent:
    """A real toy agent through exec and (fake) systemd-run: env, argv, brief, log, exit file, stop."""

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_env_has_heartbeat_vars_and_no_systemd_plumbing(
        self, make_kit: Callable[..., Kit], kind: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The agent gets HEARTBEAT_* and the config's env, and never NOTIFY_SOCKET/WATCHDOG_*/LISTEN_*."""
        for name in PLUMBING_ENV:
            monkeypatch.setenv(name, "daemon-only")
        monkeypatch.setenv("HEARTBEAT_EPOCH", "999")  # the daemon's own: must not leak
        monkeypatch.setenv("DAEMON_THING", "inherited")
        kit = make_kit(kind, mode="exit:0", extra_env={"MODEL": "large", "NOTIFY_SOCKET": "/config/too"})
        _, req = kit.launch()
        env = kit.agent_report()["env"]
        assert env["HEARTBEAT_TASK"] == "t1"
        assert env["HEARTBEAT_EPOCH"] == "1"
        assert env["HEARTBEAT_BRIEF"] == req.brief_file
        assert env["HEARTBEAT_CONFIG"] == req.config_path
        assert env["HEARTBEAT_STATE_DIR"] == req.state_dir
        assert env["MODEL"] == "large"
        assert env["DAEMON_THING"] == "inherited"
        assert not set(PLUMBING_ENV) & set(env)

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_env_allow_list(self, make_kit: Callable[..., Kit], kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """inherit_env = [names] passes only those names of the daemon's environment."""
        monkeypatch.setenv("KEEP_ME", "kept")
        monkeypatch.setenv("DROP_ME", "secret")
        kit = make_kit(kind, mode="exit:0", inherit_env=("KEEP_ME", "PATH", "NOT_SET_ANYWHERE"))
        kit.launch()
        env = kit.agent_report()["env"]
        assert env["KEEP_ME"] == "kept"
        assert "DROP_ME" not in env
        assert "NOT_SET_ANYWHERE" not in env
        assert env["HEARTBEAT_TASK"] == "t1"

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_hostile_value_stays_one_literal_argument(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """Placeholders are substituted per argument; a value with ; $() backticks $VAR and newlines runs nothing."""
        kit = make_kit(kind, mode="exit:0")
        _, req = kit.launch(kit.request(session=HOSTILE))
        report = kit.agent_report()
        assert report["argv"] == [
            "--task=t1", HOSTILE, req.brief_file, "epoch=1", "attempt=2", req.state_dir, req.workdir, "{literal}",
        ]
        assert report["cwd"] == req.workdir
        for where in (kit.root / "work", kit.root, Path.cwd()):
            assert not (where / "pwned").exists() and not (where / "pwned2").exists()

    def test_hostile_workdir_is_one_argument_and_the_cwd(self, make_kit: Callable[..., Kit]) -> None:
        """A working directory whose name is hostile is still one argument and a plain chdir (exec)."""
        kit = make_kit("exec", mode="exit:0")
        work = kit.root / HOSTILE.replace("/", "_")
        work.mkdir()
        kit.launch(kit.request(workdir=str(work)))
        report = kit.agent_report()
        assert report["cwd"] == str(work)
        assert report["argv"][6] == str(work)
        assert not (work / "pwned").exists()

    @pytest.mark.parametrize("kind", REAL_KINDS)
    @pytest.mark.parametrize("brief", ["file", "stdin", "arg"])
    def test_brief_delivered(self, make_kit: Callable[..., Kit], kind: str, brief: str) -> None:
        """The brief reaches the agent as HEARTBEAT_BRIEF's file, on stdin, or as the last argument."""
        text = "# Brief\n\nintent: keep `it` $safe; constraints: none\n" + HOSTILE
        kit = make_kit(kind, mode="exit:0", brief=brief, extra_env={"TOY_BRIEF": brief})
        req = kit.request(brief=text)
        if brief == "file":  # the daemon writes the brief file before it launches
            Path(req.brief_file).parent.mkdir(parents=True, exist_ok=True)
            Path(req.brief_file).write_text(text)
        kit.launch(req)
        report = kit.agent_report()
        assert report["brief"] == text
        argv_without_brief = report["argv"][:-1] if brief == "arg" else report["argv"]
        assert len(argv_without_brief) == 8

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_output_goes_to_private_log(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """stdout and stderr are appended to logs/<id>/<epoch>.log (0600, in a 0700 directory)."""
        kit = make_kit(kind, mode="exit:0")
        _, req = kit.launch()
        wait_for(lambda: read_exit_file(req.exit_file), message="the exit file")
        log = Path(req.log_file)
        assert "toy agent says hello" in log.read_text()
        assert "toy agent complains" in log.read_text()
        assert log.stat().st_mode & 0o777 == 0o600
        assert log.parent.stat().st_mode & 0o777 == 0o700
        assert (kit.state / "logs").stat().st_mode & 0o777 == 0o700

    @pytest.mark.parametrize("kind", REAL_KINDS)
    @pytest.mark.parametrize(("mode", "expected"), [
        ("exit:0", (0, None)),
        ("exit:3", (3, None)),
        (f"signal:{int(signal.SIGTERM)}", (None, int(signal.SIGTERM))),
        (f"signal:{int(signal.SIGKILL)}", (None, int(signal.SIGKILL))),
    ])
    def test_exit_recorded_in_exit_file(
        self, make_kit: Callable[..., Kit], kind: str, mode: str, expected: tuple[int | None, int | None]
    ) -> None:
        """The shim writes {code, signal, ended_at} to the exit file: 0, 3, or the signal that killed the agent."""
        kit = make_kit(kind, mode=mode)
        owner, req = kit.launch()
        status = wait_for(lambda: read_exit_file(req.exit_file), message="the exit file")
        assert isinstance(status, ExitStatus)
        assert (status.code, status.signal) == expected
        raw = json.loads(Path(req.exit_file).read_text())
        assert set(raw) == {"code", "signal", "ended_at"}
        wait_for(lambda: not kit.launcher.alive(owner), message="the shim to exit")
        assert kit.launcher.exit_status(owner, req.exit_file) == status

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_missing_program_records_127(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """A program that does not exist is exit 127 in the exit file, with one line in the log."""
        kit = make_kit(kind, command=("/nonexistent/agent-cli", "{id}"))
        _, req = kit.launch()
        status = wait_for(lambda: read_exit_file(req.exit_file), message="the exit file")
        assert isinstance(status, ExitStatus) and (status.code, status.signal) == (127, None)
        assert "cannot start '/nonexistent/agent-cli'" in Path(req.log_file).read_text()

    @pytest.mark.parametrize("kind", REAL_KINDS)
    @pytest.mark.parametrize("workdir", ["missing", "", "relative/dir", "file"])
    def test_bad_cwd_is_a_clear_error(self, make_kit: Callable[..., Kit], kind: str, workdir: str) -> None:
        """A working directory that is missing, unset, relative or a file is a LaunchError naming it; nothing starts."""
        kit = make_kit(kind)
        (kit.root / "file").touch()
        path = {"missing": str(kit.root / "missing"), "": "", "relative/dir": "relative/dir",
                "file": str(kit.root / "file")}[workdir]
        with pytest.raises(LaunchError) as caught:
            kit.launch(kit.request(workdir=path))
        message = str(caught.value)
        assert message.startswith("t1: workdir: ")
        assert "\n" not in message
        if path:
            assert path in message
        else:
            assert "no working directory" in message
        assert not kit.report.exists()

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_stop_escalates_to_sigkill_and_kills_the_group(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """An agent (and its child) that ignore SIGTERM are SIGKILLed after the grace; stop() returns True."""
        kit = make_kit(kind, mode="stubborn", stop_grace=0.5)
        owner, _ = kit.launch()
        report = kit.agent_report()
        child = report["child"]
        assert report["pgid"] == owner.pid  # the agent runs in the shim's group
        started = time.monotonic()
        assert kit.launcher.stop(owner, grace=0.5) is True
        elapsed = time.monotonic() - started
        assert elapsed >= 0.45
        assert gone(report["pid"]) and gone(child)
        assert not kit.launcher.alive(owner)

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_kill_now_sends_no_sigterm(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """``kill_now`` (an agent past its lease's kill deadline) SIGKILLs the group at once: the agent's
        SIGTERM handler never runs. Its ``stop`` lets the handler run (what makes the test able to fail)."""
        kit = make_kit(kind, mode="noteterm", stop_grace=5)
        owner, _ = kit.launch()
        noted = Path(str(kit.report) + ".term")
        kit.agent_report()
        assert kill_now(kit.launcher, owner) is True
        assert gone(kit.agent_report()["pid"]) and not kit.launcher.alive(owner)
        assert not noted.exists()
        second = make_kit(kind, mode="noteterm", stop_grace=5)
        owner, _ = second.launch(second.request(task="t2"))  # (a unit name of its own)
        second.agent_report()
        assert second.launcher.stop(owner, grace=5) is True
        assert Path(str(second.report) + ".term").exists()

    @pytest.mark.parametrize("kind", REAL_KINDS)
    def test_leftovers_stopped_when_agent_exits(self, make_kit: Callable[..., Kit], kind: str) -> None:
        """What the agent left running in its group is stopped when it exits; its exit code is still recorded."""
        kit = make_kit(kind, mode="spawn", stop_grace=0.3)
        _, req = kit.launch()
        child = kit.agent_report()["child"]
        status = wait_for(lambda: read_exit_file(req.exit_file), message="the exit file")
        assert isinstance(status, ExitStatus) and status.code == 0
        wait_for(lambda: gone(child), timeout=5, message="the leftover child to be stopped")


class TestExecProcesses:
    """exec-specific process handling: pid reuse, surviving the daemon, zombies, stdin."""

    def test_reused_pid_is_not_alive_and_never_signalled(self, make_kit: Callable[..., Kit]) -> None:
        """An owner whose pid now belongs to another process (different create_time) is dead and is not signalled."""
        kit = make_kit("exec")
        bystander = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                     stdin=subprocess.PIPE, start_new_session=True)
        try:
            found = wait_for(lambda: identify(bystander.pid), message="the bystander")
            assert isinstance(found, tuple)
            impostor = Owner(pid=bystander.pid, create_time=found[1] - 3600, launcher="toy-exec", how="dispatch")
            assert not kit.launcher.alive(impostor)
            assert kit.launcher.stop(impostor, grace=0.1) is True
            assert bystander.poll() is None
            assert is_alive(Owner(pid=bystander.pid, create_time=found[1]))
        finally:
            bystander.kill()
            bystander.wait()

    def test_agent_survives_the_death_of_its_launcher(self, make_kit: Callable[..., Kit], tmp_path: Path) -> None:
        """An agent launched by a process that is then SIGKILLed keeps running, and its exit is still recorded."""
        kit = make_kit("exec", mode="wait:5")
        cfg = kit.launcher.config
        req = kit.request()
        helper = textwrap.dedent('''
            import json, sys
            from heartbeat.config.load import LauncherConfig
            from heartbeat.launchers.base import LaunchRequest
            from heartbeat.launchers.exec import ExecLauncher
            cfg, req = json.loads(sys.argv[1]), json.loads(sys.argv[2])
            cfg["command"] = tuple(cfg["command"])
            owner = ExecLauncher(LauncherConfig(**cfg)).launch(LaunchRequest(**req))
            print(json.dumps({"pid": owner.pid, "create_time": owner.create_time}), flush=True)
            sys.stdin.read()
        ''')
        cfg_doc = {"name": cfg.name, "command": list(cfg.command), "env": dict(cfg.env), "stop_grace": cfg.stop_grace}
        daemon = subprocess.Popen([sys.executable, "-c", helper, json.dumps(cfg_doc), json.dumps(req.__dict__)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert daemon.stdout is not None
        got = json.loads(daemon.stdout.readline())
        owner = Owner(pid=got["pid"], create_time=got["create_time"], launcher=cfg.name, how="dispatch")
        kit.owners.append(owner)
        kit.agent_report()
        daemon.kill()
        daemon.wait()
        assert is_alive(owner)
        assert kit.launcher.alive(owner)  # a fresh launcher (a restarted daemon) sees it too
        assert kit.launcher.exit_status(owner, req.exit_file) is None
        kit.release()
        status = wait_for(lambda: kit.launcher.exit_status(owner, req.exit_file), message="the exit file")
        assert isinstance(status, ExitStatus) and (status.code, status.signal) == (5, None)
        wait_for(lambda: not kit.launcher.alive(owner), message="the re-adopted agent to be seen dead")

    def test_no_zombies_after_reap(self, make_kit: Callable[..., Kit]) -> None:
        """Children that exited are reaped: none is left a zombie, and their exit status is kept."""
        kit = make_kit("exec", mode="exit:4")
        launched = [kit.launch(kit.request(task=f"z{i}")) for i in range(3)]
        for _, req in launched:
            wait_for(lambda req=req: read_exit_file(req.exit_file), message="the exit files")
        shims = {owner.pid for owner, _ in launched}

        def exited() -> bool:
            kit.launcher.reap()
            return not any(p.pid in shims for p in psutil.Process().children())

        wait_for(exited, message="the shims to be reaped")
        for owner, req in launched:
            status = kit.launcher.exit_status(owner, req.exit_file)
            assert status is not None and status.code == 4

    def test_killed_shim_reports_the_signal(self, make_kit: Callable[..., Kit]) -> None:
        """When the whole group is SIGKILLed (no exit file), exit_status() still reports the signal for our child."""
        kit = make_kit("exec", mode="wait:0")
        owner, req = kit.launch()
        kit.agent_report()
        assert owner.pid is not None
        os.killpg(owner.pid, signal.SIGKILL)
        status = wait_for(lambda: kit.launcher.exit_status(owner, req.exit_file), message="an exit status")
        assert isinstance(status, ExitStatus) and (status.code, status.signal) == (None, int(signal.SIGKILL))
        assert not Path(req.exit_file).exists()

    def test_large_stdin_brief_does_not_block_launch(self, make_kit: Callable[..., Kit]) -> None:
        """A brief far larger than a pipe buffer, for an agent that never reads stdin, does not block launch()."""
        kit = make_kit("exec", mode="wait:0", brief="stdin")
        started = time.monotonic()
        kit.launch(kit.request(brief="x" * 4_000_000))
        assert time.monotonic() - started < 5
        kit.agent_report()

    def test_stop_of_a_non_leader_signals_only_that_process(self, tmp_path: Path) -> None:
        """An owner that does not lead its process group (a claimed agent) is stopped alone, not its group."""
        leader = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
             "'import sys; sys.stdin.read()'], stdin=subprocess.PIPE); print(p.pid, flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        try:
            assert leader.stdout is not None
            member = int(leader.stdout.readline())
            found = identify(member)
            assert found is not None
            assert stop_process_group(member, found[1], 1.0) is True
            assert gone(member)
            assert leader.poll() is None
        finally:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()

    def test_group_members_skips_zombies(self) -> None:
        """group_members() lists living processes of a group and not zombies."""
        proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
        wait_for(lambda: gone(proc.pid), message="the child to exit")
        assert group_members(proc.pid) == []
        proc.wait()


class TestSystemdRun:
    """systemd-run against a fake systemd-run/systemctl pair: the exact argv and how the env travels."""

    def test_exact_argv_and_env_passing(self, make_kit: Callable[..., Kit], fake_systemd: FakeSystemd,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """systemd-run gets the documented argv; env values travel in its environment, never on its argv."""
        monkeypatch.setenv("SECRET_TOKEN", "hunter2")
        monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
        kit = make_kit("systemd-run", mode="exit:0", inherit_env=("PATH", "SECRET_TOKEN"),
                       options={"user": True, "slice": "agents.slice", "properties": {"MemoryMax": "2G", "Nice": 5}})
        req = kit.request(session="cost $5 ${HOME}")
        owner, _ = kit.launch(req)
        kit.agent_report()
        call = fake_systemd.calls("systemd-run")[0]
        agent_env = build_env(kit.launcher.config, req)
        argv = build_argv(kit.launcher.config, req)
        assert call["argv"] == [
            "--user", "--unit=heartbeat-t1-1", "--collect", "--quiet", "--description=heartbeat t1 epoch 1",
            "--slice=agents.slice", "-p", "MemoryMax=2G", "-p", "Nice=5",
            "-p", "TimeoutStopSec=500ms", "-p", f"WorkingDirectory={req.workdir}",
            "-p", f"StandardOutput=append:{req.log_file}", "-p", f"StandardError=append:{req.log_file}",
            *[f"--setenv={name}" for name in sorted(agent_env)],
            "--", sys.executable, "-I", "-S", SHIM_PATH, "--grace", "0.5", req.exit_file, "--",
            *[arg.replace("$", "$$") for arg in argv],
        ]
        assert "hunter2" not in json.dumps(call["argv"])
        assert call["env"]["SECRET_TOKEN"] == "hunter2"
        assert "NOTIFY_SOCKET" not in call["env"]
        report = kit.agent_report()
        assert report["env"]["SECRET_TOKEN"] == "hunter2"
        assert report["argv"][1] == "cost $5 ${HOME}"  # systemd's $-expansion did not touch it
        assert owner.unit == "heartbeat-t1-1"

    def test_liveness_and_stop_go_through_systemctl(self, make_kit: Callable[..., Kit],
                                                    fake_systemd: FakeSystemd) -> None:
        """alive() asks `systemctl --user is-active UNIT` and stop() runs `systemctl --user stop UNIT`."""
        kit = make_kit("systemd-run", mode="wait:0", options={"user": True})
        owner, _ = kit.launch()
        kit.agent_report()
        assert kit.launcher.alive(owner)
        assert kit.launcher.stop(owner, grace=1.0)
        verbs = [c["argv"] for c in fake_systemd.calls("systemctl")]
        assert ["--user", "is-active", "heartbeat-t1-1"] in verbs
        assert ["--user", "stop", "heartbeat-t1-1"] in verbs

    def test_brief_on_stdin_is_a_unit_property(self, make_kit: Callable[..., Kit], fake_systemd: FakeSystemd) -> None:
        """brief = "stdin" writes the brief file (0600) and sets StandardInput=file:<brief_file>."""
        kit = make_kit("systemd-run", mode="exit:0", brief="stdin")
        _, req = kit.launch()
        argv = fake_systemd.calls("systemd-run")[0]["argv"]
        assert f"StandardInput=file:{req.brief_file}" in argv
        assert Path(req.brief_file).stat().st_mode & 0o777 == 0o600

    def test_failure_of_systemd_run_is_a_launch_error(self, make_kit: Callable[..., Kit],
                                                      fake_systemd: FakeSystemd) -> None:
        """systemd-run failing (a unit of that name exists) is a LaunchError carrying its message."""
        kit = make_kit("systemd-run", mode="exit:0")
        kit.launch()
        with pytest.raises(LaunchError, match="already exists"):
            kit.launch()

    def test_unit_gone_is_not_alive(self, make_kit: Callable[..., Kit], fake_systemd: FakeSystemd) -> None:
        """A unit that systemctl does not know is not alive, and stopping it is not an error."""
        kit = make_kit("systemd-run")
        ghost = Owner(pid=None, unit="heartbeat-ghost-1", launcher="toy-systemd-run", how="dispatch")
        assert not kit.launcher.alive(ghost)
        assert kit.launcher.stop(ghost, grace=0.1) is True

    @pytest.mark.parametrize(("options", "message"), [
        ({"properties": {"Bad Key": "x"}}, "bad property name"),
        ({"properties": "MemoryMax=1G"}, "expected a table"),
        ({"user": "yes"}, "expected true or false"),
        ({"slice": "not a slice"}, "slice unit name"),
        ({"nice": 3}, "unknown option"),
    ])
    def test_bad_options_are_config_errors(self, options: dict[str, Any], message: str) -> None:
        """Bad systemd-run options fail when the launcher is made, naming the key."""
        cfg = LauncherConfig(name="sd", type="systemd-run", command=("agent",), options=options)
        with pytest.raises(ConfigError, match=message):
            make_launcher(cfg)


class TestNullLauncher:
    """The null launcher records and pretends; it never starts or signals anything."""

    def test_records_launches_and_pretends(self, tmp_path: Path) -> None:
        """Launches are recorded; the pretend agent runs for `runtime` on the injected clock, then exits with `exit_code`."""
        now = [100.0]
        cfg = LauncherConfig(name="dry", type="null", options={"exit_code": 7, "runtime": "30s"})
        launcher = NullLauncher(cfg, clock=lambda: now[0])
        req = LaunchRequest("t1", 1, 1, str(tmp_path), "brief", "b", "l", str(tmp_path / "x.exit"), str(tmp_path), "")
        owner = launcher.launch(req)
        assert launcher.launches == [req]
        assert owner.pid is not None and owner.pid >= FAKE_PID_BASE and not psutil.pid_exists(owner.pid)
        now[0] += 29
        assert launcher.alive(owner) and launcher.exit_status(owner, req.exit_file) is None
        now[0] += 1
        assert not launcher.alive(owner)
        status = launcher.exit_status(owner, req.exit_file)
        assert status is not None and (status.code, status.signal) == (7, None)
        assert not (tmp_path / "x.exit").exists()

    def test_runs_forever_by_default_and_stop_is_recorded(self, tmp_path: Path) -> None:
        """Without `runtime` the pretend agent runs until stopped; a stop is recorded and reads as SIGTERM."""
        launcher = make_launcher(LauncherConfig(name="dry", type="null"))
        assert isinstance(launcher, NullLauncher)
        req = LaunchRequest("t1", 1, 1, str(tmp_path), "brief", "b", "l", "e", str(tmp_path), "")
        owner = launcher.launch(req)
        assert launcher.alive(owner)
        assert launcher.stop(owner, grace=5) is True
        assert launcher.stops == [owner]
        status = launcher.exit_status(owner, "e")
        assert status is not None and status.signal == signal.SIGTERM

    def test_unknown_owner_is_checked_for_real_and_not_signalled(self) -> None:
        """An owner it did not launch is alive if its process is, and stop() never signals it."""
        launcher = make_launcher(LauncherConfig(name="dry", type="null"))
        me = identify(os.getpid())
        assert me is not None
        owner = Owner(pid=os.getpid(), create_time=me[1])
        assert launcher.alive(owner)
        assert launcher.stop(owner, grace=0) is True  # we are still here to assert it
        assert not launcher.alive(Owner(pid=os.getpid(), create_time=me[1] - 100))

    @pytest.mark.parametrize("options", [{"exit_code": 300}, {"exit_code": "0"}, {"runtime": "soon"}, {"x": 1}])
    def test_bad_options_are_config_errors(self, options: dict[str, Any]) -> None:
        """Bad null options fail when the launcher is made."""
        with pytest.raises(ConfigError):
            make_launcher(LauncherConfig(name="dry", type="null", options=options))


class TestArgvAndEnv:
    """build_argv and build_env: the pure parts every launcher shares."""

    def req(self, **kw: Any) -> LaunchRequest:
        values: dict[str, Any] = dict(task_id="t1", epoch=4, attempt=2, workdir="/w", brief_text="BRIEF",
                                      brief_file="/s/logs/t1/4.brief.md", log_file="/s/logs/t1/4.log",
                                      exit_file="/s/logs/t1/4.exit", state_dir="/s", config_path="/c.toml",
                                      session="")
        values.update(kw)
        return LaunchRequest(**values)

    def test_placeholders_per_argument(self) -> None:
        """Each placeholder is replaced inside its own argument; {{ and }} are literal braces."""
        cfg = LauncherConfig(name="a", command=("agent", "--id={id}", "{brief_file}", "{workdir}/x", "{epoch}.{attempt}",
                                                "{state_dir}", "--resume={session}", "{{id}}"))
        assert build_argv(cfg, self.req(session=HOSTILE)) == [
            "agent", "--id=t1", "/s/logs/t1/4.brief.md", "/w/x", "4.2", "/s", f"--resume={HOSTILE}", "{id}",
        ]

    @pytest.mark.parametrize(("brief", "last"), [("arg", "BRIEF"), ("file", "{x}"), ("stdin", "{x}")])
    def test_brief_arg_mode_appends_text(self, brief: str, last: str) -> None:
        """Only brief = "arg" appends the brief's text as the last argument."""
        cfg = LauncherConfig(name="a", command=("agent", "{{x}}"), brief=brief)
        assert build_argv(cfg, self.req())[-1] == last

    def test_nul_and_oversized_arguments_are_refused(self) -> None:
        """An argument with a NUL byte, or one over 128 KiB, is a LaunchError, not an exec failure."""
        cfg = LauncherConfig(name="a", command=("agent", "{session}"))
        with pytest.raises(LaunchError, match="NUL"):
            build_argv(cfg, self.req(session="a\0b"))
        arg_cfg = LauncherConfig(name="a", command=("agent",), brief="arg")
        with pytest.raises(LaunchError, match="128 KiB"):
            build_argv(arg_cfg, self.req(brief_text="x" * 200_000))

    def test_env_modes(self) -> None:
        """inherit_env true copies, a list filters, false drops the daemon's env; config env and HEARTBEAT_* follow."""
        base = {"PATH": "/bin", "HOME": "/root", "HEARTBEAT_TASK": "daemon", "HEARTBEAT_OTHER": "x",
                **{name: "1" for name in PLUMBING_ENV}}
        ours = {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "4", "HEARTBEAT_BRIEF": "/s/logs/t1/4.brief.md",
                "HEARTBEAT_CONFIG": "/c.toml", "HEARTBEAT_STATE_DIR": "/s"}
        every = build_env(LauncherConfig(name="a", env={"MODEL": "m"}), self.req(), base)
        assert every == {"PATH": "/bin", "HOME": "/root", "MODEL": "m", **ours}
        listed = build_env(LauncherConfig(name="a", inherit_env=("PATH", "NOTIFY_SOCKET")), self.req(), base)
        assert listed == {"PATH": "/bin", **ours}
        none = build_env(LauncherConfig(name="a", inherit_env=False, env={"WATCHDOG_USEC": "5"}), self.req(), base)
        assert none == ours

    def test_starter_style_config_makes_launchers(self) -> None:
        """Launchers parsed from a real config file are made by type name, options included."""
        config = parse_config(textwrap.dedent('''
            [daemon]
            default_launcher = "a"
            [launchers.a]
            command = ["agent", "{id}"]
            [launchers.sd]
            type = "systemd-run"
            command = ["agent"]
            user = true
            properties = { MemoryMax = "1G" }
            [launchers.dry]
            type = "null"
            runtime = "5s"
        '''))
        made = {name: make_launcher(cfg) for name, cfg in config.launchers.items()}
        assert isinstance(made["a"], ExecLauncher)
        assert isinstance(made["sd"], SystemdRunLauncher) and made["sd"].user
        assert made["sd"].properties == ["MemoryMax=1G"]
        assert isinstance(made["dry"], NullLauncher) and made["dry"].runtime == 5.0


class TestRegistry:
    """resolve() finds built-ins, entry points and dotted paths, and refuses what is not a launcher."""

    def test_builtins(self) -> None:
        """Every built-in type name resolves to a class with the protocol's methods."""
        assert set(BUILTIN) == {"exec", "systemd-run", "null"}
        assert resolve("exec") is ExecLauncher
        assert resolve("systemd-run") is SystemdRunLauncher
        assert resolve("null") is NullLauncher

    def test_dotted_path(self) -> None:
        """"package.module:Class" resolves to that class."""
        assert resolve("heartbeat.launchers.null:NullLauncher") is NullLauncher

    def test_entry_point(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A distribution's entry point in the group heartbeat.launchers is found by its name."""
        dist = tmp_path / "toy_launchers-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-launchers\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text("[heartbeat.launchers]\ntoy = heartbeat.launchers.null:NullLauncher\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        assert resolve("toy") is NullLauncher
        launcher = make_launcher(LauncherConfig(name="x", type="toy"))
        assert isinstance(launcher, NullLauncher) and launcher.name == "x"

    @pytest.mark.parametrize(("type_name", "message"), [
        ("nope", "unknown launcher type 'nope'"),
        ("heartbeat.model.errors:HeartbeatError", "missing launch, alive, exit_status, stop, reap"),
        ("heartbeat.no_such_module:X", "cannot import"),
        ("heartbeat.launchers.null:Nothing", "has no Nothing"),
        ("heartbeat.launchers.null:FAKE_PID_BASE", "is not a class"),
    ])
    def test_bad_types_are_config_errors(self, type_name: str, message: str) -> None:
        """A type that names nothing, or names something that is not a launcher, is a ConfigError saying so."""
        with pytest.raises(ConfigError, match=message) as caught:
            make_launcher(LauncherConfig(name="x", type=type_name), path="/etc/hb.toml")
        assert str(caught.value).startswith("/etc/hb.toml: launchers.x.type: ")
