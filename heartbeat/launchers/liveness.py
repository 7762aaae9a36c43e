"""Is an agent still alive? psutil, with the process's create time so a reused pid is not
mistaken for the agent, and zombies counted as dead; and is it still doing anything, read
from its own output (:func:`output_at`). And stopping one: its whole process group,
SIGTERM then SIGKILL, never a process that merely inherited its pid."""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from heartbeat.launchers.shim import group_members
from heartbeat.model import defaults
from heartbeat.model.baton import Owner

__all__ = ["identify", "is_alive", "note_boot_time", "output_at", "process_age", "same_start", "this_host", "group_members",
           "group_leftovers",
           "stop_process_group"]

_CREATE_TIME_SLACK = 0.05  # psutil's create_time is derived from jiffies: allow rounding
_OUTPUT_FUTURE_SKEW = defaults.PULSE_FUTURE_SKEW
"""Seconds an output log's mtime may lie ahead of the reader's clock before it is ignored as forged."""

_BOOT_TIMES: set[float] = set()
"""Every boot time this process has read (``/proc/stat``'s ``btime``, in wall-clock seconds). A
create time is the boot time plus the process's start in ticks since boot; a wall-clock step
moves the boot time, and every create time with it. A create time recorded before the step
(in a baton, a pid file) still names the same process when it matches under a boot time seen
before: a step must not make a live agent look gone, and get it a twin."""


def this_host() -> str:
    """This host's id: ``$HEARTBEAT_HOST`` when set (a daemon exports its ``daemon.host`` there,
    so its launchers and agents agree with it), else the hostname."""
    return os.environ.get("HEARTBEAT_HOST", "").strip() or socket.gethostname()


def output_at(log_path: str, now: float | None = None) -> datetime | None:
    """When the agent last printed anything: the mtime of its log (``logs/<id>/<epoch>.log``, which
    the launcher opened as the agent's stdout and stderr), or None when the log is empty, missing
    or not a regular file.

    The kernel updates the mtime at every write, so this is one ``lstat`` per look, whatever the
    agent prints: nothing is read or parsed (a FIFO or a link planted there is never opened).
    An empty log says nothing (the launcher creates it at dispatch), and an mtime more than a few
    seconds ahead of ``now`` is ignored: an agent cannot buy itself a future with ``touch -d``.
    """
    try:
        st = os.lstat(log_path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    if st.st_mtime > (time.time() if now is None else now) + _OUTPUT_FUTURE_SKEW:
        return None
    return datetime.fromtimestamp(st.st_mtime, UTC)


def identify(pid: int) -> tuple[int, float] | None:
    """``(pid, create_time)`` of a running process, or None when there is none."""
    if pid < 1:  # 0 and negatives name groups to kill(2), never one process
        return None
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid, proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
        return None


def same_start(found: float, recorded: float) -> bool:
    """Whether a create time read now (``found``) and one recorded earlier name the same start,
    across wall-clock steps (see ``_BOOT_TIMES``)."""
    if abs(found - recorded) <= _CREATE_TIME_SLACK:
        return True
    try:
        boot = boot_time()
    except (OSError, RuntimeError, ValueError):
        return False
    _BOOT_TIMES.add(boot)
    since_boot = found - boot
    return any(abs(since_boot + seen - recorded) <= _CREATE_TIME_SLACK for seen in _BOOT_TIMES if seen != boot)


def _read_proc(path: str, limit: int = 4096) -> bytes:
    """The start of a file of the kernel's (``/proc``): nothing anyone can plant, never a FIFO."""
    with open(path, "rb") as f:
        return f.read(limit)


def boot_time() -> float:
    """``psutil.boot_time()``: on Linux read here, from the same ``btime`` of ``/proc/stat`` psutil
    reads, so that the idle daemon, which notes it every pass, never imports psutil (about 2 MB)
    until an agent's liveness needs it; once psutil is loaded, psutil's own (its create times and
    this come from one ``/proc``). Raises OSError, RuntimeError or ValueError as psutil does."""
    # psutil's own once it is loaded; None while another thread imports it: the module is then in
    # sys.modules half made, without its functions (the daemon's main thread met it so, and died)
    loaded = getattr(sys.modules.get("psutil"), "boot_time", None)
    if loaded is not None:
        return float(loaded())
    limit = 1 << 16
    try:
        text = _read_proc("/proc/stat", limit)
    except OSError:
        text = b""
    lines = text.split(b"\n")
    if len(text) >= limit:
        lines.pop()  # cut short (a host with many CPUs): its last line may be a part of one
    for line in lines:
        if line.startswith(b"btime "):
            return float(line.split()[1])
    import psutil  # not Linux, or no /proc

    return float(psutil.boot_time())


_NOTED_ESTIMATE: list[float] = []
"""The boot time estimated from the clocks (wall less ``CLOCK_BOOTTIME``) when it was last read."""

def note_boot_time() -> None:
    """Remember the boot time now (the daemon at its start, and at every pass), so a step that
    comes later is recognised (see ``_BOOT_TIMES``). Read again only when the wall clock less the
    boot clock moved since the last read: the kernel writes all of ``/proc/stat`` for its
    ``btime`` (its interrupt counts too), which was a third of an idle daemon's pass."""
    boot_clock = getattr(time, "CLOCK_BOOTTIME", None)
    estimate = time.time() - time.clock_gettime(boot_clock) if boot_clock is not None else None
    if estimate is not None and _NOTED_ESTIMATE and abs(estimate - _NOTED_ESTIMATE[0]) < defaults.BOOT_TIME_MOVED:
        return
    try:
        _BOOT_TIMES.add(boot_time())
    except (OSError, RuntimeError, ValueError):
        return
    if estimate is not None:
        _NOTED_ESTIMATE[:] = [estimate]


def process_age(owner: Owner | None, *, host: str | None = None) -> float | None:
    """How long the owner's process has run, in seconds, from the kernel's own count on the boot
    clock (``/proc/PID/stat``'s start time against ``CLOCK_BOOTTIME``): no wall clock involved, so
    a step of it changes nothing. None when unknown (no pid, another host, no such process)."""
    if owner is None or owner.pid is None or (owner.host and owner.host != (host or this_host())):
        return None
    try:
        stat_line = _read_proc(f"/proc/{int(owner.pid)}/stat")
        ticks = int(stat_line[stat_line.rindex(b")") + 2:].split()[19])
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
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
    return same_start(found[1], owner.create_time)



def _matches(pid: int, create_time: float | None) -> bool:
    found = identify(pid)
    if found is None:
        return False
    return create_time is None or same_start(found[1], create_time)


def _orphans(pgid: int, create_time: float | None) -> list[int]:
    """Members of a group whose leader is gone, started no earlier than the leader was.

    While any member holds the group, the kernel does not hand its number out as a new
    pid, so these are the leader's own leftovers.
    """
    if create_time is None:
        return []
    import psutil

    found = []
    for pid in group_members(pgid):
        try:
            if psutil.Process(pid).create_time() >= create_time - _CREATE_TIME_SLACK:
                found.append(pid)
        except (psutil.Error, ValueError):
            continue
    return found


def group_leftovers(pgid: int, create_time: float | None) -> list[int]:
    """Pids still in the group of a leader (started at ``create_time``) that is gone.

    An agent whose shim was killed on its own lives on in the shim's group: it still holds
    its task, and a successor must not start until it is gone. Empty when the leader runs,
    or when its pid belongs to another process now (then its group is gone: the kernel
    does not reuse a pid that still names a process group).
    """
    if identify(pgid) is not None:
        return []
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []  # no process at all is left in the group: no need to read the process table
    except PermissionError:
        pass
    return _orphans(pgid, create_time)


def _signal(targets: Callable[[], list[int]], pgid: int | None, signum: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, signum)
            return
        except OSError:
            pass
    for pid in targets():
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _wait_gone(targets: Callable[[], list[int]], seconds: float, on_poll: Callable[[], object] | None) -> bool:
    deadline = time.monotonic() + seconds
    delay = 0.01
    while True:
        if on_poll is not None:
            on_poll()
        if not targets():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.1)


