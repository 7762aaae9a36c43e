"""The ledger in PostgreSQL: events appended in the same transaction as the write they record."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from heartbeat.model.errors import (
    BadInput,
)
from heartbeat.model.ledger import Event, EventKind, PendingWrite
from heartbeat.store.ledger import _minute

if TYPE_CHECKING:
    from heartbeat.store.postgres.store import PostgresStore

__all__ = ["PostgresLedger"]


class PostgresLedger:
    """The ledger as the table ``heartbeat_events``; same coalescing of touches as the SQLite one."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def append(self, events: Sequence[Event], *, write: PendingWrite | None = None) -> None:
        # ``write`` is for stores that append before they rename; here a write and its events
        # commit in one transaction, so there is never a pending write to settle.
        if not events:
            return
        with self._store._conn() as conn, conn.transaction():
            append_events(conn, events)

    def landed(self, write: PendingWrite) -> None:
        pass  # nothing is ever pending: see append

    def highest_revision(self, task: str, base: str = "") -> int:
        with self._store._conn() as conn:
            found = highest_revision(conn, task)
            conn.commit()
        return found

    def fold(self, task: str, ids: Sequence[int], events: Sequence[Event]) -> int:
        """In one transaction: remove ``task``'s rows ``ids`` and append ``events`` (retention's
        summaries). Returns how many rows went; rows of other tasks are never touched."""
        with self._store._conn() as conn, conn.transaction():
            cur = conn.execute("DELETE FROM heartbeat_events WHERE task = %s AND id = ANY(%s)", (task, list(ids)))
            removed = cur.rowcount
            append_events(conn, events)
        return int(removed)

    def count(self) -> int:
        """How many rows the ledger holds."""
        with self._store._conn() as conn:
            row = conn.execute("SELECT count(*) FROM heartbeat_events").fetchone()
            conn.commit()
        return int(row[0] if row else 0)

    def events(
        self, task: str | None = None, *, since: datetime | None = None, kinds: Iterable[str] | None = None
    ) -> list[Event]:
        clauses: list[str] = []
        params: list[object] = []
        if task is not None:
            clauses.append("task = %s")
            params.append(task)
        if since is not None:
            clauses.append("ts >= %s")
            params.append(since)
        kind_list = list(kinds or ())
        if kind_list:
            clauses.append("kind = ANY(%s)")
            params.append(kind_list)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._store._conn() as conn:
            rows = conn.execute(
                f"SELECT id, ts, task, kind, epoch, revision, actor, data FROM heartbeat_events {where} ORDER BY id",
                params,
            ).fetchall()
            conn.commit()
        return [
            Event(id=r[0], ts=r[1].astimezone(UTC), task=r[2], kind=r[3], epoch=r[4], revision=r[5], actor=r[6],
                  data=json.loads(r[7]))
            for r in rows
        ]

    def close(self) -> None:
        pass


def highest_revision(conn: psycopg.Connection[Any], task: str) -> int:
    """The highest revision the ledger recorded for ``task`` (0 if none), on ``conn``."""
    row = conn.execute("SELECT max(revision) FROM heartbeat_events WHERE task = %s", (task,)).fetchone()
    return int(row[0] or 0) if row else 0


def append_events(conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
    """Insert events on ``conn``, inside the caller's transaction."""
    for event in events:
        data = json.dumps(event.data, ensure_ascii=False, default=str, sort_keys=True)
        if "\x00" in event.task + event.kind + event.actor:
            raise BadInput("an event may not hold a NUL character", task=event.task)
        if event.kind == EventKind.TOUCHED:
            row = conn.execute(
                "SELECT id, kind, ts FROM heartbeat_events WHERE task = %s ORDER BY id DESC LIMIT 1", (event.task,)
            ).fetchone()
            if row and row[1] == EventKind.TOUCHED and _minute(row[2].timestamp()) == _minute(event.ts.timestamp()):
                conn.execute(
                    "UPDATE heartbeat_events SET ts = %s, epoch = %s, revision = %s, actor = %s, data = %s WHERE id = %s",
                    (event.ts, event.epoch, event.revision, event.actor, data, row[0]),
                )
                event.id = int(row[0])
                continue
        found = conn.execute(
            "INSERT INTO heartbeat_events (ts, task, kind, epoch, revision, actor, data) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (event.ts, event.task, event.kind, event.epoch, event.revision, event.actor, data),
        ).fetchone()
        event.id = int(found[0]) if found else 0
