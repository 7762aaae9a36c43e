"""The PostgreSQL store: batons as rows, the ledger as a table of the same database.

Open it with ``[store] url = "postgresql://..."`` or ``$HEARTBEAT_STORE_URL`` (any libpq
URL, a Unix socket too: ``postgresql://user@/db?host=/run/postgresql``). Needs the extra
the ``postgres`` extra (psycopg 3 and its pool); nothing imports this module unless a
URL is configured, so the file store's CLI never loads psycopg.

A baton is one row of ``heartbeat_batons``: its TOML text kept verbatim (``body``, so
unknown keys and the file format survive export and import) plus indexed columns the
daemon can query without parsing: id, status, revision, epoch, owner host, lease expiry
and next wake; from schema version 2, whether an agent owns it (``owned``), the baton's
``host_labels``, and ``heartbeat_hosts``, one row per daemon. Leases (claim, renewal,
takeover) are :mod:`heartbeat.lease`'s; a write here keeps them coherent: ``owner_host``
is the host whose daemon holds (or last held) the task, and a write that gives the task
an owner on another host drops the old host's lease.

A write is one transaction: lock the row (``SELECT ... FOR UPDATE``), check the fence,
apply the bookkeeping of :func:`heartbeat.store.base.finish_edit`, ``UPDATE`` guarded by
the old revision (compare-and-set), insert the events, ``NOTIFY``. A writer killed at any
instant leaves the old row and none of its events. Every connection has a connect
timeout and a statement timeout: a database that is down or hung gives one line,
``cannot reach the database: ...``, never a traceback or a hang.

The schema belongs to heartbeat: :func:`upgrade` (``heartbeat db upgrade``) applies the
numbered migrations below in one transaction under an advisory lock, and records with each
version its ``min_reader``: the oldest schema version whose code may still read and write it.
Code of schema version V opens a database at version S when S == V, or when S > V and
min_reader <= V (an older host beside a newer schema, the middle of a rolling upgrade); it
refuses in one line a database it is too old for (min_reader > V) and one that needs
``db upgrade`` (S < V). The check runs once per store opened, i.e. once per process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from heartbeat import defaults
from heartbeat.baton import Baton, check_id, dump_baton, host_labels, parse_baton
from heartbeat.errors import AlreadyExists, BadInput, Conflict, HeartbeatError, NotFound, StoreError, StoreUnreachable
from heartbeat.ledger import Event, EventKind, Ledger, PendingWrite, _minute
from heartbeat.store import pg_archive, pg_leases
from heartbeat.store.base import (
    Edit,
    Entry,
    HostRow,
    LeaseRow,
    Renewal,
    TakenOver,
    Unwatch,
    check_fence,
    continue_above,
    created_data,
    finish_edit,
    now_or,
    start_create,
)

__all__ = [
    "CHANNEL",
    "MIN_READER",
    "SCHEMA_VERSION",
    "PostgresLedger",
    "PostgresStore",
    "schema_refusal",
    "schema_state",
    "schema_version",
    "upgrade",
]

CHANNEL = "heartbeat_batons"
"""The LISTEN/NOTIFY channel; the payload is the id of the task written."""

_UPGRADE_LOCK = 0x68620001  # pg_advisory_xact_lock key: one `db upgrade` at a time
_DAEMON_LOCK = 0x68620002  # pg_advisory_lock key (with the host id's hash): one daemon per host id

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE heartbeat_batons (
            id text PRIMARY KEY,
            body text NOT NULL,
            status text NOT NULL,
            revision bigint NOT NULL,
            epoch bigint NOT NULL,
            owner_host text NOT NULL DEFAULT '',
            lease_expires timestamptz,
            next_wake timestamptz,
            written_at timestamptz NOT NULL DEFAULT now()
        )""",
        "CREATE INDEX heartbeat_batons_status ON heartbeat_batons (status)",
        "CREATE INDEX heartbeat_batons_lease ON heartbeat_batons (owner_host, lease_expires)",
        "CREATE INDEX heartbeat_batons_next_wake ON heartbeat_batons (next_wake)",
        """CREATE TABLE heartbeat_events (
            id bigserial PRIMARY KEY,
            ts timestamptz NOT NULL,
            task text NOT NULL,
            kind text NOT NULL,
            epoch bigint NOT NULL DEFAULT 0,
            revision bigint NOT NULL DEFAULT 0,
            actor text NOT NULL DEFAULT '',
            data text NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX heartbeat_events_task ON heartbeat_events (task, id)",
        "CREATE INDEX heartbeat_events_ts ON heartbeat_events (ts)",
    ),
    2: (  # leased daemons on many hosts (heartbeat.lease)
        "ALTER TABLE heartbeat_batons ADD COLUMN owned boolean NOT NULL DEFAULT false",
        "ALTER TABLE heartbeat_batons ADD COLUMN host_labels text[] NOT NULL DEFAULT '{}'",
        "ALTER TABLE heartbeat_batons ADD COLUMN lease_renewed timestamptz",
        "UPDATE heartbeat_batons SET owned = owner_host <> ''",
        "CREATE INDEX heartbeat_batons_lease_expires ON heartbeat_batons (lease_expires) WHERE owned",
        """CREATE TABLE heartbeat_hosts (
            host text PRIMARY KEY,
            pid integer NOT NULL DEFAULT 0,
            labels text[] NOT NULL DEFAULT '{}',
            capacity integer NOT NULL DEFAULT 0,
            running integer NOT NULL DEFAULT 0,
            lease_ttl double precision NOT NULL DEFAULT 30,
            started_at timestamptz NOT NULL DEFAULT now(),
            renewed_at timestamptz NOT NULL DEFAULT now(),
            stopped_at timestamptz
        )""",
    ),
    3: pg_archive.MIGRATION,  # retention: heartbeat_archive (heartbeat.store.pg_archive)
}
"""Schema version -> the statements that bring version-1 to it. Append, never edit."""

SCHEMA_VERSION = max(MIGRATIONS)
"""The schema this code reads and writes."""

MIN_READER: dict[int, int] = {1: 1, 2: 2, 3: 3}
"""Schema version -> its ``min_reader``, where a migration raises it; a version left out keeps the one before.

