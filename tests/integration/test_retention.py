"""Bounded disk (``[retention]``, ``heartbeat gc``): old epochs' files go, long-done tasks move into
a compressed archive, touches of finished tasks are folded, and ``heartbeat report`` says exactly
what it said before. Real files, a real SQLite ledger, the real CLI and a real daemon."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.util
import json
import os
import random
import shutil
import sqlite3
import tomllib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Result
from daemon_harness import DaemonHarness

from heartbeat.config.load import parse_config
from heartbeat.config.shape import RetentionConfig
from heartbeat.model import defaults
from heartbeat.model.baton import Status
from heartbeat.model.errors import ConfigError, GcBusy, StoreError
from heartbeat.ops.retention import RETENTION_KINDS, run_gc
from heartbeat.reports.report import build_report
from heartbeat.store.files import FileStore


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(days=400)


def _load_sim() -> Any:
    spec = importlib.util.spec_from_file_location("sim_retention", ROOT / "scripts" / "sim_retention.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sim = _load_sim()


def make_task(store: FileStore, task: str, start: datetime, *, seed: int = 1, epochs: int = 4, touches: int = 4,
              finish: str = "done", log_bytes: int = 0) -> datetime:
    return sim.write_history(store, task, start, random.Random(seed), epochs=epochs, touches=touches,
                             log_bytes=log_bytes, finish=finish)


@pytest.fixture(scope="module")
def rich_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Forty tasks through every metric: done, failed and still active; with logs. Written once."""
    state = tmp_path_factory.mktemp("rich") / "state"
    state.mkdir(mode=0o700)
    store = FileStore(str(state))
    for n in range(40):
        finish = "done" if n % 5 else ("failed" if n % 10 else "active")
        make_task(store, f"t{n:02d}", T0 + timedelta(hours=n), seed=n, epochs=3 + n % 6, touches=3 + n % 4,
                  finish=finish, log_bytes=512)
    store.close()
    return state


@pytest.fixture
def rich(rich_template: Path, state_dir: Path) -> Callable[[FileStore], None]:
    """Fills ``state_dir`` with a copy of the rich template (call it before using the store)."""

    def fill(store: FileStore) -> None:
        store.close()
        shutil.rmtree(state_dir)
        shutil.copytree(rich_template, state_dir, symlinks=True)

    return fill


def report_json(store: FileStore, **kwargs: Any) -> dict[str, Any]:
    return build_report(store, now=LATER, **kwargs).to_json()


def rows(store: FileStore) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(store.ledger.path)  # type: ignore[attr-defined]
    try:
        return conn.execute("SELECT id, ts, task, kind, epoch, revision, actor, data FROM events ORDER BY id").fetchall()
    finally:
        conn.close()


