"""Fingerprints of the world a baton describes: its key files and the workdir's git HEAD.

A baton records them whenever its content is written (every store that writes batons calls
:func:`fingerprint_world`); ``heartbeat verify`` (:mod:`heartbeat.tasks.verify`) compares them with
the world as it is now, so a resumed agent learns whether the note still holds before it
does something it cannot undo.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from heartbeat.model import defaults
from heartbeat.model.errors import UnsafePath
from heartbeat.system.safefile import open_regular, read_regular

try:  # hashlib's own built-in SHA-256: importing hashlib loads OpenSSL, a third of an interpreter start
    from _sha256 import sha256 as _sha256  # Python 3.11
except ImportError:
    try:
        from _sha2 import sha256 as _sha256  # Python 3.12+
    except ImportError:
        from hashlib import sha256 as _sha256

sha256 = _sha256
"""SHA-256 without OpenSSL: what a module on an agent's write path hashes with (store/archive.py)."""

if TYPE_CHECKING:
    from heartbeat.model.baton import Baton

__all__ = [
    "sha256",
    "GIT_HEAD_KEY",
    "MISSING",
    "resolve_key_file",
    "fingerprint",
    "fingerprint_world",
    "git_head",
    "describe_change",
    "world_changes",
]

GIT_HEAD_KEY = ":git-head"
"""The key under ``[meta.world]`` that holds the workdir's git HEAD (no file path starts with ':')."""

MISSING = "missing"


