"""Fingerprints of the world a baton describes: its key files and the workdir's git HEAD.

A baton records them on every write; ``heartbeat verify`` compares them with the world
as it is now, so a resumed agent learns whether the note still holds before it does
something it cannot undo.
"""

from __future__ import annotations

import hashlib
import os
import stat

from heartbeat import defaults
from heartbeat.errors import UnsafePath

__all__ = ["GIT_HEAD_KEY", "resolve_key_file", "fingerprint", "fingerprint_world", "git_head"]

GIT_HEAD_KEY = ":git-head"
"""The key under ``[meta.world]`` that holds the workdir's git HEAD (no file path starts with ':')."""

MISSING = "missing"


def resolve_key_file(workdir: str, key_file: str) -> str:
    """The absolute path of ``key_file`` under ``workdir``; refuses paths that escape it.

    ``..``, an absolute path outside the workdir and a symlink that points outside it
    are all refused with :class:`UnsafePath`.
    """
    root = os.path.realpath(workdir)
    joined = os.path.normpath(os.path.join(root, key_file))
    if not _within(joined, root):
        raise UnsafePath(f"key file {key_file[:200]!r} is outside the workdir {workdir}", field="key_files")
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
    digest = hashlib.sha256()
    try:
        # O_NONBLOCK: a file swapped for a FIFO between stat and open must not hang us.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"error:{exc.errno}"
    with os.fdopen(fd, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def git_head(workdir: str) -> str | None:
    """The commit the workdir's git HEAD points at, read from ``.git`` without running git."""
    gitdir = os.path.join(workdir, ".git")
    try:
        if os.path.isfile(gitdir):  # a worktree or submodule: "gitdir: <path>"
            with open(gitdir, encoding="utf-8") as handle:
                line = handle.read(4096).strip()
            if not line.startswith("gitdir:"):
                return None
            gitdir = os.path.join(workdir, line[len("gitdir:") :].strip())
        with open(os.path.join(gitdir, "HEAD"), encoding="utf-8") as handle:
            head = handle.read(4096).strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head[4:].strip()
        common = gitdir
        commondir_file = os.path.join(gitdir, "commondir")
        if os.path.isfile(commondir_file):
            with open(commondir_file, encoding="utf-8") as handle:
                common = os.path.join(gitdir, handle.read(4096).strip())
        for base in (gitdir, common):
            ref_path = os.path.join(base, ref)
            if os.path.isfile(ref_path):
                with open(ref_path, encoding="utf-8") as handle:
                    return handle.read(4096).strip() or None
        packed = os.path.join(common, "packed-refs")
        if os.path.isfile(packed):
            with open(packed, encoding="utf-8") as handle:
                for line in handle:
                    parts = line.split()
                    if len(parts) == 2 and parts[1] == ref:
                        return parts[0]
        return f"unborn:{ref}"
    except (OSError, UnicodeDecodeError):
        return None


def fingerprint_world(workdir: str, key_files: list[str]) -> dict[str, str]:
    """Fingerprint every key file (and git HEAD) of a baton; raises :class:`UnsafePath` on escapes."""
    if not workdir:
        return {}
    world = {key: fingerprint(resolve_key_file(workdir, key)) for key in key_files}
    head = git_head(workdir)
    if head:
        world[GIT_HEAD_KEY] = head
    return world
