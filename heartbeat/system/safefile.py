"""Opening files that someone else may have planted: never block, never follow, never leave the root.

Agents, workdirs and other local users can put things where heartbeat looks: a FIFO
at ``logs/<id>/<epoch>.exit`` or at ``<workdir>/.git/HEAD`` (an ``open()`` of it waits
forever for a writer), a symlink at ``logs/<id>`` (a write through it lands outside the
state dir), a device or a directory where a file should be. Every open of such a path
goes through this module:

- :func:`open_regular` opens with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO opens at once, a
  symlink is refused by the kernel), then ``fstat``\\ s the descriptor and refuses anything
  but a regular file; it first ``lstat``\\ s the path so a device is not even opened;
- :func:`read_regular` reads one such file, bounded; :func:`read_log_ends` reads the two
  ends of a log, bounded; :func:`read_tail_below` reads the end of a file below a trusted root
  through no symlink, creating nothing;
- :func:`open_dir` walks a directory below a trusted root one component at a time with
  ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous one, creating missing ones 0700,
  so a symlinked ``logs`` or ``logs/<id>`` is refused *before* anything is written;
- :func:`write_temp`, :func:`replace_temp`, :func:`write_atomic`, :func:`write_file_atomic` and
  :func:`open_atomic` are the one way heartbeat writes a file whole: a fresh temp file
  (exclusive, never through a link, exact mode), fsync, rename, optionally a directory fsync,
  all relative to one directory descriptor; no temp file outlives a failed write.

Every refusal is an :class:`~heartbeat.model.errors.UnsafePath` whose one line names the file.

**The one exception** to "every whole-file write goes through here" is the launcher shim
(:mod:`heartbeat.launchers.shim`): it runs as a plain script that imports nothing from heartbeat
(the agent's ``PYTHONPATH`` must not reach it), so it writes its exit file with the same steps by
hand (exclusive no-follow temp file relative to its held log directory, fsync, rename, directory
fsync, the temp removed on failure). ``tests/unit/test_one_home.py`` fails on any other ``os.replace``
or ``os.rename`` outside this module.

**The exceptions** to "every read of a file someone could plant goes through here", each pinned
by count in ``tests/unit/test_one_home.py``: :mod:`heartbeat.launchers.shim` (the plain script
above: ``/proc`` and its lease file, no-follow and non-blocking by hand), :mod:`heartbeat.hotpath.pulse`
(an agent's touch imports nothing more; the same flags by hand), :mod:`heartbeat.launchers.liveness`
(``/proc/<pid>/stat`` and ``/proc/stat``, written by the kernel), :mod:`heartbeat.cli.state` (``heartbeat import FILE``
streams a file the human names, a pipe such as ``<(zcat export.gz)`` included), and
:mod:`heartbeat.ops.demo` and :mod:`heartbeat.toyagent` (their own files in their own temp dir).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from heartbeat.model import defaults
from heartbeat.model.errors import UnsafePath

__all__ = ["NOFOLLOW_READ", "open_regular", "read_regular", "read_fd", "read_log_ends", "read_tail_below",
           "check_not_special", "open_dir", "write_temp",
           "replace_temp", "write_atomic", "write_file_atomic", "open_atomic", "open_parent", "fsync_dir", "kind_of"]

NOFOLLOW_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
"""The flags of a read that neither waits for a FIFO's writer nor follows a planted link."""

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


def kind_of(mode: int) -> str:
    """``a FIFO``, ``a directory``, ... for a stat mode that is not a regular file."""
    return _KINDS.get(stat.S_IFMT(mode), f"a special file (mode {stat.S_IFMT(mode):o})")


def _refuse(path: str, mode: int) -> UnsafePath:
    return UnsafePath(f"is {kind_of(mode)}, not a regular file; heartbeat does not open it", path=path)