def resolve_key_file(workdir: str, key_file: str) -> str:
    """The absolute path of ``key_file`` under ``workdir``; refuses paths that escape it.

    ``..``, an absolute path outside the workdir and a symlink that points outside it
    are all refused with :class:`UnsafePath`.
    """
    if "\0" in workdir or "\0" in key_file:  # the OS would cut the path at the NUL (Python refuses it)
        raise UnsafePath(f"key file {key_file[:200]!r} or workdir {workdir[:200]!r} holds a NUL byte",
                         field="key_files")
    root = os.path.realpath(workdir)
    joined = os.path.normpath(os.path.join(root, key_file))
    if not _within(joined, root):
        raise UnsafePath(
            f"key file {key_file[:200]!r} is outside the workdir {workdir}: key files must be paths inside it",
            field="key_files",
        )
    real = os.path.realpath(joined)
    if not _within(real, root):
        raise UnsafePath(
            f"key file {key_file[:200]!r} is a link to {real[:200]}, outside the workdir {workdir}",
            field="key_files",
        )
    return real


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def fingerprint(path: str, *, hash_limit: int = defaults.FINGERPRINT_HASH_LIMIT) -> str:
    """``sha256:<hex>`` for a file up to ``hash_limit`` bytes, ``stat:<size>:<mtime_ns>`` above it,
    ``dir:<mtime_ns>`` for a directory, ``missing`` when absent, ``other:<mode>`` otherwise."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return MISSING
    except OSError as exc:
        return f"error:{exc.errno}"
    if stat.S_ISDIR(st.st_mode):
        return f"dir:{st.st_mtime_ns}"
    if not stat.S_ISREG(st.st_mode):
        return f"other:{stat.S_IFMT(st.st_mode):o}"
    if st.st_size > hash_limit:
        return f"stat:{st.st_size}:{st.st_mtime_ns}"
    digest = _sha256()
    try:
        # Swapped for a FIFO, a device or a link between the stat and the open: refused, never waited on.
        fd = open_regular(path)
    except UnsafePath:
        try:
            return f"other:{stat.S_IFMT(os.lstat(path).st_mode):o}"
        except OSError:
            return MISSING
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        return f"error:{exc.errno}"
    with os.fdopen(fd, "rb") as handle:
        try:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        except OSError as exc:  # EIO from a failing disk, a /proc or FUSE file: a fingerprint, not a crash
            return f"error:{exc.errno}"
    return f"sha256:{digest.hexdigest()}"


_GIT_READ_LIMIT = 4096
_PACKED_REFS_LIMIT = 16 * 1024 * 1024


def _git_file(path: str, limit: int = _GIT_READ_LIMIT) -> str | None:
    """The text of a file under ``.git``; None when absent. A FIFO, device, directory or
    symlink there is refused (:class:`UnsafePath` naming it): git itself would hang on a FIFO."""
    try:
        return read_regular(path, limit).decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None


def git_head(workdir: str) -> str | None:
    """The commit the workdir's git HEAD points at, read from ``.git`` without running git.

    None when the workdir is no git checkout or a file is unreadable; :class:`UnsafePath`
    when one of git's files is a FIFO, a device, a directory or a symlink (never opened for
    reading, so nothing here can block).
    """
    gitdir = os.path.join(workdir, ".git")
    try:
        if os.path.isfile(gitdir):  # a worktree or submodule: "gitdir: <path>"
            line = (_git_file(gitdir) or "").strip()
            if not line.startswith("gitdir:"):
                return None
            gitdir = os.path.join(workdir, line[len("gitdir:") :].strip())
        head = _git_file(os.path.join(gitdir, "HEAD"))
        if head is None:
            return None
        head = head.strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head[4:].strip()
        if not ref.startswith("refs/") or ".." in ref.split("/"):
            return f"unborn:{ref[:200]}"  # not a ref git would follow: never a path out of .git
        common = gitdir
        commondir = _git_file(os.path.join(gitdir, "commondir"))
        if commondir is not None:
            common = os.path.join(gitdir, commondir.strip())
        for base in (gitdir, common):
            value = _git_file(os.path.join(base, ref))
            if value is not None:
                return value.strip() or None
        packed = _git_file(os.path.join(common, "packed-refs"), _PACKED_REFS_LIMIT)
        if packed is not None:
            for line in packed.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
        return f"unborn:{ref}"
    except UnsafePath:
        raise
    except (OSError, UnicodeDecodeError):
        return None


def fingerprint_world(workdir: str, key_files: list[str]) -> dict[str, str]:
    """Fingerprint every key file (and git HEAD) of a baton; raises :class:`UnsafePath` on escapes."""
    if not workdir:
        return {}
    if "\0" in workdir or not os.path.isabs(workdir):
        raise UnsafePath(f"workdir {workdir[:200]!r} must be an absolute path", field="workdir")
    world = {key: fingerprint(resolve_key_file(workdir, key)) for key in key_files}
    head = git_head(workdir)  # a FIFO (or device, link) for .git/HEAD: UnsafePath, the write is refused
    if head:
        world[GIT_HEAD_KEY] = head
    return world


def _current(workdir: str, key: str) -> str:
    """The fingerprint of one recorded key now; a path that became unsafe reads as ``unsafe:``."""
    try:
        if key == GIT_HEAD_KEY:
            return git_head(workdir) or MISSING
        return fingerprint(resolve_key_file(workdir, key))
    except UnsafePath as exc:
        return f"unsafe:{exc.path}: {exc.message}" if exc.path else f"unsafe:{exc.message}"


def _kind(value: str) -> str:
    prefix = value.split(":", 1)[0]
    return {"sha256": "file", "stat": "file", "dir": "directory", "other": "special file"}.get(prefix, prefix)


def describe_change(key: str, was: str, now: str) -> str:
    """A few words for how a fingerprint changed: ``modified``, ``deleted``, ``created``, ..."""
    if now.startswith("unsafe:"):
        return "now refused: " + now[len("unsafe:"):]
    if key == GIT_HEAD_KEY:
        return "HEAD moved" if now != MISSING else "no longer a git checkout"
    if now.startswith("error:"):
        return f"unreadable now (errno {now[len('error:'):]})"
    if was == MISSING:
        return f"created ({_kind(now)})"
    if now == MISSING:
        return "deleted"
    if _kind(was) != _kind(now):
        return f"replaced ({_kind(was)} -> {_kind(now)})"
    return "modified"


def world_changes(baton: Baton) -> list[dict[str, str]]:
    """What differs between the world the baton recorded (``meta.world``) and the world now.

    Only recorded keys that are still key files (or git HEAD) are compared: a key file
    added by a hand edit was never fingerprinted, so there is nothing to compare it with.
    Each change is ``{"key", "was", "now", "change"}``.
    """
    recorded = baton.meta.world
    if not baton.workdir or not recorded:
        return []
    wanted = set(baton.key_files) | {GIT_HEAD_KEY}
    changes = []
    for key, was in recorded.items():
        if key not in wanted:
            continue
        now = _current(baton.workdir, key)
        if now != was:
            changes.append({"key": key, "was": was, "now": now, "change": describe_change(key, was, now)})
    return changes
