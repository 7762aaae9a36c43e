"""The store contract (``heartbeat/store/base.py``), run against every store implementation."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from heartbeat.model.baton import Baton, Meta, Status
from heartbeat.model.errors import AlreadyExists, BadInput, Conflict, NotFound
from heartbeat.model.ledger import Event
from heartbeat.store.base import Store
from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore

T0 = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, state_dir: Path) -> Iterator[Store]:
    """Each test in this file runs once per store implementation; on PostgreSQL (a real server) in
    tests/external/test_store_contract_postgres.py."""
    s: Store = FileStore(str(state_dir)) if request.param == "file" else MemoryStore()
    yield s
    s.close()


def _baton(task_id: str = "t", **fields: object) -> Baton:
    values: dict[str, object] = {"task": "Fix the fallback", "step": "Read the logs"}
    values.update(fields)
    return Baton(meta=Meta(id=task_id), **values)  # type: ignore[arg-type]


class BoomError(Exception):
    pass


class TestStoreContract:
    def test_create_then_load(self, store: Store) -> None:
        """create writes revision 1 with its times stamped, and load returns the same baton."""
        written = store.create(_baton(intent="why", constraints=["never X"]), now=T0)
        assert written.meta.revision == 1
        assert written.meta.created_at == written.meta.updated_at == written.meta.progress_at == T0
        loaded = store.load("t")
        assert loaded == written
        assert loaded.intent == "why" and loaded.constraints == ["never X"]

    def test_create_twice_is_refused(self, store: Store) -> None:
        """A second create of the same id is AlreadyExists (exit 5) and leaves the first baton alone."""
        store.create(_baton(step="first"))
        with pytest.raises(AlreadyExists) as info:
            store.create(_baton(step="second"))
        assert info.value.exit_code == 5
        assert store.load("t").step == "first"

    def test_create_refuses_bad_id(self, store: Store) -> None:
        """A baton whose id is not a valid task id is never written."""
        with pytest.raises(BadInput):
            store.create(_baton("../escape"))
        assert store.scan() == []

    def test_load_missing_is_not_found(self, store: Store) -> None:
        """Loading an id with no baton is NotFound (exit 1)."""
        with pytest.raises(NotFound) as info:
            store.load("nope")
        assert info.value.exit_code == 1

    def test_load_returns_a_copy(self, store: Store) -> None:
        """Mutating a loaded baton changes nothing stored."""
        store.create(_baton())
        loaded = store.load("t")
        loaded.step = "changed"
        loaded.done.append("x")
        assert store.load("t").step == "Read the logs"
        assert store.load("t").done == []

    def test_edit_writes_and_bumps_revision(self, store: Store) -> None:
        """Each edit bumps the revision by exactly one and its change is what the next load sees."""
        store.create(_baton())
        for expected in range(2, 6):
            with store.edit("t") as ed:
                ed.baton.next_step = f"n{expected}"
            assert store.load("t").meta.revision == expected
            assert store.load("t").next_step == f"n{expected}"

    def test_edit_exposes_old_and_now(self, store: Store) -> None:
        """The edit carries the baton as it was and the write's time; progress stamps progress_at."""
        store.create(_baton(), now=T0)
        later = T0 + timedelta(minutes=5)
        with store.edit("t", now=later) as ed:
            assert ed.old.step == "Read the logs" and ed.now == later
            ed.baton.step = "Patch the code"
        meta = store.load("t").meta
        assert meta.updated_at == later and meta.progress_at == later and meta.touched_at == later

    def test_expect_revision_match_writes(self, store: Store) -> None:
        """A write naming the current revision goes through."""
        store.create(_baton())
        with store.edit("t", expect_revision=1) as ed:
            ed.baton.step = "next"
        assert store.load("t").meta.revision == 2

    def test_expect_revision_conflict_changes_nothing(self, store: Store) -> None:
        """A write naming a revision that moved on is Conflict (exit 5); the baton and ledger are untouched."""
        store.create(_baton())
        with store.edit("t") as ed:
            ed.baton.step = "moved on"
        before = store.load("t")
        events_before = len(store.ledger.events("t"))
        with pytest.raises(Conflict, match="expected revision 1 but the baton is at revision 2") as info:
            with store.edit("t", expect_revision=1) as ed:
                ed.baton.step = "stale write"
        assert info.value.exit_code == 5
        assert store.load("t") == before
        assert len(store.ledger.events("t")) == events_before

    def test_epoch_conflict_changes_nothing(self, store: Store) -> None:
        """A write carrying an epoch older than the baton's is refused: a zombie cannot overwrite its successor."""
        store.create(_baton())
        with store.edit("t") as ed:
            ed.baton.meta.epoch = 3
        before = store.load("t")
        for stale in (0, 2):
            with pytest.raises(Conflict, match=f"epoch {stale} has been superseded by epoch 3"):
                with store.edit("t", epoch=stale) as ed:
                    ed.baton.step = "zombie write"
        with pytest.raises(Conflict, match="ahead of"):
            with store.edit("t", epoch=4) as ed:
                ed.baton.step = "from the future"
        assert store.load("t") == before

    def test_current_epoch_writes(self, store: Store) -> None:
        """A write carrying the baton's own epoch goes through."""
        store.create(_baton())
        with store.edit("t") as ed:
            ed.baton.meta.epoch = 2
        with store.edit("t", epoch=2) as ed:
            ed.baton.step = "mine"
        assert store.load("t").step == "mine"

    def test_cancel_writes_nothing(self, store: Store) -> None:
        """An edit that calls cancel() writes nothing and records no event."""
        store.create(_baton())
        before = store.load("t")
        events_before = len(store.ledger.events("t"))
        with store.edit("t") as ed:
            ed.baton.step = "never written"
            ed.event("blocked", on="x", gate="human")
            ed.cancel()
        assert store.load("t") == before
        assert len(store.ledger.events("t")) == events_before

    def test_exception_writes_nothing(self, store: Store) -> None:
        """An exception inside an edit propagates, and neither the baton nor the ledger changes."""
        store.create(_baton())
        before = store.load("t")
        events_before = len(store.ledger.events("t"))
        with pytest.raises(BoomError):
            with store.edit("t") as ed:
                ed.baton.step = "half done"
                raise BoomError
        assert store.load("t") == before
        assert len(store.ledger.events("t")) == events_before

    def test_edit_of_missing_task_is_not_found(self, store: Store) -> None:
        """Editing an id with no baton is NotFound, and creates nothing."""
        with pytest.raises(NotFound):
            with store.edit("ghost") as ed:
                ed.baton.step = "x"
        assert store.scan() == []

    def test_edit_cannot_rename_a_task(self, store: Store) -> None:
        """meta.id is the file's: an edit that changes it is written under the original id."""
        store.create(_baton())
        with store.edit("t") as ed:
            ed.baton.meta.id = "other"
        assert store.load("t").meta.id == "t"
        with pytest.raises(NotFound):
            store.load("other")

    def test_scan_lists_every_task_sorted(self, store: Store) -> None:
        """scan returns one entry per task, sorted by id, each with its baton."""
        for task_id in ("b", "a", "c"):
            store.create(_baton(task_id))
        entries = store.scan()
        assert [e.id for e in entries] == ["a", "b", "c"]
        assert all(e.baton is not None and e.error is None for e in entries)
        assert store.scan()[1].baton == store.load("b")

    def test_scan_sees_edits(self, store: Store) -> None:
        """A scan after an edit returns the edited baton (no stale cache)."""
        store.create(_baton())
        store.scan()
        with store.edit("t") as ed:
            ed.baton.step = "after"
        (entry,) = store.scan()
        assert entry.baton is not None and entry.baton.step == "after"

    def test_events_recorded_for_create_and_edit(self, store: Store) -> None:
        """create records `created`; a plain edit records `updated` naming the changed fields."""
        store.create(_baton(), now=T0)
        with store.edit("t", now=T0 + timedelta(seconds=1)) as ed:
            ed.baton.step = "two"
            ed.baton.next_step = "three"
        events = store.ledger.events("t")
        assert [e.kind for e in events] == ["created", "updated"]
        assert events[0].data["task"] == "Fix the fallback" and events[0].data["status"] == "active"
        assert events[1].revision == 2
        assert events[1].data["changed"] == ["step", "next_step"]
        assert events[1].data["step"] == "two" and events[1].data["from_step"] == "Read the logs"

    def test_named_events_replace_updated(self, store: Store) -> None:
        """An edit that names its event records that kind (with the write's epoch and revision), not `updated`."""
        store.create(_baton())
        with store.edit("t", actor="ops") as ed:
            ed.baton.meta.status = Status.BLOCKED
            ed.baton.blocked_on = "approval"
            ed.event("blocked", on="approval", gate="human")
        (event,) = store.ledger.events("t", kinds=["blocked"])
        assert event.data["on"] == "approval" and event.actor == "ops" and event.revision == 2
        assert [e.kind for e in store.ledger.events("t")] == ["created", "blocked"]

    def test_touch_is_not_progress(self, store: Store) -> None:
        """A touch stamps touched_at but not updated_at or progress_at, and records `touched`."""
        store.create(_baton(), now=T0)
        later = T0 + timedelta(minutes=1)
        with store.edit("t", touch=True, now=later):
            pass
        meta = store.load("t").meta
        assert meta.touched_at == later and meta.updated_at == T0 and meta.progress_at == T0
        assert meta.revision == 2
        assert store.ledger.events("t")[-1].kind == "touched"

    def test_progress_resets_attempts(self, store: Store) -> None:
        """Progress (step changed, or done grew) resets attempt and idle_resumes; other writes do not."""
        store.create(_baton())
        with store.edit("t") as ed:
            ed.baton.meta.attempt = 3
            ed.baton.meta.idle_resumes = 2
        with store.edit("t") as ed:
            ed.baton.next_step = "not progress"
        assert store.load("t").meta.attempt == 3
        with store.edit("t") as ed:
            ed.baton.done.append("Read the logs")
        assert (store.load("t").meta.attempt, store.load("t").meta.idle_resumes) == (0, 0)

    def test_record_appends_events_without_a_write(self, store: Store) -> None:
        """record() adds events (an agent's exit) without touching the baton."""
        store.create(_baton())
        before = store.load("t")
        store.record([Event(task="t", kind="exited", ts=T0, data={"code": 0, "signal": None})])
        assert store.load("t") == before
        assert store.ledger.events("t", kinds=["exited"])[0].data == {"code": 0, "signal": None}

    def test_needs_declared_and_learned(self, store: Store) -> None:
        """A downstream's needs round-trip; its upstream's done is refused while one is empty; two runs
        re-deriving a part teach it (a need_learned event read back by kind across tasks), and the
        third run's upstream is refused on it; a pin and a drop are folded from the events."""
        from heartbeat.config.shape import HandoffConfig
        from heartbeat.model.errors import NeedsUnmet
        from heartbeat.tasks import needs
        from heartbeat.tasks import verbs as tasks

        config = HandoffConfig()
        for run in ("p1", "p2", "p3"):
            tasks.new_task(store, f"{run}.build", task="Build", step="build", intent="why")
            tasks.new_task(store, f"{run}.review", task="Review", step="review", after=[f"{run}.build"],
                           needs=["decisions"])
        assert store.load("p1.review").needs == ["decisions"]
        with pytest.raises(NeedsUnmet) as info:
            tasks.finish(store, "p1.build", checks={})
        assert info.value.exit_code == 4 and "p1.review needs `decisions` (declared)" in str(info.value)
        assert store.ledger.events("p1.build", kinds=["needs_unmet"])
        for run in ("p1", "p2"):
            tasks.add_items(store, f"{run}.build", "decisions", ["an LRU"])
            tasks.finish(store, f"{run}.build", checks={})
            tasks.add_items(store, f"{run}.review", "rederived", ["rejected: Redis was tried"])
            needs.learn(store, [f"{run}.review"], config)
        learned = store.ledger.events(kinds=["need_learned"])
        assert [e.data["part"] for e in learned] == ["rejected"]
        assert learned[0].data["evidence"] == "review re-derived `rejected` in 2 of the last 2 handoffs"
        tasks.add_items(store, "p3.build", "decisions", ["an LRU"])
        with pytest.raises(NeedsUnmet) as info:
            tasks.finish(store, "p3.build", checks={})
        assert "`rejected` (learned" in str(info.value)
        needs.pin(store, "p3.review", pin_parts=["key_files"], drop_parts=["rejected"], by="ann")
        found = needs.edge_needs(store, store.load("p3.review"), "p3.build")
        assert [(n.part, n.source.value) for n in found] == [("decisions", "declared"), ("key_files", "pinned")]

    def test_unknown_keys_survive_edits(self, store: Store) -> None:
        """Unknown keys at the top and in meta are carried through every edit."""
        baton = _baton()
        baton.extra = {"custom": {"nested": [1, 2]}}
        baton.meta.extra = {"vendor": "x"}
        store.create(baton)
        with store.edit("t") as ed:
            ed.baton.step = "another"
        loaded = store.load("t")
        assert loaded.extra == {"custom": {"nested": [1, 2]}} and loaded.meta.extra == {"vendor": "x"}


