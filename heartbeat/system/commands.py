"""Running the operator's commands (gate checks, escalation notifiers) safely.

Each command is an argv from the config with placeholders substituted per argument
(:func:`heartbeat.config.shape.expand_argv`), run without a shell, in its own process group,
with a timeout that kills the whole group: a check that never returns cannot freeze
the daemon's clock, and one that forks cannot leave children behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CommandResult", "run_command", "kill_running"]

_OUTPUT_LIMIT = 4096

_running: set[int] = set()
"""Process groups of the commands running now (for :func:`kill_running`)."""
_running_lock = threading.Lock()


@dataclass(frozen=True)
class CommandResult:
    """How a command ended. ``code`` is None when it timed out or could not start."""

    code: int | None
    output: str
    timed_out: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0


def run_command(
    argv: list[str],
    *,
    timeout: float,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run ``argv`` to completion or ``timeout``; never raises for the command's own failures."""
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd or None,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return CommandResult(None, "", error=f"cannot run {argv[0]!r}: {exc.strerror}")
    with _running_lock:
        _running.add(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, _ = proc.communicate()
        return CommandResult(None, _tail(out), timed_out=True, error=f"timed out after {timeout:g}s")
    finally:
        with _running_lock:
            _running.discard(proc.pid)
    return CommandResult(proc.returncode, _tail(out))


def kill_running() -> int:
    """Kill the process group of every command still running (a daemon exiting without waiting
    for them); returns how many there were."""
    with _running_lock:
        groups = list(_running)
    for pgid in groups:
        _kill_group(pgid)
    return len(groups)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(data: bytes | None) -> str:
    if not data:
        return ""
    return data[-_OUTPUT_LIMIT:].decode("utf-8", "replace")
