"""Issue 24 item 14: a database error during a look is an outage, never an invalid baton.

A poke (an exit notice, the change feed) looked at a task while the database was out of reach:
the load's StoreUnreachable became the entry's error, logged ``invalid_baton`` for a valid baton,
and the daemon tried to write an ``invalid`` event (3/3 outages), so the invalid-baton metric and
alert could fire after a blip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from daemon_harness import in_process_config

from heartbeat.daemon import Daemon
from heartbeat.model.errors import StoreUnreachable
from heartbeat.store.files import FileStore
from heartbeat.store.postgres.store import PostgresStore
from heartbeat.tasks import verbs as tasks
from tests.system.test_clock_steps import RecordingLog


class _Outage:
    down = False
    writes_down = False
    """The database lost after a task's load, before the daemon's write (a session the server closed)."""

    def load(self, task_id: str, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise StoreUnreachable("the database is unreachable: connection refused")
        return super().load(task_id, *args, **kwargs)  # type: ignore[misc]

    def edit(self, task_id: str, *args: Any, **kwargs: Any) -> Any:
        if self.writes_down:
            raise StoreUnreachable("the database is unreachable: server closed the connection unexpectedly")
        return super().edit(task_id, *args, **kwargs)  # type: ignore[misc]


class OutageFiles(_Outage, FileStore):
    pass


class OutagePostgres(_Outage, PostgresStore):
    pass


def invalid_events(store: Any) -> list[Any]:
    return [e for e in store.ledger.events("t") if e.kind == "invalid"]


@contextlib.contextmanager
def serving(tmp_path: Path, store_of: Callable[[Path], Any]) -> Iterator[tuple[Daemon, Any, RecordingLog]]:
    """An in-process daemon on ``store_of(state_dir)``, its log kept; the outage over and the daemon shut down after."""
    tmp_path.chmod(0o700)
    state, config = in_process_config(tmp_path)
    store = store_of(state)
    log = RecordingLog()
    d = Daemon(config, store=store, log=log)
    try:
        yield d, store, log
    finally:
        store.down = store.writes_down = False
        d.shutdown(timeout=10)


class TestALookDuringAnOutage:
    def test_on_the_database_store_it_is_said_once_as_the_outage(self, pg_url: str, tmp_path: Path) -> None:
        """``store_unreachable`` once for three looks, no ``invalid_baton``, no ``invalid`` event.
        At 4c852cf: ``invalid_baton`` per look and an ``invalid`` event tried."""
        with serving(tmp_path, lambda _: OutagePostgres(pg_url)) as (d, store, log):
            tasks.new_task(store, "t", task="work", step="start")
            store.down = True
            for _ in range(3):
                d.evaluate("t")
            store.down = False
            assert not log.events("invalid_baton")
            assert len(log.events("store_unreachable")) == 1
            assert invalid_events(store) == []

    def test_on_the_file_store_the_look_is_deferred(self, tmp_path: Path) -> None:
        """The file store has no lease part: the look is deferred quietly; the task stays valid."""
        with serving(tmp_path, lambda state: OutageFiles(str(state))) as (d, store, log):
            tasks.new_task(store, "t", task="work", step="start")
            store.down = True
            d.evaluate("t")
            store.down = False
            assert not log.events("invalid_baton") and log.events("look_deferred")
            assert invalid_events(store) == []


class TestAnActDuringAnOutage:
    """The database lost between a task's load and the daemon's write (a session the server closed
    mid-pass) is the store's outage, not the task's failure: fails on c34dcdd (``task_failed`` at
    level error: a healthy host reported a failing task)."""

    def wake_due(self, store: Any) -> datetime:
        tasks.new_task(store, "t", task="work", step="start")
        tasks.snooze(store, "t", datetime.now(UTC) + timedelta(seconds=1))
        return datetime.now(UTC) + timedelta(seconds=5)

    def test_on_the_database_store_it_is_said_once_as_the_outage(self, pg_url: str, tmp_path: Path) -> None:
        """Three passes whose wake cannot be written: ``store_unreachable`` once, no ``task_failed``;
        the database back, the next pass wakes the task."""
        with serving(tmp_path, lambda _: OutagePostgres(pg_url)) as (d, store, log):
            later = self.wake_due(store)
            store.writes_down = True
            for i in range(3):
                d.tick(now=later + timedelta(seconds=i))
            assert not log.events("task_failed"), log.events("task_failed")
            assert len(log.events("store_unreachable")) == 1
            store.writes_down = False
            d.tick(now=later + timedelta(seconds=5))
            assert [e.kind for e in store.ledger.events("t", kinds=["woke"])] == ["woke"]

    def test_on_the_file_store_the_look_is_deferred(self, tmp_path: Path) -> None:
        """The same on the file store (no lease part): deferred quietly, woken when writes come back."""
        with serving(tmp_path, lambda state: OutageFiles(str(state))) as (d, store, log):
            later = self.wake_due(store)
            store.writes_down = True
            d.tick(now=later)
            assert not log.events("task_failed") and log.events("look_deferred")
            store.writes_down = False
            d.tick(now=later + timedelta(seconds=1))
            assert [e.kind for e in store.ledger.events("t", kinds=["woke"])] == ["woke"]
