"""Connecting to PostgreSQL: the connection's settings, and a refusal or an outage told in one line."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors

from heartbeat.model import defaults
from heartbeat.model.errors import (
    BadInput,
    StoreError,
    StoreUnreachable,
)

_log = logging.getLogger("psycopg.pool")
_log.addHandler(logging.NullHandler())
_log.propagate = False  # its reconnect warnings would break the CLI's one-line errors


_MISSING = re.compile(r'\b(role|database) "([^"]{1,63})" does not exist')
"""libpq's words for a connection to a role or database the server does not have."""


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
    if "tcp_user_timeout" not in info:  # data sent and never acknowledged (keepalives cover only a quiet line)
        kwargs["tcp_user_timeout"] = int(defaults.PG_TCP_USER_TIMEOUT * 1000)
    if "connect_timeout" not in info:
        kwargs["connect_timeout"] = max(2, int(defaults.PG_CONNECT_TIMEOUT))
    if "application_name" not in info:
        kwargs["application_name"] = "heartbeat"
    return kwargs


def idle_limit(lease_ttl: float) -> float:
    """A leased daemon's idle-transaction bound: half its lease ttl (``PG_IDLE_IN_TRANSACTION_FLOOR``
    at least, ``PG_IDLE_IN_TRANSACTION_TIMEOUT`` at most), so a transaction left idle by a host cut
    off or paused mid-write never holds its row locks beyond the lease and delays the takeover."""
    return min(defaults.PG_IDLE_IN_TRANSACTION_TIMEOUT, max(defaults.PG_IDLE_IN_TRANSACTION_FLOOR, lease_ttl / 2))


def _session_settings(idle: float | None = None) -> list[str]:
    """What every heartbeat session sets: UTC; no statement, lock wait or idle transaction longer than
    the timeouts (a process paused or cut off mid-write must not hold its row locks for ever); and the
    server's side of TCP keepalives (a partitioned host's session ends in seconds, not hours)."""
    return [
        "SET TIME ZONE 'UTC'",
        f"SET statement_timeout = {int(defaults.PG_STATEMENT_TIMEOUT * 1000)}",
        f"SET lock_timeout = {int(defaults.LOCK_TIMEOUT * 1000)}",
        f"SET idle_in_transaction_session_timeout = "
        f"{int((defaults.PG_IDLE_IN_TRANSACTION_TIMEOUT if idle is None else idle) * 1000)}",
        f"SET tcp_keepalives_idle = {int(defaults.PG_KEEPALIVE_IDLE)}",
        f"SET tcp_keepalives_interval = {int(defaults.PG_KEEPALIVE_INTERVAL)}",
        f"SET tcp_keepalives_count = {int(defaults.PG_KEEPALIVE_COUNT)}",
    ]


def _configure(conn: psycopg.Connection[Any], idle: float | None = None) -> None:
    """Every pooled connection: :func:`_session_settings`, and the :class:`Watchdog`'s watch."""
    for statement in _session_settings(idle):
        conn.execute(statement)  # our own constant SQL
    conn.commit()
    WATCHDOG.add(conn)


