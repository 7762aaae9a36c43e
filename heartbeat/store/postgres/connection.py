"""Connecting to PostgreSQL: the connection's settings, and a refusal or an outage told in one line."""

from __future__ import annotations

import logging
import re
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
