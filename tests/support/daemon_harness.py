"""A real ``heartbeat run`` in a subprocess, with tiny intervals, for the daemon tests and the soak.

The harness writes a config, starts the daemon, and offers independent views of the
world: batons read from disk, the daemon's JSON log lines, and the live agents found by
scanning the process table for ``HEARTBEAT_TASK`` in their environment (not the daemon's
own bookkeeping). :func:`in_process_config` is the config of a daemon run in the test's own
process instead (``Daemon(config, store=...)``, ticked by hand).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heartbeat.model.baton import Baton
from heartbeat.model.errors import HeartbeatError
from heartbeat.store.files import FileStore

if TYPE_CHECKING:
    from heartbeat.config.shape import Config

TOY = [sys.executable, "-m", "heartbeat.toyagent"]
NULL_AGENT = """[launchers.agent]
type = "null"
"""
"""The launcher table of :func:`in_process_config` unless told: ``agent``, a null launcher."""


def toml_list(items: list[str]) -> str:
    return json.dumps(items)


def in_process_config(root: Path, *, daemon: str = "", launchers: str = NULL_AGENT) -> tuple[Path, Config]:
    """The state dir ``root/state`` (made, 0700) and a config on it for an in-process daemon:
    ``default_launcher = "agent"``, the ``[daemon]`` lines ``daemon``, then the tables ``launchers``."""
    from heartbeat.config.load import parse_config

    state = root / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    config = parse_config(f"""
[daemon]
state_dir = {json.dumps(str(state))}
default_launcher = "agent"
{daemon}
{launchers}""", path=str(root / "heartbeat.toml"))
    return state, config


def zombie(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie, or gone): the state letter of ``/proc/PID/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return True
    return raw[raw.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _parse_line(raw: bytes) -> dict[str, Any]:
    line = raw.decode(errors="replace")
    try:
        return json.loads(line)
    except ValueError:
        return {"event": "non-json", "line": line}


class DaemonHarness:
    """One state dir, one config, and a daemon process that can be killed and restarted."""

    def __init__(self, root: Path, *, tick: str = "200ms", stall_after: str = "3s", progress_after: str = "1h",
                 max_attempts: int = 5, max_idle_resumes: int = 3, backoff_initial: str = "200ms",
                 backoff_max: str = "1s", max_concurrent: int = 50, dispatches_per_minute: int = 600,
                 agent: list[str] | None = None, extra: str = "", launcher_extra: str = "") -> None:
        self.root = root
        self.state = root / "state"
        self.state.mkdir(mode=0o700, exist_ok=True)
        self.config = root / "heartbeat.toml"
        self.log_path = root / "daemon.log"
        self._log_offset = 0
        self._log_lines: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.settings = dict(tick=tick, stall_after=stall_after, progress_after=progress_after,
                             max_attempts=max_attempts, max_idle_resumes=max_idle_resumes,
                             backoff_initial=backoff_initial, backoff_max=backoff_max,
                             max_concurrent=max_concurrent, dispatches_per_minute=dispatches_per_minute)
        self.agent = agent or [*TOY, "--step-time", "0.3"]
        self.extra = extra
        self.launcher_extra = launcher_extra
        self.write_config()
        self.store = FileStore(str(self.state))

    def config_text(self) -> str:
        s = self.settings
        return f"""\
[daemon]
state_dir = {json.dumps(str(self.state))}
tick = "{s['tick']}"
stall_after = "{s['stall_after']}"
progress_after = "{s['progress_after']}"
max_attempts = {s['max_attempts']}
max_idle_resumes = {s['max_idle_resumes']}
backoff_initial = "{s['backoff_initial']}"
backoff_max = "{s['backoff_max']}"
max_concurrent = {s['max_concurrent']}
dispatches_per_minute = {s['dispatches_per_minute']}
default_launcher = "toy"
log_format = "json"
log_level = "debug"

