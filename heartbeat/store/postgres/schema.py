"""The PostgreSQL schema: its migrations, its version and the oldest code that may read it (``min_reader``)."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.errors

from heartbeat.model.baton import Baton, host_labels
from heartbeat.model.errors import (
    StoreError,
)
from heartbeat.store.postgres import archive as pg_archive
from heartbeat.store.postgres.connection import _label, _one_line, _unreachable, connect

__all__ = ["MIN_READER", "SCHEMA_VERSION", "schema_refusal", "schema_state", "schema_version", "upgrade"]

_UPGRADE_LOCK = 0x68620001  # pg_advisory_xact_lock key: one `db upgrade` at a time

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
    2: (  # leased daemons on many hosts (heartbeat.ops.lease)
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
    3: pg_archive.MIGRATION,  # retention: heartbeat_archive (heartbeat.store.postgres.archive)
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
    if version >= 1 and not 1 <= floor <= version:  # as the file store refuses a format file's
        return StoreError(
            f"the database {label}'s schema row is damaged (version {version}, min_reader {floor}; min_reader "
            f"must be a whole number from 1 to the version): repair heartbeat_schema's newest row"
        )
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