Version 3 (gc's archive table) raises it to 3: code of version 2 would read a database whose finished
tasks gc moved into ``heartbeat_archive`` and report lower totals without saying so. No heartbeat
that knew ``min_reader`` ever ran at version 2, so the raise costs no rolling upgrade.

A migration is additive by default: new tables, new columns that are nullable or have a default, new
indexes; code one version older keeps working beside it (it names its columns, never ``SELECT *``).
A migration that drops, renames or retypes anything older code reads or writes, or adds a constraint
older writers would break, must raise ``min_reader`` here, to a version every host already runs
before its ``db upgrade`` (expand, then contract: docs/operating.md, "Rolling upgrade")."""

_log = logging.getLogger("psycopg.pool")
_log.addHandler(logging.NullHandler())
_log.propagate = False  # its reconnect warnings would break the CLI's one-line errors


def _label(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the database"
    db = info.get("dbname") or info.get("user") or ""
    host = info.get("host") or "localhost"
    return f"{db}@{host}" if db else str(host)


def _connect_kwargs(url: str) -> dict[str, Any]:
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise BadInput(f"not a PostgreSQL URL: {_one_line(exc)}", field="store.url") from None
    kwargs: dict[str, Any] = {
        # The client's side of a cut-off TCP connection (a Unix socket ignores them); the URL may say otherwise.
        "keepalives": 1,
        "keepalives_idle": int(defaults.PG_KEEPALIVE_IDLE),
        "keepalives_interval": int(defaults.PG_KEEPALIVE_INTERVAL),
        "keepalives_count": int(defaults.PG_KEEPALIVE_COUNT),
    }
    kwargs = {k: v for k, v in kwargs.items() if k not in info}
    if "connect_timeout" not in info:
        kwargs["connect_timeout"] = max(2, int(defaults.PG_CONNECT_TIMEOUT))
    if "application_name" not in info:
        kwargs["application_name"] = "heartbeat"
    return kwargs


def _session_settings() -> list[str]:
    """What every heartbeat session sets: UTC; no statement, lock wait or idle transaction longer than
    the timeouts (a process paused or cut off mid-write must not hold its row locks for ever); and the
    server's side of TCP keepalives (a partitioned host's session ends in seconds, not hours)."""
    return [
        "SET TIME ZONE 'UTC'",
        f"SET statement_timeout = {int(defaults.PG_STATEMENT_TIMEOUT * 1000)}",
        f"SET lock_timeout = {int(defaults.LOCK_TIMEOUT * 1000)}",
        f"SET idle_in_transaction_session_timeout = {int(defaults.PG_IDLE_IN_TRANSACTION_TIMEOUT * 1000)}",
        f"SET tcp_keepalives_idle = {int(defaults.PG_KEEPALIVE_IDLE)}",
        f"SET tcp_keepalives_interval = {int(defaults.PG_KEEPALIVE_INTERVAL)}",
        f"SET tcp_keepalives_count = {int(defaults.PG_KEEPALIVE_COUNT)}",
    ]


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Every pooled connection: :func:`_session_settings`."""
    for statement in _session_settings():
        conn.execute(statement)  # our own constant SQL
    conn.commit()


