"""The process a launcher actually starts: it runs the agent and records how it ended.

Usage: ``python heartbeat/launchers/shim.py [--grace SECONDS] [--unset NAME]... [--lease LEASE_FILE
[--ttl SECONDS]] EXIT_FILE -- ARGV...``
(``python -m heartbeat.launchers.shim ...`` works too). ``--unset`` removes a variable
from the agent's environment that the shim's own start-up put there: Python coerces a C
locale by setting ``LC_CTYPE``, which the launcher's environment did not have.

The shim is started as the leader of a new session and process group. It runs the agent
as its child in that same group, so a signal sent to the group (a stop) reaches the
agent, while the shim itself swallows SIGTERM/SIGINT/SIGHUP and stays to record the
outcome. On Linux the shim is also a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``):
a descendant orphaned by its parent, even one that left the group with ``setsid``, is
re-parented to the shim instead of to init, and reaped by it. When the agent ends,
whatever it left behind, in the group or among the shim's descendants, is stopped too
(SIGTERM, ``--grace`` seconds, SIGKILL) and reaped: an agent's helpers do not outlive
its shift, as under systemd. Then ``{"code": N|null, "signal": S|null, "ended_at": ISO}`` (with
``"stopped": "lease"`` when the lease watch below stopped the agent) is written
atomically to EXIT_FILE, and the shim exits with the agent's code (128+S for a signal).
This is how the daemon learns an agent's exit status even when it was restarted in the
meantime and the agent is no longer its child.

With ``--lease`` (a daemon on a store shared by many hosts) the shim also watches its host's
lease on the task: the daemon writes ``LEASE_FILE`` (``{"term_at": T, "kill_at": K}``, seconds
on :func:`lease_clock`) before the launch and after each renewal that renewed this epoch's
lease. When ``term_at`` passes without a newer file the shim stops the agent (SIGTERM to the
group, then SIGKILL to what is left at ``kill_at``), whatever became of its daemon (killed,
paused, cut off from the database): the lease's ``kill_at`` lies before the lease can expire
in the database, so no other host's replacement ever runs beside this agent. The file is
read, never trusted to extend a stop under way: an unreadable or missing file gives no new
deadline, so the last one seen holds (none seen: the agent is stopped at once, ``--grace`` between
SIGTERM and SIGKILL). ``--ttl`` (the lease's ttl) bounds what a file may say: no deadline lies more
than the ttl after the file was first seen. A shim that wakes past ``kill_at`` (its host was paused:
SIGSTOP, a frozen container or VM) SIGKILLs the agent at once, before anything else and with no
SIGTERM whose handler could still act: another host may run the task already. What it cannot stop
is an agent the thaw lets run before its shim gets the CPU, for those moments: its writes are
refused by its lapsed epoch (the fence), not by this watch.

An agent that cannot be started is recorded as code 127 (no such program) or 126 (not
executable) with its reason in the record's ``launch_error`` (the daemon counts it a failed
launch, not a failed run of the agent), and one line on stderr, which the launcher points at
the task's log.

The shim lives as long as the agent, so it imports only a few standard modules and
nothing from heartbeat: it can run as a plain script, unaffected by the agent's
``PYTHONPATH``.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
import threading
import time

__all__ = ["main", "group_members", "descendants", "become_subreaper", "write_exit_file", "STOP_GRACE",
           "LEASE_POLL", "lease_clock", "read_lease"]

STOP_GRACE = 10.0  # defaults.STOP_GRACE: the shim imports nothing from heartbeat (tests pin them equal)
"""Seconds the agent's leftovers get between SIGTERM and SIGKILL after the agent ended."""

LEASE_POLL = 0.2
"""Seconds between two reads of the lease file (the shim imports nothing from heartbeat, so this
default lives here, not in defaults.py)."""

LEASE_PAUSED = 1.0
"""Seconds a lease watch may oversleep its poll before the shim calls it a pause (SIGSTOP, a frozen
container or VM) in the line it writes."""

LAUNCH_ERROR_MAX = 512
"""Bytes of the reason an agent could not be started that the exit record keeps."""

