"""The embedded ledgers: SQLite in WAL mode (``<state_dir>/ledger.sqlite3``) and in memory.

Every statement is parameterized: no value from a baton is ever spliced into SQL.
Touches are coalesced, one row per task per minute, so an agent touching every few
seconds for days does not bloat it."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; threading itself costs an agent's write 1 ms
import json
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from heartbeat.model import defaults
from heartbeat.model.errors import StoreError
from heartbeat.model.ledger import Event, EventKind, PendingWrite

__all__ = ["SqliteLedger", "MemoryLedger"]


def _minute(ts: float) -> int:
    return int(ts // defaults.TOUCH_COALESCE)


def _finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _crashed_ids(conn: sqlite3.Connection, task: str, base: str) -> list[int]:
    """The event ids of ``task``'s pending write if it crashed before its rename: the baton a
    writer now finds (``base``) is still the one that write replaced."""
    row = conn.execute("SELECT base, new, ids FROM pending_writes WHERE task = ?", (task,)).fetchone()
    if row is None or row[0] != base or row[1] == base:
        return []
    try:
        ids = json.loads(row[2])
    except ValueError:
        return []
    return [i for i in ids if isinstance(i, int) and not isinstance(i, bool)] if isinstance(ids, list) else []


class _Unreadable(Exception):
    """A ledger row that does not hold an event (said why in the message)."""


def _row_event(row: Sequence[Any]) -> Event:
    """The event of one ``events`` row, or :class:`_Unreadable` when a column is not what it must be."""
    row_id, ts, task, kind, epoch, revision, actor, data = row
    if not _finite_number(ts):
        raise _Unreadable(f"ts is {ts!r:.40}, not a time")
    try:
        when = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        raise _Unreadable(f"ts {ts!r} is out of range") from None
    for name, value, type_ in (("task", task, str), ("kind", kind, str), ("actor", actor, str),
                               ("epoch", epoch, int), ("revision", revision, int), ("data", data, str)):
        if not isinstance(value, type_) or isinstance(value, bool):
            raise _Unreadable(f"{name} is {value!r:.40}, not {'text' if type_ is str else 'an integer'}")
    try:
        payload = json.loads(data)
    except ValueError:
        raise _Unreadable(f"data is not JSON: {data!r:.40}") from None
    if not isinstance(payload, dict):
        raise _Unreadable(f"data is {type(payload).__name__}, not an object")
    return Event(id=row_id, ts=when, task=task, kind=kind, epoch=epoch, revision=revision, actor=actor,
                 data=payload)


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
CREATE TABLE IF NOT EXISTS pending_writes (
    task TEXT PRIMARY KEY,
    base TEXT NOT NULL,
    new TEXT NOT NULL,
    ids TEXT NOT NULL
) WITHOUT ROWID;
"""
_SCHEMA_VERSION = 2
"""``PRAGMA user_version`` once :data:`_SCHEMA` is in place; a ledger behind it is migrated."""


