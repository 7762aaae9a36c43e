"""The pulse: an agent's ``touch`` as the mtime of one small file, fenced by the baton's bytes.

A touch says "alive, still on this step". Writing it into the baton (parse the TOML, bump
the revision, rename, append a ledger row) cost an agent's ``heartbeat touch`` five
interpreter starts; the pulse costs about one. ``<state_dir>/logs/<id>/<epoch>.pulse``:

- **The slow touch arms it.** A touch that goes through the store (the first one after
  any write to the baton, and the first one after each ``defaults.TOUCH_COALESCE``
  seconds) writes the baton and its coalesced ``touched`` ledger row exactly as before,
  then writes the pulse: a header (``heartbeat-pulse 1 <epoch> <fold_by>``) and the exact
  bytes of the baton it just wrote. It arms only for an agent's touch (an epoch) on an
  active task that has an owner, at the baton's own epoch.
- **A fast touch is a bare ``futimens``.** :func:`fast_touch` reads the pulse and the
  baton without parsing either, and only when the baton's bytes are still exactly the
  armed ones (so its epoch, status and owner are still what the slow touch checked) and
  ``fold_by`` has not passed does it set the pulse's mtime to now. Anything else (a
  missing, changed, foreign or planted file; an epoch bump by the daemon; a ``done``; a
  hand edit) falls back to the slow touch, which answers with today's exit codes and
  one-line errors: a superseded agent's touch is still refused with exit 5.
- **Readers fold it in.** :func:`apply_pulse` (called by the file store's ``load`` and
  ``scan`` for every task with an owner) makes ``meta.touched_at`` the later of the
  baton's and the pulse's of the baton's *own* epoch, so the daemon's stall decision,
  ``status``, the web page and the metrics see a fast touch as they saw a written one.
  A pulse of another epoch is never looked at; a symlink, FIFO or anything but a regular
  file there is ignored (only ``lstat``: never opened, so never waited on), and so is an
  mtime in the future.

The ledger keeps one ``touched`` row per task per coalescing window, as before; the
baton's own ``touched_at`` lags the pulse by at most that window between other writes.

This module imports nothing but ``os``, ``stat`` and ``time`` at load: the ``heartbeat``
command (:mod:`heartbeat.__main__`) runs :func:`hot_touch` before anything else.
"""

from __future__ import annotations

import os
import stat
import time

from heartbeat.hotpath.argv import agent_call

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from heartbeat.model.baton import Baton

__all__ = ["PULSE_SUFFIX", "pulse_name", "fast_touch", "arm", "pulse_mtime", "apply_pulse", "hot_touch"]

PULSE_SUFFIX = ".pulse"
MAGIC = b"heartbeat-pulse 1 "
"""The pulse's first line starts so; then ``<epoch> <fold_by>`` (Unix seconds) and a newline."""

FUTURE_SKEW = 5.0  # defaults.PULSE_FUTURE_SKEW, without loading defaults (tests pin them equal)
"""Seconds a pulse's mtime may lie ahead of the reader's clock before it is ignored as forged."""

MAX_BATON_BYTES = 1024 * 1024  # defaults.MAX_BATON_BYTES, without loading defaults (tests pin them equal)
_HEADER_MAX = 64
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_ID_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ID_REST = _ID_FIRST | frozenset("._-")


def pulse_name(epoch: int) -> str:
    """``<epoch>.pulse``, the pulse's name in ``logs/<id>/``."""
    return f"{int(epoch)}{PULSE_SUFFIX}"


def _valid_id(task_id: str) -> bool:
    """``baton.ID_PATTERN`` without ``re`` (a test pins them equal)."""
    return 0 < len(task_id) <= 64 and task_id[0] in _ID_FIRST and all(c in _ID_REST for c in task_id)


