"""Archives travel with ``heartbeat export`` / ``import`` / ``migrate`` (issue 19 item 2's follow-up):
gc's archives (files in ``<state_dir>/archive/``, rows of ``heartbeat_archive``) are carried with
the ``archived`` events that name them, in every direction, byte for byte, so ``heartbeat report``
on the target is the source's. Before, the events went and the archives stayed behind: the
report on the target stopped with "the archive ... ". A real throwaway cluster (tests/support/pg.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from conftest import Result, clean_env

from heartbeat.config.shape import RetentionConfig
from heartbeat.model.errors import BadInput, Conflict, StoreError
from heartbeat.ops.retention import run_gc
from heartbeat.ops.transfer import Counts, export_lines, import_lines, migrate
from heartbeat.reports.report import build_report
from heartbeat.store.base import Archiving, Store
from heartbeat.store.files import FileStore
from heartbeat.store.postgres.store import PostgresStore
from tests.integration.test_retention import sim

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MID = T0 + timedelta(days=200)
LATER = T0 + timedelta(days=400)

Opener = Callable[[str], Store]


@pytest.fixture
def other_pg_url(pg_cluster: Any, pg_url: str) -> str:
    """A second database at the current schema, on the same throwaway cluster."""
    name = urlsplit(pg_url).path.lstrip("/") + "_b"
    with psycopg.connect(pg_cluster.host_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE hb_template')
    return str(pg_cluster.url(name))


@pytest.fixture
def places(tmp_path: Path, pg_url: str, other_pg_url: str) -> Iterator[dict[str, Store]]:
    """Two state dirs and two databases, each an empty store; closed at the end."""
    opened: dict[str, Store] = {}
    for key in ("files", "files2"):
        state = tmp_path / key
        state.mkdir(mode=0o700)
        opened[key] = FileStore(str(state))
    opened["pg"], opened["pg2"] = PostgresStore(pg_url), PostgresStore(other_pg_url)
    yield opened
    for store in opened.values():
        store.close()


def write(store: Store, task: str, start: datetime, *, seed: int, finish: str = "done") -> None:
    sim.write_history(store, task, start, random.Random(seed), epochs=2 + seed % 4, touches=3, finish=finish)


def gc_twice(store: Store) -> None:
    """Two gc runs, so two archives: eight tasks of the first months, then four more; an active
    task, a failed one and a recent one stay live."""
    for n in range(8):
        write(store, f"early{n}", T0 + timedelta(hours=n), seed=n, finish="failed" if n == 3 else "done")
    write(store, "active", T0, seed=20, finish="active")
    assert len(run_gc(store, RetentionConfig(), now=MID).archived) == 7
    for n in range(4):
        write(store, f"late{n}", MID + timedelta(hours=n), seed=10 + n)
    write(store, "recent", LATER - timedelta(days=2), seed=30)
    assert len(run_gc(store, RetentionConfig(), now=LATER).archived) == 4


def report(store: Store) -> dict[str, Any]:
    return build_report(store, now=LATER).to_json()


def archive_bytes(store: Store, name: str) -> bytes:
    """The archive as the store keeps it: the file's bytes, the row's body."""
    if isinstance(store, FileStore):
        return (Path(store.layout.archive_dir) / name).read_bytes()
    with psycopg.connect(store.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        row = conn.execute("SELECT body FROM heartbeat_archive WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return bytes(row[0])


def everything(store: Store) -> tuple[list[str], dict[str, list[dict[str, Any]]], list[str]]:
    """What a store holds: baton ids, each task's events in order (migrate copies task by task), archive names."""
    assert isinstance(store, Archiving)
    events: dict[str, list[dict[str, Any]]] = {}
    for event in store.ledger.events():
        doc = event.to_json()
        del doc["id"]
        events.setdefault(event.task, []).append(doc)
    return sorted(e.id for e in store.scan()), events, store.archive_names()


DIRECTIONS = [("files", "pg"), ("pg", "files"), ("files", "files2"), ("pg", "pg2")]


