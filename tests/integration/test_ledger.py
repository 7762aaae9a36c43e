"""The ledger: one event per thing that happened, with the agreed kinds and data keys."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import Result

from heartbeat.model.baton import Gate, Owner, Status
from heartbeat.model.errors import Conflict, NotActive
from heartbeat.model.ledger import Event, Ledger
from heartbeat.store.files import FileStore
from heartbeat.store.ledger import MemoryLedger, SqliteLedger
from heartbeat.tasks import verbs as tasks

Hb = Callable[..., Result]


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


T0 = datetime(2026, 11, 29, 6, 0, 5, tzinfo=UTC)  # five seconds into a minute


def _kinds(store: FileStore, task_id: str) -> list[str]:
    return [e.kind for e in store.ledger.events(task_id)]


def _last(store: FileStore, task_id: str) -> Event:
    return store.ledger.events(task_id)[-1]


@pytest.fixture(params=["sqlite", "memory"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """Each ledger implementation in turn."""
    led: Ledger = SqliteLedger(str(tmp_path / "ledger.sqlite3")) if request.param == "sqlite" else MemoryLedger()
    yield led
    led.close()


class TestEveryVerb:
    def test_created(self, file_store: FileStore) -> None:
        """new: `created` with task, step and status, at revision 1."""
        tasks.new_task(file_store, "v", task="Fix it", step="Look", actor="alice")
        (event,) = file_store.ledger.events("v")
        assert event.kind == "created" and event.revision == 1 and event.actor == "alice"
        assert {"task": "Fix it", "step": "Look", "status": "active"}.items() <= event.data.items()

    def test_updated_names_the_changed_fields(self, file_store: FileStore) -> None:
        """set/add: `updated` with the changed fields, the step move and the items done."""
        tasks.new_task(file_store, "v", task="t", step="one")
        tasks.set_fields(file_store, "v", {"step": "two", "intent": "why"})
        event = _last(file_store, "v")
        assert event.kind == "updated" and event.data["changed"] == ["intent", "step"]
        assert (event.data["step"], event.data["from_step"]) == ("two", "one")
        tasks.add_items(file_store, "v", "done", ["one", "two"])
        event = _last(file_store, "v")
        assert event.data["changed"] == ["done"] and event.data["done"] == ["one", "two"]
        assert "step" not in event.data

    def test_blocked_and_unblocked(self, file_store: FileStore) -> None:
        """block: `blocked` with on and the gate; unblock: `unblocked` with by, note, was_on, gate."""
        tasks.new_task(file_store, "v", task="t", step="s")
        tasks.block(file_store, "v", "the deploy window", Gate.parse("time:2030-01-01T00:00:00Z"))
        event = _last(file_store, "v")
        assert event.kind == "blocked"
        assert {"on": "the deploy window", "gate": "time:2030-01-01T00:00:00+00:00"}.items() <= event.data.items()
        tasks.unblock(file_store, "v", by="alice", note="window moved")
        event = _last(file_store, "v")
        assert event.kind == "unblocked" and event.actor == "alice"
        assert {"by": "alice", "note": "window moved", "was_on": "the deploy window",
                "gate": "time:2030-01-01T00:00:00+00:00", "gate_opened": ""}.items() <= event.data.items()

    def test_done_failed_retried(self, file_store: FileStore) -> None:
        """done: `done` with the note; fail: `failed` with the reason; retry: `retried` with by, note, was."""
        tasks.new_task(file_store, "d", task="t", step="s")
        tasks.finish(file_store, "d", note="shipped")
        done = file_store.ledger.events("d")[-2]  # then handed_off: the package frozen for downstreams
        assert (done.kind, done.data) == ("done", {"note": "shipped"})
        assert _last(file_store, "d").kind == "handed_off"
        tasks.new_task(file_store, "f", task="t", step="s")
        tasks.fail(file_store, "f", reason="quota")
        assert (_last(file_store, "f").kind, _last(file_store, "f").data) == ("failed", {"reason": "quota"})
        tasks.retry(file_store, "f", by="bob", note="raised quota")
        event = _last(file_store, "f")
        assert event.kind == "retried" and event.data == {"by": "bob", "note": "raised quota", "was": "failed"}

    def test_claimed_released_snoozed(self, file_store: FileStore) -> None:
        """claim: `claimed` with pid, host, previous_pid (at the new epoch); release: `released` with the pid;
        snooze: `snoozed` with until."""
        tasks.new_task(file_store, "c", task="t", step="s")
        tasks.claim(file_store, "c", Owner(pid=111, host="h1"), alive=False)
        tasks.claim(file_store, "c", Owner(pid=222, host="h1"), alive=False)
        event = _last(file_store, "c")
        assert event.kind == "claimed" and event.epoch == 2
        assert event.data == {"pid": 222, "host": "h1", "previous_pid": 111}
        tasks.release(file_store, "c")
        assert (_last(file_store, "c").kind, _last(file_store, "c").data) == ("released", {"pid": 222})
        until = datetime(2030, 1, 1, tzinfo=UTC)
        tasks.snooze(file_store, "c", until)
        assert (_last(file_store, "c").kind, _last(file_store, "c").data) == ("snoozed", {"until": until.isoformat()})
        assert file_store.load("c").meta.status is Status.SNOOZED

    def test_a_refused_write_records_nothing(self, file_store: FileStore) -> None:
        """A verb refused (wrong state, stale epoch) adds no event."""
        tasks.new_task(file_store, "r", task="t", step="s")
        tasks.claim(file_store, "r", Owner(pid=1), alive=False)
        before = _kinds(file_store, "r")
        with pytest.raises(NotActive):
            tasks.retry(file_store, "r", by="x")
        with pytest.raises(Conflict):
            tasks.set_fields(file_store, "r", {"step": "x"}, epoch=0)
        assert _kinds(file_store, "r") == before

    def test_events_carry_epoch_and_revision(self, file_store: FileStore) -> None:
        """Every event records the baton's epoch and the revision its write produced, in order."""
        tasks.new_task(file_store, "e", task="t", step="s", owner=Owner(pid=1))
        tasks.set_fields(file_store, "e", {"step": "two"}, epoch=1)
        tasks.touch(file_store, "e")  # by hand: written (the agent's own would be a pulse now)
        events = file_store.ledger.events("e")
        assert [(e.epoch, e.revision) for e in events] == [(1, 1), (1, 2), (1, 3)]
        assert [e.id for e in events] == sorted(e.id for e in events)


