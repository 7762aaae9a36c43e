"""Proof of life from the agent itself: its own output counts as a touch (issue 16, item 3).

A real daemon with a tiny tick runs shell agents that print but never touch their note: one
that keeps printing is left to work past several ``stall_after``; one that goes quiet (a stuck
model: no answer, so no output) is stopped as hung.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonHarness, toml_list

from heartbeat.launchers.liveness import output_at

pytestmark = pytest.mark.slow

PRINTER = ["sh", "-c", 'i=0; while [ $i -lt 25 ]; do echo "working $i"; i=$((i+1)); sleep 0.2; done; '
           'echo finished > "$HEARTBEAT_TASK.finished"']
"""Prints every 0.2 s for about 5 s (over three ``stall_after``), never touches, then leaves a marker."""

QUIET = ["sh", "-c", 'echo "thinking"; exec sleep 3600']
"""Prints once, then waits for an answer that never comes."""

LAUNCHERS = f"""
[launchers.printer]
type = "exec"
command = {toml_list(PRINTER)}
stop_grace = "500ms"

[launchers.quiet]
type = "exec"
command = {toml_list(QUIET)}
stop_grace = "500ms"
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path, stall_after="1500ms", extra=LAUNCHERS)
    yield h
    h.close()


class TestOutputIsProofOfLife:
    """The daemon reads an agent's own output (its log's mtime) as it reads a touch."""

    def test_printing_agent_that_never_touches_is_not_stalled(self, daemon: DaemonHarness) -> None:
        """An agent that prints steadily for over three stall_after, never touching, runs to its end."""
        daemon.start()
        daemon.new("printer", "--launcher", "printer")
        daemon.wait(lambda: (daemon.root / "printer.finished").exists(), "the printer to finish", timeout=40)
        daemon.wait(lambda: daemon.events("printer", "exited"), "its exit to be settled")
        assert not daemon.events("printer", "stopped"), "a printing agent was stopped as hung"
        assert daemon.events("printer", "exited")[0].data["code"] == 0
        assert [e.epoch for e in daemon.events("printer", "dispatched")][:1] == [1]

    def test_agent_gone_quiet_is_stopped_as_hung(self, tmp_path: Path) -> None:
        """An agent that printed once, then waits on a model that never answers, is stopped as silent.

        Its own daemon with a 4 s ``stall_after``: the agent's one line must land inside the window
        (under two busy loops the 1.5 s of the other tests passed before ``sh`` had echoed, and the
        daemon rightly said "never wrote nor printed")."""
        tmp_path.chmod(0o700)
        daemon = DaemonHarness(tmp_path, stall_after="4s", extra=LAUNCHERS)
        try:
            self._quiet(daemon)
        finally:
            daemon.close()

    @staticmethod
    def _quiet(daemon: DaemonHarness) -> None:
        daemon.start()
        daemon.new("quiet", "--launcher", "quiet")
        stopped = daemon.wait(lambda: daemon.events("quiet", "stopped"), "the quiet agent to be stopped", timeout=30)
        assert stopped[0].data["why"] == "hung"
        assert "no output" in stopped[0].data["reason"]
        stalled = daemon.wait(lambda: daemon.events("quiet", "stalled"), "the stall to be recorded")
        assert stalled[0].data["why"] == "silent"  # it printed: not "never wrote"


class TestOutputAt:
    """``output_at`` is one lstat of the log, and what an agent may plant there cannot mislead it."""

    def test_empty_missing_and_non_regular_logs_say_nothing(self, tmp_path: Path) -> None:
        """The launcher creates the log at dispatch: empty means no output yet; a FIFO or link is not read."""
        log = tmp_path / "1.log"
        assert output_at(str(log)) is None
        log.write_bytes(b"")
        assert output_at(str(log)) is None
        log.write_bytes(b"line\n")
        seen = output_at(str(log))
        assert seen is not None and abs(seen.timestamp() - log.stat().st_mtime) < 1e-3
        fifo = tmp_path / "2.log"
        os.mkfifo(fifo)
        assert output_at(str(fifo)) is None
        link = tmp_path / "3.log"
        link.symlink_to(log)
        assert output_at(str(link)) is None

    def test_a_future_mtime_is_ignored(self, tmp_path: Path) -> None:
        """An agent cannot stay alive for ever by setting its log's mtime ahead of the clock."""
        log = tmp_path / "1.log"
        log.write_bytes(b"x")
        ahead = time.time() + 3600
        os.utime(log, (ahead, ahead))
        assert output_at(str(log)) is None
        os.utime(log, (ahead - 3598, ahead - 3598))  # a couple of seconds of skew is tolerated
        assert output_at(str(log)) is not None
