"""Trusting the watcher between full sweeps, and exit notices: what the daemon sees, and when.

The sweep tests run the loop in-process over a real file store whose change feed is told to
drop its reports (a watcher that loses events), with the pass's ``now`` given, so "before
``sweep_every``" and "after" are exact, not slept for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from daemon_harness import in_process_config

from heartbeat.daemon import Daemon
from heartbeat.store.base import Unwatch
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


class DeafStore(FileStore):
    """A file store whose watch drops every report of a written task while ``deaf`` is set
    (its "writes may have been missed" reports still pass)."""

    deaf = True

    def watch(self, callback: Callable[[str | None], None]) -> Unwatch:
        def filtered(task_id: str | None) -> None:
            if task_id is None or not self.deaf:
                callback(task_id)

        return super().watch(filtered)


class DoomedStore(FileStore):
    """A file store whose feed's thread dies at the first report of a written task while ``doomed``
    is set: the callback raises in watchdog's observer thread, which ends (as any exception there
    ends it, and as libfaketime's broken ``time.sleep`` ended its emitter in a fresh-clone CI)."""

    doomed = False

    def watch(self, callback: Callable[[str | None], None]) -> Unwatch:
        def dying(task_id: str | None) -> None:
            if self.doomed and task_id is not None:
                raise RuntimeError("the feed's thread ends here")
            callback(task_id)

        return super().watch(dying)


class WalkedList(list[Any]):
    """A scan's entries that count each walk over all of them (iterating, copying, ``set(...)``)."""

    def __init__(self, entries: list[Any], store: WalkCountingStore) -> None:
        super().__init__(entries)
        self._store = store

    def __iter__(self) -> Iterator[Any]:
        self._store.walks += 1
        return super().__iter__()


class WalkCountingStore(DeafStore):
    """A deaf file store whose scans count the passes that walked the whole list of tasks."""

    deaf = False
    walks = 0

    def scan(self, only: Any = None) -> list[Any]:
        return WalkedList(super().scan(only=only), self)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Daemon]:
    state, config = in_process_config(tmp_path, daemon='sweep_every = "60s"')
    d = Daemon(config, store=DeafStore(str(state)))
    d.watcher.start()
    yield d
    d.shutdown(timeout=5)


def human(d: Daemon) -> FileStore:
    """Another process's store on the daemon's state dir (a human's CLI): only the change feed
    tells the daemon of its writes (the daemon's own writes are in its next scan whatever the feed)."""
    return FileStore(d.store.state_dir)


def dispatched(d: Daemon, task_id: str) -> bool:
    return bool(d.store.ledger.events(task_id, kinds=["dispatched"]))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class TestSweep:
    def test_a_change_the_watcher_dropped_is_seen_by_the_next_sweep(self, loop: Daemon) -> None:
        """A baton written while the watcher drops events waits for the sweep, and is dispatched by it."""
        loop.tick(now=at(0))  # the first pass sweeps
        tasks.new_task(human(loop), "late", task="t", step="s")
        for second in (1, 10, 59):
            loop.tick(now=at(second))
            assert not dispatched(loop, "late"), f"seen at {second}s: the daemon swept, it did not trust the watcher"
        loop.tick(now=at(60))
        assert dispatched(loop, "late")

    def test_an_unblock_the_watcher_dropped_is_seen_by_the_next_sweep(self, loop: Daemon) -> None:
        """An unblock whose event was lost is acted on at the sweep: nothing stays missed."""
        tasks.new_task(loop.store, "gated", task="t", step="s", blocked_on="a human")
        loop.tick(now=at(0))
        tasks.unblock(human(loop), "gated", by="test")
        loop.tick(now=at(30))
        assert not dispatched(loop, "gated")
        loop.tick(now=at(61))
        assert dispatched(loop, "gated")

    def test_a_reported_change_is_seen_before_any_sweep(self, loop: Daemon) -> None:
        """With the watcher reporting, the next pass sees a new baton without a sweep."""
        loop.tick(now=at(0))
        assert isinstance(loop.store, DeafStore)
        loop.store.deaf = False
        tasks.new_task(human(loop), "heard", task="t", step="s")
        sweeps = loop.loop.changes.sweeps

        def seen() -> bool:
            loop.tick(now=at(1))
            return dispatched(loop, "heard")

        wait_for(seen, timeout=10, message="the reported baton to be dispatched")
        assert loop.loop.changes.sweeps == sweeps

    def test_an_inotify_overflow_makes_the_next_pass_a_sweep(self, loop: Daemon) -> None:
        """watchdog's "queue overflowed" warning makes the very next pass sweep, long before sweep_every."""
        loop.tick(now=at(0))
        tasks.new_task(human(loop), "lost", task="t", step="s")
        loop.tick(now=at(1))
        assert not dispatched(loop, "lost")
        logging.getLogger("watchdog.observers.inotify_c").warning("Inotify queue overflowed; filesystem events were lost")
        loop.tick(now=at(2))
        assert dispatched(loop, "lost")

    @pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (the death is the point)
    def test_a_feed_whose_thread_died_is_trusted_no_more(self, tmp_path: Path) -> None:
        """The store's watch thread ends: the next pass says so once (``watch_lost``, level error) and
        sweeps, and so does every pass after it: a human's new task is dispatched at once, not at
        ``sweep_every`` (fails on 674f791: the daemon trusted a dead feed until the next sweep, and
        under a clock stepped back, until long after)."""
        import threading

        from tests.system.test_clock_steps import RecordingLog

        state, config = in_process_config(tmp_path, daemon='sweep_every = "60s"')
        log = RecordingLog()
        d = Daemon(config, store=DoomedStore(str(state)), log=log)
        before = set(threading.enumerate())
        d.watcher.start()
        feeds = set(threading.enumerate()) - before
        try:
            d.tick(now=at(0))  # the first pass sweeps
            store = d.store
            assert isinstance(store, DoomedStore)
            store.doomed = True
            tasks.new_task(human(d), "first", task="t", step="s")  # its report ends the feed's thread
            wait_for(lambda: any(not t.is_alive() for t in feeds), message="the feed's thread to end")
            d.tick(now=at(1))
            assert dispatched(d, "first")
            tasks.new_task(human(d), "second", task="t", step="s")
            d.tick(now=at(2))
            assert dispatched(d, "second")
            lost = log.events("watch_lost")
            assert len(lost) == 1 and "restart the daemon" in lost[0]["hint"], lost
            assert [level for level, event, _ in log.lines if event == "watch_lost"] == ["error"]
        finally:
            d.shutdown(timeout=5)

    def test_without_a_watcher_every_pass_sweeps(self, tmp_path: Path) -> None:
        """A loop with no watcher (``--once``, the tests' bare loops) stats every baton each pass."""
        state, config = in_process_config(tmp_path)
        d = Daemon(config, store=DeafStore(str(state)))
        try:
            d.tick(now=at(0))
            tasks.new_task(human(d), "late", task="t", step="s")
            d.tick(now=at(1))
            assert dispatched(d, "late")
        finally:
            d.shutdown(timeout=5)