def snapshot(state: Path) -> dict[str, Any]:
    """Every file's kind and content under the state dir (the ledger by its rows, not its pages)."""
    found: dict[str, Any] = {}
    for path in sorted(state.rglob("*")):
        rel = str(path.relative_to(state))
        if rel.startswith("ledger.sqlite3"):
            continue
        st = path.lstat()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_fifo():
            found[rel] = ("fifo",)
        elif path.is_dir():
            found[rel] = ("dir", st.st_mode)
        else:
            found[rel] = ("file", st.st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    conn = sqlite3.connect(state / "ledger.sqlite3")
    try:
        found["ledger rows"] = conn.execute("SELECT * FROM events ORDER BY id").fetchall()
    finally:
        conn.close()
    return found


def epoch_files(store: FileStore, task: str) -> set[str]:
    path = Path(store.logs_dir) / task
    return {p.name for p in path.iterdir()} if path.is_dir() else set()


@pytest.fixture
def store(state_dir: Path) -> Iterator[FileStore]:
    s = FileStore(str(state_dir))
    yield s
    s.close()


class TestConfig:
    def test_defaults(self) -> None:
        """Without a [retention] table: keep 5 epochs, archive after 30 days, run daily."""
        config = parse_config("")
        assert config.retention == RetentionConfig(keep_epochs=5, finished_after=30 * 86400.0, every=86400.0)
        assert (defaults.KEEP_EPOCHS, defaults.FINISHED_AFTER, defaults.GC_EVERY) == (5, 30 * 86400.0, 86400.0)

    def test_example_documents_every_key_with_the_defaults(self) -> None:
        """config/heartbeat.example.toml has every RetentionConfig field, at its default value."""
        doc = tomllib.loads((ROOT / "config" / "heartbeat.example.toml").read_text())
        assert {f.name for f in dataclasses.fields(RetentionConfig)} == set(doc["retention"])
        text = (ROOT / "config" / "heartbeat.example.toml").read_text()
        assert parse_config(text[text.index("[retention]"):]).retention == RetentionConfig()

    @pytest.mark.parametrize(("text", "message"), [
        ("[retention]\nkeep_epochs = 0\n", "retention.keep_epochs: must be at least 1"),
        ('[retention]\nfinished_after = "soon"\n', "retention.finished_after: bad duration"),
        ("[retention]\nkeep = 3\n", "retention.keep: unknown key"),
        ('[retention]\nenabled = "yes"\n', "retention.enabled: expected true or false"),
        ("[retention]\narchive_failed = 1\n", "retention.archive_failed: expected true or false"),
    ])
    def test_bad_values_are_one_line_errors(self, text: str, message: str) -> None:
        """A bad [retention] value is a ConfigError naming the key."""
        with pytest.raises(ConfigError, match=message):
            parse_config(text)


class TestEpochFiles:
    def test_keeps_the_latest_epochs_and_the_current_one(self, store: FileStore) -> None:
        """With keep_epochs = 3, only the files of the three latest epochs stay; sizes are reported."""
        make_task(store, "a", T0, epochs=8, finish="active", log_bytes=1000)
        assert store.load("a").meta.epoch == 8
        result = run_gc(store, RetentionConfig(keep_epochs=3), now=T0 + timedelta(days=1))
        assert {int(n.split(".")[0]) for n in epoch_files(store, "a")} == {6, 7, 8}
        assert len(result.removed_files) == 5 * 4 and result.removed_bytes > 5 * 1000

    def test_never_the_current_epoch(self, store: FileStore) -> None:
        """The current epoch's files stay even when higher-numbered strays exist and keep_epochs = 1."""
        make_task(store, "a", T0, epochs=3, finish="active", log_bytes=100)
        for name in ("9.log", "10.log"):  # strays above the current epoch (3)
            (Path(store.logs_dir) / "a" / name).write_text("x")
        run_gc(store, RetentionConfig(keep_epochs=1), now=T0 + timedelta(days=1))
        names = epoch_files(store, "a")
        assert {"3.log", "3.exit", "3.pid", "3.brief.md", "9.log", "10.log"} <= names
        assert not any(n.startswith(("1.", "2.")) for n in names)

    def test_old_epochs_pulses_go_with_their_logs(self, store: FileStore) -> None:
        """An agent's pulse (logs/<id>/<epoch>.pulse, heartbeat.hotpath.pulse) is an epoch file: kept for the
        latest epochs, removed with the older ones."""
        make_task(store, "a", T0, epochs=4, finish="active", log_bytes=10)
        for epoch in range(1, 5):
            (Path(store.logs_dir) / "a" / f"{epoch}.pulse").write_text("p")
        run_gc(store, RetentionConfig(keep_epochs=2), now=T0 + timedelta(days=1))
        names = epoch_files(store, "a")
        assert {"3.pulse", "4.pulse"} <= names and not names & {"1.pulse", "2.pulse"}

    def test_old_epochs_lease_files_go_with_their_logs(self, store: FileStore) -> None:
        """An agent's lease file (logs/<id>/<epoch>.lease, written on a shared store for its shim) is an
        epoch file: kept for the latest epochs, removed with the older ones (else an archived task's
        log directory could never go)."""
        make_task(store, "a", T0, epochs=4, finish="active", log_bytes=10)
        for epoch in range(1, 5):
            (Path(store.logs_dir) / "a" / f"{epoch}.lease").write_text("{}")
        run_gc(store, RetentionConfig(keep_epochs=2), now=T0 + timedelta(days=1))
        names = epoch_files(store, "a")
        assert {"3.lease", "4.lease"} <= names and not names & {"1.lease", "2.lease"}

    def test_hostile_entries_are_never_followed_or_opened(self, hb: Callable[..., Result], state_dir: Path,
                                                           tmp_path: Path) -> None:
        """A symlink and a FIFO named like old epoch files are removed as names (the link's target is
        untouched, the FIFO never opened: the CLI does not hang); a symlinked task dir is not entered."""
        s = FileStore(str(state_dir))
        make_task(s, "a", T0, epochs=7, finish="active", log_bytes=100)
        make_task(s, "b", T0, epochs=7, finish="active", log_bytes=100)
        s.close()
        outside = tmp_path / "precious.txt"
        outside.write_text("keep me")
        task_dir = state_dir / "logs" / "a"
        (task_dir / "1.log").unlink()
        (task_dir / "1.log").symlink_to(outside)
        (task_dir / "1.exit").unlink()
        os.mkfifo(task_dir / "1.exit")
        (task_dir / "1.pid").unlink()
        (task_dir / "1.pid").mkdir()  # a directory named like a file: left alone
        (task_dir / "notes.txt").write_text("not ours")
        elsewhere = tmp_path / "elsewhere"
        (state_dir / "logs" / "b").rename(elsewhere)
        (state_dir / "logs" / "b").symlink_to(elsewhere)
        before_elsewhere = sorted(p.name for p in elsewhere.iterdir())
        r = hb("gc", "--now", (T0 + timedelta(days=1)).isoformat(), timeout=60)
        assert r.code == 0, r.err
        names = {p.name for p in task_dir.iterdir()}
        assert "1.log" not in names and "1.exit" not in names  # the link and the FIFO, unlinked
        assert {"1.pid", "notes.txt"} <= names
        assert outside.read_text() == "keep me"
        assert sorted(p.name for p in elsewhere.iterdir()) == before_elsewhere
        assert (state_dir / "logs" / "b").is_symlink()

    def test_an_unreadable_baton_keeps_its_files(self, store: FileStore) -> None:
        """A task whose baton does not parse keeps every file: its current epoch is unknown."""
        make_task(store, "a", T0, epochs=8, finish="active", log_bytes=100)
        before = epoch_files(store, "a")
        Path(store.path_of("a")).write_text("this is not toml = = =")
        run_gc(store, RetentionConfig(keep_epochs=1), now=T0 + timedelta(days=1))
        assert epoch_files(store, "a") == before


class TestArchive:
    def test_a_long_done_task_moves_into_the_archive(self, store: FileStore) -> None:
        """Done for more than finished_after: baton text and every event go into a gzip'd JSON line,
        the ledger keeps one `archived` event saying how many rows went, baton and logs are removed."""
        end = make_task(store, "a", T0, epochs=3, log_bytes=100)
        raw = Path(store.path_of("a")).read_bytes()
        events = store.ledger.events("a")
        result = run_gc(store, RetentionConfig(), now=end + timedelta(days=31))
        assert result.archived == ["a"] and result.archived_rows == len(events)
        assert not Path(store.path_of("a")).exists() and not (Path(store.logs_dir) / "a").exists()
        archive = Path(result.archive_file)
        assert archive.parent == Path(store.state_dir) / "archive" and oct(archive.stat().st_mode & 0o777) == "0o600"
        [record] = [json.loads(line) for line in gzip.decompress(archive.read_bytes()).splitlines()]
        assert record["baton"].encode() == raw and record["baton_sha256"] == hashlib.sha256(raw).hexdigest()
        assert [e["id"] for e in record["events"]] == [e.id for e in events]
        [mark] = store.ledger.events("a")
        assert mark.kind == "archived" and mark.data["rows"] == len(events) and mark.data["archive"] == archive.name

    def test_what_is_not_archived(self, store: FileStore) -> None:
        """Done recently, failed, and active tasks stay; so does a done task an agent still owns."""
        make_task(store, "recent", T0 + timedelta(days=20))
        make_task(store, "failed", T0, finish="failed")
        make_task(store, "active", T0, finish="active")
        make_task(store, "owned", T0)
        with store.edit("owned", actor="daemon", now=T0 + timedelta(days=2)) as ed:
            ed.baton.meta.owner = sim.Owner(pid=1, how="dispatch")
        result = run_gc(store, RetentionConfig(), now=T0 + timedelta(days=45))
        assert result.archived == []
        assert {e.id for e in store.scan()} == {"recent", "failed", "active", "owned"}

    def test_failed_tasks_only_when_asked(self, store: FileStore) -> None:
        """archive_failed = true archives a long-failed task as well; the report still counts it."""
        make_task(store, "failed", T0, finish="failed")
        before = report_json(store)
        result = run_gc(store, RetentionConfig(archive_failed=True), now=T0 + timedelta(days=45))
        assert result.archived == ["failed"] and not Path(store.path_of("failed")).exists()
        assert report_json(store) == before and before["tasks"][0]["status"] == "failed"

    def test_a_task_revived_mid_way_is_not_archived(self, store: FileStore,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        """A done task retried after its archive record was written keeps its baton and rows; the
        stray record in the archive is ignored by the report (no `archived` event names it)."""
        end = make_task(store, "a", T0)
        before = report_json(store)
        write = store.write_archive

        def write_then_revive(name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
            found = write(name, records)
            with store.edit("a", actor="bob", now=end + timedelta(days=31)) as ed:  # `heartbeat retry`
                ed.baton.meta.status = Status.ACTIVE
                ed.event("retried", by="bob", note="")
            return found

        monkeypatch.setattr(store, "write_archive", write_then_revive)
        result = run_gc(store, RetentionConfig(), now=end + timedelta(days=31))
        assert result.archived == [] and result.skipped == [
            ("a", "the baton changed while it was being archived (revived?)")]
        assert store.load("a").meta.status is Status.ACTIVE
        assert not [e for e in store.ledger.events("a") if e.kind in RETENTION_KINDS]
        after = report_json(store)["tasks"][0]
        assert after["status"] == "active"  # and, no longer finished, no duration: the rest is as before
        old = before["tasks"][0]
        assert {**after["metrics"], "duration_s": None} == {**old["metrics"], "duration_s": None}
        assert after["incidents"] == old["incidents"]

    def test_a_damaged_archive_is_an_error_not_lower_totals(self, store: FileStore, hb: Callable[..., Result]
                                                            ) -> None:
        """If an archive the ledger names is damaged, `report` fails with one line instead of
        silently counting less."""
        end = make_task(store, "a", T0)
        result = run_gc(store, RetentionConfig(), now=end + timedelta(days=31))
        Path(result.archive_file).write_bytes(b"not gzip")
        with pytest.raises(StoreError, match="archive is damaged"):
            build_report(store)
        r = hb("report")
        assert r.code == 1 and r.err.startswith("heartbeat: ") and "archive is damaged" in r.err
        assert len(r.err.strip().splitlines()) == 1


class TestReportIsUnchanged:
    def test_every_metric_identical_after_gc(self, store: FileStore, rich: Callable[[FileStore], None]) -> None:
        """A rich ledger: every report metric, per task and in totals, identical after gc folds
        and archives; with --since windows too."""
        rich(store)
        windows = [None, T0 + timedelta(hours=10), T0 + timedelta(days=2)]
        before = [report_json(store, since=s) for s in windows]
        rows_before = store.ledger.count()  # type: ignore[attr-defined]
        result = run_gc(store, RetentionConfig(keep_epochs=2), now=LATER)
        assert len(result.archived) == 32 and sum(result.folded.values()) > 0 and result.removed_files
        assert [report_json(store, since=s) for s in windows] == before
        assert before[0]["totals"]["dispatches"] > 100
        for key in ("resumes", "clean_resumes", "redone_steps", "skipped_steps", "bypassed_blocks",
                    "stale_resumes", "idle_resumes", "spinning", "escalations"):
            assert before[0]["totals"][key] > 0, key  # the ledger really exercises each metric
        assert rows_before > store.ledger.count() == result.ledger_rows_after  # type: ignore[attr-defined]

    def test_folding_alone_keeps_the_report(self, store: FileStore, rich: Callable[[FileStore], None]) -> None:
        """Nothing old enough to archive: touches of finished tasks fold, the report stays identical."""
        rich(store)
        before = report_json(store)
        result = run_gc(store, RetentionConfig(finished_after=10 * 365 * 86400.0), now=LATER)
        assert result.archived == [] and sum(result.folded.values()) > 100
        assert report_json(store) == before

    def test_the_cli_report_json_is_identical(self, store: FileStore, hb: Callable[..., Result],
                                              rich: Callable[[FileStore], None]) -> None:
        """`heartbeat report --json` prints the same document (but its generation time) after `heartbeat gc`."""
        rich(store)
        store.close()

        def report() -> dict[str, Any]:
            r = hb("report", "--json")
            assert r.code == 0, r.err
            doc = json.loads(r.out)
            doc.pop("generated_at")
            return doc

        before, text_before = report(), hb("report").out
        r = hb("gc", "--now", LATER.isoformat())
        assert r.code == 0, r.err
        assert "archive 32 task(s)" in r.out.splitlines()[-1]
        assert report() == before and hb("report").out == text_before

    def test_the_decrease_is_explained_by_the_ledger(self, store: FileStore, rich: Callable[[FileStore], None]) -> None:
        """Rows before - rows after = rows the new `archived` and `compacted` events say they hold,
        minus those events themselves: a soak checker can account for every row."""
        rich(store)
        count_before = store.ledger.count()  # type: ignore[attr-defined]
        ids_before = {r[0] for r in rows(store)}
        run_gc(store, RetentionConfig(), now=LATER)
        new = [e for e in store.ledger.events() if e.id not in ids_before]
        assert new and {e.kind for e in new} == {"archived", "compacted"}
        explained = sum(e.data.get("rows", 0) + e.data.get("folded", 0) for e in new) - len(new)
        assert count_before - store.ledger.count() == explained  # type: ignore[attr-defined]

    def test_a_second_gc_changes_nothing(self, store: FileStore, rich: Callable[[FileStore], None]) -> None:
        """gc is idempotent: a second run at the same instant removes, archives and folds nothing."""
        rich(store)
        run_gc(store, RetentionConfig(keep_epochs=2), now=LATER)
        again = run_gc(store, RetentionConfig(keep_epochs=2), now=LATER)
        assert (again.removed_files, again.archived, again.folded) == ([], [], {})


class TestDryRun:
    def test_changes_nothing_and_says_what_it_would_do(self, state_dir: Path, hb: Callable[..., Result],
                                                       rich: Callable[[FileStore], None]) -> None:
        """`gc --dry-run` prints the files, bytes, tasks and rows it would touch; every file and ledger
        row is as it was, and a real gc then does what the dry run said."""
        s = FileStore(str(state_dir))
        rich(s)
        s.close()
        assert hb("report").code == 0  # the ledger's -wal/-shm exist before the snapshot
        before = snapshot(state_dir)
        r = hb("gc", "--dry-run", "--json", "--now", LATER.isoformat())
        assert r.code == 0, r.err
        planned = json.loads(r.out)
        assert snapshot(state_dir) == before
        assert planned["dry_run"] and len(planned["archived"]) == 32 and planned["removed_bytes"] > 0
        assert planned["archived_bytes"] > 0 and planned["folded_rows"] > 0
        text = hb("gc", "--dry-run", "--now", LATER.isoformat())
        assert "would archive t01" in text.out and "(dry run: nothing changed)" in text.out
        assert snapshot(state_dir) == before
        r = hb("gc", "--json", "--now", LATER.isoformat())
        done = json.loads(r.out)
        for key in ("removed_files", "removed_bytes", "archived", "archived_rows", "folded", "archived_bytes",
                    "ledger_rows_before", "ledger_rows_after"):
            assert done[key] == planned[key], key


class TestConcurrency:
    def test_one_gc_at_a_time(self, store: FileStore) -> None:
        """While one gc holds the state dir's gc lock, another refuses with a clear error."""
        with store.gc_lock(), pytest.raises(GcBusy, match="another gc"):
            run_gc(store, RetentionConfig(), now=LATER)

    def test_the_daemon_runs_gc_beside_its_tick(self, tmp_path: Path) -> None:
        """A real daemon with `every = "1s"` archives a long-done task and prunes old epochs by itself,
        logs `gc`, and keeps ticking."""
        h = DaemonHarness(tmp_path, extra='[retention]\nevery = "1s"\nfinished_after = "1s"\nkeep_epochs = 2\n')
        try:
            old = datetime.now(UTC) - timedelta(days=2)
            make_task(h.store, "old", old, epochs=5, log_bytes=100)
            make_task(h.store, "idle", old, epochs=5, finish="failed", log_bytes=100)
            h.start()
            h.wait(lambda: not Path(h.store.path_of("old")).exists(), "the daemon's gc to archive `old`")
            entry = h.wait_log(lambda e: e.get("event") == "gc" and e.get("archived") == 1, "a gc log line")
            assert entry["removed_files"] >= 12
            assert {int(n.split(".")[0]) for n in epoch_files(h.store, "idle")} == {4, 5}
            ticks = len([e for e in h.log() if e.get("event") == "tick"])
            h.wait(lambda: len([e for e in h.log() if e.get("event") == "tick"]) > ticks + 2, "more ticks")
            report = build_report(h.store).to_json()
            assert {t["id"] for t in report["tasks"]} == {"old", "idle"}
        finally:
            h.stop()
            h.close()


def _counters(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every ``*_total`` sample of one scrape, as Prometheus' own parser reads the exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    from heartbeat.web.metrics import exposition, make_registry

    body, _ = exposition(make_registry(collector))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples if s.name.endswith("_total")}


class TestCountersAcrossGc:
    """Issue 19 item 5: the counters were recounted from the ledger at each scrape, so gc archiving a task
    took its events out of them (escalations 1,044 -> 221): Prometheus read a reset, and the shipped
    HeartbeatEscalation alert (increase() over the window) fired after every daily gc."""

    def test_archiving_leaves_every_counter_where_it_was(self, rich: Callable[[FileStore], None],
                                                          state_dir: Path, hb: Callable[..., Result]) -> None:
        """Forty tasks' history, then a real `heartbeat gc` archiving the finished ones: the same exporter's
        next scrape, a fresh exporter's (a restart), and `heartbeat metrics` all show every counter
        exactly as before, labels included."""
        from heartbeat.web.metrics import HeartbeatCollector

        store = FileStore(str(state_dir))
        rich(store)
        store = FileStore(str(state_dir))
        from heartbeat.model.ledger import Event

        store.record([Event(task="t01", kind="dispatched", ts=T0, data={"launcher": "toy"}),  # labelled ones too
                      Event(task="t01", kind="exited", ts=T0, data={"kind": "failed"}),
                      Event(task="t01", kind="stalled", ts=T0, data={"why": "owner_dead"})])
        collector = HeartbeatCollector(store, state_dir=str(state_dir))
        before = _counters(collector)
        assert before[("heartbeat_escalations_total", (("scope", "store"),))] > 0
        assert before[("heartbeat_exits_total", (("kind", "failed"), ("scope", "store")))] == 1
        assert before[("heartbeat_stalls_total", (("scope", "store"), ("why", "owner_dead")))] == 1
        assert before[("heartbeat_dispatches_total", (("launcher", "toy"), ("scope", "store")))] == 1
        rows = store.ledger.count()
        r = hb("gc", "--now", LATER.isoformat(), "--json")
        assert r.code == 0, r.err
        archived = json.loads(r.out)["archived"]
        assert "t01" in archived and len(archived) > 20 and store.ledger.count() < rows / 2
        assert _counters(collector) == before
        assert _counters(HeartbeatCollector(FileStore(str(state_dir)), state_dir=str(state_dir))) == before
        from prometheus_client.parser import text_string_to_metric_families

        r = hb("metrics")
        assert r.code == 0, r.err
        fresh = {(s.name, tuple(sorted(s.labels.items()))): s.value
                 for f in text_string_to_metric_families(r.out) for s in f.samples if s.name.endswith("_total")}
        assert {k: v for k, v in fresh.items() if k in before} == before

    def test_an_archive_written_before_labels_were_kept_still_counts_its_kinds(self, store: FileStore) -> None:
        """An `archived` event from an older heartbeat has only `kinds`: its counted kinds are still counted,
        unlabelled; a malformed one counts nothing and breaks nothing."""
        from heartbeat.model.ledger import Event
        from heartbeat.web.metrics import HeartbeatCollector

        store.record([Event(task="old", kind="archived", ts=T0, data={"kinds": {"escalated": 2, "exited": 3,
                                                                                "touched": 9}}),
                      Event(task="bad", kind="archived", ts=T0, data={"counted": {"escalated": {"": "many"}},
                                                                      "kinds": "x"})])
        found = _counters(HeartbeatCollector(store, state_dir=store.state_dir))
        assert found[("heartbeat_escalations_total", (("scope", "store"),))] == 2
        assert found[("heartbeat_exits_total", (("kind", "unknown"), ("scope", "store")))] == 3

    def test_no_counter_goes_down_within_one_process(self, store: FileStore) -> None:
        """Events that vanish from the ledger by any path (a write whose rename never happened) leave the
        counters of a running exporter where they were; a new process counts what the ledger holds."""
        from heartbeat.model.ledger import Event
        from heartbeat.web.metrics import HeartbeatCollector

        make_task(store, "t", T0)
        collector = HeartbeatCollector(store, state_dir=store.state_dir)
        before = _counters(collector)
        ids = [e.id or 0 for e in store.ledger.events("t") if e.kind == "dispatched"]
        store.ledger.fold("t", ids, [Event(task="t", kind="compacted", ts=T0, data={})])
        assert _counters(collector) == before
        fresh = _counters(HeartbeatCollector(store, state_dir=store.state_dir))
        assert sum(v for (name, _), v in fresh.items() if name == "heartbeat_dispatches_total") == 0