class TestMigrate:
    @pytest.mark.parametrize(("source", "target"), DIRECTIONS, ids=[f"{a}-to-{b}" for a, b in DIRECTIONS])
    def test_the_report_and_the_archives_are_the_same_on_the_target(self, places: dict[str, Store], source: str,
                                                                     target: str) -> None:
        """After two gc runs on the source, migrate carries both archives byte for byte (a file's
        bytes are a row's body and back) and the report on the target equals the source's; a second
        migrate copies nothing and keeps the archives (fails on 4427533: the target's report stops
        with "the archive ... ")."""
        src, dst = places[source], places[target]
        gc_twice(src)
        assert isinstance(src, Archiving) and isinstance(dst, Archiving)
        names = src.archive_names()
        assert len(names) == 2
        expected = report(src)
        counts, skipped = migrate(src, dst)
        assert report(dst) == expected
        assert dst.archive_names() == names
        assert [archive_bytes(dst, n) for n in names] == [archive_bytes(src, n) for n in names]
        assert skipped == [] and counts.archives == 2
        assert dst.archived_tasks().keys() == src.archived_tasks().keys()
        assert everything(dst) == everything(src)
        again, _ = migrate(src, dst)
        assert (again.batons, again.events, again.archives, again.archives_kept) == (0, 0, 0, 2)
        assert report(dst) == expected

    def test_an_archive_of_the_same_name_with_other_records_is_refused(self, places: dict[str, Store]) -> None:
        """The target holding an archive of that name with other records contradicts the source:
        Conflict, nothing written."""
        src, dst = places["files"], places["pg"]
        gc_twice(src)
        assert isinstance(src, Archiving) and isinstance(dst, Archiving)
        name = src.archive_names()[0]
        dst.write_archive(name, [{"task": "other", "baton": "", "baton_sha256": "", "events": []}])
        before = everything(dst)
        with pytest.raises(Conflict, match=f"holds an archive {name} with other records; nothing was written"):
            migrate(src, dst)
        assert everything(dst) == before

    def test_a_damaged_archive_on_the_source_is_one_line_and_nothing_written(self, places: dict[str, Store]) -> None:
        """An archive file cut short on the source (its report fails the same way) stops the migration
        in one line before anything is written: history is never left out of a copy."""
        src, dst = places["files"], places["pg"]
        gc_twice(src)
        assert isinstance(src, Archiving)
        path = Path(src.layout.archive_dir) / src.archive_names()[0]  # type: ignore[attr-defined]
        path.write_bytes(path.read_bytes()[:-20])
        with pytest.raises(StoreError, match="the archive is damaged") as caught:
            migrate(src, dst)
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)
        assert everything(dst) == ([], {}, [])


def export_of(store: Store) -> list[str]:
    counts = Counts()
    return list(export_lines(store, counts))


