"""The archive: where ``heartbeat gc`` (:mod:`heartbeat.ops.retention`) moves finished tasks, read back.

One format for every store: an archive is gzip'd JSON lines, one record per archived task
(:func:`make_record`: its baton's text, the text's sha256 and every ledger event), under a
name made of gc's UTC time (:data:`ARCHIVE_NAME`); the ledger keeps one ``archived`` event per
task naming the archive. Where the archive lives is the store's (:class:`~heartbeat.store.base.Archiving`):

- the file store: ``<state_dir>/archive/<name>``, written to a temp name, fsynced, renamed,
  its directory fsynced (the functions below, used by :mod:`heartbeat.store.files`);
- the PostgreSQL store: one row of ``heartbeat_archive`` (name, the same gzip bytes):
  :mod:`heartbeat.store.postgres.archive`.

``heartbeat report`` replays archived tasks through :func:`read_archived`; gc verifies what it
wrote with the same reader (:func:`records_of`) before it retires anything.

The file store's epoch files are listed and removed here too, through a directory descriptor
opened with ``O_NOFOLLOW``, with ``lstat``/``unlink`` only: a symlink or FIFO planted in
``logs/`` is removed as a name, never followed or opened; anything not named like an epoch's
file is left alone.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import io
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import IO, Any

from heartbeat.model.baton import Baton, parse_baton
from heartbeat.model.errors import GcBusy, HeartbeatError, StoreError, UnsafePath
from heartbeat.model.ledger import Event, EventKind
from heartbeat.store.base import Archiving
from heartbeat.system.safefile import open_regular, read_fd, write_file_atomic
from heartbeat.system.world import sha256

__all__ = ["RETENTION_KINDS", "ARCHIVE_NAME", "EPOCH_FILE", "archive_name", "make_record", "pack", "same_history",
           "event_from_json", "records_of", "read_archive", "read_archived", "resolve_marks"]

RETENTION_KINDS = frozenset({EventKind.ARCHIVED, EventKind.COMPACTED})
"""Ledger event kinds gc writes; ``heartbeat report`` does not replay them."""

ARCHIVE_NAME = re.compile(r"\d{8}T\d{6}\d{6}Z\.jsonl\.gz")
"""An archive's name, as gc makes it (:func:`archive_name`)."""

MAX_ARCHIVE_LINE = 64 * 1024 * 1024
"""The longest record read from an archive, in bytes."""

EPOCH_FILE = re.compile(r"(\d{1,18})\.(log|log\.1|brief\.md|exit|pid|pulse|lease)")
"""The names of an epoch's files under ``logs/<id>/``; nothing else there is ever removed."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- the format, every store's ------------------------------------------------------------


def archive_name(now: datetime) -> str:
    """The name of the archive a gc at ``now`` writes."""
    return f"{now.strftime('%Y%m%dT%H%M%S%f')}Z.jsonl.gz"


def make_record(task: str, raw: bytes, events: list[Event], now: datetime) -> dict[str, Any]:
    """One archived task: its baton's text and sha256 and its events (``archived`` marks aside)."""
    return {"task": task, "archived_at": now.isoformat(), "baton": raw.decode("utf-8"),
            "baton_sha256": sha256(raw).hexdigest(), "events": [e.to_json() for e in events]}


def pack(records: list[dict[str, Any]]) -> bytes:
    """The bytes of an archive holding ``records``: gzip'd JSON lines (``zcat | jq`` reads it)."""
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n" for r in records]
    return gzip.compress(b"".join(lines), compresslevel=6, mtime=0)


def same_history(found: list[Event], expected: list[Event]) -> bool:
    """Whether a task's ledger (``archived`` marks aside) is still the one its record holds."""
    return [(e.id, e.ts) for e in found] == [(e.id, e.ts) for e in expected]


def event_from_json(doc: dict[str, Any]) -> Event:
    """An event as an archive record holds it (:meth:`heartbeat.model.ledger.Event.to_json`)."""
    return Event(task=str(doc["task"]), kind=str(doc["kind"]), ts=datetime.fromisoformat(doc["ts"]),
                 epoch=int(doc.get("epoch", 0)), revision=int(doc.get("revision", 0)),
                 actor=str(doc.get("actor", "")), data=dict(doc.get("data") or {}), id=int(doc.get("id", 0)))


def records_of(raw: IO[bytes], where: str) -> Iterator[dict[str, Any]]:
    """The records of one archive read from ``raw``; :class:`StoreError` naming ``where`` when it
    is not a whole gzip of JSON lines."""
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as handle:
            for line in iter(lambda: handle.readline(MAX_ARCHIVE_LINE), b""):
                yield json.loads(line)
    except (OSError, EOFError, ValueError) as exc:
        raise StoreError(f"the archive is damaged: {exc}", path=where) from None


def records_in(data: bytes, where: str) -> list[dict[str, Any]]:
    """:func:`records_of` an archive held in memory (a database row)."""
    return list(records_of(io.BytesIO(data), where))


