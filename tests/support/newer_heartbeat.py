"""``heartbeat`` one schema version ahead, for the rolling-upgrade tests: run as ``python newer_heartbeat.py
ARGS...`` it is the installed heartbeat plus :data:`NEXT_MIGRATION`, an additive migration (a column and a
table) it applies with ``db upgrade`` and requires before it runs, the way the next release would.

``--raise-min-reader`` (first argument) makes that migration raise ``min_reader`` to its own version:
the kind of migration older code cannot live beside. Agents it launches run the installed heartbeat,
one version behind it: "an N+1 daemon beside an N agent".
"""

from __future__ import annotations

import sys

from heartbeat.store.postgres import schema

NEXT = schema.SCHEMA_VERSION + 1
NEXT_MIGRATION = (
    "ALTER TABLE heartbeat_batons ADD COLUMN next_release_note text",
    "CREATE TABLE heartbeat_next_release (task text PRIMARY KEY, seen_at timestamptz NOT NULL DEFAULT now())",
)


def become_next(*, raise_min_reader: bool = False) -> None:
    """Make this process's heartbeat the next schema version."""
    schema.MIGRATIONS[NEXT] = NEXT_MIGRATION
    if raise_min_reader:
        schema.MIN_READER[NEXT] = NEXT
    schema.SCHEMA_VERSION = NEXT


if __name__ == "__main__":
    raising = sys.argv[1:2] == ["--raise-min-reader"]
    if raising:
        del sys.argv[1]
    become_next(raise_min_reader=raising)
    from heartbeat.__main__ import main

    raise SystemExit(main())
