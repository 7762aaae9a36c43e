"""Fingerprints of the world a baton describes: its key files and the workdir's git HEAD.

A baton records them whenever its content is written; ``heartbeat verify`` compares
them with the world as it is now, so a resumed agent learns whether the note still holds
before it does something it cannot undo. Verify's checks, in order: the caller's epoch
has been superseded (5), the task is not active (4), the world changed (3), else fresh (0).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat import defaults
from heartbeat.errors import EXIT_CONFLICT, EXIT_NOT_ACTIVE, EXIT_OK, EXIT_STALE, UnsafePath
from heartbeat.safefile import open_regular, read_regular

try:  # hashlib's own built-in SHA-256: importing hashlib loads OpenSSL, a third of an interpreter start
    from _sha256 import sha256 as _sha256  # Python 3.11
except ImportError:
    try:
        from _sha2 import sha256 as _sha256  # Python 3.12+
    except ImportError:
        from hashlib import sha256 as _sha256

if TYPE_CHECKING:
    from heartbeat.baton import Baton
    from heartbeat.config import CommandConfig
    from heartbeat.store.base import Store

__all__ = [
    "GIT_HEAD_KEY",
    "MISSING",
    "resolve_key_file",
    "fingerprint",
    "fingerprint_world",
    "git_head",
    "describe_change",
    "world_changes",
    "VerifyResult",
    "verify",
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


@dataclass
class VerifyResult:
    """What ``heartbeat verify`` found. ``code``: 0 fresh, 3 stale, 4 not active, 5 superseded."""

    task_id: str
    code: int
    status: str  # fresh | stale | blocked | superseded (the ``verified`` event's ``result``)
    message: str
    changed: list[dict[str, str]] = field(default_factory=list)
    task_status: str = ""
    epoch: int = 0
    caller_epoch: int | None = None
    revision: int = 0
    checked: list[str] = field(default_factory=list)
    verified_at: datetime | None = None
    broken: list[dict[str, Any]] = field(default_factory=list)
    """Upstream guarantees that no longer hold (status ``broken``, exit 3)."""
    actions: list[str] = field(default_factory=list)
    """What the edge's ``on_broken`` policy did about them."""
    unchecked: list[str] = field(default_factory=list)
    """Upstream guarantees whose check this config does not define."""

    @property
    def ok(self) -> bool:
        return self.code == EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.task_id,
            "code": self.code,
            "result": self.status,
            "message": self.message,
            "changed": [dict(c) for c in self.changed],
            "task_status": self.task_status,
            "epoch": self.epoch,
            "caller_epoch": self.caller_epoch,
            "revision": self.revision,
            "checked": list(self.checked),
            "verified_at": self.verified_at.isoformat() if self.verified_at else None,
            "broken": [dict(b) for b in self.broken],
            "actions": list(self.actions),
            "unchecked": list(self.unchecked),
        }

    def render_text(self) -> str:
        lines = [f"{self.status}: {self.message}"]
        for b in self.broken:
            lines.append(f"  upstream {b['upstream']}: guarantee {b['guarantee']!r} broken "
                         f"(check {b['check']} {b['detail']})")
        for action in self.actions:
            lines.append(f"  policy: {action}")
        for item in self.unchecked:
            lines.append(f"  not checked: {item}")
        for c in self.changed:
            lines.append(f"  {c['key']}: {c['change']} ({_short(c['was'])} -> {_short(c['now'])})")
        return "\n".join(lines)


def _short(value: str) -> str:
    if value.startswith("sha256:"):
        return value[:19]
    return value if len(value) <= 60 else value[:57] + "..."


def verify(
    store: Store,
    task_id: str,
    *,
    epoch: int | None = None,
    actor: str = "",
    now: datetime | None = None,
    record: bool = True,
    checks: Mapping[str, CommandConfig] | None = None,
) -> VerifyResult:
    """Does the baton still hold for a caller at ``epoch``? Records a ``verified`` event.

    Superseded (5) is checked before not active (4), before broken and stale (3): an
    agent whose epoch has moved on must stop whatever the world looks like. A task with
    upstreams (``after``) also re-runs their guarantees (``checks``: the config's
    ``[checks.NAME]``, None reads the config) and compares their key files with the
    fingerprints of their packages; a broken guarantee triggers the edge's ``on_broken``
    policy when ``record`` is set.
    """
    from heartbeat.baton import Status
    from heartbeat.ledger import Event
    from heartbeat.timeparse import utcnow

    now = now or utcnow()
    baton = store.load(task_id)
    meta = baton.meta
    checked = sorted(k for k in meta.world if k in set(baton.key_files) | {GIT_HEAD_KEY})
    result = VerifyResult(task_id, EXIT_OK, "fresh", "", task_status=meta.status.value, epoch=meta.epoch,
                          caller_epoch=epoch, revision=meta.revision, checked=checked, verified_at=now)
    if epoch is not None and epoch != meta.epoch:
        result.code, result.status = EXIT_CONFLICT, "superseded"
        relation = "has been superseded by" if epoch < meta.epoch else "is ahead of"
        result.message = (f"{task_id}: your epoch {epoch} {relation} the task's epoch {meta.epoch}: "
                          "another agent holds this task; stop and do not write")
    elif meta.status is not Status.ACTIVE:
        result.code = EXIT_NOT_ACTIVE
        if meta.status is Status.BLOCKED:
            result.status = "blocked"
            gate = meta.gate.spec() if meta.gate else "human"
            result.message = f"{task_id} is blocked on {' '.join(baton.blocked_on.split())!r} (gate {gate})"
        else:  # done, failed, escalated, snoozed, paused: not "blocked", which would send a reader to a gate
            result.status = "not_active"
            result.message = f"{task_id} is {meta.status.value}, not active: nothing to act on under this baton"
    else:
        result.changed = world_changes(baton)
        if baton.after:
            from heartbeat import handoff

            packages = handoff.load_packages(store, baton)
            if checks is None and any(g.get("check") for p in packages for g in p.get("guarantees") or []
                                      if isinstance(g, dict)):
                checks = handoff.configured_checks()
            changed, result.broken, result.unchecked = handoff.check_upstreams(packages, checks or {})
            result.changed.extend(changed)
        if result.broken:
            result.code, result.status = EXIT_STALE, "broken"
            names = ", ".join(sorted({b["upstream"] for b in result.broken}))
            result.message = (f"{task_id}: {len(result.broken)} upstream guarantee(s) broken ({names}): "
                              "do not build on it; the edge's policy applies")
            if record:
                result.actions = handoff.apply_broken(store, baton, result.broken, actor=actor, now=now)
        elif result.changed:
            result.code, result.status = EXIT_STALE, "stale"
            result.message = (f"{task_id}: the world changed since the baton was written (revision "
                              f"{meta.revision}): {len(result.changed)} change(s); re-read before acting")
        else:
            what = f"{len(checked)} fingerprint(s)" if checked else "nothing fingerprinted"
            result.message = f"{task_id} is active at epoch {meta.epoch} and the world matches the baton ({what})"
    if record:
        store.record([Event(task=task_id, kind="verified", ts=now, epoch=epoch if epoch is not None else meta.epoch,
                            revision=meta.revision, actor=actor,
                            data={"result": result.status, "changed": [c["key"] for c in result.changed],
                                  **({"broken": [b["upstream"] for b in result.broken]} if result.broken else {})})])
    return result
