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
takeover) are :mod:`heartbeat.ops.lease`'s; a write here keeps them coherent: ``owner_host``
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
``db upgrade`` (S < V). The check runs once per store opened, i.e. once per process."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, check_id, dump_baton, parse_baton
from heartbeat.model.errors import (
    AlreadyExists,
    BadInput,
    Conflict,
    HeartbeatError,
    NotFound,
    StoreError,
    StoreUnreachable,
)
from heartbeat.model.ledger import Event, EventKind, Ledger
from heartbeat.store.base import (
    Edit,
    Entry,
    HostRow,
    LeaseRow,
    Renewal,
    TakenOver,
    Unwatch,
    Watching,
    check_fence,
    continue_above,
    created_data,
    finish_edit,
    now_or,
    start_create,
)
from heartbeat.store.postgres import archive as pg_archive
from heartbeat.store.postgres import leases as pg_leases
from heartbeat.store.postgres.connection import (
    WATCHDOG,
    _configure,
    _connect_kwargs,
    _label,
    _one_line,
    _refusal,
    _unreachable,
    check_connection,
    connect,
)
from heartbeat.store.postgres.ledger import PostgresLedger, append_events, highest_revision
from heartbeat.store.postgres.schema import SCHEMA_VERSION, _columns, _needs_upgrade, schema_refusal, schema_state

__all__ = ["CHANNEL", "PostgresStore"]

CHANNEL = "heartbeat_batons"
"""The LISTEN/NOTIFY channel; the payload is the id of the task written."""
_DAEMON_LOCK = 0x68620002  # pg_advisory_lock key (with the host id's hash): one daemon per host id
_LINKS_LOCK = 0x68620003  # pg_advisory_xact_lock key: writes that change `after`, one at a time




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


class PostgresStore:
    """Batons in ``heartbeat_batons``, events in ``heartbeat_events``; see the module docstring."""

    def __init__(self, url: str, *, check_schema: bool = True, pool_size: int | None = None,
                 wait: float | None = None, refused_wait: float | None = None,
                 idle_timeout: float | None = None) -> None:
        """``pool_size``: connections at most (default ``defaults.PG_POOL_SIZE``); ``wait``: seconds a
        statement waits for one of them (``defaults.PG_CONNECT_TIMEOUT``); ``refused_wait``: seconds it
        goes on waiting, with one notice on stderr, while the database refuses connections (default:
        ``defaults.PG_REFUSED_WAIT`` in an agent's process, ``$HEARTBEAT_EPOCH`` set, whose failed
        call would count against its task; else 0, a person's command answers at once);
        ``idle_timeout``: its sessions' ``idle_in_transaction_session_timeout`` in seconds (default
        ``defaults.PG_IDLE_IN_TRANSACTION_TIMEOUT``; a leased daemon's: :func:`idle_limit`)."""
        self.url = url
        self.idle_timeout = idle_timeout
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
            configure=lambda conn: _configure(conn, idle_timeout),
            check=check_connection,
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
                _configure(conn, self.idle_timeout)
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

    def _load_in(self, conn: psycopg.Connection[Any], task_id: str) -> Baton:
        """One baton read on ``conn`` (inside its transaction)."""
        check_id(task_id)
        row = conn.execute("SELECT body FROM heartbeat_batons WHERE id = %s", (task_id,)).fetchone()
        if row is None:
            raise NotFound("no such task", task=task_id)
        return parse_baton(row[0], path=self._path(task_id), expected_id=task_id)

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
        links: bool = False,
    ) -> Iterator[Edit]:
        check_id(task_id)
        committing = False
        try:
            with self._conn() as conn, conn.transaction():
                if links:  # held to the commit: the next such write reads this one's rows (read committed)
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LINKS_LOCK,))
                row = conn.execute(
                    "SELECT body FROM heartbeat_batons WHERE id = %s FOR UPDATE", (task_id,)
                ).fetchone()
                if row is None:
                    raise NotFound("no such task", task=task_id)
                old = parse_baton(row[0], path=self._path(task_id), expected_id=task_id)
                check_fence(old, expect_revision=expect_revision, epoch=epoch)
                ed = Edit(old=old, baton=old.copy(), now=now_or(now), actor=actor, touch=touch,
                          reader=lambda other: self._load_in(conn, other))
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
                    raise Conflict(f"the baton moved on from revision {old.meta.revision} during the write",
                                   task=task_id)
                append_events(conn, events)
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, task_id))
                committing = True  # from here the COMMIT is under way: a lost answer may mean it landed
        except StoreUnreachable as exc:
            exc.unapplied = not committing
            raise

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

    # -- archiving (heartbeat.store.base.Archiving: heartbeat gc; heartbeat.store.postgres.archive) ----

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

        return Watching(stop_watching, thread.is_alive)

    def claim_daemon(self, host: str = "") -> None:
        """Hold, for this store's life, the lock that says a daemon with host id ``host`` runs
        on this database. Daemons on many hosts share one database through leases
        (:mod:`heartbeat.ops.lease`), but two with one host id would each take the other's tasks
        for their own: the second is refused. The lock lives as long as its connection, so the
        daemon re-checks it at every renewal (:meth:`keep_daemon_lock`); the host's row in
        ``heartbeat_hosts`` is what says which daemon is the host (:meth:`heartbeat.ops.lease.Lease.take_host`)."""
        from heartbeat.launchers.liveness import this_host

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
                    with WATCHDOG.bounded(conn, defaults.PG_CONNECT_TIMEOUT):
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

    # -- leases (the SharedStore capability: the SQL in pg_leases, the policy in heartbeat.ops.lease) --

    def lease_hosts(self) -> list[HostRow]:
        with self._conn() as conn:
            return pg_leases.hosts(conn)

    def lease_host(self, host: str) -> HostRow | None:
        with self._conn() as conn:
            return pg_leases.host_row(conn, host)

    def lease_rows(self) -> dict[str, LeaseRow]:
        with self._conn() as conn:
            return pg_leases.lease_rows(conn)

    @contextmanager
    def _one_statement(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit: the server commits the statement before it answers, so
        no answer lost on the way (a partition, a cut) leaves its rows locked in an open transaction
        until ``idle_in_transaction_session_timeout``: a renewal or claim cut off mid-flight never pins
        the host's tasks beyond their lease."""
        with self._conn() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                if not conn.closed and not conn.broken:
                    conn.autocommit = False

    def renew_leases(self, renewal: Renewal) -> tuple[bool, list[str]]:
        # (an answer later than the lease is worth nothing: the host's agents are stopped by then)
        with self._one_statement() as conn, WATCHDOG.bounded(conn, renewal.ttl):
            return pg_leases.renew(conn, renewal)

    def claim_leases(self, ids: list[str], *, host: str, labels: list[str], ttl: float, limit: int) -> set[str]:
        with self._one_statement() as conn:
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
        WATCHDOG.wake()
