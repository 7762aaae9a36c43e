"""``heartbeat rm`` on the PostgreSQL store (issue 26, item 12): archived into the database's
``heartbeat_archive`` as gc archives there, and ``show`` names that archive."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from conftest import Result

pytestmark = pytest.mark.slow

Cli = Callable[..., Result]


def test_rm_archives_into_the_database_and_show_says_so(cli: Cli, pg_url: str) -> None:
    env = {"HEARTBEAT_STORE_URL": pg_url}
    assert cli("new", "t", "--task", "x", "--step", "s", env=env).code == 0
    assert cli("new", "up", "--task", "x", "--step", "s", env=env).code == 0
    assert cli("new", "down", "--task", "x", "--step", "s", "--after", "up", env=env).code == 0
    refused = cli("rm", "up", env=env)
    assert refused.code == 2 and "task down depends on it" in refused.err, refused.err
    r = cli("rm", "t", "--by", "alice", env=env)
    assert r.code == 0, r.err
    [mark] = json.loads(cli("log", "t", "--json", env=env).out)["events"]
    assert mark["kind"] == "archived" and mark["actor"] == "alice"
    shown = cli("show", "t", env=env)
    assert shown.code != 0 and f"the database's archive {mark['data']['archive']}" in shown.err, shown.err
    import psycopg

    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM heartbeat_archive WHERE name = %s",
                            (mark["data"]["archive"],)).fetchone() == (1,)
    assert json.loads(cli("status", "--json", env=env).out)["tasks"] and \
        "t" not in {row["id"] for row in json.loads(cli("status", "--json", env=env).out)["tasks"]}