def lines_where(lines: list[str], change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> list[str]:
    """The export with ``change`` applied to each parsed line (None drops it)."""
    out = []
    for line in lines:
        doc = change(json.loads(line))
        if doc is not None:
            out.append(json.dumps(doc) + "\n")
    return out


class TestImport:
    @pytest.mark.parametrize(("source", "target"), [("pg", "files"), ("files", "pg")])
    def test_export_then_import_carries_the_archives(self, places: dict[str, Store], source: str,
                                                     target: str) -> None:
        """An export is format 2 with one line per archived record; importing it gives the same report
        and archives, and importing it again writes nothing more (fails on 4427533)."""
        src, dst = places[source], places[target]
        gc_twice(src)
        lines = export_of(src)
        assert json.loads(lines[0]) == {"heartbeat_export": 2}
        assert sum(1 for line in lines if '"archive"' in line[:12]) == 11
        counts = import_lines(dst, lines)
        assert report(dst) == report(src) and everything(dst) == everything(src)
        assert counts.archives == 2
        again = import_lines(dst, lines)
        assert (again.batons, again.events, again.archives, again.archives_kept) == (0, 0, 0, 2)

    def test_a_store_without_archives_exports_format_1_and_format_1_still_imports(
            self, places: dict[str, Store]) -> None:
        """No archive, no archive lines: the header stays format 1 (older heartbeats read it), and an
        export written before archives travelled imports as before."""
        src = places["files"]
        write(src, "only", T0, seed=1, finish="active")
        lines = export_of(src)
        assert json.loads(lines[0]) == {"heartbeat_export": 1}
        counts = import_lines(places["pg"], lines)
        assert counts.batons == 1 and report(places["pg"]) == report(src)
        assert everything(places["pg"]) == everything(src)

    @pytest.mark.parametrize("tamper", ["one event less", "another baton", "archive left out", "a record left out",
                                        "kinds changed"])
    def test_an_archive_that_does_not_match_its_event_is_refused_and_nothing_written(
            self, places: dict[str, Store], tamper: str) -> None:
        """An export whose archive record does not match its `archived` event (a row count, a baton
        whose sha256 differs, the kinds, a record or a whole archive missing) is refused in one line
        naming the archive and the task, and the target is left exactly as it was."""
        src, dst = places["files"], places["pg"]
        gc_twice(src)
        write(dst, "mine", T0, seed=5, finish="active")
        before = everything(dst)
        victim = "early1"

        def change(doc: dict[str, Any]) -> dict[str, Any] | None:
            record = doc.get("record")
            if not record or record["task"] != victim:
                return doc
            if tamper == "one event less":
                record["events"].pop()
            elif tamper == "another baton":
                record["baton"] += "# changed\n"
            elif tamper == "kinds changed":
                record["events"][-1]["kind"] = "touched" if record["events"][-1]["kind"] != "touched" else "done"
            elif tamper == "a record left out":
                return None
            return doc

        lines = export_of(src)
        named = victim
        if tamper == "archive left out":
            named = next(json.loads(x)["archive"] for x in lines if '"record": {' in x and f'"task": "{victim}"' in x)
            lines = lines_where(lines, lambda d: None if d.get("archive") == named else d)
        else:
            lines = lines_where(lines, change)
        with pytest.raises(BadInput) as caught:
            import_lines(dst, lines, where="x.jsonl")
        message = str(caught.value)
        assert "\n" not in message and message.startswith("x.jsonl: ") and named in message, message
        assert message.endswith("nothing was written"), message
        assert everything(dst) == before

    @pytest.mark.parametrize("name", ["../../../tmp/evil.jsonl.gz", "x", "20260101T000000000000Z.jsonl.gz/../a"])
    def test_an_archive_name_gc_would_not_make_is_refused(self, places: dict[str, Store], name: str,
                                                          tmp_path: Path) -> None:
        """An archive line names a file in the target's archive dir: only gc's names are taken, so no
        path leaves it; refused in one line, nothing written."""
        lines = ['{"heartbeat_export": 2}\n', json.dumps({"archive": name, "record": {"task": "a"}}) + "\n"]
        dst = places["files"]
        with pytest.raises(BadInput, match="an archive line needs an archive name as gc makes them"):
            import_lines(dst, lines, where="x.jsonl")
        assert everything(dst) == ([], {}, [])
        assert not (tmp_path / "evil.jsonl.gz").exists() and not Path("/tmp/evil.jsonl.gz").exists()

    def test_a_hostile_task_id_in_an_archived_event_stays_one_line(self, places: dict[str, Store]) -> None:
        """An `archived` event whose task id holds a newline, naming an archive the export lacks: one
        line (the id quoted), nothing written."""
        event = {"ts": "2026-01-01T00:00:00+00:00", "task": "a\nb", "kind": "archived",
                 "data": {"archive": "20260101T000000000000Z.jsonl.gz", "baton_sha256": "0"}}
        lines = ['{"heartbeat_export": 1}\n', json.dumps({"event": event}) + "\n"]
        with pytest.raises(BadInput) as caught:
            import_lines(places["pg"], lines, where="x.jsonl")
        assert "\n" not in str(caught.value) and "'a\\nb'" in str(caught.value), str(caught.value)
        assert everything(places["pg"]) == ([], {}, [])


def hb(tmp_path: Path, where: str, *args: str) -> Result:
    env = clean_env(HEARTBEAT_STATE_DIR=where) if where.startswith("/") else clean_env(
        HEARTBEAT_STORE_URL=where, HEARTBEAT_STATE_DIR=str(tmp_path / "pg-host"))
    proc = subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=str(tmp_path))
    return Result(proc.returncode, proc.stdout, proc.stderr)


class TestCommandLine:
    def test_migrate_both_ways_then_report_is_the_same(self, places: dict[str, Store], pg_url: str,
                                                       tmp_path: Path) -> None:
        """`heartbeat migrate` files -> PostgreSQL -> a new state dir: `heartbeat report --json` is the
        same in all three places (fails on 4427533: exit 1, "the archive ..." on the targets)."""
        src = places["files"]
        gc_twice(src)
        state = str(tmp_path / "files")
        back = str(tmp_path / "back")
        os.mkdir(back, 0o700)
        first = hb(tmp_path, state, "migrate", "--from", state, "--to", pg_url)
        second = hb(tmp_path, back, "migrate", "--from", pg_url, "--to", back)
        assert first.code == second.code == 0, (first.err, second.err)
        reports = [hb(tmp_path, where, "report", "--json") for where in (state, pg_url, back)]
        assert [r.code for r in reports] == [0, 0, 0], [r.err for r in reports]
        assert "and 2 archive(s)" in first.out and "and 2 archive(s)" in second.out, (first.out, second.out)
        docs = [json.loads(r.out) for r in reports]
        for doc in docs:
            del doc["generated_at"]
        assert docs[0]["totals"] == docs[1]["totals"] == docs[2]["totals"]
        assert docs[0] == docs[1] == docs[2]

    def test_a_tampered_import_is_one_line_and_writes_nothing(self, places: dict[str, Store], tmp_path: Path) -> None:
        """`heartbeat import` of an export whose record lost an event: exit 2, one line, nothing written."""
        src = places["files"]
        gc_twice(src)
        lines = lines_where(export_of(src), lambda d: {**d, "record": {**d["record"], "events": []}}
                            if d.get("record", {}).get("task") == "late2" else d)
        path = tmp_path / "tampered.jsonl"
        path.write_text("".join(lines), encoding="utf-8")
        target = str(tmp_path / "files2")
        r = hb(tmp_path, target, "import", str(path))
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, (r.code, r.err)
        assert "late2" in r.err and "nothing was written" in r.err
        assert everything(places["files2"]) == ([], {}, [])