_REFUSALS = ("too many clients", "remaining connection slots are reserved", "connection refused",
             "the database system is starting up", "the database system is shutting down",
             "the database system is in recovery mode", "no such file or directory")
"""What libpq says when the server is full, restarting or not (yet) listening: worth a wait."""


def _refusal(exc: BaseException | None) -> str | None:
    """The reason (``"too many clients"``, ...) when ``exc`` says the server refused a connection
    it may accept later; None for anything else (a bad password, a missing database, success)."""
    if exc is None:
        return None
    if getattr(exc, "sqlstate", None) in ("53300", "57P03"):  # too_many_connections, cannot_connect_now
        return "too many clients" if exc.sqlstate == "53300" else "not accepting connections now"  # type: ignore[attr-defined]
    text = str(exc).lower()
    return next((reason for reason in _REFUSALS if reason in text), None)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _unreachable(exc: BaseException, url: str) -> StoreError:
    said = _one_line(exc)
    missing = _MISSING.search(said)
    if missing:  # the server answered: it is not out of reach, it has no such role or database yet
        what, name = missing.group(1), missing.group(2)
        fix = (f"createuser {name}" if what == "role" else
               f"createdb -O {psycopg.conninfo.conninfo_to_dict(url).get('user') or 'ROLE'} {name}")
        return StoreUnreachable(f"the database server of {_label(url)} has no {what} {name!r}: create it as "
                                f"PostgreSQL's superuser (sudo -u postgres {fix}; docs/operating.md, PostgreSQL "
                                f"store) ({said})")
    return StoreUnreachable(f"cannot reach the database {_label(url)}: {said}")


_MISSING = re.compile(r'\b(role|database) "([^"]{1,63})" does not exist')
"""libpq's words for a connection to a role or database the server does not have."""


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """One connection outside the pool (upgrade, LISTEN, the daemon's lock), configured."""
    try:
        conn = psycopg.connect(url, autocommit=autocommit, **_connect_kwargs(url))
        if autocommit:
            for statement in _session_settings():
                conn.execute(statement)  # our own constant SQL
        else:
            _configure(conn)
    except psycopg.OperationalError as exc:
        raise _unreachable(exc, url) from None
    return conn