def check_not_special(path: str, *, dir_fd: int | None = None) -> bool:
    """True when ``path`` is a regular file, False when it is absent; :class:`UnsafePath` for
    anything else (a FIFO, a device, a socket, a directory, a symlink). Never opens it."""
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode)
    return True


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o600, *, dir_fd: int | None = None,
                 follow: bool = False) -> int:
    """A descriptor of the regular file ``path``, opened without blocking and without following a link.

    ``flags`` may add ``O_WRONLY``/``O_RDWR``/``O_APPEND``/``O_CREAT``; ``O_NONBLOCK``,
    ``O_NOFOLLOW`` and ``O_CLOEXEC`` are always added, and ``O_NONBLOCK`` is cleared again
    once the file is known to be regular (where it means nothing). Raises
    :class:`UnsafePath` (naming ``path``) for a symlink or anything not a regular file, and
    the ``OSError`` of the open otherwise (``FileNotFoundError`` for a missing file).
    With ``follow`` (a path a human named: a config, a ``--from`` file) a symlink is followed
    to the file it names, which must still be regular.
    """
    try:
        st = os.stat(path, dir_fd=dir_fd) if follow else os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)  # a device is not even opened: opening one can have effects
    try:
        nofollow = 0 if follow else os.O_NOFOLLOW
        fd = os.open(path, flags | os.O_NONBLOCK | nofollow | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath("is a symbolic link; heartbeat does not follow it", path=path) from None
        if exc.errno == errno.ENXIO:  # a FIFO swapped in after the lstat, opened for writing
            raise UnsafePath("is a FIFO, not a regular file; heartbeat does not open it", path=path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, limit: int, *, dir_fd: int | None = None, follow: bool = False) -> bytes:
    """Up to ``limit`` bytes of the regular file ``path`` (see :func:`open_regular` for what is refused)."""
    fd = open_regular(path, dir_fd=dir_fd, follow=follow)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``'s offset on (fewer at its end)."""
    chunks = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def read_log_ends(path: str, *, head: int = defaults.RESULT_HEAD_BYTES, tail: int = defaults.RESULT_TAIL_BYTES,
                  line: int = defaults.RESULT_LINE_BYTES) -> bytes:
    """The first ``head`` and the last ``tail`` bytes of the regular file ``path`` (all of a small
    one, the two parts joined by a newline), or ``b""`` when there is no regular file to read.

    The tail starts at the start of its first line when that is at most ``line`` bytes further
    back: a final line longer than the tail is read whole. Nothing more than
    ``head + tail + line`` bytes is ever read, whatever the file's size. For an agent's log, where
    the result a preset parses is at one end or the other; a cut first line is dropped by the parser.
    """
    try:
        fd = open_regular(path)
    except (OSError, UnsafePath):
        return b""
    try:
        size = os.fstat(fd).st_size
        if size <= head + tail:
            return read_fd(fd, head + tail)
        start = _line_start(fd, size - tail, line)
        os.lseek(fd, 0, os.SEEK_SET)
        if start <= head:
            return read_fd(fd, size)
        first = read_fd(fd, head)
        os.lseek(fd, start, os.SEEK_SET)
        return first + b"\n" + read_fd(fd, size - start)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _line_start(fd: int, offset: int, limit: int) -> int:
    """The offset of the line holding byte ``offset`` (just after the newline before it), looking
    back at most ``limit`` bytes; ``offset`` itself when the line starts further back."""
    pos = offset
    while pos > 0 and offset - pos < limit:
        size = min(1 << 16, pos, limit - (offset - pos))
        os.lseek(fd, pos - size, os.SEEK_SET)
        chunk = read_fd(fd, size)
        found = chunk.rfind(b"\n")
        if found >= 0:
            return pos - size + found + 1
        pos -= size
    return 0 if pos == 0 else offset


def read_tail_below(root: str, parts: tuple[str, ...], name: str, limit: int) -> tuple[bytes, int]:
    """The last ``limit`` bytes of ``root/parts.../name`` and the file's size, reached through no
    symlink: ``root`` is trusted, each directory below it is opened ``O_NOFOLLOW`` relative to the
    one before (nothing is created or changed on the way), the file as :func:`open_regular` does.

    Raises ``FileNotFoundError`` when a part is missing, :class:`UnsafePath` for a symlink or a
    file that is not regular, and the ``OSError`` of a directory that is a link or not one.
    """
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parts:
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
        fd = open_regular(name, dir_fd=fds[-1])
        fds.append(fd)
        size = os.fstat(fd).st_size
        return os.pread(fd, limit, max(0, size - limit)), size
    finally:
        for opened in reversed(fds):
            os.close(opened)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(root: str, *parts: str, create: bool = True) -> int:
    """A descriptor of ``root/parts...``: each part opened relative to the one before, never through a link.

    ``root`` is trusted (the state dir, already checked); every part below it must be a real
    directory owned by this user (or root), and is created 0700 when missing (``create``)
    and made 0700 when others could read it. A symlink, a file, or another user's directory
    is refused with :class:`UnsafePath` naming it, before anything is written below it.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = root
    try:
        for part in parts:
            if not part or part in (".", "..") or "/" in part:
                raise UnsafePath(f"{part!r} is not a plain directory name", path=path)
            path = os.path.join(path, part)
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    st = os.lstat(part, dir_fd=fd)
                    raise UnsafePath(f"is {kind_of(st.st_mode)}, not a directory; heartbeat writes nothing "
                                     "through it", path=path) from None
                raise
            os.close(fd)
            fd = sub
            st = os.fstat(fd)
            if st.st_uid not in (os.geteuid(), 0):
                raise UnsafePath(f"belongs to uid {st.st_uid}, not to this user; heartbeat writes nothing in it",
                                 path=path)
            if stat.S_IMODE(st.st_mode) & 0o077:
                os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_temp(dir_fd: int, name: str, mode: int) -> tuple[str, int]:
    """A fresh ``.<name>.<pid>.<random>.tmp`` in ``dir_fd`` and its descriptor, created exclusively
    (``O_EXCL``, never a file someone planted at the name, never through a link) with exactly ``mode``."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)  # whatever the umask
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp, dir_fd)
        raise
    return tmp, fd


