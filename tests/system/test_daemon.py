"""The real daemon, real agents, real signals, tiny intervals."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import TOY, DaemonHarness, toml_list

from tests.integration.test_daemon_ticks import in_process_daemon

pytestmark = pytest.mark.slow

LAUNCHERS = f"""
[launchers.hang]
type = "exec"
command = {toml_list([*TOY, "--mode", "hang"])}
stop_grace = "500ms"

[launchers.spin]
type = "exec"
command = {toml_list([*TOY, "--mode", "spin", "--step-time", "0.4"])}
stop_grace = "500ms"

[launchers.crash]
type = "exec"
command = {toml_list([*TOY, "--mode", "exit:1"])}
stop_grace = "500ms"

[launchers.needs-human]
type = "exec"
command = {toml_list([*TOY, "--mode", "exit:3"])}
non_retryable_exit_codes = [3]
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path, extra=LAUNCHERS)
    yield h
    h.close()


def owner_pid(h: DaemonHarness, task_id: str) -> int | None:
    b = h.try_baton(task_id)
    return b.meta.owner.pid if b is not None and b.meta.owner is not None else None


def at_most_one_agent_each(h: DaemonHarness) -> None:
    for task, groups in h.live_agents().items():
        assert len(groups) <= 1, f"task {task} has {len(groups)} live agents: {groups}"