class TestChangeFeed:
    """``Store.watch`` and ``scan_unchanged``: what the daemon reads instead of reaching into a store."""

    def test_a_write_is_reported_by_task_id_until_the_watch_stops(self, store: Store) -> None:
        """Every store calls the watcher with the id of a baton written, and stops calling once unwatched."""
        import threading

        from conftest import wait_for

        from heartbeat.tasks import verbs as tasks

        heard: list[str | None] = []
        lock = threading.Lock()

        def hear(task_id: str | None) -> None:
            with lock:
                heard.append(task_id)

        stop = store.watch(hear)
        try:
            store.create(_baton("fed"))
            tasks.set_fields(store, "fed", {"step": "next"})
            wait_for(lambda: "fed" in heard, message="the store's change feed to report 'fed'")
        finally:
            stop(timeout=5.0)
        with lock:
            heard.clear()
        tasks.set_fields(store, "fed", {"step": "after the watch"})
        store.load("fed")  # (a file store's inotify would have had time to report by the next write)
        assert "fed" not in heard

    def test_scan_unchanged_never_claims_a_changed_scan(self, store: Store) -> None:
        """A scan after a write is never "unchanged"; a store may say so of a quiet one, or never."""
        from heartbeat.tasks import verbs as tasks

        store.create(_baton("q"))
        store.scan()
        tasks.set_fields(store, "q", {"step": "moved"})
        store.scan()
        assert store.scan_unchanged is False
        first = store.scan()
        again = store.scan()
        assert [e.id for e in again] == [e.id for e in first] == ["q"]

    def test_a_quiet_scan_reads_no_baton(self, store: Store) -> None:
        """``reads`` counts the batons scans parsed: a scan of a store nobody wrote since reads none."""
        from heartbeat.tasks import verbs as tasks

        store.create(_baton("r1"))
        store.create(_baton("r2"))
        store.scan()
        before = store.reads
        store.scan()
        store.scan()
        assert store.reads == before
        tasks.set_fields(store, "r1", {"step": "moved"})
        store.scan()
        assert store.reads - before in (0, 1)  # one re-read, or none for a store that parses nothing