def write_temp(dir_fd: int, name: str, data: bytes | Iterable[bytes], mode: int = 0o600, *,
               fsync: bool = True, mtime: float | None = None) -> str:
    """Write ``data`` (bytes, or chunks of it) to a fresh temp file beside ``name`` in the directory
    ``dir_fd`` and return the temp file's name (relative to ``dir_fd``), for :func:`replace_temp`.

    The temp file is ``.<name>.<pid>.<random>.tmp``: created exclusively (``O_EXCL``, never a
    file someone planted at the name, never through a link), given exactly ``mode`` (whatever
    the umask), written in full, its times set to ``mtime`` when given, and fsynced (unless
    ``fsync`` is False: a report rewritten every few seconds). It is removed again when any step fails.
    """
    tmp, fd = _create_temp(dir_fd, name, mode)
    try:
        try:
            for chunk in (data,) if isinstance(data, bytes) else data:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            if mtime is not None:
                os.utime(fd, (mtime, mtime))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(tmp, dir_fd)
        raise
    return tmp


def replace_temp(dir_fd: int, tmp: str, name: str) -> None:
    """Rename the temp file ``tmp`` (from :func:`write_temp`) over ``name`` in the directory
    ``dir_fd``: a reader sees the old file or the new one. On failure the temp file is removed."""
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(tmp, dir_fd)
        raise


def write_atomic(dir_fd: int, name: str, data: bytes | Iterable[bytes], mode: int = 0o600, *,
                 fsync: bool = True, fsync_dir: bool = False, mtime: float | None = None) -> None:
    """Write ``data`` to ``name`` in the directory ``dir_fd``: :func:`write_temp`, then rename over
    ``name`` (a reader sees the old file or the new one), then fsync the directory when
    ``fsync_dir`` (the rename itself survives a crash). No temp file outlives a failed write."""
    replace_temp(dir_fd, write_temp(dir_fd, name, data, mode, fsync=fsync, mtime=mtime), name)
    if fsync_dir:
        os.fsync(dir_fd)


@contextmanager
def open_atomic(path: str, mode: int = 0o600, *, fsync_dir: bool = False) -> Iterator[BinaryIO]:
    """A binary file to stream into that replaces ``path`` whole when the ``with`` block ends
    normally (fsynced first); when the block raises, ``path`` is untouched and the temp file gone.
    For output too large to hold in memory (an export); everything else uses :func:`write_file_atomic`."""
    dir_fd = open_parent(path)
    try:
        name = os.path.basename(path)
        tmp, fd = _create_temp(dir_fd, name, mode)
        try:
            with open(fd, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            _unlink_quietly(tmp, dir_fd)
            raise
        replace_temp(dir_fd, tmp, name)
        if fsync_dir:
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_file_atomic(path: str, data: bytes | Iterable[bytes], mode: int = 0o600, *,
                      fsync: bool = True, fsync_dir: bool = False, follow: bool = True) -> None:
    """:func:`write_atomic` for a path whose directory is trusted (the state dir, a config's
    directory): the directory is opened once (not through a link when ``follow`` is False) and
    everything happens relative to it."""
    dir_fd = open_parent(path, follow=follow)
    try:
        write_atomic(dir_fd, os.path.basename(path), data, mode, fsync=fsync, fsync_dir=fsync_dir)
    finally:
        os.close(dir_fd)


def open_parent(path: str, *, follow: bool = True) -> int:
    """A descriptor of the directory ``path`` is in (for the ``dir_fd`` of the functions above);
    with ``follow`` False a symlink in its place is refused (``ELOOP``)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    return os.open(os.path.dirname(path) or ".", flags)


def fsync_dir(path: str, *, follow: bool = True) -> None:
    """fsync a directory: the renames and unlinks in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(name: str, dir_fd: int | None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