LEASE_MAX_BYTES = 4096
"""A lease file is a few dozen bytes; more is not one the daemon wrote."""

PR_SET_CHILD_SUBREAPER = 36
"""``prctl`` option (linux/prctl.h): orphaned descendants are re-parented to this process."""

_SWALLOWED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_USAGE = "usage: shim.py [--grace SECONDS] [--unset NAME]... [--lease LEASE_FILE [--ttl SECONDS]] EXIT_FILE -- ARGV..."


def _proc_table() -> list[tuple[int, int, int]] | None:
    """``(pid, ppid, pgrp)`` of every living (not zombie) process, from ``/proc``; None without it."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ")".
        fields = raw[raw.rfind(b")") + 2:].split()
        if len(fields) < 3 or fields[0] in (b"Z", b"X", b"x"):
            continue
        table.append((int(name), int(fields[1]), int(fields[2])))
    return table


def group_members(pgid: int, *, exclude: int | None = None) -> list[int]:
    """Pids of the living (not zombie) processes in process group ``pgid``.

    Reads ``/proc/<pid>/stat`` directly: a stop must see every member, and this runs in
    the shim, which must not import psutil. Without ``/proc`` (not Linux) it can only
    say whether the group has any member at all, and answers ``[pgid]`` for yes.
    """
    table = _proc_table()
    if table is None:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return []
        return [pgid]
    return [pid for pid, _, group in table if group == pgid and pid != exclude]


def descendants(pid: int) -> list[int]:
    """Pids of the living descendants of ``pid`` (children, their children, ...), from ``/proc``."""
    return _descendants_in(_proc_table() or [], pid)


def _descendants_in(table: list[tuple[int, int, int]], pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent, _ in table:
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if child not in found:
            found.append(child)
            todo.extend(children.get(child, []))
    return found


def become_subreaper() -> bool:
    """Make orphaned descendants ours (Linux ``PR_SET_CHILD_SUBREAPER``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError, ImportError):
        return False


_DIR_FDS: dict[str, int] = {}
"""The log directory, opened once at start: records are written relative to it, so swapping
``logs/<id>`` for a link while the agent runs cannot send them anywhere else."""


def hold_dir(directory: str) -> int:
    """Open ``directory`` (no symlink as its last part) once and keep it for this shim's records."""
    directory = directory or "."
    if directory not in _DIR_FDS:
        _DIR_FDS[directory] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return _DIR_FDS[directory]


def _write_record(path: str, record: dict[str, object]) -> None:
    """Write one JSON line atomically: temp file, fsync, rename, directory fsync, all relative to
    the log directory this shim opened at start."""
    dir_fd = hold_dir(os.path.dirname(path))
    name = os.path.basename(path)
    tmp = f"{name}.{os.getpid()}.tmp"
    try:  # never write into something planted at the temp name (a FIFO would block us for ever)
        os.unlink(tmp, dir_fd=dir_fd)
    except OSError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            data = (json.dumps(record) + "\n").encode()
            if os.write(fd, data) != len(data):
                raise OSError(28, "short write (the disk is full)")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:  # a full disk must not leave a 0-byte temp file beside the logs
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    try:
        os.fsync(dir_fd)
    except OSError:
        pass


def write_exit_file(path: str, code: int | None, sig: int | None, ended_at: float, *, stopped: str = "",
                    launch_error: str = "") -> None:
    """Write the exit record atomically; ``stopped`` says why the shim stopped the agent ("lease":
    its host's lease lapsed), so the daemon does not take the end for the agent's own;
    ``launch_error``: the agent never ran, and why."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ended_at)) + f".{int(ended_at % 1 * 1e6):06d}Z"
    record: dict[str, object] = {"code": code, "signal": sig, "ended_at": stamp}
    if stopped:
        record["stopped"] = stopped
    if launch_error:
        record["launch_error"] = launch_error
    _write_record(path, record)


def pid_file_for(exit_file: str) -> str:
    """``<epoch>.pid`` beside ``<epoch>.exit``: who this dispatch's agent is."""
    base = exit_file[: -len(".exit")] if exit_file.endswith(".exit") else exit_file
    return f"{base}.pid"