class TestTouchCoalescing:
    def test_touches_within_a_minute_share_one_row(self, file_store: FileStore) -> None:
        """Touches of one task in the same minute update one `touched` row (its time and revision move)."""
        tasks.new_task(file_store, "t", task="t", step="s", now=T0)
        for seconds in (1, 20, 50):
            with file_store.edit("t", touch=True, now=T0 + timedelta(seconds=seconds)):
                pass
        events = file_store.ledger.events("t")
        assert _kinds(file_store, "t") == ["created", "touched"]
        assert events[1].ts == T0 + timedelta(seconds=50) and events[1].revision == 4

    def test_a_new_minute_starts_a_new_row(self, file_store: FileStore) -> None:
        """A touch in the next minute is a new row."""
        tasks.new_task(file_store, "t", task="t", step="s", now=T0)
        for seconds in (1, 60, 61):
            with file_store.edit("t", touch=True, now=T0 + timedelta(seconds=seconds)):
                pass
        assert _kinds(file_store, "t") == ["created", "touched", "touched"]

    def test_another_event_breaks_the_run(self, file_store: FileStore) -> None:
        """A write between two touches keeps both touches: the ledger stays in order."""
        tasks.new_task(file_store, "t", task="t", step="s", now=T0)
        with file_store.edit("t", touch=True, now=T0 + timedelta(seconds=1)):
            pass
        with file_store.edit("t", now=T0 + timedelta(seconds=2)) as ed:
            ed.baton.step = "moved"
        with file_store.edit("t", touch=True, now=T0 + timedelta(seconds=3)):
            pass
        assert _kinds(file_store, "t") == ["created", "touched", "updated", "touched"]

    def test_ledgers_coalesce_alike(self, ledger: Ledger) -> None:
        """The SQLite and in-memory ledgers coalesce the same way, per task."""
        def touch(task: str, seconds: int) -> None:
            ledger.append([Event(task=task, kind="touched", ts=T0 + timedelta(seconds=seconds))])

        touch("a", 1)
        touch("b", 2)
        touch("a", 3)
        touch("a", 70)
        assert [(e.task, e.kind) for e in ledger.events()] == [("a", "touched"), ("b", "touched"), ("a", "touched")]
        assert [e.ts for e in ledger.events("a")] == [T0 + timedelta(seconds=3), T0 + timedelta(seconds=70)]


