"""The ledger: an append-only record of every write, dispatch, exit, block and unblock.

The embedded ledger is an SQLite database in WAL mode (``<state_dir>/ledger.sqlite3``).
Every statement is parameterized: no value from a baton is ever spliced into SQL.
Touches are coalesced, one row per task per minute, so an agent touching every few
seconds for days does not bloat it.
"""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; threading itself costs an agent's write 1 ms
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from heartbeat import defaults
from heartbeat.errors import StoreError

__all__ = ["Event", "Ledger", "SqliteLedger", "MemoryLedger"]


@dataclass
class Event:
    """One thing that happened to a task."""

    task: str
    kind: str
    ts: datetime
    epoch: int = 0
    revision: int = 0
    actor: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    id: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts.isoformat(),
            "task": self.task,
            "kind": self.kind,
            "epoch": self.epoch,
            "revision": self.revision,
            "actor": self.actor,
            "data": self.data,
        }


class Ledger(Protocol):
    """Where events go. Implementations must keep events in append order (ids increase)."""

    def append(self, events: Sequence[Event], *, supersede: tuple[str, int] | None = None) -> None:
        """Record events durably, in order; a ``touched`` event may be merged into the
        task's previous touch of the same minute instead of adding a row.

        ``supersede=(task, revision)`` first removes that task's events of ``revision`` and
        later. The store appends a write's events *before* it renames the baton into place,
        so a writer killed in between leaves events for a revision that never landed; the
        next write of that revision (made under the baton's lock, so nothing else can have
        written it) replaces them. Readers never see two histories of one revision.
        """

    def events(
        self, task: str | None = None, *, since: datetime | None = None, kinds: Iterable[str] | None = None
    ) -> list[Event]:
        """Events in append order, optionally for one task, since a time, of some kinds."""

    def close(self) -> None:
        """Release resources; the ledger may be reopened by a new instance."""


