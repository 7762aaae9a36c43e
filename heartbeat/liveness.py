"""Is an agent still alive? psutil, with the process's create time so a reused pid is not
mistaken for the agent, and zombies counted as dead."""

from __future__ import annotations

import os
import socket

from heartbeat.baton import Owner

__all__ = ["identify", "is_alive", "this_host"]

_CREATE_TIME_SLACK = 0.05  # psutil's create_time is derived from jiffies: allow rounding


def this_host() -> str:
    return socket.gethostname()


def identify(pid: int) -> tuple[int, float] | None:
    """``(pid, create_time)`` of a running process, or None when there is none."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid, proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
        return None


def is_alive(owner: Owner | None, *, host: str | None = None) -> bool:
    """True when the owner's process still runs: same pid, same create time, not a zombie.

    An owner on another host cannot be checked from here and counts as alive: the
    daemon that launched it (or its lease, in a shared store) decides.
    """
    if owner is None or owner.pid is None:
        return False
    if owner.host and owner.host != (host or this_host()):
        return True
    found = identify(owner.pid)
    if found is None:
        return False
    if owner.create_time is None:
        return True
    return abs(found[1] - owner.create_time) <= _CREATE_TIME_SLACK


def parent_pid() -> int:
    return os.getppid()