class TestQueries:
    def test_filters(self, ledger: Ledger) -> None:
        """events() filters by task, by time and by kind, keeping append order."""
        for i, (task, kind) in enumerate([("a", "created"), ("b", "created"), ("a", "blocked"), ("a", "done")]):
            ledger.append([Event(task=task, kind=kind, ts=T0 + timedelta(minutes=i))])
        assert [e.kind for e in ledger.events("a")] == ["created", "blocked", "done"]
        assert [e.task for e in ledger.events(since=T0 + timedelta(minutes=1))] == ["b", "a", "a"]
        assert [e.kind for e in ledger.events("a", kinds=["done", "created"])] == ["created", "done"]
        assert ledger.events("nobody") == []

    def test_values_are_stored_verbatim(self, ledger: Ledger) -> None:
        """Text that looks like SQL or JSON, unicode and nesting come back exactly as appended."""
        data = {"note": "'); DROP TABLE events; --", "nested": {"list": [1, "two", None]}, "u": "日本 🙂"}
        ledger.append([Event(task="x'y", kind="unblocked", ts=T0, actor="o'brien", data=data)])
        (event,) = ledger.events("x'y")
        assert event.data == data and event.actor == "o'brien" and event.ts == T0

    def test_sqlite_ledger_survives_reopening(self, tmp_path: Path) -> None:
        """Events written by one SqliteLedger are read by another opened later (another process's view)."""
        path = str(tmp_path / "ledger.sqlite3")
        first = SqliteLedger(path)
        first.append([Event(task="a", kind="created", ts=T0, epoch=2, revision=1, data={"step": "s"})])
        first.close()
        second = SqliteLedger(path)
        (event,) = second.events()
        assert (event.task, event.kind, event.epoch, event.revision, event.data) == ("a", "created", 2, 1, {"step": "s"})
        second.close()
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"

    def test_missing_ledger_reads_empty(self, tmp_path: Path) -> None:
        """Reading a ledger that was never written is empty, and creates no file."""
        led = SqliteLedger(str(tmp_path / "none.sqlite3"))
        assert led.events() == []
        assert not (tmp_path / "none.sqlite3").exists()


class TestLogCommand:
    def test_log_json_follows_the_cli(self, hb: Hb, state_dir: Path) -> None:
        """`log --json` lists what the CLI did, in order, with the agreed data keys."""
        assert hb("new", "l", "--task", "t", "--step", "one").code == 0
        assert hb("set", "l", "step=two").code == 0
        assert hb("touch", "l").code == 0
        assert hb("block", "l", "--on", "review", "--gate", "file:/tmp/ok").code == 0
        assert hb("unblock", "l", "--by", "alice", "--note", "reviewed").code == 0
        assert hb("done", "l", "--note", "fin").code == 0
        r = hb("log", "l", "--json")
        assert r.code == 0, r.err
        events = json.loads(r.out)["events"]
        assert [e["kind"] for e in events] == ["created", "updated", "touched", "blocked", "unblocked", "done",
                                               "handed_off"]  # done freezes the task's package
        assert events[1]["data"]["changed"] == ["step"]
        assert {"on": "review", "gate": "file:/tmp/ok"}.items() <= events[3]["data"].items()
        assert events[4]["data"]["by"] == "alice" and events[4]["data"]["note"] == "reviewed"
        assert [e["revision"] for e in events] == [1, 2, 3, 4, 5, 6, 6]  # done and handed_off: one write
        assert all(datetime.fromisoformat(e["ts"]).tzinfo is not None for e in events)

    def test_log_of_unknown_task_is_empty(self, hb: Hb) -> None:
        """`log` of a task with no events prints an empty list, and a bad id is exit 2."""
        r = hb("log", "ghost", "--json")
        assert r.code == 0 and json.loads(r.out) == {"task": "ghost", "events": []}
        assert hb("log", "Ghost").code == 2


class TestSupersede:
    """Events of a write that never landed are replaced by the write that does."""

    def test_a_crash_between_ledger_and_rename_leaves_one_history(
        self, file_store: FileStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A writer dying after appending its events but before the rename: the retry's events replace them."""
        from heartbeat.model.baton import Baton, Meta

        file_store.create(Baton(task="t", step="s", meta=Meta(id="crashy")))

        class Died(Exception):
            pass

        def dying_replace(src: str, dst: str, **dir_fds: object) -> None:
            raise Died  # the fault: the process stops after the ledger append, before the rename

        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", dying_replace)
            with pytest.raises(Died), file_store.edit("crashy") as ed:
                ed.event("dispatched", reason="first try")
        assert [e.data.get("reason") for e in file_store.ledger.events("crashy", kinds=["dispatched"])] == [
            "first try"]
        assert file_store.load("crashy").meta.revision == 1
        with file_store.edit("crashy") as ed:
            ed.event("dispatched", reason="second try")
        events = file_store.ledger.events("crashy", kinds=["dispatched"])
        assert [(e.data.get("reason"), e.revision) for e in events] == [("second try", 2)]
