"""``type = "exec"``: the agent runs as a direct child of the daemon, in its own session.

The daemon starts the shim (:mod:`heartbeat.launchers.shim`) with
``start_new_session=True``; the shim runs the agent in its process group and records the
exit status in the exit file. So the agent survives the daemon (a restart, a crash, a
SIGKILL), a stop reaches the agent and all its children through the group, and the
exit status is known even for an agent a restarted daemon re-adopted and never waited for.

``Owner.pid`` is the shim's pid, which is also the process group id.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import IO, Any

from heartbeat.config.shape import LauncherConfig
from heartbeat.launchers import shim
from heartbeat.launchers.base import (
    ExitStatus,
    LaunchError,
    LaunchRequest,
    build_argv,
    build_env,
    prepare_log,
    read_exit_file,
    resolve_cwd,
)
from heartbeat.launchers.liveness import group_leftovers, identify, is_alive, stop_process_group, this_host
from heartbeat.model.baton import Owner
from heartbeat.model.timeparse import utcnow

__all__ = ["ExecLauncher", "shim_command"]

_KEEP_FINISHED = 1024
"""Exit statuses of reaped children kept in memory (the exit file is the lasting record)."""


def shim_command(config: LauncherConfig, exit_file: str, argv: list[str],
                 env: Mapping[str, str] | None = None, *, lease_file: str = "", lease_ttl: float = 0.0) -> list[str]:
    """The argv that starts the shim around ``argv``.

    The shim runs as a script (``-I``: isolated from the agent's ``PYTHON*`` variables
    and user site), not as ``-m heartbeat.launchers.shim``: it then imports nothing from
    heartbeat, stays small for the agent's whole life, and works whatever the agent's
    environment says. With ``env`` (the agent's environment) given, a variable Python's
    start-up adds to it (``LC_CTYPE``, when it coerces a C locale) is taken out again, so
    the agent gets exactly the environment the launcher config says. With ``lease_file`` the
    shim stops the agent when its host's lease runs out (a store shared by many hosts); ``lease_ttl``
    bounds the deadlines the shim accepts from that file.
    """
    if not sys.executable:
        raise LaunchError("cannot find the Python interpreter to run the shim (sys.executable is empty)")
    grace = f"{max(0.0, config.stop_grace):g}"
    unset = ["--unset", "LC_CTYPE"] if env is not None and "LC_CTYPE" not in env else []
    lease = ["--lease", lease_file] if lease_file else []
    if lease_file and lease_ttl > 0:
        lease += ["--ttl", f"{lease_ttl:g}"]
    return [sys.executable, "-I", "-S", shim_path(), "--grace", grace, *unset, *lease, exit_file, "--", *argv]


def shim_path() -> str:
    """The shim's file, as this process imported it; :class:`LaunchError` saying "restart the daemon"
    when it is gone (heartbeat was reinstalled or moved under the running daemon: every agent
    would otherwise die at once with python's "can't open file")."""
    path = os.path.abspath(shim.__file__)
    gone = next((p for p in (path, sys.executable) if not os.path.isfile(p)), "")
    if gone:
        raise LaunchError(f"heartbeat's own files moved under this running daemon ({gone} is gone: heartbeat was "
                          "reinstalled or moved): restart the daemon (systemctl restart heartbeat) so it runs from "
                          "where heartbeat is now")
    return path


def _stdin_for(config: LauncherConfig, req: LaunchRequest) -> IO[bytes] | int:
    """The brief on stdin: an unlinked temp file, so no thread and no pipe can block the daemon."""
    if config.brief != "stdin":
        return subprocess.DEVNULL
    handle = tempfile.TemporaryFile(dir=os.path.dirname(req.log_file))  # noqa: SIM115 (the caller closes it)
    try:
        handle.write(req.brief_text.encode("utf-8", "surrogateescape"))
        handle.flush()
        handle.seek(0)
    except OSError as exc:
        handle.close()
        raise LaunchError(f"cannot stage the brief for stdin: {exc.strerror}", task=req.task_id) from None
    return handle


class ExecLauncher:
    """Starts the agent as a child process of the daemon, in a new session (see the module doc).

    Safe to call from several threads (the daemon's tick and its watcher).
    """

    def __init__(self, config: LauncherConfig) -> None:
        self.name = config.name
        self.config = config
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._finished: dict[int, ExitStatus] = {}

    def launch(self, req: LaunchRequest) -> Owner:
        argv = build_argv(self.config, req)
        env = build_env(self.config, req)
        cwd = resolve_cwd(self.config, req)
        command = shim_command(self.config, req.exit_file, argv, env, lease_file=req.lease_file,
                                lease_ttl=req.lease_ttl)
        log_fd = prepare_log(req)
        stdin: IO[bytes] | int = subprocess.DEVNULL
        try:
            stdin = _stdin_for(self.config, req)
            proc = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=log_fd,
                stderr=log_fd,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {command[0]}: {exc.strerror}", task=req.task_id) from None
        finally:
            os.close(log_fd)
            if not isinstance(stdin, int):
                stdin.close()
        with self._lock:
            self._children[proc.pid] = proc
            self._finished.pop(proc.pid, None)
        found = identify(proc.pid)
        return Owner(
            pid=proc.pid,
            create_time=found[1] if found else _create_time(proc.pid),
            host=this_host(),
            launcher=self.name,
            session=req.session,
            how="dispatch",
            started_at=utcnow(),
        )

    def alive(self, owner: Owner) -> bool:
        self.reap()
        if is_alive(owner):
            return True
        # The shim may have been killed on its own (kill -9 of one pid, the OOM killer): the
        # agent it ran lives on, orphaned, in its group and still holds the task.
        if owner.pid is None or (owner.host and owner.host != this_host()):
            return False
        return bool(group_leftovers(owner.pid, owner.create_time))

    def exit_status(self, owner: Owner, exit_file: str) -> ExitStatus | None:
        recorded = read_exit_file(exit_file)
        if recorded is not None:
            return recorded
        if owner.pid is None:
            return None
        self.reap()
        with self._lock:
            if owner.pid in self._children:
                return None  # still running
            finished = self._finished.get(owner.pid)
        if finished is not None:
            # The shim wrote its record before exiting; a file may have appeared since we looked.
            return read_exit_file(exit_file) or finished
        return None

    def stop(self, owner: Owner, *, grace: float) -> bool:
        if owner.pid is None:
            return True
        if owner.host and owner.host != this_host():
            return False  # another machine's process: not ours to signal
        gone = stop_process_group(owner.pid, owner.create_time, grace, on_poll=self.reap)
        self.reap()
        return gone

    def kill(self, owner: Owner) -> bool:
        """SIGKILL the agent's group at once (:func:`~heartbeat.launchers.base.kill_now`)."""
        if owner.pid is None:
            return True
        if owner.host and owner.host != this_host():
            return False
        gone = stop_process_group(owner.pid, owner.create_time, 0.0, on_poll=self.reap, term=False)
        self.reap()
        return gone

    def reap(self) -> None:
        with self._lock:
            for pid, proc in list(self._children.items()):
                code = proc.poll()
                if code is None:
                    continue
                del self._children[pid]
                # The shim's own status: its code mirrors the agent's; a negative code means the
                # shim was killed (a SIGKILL to the group), so the agent died by that signal too.
                self._finished[pid] = ExitStatus(
                    code=code if code >= 0 else None, signal=-code if code < 0 else None, ended_at=utcnow()
                )
            while len(self._finished) > _KEEP_FINISHED:
                del self._finished[next(iter(self._finished))]


def _create_time(pid: int) -> float | None:
    """The create time even of a child that already exited (a zombie still has one)."""
    import psutil

    try:
        value: Any = psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None
    return float(value)