def _read_bounded(name: str, dir_fd: int, limit: int) -> bytes | None:
    """The bytes of regular file ``name`` under ``dir_fd`` (at most ``limit``), or None: a FIFO
    opens at once (O_NONBLOCK) and is refused by fstat, a link is refused by the kernel."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        data = os.read(fd, st.st_size + 1)
        return data if len(data) == st.st_size else None
    except OSError:
        return None
    finally:
        os.close(fd)


def fast_touch(state_dir: str, task_id: str, epoch: int) -> bool:
    """Touch the pulse of ``task_id`` at ``epoch`` if it is armed for the baton as it is now.

    True when done; False (having changed nothing) whenever the slow touch must answer
    instead. Never raises for what it finds on disk, never blocks, never follows a link.
    """
    if not _valid_id(task_id) or epoch < 0:
        return False
    fds: list[int] = []
    try:
        root = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds.append(root)
        st = os.fstat(root)
        if st.st_mode & 0o022 or st.st_uid not in (os.geteuid(), 0):
            return False  # the store refuses such a state dir: let it say so
        logs = os.open("logs", _DIR, dir_fd=root)
        fds.append(logs)
        task_dir = os.open(task_id, _DIR, dir_fd=logs)
        fds.append(task_dir)
        pulse = os.open(pulse_name(epoch), _READ, dir_fd=task_dir)
        fds.append(pulse)
        pst = os.fstat(pulse)
        if not stat.S_ISREG(pst.st_mode) or pst.st_size > MAX_BATON_BYTES + _HEADER_MAX:
            return False
        armed = os.read(pulse, pst.st_size + 1)
        header, sep, expected = armed.partition(b"\n")
        if not sep or not header.startswith(MAGIC):
            return False
        fields = header[len(MAGIC):].split(b" ")
        if len(fields) != 2 or fields[0] != str(epoch).encode() or not time.time() < float(fields[1]):
            return False
        batons = os.open("batons", _DIR, dir_fd=root)
        fds.append(batons)
        if _read_bounded(f"{task_id}.toml", batons, MAX_BATON_BYTES) != expected:
            return False
        os.utime(pulse)  # futimens(fd, NULL): now
        return True
    except (OSError, ValueError):
        return False
    finally:
        for fd in reversed(fds):
            os.close(fd)


def arm(state_dir: str, task_id: str, epoch: int, baton_bytes: bytes, touched: float, fold_by: float) -> bool:
    """Write ``logs/<id>/<epoch>.pulse`` for a baton whose bytes are ``baton_bytes``, fresh until
    ``fold_by``, its mtime the baton's ``touched`` (Unix seconds). Best effort: a planted link
    or FIFO on the way, a full disk, anything unusual leaves no pulse (every touch then takes
    the slow way) and returns False."""
    from heartbeat.model.errors import UnsafePath
    from heartbeat.system.safefile import open_dir, write_atomic

    try:
        task_dir = open_dir(state_dir, "logs", task_id)
    except (UnsafePath, OSError):
        return False
    data = MAGIC + f"{int(epoch)} {fold_by!r}\n".encode() + baton_bytes
    try:
        # No fsync: a pulse lost to a crash costs one slow touch, never a wrong answer.
        write_atomic(task_dir, pulse_name(epoch), data, 0o600, fsync=False, mtime=touched)
        return True
    except OSError:
        return False
    finally:
        os.close(task_dir)


def pulse_mtime(logs_dir: str, task_id: str, epoch: int) -> float | None:
    """The mtime of ``logs/<id>/<epoch>.pulse`` when it is a regular file in a real directory,
    else None. Only ``lstat``: a FIFO, a link or a huge file there is never opened."""
    task_dir = os.path.join(logs_dir, task_id)
    try:
        if not stat.S_ISDIR(os.lstat(task_dir).st_mode):
            return None
        st = os.lstat(os.path.join(task_dir, pulse_name(epoch)))
    except (OSError, ValueError):
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def apply_pulse(baton: Baton, logs_dir: str, now: float | None = None) -> None:
    """Make ``baton.meta.touched_at`` the later of its own and its epoch's pulse (see the module
    docstring); only for a baton with an owner (nobody else pulses). An mtime more than
    :data:`FUTURE_SKEW` ahead of ``now`` is ignored."""
    meta = baton.meta
    if meta.owner is None:
        return
    mtime = pulse_mtime(logs_dir, baton.id, meta.epoch)
    if mtime is None or mtime > (time.time() if now is None else now) + FUTURE_SKEW:
        return
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(mtime, UTC)
    if meta.touched_at is None or when > meta.touched_at:
        meta.touched_at = when


def hot_touch(argv: list[str], environ: Mapping[str, str] | None = None) -> bool:
    """``heartbeat touch ID`` answered from the pulse, for an agent the daemon launched (its
    ``HEARTBEAT_STATE_DIR`` and ``HEARTBEAT_EPOCH`` set, no store URL): True when done,
    False when the CLI must run as usual."""
    env = os.environ if environ is None else environ
    call = agent_call(argv)
    if call is None or call[0] != "touch":
        return False
    state_dir = env.get("HEARTBEAT_STATE_DIR")
    raw_epoch = env.get("HEARTBEAT_EPOCH")
    if not state_dir or not raw_epoch or env.get("HEARTBEAT_STORE_URL"):
        return False
    owner_task = env.get("HEARTBEAT_TASK")
    if owner_task and owner_task != argv[1]:
        return False  # not this task's agent: the CLI touches unfenced, as epoch_from_env says
    if not raw_epoch.isdigit() or not raw_epoch.isascii() or len(raw_epoch) > 18:
        return False  # the CLI says what is wrong with it
    return fast_touch(os.path.abspath(state_dir), argv[1], int(raw_epoch))