class TestResume:
    """A dead agent's task is dispatched again, and the successor resumes from the baton."""

    def test_killed_agent_is_redispatched_with_next_epoch_and_brief(self, daemon: DaemonHarness) -> None:
        """SIGKILL an agent mid-task: epoch+1, a brief on disk, the rest of the plan done once each."""
        daemon.start()
        daemon.new("work", plan=6)
        first = daemon.wait(lambda: owner_pid(daemon, "work"), "first dispatch")
        daemon.wait(lambda: len(daemon.baton("work").done) >= 2, "two steps done")
        os.killpg(first, signal.SIGKILL)
        b = daemon.wait(lambda: (x := daemon.try_baton("work")) and x.meta.epoch == 2 and x.meta.owner
                        and x.meta.owner.pid and x, "the successor")
        assert b.meta.owner.pid != first
        brief = Path(daemon.state, "logs", "work", "2.brief.md").read_text()
        assert "test" in brief and "work" in brief
        agents = daemon.live_agents("work")
        assert agents.get("work", set()) <= {b.meta.owner.pid}
        daemon.wait(lambda: daemon.baton("work").meta.status.value == "done", "the task to finish")
        final = daemon.baton("work")
        assert final.done == [f"step {i}" for i in range(1, 7)]
        dispatched = daemon.events("work", "dispatched")
        assert [e.epoch for e in dispatched] == [1, 2]
        assert dispatched[1].data["resume"] is True

    def test_shift_ends_are_not_attempts(self, tmp_path: Path) -> None:
        """An agent that exits 0 after progress hands over at once; many shifts never escalate."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, agent=[*TOY, "--step-time", "0.05", "--steps-per-shift", "1"],
                          max_attempts=2, max_idle_resumes=1)
        try:
            h.start()
            h.new("shifts", plan=6)
            h.wait(lambda: h.baton("shifts").meta.status.value == "done", "the task to finish", timeout=40)
            b = h.baton("shifts")
            assert b.meta.dispatches == 6
            assert not h.events("shifts", "escalated")
        finally:
            h.close()


class TestStops:
    """A living agent that stopped working is stopped before its successor starts."""

    def test_hung_agent_is_stopped_and_replaced(self, tmp_path: Path) -> None:
        """An agent that never writes is stopped after stall_after and replaced, never overlapping."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, stall_after="1s", extra=LAUNCHERS)
        try:
            h.start()
            h.new("stuck", "--launcher", "hang")
            first = h.wait(lambda: owner_pid(h, "stuck"), "first dispatch")

            def replaced() -> bool:
                at_most_one_agent_each(h)
                b = h.baton("stuck")
                return b.meta.epoch >= 2 and b.meta.owner is not None and b.meta.owner.pid not in (None, first)

            h.wait(replaced, "a replacement", timeout=20, interval=0.01)
            stopped = h.events("stuck", "stopped")
            assert stopped and stopped[0].data["why"] == "hung" and stopped[0].data["pid"] == first
            assert h.events("stuck", "stalled")[0].data["why"] in ("never_wrote", "silent")
        finally:
            h.close()

    def test_spinning_agent_is_stopped_and_escalated(self, tmp_path: Path) -> None:
        """Alive and touching but stuck on one step past progress_after: stopped, escalated, reported."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, progress_after="1s", extra=LAUNCHERS)
        try:
            h.start()
            h.new("spinner", "--launcher", "spin")
            h.wait(lambda: h.baton("spinner").meta.status.value == "escalated", "escalation")
            assert h.events("spinner", "spinning")
            h.wait(lambda: not h.live_agents("spinner"), "the spinning agent to be gone")
        finally:
            h.close()


class TestBlocks:
    """Blocks hold: nothing but unblock or an open gate lets a blocked task run."""

    def test_blocked_task_is_never_dispatched_despite_hand_edits(self, daemon: DaemonHarness) -> None:
        """Over many ticks and a hand edit that drops the block, the task is held and the bypass recorded."""
        daemon.start()
        daemon.new("held", "--blocked-on", "legal review")
        ticks_before = sum(1 for e in daemon.log() if e.get("event") == "tick")
        daemon.wait(lambda: sum(1 for e in daemon.log() if e.get("event") == "tick") >= ticks_before + 10,
                    "ten ticks")
        path = Path(daemon.state, "batons", "held.toml")
        text = path.read_text()
        path.write_text(text.replace('status = "blocked"', 'status = "active"')
                        .replace('blocked_on = "legal review"', 'blocked_on = ""'))
        daemon.wait(lambda: daemon.events("held", "bypass"), "the bypass to be recorded")
        b = daemon.wait(lambda: (x := daemon.baton("held")).meta.status.value == "blocked" and x, "the block back")
        assert b.blocked_on == "legal review"
        ticks_now = sum(1 for e in daemon.log() if e.get("event") == "tick")
        daemon.wait(lambda: sum(1 for e in daemon.log() if e.get("event") == "tick") >= ticks_now + 5, "more ticks")
        assert daemon.baton("held").meta.dispatches == 0
        assert not daemon.events("held", "dispatched")
        assert not daemon.live_agents("held")
        r = daemon.cli("unblock", "held", "--by", "alice")
        assert r.returncode == 0, r.stderr
        daemon.wait(lambda: daemon.events("held", "dispatched"), "dispatch after unblock")

    def test_gate_file_appearing_dispatches_within_a_second(self, tmp_path: Path) -> None:
        """With a 30 s tick, only the watcher can react: the dispatch follows the gate file in under a second."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, tick="30s")
        try:
            gate_dir = tmp_path / "gates"
            gate_dir.mkdir()
            h.start()
            h.new("gated", "--blocked-on", "the data export", "--gate", f"file:{gate_dir / 'export.done'}")
            h.wait_log(lambda e: e.get("event") == "watching" and e.get("directory") == str(gate_dir),
                       "the daemon to watch the gate's directory")
            assert not h.events("gated", "dispatched")
            written = time.time()
            (gate_dir / "export.done").write_text("ok")
            event = h.wait(lambda: h.events("gated", "dispatched"), "dispatch after the gate opened", timeout=10)
            latency = event[0].ts.timestamp() - written
            assert latency < 1.0, f"dispatch came {latency:.3f}s after the gate file"
            unblocked = h.events("gated", "unblocked")
            assert unblocked and unblocked[0].data["gate_opened"].startswith("file:")
        finally:
            h.close()

    def test_non_retryable_exit_blocks_the_task(self, daemon: DaemonHarness) -> None:
        """An exit code the launcher marks non-retryable blocks the task for a human instead of retrying."""
        daemon.start()
        daemon.new("quota", "--launcher", "needs-human")
        b = daemon.wait(lambda: (x := daemon.baton("quota")).meta.status.value == "blocked" and x, "the block")
        assert "non-retryable" in b.blocked_on
        assert len(daemon.events("quota", "dispatched")) == 1


