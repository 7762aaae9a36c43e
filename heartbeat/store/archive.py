"""The archive: where ``heartbeat gc`` (:mod:`heartbeat.retention`) moves finished tasks, read back.

``<state_dir>/archive/<UTC time>.jsonl.gz``: one JSON record per archived task (its baton's
text and its ledger events); the ledger keeps one ``archived`` event per task naming the file.
``heartbeat report`` replays archived tasks from here; gc verifies what it wrote with the same
reader.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from heartbeat.baton import Baton, parse_baton
from heartbeat.errors import HeartbeatError, StoreError
from heartbeat.layout import StateLayout
from heartbeat.ledger import Event, EventKind

__all__ = ["RETENTION_KINDS", "ARCHIVE_NAME", "event_from_json", "read_archive", "read_archived"]

RETENTION_KINDS = frozenset({EventKind.ARCHIVED, EventKind.COMPACTED})
"""Ledger event kinds gc writes; ``heartbeat report`` does not replay them."""

ARCHIVE_NAME = re.compile(r"\d{8}T\d{6}\d{6}Z\.jsonl\.gz")
"""An archive file's name, as gc makes it."""

MAX_ARCHIVE_LINE = 64 * 1024 * 1024
"""The longest record read from an archive, in bytes."""


def event_from_json(doc: dict[str, Any]) -> Event:
    """An event as an archive record holds it (:meth:`heartbeat.ledger.Event.to_json`)."""
    return Event(task=str(doc["task"]), kind=str(doc["kind"]), ts=datetime.fromisoformat(doc["ts"]),
                 epoch=int(doc.get("epoch", 0)), revision=int(doc.get("revision", 0)),
                 actor=str(doc.get("actor", "")), data=dict(doc.get("data") or {}), id=int(doc.get("id", 0)))


def read_archive(path: str) -> Iterator[dict[str, Any]]:
    """The records of one archive file, in order; :class:`StoreError` when it is not a whole, regular gzip of JSON lines."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreError(f"cannot open the archive: {exc.strerror}", path=path) from None
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
            raise StoreError("the archive is not a regular file", path=path)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as handle:
                for line in iter(lambda: handle.readline(MAX_ARCHIVE_LINE), b""):
                    yield json.loads(line)
        except (OSError, EOFError, ValueError) as exc:
            raise StoreError(f"the archive is damaged: {exc}", path=path) from None


def read_archived(store: Any) -> dict[str, tuple[Baton | None, list[Event]]]:
    """Archived tasks as the report needs them: the baton (None if it no longer parses) and
    the archived events, in order, of every ``archived`` event in the ledger."""
    state_dir = getattr(store, "state_dir", None)
    if state_dir is None:
        return {}
    marks = store.ledger.events(kinds=[EventKind.ARCHIVED])
    if not marks:
        return {}
    wanted: dict[str, list[Event]] = {}
    for mark in marks:
        wanted.setdefault(str(mark.data.get("archive", "")), []).append(mark)
    records: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name in wanted:
        if not ARCHIVE_NAME.fullmatch(name):
            raise StoreError(f"the ledger names an archive {name!r} that is not an archive file name")
        path = os.path.join(StateLayout(state_dir).archive_dir, name)
        for doc in read_archive(path):
            records[(name, str(doc.get("task")), str(doc.get("baton_sha256")))] = doc
    found: dict[str, tuple[Baton | None, list[Event]]] = {}
    for mark in marks:
        key = (str(mark.data.get("archive", "")), mark.task, str(mark.data.get("baton_sha256", "")))
        rec = records.get(key)
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
