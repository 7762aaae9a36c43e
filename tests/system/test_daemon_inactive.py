"""The real daemon stops an agent that keeps running on a task a human took out of active.

Issue 8: a blocked (or finished) task never gets an agent. An agent that ignores a human's
``block`` or ``done`` is given ``inactive_grace`` to end on its own, then stopped (SIGTERM,
``stop_grace``, SIGKILL) without a successor and without touching the task's status.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import TOY, DaemonHarness, toml_list

pytestmark = pytest.mark.slow

GRACE = 1.0
"""The ``inactive_grace`` these tests configure, in seconds."""

HANG = f"""
[launchers.hang]
type = "exec"
command = {toml_list([*TOY, "--mode", "hang"])}
stop_grace = "500ms"
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path, stall_after="1h", extra=HANG)
    h.write_config(h.config_text().replace('log_level = "debug"\n',
                                           f'log_level = "debug"\ninactive_grace = "{GRACE}s"\n'))
    h.start()
    yield h
    h.close()


def running_agent(h: DaemonHarness, task_id: str) -> set[int]:
    """Dispatch ``task_id`` on the hanging agent and wait until its process group is alive."""
    h.new(task_id, "--launcher", "hang")
    h.wait(lambda: (b := h.try_baton(task_id)) is not None and b.meta.owner is not None and b.meta.owner.pid,
           "the agent's pid on the baton")
    return h.wait(lambda: h.live_agents(task_id).get(task_id), "the agent's process group")


def ticks(h: DaemonHarness) -> int:
    return sum(1 for e in h.log() if e.get("event") == "tick")


def assert_stopped_without_successor(h: DaemonHarness, task_id: str, status: str, since_kind: str) -> None:
    """The agent's group goes within grace + stop_grace + a few ticks; the status stands; nothing is dispatched."""
    h.wait(lambda: not h.live_agents(task_id), "the agent to be stopped", timeout=GRACE + 0.5 + 15)
    exited = h.wait(lambda: h.events(task_id, "exited"), "the exit to be settled")
    stopped = h.events(task_id, "stopped")
    assert len(stopped) == 1, stopped
    assert stopped[0].data["reason"].startswith(f"task {status}: agent still running after grace"), stopped[0].data
    assert stopped[0].data["why"] == "inactive" and stopped[0].data["gone"] is True
    left = h.events(task_id, since_kind)[-1].ts
    assert (stopped[0].ts - left).total_seconds() >= GRACE, "stopped before its grace was up"
    assert exited[-1].data["kind"] == "finished", exited[-1].data  # not a failed attempt
    # A few more ticks: still no successor, the status untouched.
    after = ticks(h)
    h.wait(lambda: ticks(h) >= after + 5, "five more ticks")
    b = h.baton(task_id)
    assert b.meta.status.value == status
    assert b.meta.owner is None and not b.meta.last_failure
    assert len(h.events(task_id, "dispatched")) == 1
    assert not h.events(task_id, "stalled") and not h.events(task_id, "escalated")
    assert not h.live_agents(task_id)


class TestInactiveTaskAgentIsStopped:
    """An agent running on a task that is no longer active is stopped after a grace, nothing else changes."""

    def test_human_block_stops_the_agent_and_the_task_stays_blocked(self, daemon: DaemonHarness) -> None:
        """A human blocks a task whose agent ignores it: stopped after the grace, still blocked, no successor."""
        h = daemon
        running_agent(h, "blk")
        r = h.cli("block", "blk", "--on", "the owner wants to review first")
        assert r.returncode == 0, r.stderr
        assert_stopped_without_successor(h, "blk", "blocked", "blocked")
        assert h.baton("blk").blocked_on == "the owner wants to review first"

    def test_human_done_stops_the_agent_and_the_task_stays_done(self, daemon: DaemonHarness) -> None:
        """A human marks a running task done: its agent is stopped after the grace, the task stays done."""
        h = daemon
        running_agent(h, "fin")
        r = h.cli("done", "fin", "--note", "finished by hand")
        assert r.returncode == 0, r.stderr
        assert_stopped_without_successor(h, "fin", "done", "done")

    def test_human_snooze_stops_the_agent_and_wakes_with_a_fresh_one(self, daemon: DaemonHarness) -> None:
        """A human snoozes a running task: its agent is stopped, and at the snooze's end a fresh agent starts."""
        h = daemon
        first = running_agent(h, "nap")
        r = h.cli("snooze", "nap", "--for", "6s")
        assert r.returncode == 0, r.stderr
        h.wait(lambda: not h.live_agents("nap"), "the agent to be stopped", timeout=GRACE + 0.5 + 15)
        assert h.baton("nap").meta.status.value == "snoozed"
        assert len(h.events("nap", "dispatched")) == 1
        fresh = h.wait(lambda: h.live_agents("nap").get("nap"), "a fresh agent after the snooze", timeout=30)
        assert fresh.isdisjoint(first)
        assert h.events("nap", "woke") and len(h.events("nap", "dispatched")) == 2


class TestNonRetryableExitOnAStoppedTask:
    """An agent that stops its own task (or is stopped by a human) and then exits with a non-retryable
    code leaves the task as the human or agent left it: the exit does not re-block it over them."""

    @pytest.mark.parametrize("verb, status", [("block", "blocked"), ("done", "done")])
    def test_the_status_and_the_reason_are_kept(self, tmp_path: Path, verb: str, status: str) -> None:
        """The agent runs `heartbeat block --on ...` (or `done`), then exits 3 (non-retryable): the task stays
        as it wrote it, with its reason; before the fix the exit replaced it with "a human is needed"."""
        tmp_path.chmod(0o700)
        args = ["block", "--on", "the customer asked us to wait"] if verb == "block" else ["done"]
        script = ("import os, subprocess, sys\n"
                  f"r = subprocess.run([sys.executable, '-m', 'heartbeat', {verb!r}, os.environ['HEARTBEAT_TASK'], "
                  f"*{args[1:]!r}])\n"
                  "sys.exit(3 if r.returncode == 0 else 9)\n")
        agent = [sys.executable, "-c", script]
        h = DaemonHarness(tmp_path, agent=agent, launcher_extra="non_retryable_exit_codes = [3]")
        try:
            h.start()
            h.new("t1")
            h.wait(lambda: h.events("t1", "exited"), "the agent's exit to be settled", timeout=60)
            baton = h.baton("t1")
        finally:
            h.close()
        assert baton.meta.status.value == status
        if verb == "block":
            assert baton.blocked_on == "the customer asked us to wait"
        # A finished task's exit is "finished" whatever its code; a blocked one's is still non-retryable.
        assert [e.data.get("kind") for e in h.events("t1", "exited")] == [
            "non-retryable" if verb == "block" else "finished"]