class TestQuietPasses:
    def test_counts_stay_right_as_tasks_turn_quiet_between_sweeps(self, loop: Daemon) -> None:
        """Passes that look at no baton (nothing reported, no sweep due) count every task by status,
        while the tasks first looked at move to the quiet side and are not looked at again."""
        for task_id, blocked in (("a", ""), ("b", "a human"), ("c", "a human")):
            tasks.new_task(loop.store, task_id, task="t", step="s", blocked_on=blocked)
        tasks.finish(loop.store, "a")
        loop.tick(now=at(0))
        tasks.new_task(loop.store, "d", task="t", step="s", blocked_on="a human")
        swept = loop.tick(now=at(60))  # a sweep: a, b, c quiet already, d looked at for the first time
        looks: list[str] = []
        original = loop.loop.look

        def counting_look(entry: Any, *args: Any, **kwargs: Any) -> Any:
            looks.append(entry.id)
            return original(entry, *args, **kwargs)

        loop.loop.look = counting_look  # type: ignore[method-assign]
        later = [loop.tick(now=at(second)) for second in (61, 62, 63)]
        assert swept["blocked"] == 3 and swept["done"] == 1
        assert all(counts == swept for counts in later)
        assert looks == []


    def test_a_quiet_pass_walks_no_list_of_every_task(self, tmp_path: Path) -> None:
        """Between sweeps, a pass over an unchanged store walks no list of every task: its cost
        does not grow with the tasks at rest (on 4c852cf each pass re-indexed every task's
        upstreams: 3 walks in 3 quiet passes, 12 ms of CPU a second at 10,000 batons)."""
        state, config = in_process_config(tmp_path, daemon='sweep_every = "60s"')
        store = WalkCountingStore(str(state))
        d = Daemon(config, store=store)
        d.watcher.start()
        try:
            tasks.new_task(store, "up", task="t", step="s", blocked_on="a human")
            tasks.new_task(store, "down", task="t", step="s", after=["up"])
            tasks.new_task(store, "done", task="t", step="s")
            tasks.finish(store, "done")
            d.tick(now=at(0))  # the sweep
            d.tick(now=at(1))  # the daemon's own writes of the first pass, if any
            store.walks = 0
            counts = [d.tick(now=at(second)) for second in (2, 3, 4)]
            assert store.walks == 0
            assert counts[-1]["blocked"] == 2 and counts[-1]["done"] == 1  # up, and down on its after: gate
        finally:
            d.shutdown(timeout=5)

    def test_tasks_without_an_owner_keep_no_stamp_ages(self, loop: Daemon) -> None:
        """The monotonic ages of a task's stamps are kept only while it has an owner: thousands of
        done, snoozed and blocked tasks hold none (on 4c852cf: 4 stamps each, ~480 bytes a task)."""
        tasks.new_task(loop.store, "a", task="t", step="s", blocked_on="a human")
        tasks.new_task(loop.store, "b", task="t", step="s")
        tasks.finish(loop.store, "b")
        loop.tick(now=at(0))
        assert loop.observer.ages.memory == {}

    def test_a_downstream_is_looked_at_on_its_upstreams_done_after_quiet_passes(self, tmp_path: Path) -> None:
        """The index of who waits on whom outlives the quiet passes that do not rebuild it: the
        upstream's ``done`` (the watcher's look) still dispatches its downstream at once."""
        state, config = in_process_config(tmp_path, daemon='sweep_every = "60s"')
        d = Daemon(config, store=WalkCountingStore(str(state)))
        d.watcher.start()
        try:
            tasks.new_task(d.store, "up", task="t", step="s")
            tasks.snooze(d.store, "up", at(86400))
            tasks.new_task(d.store, "down", task="t", step="s", after=["up"])
            for second in (0, 1, 2, 3):
                d.tick(now=at(second))
            assert not dispatched(d, "down")
            tasks.finish(human(d), "up")
            d.evaluate("up", now=at(4))
            assert dispatched(d, "down")
        finally:
            d.shutdown(timeout=5)