def _own_create_time() -> float | None:
    """Our start time as psutil computes it (boot time + start ticks), without importing psutil."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            raw = handle.read()
        start_ticks = int(raw[raw.rfind(b")") + 2:].split()[19])
        with open("/proc/stat", "rb") as handle:
            btime = next(int(line.split()[1]) for line in handle if line.startswith(b"btime"))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _write_pid_file(exit_file: str) -> None:
    """Record who we are before the agent starts, so a daemon that died mid-dispatch (before it
    could write our pid into the baton) can adopt us on restart instead of launching a twin."""
    path = pid_file_for(exit_file)
    try:
        _write_record(path, {"pid": os.getpid(), "create_time": _own_create_time()})
    except OSError as exc:
        _say(f"heartbeat shim: cannot write {path}: {exc.strerror}\n")


def _swallow(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: handled signals reset to default in the child at exec."""


def _spawn(argv: list[str]) -> tuple[int, str]:
    """Fork and exec the agent in our process group; return its pid, and why it could not be
    started (``""`` when it was). The child reports an ``execvp`` failure over a close-on-exec
    pipe, so the read below ends at the exec (EOF) or with the reason: the record can say the
    agent never ran, which no exit code can (an agent may exit 127 itself)."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid:
        os.close(wfd)
        return pid, _read_launch_error(rfd)
    try:
        os.close(rfd)
        # Python ignores SIGPIPE and SIGXFSZ for itself; the agent gets the defaults.
        for signum in (*_SWALLOWED, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except OSError as exc:
        code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        reason = f"cannot start {argv[0]!r}: {exc.strerror}"
        try:
            os.write(2, f"heartbeat shim: {reason}\n".encode(errors="replace"))
            os.write(wfd, reason.encode(errors="replace")[:LAUNCH_ERROR_MAX])
        finally:
            os._exit(code)
    except BaseException:
        os._exit(127)
    os._exit(127)  # unreachable: execvp returns only by raising


def _read_launch_error(fd: int) -> str:
    """What the child wrote before its exec failed; ``""`` once the exec closed the pipe."""
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, LAUNCH_ERROR_MAX)
            except InterruptedError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)[:LAUNCH_ERROR_MAX].decode(errors="replace")


def _wait(pid: int) -> tuple[int | None, int | None]:
    """Wait for the agent; ``(code, None)`` or ``(None, signal)``. Orphans re-parented to us that
    end meanwhile are reaped on the way, so none stays a zombie while the agent runs."""
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:  # no child left at all: the agent was reaped already
            return None, None
        if got != pid:
            continue
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status), None
        if os.WIFSIGNALED(status):
            return None, os.WTERMSIG(status)


def _reap() -> None:
    """Collect every child that has ended (orphans re-parented to us end up here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _leftovers(me: int, own_group: bool) -> list[int]:
    """What the agent left behind: the rest of our group (when we lead it) and our descendants,
    from one read of the process table (the agent's successor waits for this)."""
    table = _proc_table()
    if table is None:
        found = set(descendants(me))
        if own_group:
            found.update(group_members(me, exclude=me))
    else:
        found = set(_descendants_in(table, me))
        if own_group:
            found.update(pid for pid, _, group in table if group == me)
    found.discard(me)
    return sorted(found)


def _stop_leftovers(grace: float) -> None:
    """Stop what the agent left in our group or among our descendants: SIGTERM, wait, SIGKILL each, reap."""
    me = os.getpid()
    own_group = os.getpgid(0) == me
    if not _leftovers(me, own_group):
        _reap()
        return
    if own_group:
        try:
            os.killpg(me, signal.SIGTERM)  # reaches us too: swallowed
        except OSError:
            pass
    for pid in descendants(me):  # a setsid'd descendant is in no group of ours
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    delay = 0.01
    while _leftovers(me, own_group):
        _reap()
        if time.monotonic() >= deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    for _ in range(50):
        _reap()
        left = _leftovers(me, own_group)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
    _reap()


def lease_clock() -> float:
    """The clock of lease files: ``CLOCK_BOOTTIME`` (it goes on during a suspend, as the database's
    clock does), else the monotonic clock. Both are system-wide: the daemon and the shim agree."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        try:
            return time.clock_gettime(boottime)
        except OSError:
            pass
    return time.monotonic()


def read_lease(path: str) -> tuple[float, float] | None:
    """``(term_at, kill_at)`` from a lease file, or None when it is missing, not a regular file,
    too big or not what the daemon writes. Never blocks (a FIFO in its place is opened non-blocking
    and refused) and never follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, LEASE_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > LEASE_MAX_BYTES:
        return None
    try:
        record = json.loads(raw)
        term_at, kill_at = float(record["term_at"]), float(record["kill_at"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if not (term_at == term_at and kill_at == kill_at) or abs(term_at) == float("inf") or abs(kill_at) == float("inf"):
        return None
    return min(term_at, kill_at), kill_at


def _file_identity(path: str) -> tuple[int, int, int, int] | None:
    """What tells one lease file from the next the daemon writes (inode, mtime, ctime, size)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


class _LeaseWatch:
    """The thread that stops the agent when its host's lease runs out (see the module docstring)."""

    def __init__(self, path: str, grace: float, *, ttl: float = 0.0, agent: int = 0) -> None:
        self.path = path
        self.no_lease_grace = grace
        """Between SIGTERM and SIGKILL when no lease was ever read (else the lease's own kill_at)."""
        self.ttl = ttl
        """The lease's ttl the daemon started us with (``--ttl``; 0: unbounded): no deadline read
        lies further than this from when its file was first seen."""
        self.agent = agent
        """The agent's pid: SIGKILLed first, before any scan, when the stop comes past ``kill_at``."""
        self.kill_at: float | None = None
        """Set once the stop began: when what is left of the agent is SIGKILLed."""
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-shim-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        term_at = kill_at = None
        seen = False
        identity: tuple[int, int, int, int] | None = None
        last = lease_clock()
        while not self.done.is_set():
            # First thing on every wake, a thaw after a pause included: the lease, then the clock.
            current = _file_identity(self.path)
            got = read_lease(self.path) if current is None or current != identity else None
            now = lease_clock()
            if got is not None:
                identity, seen = current, True
                term_at, kill_at = self._bounded(got, now)
            if term_at is None or kill_at is None:  # no lease ever seen: the daemon writes one before the launch
                term_at, kill_at = now, now + self.no_lease_grace
            if now >= term_at:
                self._stop(kill_at, seen=seen, paused=now - last - LEASE_POLL)
                return
            last = now
            self.done.wait(max(0.01, min(LEASE_POLL, term_at - now)))

    def _bounded(self, got: tuple[float, float], now: float) -> tuple[float, float]:
        """A file's deadlines, never past ``ttl`` from now (a file saying 1e308 is not a lease)."""
        term_at, kill_at = got
        if self.ttl > 0:
            term_at, kill_at = min(term_at, now + self.ttl), min(kill_at, now + self.ttl)
        return term_at, kill_at

    def _stop(self, kill_at: float, *, seen: bool, paused: float = 0.0) -> None:
        self.kill_at = kill_at
        why = "its host's lease on the task ran out unrenewed" if seen else f"no lease file at {self.path}"
        late = lease_clock() >= kill_at
        if paused > LEASE_PAUSED:
            why += f" (this host was paused for {paused:.1f}s)"
        how = "killing the agent at once: its kill deadline passed" if late else "stopping the agent"
        _say(f"heartbeat shim: {why}: {how} (another host may take the task over)\n")
        me = os.getpid()
        own_group = os.getpgid(0) == me
        if late:  # past kill_at another host may run the task already: no SIGTERM for a handler to act on
            self._kill_all(me, own_group)
            return
        if own_group:
            try:
                os.killpg(me, signal.SIGTERM)  # reaches us too: swallowed
            except OSError:
                pass
        for pid in _leftovers(me, own_group):  # a setsid'd descendant is in no group of ours
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        while not self.done.is_set() and lease_clock() < kill_at and _leftovers(me, own_group):
            self.done.wait(max(0.0, min(LEASE_POLL / 4, kill_at - lease_clock())))
        if self.done.is_set():
            return  # the agent ended: the main thread stops what it left, by kill_at
        self._kill_all(me, own_group)

    def _kill_all(self, me: int, own_group: bool) -> None:
        """SIGKILL the agent (first, before any scan of the process table), then what it left,
        one by one, never the group: SIGKILL would reach us."""
        if self.agent > 0:
            try:
                os.kill(self.agent, signal.SIGKILL)
            except OSError:
                pass
        for pid in _leftovers(me, own_group):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def grace(self, grace: float) -> float:
        """The leftovers' grace after the agent ended: never past the lease's ``kill_at``."""
        if self.kill_at is None:
            return grace
        return max(0.0, min(grace, self.kill_at - lease_clock()))


def _parse(args: list[str]) -> tuple[float, list[str], str, float, str, list[str]]:
    grace = STOP_GRACE
    unset: list[str] = []
    lease = ""
    ttl = 0.0
    while args[:1] in (["--grace"], ["--unset"], ["--lease"], ["--ttl"]) and len(args) > 1:
        if args[0] == "--grace":
            grace = max(0.0, float(args[1]))
        elif args[0] == "--ttl":
            ttl = float(args[1])
            if not 0 < ttl < float("inf"):
                raise ValueError(f"bad --ttl: {args[1]}")
        elif args[0] == "--lease":
            lease = args[1]
        else:
            unset.append(args[1])
        args = args[2:]
    if len(args) < 3 or args[1] != "--":
        raise ValueError(_USAGE)
    return grace, unset, lease, ttl, args[0], args[2:]


def main(args: list[str] | None = None) -> int:
    try:
        grace, unset, lease, ttl, exit_file, argv = _parse(sys.argv[1:] if args is None else args)
    except ValueError as exc:
        msg = str(exc) if str(exc) == _USAGE or str(exc).startswith("bad --ttl") else f"bad --grace: {exc}"
        _say(f"heartbeat shim: {msg}\n")
        return 2
    for name in unset:  # what our own start-up added, e.g. Python's C-locale coercion (LC_CTYPE)
        os.environ.pop(name, None)
    for signum in _SWALLOWED:
        signal.signal(signum, _swallow)
    # A daemon thread may have had signals blocked: the mask is inherited, so clear it.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    become_subreaper()  # before the agent starts: its setsid'd descendants stay ours
    try:  # the log dir, held from now on: a link swapped in later cannot redirect our records
        hold_dir(os.path.dirname(exit_file))
    except OSError:
        pass  # the record writes will say what is wrong
    _write_pid_file(exit_file)
    pid, launch_error = _spawn(argv)
    watch = _LeaseWatch(lease, grace, ttl=ttl, agent=pid) if lease else None
    if watch is not None:  # started after the fork: the agent's process has no thread of ours
        watch.start()
    code, sig = _wait(pid)
    ended_at = time.time()
    if watch is not None:
        watch.done.set()
        grace = watch.grace(grace)
    _stop_leftovers(grace)
    try:
        write_exit_file(exit_file, code, sig, ended_at,
                        stopped="lease" if watch is not None and watch.kill_at is not None else "",
                        launch_error=launch_error)
    except OSError as exc:
        _say(f"heartbeat shim: cannot write {exit_file}: {exc.strerror}\n")
        if sig is not None:  # no record (a full disk): our own end tells the daemon the agent's signal
            _die_by(sig)
    return code if code is not None else 128 + (sig or 0)


def _say(text: str) -> None:
    """One line on stderr (the task's log), never raising: on a full disk it is lost, not fatal."""
    try:
        os.write(2, text.encode(errors="replace"))
    except OSError:
        pass


def _die_by(sig: int) -> None:
    """End this process by ``sig``, as the agent ended (its status is then what the launcher reads)."""
    try:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # (those two have no handler to reset)
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        if sig != signal.SIGSTOP:
            os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass  # a signal we cannot die by (a number out of range): 128+S below


if __name__ == "__main__":
    # The record is written: exit at once, without the interpreter's teardown (about 10 ms),
    # for the daemon starts the successor when this process ends. Nothing here buffers output.
    os._exit(main() & 0xFF)
