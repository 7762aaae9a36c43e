"""The handoff report of a real daemon's run (tests/support/daemon_harness.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_report import SECONDS, drop_block_by_hand, expect


@pytest.mark.slow
class TestWithTheDaemon:
    def test_daemon_driven_handoffs_are_counted(self, tmp_path: Path) -> None:
        """A real daemon: shift-changing agents resume cleanly, a crashing one escalates, a spinning one is
        stopped and escalated, a hand-dropped block is a bypass; the report counts exactly that per task."""
        from daemon_harness import TOY, DaemonHarness, toml_list

        tmp_path.chmod(0o700)
        launchers = f"""
[launchers.shifts]
type = "exec"
command = {toml_list([*TOY, "--step-time", "0.05", "--steps-per-shift", "1"])}

[launchers.crash]
type = "exec"
command = {toml_list([*TOY, "--mode", "exit:1"])}

[launchers.spin]
type = "exec"
command = {toml_list([*TOY, "--mode", "spin", "--step-time", "0.4"])}
stop_grace = "500ms"
"""
        # progress_after is the spinner's clock, and every agent's: 1 s judged a slow start on a loaded machine
        # (the worker's first step) as spinning; 4 s still escalates the spinner well inside the wait.
        h = DaemonHarness(tmp_path, max_attempts=2, progress_after="4s", extra=launchers)
        try:
            h.start()
            h.new("worker", "--launcher", "shifts", plan=3)
            h.new("doomed", "--launcher", "crash")
            h.new("spinner", "--launcher", "spin")
            h.new("held", "--blocked-on", "legal review")
            path = h.state / "batons" / "held.toml"
            drop_block_by_hand(path)
            h.wait(lambda: h.events("held", "bypass"), "the daemon to see the bypass")
            h.wait(lambda: h.baton("worker").meta.status.value == "done", "the worker to finish", timeout=60)
            h.wait(lambda: h.baton("doomed").meta.status.value == "escalated", "the escalation", timeout=60)
            h.wait(lambda: h.baton("spinner").meta.status.value == "escalated", "the spinner's escalation", timeout=60)
            r = h.cli("report", "--json")
            assert r.returncode == 0, r.stderr
            by_id = {t["id"]: t["metrics"] for t in json.loads(r.stdout)["tasks"]}
        finally:
            h.close()
        assert by_id["worker"] == expect(dispatches=3, resumes=2, clean_resumes=2, mean_time_to_resume_s=SECONDS,
                                         duration_s=SECONDS)
        assert by_id["doomed"] == expect(dispatches=2, resumes=1, idle_resumes=1, escalations=1)
        assert by_id["spinner"] == expect(dispatches=1, spinning=1, escalations=1)
        assert by_id["held"] == expect(bypassed_blocks=1)


