"""Limits are waits, not failures; a cost budget escalates (issue 16, item 5), with a real daemon.

The agent is a stand-in for ``claude`` under the ``claude-code`` preset: a script that prints a
run recorded from the real CLI (tests/support/data) and exits as it did. The real CLI against the
scripted model is in tests/test_real_claude_limits.py.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonHarness
from web_scenario import start_web

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "support" / "data"


def fake_claude(root: Path, fixture: str, code: int) -> Path:
    """An executable that prints ``tests/support/data/<fixture>`` as its run and exits ``code``."""
    path = root / f"fake-claude-{fixture.removesuffix('.log')}"
    path.write_text(f"#!/bin/sh\ncat {json.dumps(str(DATA / fixture))}\nexit {code}\n")
    path.chmod(0o755)
    return path


def preset_daemon(root: Path, program: Path, *, daemon_extra: str = "", **kwargs: object) -> DaemonHarness:
    root.chmod(0o700)
    launcher = f"""
[launchers.claude]
preset = "claude-code"
program = {json.dumps(str(program))}
stop_grace = "500ms"
"""
    h = DaemonHarness(root, extra=launcher, **kwargs)  # type: ignore[arg-type]
    text = h.config_text().replace('default_launcher = "toy"', f'default_launcher = "claude"\n{daemon_extra}')
    h.write_config(text)
    return h


@pytest.fixture
def cleanup() -> Iterator[list[DaemonHarness]]:
    made: list[DaemonHarness] = []
    yield made
    for h in made:
        h.close()


class TestRateLimitsWait:
    """A run refused by a limit spends no attempt and never moves toward escalation."""

    def test_rate_limited_runs_spend_no_attempt(self, tmp_path: Path, cleanup: list[DaemonHarness]) -> None:
        """Five 429 runs in a row with max_attempts = 2: no escalation, the attempt never grows past one."""
        h = preset_daemon(tmp_path, fake_claude(tmp_path, "claude_rate_limited.log", 1), max_attempts=2)
        cleanup.append(h)
        h.start()
        h.new("limited")
        h.wait(lambda: len(h.events("limited", "exited")) >= 5, "five rate-limited runs", timeout=60)
        exits = h.events("limited", "exited")
        assert {e.data["kind"] for e in exits} == {"rate-limited"}
        assert all(e.data.get("rate_limited") for e in exits)
        assert not h.events("limited", "escalated")
        assert not h.events("limited", "stalled")
        assert [e.data["attempt"] for e in h.events("limited", "dispatched")][:5] == [1, 1, 1, 1, 1]
        waits = h.events("limited", "rate_limited")
        assert waits and waits[0].data["source"] == "backoff" and waits[-1].data["hits"] >= 4

    def test_a_reset_in_an_unknown_zone_is_not_read_as_local_time(self, tmp_path: Path,
                                                                  cleanup: list[DaemonHarness]) -> None:
        """"resets 3pm (Mars/Olympus)": no such zone, so no instant is named: the wait is the backoff and
        the rate_limited event says ``unknown_zone`` (issue 24 item 12; on 4c852cf: source "reset", 3pm in
        the daemon's zone, silently)."""
        text = (DATA / "claude_usage_limit.log").read_text().replace("resets 3pm (UTC)", "resets 3pm (Mars/Olympus)")
        log = tmp_path / "mars.log"
        log.write_text(text)
        agent = tmp_path / "fake-claude-mars"
        agent.write_text(f"#!/bin/sh\ncat {json.dumps(str(log))}\nexit 1\n")
        agent.chmod(0o755)
        h = preset_daemon(tmp_path, agent, daemon_extra='max_limit_wait = "25h"')
        cleanup.append(h)
        h.start()
        h.new("mars")
        wait = h.wait(lambda: h.events("mars", "rate_limited"), "the limit's wait", timeout=40)[0]
        assert wait.data["source"] == "backoff" and wait.data["unknown_zone"] == "Mars/Olympus"

    def test_a_named_reset_is_waited_for_and_shown(self, tmp_path: Path, cleanup: list[DaemonHarness]) -> None:
        """"resets 3pm (UTC)": no dispatch before it, and status and the page (list and task) say
        "waiting for the rate limit until T"."""
        h = preset_daemon(tmp_path, fake_claude(tmp_path, "claude_usage_limit.log", 1),
                          daemon_extra='max_limit_wait = "25h"')
        cleanup.append(h)
        h.start()
        h.new("usage")
        wait = h.wait(lambda: h.events("usage", "rate_limited"), "the limit to be recorded")[0]
        assert wait.data["source"] == "reset" and wait.data["until"].endswith("T15:00:00+00:00")
        h.wait(lambda: h.baton("usage").meta.owner is None, "the run to be settled")
        r = h.cli("status")
        assert r.returncode == 0 and f"waiting for the rate limit until {wait.data['until']}" in r.stdout
        doc = json.loads(h.cli("status", "--json").stdout)
        assert doc["tasks"][0]["waiting"].startswith("waiting for the rate limit until")
        web = start_web(h)
        try:
            for page in ("", "tasks/usage"):
                with urllib.request.urlopen(web.at(page), timeout=30) as response:
                    assert f"waiting for the rate limit until {wait.data['until']}" in response.read().decode()
        finally:
            web.stop()
        h.wait_log(lambda e: e.get("event") == "decision" and e.get("task") == "usage"
                   and str(e.get("reason", "")).startswith("waiting for the rate limit until"), "the wait decided")
        # Several ticks later it has still not been dispatched again, nor escalated.
        ticks = len([e for e in h.log() if e.get("event") == "tick"])
        h.wait(lambda: len([e for e in h.log() if e.get("event") == "tick"]) > ticks + 5, "five more ticks")
        assert len(h.events("usage", "dispatched")) == 1 and not h.events("usage", "escalated")

    def test_a_reset_past_the_longest_wait_escalates_with_that_reason(self, tmp_path: Path,
                                                                     cleanup: list[DaemonHarness]) -> None:
        """A reset further away than max_limit_wait escalates the task, naming the limit and the wait."""
        h = preset_daemon(tmp_path, fake_claude(tmp_path, "claude_usage_limit.log", 1),
                          daemon_extra='max_limit_wait = "1s"')
        cleanup.append(h)
        h.start()
        h.new("weekly")
        escalated = h.wait(lambda: h.events("weekly", "escalated"), "the escalation")[0]
        assert "max_limit_wait (1s)" in escalated.data["reason"]
        assert "resets 3pm (UTC)" in escalated.data["reason"]
        assert len(h.events("weekly", "dispatched")) == 1


class TestCostBudget:
    """max_cost_usd: the runs' summed total_cost_usd escalates the task with the spend named."""

    def test_spend_past_the_budget_escalates(self, tmp_path: Path, cleanup: list[DaemonHarness]) -> None:
        """Runs of $0.4213 each under max_cost_usd = 1: the third brings it to $1.26 and the task escalates."""
        h = preset_daemon(tmp_path, fake_claude(tmp_path, "claude_success.log", 0), max_idle_resumes=10,
                          daemon_extra="max_cost_usd = 1.0")
        cleanup.append(h)
        h.start()
        h.new("spender")
        escalated = h.wait(lambda: h.events("spender", "escalated"), "the escalation", timeout=40)[0]
        assert escalated.data["reason"] == "cost budget spent: its runs cost $1.26 (max_cost_usd $1.00)"
        assert len(h.events("spender", "dispatched")) == 3
        assert h.baton("spender").meta.cost_usd == pytest.approx(3 * 0.4213)

    def test_runs_cut_by_max_runtime_are_charged_from_their_usage(self, tmp_path: Path,
                                                                   cleanup: list[DaemonHarness]) -> None:
        """An agent that spends $0.12 of sonnet tokens (two assistant messages) and never ends is cut by
        max_runtime every run, with no result line: each cut run is charged from the stream's usage, and
        max_cost_usd = 0.3 escalates the task at the third (on 4c852cf: no cost ever, four runs and
        counting, no escalation)."""
        def line(msg_id: str) -> str:
            usage = {"input_tokens": 10_000, "output_tokens": 2_000, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 0}
            return json.dumps({"type": "assistant", "message": {"id": msg_id, "model": "claude-sonnet-4-5-20250929",
                                                                "content": [], "usage": usage}})

        stream = tmp_path / "stream.jsonl"
        stream.write_text(f"{line('msg_a')}\n{line('msg_a')}\n{line('msg_b')}\n")
        agent = tmp_path / "fake-claude-cut"
        agent.write_text(f"#!/bin/sh\ncat {json.dumps(str(stream))}\nexec sleep 600\n")
        agent.chmod(0o755)
        h = preset_daemon(tmp_path, agent, max_attempts=20, stall_after="60s", daemon_extra="max_cost_usd = 0.3")
        h.write_config(h.config_text().replace('stop_grace = "500ms"', 'stop_grace = "500ms"\nmax_runtime = "1s"')
                       .replace('default_launcher = "toy"', 'default_launcher = "claude"\nmax_cost_usd = 0.3'))
        cleanup.append(h)
        h.start()
        h.new("cut")
        escalated = h.wait(lambda: h.events("cut", "escalated"), "the escalation", timeout=60)[0]
        assert escalated.data["reason"] == "cost budget spent: its runs cost $0.36 (max_cost_usd $0.30)"
        exits = h.events("cut", "exited")
        assert len(exits) == 3 and all(e.data["cost_source"] == "usage" for e in exits)
        assert h.baton("cut").meta.cost_usd == pytest.approx(0.36)