def _minute(ts: float) -> int:
    return int(ts // defaults.TOUCH_COALESCE)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    task TEXT NOT NULL,
    kind TEXT NOT NULL,
    epoch INTEGER NOT NULL DEFAULT 0,
    revision INTEGER NOT NULL DEFAULT 0,
    actor TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_task ON events (task, id);
CREATE INDEX IF NOT EXISTS events_task_revision ON events (task, revision);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
"""


class SqliteLedger:
    """The embedded ledger. Safe to share between threads of one process and between processes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = _thread.allocate_lock()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            fresh = not os.path.exists(self.path)
            try:
                conn = sqlite3.connect(self.path, timeout=defaults.LOCK_TIMEOUT, check_same_thread=False,
                                       isolation_level=None)
                if fresh:
                    os.chmod(self.path, 0o600)
                # WAL lets readers (status, report) run while agents write; NORMAL sync in WAL
                # is durable across process crashes, which is what a ledger of a host's agents needs.
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                if fresh or not conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='events'"
                ).fetchone():
                    conn.executescript(_SCHEMA)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the ledger: {exc}", path=self.path) from None
            self._conn = conn
        return self._conn

    def append(self, events: Sequence[Event], *, supersede: tuple[str, int] | None = None) -> None:
        if not events:
            return
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                if supersede is not None:
                    conn.execute("DELETE FROM events WHERE task = ? AND revision >= ?", supersede)
                for event in events:
                    self._append_one(conn, event)
                conn.execute("COMMIT")
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                # Besides SQLite's own errors: text that is not UTF-8, an integer over 64 bits.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"cannot write the ledger: {exc}", path=self.path) from None

    def _append_one(self, conn: sqlite3.Connection, event: Event) -> None:
        ts = event.ts.timestamp()
        data = json.dumps(event.data, ensure_ascii=False, default=str, sort_keys=True)
        if event.kind == "touched":
            row = conn.execute(
                "SELECT id, kind, ts FROM events WHERE task = ? ORDER BY id DESC LIMIT 1", (event.task,)
            ).fetchone()
            if row and row[1] == "touched" and _minute(row[2]) == _minute(ts):
                conn.execute(
                    "UPDATE events SET ts = ?, epoch = ?, revision = ?, actor = ?, data = ? WHERE id = ?",
                    (ts, event.epoch, event.revision, event.actor, data, row[0]),
                )
                event.id = row[0]
                return
        cur = conn.execute(
            "INSERT INTO events (ts, task, kind, epoch, revision, actor, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ts, event.task, event.kind, event.epoch, event.revision, event.actor, data),
        )
        event.id = int(cur.lastrowid or 0)

    def events(
        self, task: str | None = None, *, since: datetime | None = None, kinds: Iterable[str] | None = None
    ) -> list[Event]:
        if not os.path.exists(self.path):
            return []
        clauses: list[str] = []
        params: list[object] = []
        if task is not None:
            clauses.append("task = ?")
            params.append(task)
        if since is not None:
            clauses.append("ts >= ?")
            params.append(since.timestamp())
        kind_list = list(kinds or ())
        if kind_list:
            clauses.append(f"kind IN ({', '.join('?' for _ in kind_list)})")
            params.extend(kind_list)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            conn = self._connect()
            try:
                rows = conn.execute(
                    f"SELECT id, ts, task, kind, epoch, revision, actor, data FROM events {where} ORDER BY id",
                    params,
                ).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the ledger: {exc}", path=self.path) from None
        return [
            Event(
                id=r[0],
                ts=datetime.fromtimestamp(r[1], UTC),
                task=r[2],
                kind=r[3],
                epoch=r[4],
                revision=r[5],
                actor=r[6],
                data=json.loads(r[7]),
            )
            for r in rows
        ]

    def fold(self, task: str, ids: Sequence[int], events: Sequence[Event]) -> int:
        """In one transaction: remove ``task``'s rows ``ids`` and append ``events`` (retention's
        summaries). Returns how many rows went; rows of other tasks are never touched."""
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                removed = 0
                for start in range(0, len(ids), 500):
                    chunk = list(ids[start:start + 500])
                    cur = conn.execute(
                        f"DELETE FROM events WHERE task = ? AND id IN ({', '.join('?' for _ in chunk)})",
                        [task, *chunk],
                    )
                    removed += cur.rowcount
                for event in events:
                    self._append_one(conn, event)
                conn.execute("COMMIT")
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"cannot write the ledger: {exc}", path=self.path) from None
        return removed

    def count(self) -> int:
        """How many rows the ledger holds."""
        if not os.path.exists(self.path):
            return 0
        with self._lock:
            try:
                return int(self._connect().execute("SELECT COUNT(*) FROM events").fetchone()[0])
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the ledger: {exc}", path=self.path) from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class MemoryLedger:
    """A ledger in a list, for tests and ``--dry-run``; same coalescing as the SQLite one."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._lock = _thread.allocate_lock()

    def append(self, events: Sequence[Event], *, supersede: tuple[str, int] | None = None) -> None:
        with self._lock:
            if supersede is not None:
                task, revision = supersede
                self._events = [e for e in self._events if not (e.task == task and e.revision >= revision)]
            for event in events:
                last = next((e for e in reversed(self._events) if e.task == event.task), None)
                if (
                    event.kind == "touched"
                    and last is not None
                    and last.kind == "touched"
                    and _minute(last.ts.timestamp()) == _minute(event.ts.timestamp())
                ):
                    event.id = last.id
                    self._events[self._events.index(last)] = event
                    continue
                event.id = len(self._events) + 1 if not self._events else self._events[-1].id + 1
                self._events.append(event)

    def events(
        self, task: str | None = None, *, since: datetime | None = None, kinds: Iterable[str] | None = None
    ) -> list[Event]:
        wanted = set(kinds or ())
        with self._lock:
            return [
                e
                for e in self._events
                if (task is None or e.task == task)
                and (since is None or e.ts >= since)
                and (not wanted or e.kind in wanted)
            ]

    def fold(self, task: str, ids: Sequence[int], events: Sequence[Event]) -> int:
        """As :meth:`SqliteLedger.fold`."""
        gone = set(ids)
        with self._lock:
            before = len(self._events)
            self._events = [e for e in self._events if not (e.task == task and e.id in gone)]
            removed = before - len(self._events)
            for event in events:
                event.id = (self._events[-1].id if self._events else 0) + 1
                self._events.append(event)
        return removed

    def count(self) -> int:
        with self._lock:
            return len(self._events)

    def close(self) -> None:
        pass