class Watchdog:
    """Cuts the socket of a connection whose statement has waited for an answer longer than the
    server could take (``PG_STATEMENT_TIMEOUT`` + ``PG_CLIENT_MARGIN``, or the shorter bound of a
    call that needs no more: :meth:`bounded`): the server cancels a statement that runs longer, so
    an answer that has not come by then never will. That is a partition that neither side can see
    (a black-holed NAT or proxy flow acknowledges every byte and answers none; no keepalive,
    ``tcp_user_timeout`` or ``statement_timeout`` ends it), and libpq would wait for ever: the
    daemon's renewal, tick or relay with it. The cut socket fails the statement at once (a one-line
    outage) and the pool replaces the connection. The idle connections to the same server opened
    before it are cut too: they crossed the same dead path, and each would hang its next user."""

    def __init__(self) -> None:
        self._conns: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        self._busy: dict[int, tuple[float, int]] = {}
        """id(conn) -> (monotonic time it was first seen waiting on a statement, its socket)."""
        self._bounds: dict[int, float] = {}
        """id(conn) -> the shorter bound of the call using it (:meth:`bounded`)."""
        self._born: dict[int, float] = {}
        """id(conn) -> monotonic time it was first watched."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._pid = os.getpid()
        self.cut = 0
        """Connections cut so far (for the tests)."""

    def add(self, conn: psycopg.Connection[Any]) -> None:
        """Watch ``conn`` while it is open; the watching thread runs while any is."""
        with self._lock:
            self._conns.add(conn)
            self._born[id(conn)] = time.monotonic()
            if self._thread is None or self._pid != os.getpid():  # (none yet, or a fork's copy)
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name=defaults.PG_WATCHDOG_THREAD, daemon=True)
                self._thread.start()

    @contextmanager
    def bounded(self, conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
        """While in this block, a statement of ``conn`` unanswered for ``seconds`` is cut."""
        with self._lock:
            self._bounds[id(conn)] = seconds
        try:
            yield
        finally:
            with self._lock:
                self._bounds.pop(id(conn), None)

    def wake(self) -> None:
        """Look now (a store closed its connections: with none left open, the thread ends at once)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(defaults.PG_CLIENT_CHECK)
            self._wake.clear()
            self.check(time.monotonic())
            with self._lock:  # every connection closed: end (a stopping daemon joins its threads)
                if not any(not c.closed for c in self._conns):
                    self._thread = None
                    return

    def check(self, now: float) -> None:
        """Cut each connection that has waited on one statement for longer than its bound."""
        with self._lock:
            conns = list(self._conns)
            bounds = dict(self._bounds)
            born = dict(self._born)
        seen: dict[int, tuple[float, int]] = {}
        dead: list[psycopg.Connection[Any]] = []
        for conn in conns:
            try:
                if conn.closed or conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.ACTIVE:
                    continue
                fd = conn.pgconn.socket
            except psycopg.Error:
                continue
            since, old_fd = self._busy.get(id(conn), (now, fd))
            since = since if old_fd == fd else now
            seen[id(conn)] = (since, fd)
            limit = bounds.get(id(conn), defaults.PG_STATEMENT_TIMEOUT + defaults.PG_CLIENT_MARGIN)
            if now - since > limit:
                self._cut(fd)
                seen.pop(id(conn))
                dead.append(conn)
        for gone in dead:  # the idle connections to that server it outlived crossed the same path
            for conn in conns:
                try:
                    if conn is gone or conn.closed or conn.info.host != gone.info.host \
                            or conn.info.port != gone.info.port or born.get(id(conn), now) > born.get(id(gone), 0) \
                            or conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
                        continue
                    self._cut(conn.pgconn.socket)
                except psycopg.Error:
                    continue
        self._busy = seen

    def _cut(self, fd: int) -> None:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)  # the socket itself, not only this duplicate: the waiting read wakes
            self.cut += 1
        except OSError:
            pass
        finally:
            sock.close()


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's look at a connection before it lends it: an empty query, answered within
    ``PG_CONNECT_TIMEOUT`` or cut (a black-holed connection must not hang the borrower)."""
    from psycopg_pool import ConnectionPool

    with WATCHDOG.bounded(conn, defaults.PG_CONNECT_TIMEOUT):
        ConnectionPool.check_connection(conn)


WATCHDOG = Watchdog()
"""The one :class:`Watchdog` of this process."""


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


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """One connection outside the pool (upgrade, LISTEN, the daemon's lock), configured."""
    try:
        conn = psycopg.connect(url, autocommit=autocommit, **_connect_kwargs(url))
        if autocommit:
            for statement in _session_settings():
                conn.execute(statement)  # our own constant SQL
            WATCHDOG.add(conn)
        else:
            _configure(conn)
    except psycopg.OperationalError as exc:
        raise _unreachable(exc, url) from None
    return conn