class TestRestarts:
    """Daemon restarts never duplicate agents; agents outlive the daemon."""

    def test_sigterm_leaves_agents_running_and_restart_readopts(self, daemon: DaemonHarness) -> None:
        """A clean stop keeps the agent; the next daemon adopts it instead of launching another."""
        daemon.start()
        daemon.new("long", "--launcher", "spin")
        pid = daemon.wait(lambda: owner_pid(daemon, "long"), "dispatch")
        assert daemon.stop() == 0
        assert daemon.live_agents("long") == {"long": {pid}}
        daemon.start()
        ticks = sum(1 for e in daemon.log() if e.get("event") == "tick")
        daemon.wait(lambda: sum(1 for e in daemon.log() if e.get("event") == "tick") >= ticks + 8, "ticks")
        assert daemon.live_agents("long") == {"long": {pid}}
        assert daemon.baton("long").meta.epoch == 1

    def test_sigkill_mid_dispatch_never_makes_two_agents(self, tmp_path: Path) -> None:
        """SIGKILL the daemon at random instants while it dispatches; after restarts, one agent per task."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, extra=LAUNCHERS)
        rng = random.Random(7)
        try:
            ids = [f"t{i:02d}" for i in range(12)]
            for task_id in ids:
                h.new(task_id, "--launcher", "spin")
            for _ in range(4):
                h.start()
                time.sleep(rng.uniform(0.0, 0.4))  # a fault injected at a random instant, not a wait
                h.kill(signal.SIGKILL)
                at_most_one_agent_each(h)
            h.start()

            def settled() -> bool:
                at_most_one_agent_each(h)
                agents = h.live_agents()
                return all(len(agents.get(t, ())) == 1 and owner_pid(h, t) in agents[t] for t in ids)

            h.wait(settled, "one recorded agent per task", timeout=60, interval=0.05)
            ticks = sum(1 for e in h.log() if e.get("event") == "tick")
            h.wait(lambda: (at_most_one_agent_each(h), sum(1 for e in h.log() if e.get("event") == "tick")
                            >= ticks + 5)[1], "more ticks")
        finally:
            h.close()


class TestRobustness:
    """Bad input never takes the daemon down, and problems are loud."""

    def test_sighup_with_broken_config_keeps_the_old_one(self, daemon: DaemonHarness) -> None:
        """A broken config on reload is logged; the daemon keeps serving with the old config."""
        daemon.start()
        daemon.write_config("[daemon\nthis is not toml")
        daemon.proc.send_signal(signal.SIGHUP)
        failed = daemon.wait_log(lambda e: e.get("event") == "reload_failed", "reload_failed")
        assert "heartbeat.toml" in failed["error"]
        assert daemon.proc.poll() is None
        daemon.new("after", plan=1)
        daemon.wait(lambda: daemon.baton("after").meta.status.value == "done", "work under the old config")
        daemon.write_config()
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_log(lambda e: e.get("event") == "reloaded", "reloaded")

    def test_malformed_baton_is_reported_and_others_served(self, daemon: DaemonHarness) -> None:
        """Garbage in one baton is reported once, left byte-identical, and every other task runs."""
        bad = Path(daemon.state, "batons", "broken.toml")
        garbage = b'task = "x"\nstep = 3\n\x00\xff not toml ['
        bad.write_bytes(garbage)
        daemon.start()
        daemon.new("fine", plan=2)
        daemon.wait(lambda: daemon.baton("fine").meta.status.value == "done", "the good task")
        logged = [e for e in daemon.log() if e.get("event") == "invalid_baton"]
        assert len(logged) == 1 and "broken.toml" in logged[0]["error"]
        assert len(daemon.events("broken", "invalid")) == 1
        assert bad.read_bytes() == garbage
        status = json.loads(daemon.cli("status", "--json").stdout)
        assert {"id": "broken", "status": "invalid"}.items() <= next(
            t for t in status["tasks"] if t["id"] == "broken").items()

    def test_escalation_runs_the_notify_command_once(self, tmp_path: Path) -> None:
        """After max_attempts failed dispatches the task is escalated and the notifier runs exactly once."""
        tmp_path.chmod(0o700)
        out = tmp_path / "notified.txt"
        script = f"import sys; open({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')"
        notify = f"""
[notify.file]
command = {toml_list([sys.executable, "-c", script, "{id}", "{reason}"])}
timeout = "5s"
"""
        h = DaemonHarness(tmp_path, max_attempts=2, extra=LAUNCHERS + notify)
        try:
            h.start()
            h.new("doomed", "--launcher", "crash")
            h.wait(lambda: h.baton("doomed").meta.status.value == "escalated", "escalation")
            h.wait(lambda: h.events("doomed", "notified"), "the notifier")
            ticks = sum(1 for e in h.log() if e.get("event") == "tick")
            h.wait(lambda: sum(1 for e in h.log() if e.get("event") == "tick") >= ticks + 10, "ten more ticks")
            lines = out.read_text().splitlines()
            assert len(lines) == 1 and lines[0].startswith("doomed ")
            assert len(h.events("doomed", "dispatched")) == 2
            r = h.cli("retry", "doomed", "--by", "alice")
            assert r.returncode == 0, r.stderr
            h.wait(lambda: len(h.events("doomed", "dispatched")) == 3, "dispatch after retry")
        finally:
            h.close()


def agent_children(pid: int) -> list[int]:
    """The shim's children (the agent it runs), from the process table."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