class SqliteLedger:
    """The embedded ledger. Safe to share between threads of one process and between processes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = _thread.allocate_lock()
        self.unreadable: dict[Any, str] = {}
        """Rows skipped because they cannot be read, by id, with why (each is reported once)."""
        self.on_unreadable: Callable[[Any, str], None] | None = None
        """Called once per unreadable row; else one warning line goes to stderr."""

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            fresh = not os.path.exists(self.path)
            try:
                conn = sqlite3.connect(self.path, timeout=defaults.LOCK_TIMEOUT, check_same_thread=False,
                                       isolation_level=None)
                if fresh:
                    os.chmod(self.path, 0o600)
                if conn.execute("PRAGMA user_version").fetchone()[0] < _SCHEMA_VERSION:
                    self._migrate(conn)
                conn.execute("PRAGMA synchronous=NORMAL")
            except (sqlite3.Error, OSError) as exc:
                raise StoreError(f"cannot open the ledger: {exc}", path=self.path) from None
            self._conn = conn
        return self._conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Create or upgrade the schema, one process at a time.

        Several first writes on a fresh state dir race to switch the journal to WAL and to
        create the tables; SQLite answers some of them "database is locked" at once, without
        waiting on its busy timeout. An flock beside the ledger serializes the few processes
        that find the schema behind; everyone else never takes it.
        """
        import fcntl

        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if conn.execute("PRAGMA user_version").fetchone()[0] >= _SCHEMA_VERSION:
                return  # another process did it while this one waited for the lock
            # WAL lets readers (status, report) run while agents write; NORMAL sync in WAL
            # is durable across process crashes, which is what a ledger of a host's agents needs.
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version = {_SCHEMA_VERSION}; COMMIT;")
        finally:
            os.close(fd)

    def append(self, events: Sequence[Event], *, write: PendingWrite | None = None) -> None:
        if not events:
            return
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                if write is not None:
                    crashed = _crashed_ids(conn, write.task, write.base)
                    if crashed:
                        conn.execute(f"DELETE FROM events WHERE id IN ({', '.join('?' for _ in crashed)})", crashed)
                ids = []
                for event in events:
                    if self._append_one(conn, event):
                        ids.append(event.id)
                if write is not None:
                    conn.execute("INSERT OR REPLACE INTO pending_writes (task, base, new, ids) VALUES (?, ?, ?, ?)",
                                 (write.task, write.base, write.new, json.dumps(ids)))
                conn.execute("COMMIT")
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                # Besides SQLite's own errors: text that is not UTF-8, an integer over 64 bits.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"cannot write the ledger: {exc}", path=self.path) from None

    def landed(self, write: PendingWrite) -> None:
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("DELETE FROM pending_writes WHERE task = ? AND new = ?", (write.task, write.new))
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the ledger: {exc}", path=self.path) from None

    def unlanded_ids(self, task: str, base: str) -> set[int]:
        """The ids of ``task``'s pending write whose baton is still ``base`` (see :func:`_crashed_ids`)."""
        if not os.path.exists(self.path):
            return set()
        with self._lock:
            try:
                return set(_crashed_ids(self._connect(), task, base))
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the ledger: {exc}", path=self.path) from None

    def highest_revision(self, task: str, base: str = "") -> int:
        if not os.path.exists(self.path):
            return 0
        with self._lock:
            conn = self._connect()
            try:
                crashed = _crashed_ids(conn, task, base)
                row = conn.execute(
                    "SELECT max(revision) FROM events WHERE task = ? AND typeof(revision) = 'integer' "
                    f"AND id NOT IN ({', '.join('?' for _ in crashed)})", [task, *crashed]).fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the ledger: {exc}", path=self.path) from None
        return int(row[0] or 0)

    def _append_one(self, conn: sqlite3.Connection, event: Event) -> bool:
        """Insert one event (True), or merge a touch into the previous one (False)."""
        ts = event.ts.timestamp()
        data = json.dumps(event.data, ensure_ascii=False, default=str, sort_keys=True)
        if event.kind == EventKind.TOUCHED:
            row = conn.execute(
                "SELECT id, kind, ts FROM events WHERE task = ? ORDER BY id DESC LIMIT 1", (event.task,)
            ).fetchone()
            if row and row[1] == "touched" and _finite_number(row[2]) and _minute(row[2]) == _minute(ts):
                conn.execute(
                    "UPDATE events SET ts = ?, epoch = ?, revision = ?, actor = ?, data = ? WHERE id = ?",
                    (ts, event.epoch, event.revision, event.actor, data, row[0]),
                )
                event.id = row[0]
                return False
        cur = conn.execute(
            "INSERT INTO events (ts, task, kind, epoch, revision, actor, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ts, event.task, event.kind, event.epoch, event.revision, event.actor, data),
        )
        event.id = int(cur.lastrowid or 0)
        return True

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
        events: list[Event] = []
        for row in rows:
            try:
                events.append(_row_event(row))
            except _Unreadable as exc:
                self._report_unreadable(row[0], str(exc))
        return events

    def _report_unreadable(self, row_id: Any, why: str) -> None:
        """A row no reader can use (a hand edit, a bit flip): skipped, and said once per process."""
        if row_id in self.unreadable:
            return
        self.unreadable[row_id] = why
        if self.on_unreadable is not None:
            self.on_unreadable(row_id, why)
        else:
            sys.stderr.write(f"heartbeat: warning: {self.path}: ledger row {row_id} is unreadable ({why}); "
                             "skipped\n")

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

    def append(self, events: Sequence[Event], *, write: PendingWrite | None = None) -> None:
        # The memory store writes a baton and its events at once: no write is ever left pending.
        with self._lock:
            for event in events:
                last = next((e for e in reversed(self._events) if e.task == event.task), None)
                if (
                    event.kind == EventKind.TOUCHED
                    and last is not None
                    and last.kind == EventKind.TOUCHED
                    and _minute(last.ts.timestamp()) == _minute(event.ts.timestamp())
                ):
                    event.id = last.id
                    self._events[self._events.index(last)] = event
                    continue
                event.id = len(self._events) + 1 if not self._events else self._events[-1].id + 1
                self._events.append(event)

    def landed(self, write: PendingWrite) -> None:
        pass

    def highest_revision(self, task: str, base: str = "") -> int:
        with self._lock:
            return max((e.revision for e in self._events if e.task == task), default=0)

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