def resolve_marks(marks: list[Event], records: Callable[[str], Iterable[dict[str, Any]]]
                  ) -> dict[str, tuple[Baton | None, list[Event]]]:
    """Archived tasks as the report needs them, from the ledger's ``archived`` marks (in order)
    and ``records(name)``, the records of the archive so named; a mark whose record is missing,
    or that names no archive, is an error, never a task silently counted less."""
    wanted: dict[str, list[Event]] = {}
    for mark in marks:
        wanted.setdefault(str(mark.data.get("archive", "")), []).append(mark)
    found_records: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name in wanted:
        if not ARCHIVE_NAME.fullmatch(name):
            raise StoreError(f"the ledger names an archive {name!r} that is not an archive file name")
        for doc in records(name):
            found_records[(name, str(doc.get("task")), str(doc.get("baton_sha256")))] = doc
    found: dict[str, tuple[Baton | None, list[Event]]] = {}
    for mark in marks:
        key = (str(mark.data.get("archive", "")), mark.task, str(mark.data.get("baton_sha256", "")))
        rec = found_records.get(key)
        if rec is None:
            raise StoreError(f"the archive {key[0]} has no record of task {mark.task} that the ledger says it holds")
        events = [event_from_json(doc) for doc in rec.get("events", [])]
        try:
            baton: Baton | None = parse_baton(str(rec["baton"]), path=f"{key[0]}:{mark.task}",
                                              expected_id=mark.task)
        except HeartbeatError:
            baton = None
        earlier = found.get(mark.task, (None, []))[1]
        found[mark.task] = (baton, earlier + events)
    return found


def read_archived(store: Any) -> dict[str, tuple[Baton | None, list[Event]]]:
    """Archived tasks as the report needs them (:meth:`~heartbeat.store.base.Archiving.archived_tasks`);
    a store that archives nothing has none."""
    return store.archived_tasks() if isinstance(store, Archiving) else {}


# -- the file store's archive files and epoch files ----------------------------------------


def read_archive(path: str) -> Iterator[dict[str, Any]]:
    """The records of one archive file, in order; :class:`StoreError` when it is not a whole, regular gzip of JSON lines."""
    try:
        fd = open_regular(path)
    except UnsafePath as exc:
        raise StoreError(f"the archive {exc.message}", path=path) from None
    except OSError as exc:
        raise StoreError(f"cannot open the archive: {exc.strerror}", path=path) from None
    with os.fdopen(fd, "rb") as raw:
        yield from records_of(raw, path)


def write_archive_file(archive_dir: str, name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
    """Write ``<archive_dir>/<name>`` durably (temp name, fsync, rename, fsync of the directory)
    and read it back: every record must be exactly what was meant to go in."""
    path = os.path.join(archive_dir, name)
    if os.path.lexists(path):
        raise StoreError("an archive of this instant exists already (run gc again)", path=path)
    try:
        write_file_atomic(path, pack(records), fsync_dir=True, follow=False)
    except OSError as exc:
        raise StoreError(f"cannot write the archive: {exc.strerror}; nothing was archived", path=path) from None
    if list(read_archive(path)) != records:
        raise StoreError("the archive read back differs from what was written; nothing was archived", path=path)
    return path, os.stat(path, follow_symlinks=False).st_size


@contextmanager
def file_gc_lock(path: str) -> Iterator[None]:
    """One gc at a time per state dir (the daemon's job and ``heartbeat gc``): a flock on ``path``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot open the gc lock: {exc.strerror}", path=path) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GcBusy("another gc is running on this state dir", path=path) from None
        yield
    finally:
        os.close(fd)


def read_baton_bytes(path: str) -> bytes | None:
    """A baton file's bytes (never through a symlink, never a FIFO); None when there is no regular file."""
    try:
        fd = open_regular(path)
    except (OSError, UnsafePath):
        return None
    try:
        return read_fd(fd, os.fstat(fd).st_size + 1)  # all of it, also what was appended since the fstat
    finally:
        os.close(fd)


def _open_task_dir(logs_dir: str, task_id: str) -> int | None:
    """A descriptor on ``logs/<id>``, a real directory reached through no symlink, or None."""
    try:
        parent = os.open(logs_dir, _DIR_FLAGS)
    except OSError:
        return None  # missing, a symlink (ELOOP), not a directory: nothing of ours to prune
    try:
        return os.open(task_id, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)


def _epoch_files(fd: int) -> list[tuple[int, str, int]]:
    """``(epoch, name, bytes)`` of the entries named like an epoch's files; sizes from lstat."""
    found = []
    for name in os.listdir(fd):
        match = EPOCH_FILE.fullmatch(name)
        if match is None:
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        found.append((int(match.group(1)), name, st.st_size if stat.S_ISREG(st.st_mode) else 0))
    return found


def _unlink_at(fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EISDIR, errno.EPERM, errno.EACCES):
            return False
        raise StoreError(f"cannot remove {name}: {exc.strerror}") from None
    return True


def epoch_files(logs_dir: str, task_id: str) -> list[tuple[int, str, int]]:
    """``(epoch, path, bytes)`` of ``logs/<id>``'s epoch files (none when it is no real directory)."""
    fd = _open_task_dir(logs_dir, task_id)
    if fd is None:
        return []
    try:
        return [(epoch, os.path.join(logs_dir, task_id, name), size) for epoch, name, size in _epoch_files(fd)]
    finally:
        os.close(fd)


def remove_epoch_files(logs_dir: str, task_id: str, paths: list[str] | None) -> list[tuple[str, int]]:
    """Remove these epoch files of ``logs/<id>`` (all of them when ``paths`` is None, and then the
    directory too when that leaves it empty); ``(path, bytes)`` of those that went."""
    fd = _open_task_dir(logs_dir, task_id)
    if fd is None:
        return []
    wanted = None if paths is None else {os.path.basename(p) for p in paths}
    gone = []
    try:
        for _, name, size in _epoch_files(fd):
            if (wanted is None or name in wanted) and _unlink_at(fd, name):
                gone.append((os.path.join(logs_dir, task_id, name), size))
        empty = paths is None and not os.listdir(fd)
    finally:
        os.close(fd)
    if empty:
        try:
            parent = os.open(logs_dir, _DIR_FLAGS)
        except OSError:
            return gone
        try:
            os.rmdir(task_id, dir_fd=parent)
        except OSError:
            pass
        finally:
            os.close(parent)
    return gone