def _schema_row(conn: psycopg.Connection[Any]) -> tuple[int, int, bool]:
    """(version, min_reader, whether ``heartbeat_schema`` has the min_reader column); (0, 0, True) when
    heartbeat has never upgraded the database. Two statements, as before min_reader existed: the
    row is read whole (``to_jsonb``), so a table written by a heartbeat before min_reader reads too."""
    row = conn.execute("SELECT to_regclass('heartbeat_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0, 0, True
    found = conn.execute(
        "SELECT to_jsonb(s) FROM heartbeat_schema s ORDER BY version DESC LIMIT 1"
    ).fetchone()
    if not found or not isinstance(found[0], dict):
        return 0, 0, True
    version = int(found[0]["version"])
    floor = found[0].get("min_reader")
    # A version recorded without a min_reader (by a heartbeat before min_reader) asked for an exact match.
    return version, int(floor) if floor is not None else version, "min_reader" in found[0]


def schema_state(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """The database's schema (version, min_reader); (0, 0) when heartbeat has never upgraded it."""
    version, floor, _ = _schema_row(conn)
    return version, floor


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The schema version recorded in the database; 0 when heartbeat has never upgraded it."""
    return schema_state(conn)[0]


def _needs_upgrade(label: str, version: int, ours: int) -> StoreError:
    return StoreError(
        f"the database {label} needs `heartbeat db upgrade` (its schema is version {version}, this heartbeat uses {ours})"
    )


def schema_refusal(version: int, floor: int, label: str, ours: int | None = None) -> StoreError | None:
    """Why code of schema ``ours`` (this code's) may not use a database at (``version``, min_reader
    ``floor``), as the one-line error to raise; None when it may. A pure function of the numbers."""
    ours = SCHEMA_VERSION if ours is None else ours
    if version < ours:
        return _needs_upgrade(label, version, ours)
    if version > ours and floor > ours:
        return StoreError(
            f"the database {label}'s schema is version {version}, newer than this heartbeat knows ({ours}), "
            f"and needs a heartbeat of schema {floor} or newer (its min_reader): upgrade heartbeat on this host"
        )
    return None


def min_reader_of(version: int, min_readers: dict[int, int] | None = None) -> int:
    """The min_reader that ``version`` records (:data:`MIN_READER`: a version left out keeps the one before)."""
    table = MIN_READER if min_readers is None else min_readers
    floor = 0
    for v in range(1, version + 1):
        floor = min(v, max(floor, table.get(v, floor)))
    return floor


def upgrade(
    url: str,
    *,
    migrations: dict[int, tuple[str, ...]] | None = None,
    min_readers: dict[int, int] | None = None,
) -> tuple[int, int]:
    """Bring the schema to the newest of ``migrations`` (:data:`MIGRATIONS`); return (version before, after).

    One transaction under an advisory lock: two upgrades at once run one after the other,
    and the second finds nothing to do. Each version applied is recorded with its min_reader
    (:func:`min_reader_of`). A database newer than this code is left as it is: nothing to do when
    this code may still use it, else refused in one line. ``migrations`` (instead of the module's)
    and ``min_readers`` (over the module's) are for tests that play a newer heartbeat.
    """
    steps = MIGRATIONS if migrations is None else migrations
    floors = {**MIN_READER, **(min_readers or {})}
    latest = max(steps)
    conn = connect(url)
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_UPGRADE_LOCK,))
            before, floor, has_floor = _schema_row(conn)
            if before > latest:
                refused = schema_refusal(before, floor, _label(url), latest)
                if refused is not None:
                    raise refused
                return before, before
            if before == 0:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS heartbeat_schema (version integer PRIMARY KEY, "
                    "applied_at timestamptz NOT NULL DEFAULT now(), min_reader integer)"
                )
            elif not has_floor:  # a table of a heartbeat before min_reader: it meant an exact match
                conn.execute("ALTER TABLE heartbeat_schema ADD COLUMN min_reader integer")
                conn.execute("UPDATE heartbeat_schema SET min_reader = version")
            for version in range(before + 1, latest + 1):
                for statement in steps[version]:
                    conn.execute(statement)  # our own constant SQL
                conn.execute(
                    "INSERT INTO heartbeat_schema (version, min_reader) VALUES (%s, %s)",
                    (version, max(floor, min_reader_of(version, floors))),
                )
        return before, latest
    except psycopg.OperationalError as exc:
        raise _unreachable(exc, url) from None
    except psycopg.Error as exc:
        raise StoreError(f"cannot upgrade the database {_label(url)}: {_one_line(exc)}") from None
    finally:
        conn.close()


def _columns(baton: Baton) -> dict[str, Any]:
    meta = baton.meta
    return {
        "status": meta.status.value,
        "revision": meta.revision,
        "epoch": meta.epoch,
        "owner_host": meta.owner.host if meta.owner is not None else "",
        "owned": meta.owner is not None,
        "host_labels": host_labels(baton),
        "next_wake": meta.snooze_until,
    }


_INSERT = (
    "INSERT INTO heartbeat_batons (id, body, status, revision, epoch, owner_host, owned, host_labels, next_wake) "
    "VALUES (%(id)s, %(body)s, %(status)s, %(revision)s, %(epoch)s, %(owner_host)s, %(owned)s, %(host_labels)s, "
    "%(next_wake)s) ON CONFLICT (id) DO NOTHING"
)

_UPDATE = (
    # owner_host is sticky (the host that last held the task evaluates its local gates); an
    # owner on another host drops the old host's lease, so it can neither renew nor lose it.
    "UPDATE heartbeat_batons SET body = %(body)s, status = %(status)s, revision = %(revision)s, epoch = %(epoch)s, "
    "lease_expires = CASE WHEN %(owner_host)s IN ('', owner_host) THEN lease_expires END, "
    "owner_host = CASE WHEN %(owner_host)s = '' THEN owner_host ELSE %(owner_host)s END, "
    "owned = %(owned)s, host_labels = %(host_labels)s, next_wake = %(next_wake)s, written_at = now() "
    "WHERE id = %(id)s AND revision = %(old_revision)s"
)


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


class PostgresStore:
    """Batons in ``heartbeat_batons``, events in ``heartbeat_events``; see the module docstring."""

    def __init__(self, url: str, *, check_schema: bool = True, pool_size: int | None = None,
                 wait: float | None = None, refused_wait: float | None = None) -> None:
        """``pool_size``: connections at most (default ``defaults.PG_POOL_SIZE``); ``wait``: seconds a
        statement waits for one of them (``defaults.PG_CONNECT_TIMEOUT``); ``refused_wait``: seconds it
        goes on waiting, with one notice on stderr, while the database refuses connections (default:
        ``defaults.PG_REFUSED_WAIT`` in an agent's process, ``$HEARTBEAT_EPOCH`` set, whose failed
        call would count against its task; else 0, a person's command answers at once)."""
        self.url = url
        if refused_wait is None:
            refused_wait = defaults.PG_REFUSED_WAIT if os.environ.get("HEARTBEAT_EPOCH") else 0.0
        self.refused_wait = refused_wait
        """Seconds :meth:`_conn` waits while the database refuses connections (see :func:`_refusal`)."""
        self._refused_noticed = False
        self.label = _label(url)
        self.ledger: Ledger = PostgresLedger(self)
        self.scan_unchanged = False
        self.reads = 0
        """Rows read and parsed by scans so far (see :attr:`heartbeat.store.base.Store.reads`)."""
        """Whether the last :meth:`scan` found exactly the rows of the one before it."""
        self.owner_hosts: dict[str, str] = {}
        """Task id -> the host whose daemon holds or last held it, as the last :meth:`scan` read it."""
        self._cache: dict[str, tuple[tuple[int, str], Entry]] = {}
        self._sorted: list[Entry] = []
        self._daemon_conn: psycopg.Connection[Any] | None = None
        self._daemon_host: str | None = None
        """The host id :meth:`claim_daemon` locked (None: not claimed)."""
        self._daemon_lock_guard = threading.Lock()
        self._archive = pg_archive.PgArchive(self._conn, lambda: connect(url, autocommit=True), self.label, CHANNEL)
        self.schema: tuple[int, int] = (0, 0)
        """The database's schema (version, min_reader) as :meth:`check_schema` last read it."""
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size or defaults.PG_POOL_SIZE,
            kwargs=_connect_kwargs(url),
            configure=_configure,
            check=ConnectionPool.check_connection,
            timeout=defaults.PG_CONNECT_TIMEOUT if wait is None else wait,
            name="heartbeat",
            open=True,
        )
        if check_schema:
            try:
                self.check_schema()
            except BaseException:
                self.close()
                raise

    # -- connections -----------------------------------------------------------------

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; database errors become one-line :class:`StoreError`."""
        try:
            with self._checkout() as conn:
                yield conn
        except PoolTimeout:
            raise self._diagnose() from None
        except psycopg.errors.LockNotAvailable:
            raise StoreError(
                f"another writer has held this baton's lock for {defaults.LOCK_TIMEOUT:.0f}s"
            ) from None
        except psycopg.errors.UndefinedTable:
            raise self._needs_upgrade(0) from None
        except psycopg.OperationalError as exc:
            raise _unreachable(exc, self.url) from None
        except psycopg.Error as exc:
            raise StoreError(f"database error on {self.label}: {_one_line(exc)}") from None

    @contextmanager
    def _checkout(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool; when the pool has none to give within its ``wait`` (its own
        retries back off 1 s, 2 s, 4 s ... unbounded), a store that may wait (:attr:`refused_wait`
        > 0: a command, not the daemon) connects by itself, for this one statement or transaction:
        while the database refuses connections (:func:`_refusal`: "too many clients", refused,
        restarting) it tries again after a pause doubling from ``PG_REFUSED_BACKOFF[0]`` up to
        ``PG_REFUSED_BACKOFF[1]``, for :attr:`refused_wait` seconds in all, saying so once on
        stderr. A full or restarting server is a wait, not an agent's failed write."""
        try:
            conn = self._pool.getconn()
        except PoolTimeout:
            if self.refused_wait <= 0:
                raise
            conn = None
        if conn is not None:
            try:
                yield conn
            finally:
                self._pool.putconn(conn)
            return
        own = self._connect_waiting()
        try:
            yield own
        finally:
            own.close()

    def _connect_waiting(self) -> psycopg.Connection[Any]:
        """A configured connection of this store's own, waiting while the database refuses them
        (see :meth:`_checkout`); :class:`StoreUnreachable` when it does not come in time."""
        give_up = time.monotonic() + self.refused_wait
        pause = defaults.PG_REFUSED_BACKOFF[0]
        while True:
            try:
                conn = psycopg.connect(self.url, **_connect_kwargs(self.url))
            except psycopg.Error as exc:
                reason = _refusal(exc)
                if reason is None or time.monotonic() + pause >= give_up:
                    raise _unreachable(exc, self.url) from None
                if not self._refused_noticed:
                    self._refused_noticed = True
                    sys.stderr.write(f"heartbeat: the database {self.label} refuses connections ({reason}): "
                                     f"waiting up to {self.refused_wait:.0f}s\n")
                    sys.stderr.flush()
                time.sleep(pause)
                pause = min(pause * 2, defaults.PG_REFUSED_BACKOFF[1])
                continue
            try:
                _configure(conn)
            except psycopg.Error as exc:
                conn.close()
                raise _unreachable(exc, self.url) from None
            return conn

    def _probe(self) -> psycopg.Error | None:
        """One direct connection attempt: what libpq says, or None when it connected."""
        try:
            psycopg.connect(self.url, **_connect_kwargs(self.url)).close()
        except psycopg.Error as exc:
            return exc
        return None

    def _diagnose(self) -> StoreError:
        """Why the pool has no connection to give: one direct attempt says what libpq says."""
        found = self._probe()
        return self._no_connection() if found is None else _unreachable(found, self.url)

    def _no_connection(self) -> StoreError:
        return StoreUnreachable(
            f"cannot reach the database {self.label}: no connection within {defaults.PG_CONNECT_TIMEOUT:.0f}s"
        )

    def _needs_upgrade(self, found: int) -> StoreError:
        return _needs_upgrade(self.label, found, SCHEMA_VERSION)

    def check_schema(self) -> None:
        """Refuse, in one line, a database this code may not use (:func:`schema_refusal`)."""
        with self._conn() as conn:
            version, floor = schema_state(conn)
            conn.commit()
        self.schema = (version, floor)
        refused = schema_refusal(version, floor, self.label)
        if refused is not None:
            raise refused

    # -- reading ---------------------------------------------------------------------

    def _path(self, task_id: str) -> str:
        return f"{self.label}:{task_id}"

    def baton_text(self, task_id: str) -> str:
        """The baton's TOML text exactly as stored."""
        check_id(task_id)
        with self._conn() as conn:
            row = conn.execute("SELECT body FROM heartbeat_batons WHERE id = %s", (task_id,)).fetchone()
            conn.commit()
        if row is None:
            raise NotFound("no such task", task=task_id)
        return str(row[0])

    def load(self, task_id: str) -> Baton:
        return parse_baton(self.baton_text(task_id), path=self._path(task_id), expected_id=task_id)

    def scan(self, only: Collection[str] | None = None) -> list[Entry]:
        """Every row; re-parses only rows written since the last scan (by revision and ``xmin``).
        ``only`` is ignored: one query over the key columns answers for every row."""
        with self._conn() as conn:
            keys = conn.execute("SELECT id, revision, xmin::text, owner_host FROM heartbeat_batons").fetchall()
            cache = self._cache
            stale = [r[0] for r in keys if (c := cache.get(r[0])) is None or c[0] != (r[1], r[2])]
            bodies: list[tuple[str, int, str, str]] = []
            if stale:
                bodies = conn.execute(
                    "SELECT id, revision, xmin::text, body FROM heartbeat_batons WHERE id = ANY(%s)", (stale,)
                ).fetchall()
            conn.commit()
        self.reads += len(bodies)
        for task_id, revision, xmin, body in bodies:
            entry = Entry(id=task_id, path=self._path(task_id))
            try:
                entry.baton = parse_baton(body, path=entry.path, expected_id=task_id)
            except HeartbeatError as exc:
                entry.error = exc
            cache[task_id] = ((revision, xmin), entry)
        present = {r[0] for r in keys}
        self.owner_hosts = {r[0]: r[3] for r in keys if r[3]}
        unchanged = not stale and len(keys) == len(self._sorted)
        self.scan_unchanged = unchanged
        if unchanged:
            return list(self._sorted)
        for gone in [task_id for task_id in cache if task_id not in present]:
            del cache[gone]
        entries = sorted((cache[i][1] for i in present if i in cache), key=lambda e: e.id)
        self._sorted = entries
        return list(entries)

    # -- writing ---------------------------------------------------------------------

    def create(self, baton: Baton, *, actor: str = "", now: datetime | None = None) -> Baton:
        task_id = check_id(baton.meta.id)
        now = now_or(now)
        new = start_create(baton, now)
        meta = new.meta
        meta.revision = 1
        events = [Event(task=task_id, kind=EventKind.CREATED, ts=now, actor=actor, epoch=meta.epoch, revision=1,
                        data=created_data(new))]
        with self._conn() as conn, conn.transaction():
            # A re-created id continues above its history: no two histories of one revision.
            meta.revision = highest_revision(conn, task_id) + 1
            for event in events:
                event.revision = meta.revision
            body = self._body(new)
            cols = _columns(new)
            cur = conn.execute(_INSERT, {**cols, "id": task_id, "body": body, "revision": meta.revision})
            if cur.rowcount != 1:
                raise AlreadyExists("a task with this id exists already", task=task_id)
            append_events(conn, events)
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, task_id))
        return new

    def _body(self, baton: Baton) -> str:
        text = dump_baton(baton)
        size = len(text.encode("utf-8"))
        if size > defaults.MAX_BATON_BYTES:
            raise BadInput(
                f"the baton would be {size} bytes; a baton may be at most {defaults.MAX_BATON_BYTES}",
                task=baton.meta.id,
            )
        return text

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
    ) -> Iterator[Edit]:
        check_id(task_id)
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                "SELECT body FROM heartbeat_batons WHERE id = %s FOR UPDATE", (task_id,)
            ).fetchone()
            if row is None:
                raise NotFound("no such task", task=task_id)
            old = parse_baton(row[0], path=self._path(task_id), expected_id=task_id)
            check_fence(old, expect_revision=expect_revision, epoch=epoch)
            ed = Edit(old=old, baton=old.copy(), now=now_or(now), actor=actor, touch=touch)
            yield ed
            if ed.cancelled:
                return
            events = finish_edit(ed)
            # A row restored from a backup (its revision below the ledger's) continues above it.
            continue_above(ed, events, highest_revision(conn, task_id))
            body = self._body(ed.baton)
            cols = _columns(ed.baton)
            cur = conn.execute(_UPDATE, {**cols, "id": task_id, "body": body, "old_revision": old.meta.revision})
            if cur.rowcount != 1:  # the row lock makes this unreachable; the revision guard is the contract
                raise Conflict(f"the baton moved on from revision {old.meta.revision} during the write", task=task_id)
            append_events(conn, events)
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, task_id))

    def put_text(self, task_id: str, text: str) -> bool:
        """Store a baton's text verbatim (import, migrate) unless the id is taken; True when written."""
        check_id(task_id)
        baton = parse_baton(text, path=self._path(task_id), expected_id=task_id)
        cols = _columns(baton)
        with self._conn() as conn, conn.transaction():
            cur = conn.execute(_INSERT, {**cols, "id": task_id, "body": text})
            if cur.rowcount == 1:
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, task_id))
            return cur.rowcount == 1

    def record(self, events: list[Event]) -> None:
        self.ledger.append(events)

    # -- archiving (heartbeat.store.base.Archiving: heartbeat gc; heartbeat.store.pg_archive) ----

    def gc_lock(self, *, dry_run: bool = False) -> AbstractContextManager[None]:
        return self._archive.gc_lock(dry_run=dry_run)

    def archive_text(self, task_id: str) -> bytes | None:
        try:
            return self.baton_text(task_id).encode("utf-8")
        except NotFound:
            return None

    def task_files(self, task_id: str) -> list[tuple[int, str, int]]:
        return []  # agents' logs live in each host's state dir, not in the database

    def prune_files(self, task_id: str, paths: list[str]) -> list[tuple[str, int]]:
        return []

    def write_archive(self, name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
        return self._archive.write_archive(name, records)

    def retire(self, task_id: str, raw: bytes, events: list[Event], summary: Event) -> tuple[str, int]:
        return self._archive.retire(task_id, raw, events, summary)

    def archived_tasks(self) -> dict[str, tuple[Baton | None, list[Event]]]:
        return self._archive.archived_tasks(self.ledger.events(kinds=[EventKind.ARCHIVED]))

    def archive_names(self) -> list[str]:
        return self._archive.names()

    def archive_records(self, name: str) -> list[dict[str, Any]]:
        return self._archive.records(name)

    # -- change notification and the daemon's lock -------------------------------------

    def watch(self, callback: Callable[[str | None], None]) -> Unwatch:
        """Call ``callback(task_id)`` after each committed write, from a thread; returns ``stop``.

        LISTEN on its own connection. When that connection is lost it reconnects and
        calls ``callback(None)``: writes may have been missed, rescan everything.
        """
        stop = threading.Event()
        holder: list[psycopg.Connection[Any]] = []

        def listen() -> psycopg.Connection[Any]:
            conn = connect(self.url, autocommit=True)
            conn.execute(f"LISTEN {CHANNEL}")
            holder[:] = [conn]
            return conn

        conn = listen()

        def run() -> None:
            nonlocal conn
            while not stop.is_set():
                try:
                    for note in conn.notifies(timeout=0.2):
                        callback(note.payload)
                except psycopg.Error:
                    if stop.is_set():
                        return
                    conn.close()
                    while not stop.wait(0.5):
                        try:
                            conn = listen()
                        except StoreError:
                            continue
                        callback(None)
                        break

        thread = threading.Thread(target=run, name="heartbeat-pg-listen", daemon=True)
        thread.start()

        def stop_watching(timeout: float = 5.0) -> None:
            stop.set()
            thread.join(timeout=timeout)
            for c in holder:
                c.close()

        return stop_watching

    def claim_daemon(self, host: str = "") -> None:
        """Hold, for this store's life, the lock that says a daemon with host id ``host`` runs
        on this database. Daemons on many hosts share one database through leases
        (:mod:`heartbeat.lease`), but two with one host id would each take the other's tasks
        for their own: the second is refused. The lock lives as long as its connection, so the
        daemon re-checks it at every renewal (:meth:`keep_daemon_lock`); the host's row in
        ``heartbeat_hosts`` is what says which daemon is the host (:meth:`heartbeat.lease.Lease.take_host`)."""
        from heartbeat.liveness import this_host

        host = host or this_host()
        conn = connect(self.url, autocommit=True)
        row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_DAEMON_LOCK, host)).fetchone()
        if not row or not row[0]:
            conn.close()
            raise StoreError(
                f"another heartbeat daemon with host id {host!r} is running on the database {self.label}: "
                "give each daemon its own daemon.host (or $HEARTBEAT_HOST)"
            )
        self._daemon_conn = conn
        self._daemon_host = host

    def keep_daemon_lock(self) -> str:
        """Re-check the lock :meth:`claim_daemon` took; re-take it on a new connection when the old
        one died (killed, a database restart, a failover, an idle timeout). Returns ``"held"``,
        ``"retaken"``, ``"lost"`` (gone, and another process holds it or the database is out of
        reach) or ``""`` (never claimed). Thread-safe."""
        with self._daemon_lock_guard:
            host = self._daemon_host
            if host is None:
                return ""
            conn = self._daemon_conn
            if conn is not None:
                try:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                        "AND granted AND classid::bigint = %s AND objsubid = 2", (_DAEMON_LOCK,)).fetchone()
                    if row and row[0]:
                        return "held"
                except psycopg.Error:
                    pass
                conn.close()
                self._daemon_conn = None
            try:
                conn = connect(self.url, autocommit=True)
            except StoreError:
                return "lost"
            try:
                row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_DAEMON_LOCK, host)).fetchone()
            except psycopg.Error:
                row = None
            if not row or not row[0]:
                conn.close()
                return "lost"
            self._daemon_conn = conn
            return "retaken"

    def daemon_backends(self) -> list[int]:
        """The server pids of the sessions holding a daemon lock (:meth:`claim_daemon`) on this
        database, whatever their host id: empty when no daemon runs on it."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
                "AND classid::bigint = %s AND database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())", (_DAEMON_LOCK,)).fetchall()
        return sorted(int(row[0]) for row in rows)

    # -- leases (the SharedStore capability: the SQL in pg_leases, the policy in heartbeat.lease) --

    def lease_hosts(self) -> list[HostRow]:
        with self._conn() as conn:
            return pg_leases.hosts(conn)

    def lease_host(self, host: str) -> HostRow | None:
        with self._conn() as conn:
            return pg_leases.host_row(conn, host)

    def lease_rows(self) -> dict[str, LeaseRow]:
        with self._conn() as conn:
            return pg_leases.lease_rows(conn)

    def renew_leases(self, renewal: Renewal) -> tuple[bool, list[str]]:
        with self._conn() as conn:
            return pg_leases.renew(conn, renewal)

    def claim_leases(self, ids: list[str], *, host: str, labels: list[str], ttl: float, limit: int) -> set[str]:
        with self._conn() as conn:
            return pg_leases.claim(conn, ids, host=host, labels=labels, ttl=ttl, limit=limit)

    def take_over_leases(self, *, host: str, labels: list[str], ttl: float, limit: int,
                         change: Callable[[Edit, str, float], None]) -> list[TakenOver]:
        with self._conn() as conn, conn.transaction():
            return pg_leases.take_over(
                conn, host=host, labels=labels, ttl=ttl, limit=limit, label=self.label, change=change,
                body=self._body, highest=highest_revision, append=append_events,
                notify=lambda c, task_id: c.execute("SELECT pg_notify(%s, %s)", (CHANNEL, task_id)))

    def task_epochs(self, ids: list[str]) -> dict[str, int]:
        with self._conn() as conn:
            return pg_leases.epochs(conn, ids)

    def host_stopped(self, host: str, pid: int, started: datetime) -> None:
        with self._conn() as conn:
            pg_leases.host_stopped(conn, host, pid, started)

    def close(self) -> None:
        with self._daemon_lock_guard:
            self._daemon_host = None
            if self._daemon_conn is not None:
                self._daemon_conn.close()
                self._daemon_conn = None
        self._pool.close(timeout=1.0)
