"""A real daemon with a 30 s tick hands over at once when an agent exits (pidfd exit
notices); the in-process sweep is tests/integration/test_daemon_sweep.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from daemon_harness import TOY, DaemonHarness

from heartbeat.daemon.exits import pidfds_available


@contextmanager
def relay(tmp_path: Path, *, step_time: str, plan: int) -> Iterator[DaemonHarness]:
    """A real daemon with a 30 s tick, running task ``relay`` of ``plan`` steps whose agents end
    their shift after one step of ``step_time`` seconds; closed at the end."""
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path, tick="30s", agent=[*TOY, "--step-time", step_time, "--steps-per-shift", "1"])
    try:
        h.start()
        h.new("relay", plan=plan)
        yield h
    finally:
        h.close()


def relay_done(h: DaemonHarness, message: str) -> list[int]:
    """Wait (25 s at most) for ``relay`` to be done; the epochs of its dispatches."""
    h.wait(lambda: h.baton("relay").meta.status.value == "done", message, timeout=25)
    return [e.epoch for e in h.events("relay", "dispatched")]


@pytest.mark.skipif(not pidfds_available(), reason="this kernel gives no pidfds")
class TestExitNotices:
    def test_shift_ends_hand_over_without_waiting_for_the_tick(self, tmp_path: Path) -> None:
        """With a 30 s tick, three one-step shifts finish in seconds: each exit starts the successor at once."""
        with relay(tmp_path, step_time="0.05", plan=3) as h:
            assert relay_done(h, "three shifts") == [1, 2, 3]

    def test_an_adopted_agent_s_exit_is_noticed_too(self, tmp_path: Path) -> None:
        """After a daemon restart, the re-adopted agent (not the new daemon's child) hands over at once when it ends."""
        with relay(tmp_path, step_time="1.5", plan=2) as h:
            h.wait(lambda: (b := h.try_baton("relay")) and b.meta.owner and b.meta.owner.pid, "the first agent")
            h.stop()  # the agent keeps running, now nobody's child but init's
            h.start()
            assert relay_done(h, "the successor after the adopted one") == [1, 2]