class TestOrphanedAgents:
    """Found by the soak: an agent whose shim alone was killed still holds its task."""

    def test_shim_killed_alone_gets_no_twin_while_its_agent_lives(self, tmp_path: Path) -> None:
        """SIGKILL only the shim: the orphaned agent finishes the task as the only agent; no epoch 2."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, agent=[*TOY, "--step-time", "0.25"])
        try:
            h.start()
            h.new("orphan", plan=8)
            shim = h.wait(lambda: owner_pid(h, "orphan"), "the dispatch")
            h.wait(lambda: agent_children(shim), "the agent under its shim")
            h.wait(lambda: len(h.baton("orphan").done) >= 1, "the agent at work")
            os.kill(shim, signal.SIGKILL)

            def finished() -> bool:
                at_most_one_agent_each(h)
                return h.baton("orphan").meta.status.value == "done"

            h.wait(finished, "the orphaned agent to finish the task", timeout=30, interval=0.01)
            assert [e.epoch for e in h.events("orphan", "dispatched")] == [1]
            h.wait(lambda: h.baton("orphan").meta.owner is None, "the orphan's exit to be settled")
        finally:
            h.close()

    def test_hung_orphan_is_stopped_before_its_successor(self, tmp_path: Path) -> None:
        """A hung agent whose shim was killed is stopped through its group, then replaced, never overlapping."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, stall_after="1s", extra=LAUNCHERS)
        try:
            h.start()
            h.new("stuck", "--launcher", "hang")
            shim = h.wait(lambda: owner_pid(h, "stuck"), "the dispatch")
            orphan = h.wait(lambda: agent_children(shim), "the agent under its shim")[0]
            os.kill(shim, signal.SIGKILL)

            def replaced() -> bool:
                at_most_one_agent_each(h)
                b = h.baton("stuck")
                return b.meta.epoch >= 2 and b.meta.owner is not None and b.meta.owner.pid not in (None, shim)

            h.wait(replaced, "a successor", timeout=20, interval=0.01)
            assert not any(orphan in groups or shim in groups for groups in h.live_agents("stuck").values())
            assert h.events("stuck", "stopped")[0].data["why"] == "hung"
        finally:
            h.close()








class TestEscalationNotifySurvivesRestarts:
    """Found by the soak: a daemon killed between an escalation and its notifier left the escalation silent."""

    def test_restarted_daemon_runs_the_notifier_an_escalation_never_recorded(self, tmp_path: Path) -> None:
        """Escalated with no notified event after it: the next daemon runs the notifier, once; a notified one is left."""
        from conftest import wait_for

        from heartbeat.model.baton import Status
        from heartbeat.model.ledger import Event
        from heartbeat.model.timeparse import utcnow
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        out = tmp_path / "notified.txt"
        script = f"import sys; open({str(out)!r}, 'a').write(sys.argv[1] + '\\n')"
        notify = f"""
[notify.file]
command = {toml_list([sys.executable, "-c", script, "{id}"])}
"""
        d = in_process_daemon(tmp_path, notify)
        try:
            for task_id in ("lost", "told"):
                tasks.new_task(d.store, task_id, task="t", step="s")
                with d.store.edit(task_id, actor="daemon") as ed:  # what a daemon killed right after escalating left
                    ed.baton.meta.status = Status.ESCALATED
                    ed.event("escalated", reason="3 attempts without progress")
            d.store.record([Event(task="told", kind="notified", ts=utcnow(), actor="daemon",
                                  data={"name": "file", "code": 0})])
            d.tick()
            wait_for(lambda: d.store.ledger.events("lost", kinds=["notified"]), message="the notifier for 'lost'")
            d.tick()
            d.tick()
            d.shared.pool.shutdown(wait=True)
            assert out.read_text().splitlines() == ["lost"]
            assert len(d.store.ledger.events("lost", kinds=["notified"])) == 1
        finally:
            d.shutdown()










