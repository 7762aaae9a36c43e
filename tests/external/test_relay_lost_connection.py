"""Issue 24 item 16: a relayed write whose daemon-side database connection is killed before its
commit is handed back to the agent (nothing was applied), which writes it itself, waiting as it does
for a refused connection; at 4c852cf it failed at once with exit 1 (2 in a terminate storm).

A write lost *during* its commit may have landed: that one is still an error, never run twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from heartbeat.model.errors import StoreUnreachable
from heartbeat.store.postgres.store import PostgresStore
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.write import DECLINED, answer, parse_hot


class KilledMidWrite(PostgresStore):
    """A store whose next edit loses its connection (``pg_terminate_backend``) inside the transaction."""

    kill_next = False

    @contextmanager
    def edit(self, task_id: str, **kwargs: Any) -> Iterator[Any]:
        with super().edit(task_id, **kwargs) as ed:
            if self.kill_next:
                self.kill_next = False
                with psycopg.connect(self.url, autocommit=True) as other:
                    killed = other.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()").fetchall()
                assert killed, "no transaction of ours to end"
            yield ed


def notes(store: PostgresStore) -> list[str]:
    return [str(n) for n in store.load("t").done]


class TestAConnectionKilledBeforeTheCommit:
    def test_the_relay_declines_and_nothing_was_applied(self, pg_url: str) -> None:
        """The daemon's answer is ``declined`` (the client then writes itself), not exit 1; the baton is as
        it was. At 4c852cf: exit 1, 'cannot reach the database'."""
        store = KilledMidWrite(pg_url)
        try:
            tasks.new_task(store, "t", task="work", step="start")
            before = store.load("t").meta.revision
            store.kill_next = True
            code, message, _ = answer(store, parse_hot(["add", "t", "done", "one"], agent_commands=True), {})
            assert (code, message) == (DECLINED, "")
            assert store.load("t").meta.revision == before and notes(store) == []
            code, message, _ = answer(store, parse_hot(["add", "t", "done", "one"], agent_commands=True), {})
            assert code == 0, message
            assert len([n for n in notes(store) if "one" in n]) == 1
        finally:
            store.close()

    def test_the_store_says_the_write_was_not_applied(self, pg_url: str) -> None:
        store = KilledMidWrite(pg_url)
        try:
            tasks.new_task(store, "t", task="work", step="start")
            store.kill_next = True
            try:
                with store.edit("t", actor="cli") as ed:
                    ed.baton.step = "moved"
            except StoreUnreachable as exc:
                assert exc.unapplied
            else:
                raise AssertionError("the write went through a killed connection")
            assert store.load("t").step == "start"
        finally:
            store.close()
