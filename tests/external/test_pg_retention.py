"""Retention on PostgreSQL (issue 19 item 2): ``heartbeat gc`` and the daemon's daily gc archive
long-done tasks into ``heartbeat_archive``, fold finished tasks' touches, and bound the events
table, through the same policy code as the file store (:mod:`heartbeat.ops.retention`) and the
store's :class:`~heartbeat.store.base.Archiving` capability. A real throwaway cluster; two
daemons with different host ids where the fleet matters."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Result, clean_env

from heartbeat.config.shape import RetentionConfig
from heartbeat.model.baton import Baton, Gate, Status
from heartbeat.model.errors import GcBusy, StoreError
from heartbeat.ops.retention import run_gc
from heartbeat.reports.report import build_report
from heartbeat.store.base import Archiving
from heartbeat.store.postgres.store import PostgresStore
from tests.integration.test_retention import _counters, sim

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(days=400)


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


@pytest.fixture(scope="module")
def rich_template(pg_cluster: Any) -> str:
    """A database holding the rich ledger (:func:`fill_rich`), written once per module: it is the
    costly part of the tests that read it, and each of them gets a copy of its own (``rich``)."""
    name = f"hb_rich_{os.getpid()}"
    with psycopg.connect(pg_cluster.host_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE hb_template')  # type: ignore[arg-type]
    store = PostgresStore(pg_cluster.url(name))
    try:
        fill_rich(store)
    finally:
        store.close()  # no session may stay on a template while it is copied
    return name


@pytest.fixture
def rich_url(pg_cluster: Any, rich_template: str) -> str:
    """A fresh database of this test's own, a copy of the rich ledger (``CREATE DATABASE ... TEMPLATE``)."""
    name = f"{rich_template}_{next(_copies)}"
    with psycopg.connect(pg_cluster.host_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{rich_template}"')  # type: ignore[arg-type]
    return str(pg_cluster.url(name))


@pytest.fixture
def rich(rich_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(rich_url)
    yield store
    store.close()


_copies = iter(range(1, 1 << 30))


def write(store: PostgresStore, task: str, start: datetime, *, seed: int = 1, epochs: int = 4, touches: int = 4,
          finish: str = "done") -> datetime:
    return sim.write_history(store, task, start, random.Random(seed), epochs=epochs, touches=touches, finish=finish)


def fill_rich(store: PostgresStore) -> None:
    """The file store's rich ledger (tests/integration/test_retention.py), on PostgreSQL: forty tasks through every
    report metric, done, failed and still active."""
    for n in range(40):
        finish = "done" if n % 5 else ("failed" if n % 10 else "active")
        write(store, f"t{n:02d}", T0 + timedelta(hours=n), seed=n, epochs=3 + n % 6, touches=3 + n % 4, finish=finish)


def sql(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()  # type: ignore[arg-type]  # the tests' own SQL


def events_rows(url: str) -> int:
    return int(sql(url, "SELECT count(*) FROM heartbeat_events")[0][0])


def events_size(url: str) -> int:
    return int(sql(url, "SELECT pg_total_relation_size('heartbeat_events')")[0][0])


def report_json(store: PostgresStore) -> dict[str, Any]:
    return build_report(store, now=LATER).to_json()


def cli(url: str, tmp_path: Path, *args: str) -> Result:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True, timeout=120,
                          env=clean_env(HEARTBEAT_STORE_URL=url, HEARTBEAT_STATE_DIR=str(tmp_path / "state")),
                          cwd=str(tmp_path))
    return Result(proc.returncode, proc.stdout, proc.stderr)


class TestArchiving:
    def test_the_store_declares_it(self, pg: PostgresStore) -> None:
        """Archiving is a declared capability, asked with isinstance (issue 18), on both backends."""
        from heartbeat.store.files import FileStore

        assert isinstance(pg, Archiving)
        assert FileStore.__dict__.get("retire") and isinstance(FileStore.__new__(FileStore), Archiving)

    def test_rows_go_live_tasks_stay_and_the_table_stops_growing(self, pg: PostgresStore, pg_url: str) -> None:
        """Thirty long-done tasks are archived: their baton rows and events leave the live tables (one
        `archived` row each stays), the active, blocked, failed and recently done tasks' batons are
        untouched (the live ones' events row for row: only finished tasks' touches fold), and after
        gc's VACUUM the next thirty tasks' history reuses the freed space: the events relation
        (pg_total_relation_size) grows far less than it did for the first thirty."""
        empty = events_size(pg_url)
        for n in range(30):
            write(pg, f"old{n:02d}", T0 + timedelta(minutes=n), seed=n, epochs=6, touches=6)
        write(pg, "active", T0, finish="active")
        write(pg, "failed", T0, finish="failed")
        write(pg, "recent", LATER - timedelta(days=2))
        blocked = Baton(task="waits for a human", step="s0", blocked_on="a human")
        blocked.meta.id = "blocked"
        blocked.meta.status = Status.BLOCKED
        pg.create(blocked, actor="cli", now=T0)
        kept = ["active", "blocked", "failed", "recent"]
        texts = {t: pg.baton_text(t) for t in kept}
        history = {t: [e.to_json() for e in pg.ledger.events(t)] for t in ("active", "blocked")}
        rows_before, size_before = events_rows(pg_url), events_size(pg_url)
        result = run_gc(pg, RetentionConfig(), now=LATER)
        assert sorted(result.archived) == [f"old{n:02d}" for n in range(30)]
        assert sorted(e.id for e in pg.scan()) == sorted(kept)
        assert {t: pg.baton_text(t) for t in kept} == texts
        assert {t: [e.to_json() for e in pg.ledger.events(t)] for t in ("active", "blocked")} == history
        rows_after = events_rows(pg_url)
        folded = sum(result.folded.values()) - len(result.folded)  # the finished ones' touches
        assert rows_after == rows_before - result.archived_rows + 30 - folded == result.ledger_rows_after
        assert rows_after < rows_before / 3
        assert sql(pg_url, "SELECT count(*), sum(tasks) FROM heartbeat_archive") == [(1, 30)]
        for n in range(30):
            write(pg, f"new{n:02d}", T0 + timedelta(minutes=n), seed=n, epochs=6, touches=6)
        grown_first, grown_second = size_before - empty, events_size(pg_url) - size_before
        assert grown_second < grown_first / 2, (empty, size_before, events_size(pg_url))

    def test_a_finished_upstream_a_live_downstream_waits_on_is_kept(self, pg: PostgresStore) -> None:
        """Issue 17's rule on PostgreSQL: a done upstream stays while a blocked downstream's `after:`
        gate waits on it, and goes with it once that is done too."""
        write(pg, "up", T0)
        down = Baton(task="after up", step="s0", blocked_on="up", after=["up"])
        down.meta.id = "down"
        down.meta.status = Status.BLOCKED
        down.meta.gate = Gate.parse("after:up")
        pg.create(down, actor="cli", now=T0)
        result = run_gc(pg, RetentionConfig(), now=LATER)
        assert result.archived == [] and ("up", "kept: task down depends on it") in result.skipped
        assert pg.load("up").meta.status is Status.DONE

    def test_a_task_revived_mid_way_is_not_archived(self, pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """A done task retried after its archive row was written keeps its baton row and events; the
        stray record is ignored (no `archived` event names it) and the report still reads."""
        end = write(pg, "a", T0)
        write_archive = pg.write_archive

        def write_then_revive(name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
            found = write_archive(name, records)
            with pg.edit("a", actor="bob", now=end + timedelta(days=31)) as ed:
                ed.baton.meta.status = Status.ACTIVE
                ed.event("retried", by="bob", note="")
            return found

        monkeypatch.setattr(pg, "write_archive", write_then_revive)
        result = run_gc(pg, RetentionConfig(), now=end + timedelta(days=31))
        assert result.archived == [] and result.skipped == [
            ("a", "the baton changed while it was being archived (revived?)")]
        assert pg.load("a").meta.status is Status.ACTIVE
        assert report_json(pg)["tasks"][0]["status"] == "active"

    def test_a_missing_archive_row_is_an_error_not_lower_totals(self, pg: PostgresStore, pg_url: str,
                                                                tmp_path: Path) -> None:
        """If the archive row an `archived` mark names is gone (deleted by hand, a partial restore),
        `report` fails in one line instead of silently counting less."""
        write(pg, "a", T0)
        assert run_gc(pg, RetentionConfig(), now=LATER).archived == ["a"]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert conn.execute("DELETE FROM heartbeat_archive").rowcount == 1
        with pytest.raises(StoreError, match="names an archive the database does not hold"):
            build_report(pg)
        r = cli(pg_url, tmp_path, "report")
        assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and "does not hold" in r.err, r.err

    def test_one_gc_at_a_time_on_a_database(self, pg: PostgresStore, pg_url: str) -> None:
        """While one process holds the database's gc lock, a gc from another connection (another host)
        refuses in one line and changes nothing; a dry run needs no lock."""
        write(pg, "a", T0)
        other = PostgresStore(pg_url)
        try:
            with pg.gc_lock():
                with pytest.raises(GcBusy, match="another gc is running on the database"):
                    run_gc(other, RetentionConfig(), now=LATER)
                assert run_gc(other, RetentionConfig(), now=LATER, dry_run=True).archived == ["a"]
            assert other.load("a").meta.status is Status.DONE
            assert run_gc(other, RetentionConfig(), now=LATER).archived == ["a"]
        finally:
            other.close()


class TestReportAndCounters:
    def test_the_report_is_identical_and_the_decrease_explained(self, rich: PostgresStore, rich_url: str) -> None:
        """The rich ledger on PostgreSQL: every report figure identical after gc archives and folds;
        rows before - rows after = what the new `archived`/`compacted` rows say they hold, minus them."""
        pg, pg_url = rich, rich_url
        before = report_json(pg)
        ids_before = {r[0] for r in sql(pg_url, "SELECT id FROM heartbeat_events")}
        rows_before = events_rows(pg_url)
        result = run_gc(pg, RetentionConfig(), now=LATER)
        assert len(result.archived) == 32
        assert report_json(pg) == before
        assert before["totals"]["escalations"] > 0 and before["totals"]["dispatches"] > 100
        new = [e for e in pg.ledger.events() if e.id not in ids_before]
        assert new and {e.kind for e in new} == {"archived", "compacted"}
        explained = sum(e.data.get("rows", 0) + e.data.get("folded", 0) for e in new) - len(new)
        assert rows_before - events_rows(pg_url) == explained > 0
        again = run_gc(pg, RetentionConfig(), now=LATER)
        assert (again.archived, again.folded) == ([], {})

    def test_the_cli_gc_and_report_on_the_database(self, rich_url: str, tmp_path: Path) -> None:
        """`heartbeat gc` on the configured database archives (c31a8a9 refused: "gc works on the file
        store only"), and `heartbeat report --json` prints the same document before and after."""
        pg_url = rich_url

        def report() -> dict[str, Any]:
            r = cli(pg_url, tmp_path, "report", "--json")
            assert r.code == 0, r.err
            doc = json.loads(r.out)
            doc.pop("generated_at")
            return doc

        before = report()
        r = cli(pg_url, tmp_path, "gc", "--now", LATER.isoformat())
        assert r.code == 0, r.err
        assert "archive 32 task(s)" in r.out.splitlines()[-1]
        assert report() == before

    def test_counters_are_not_lower_after_gc(self, rich: PostgresStore, rich_url: str) -> None:
        """Every `*_total` counter a scrape of the PostgreSQL store shows is the same after gc archived
        most tasks, for the same exporter and a fresh one (a restart)."""
        from heartbeat.web.metrics import HeartbeatCollector

        pg, pg_url = rich, rich_url
        collector = HeartbeatCollector(pg, state_dir="")
        before = _counters(collector)
        assert before[("heartbeat_escalations_total", (("scope", "store"),))] > 0
        assert len(run_gc(pg, RetentionConfig(), now=LATER).archived) == 32
        assert _counters(collector) == before
        fresh = PostgresStore(pg_url)
        try:
            assert _counters(HeartbeatCollector(fresh, state_dir="")) == before
        finally:
            fresh.close()


class TestTouchFolding:
    def test_touches_of_a_finished_task_fold_to_a_bounded_count(self, pg: PostgresStore, pg_url: str) -> None:
        """An agent touching for 300 minutes leaves one row per minute; once the task is done, gc folds
        them into one `compacted` row (not yet old enough to archive), and its report is the same."""
        t = T0
        baton = Baton(task="long", step="s0", plan=["s0", "s1"])
        baton.meta.id = "long"
        pg.create(baton, actor="cli", now=t)
        with pg.edit("long", actor="daemon", now=t) as ed:
            ed.baton.meta.epoch += 1
            ed.baton.meta.status = Status.ACTIVE
            ed.baton.meta.owner = sim.Owner(pid=4242, how="dispatch", launcher="agent", started_at=t)
            ed.event("dispatched", reason="due", launcher="agent")
        for minute in range(300):
            for second in (5, 25, 45):  # three touches a minute coalesce into one row
                with pg.edit("long", epoch=1, actor="agent", touch=True, now=t + timedelta(minutes=minute,
                                                                                            seconds=second)):
                    pass
        end = t + timedelta(minutes=301)
        with pg.edit("long", epoch=1, actor="agent", now=end) as ed:
            ed.baton.meta.status = Status.DONE
            ed.baton.meta.owner = None
            ed.event("done")
        touched = sql(pg_url, "SELECT count(*) FROM heartbeat_events WHERE kind = 'touched'")[0][0]
        assert touched == 300
        before = build_report(pg, now=end + timedelta(days=1)).to_json()
        result = run_gc(pg, RetentionConfig(), now=end + timedelta(days=1))
        assert result.archived == [] and result.folded == {"long": 299}
        assert events_rows(pg_url) <= 6
        assert build_report(pg, now=end + timedelta(days=1)).to_json() == before


class TestTwoHosts:
    @pytest.mark.slow
    def test_the_daily_gc_of_two_hosts_archives_each_task_once(self, pg_url: str, tmp_path: Path) -> None:
        """Two daemons (host-a, host-b) on one database, each with `[retention] every = "1s"`: the twenty
        long-done tasks are archived exactly once between them (one `archived` row each, each record in
        one archive row), the human-blocked task and the done upstream it lists in `after` stay, both
        hosts keep running gc (or skip it while the other holds the lock), and the report is unchanged.
        (c31a8a9's daemon never scheduled gc on a database.)"""
        from tests.external.test_leased_daemons import Host

        store = PostgresStore(pg_url)
        hosts: list[Host] = []
        try:
            start = datetime.now(UTC) - timedelta(days=3)
            for n in range(20):
                write(store, f"old{n:02d}", start + timedelta(minutes=n), seed=n)
            write(store, "up", start)
            down = Baton(task="after up, then a human", step="s0", blocked_on="a human", after=["up"])
            down.meta.id = "down"
            down.meta.status = Status.BLOCKED
            store.create(down, actor="cli", now=start)
            now = datetime.now(UTC) + timedelta(days=1)
            before = build_report(store, now=now).to_json()
            for name in ("a", "b"):
                h = Host(tmp_path / name, pg_url, f"host-{name}")
                h.extra += '\n[retention]\nevery = "1s"\nfinished_after = "1s"\n'
                h.write_config()
                hosts.append(h)
            for h in hosts:
                h.start()

            def archived() -> list[tuple[Any, ...]]:
                return sql(pg_url, "SELECT task, count(*) FROM heartbeat_events WHERE kind = 'archived' GROUP BY task")

            hosts[0].wait(lambda: len(archived()) == 20, "the fleet's gc to archive the twenty tasks", timeout=60)
            for h in hosts:  # each host has run (or skipped) gc at least twice more since
                seen = len(h.lines("gc") + h.lines("gc_skipped"))
                h.wait(lambda h=h, seen=seen: len(h.lines("gc") + h.lines("gc_skipped")) >= seen + 2,  # type: ignore[misc]
                       f"{h.host}'s gc to run again", timeout=30)
            assert sorted(archived()) == [(f"old{n:02d}", 1) for n in range(20)]
            assert sql(pg_url, "SELECT sum(tasks) FROM heartbeat_archive") == [(20,)]
            assert sum(e.get("archived", 0) for h in hosts for e in h.lines("gc")) == 20
            assert not [e for h in hosts for e in h.lines("gc_failed")]
            assert [(e.id, e.baton.meta.status) for e in store.scan() if e.baton] == [
                ("down", Status.BLOCKED), ("up", Status.DONE)]
            assert build_report(store, now=now).to_json() == before
        finally:
            for h in hosts:
                h.close()
            store.close()
