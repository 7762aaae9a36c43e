"""Exit notices: a pidfd per running agent tells the daemon at once that its process ended."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

from heartbeat.daemon.changes import ChangeFeed
from heartbeat.daemon.exits import ExitWatch, pidfds_available
from heartbeat.launchers.liveness import identify, this_host
from heartbeat.launchers.null import FAKE_PID_BASE
from heartbeat.model.baton import Owner

needs_pidfd = pytest.mark.skipif(not pidfds_available(), reason="this kernel gives no pidfds")


class Notices:
    def __init__(self) -> None:
        self.ended: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, task_id: str) -> None:
        with self.lock:
            self.ended.append(task_id)


@pytest.fixture
def notices() -> Iterator[tuple[ExitWatch, Notices]]:
    seen = Notices()
    watch = ExitWatch(seen)
    watch.start()
    yield watch, seen
    watch.close()


def _owner_of(pid: int) -> Owner:
    found = identify(pid)
    assert found is not None
    return Owner(pid=pid, create_time=found[1], host=this_host(), how="dispatch")


@needs_pidfd
class TestExitWatch:
    def test_a_child_ending_is_reported_at_once(self, notices: tuple[ExitWatch, Notices]) -> None:
        """A watched child's exit calls back with its task id, long before any tick would look."""
        watch, seen = notices
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        assert watch.watch("t1", _owner_of(proc.pid))
        assert seen.ended == []
        assert proc.stdin is not None
        proc.stdin.close()
        wait_for(lambda: seen.ended == ["t1"], timeout=5, message="the exit notice")
        proc.wait()
        assert watch.watched() == set()

    def test_a_process_not_our_child_is_reported_too(self, notices: tuple[ExitWatch, Notices],
                                                       tmp_path: Path) -> None:
        """An agent the daemon is not the parent of (adopted, or systemd's) is reported when it ends."""
        watch, seen = notices
        go = tmp_path / "go"
        # It ends when told, or after 120 s whatever happens to this test (never left behind).
        waiter = (f"import os, time\nend = time.monotonic() + 120\n"
                  f"while not os.path.exists({str(go)!r}) and time.monotonic() < end: time.sleep(0.01)\n")
        # The intermediate exits at once: the grandchild is re-parented away from us.
        out = subprocess.run([sys.executable, "-c",
                              "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                              "start_new_session=True, stdout=subprocess.DEVNULL, "
                              "stderr=subprocess.DEVNULL); print(p.pid)", waiter],
                             capture_output=True, text=True, check=True)
        pid = int(out.stdout)
        try:
            assert watch.watch("adopted", _owner_of(pid))
            assert seen.ended == []
            go.write_text("")
            wait_for(lambda: seen.ended == ["adopted"], timeout=10, message="the exit notice")
        finally:
            go.write_text("")

    def test_a_reused_pid_is_not_watched(self, notices: tuple[ExitWatch, Notices]) -> None:
        """An owner whose create time is not the running process's names another process: no watch."""
        watch, _ = notices
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            owner = _owner_of(proc.pid)
            owner.create_time = (owner.create_time or 0) - 3600
            assert not watch.watch("t1", owner)
            assert watch.watched() == set()
        finally:
            proc.kill()
            proc.wait()

    def test_fake_and_foreign_pids_are_not_watched(self, notices: tuple[ExitWatch, Notices]) -> None:
        """The null launcher's fake pids and another host's processes are left to the tick."""
        watch, _ = notices
        assert not watch.watch("fake", Owner(pid=FAKE_PID_BASE + 1, create_time=time.time(), host=this_host()))
        assert not watch.watch("far", Owner(pid=1, create_time=0.0, host="another-host"))

    def test_forgotten_agent_is_not_reported(self, notices: tuple[ExitWatch, Notices]) -> None:
        """A task forgotten (settled meanwhile) gets no notice when its old process ends."""
        watch, seen = notices
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        assert watch.watch("t1", _owner_of(proc.pid))
        watch.forget("t1")
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        other = subprocess.Popen([sys.executable, "-c", "pass"])
        assert watch.watch("t2", _owner_of(other.pid)) or other.poll() is not None
        other.wait()
        time.sleep(0.2)  # a notice for t1 would have come by now (t2's shows the thread is serving)
        assert "t1" not in seen.ended


class TestChangeFeed:
    def test_without_a_watcher_every_tick_sweeps(self) -> None:
        """No watcher: every tick is a full sweep, whatever was reported."""
        feed = ChangeFeed(sweep_every=60)
        feed.changed("a")
        assert feed.take(0.0) is None
        assert feed.take(1.0) is None

    def test_a_watched_tick_looks_at_the_reported_tasks_only(self) -> None:
        """With a watcher, the first tick sweeps; later ticks get just what was reported, until sweep_every."""
        feed = ChangeFeed(sweep_every=60)
        feed.watching()
        assert feed.take(0.0) is None
        feed.changed("a")
        feed.changed("b")
        feed.changed("a")
        assert feed.take(1.0) == {"a", "b"}
        assert feed.take(2.0) == set()
        assert feed.take(59.9) == set()
        assert feed.take(60.0) is None
        assert feed.take(61.0) == set()
        assert feed.sweeps == 2

    def test_lost_events_force_the_next_tick_to_sweep(self) -> None:
        """A watcher overflow (or restart) makes the very next tick a sweep, then trust resumes."""
        feed = ChangeFeed(sweep_every=60)
        feed.watching()
        feed.take(0.0)
        feed.lost("the inotify queue overflowed")
        assert feed.lost_reason == "the inotify queue overflowed"
        assert feed.take(1.0) is None
        assert feed.lost_reason == ""
        assert feed.take(2.0) == set()
        feed.watching()  # restarted
        assert feed.take(3.0) is None

    def test_a_clock_gone_back_sweeps(self) -> None:
        """A tick whose time is before the last sweep's (the clock was set back) sweeps."""
        feed = ChangeFeed(sweep_every=60)
        feed.watching()
        feed.take(100.0)
        assert feed.take(50.0) is None

    def test_sweep_every_zero_sweeps_every_tick(self) -> None:
        """``sweep_every = 0`` keeps the stat sweep at every tick even with a watcher."""
        feed = ChangeFeed(sweep_every=0)
        feed.watching()
        assert feed.take(0.0) is None
        assert feed.take(0.0) is None

    def test_a_stopped_watcher_means_sweeping_again(self) -> None:
        """Once the watcher is gone, every tick sweeps again."""
        feed = ChangeFeed(sweep_every=60)
        feed.watching()
        feed.take(0.0)
        feed.stopped()
        assert feed.take(1.0) is None
        assert feed.take(2.0) is None