def stop_process_group(
    pid: int, create_time: float | None, grace: float, *, on_poll: Callable[[], object] | None = None,
    term: bool = True,
) -> bool:
    """Stop the process ``pid`` started at ``create_time`` and its process group; True when all are gone.

    SIGTERM, then up to ``grace`` seconds of polling, then SIGKILL and up to two seconds
    more to confirm (``term`` False: SIGKILL at once, no SIGTERM whose handler could act).
    If ``pid`` now belongs to another process (a reused pid) nothing is signalled and the
    owner counts as gone. A process that does not lead its own group
    (an agent that claimed a task from a shell) is signalled alone, never the group it
    shares with others. If the leader is gone but left processes in its group, those
    are stopped. ``on_poll`` runs on every poll (the exec launcher reaps its children there).
    A ``pid`` below 1 (a hand-edited baton) names no process: nothing is signalled.
    """
    if pid < 1:
        return True  # group 0 holds kernel threads and, in a container, pid 1: never ours
    if _matches(pid, create_time):
        try:
            leads = os.getpgid(pid) == pid
        except OSError:
            leads = False
        if leads:
            pgid: int | None = pid

            def targets() -> list[int]:
                return group_members(pid)
        else:
            pgid = None

            def targets() -> list[int]:
                return [pid] if _matches(pid, create_time) else []
    elif identify(pid) is None:
        pgid = None

        def targets() -> list[int]:
            return _orphans(pid, create_time)
    else:
        return True  # the pid is someone else's now: never signal it
    if not targets():
        return True
    if term:
        _signal(targets, pgid, signal.SIGTERM)
        if _wait_gone(targets, grace, on_poll):
            return True
    _signal(targets, pgid, signal.SIGKILL)
    return _wait_gone(targets, defaults.KILL_CONFIRM_WAIT, on_poll)