def _export(*rows: dict[str, Any]) -> list[str]:
    return [json.dumps(row) + "\n" for row in ({"heartbeat_export": 2}, *rows)]


def _event(task: str, *, revision: int = 1, kind: str = "created") -> dict[str, Any]:
    return {"event": {"ts": "2026-01-01T00:00:00+00:00", "task": task, "kind": kind, "epoch": 0,
                      "revision": revision, "actor": "cli", "data": {}}}


GOOD_BATON = {"baton": "good", "text": 'task = "t"\nstep = "s"\n\n[meta]\nid = "good"\nrevision = 1\n'}


class TestImportRefusesRowsWithoutABaton:
    """Issue 24 item 7: ledger rows of tasks with no baton (ids ``""``, ``/etc/passwd``, 100,000
    characters, ``../batons/good``) were imported: `report` lines 100,109 characters wide, a
    revision of 10**12 carried into a later `new`, 2**63 a raw SQLite error."""

    @pytest.mark.parametrize("store_key", ["files", "pg"])
    @pytest.mark.parametrize("task", ["", "/etc/passwd", "x" * 100_000, "../batons/good"])
    def test_a_bad_task_id_refuses_the_whole_file_in_one_line(self, places: dict[str, Store], store_key: str,
                                                              task: str) -> None:
        """One short line naming the line, nothing written, not even the valid baton beside it
        (on 4c852cf: imported)."""
        store = places[store_key]
        with pytest.raises(BadInput) as caught:
            import_lines(store, _export(GOOD_BATON, _event("good"), _event(task)), where="x.jsonl")
        message = str(caught.value)
        assert message.startswith("x.jsonl:4: an event with bad task id") and len(message) < 300, message
        assert "nothing was written" in message
        assert everything(store) == ([], {}, [])

    @pytest.mark.parametrize("store_key", ["files", "pg"])
    def test_events_of_a_task_with_no_baton_are_refused(self, places: dict[str, Store], store_key: str) -> None:
        """A valid id whose baton is in neither the export nor the store (a revision of 10**12 that a later
        `new ghost` would continue): refused naming it, nothing written (on 4c852cf: imported)."""
        store = places[store_key]
        with pytest.raises(BadInput) as caught:
            import_lines(store, _export(GOOD_BATON, _event("good"), _event("ghost", revision=10**12)), where="x.jsonl")
        assert str(caught.value) == ("x.jsonl:4: events of task ghost, which has no baton in the export or the "
                                     "store; nothing was written")
        assert everything(store) == ([], {}, [])

    @pytest.mark.parametrize("store_key", ["files", "pg"])
    @pytest.mark.parametrize("field", ["revision", "epoch"])
    def test_a_number_past_2_53_is_one_line_not_a_database_error(self, places: dict[str, Store], store_key: str,
                                                                 field: str) -> None:
        """2**63 (past SQLite's and PostgreSQL's bigint): a clean refusal, nothing written (on 4c852cf: the
        whole import failed with a raw SQLite message)."""
        store = places[store_key]
        row = _event("good")
        row["event"][field] = 2**63
        with pytest.raises(BadInput) as caught:
            import_lines(store, _export(GOOD_BATON, row), where="x.jsonl")
        assert str(caught.value) == (f"x.jsonl:3: an event with {field} '9223372036854775808' is not a whole number "
                                     "from 0 to 2**53; nothing was written")
        assert everything(store) == ([], {}, [])

    @pytest.mark.parametrize("kind", ["", "x" * 100_000, "Created\nforged", 7])
    def test_a_kind_that_is_no_word_is_refused(self, places: dict[str, Store], kind: object) -> None:
        """An event kind of 100,000 characters, a newline, a number: one short line, nothing written."""
        store = places["files"]
        row = _event("good")
        row["event"]["kind"] = kind
        with pytest.raises(BadInput) as caught:
            import_lines(store, _export(GOOD_BATON, row), where="x.jsonl")
        assert str(caught.value).startswith("x.jsonl:3: an event with kind") and len(str(caught.value)) < 200
        assert everything(store) == ([], {}, [])

    def test_events_of_a_task_the_store_holds_are_imported(self, places: dict[str, Store]) -> None:
        """A task whose baton is in the target already (no events there yet): its events are taken."""
        store = places["files"]
        assert import_lines(store, _export(GOOD_BATON)).batons == 1
        counts = import_lines(store, _export(_event("good")))
        assert counts.events == 1
