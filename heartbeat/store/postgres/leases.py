"""Leases on PostgreSQL: the statements behind the :class:`~heartbeat.store.base.SharedStore` capability.

The lease lives in the task's row (``owner_host``, ``lease_expires``, ``lease_renewed``, in
database time, so the hosts' clocks do not matter) and each daemon has a row in
``heartbeat_hosts``. This module holds only the SQL and what one statement returns; the
policy (when to renew, to take over, to stand down, to stop an agent) is :mod:`heartbeat.ops.lease`'s.
Every function takes one connection of :class:`~heartbeat.store.postgres.store.PostgresStore`'s pool
and commits its own transaction (a write sticks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from heartbeat.model.baton import Baton, parse_baton
from heartbeat.model.errors import HeartbeatError
from heartbeat.model.ledger import Event
from heartbeat.model.timeparse import utcnow
from heartbeat.store.base import Edit, HostRow, LeaseRow, Renewal, TakenOver, continue_above, finish_edit

__all__ = ["claim", "epochs", "host_row", "host_stopped", "hosts", "lease_rows", "renew", "take_over"]

Conn = Any
"""A psycopg connection (psycopg is imported by store/postgres.py, the one module that connects)."""


def _fetch(conn: Conn, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    rows = conn.execute(sql, params).fetchall()
    conn.commit()
    return rows


_HOST_COLUMNS = ("host, pid, labels, capacity, running, lease_ttl, started_at, renewed_at, stopped_at, "
                 "extract(epoch FROM now() - renewed_at)::float8")


def _host(r: Sequence[Any]) -> HostRow:
    age = max(0.0, r[9])
    # Past its ttl unrenewed, a host's agents were stopped by their shims: its last count is history.
    running = r[4] if age <= r[5] else 0
    return HostRow(host=r[0], pid=r[1], labels=tuple(r[2]), capacity=r[3], running=running, lease_ttl=r[5],
                   started_at=r[6], renewed_at=r[7], stopped_at=r[8], age=age)


def hosts(conn: Conn) -> list[HostRow]:
    """Every daemon that ever renewed on this database, most recently renewed first."""
    return [_host(r) for r in _fetch(conn, f"SELECT {_HOST_COLUMNS} FROM heartbeat_hosts "
                                           "ORDER BY renewed_at DESC, host")]


def host_row(conn: Conn, host: str) -> HostRow | None:
    rows = _fetch(conn, f"SELECT {_HOST_COLUMNS} FROM heartbeat_hosts WHERE host = %(me)s", {"me": host})
    return _host(rows[0]) if rows else None


def lease_rows(conn: Conn) -> dict[str, LeaseRow]:
    """Task id -> its owner host and lease, for every task that has a host."""
    rows = _fetch(
        conn,
        "SELECT id, owner_host, CASE WHEN owned OR lease_expires > now() "
        "THEN extract(epoch FROM lease_expires - now())::float8 END FROM heartbeat_batons WHERE owner_host <> ''",
    )
    return {r[0]: LeaseRow(host=r[1], left=r[2]) for r in rows}


_RENEW = """
WITH host AS (
    INSERT INTO heartbeat_hosts AS h (host, pid, labels, capacity, running, lease_ttl, started_at, renewed_at)
    VALUES (%(me)s, %(pid)s, %(labels)s, %(capacity)s, %(running)s, %(ttl)s, %(started)s, now())
    ON CONFLICT (host) DO UPDATE SET pid = EXCLUDED.pid, labels = EXCLUDED.labels, capacity = EXCLUDED.capacity,
        running = EXCLUDED.running, lease_ttl = EXCLUDED.lease_ttl, started_at = EXCLUDED.started_at,
        renewed_at = now(), stopped_at = NULL
    WHERE (h.pid = EXCLUDED.pid AND h.started_at = EXCLUDED.started_at)
       OR (%(take)s AND h.renewed_at IS NOT DISTINCT FROM %(seen)s::timestamptz)
    RETURNING 1
), renewed AS (
    UPDATE heartbeat_batons b
    SET lease_expires = now() + %(ttl)s * interval '1 second', lease_renewed = now()
    FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS s(id, epoch)
    WHERE b.id = s.id AND (s.epoch IS NULL OR b.epoch = s.epoch) AND b.owner_host = %(me)s
      AND EXISTS (SELECT 1 FROM host)
    RETURNING b.id
)
SELECT EXISTS (SELECT 1 FROM host), array(SELECT id FROM renewed)
"""
"""Renew a daemon's host row and its tasks' leases, in one statement. The host row is the
daemon's only while it holds the daemon's identity (pid and start time): once another daemon
with the same host id took the row over, nothing renews. ``take`` takes the row over,
compare-and-set on the ``renewed_at`` last seen."""


def renew(conn: Conn, r: Renewal) -> tuple[bool, list[str]]:
    params = {"me": r.host, "pid": r.pid, "labels": r.labels, "capacity": r.capacity, "running": r.running,
              "ttl": r.ttl, "started": r.started, "ids": r.ids, "epochs": r.epochs, "take": r.take, "seen": r.seen}
    rows = _fetch(conn, _RENEW, params)
    if not rows:
        return False, []
    held, ids = rows[0]
    return bool(held), list(ids)


_CLAIM = """
WITH c AS (
    SELECT id FROM heartbeat_batons
    WHERE id = ANY(%(ids)s::text[]) AND status = 'active' AND NOT owned
      AND (lease_expires IS NULL OR lease_expires < now() OR owner_host = %(me)s)
      AND host_labels <@ %(labels)s::text[]
    ORDER BY array_position(%(ids)s::text[], id)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE heartbeat_batons b
SET owner_host = %(me)s, lease_expires = now() + %(ttl)s * interval '1 second', lease_renewed = now()
FROM c WHERE b.id = c.id
RETURNING b.id
"""


def claim(conn: Conn, ids: list[str], *, host: str, labels: list[str], ttl: float, limit: int) -> set[str]:
    """One ``SELECT ... FOR UPDATE SKIP LOCKED``: two daemons never wait on, nor take, the same row."""
    params = {"ids": ids, "me": host, "labels": labels, "ttl": ttl, "limit": limit}
    return {r[0] for r in _fetch(conn, _CLAIM, params)}


_EXPIRED = """
SELECT id, body, owner_host, extract(epoch FROM now() - coalesce(lease_renewed, lease_expires))::float8
FROM heartbeat_batons
WHERE owned AND owner_host <> %(me)s AND lease_expires < now() AND host_labels <@ %(labels)s::text[]
ORDER BY lease_expires
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

_TAKE = (
    "UPDATE heartbeat_batons SET body = %s, status = %s, revision = %s, epoch = %s, owned = false, "
    "owner_host = %s, lease_expires = now() + %s * interval '1 second', lease_renewed = now(), "
    "written_at = now() WHERE id = %s AND revision = %s"
)


def take_over(conn: Conn, *, host: str, labels: list[str], ttl: float, limit: int, label: str,
              change: Callable[[Edit, str, float], None], body: Callable[[Baton], str],
              highest: Callable[[Conn, str], int], append: Callable[[Conn, list[Event]], None],
              notify: Callable[[Conn, str], None]) -> list[TakenOver]:
    """Take (up to ``limit``) owned tasks whose owner host's lease expired, in one transaction
    (the caller's): ``change`` edits each baton (the epoch moves on: the old agent is fenced at
    once); the row's lease becomes ``host``'s. The store passes its own writing helpers."""
    taken: list[TakenOver] = []
    rows = conn.execute(_EXPIRED, {"me": host, "labels": labels, "limit": limit}).fetchall()
    for task_id, text, from_host, age in rows:
        try:
            old = parse_baton(text, path=f"{label}:{task_id}", expected_id=task_id)
        except HeartbeatError:
            continue  # an unreadable row is reported by the scan, never rewritten here
        age = float(age or 0.0)
        ed = Edit(old=old, baton=old.copy(), now=utcnow(), actor="daemon")
        change(ed, from_host, age)
        meta = ed.baton.meta
        events = finish_edit(ed, world=False)  # nothing but bookkeeping changes: no world to fingerprint
        continue_above(ed, events, highest(conn, task_id))
        cur = conn.execute(_TAKE, (body(ed.baton), meta.status.value, meta.revision, meta.epoch, host, ttl,
                                   task_id, old.meta.revision))
        if cur.rowcount != 1:
            continue
        append(conn, events)
        notify(conn, task_id)
        taken.append(TakenOver(task=task_id, from_host=from_host, lease_age=age, epoch=meta.epoch))
    return taken


def epochs(conn: Conn, ids: list[str]) -> dict[str, int]:
    rows = _fetch(conn, "SELECT id, epoch FROM heartbeat_batons WHERE id = ANY(%(ids)s)", {"ids": ids})
    return {r[0]: int(r[1]) for r in rows}


def host_stopped(conn: Conn, host: str, pid: int, started: datetime) -> None:
    conn.execute("UPDATE heartbeat_hosts SET stopped_at = now() WHERE host = %s AND pid = %s AND started_at = %s",
                 (host, pid, started))
    conn.commit()
