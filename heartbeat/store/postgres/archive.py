"""Retention on PostgreSQL: the :class:`~heartbeat.store.base.Archiving` part of the PostgreSQL store.

:mod:`heartbeat.ops.retention` decides what goes; this moves it, with the file store's archive
format (:mod:`heartbeat.store.archive`: gzip'd JSON lines, one record per task):

- **An archive is one row of ``heartbeat_archive``** (schema version 3): its name (gc's UTC
  time, as the file store names its files), how many tasks it holds, and the gzip bytes
  (stored ``EXTERNAL``: already compressed, TOAST does not try again). Written in its own
  transaction and read back, record by record, before anything is retired; never rewritten.
- **Retiring a task is one transaction**: lock its baton row (``FOR UPDATE``), check its body
  is byte-identical and its events (``archived`` marks aside) exactly the archived ones,
  delete those rows, insert the one ``archived`` event (with the per-label counts the metrics
  keep counting), delete the baton row, ``NOTIFY``. A killed gc leaves all of it or none; a
  task revived, written or retired by another gc meanwhile is skipped and its record ignored.
- **One gc at a time across the fleet**: :meth:`PgArchive.gc_lock` holds a session-level
  advisory lock on a connection of its own for the whole run (a run spans many transactions,
  so a transaction-scoped lock cannot cover it; the connection's end, a killed process or a
  lost host, releases it). Another gc, on any host, gets :class:`~heartbeat.model.errors.GcBusy`;
  the daemon logs ``gc_skipped`` and tries at its next interval. Even without the lock no task
  is archived twice: the second retire finds the row gone or changed.
- **Then ``VACUUM (ANALYZE)``** of the events and batons tables (on the lock's connection, no
  statement timeout, never ``FULL``: writers go on): the deleted rows' space is reusable at
  once, so the tables stop growing instead of waiting for autovacuum.

Agents' logs on PostgreSQL live in each host's state dir, not in the database: gc here
archives and folds the database's rows and leaves files alone (:meth:`PgArchive.task_files`
is empty).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC
from typing import Any

import psycopg

from heartbeat.model.baton import Baton
from heartbeat.model.errors import GcBusy, StoreError
from heartbeat.model.ledger import Event, EventKind
from heartbeat.store.archive import pack, records_in, resolve_marks

__all__ = ["GC_LOCK", "MIGRATION", "PgArchive"]

GC_LOCK = 0x68620010
"""pg_try_advisory_lock key (one bigint): one gc at a time on a database, whichever host runs it."""

MIGRATION: tuple[str, ...] = (
    """CREATE TABLE heartbeat_archive (
        name text PRIMARY KEY,
        created_at timestamptz NOT NULL DEFAULT now(),
        tasks integer NOT NULL,
        body bytea NOT NULL
    )""",
    "ALTER TABLE heartbeat_archive ALTER COLUMN body SET STORAGE EXTERNAL",
)
"""The statements of the schema version that adds the archive table (postgres.MIGRATIONS)."""

Conn = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


class PgArchive:
    """Archiving for :class:`~heartbeat.store.postgres.store.PostgresStore`: ``conn()`` a pooled connection
    (errors as one-line StoreError), ``direct()`` a new configured autocommit connection,
    ``label`` the database as messages name it, ``channel`` the NOTIFY channel of baton writes."""

    def __init__(self, conn: Conn, direct: Callable[[], psycopg.Connection[Any]], label: str, channel: str) -> None:
        self._conn = conn
        self._direct = direct
        self.label = label
        self.channel = channel

    @contextmanager
    def gc_lock(self, *, dry_run: bool = False) -> Iterator[None]:
        if dry_run:
            yield
            return
        conn = self._direct()
        try:
            try:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (GC_LOCK,)).fetchone()
            except psycopg.Error as exc:
                raise StoreError(f"cannot take the gc lock on {self.label}: {' '.join(str(exc).split())}") from None
            if not row or not row[0]:
                raise GcBusy(f"another gc is running on the database {self.label} (another host's daemon, "
                             "or `heartbeat gc`)")
            yield
            self._vacuum(conn)
        finally:
            conn.close()

    def _vacuum(self, conn: psycopg.Connection[Any]) -> None:
        """Make the deleted rows' space reusable now; a VACUUM that fails (not the tables' owner,
        cancelled) leaves it to autovacuum and takes nothing back."""
        try:
            conn.execute("SET statement_timeout = 0")
            conn.execute("VACUUM (ANALYZE) heartbeat_events, heartbeat_batons")
        except psycopg.Error:
            pass

    def write_archive(self, name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
        """Insert the archive row, then read it back and compare every record."""
        data = pack(records)
        where = f"{self.label}:heartbeat_archive/{name}"
        with self._conn() as conn, conn.transaction():
            cur = conn.execute("INSERT INTO heartbeat_archive (name, tasks, body) VALUES (%s, %s, %s) "
                               "ON CONFLICT (name) DO NOTHING", (name, len(records), data))
            if cur.rowcount != 1:
                raise StoreError("an archive of this instant exists already (run gc again)", path=where)
        with self._conn() as conn:
            row = conn.execute("SELECT body FROM heartbeat_archive WHERE name = %s", (name,)).fetchone()
            conn.commit()
        if row is None or records_in(bytes(row[0]), where) != records:
            raise StoreError("the archive read back differs from what was written; nothing was archived", path=where)
        return where, len(data)

    def retire(self, task_id: str, raw: bytes, events: list[Event], summary: Event) -> tuple[str, int]:
        """One transaction (see the module doc); ``(why not, 0)``: no files here."""
        with self._conn() as conn, conn.transaction():
            row = conn.execute("SELECT body FROM heartbeat_batons WHERE id = %s FOR UPDATE", (task_id,)).fetchone()
            if row is None:
                return "the task is gone (archived by another gc?)", 0
            if str(row[0]).encode("utf-8") != raw:
                return "the baton changed while it was being archived (revived?)", 0
            found = conn.execute("SELECT id, ts FROM heartbeat_events WHERE task = %s AND kind <> %s ORDER BY id",
                                 (task_id, EventKind.ARCHIVED.value)).fetchall()
            if [(int(r[0]), r[1].astimezone(UTC)) for r in found] != [(e.id, e.ts) for e in events]:
                return "new ledger events while it was being archived", 0
            conn.execute("DELETE FROM heartbeat_events WHERE task = %s AND id = ANY(%s)",
                         (task_id, [e.id for e in events]))
            got = conn.execute(
                "INSERT INTO heartbeat_events (ts, task, kind, epoch, revision, actor, data) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (summary.ts, summary.task, summary.kind, summary.epoch, summary.revision, summary.actor,
                 json.dumps(summary.data, ensure_ascii=False, default=str, sort_keys=True))).fetchone()
            summary.id = int(got[0]) if got else 0
            conn.execute("DELETE FROM heartbeat_batons WHERE id = %s", (task_id,))
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, task_id))
        return "", 0

    def names(self) -> list[str]:
        """The names of the archive rows, oldest first."""
        with self._conn() as conn:
            rows = conn.execute("SELECT name FROM heartbeat_archive ORDER BY name").fetchall()
            conn.commit()
        return [str(r[0]) for r in rows]

    def records(self, name: str) -> list[dict[str, Any]]:
        """The records of the archive row ``name``."""
        where = f"{self.label}:heartbeat_archive/{name}"
        with self._conn() as conn:
            row = conn.execute("SELECT body FROM heartbeat_archive WHERE name = %s", (name,)).fetchone()
            conn.commit()
        if row is None:
            raise StoreError("the database holds no such archive", path=where)
        return records_in(bytes(row[0]), where)

    def archived_tasks(self, marks: list[Event]) -> dict[str, tuple[Baton | None, list[Event]]]:
        """The tasks ``marks`` (the ledger's ``archived`` events) name, from the archive rows."""
        if not marks:
            return {}
        names = sorted({str(m.data.get("archive", "")) for m in marks})
        with self._conn() as conn:
            rows = conn.execute("SELECT name, body FROM heartbeat_archive WHERE name = ANY(%s)", (names,)).fetchall()
            conn.commit()
        bodies = {str(r[0]): bytes(r[1]) for r in rows}

        def records(name: str) -> list[dict[str, Any]]:
            where = f"{self.label}:heartbeat_archive/{name}"
            if name not in bodies:
                raise StoreError("the ledger names an archive the database does not hold", path=where)
            return records_in(bodies[name], where)

        return resolve_marks(marks, records)