[launchers.toy]
type = "exec"
command = {toml_list(self.agent)}
stop_grace = "500ms"
{self.launcher_extra}
{self.extra}
"""

    def write_config(self, text: str | None = None) -> None:
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(self.config_text() if text is None else text)
        os.chmod(tmp, 0o600)  # it may hold an [http] token: readable by others, it is refused
        os.replace(tmp, self.config)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        env.pop("NOTIFY_SOCKET", None)
        return env

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(self.config), "run"],
                                     stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=str(self.root))
        log.close()
        self.wait_log(lambda e: e.get("event") == "started" and e.get("pid") == self.proc.pid, "daemon start")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # --state-dir as well: writes must not depend on the config (a test may have broken it).
        return subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(self.config),
                               "--state-dir", str(self.state), *args],
                              capture_output=True, text=True, env={**self.env(), **(env or {})}, timeout=60)

    def cli_here(self, *args: str) -> tuple[int, str, str]:
        """:meth:`cli` in this process (tests/support/inprocess_cli.py): the same argv and environment,
        no interpreter start. For a test's setup (:meth:`new`); :meth:`cli` where the process is the point."""
        from tests.support.inprocess_cli import run

        return run(["--config", str(self.config), "--state-dir", str(self.state), *args],
                   env=self.env(), cwd=str(self.root))

    def new(self, task_id: str, *extra: str, plan: int = 0, step: str = "start") -> None:
        """``heartbeat new`` for a test's setup, in this process: a subprocess cost ~0.2 s of CPU
        apiece, several hundred times a run (docs/development.md, "Keeping the suite fast")."""
        plan_args = [a for i in range(plan) for a in ("--plan", f"step {i + 1}")]
        code, _, err = self.cli_here("new", task_id, "--task", f"task {task_id}", "--step", step, "--intent", "test",
                                     "--workdir", str(self.root), *plan_args, *extra)
        assert code == 0, err

    def baton(self, task_id: str) -> Baton:
        return self.store.load(task_id)

    def try_baton(self, task_id: str) -> Baton | None:
        try:
            return self.store.load(task_id)
        except HeartbeatError:
            return None

    def events(self, task_id: str, kind: str | None = None) -> list[Any]:
        return [e for e in self.store.ledger.events(task_id) if kind is None or e.kind == kind]

    def log(self) -> list[dict[str, Any]]:
        """Every line of the daemon's log so far, parsed (a line that is not JSON as ``non-json``).

        Read incrementally: the lines already parsed are kept and only the bytes appended since
        are read, so polling a long debug log every few milliseconds stays cheap (it used to be
        re-read and re-parsed whole on each poll, stealing CPU from the daemon under test). A
        last line still being written is parsed each time, never kept, until its newline comes.
        """
        try:
            with open(self.log_path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._log_offset:  # replaced or truncated: start over
                    self._log_offset, self._log_lines = 0, []
                handle.seek(self._log_offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        complete = chunk.rfind(b"\n") + 1
        self._log_lines.extend(_parse_line(line) for line in chunk[:complete].splitlines())
        self._log_offset += complete
        partial = chunk[complete:]
        return [*self._log_lines, _parse_line(partial)] if partial.strip() else list(self._log_lines)

    def wait_log(self, predicate: Callable[[dict[str, Any]], bool], message: str, timeout: float = 20) -> Any:
        return self.wait(lambda: next((e for e in self.log() if predicate(e)), None), message, timeout)

    def wait(self, predicate: Callable[[], Any], message: str, timeout: float = 20, interval: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                tail = "\n".join(json.dumps(e)[:300] for e in self.log()[-15:])
                raise AssertionError(f"timed out after {timeout}s waiting for {message}; daemon log tail:\n{tail}")
            time.sleep(interval)

    def live_agents(self, task_id: str | None = None) -> dict[str, set[int]]:
        """Process groups of live agents per task, from the process table (independent of the daemon).

        Each process's environment is read raw from ``/proc/PID/environ`` and searched for this
        state dir before anything is parsed: the tests poll this every 20 ms, and psutil's
        ``process_iter`` with a parsed ``environ()`` per process cost ~8 ms of CPU a call at 80
        processes (more under the suite's hundreds), half a core for a test that only waits."""
        groups: dict[str, set[int]] = {}
        state = b"\0HEARTBEAT_STATE_DIR=" + os.fsencode(str(self.state)) + b"\0"
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as handle:
                    raw = b"\0" + handle.read()
            except OSError:  # gone, or not ours to read
                continue
            if state not in raw + b"\0":
                continue
            env = dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if item)
            task = env.get(b"HEARTBEAT_TASK", b"").decode(errors="replace")
            if not task or (task_id is not None and task != task_id) or zombie(int(name)):
                continue
            try:
                groups.setdefault(task, set()).add(os.getpgid(int(name)))
            except (ProcessLookupError, PermissionError):
                continue
        return groups

    def kill_agents(self) -> None:
        for groups in self.live_agents().values():
            for pgid in groups:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def close(self) -> None:
        self.stop()
        self.kill_agents()
        self.store.close()
