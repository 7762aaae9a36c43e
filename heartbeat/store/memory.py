"""A store in memory, for tests and ``--dry-run``: the same contract as the file store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import datetime

from heartbeat.model.baton import Baton, check_id
from heartbeat.model.errors import AlreadyExists, NotFound
from heartbeat.model.ledger import Event, EventKind, Ledger
from heartbeat.store.base import (
    Edit,
    Entry,
    Unwatch,
    Watching,
    check_fence,
    created_data,
    finish_edit,
    now_or,
    start_create,
)
from heartbeat.store.ledger import MemoryLedger

__all__ = ["MemoryStore"]


class MemoryStore:
    """Batons in a dict. Thread-safe; world fingerprints are not taken (there are no files)."""

    def __init__(self) -> None:
        self.ledger: Ledger = MemoryLedger()
        self._batons: dict[str, Baton] = {}
        self._lock = threading.RLock()
        self._watchers: list[Callable[[str | None], None]] = []
        self.scan_unchanged = False
        """Always False: a scan copies every baton, so there is no cheaper quiet pass to allow."""
        self.reads = 0
        """Always 0: a memory store parses nothing (its scans copy batons already parsed)."""

    def create(self, baton: Baton, *, actor: str = "", now: datetime | None = None) -> Baton:
        task_id = check_id(baton.meta.id)
        now = now_or(now)
        with self._lock:
            if task_id in self._batons:
                raise AlreadyExists("a task with this id exists already", task=task_id)
            new = start_create(baton, now, world=False)
            new.meta.revision = 1
            self.ledger.append([Event(task=task_id, kind=EventKind.CREATED, ts=now, actor=actor, epoch=new.meta.epoch,
                                      revision=1, data=created_data(new))])
            self._batons[task_id] = new
        self._changed(task_id)
        return new.copy()

    def load(self, task_id: str) -> Baton:
        check_id(task_id)
        with self._lock:
            if task_id not in self._batons:
                raise NotFound("no such task", task=task_id)
            return self._batons[task_id].copy()

    @contextmanager
    def edit(
        self,
        task_id: str,
        *,
        expect_revision: int | None = None,
        epoch: int | None = None,
        actor: str = "",
        touch: bool = False,
        now: datetime | None = None,
        links: bool = False,
    ) -> Iterator[Edit]:
        with self._lock:  # one lock over every baton: ``links`` needs no other
            old = self.load(task_id)
            check_fence(old, expect_revision=expect_revision, epoch=epoch)
            ed = Edit(old=old, baton=old.copy(), now=now_or(now), actor=actor, touch=touch, reader=self.load)
            yield ed
            if ed.cancelled:
                return
            events = finish_edit(ed, world=False)
            self.ledger.append(events)
            self._batons[task_id] = ed.baton.copy()
        self._changed(task_id)

    def scan(self, only: Collection[str] | None = None) -> list[Entry]:
        """Every baton (``only`` is ignored: there is nothing to stat)."""
        with self._lock:
            return [Entry(id=i, baton=b.copy()) for i, b in sorted(self._batons.items())]

    def put_text(self, task_id: str, text: str) -> bool:
        """Store a baton parsed from ``text`` unless the id is taken (import); True when stored."""
        from heartbeat.model.baton import parse_baton

        baton = parse_baton(text, path=task_id, expected_id=check_id(task_id))
        with self._lock:
            if task_id in self._batons:
                return False
            self._batons[task_id] = baton
        self._changed(task_id)
        return True

    def record(self, events: list[Event]) -> None:
        self.ledger.append(events)

    def watch(self, callback: Callable[[str | None], None]) -> Unwatch:
        """Call ``callback(task_id)`` after each write, in the writer's thread; returns ``stop``."""
        with self._lock:
            self._watchers.append(callback)

        def stop_watching(timeout: float = 5.0) -> None:
            with self._lock:
                if callback in self._watchers:
                    self._watchers.remove(callback)

        return Watching(stop_watching)

    def _changed(self, task_id: str) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for callback in watchers:
            callback(task_id)

    def close(self) -> None:
        pass
