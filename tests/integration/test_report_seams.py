"""`heartbeat report` learns the seams inside sessions and what the runs cost.

The ledger events are written here by hand (``store.record``), exactly as the Claude Code
hooks (``session_started``, ``compacting``, ``stop_blocked``, ``session_ended``) and the
launchers (``exited`` with ``total_cost_usd``, ``usage``, ``num_turns``, ``session_id``)
record them, so each count is induced on purpose and checked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Result

from heartbeat.model.ledger import Event
from heartbeat.model.timeparse import utcnow
from heartbeat.reports.report import build_report
from heartbeat.reports.seams import SEAM_KEYS, seam_metrics
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


T0 = utcnow() - timedelta(hours=2)


def ev(kind: str, minute: float, epoch: int = 1, task: str = "t1", **data: Any) -> Event:
    return Event(task=task, kind=kind, ts=T0 + timedelta(minutes=minute), epoch=epoch, actor="daemon", data=data)


def usage(inp: int, out: int, **more: int) -> dict[str, Any]:
    return {"input_tokens": inp, "output_tokens": out, "server_tool_use": {"web_search_requests": 0},
            "service_tier": "standard", **more}


def a_task_with_three_runs(task: str = "t1") -> list[Event]:
    """First run, then two resumes; a compaction inside each of the first two sessions."""
    return [
        ev("dispatched", 0, 1, task),
        ev("session_started", 0.1, 1, task, session_id="a", source="startup"),
        ev("compacting", 20, 1, task, session_id="a", trigger="auto", note_age_s=30.0, fresh=True),
        ev("session_started", 20.1, 1, task, session_id="a", source="compact"),
        ev("stop_blocked", 25, 1, task, session_id="a"),
        ev("session_ended", 26, 1, task, session_id="a", reason="other"),
        ev("exited", 26, 1, task, code=0, session_id="a", num_turns=12, total_cost_usd=0.5,
           usage=usage(1000, 200, cache_read_input_tokens=50)),
        ev("dispatched", 30, 2, task),
        ev("session_started", 30.1, 2, task, session_id="b", source="resume"),
        ev("compacting", 40, 2, task, session_id="b", trigger="manual", note_age_s=3600.0, fresh=False),
        ev("exited", 45, 2, task, code=1, session_id="b", num_turns=4, total_cost_usd=0.25, usage=usage(400, 100)),
        ev("dispatched", 50, 3, task),
        ev("exited", 55, 3, task, code=0, session_id="c", num_turns=2, total_cost_usd=0.125, usage=usage(100, 10)),
    ]


EXPECTED = {
    "session_starts": {"startup": 1, "compact": 1, "resume": 1},
    "compactions": 2,
    "compactions_fresh": 1,
    "compactions_stale": 1,
    "stop_blocks": 1,
    "sessions_ended": 1,
    "runs": 3,
    "cost_usd": 0.875,
    "tokens": {"input_tokens": 1500, "output_tokens": 310, "cache_read_input_tokens": 50},
    "turns": 18,
    "resume_runs": 2,
    "resume_cost_usd": 0.375,
    "resume_tokens": {"input_tokens": 500, "output_tokens": 110},
}


class TestSeamMetrics:
    """Each seam and each cost figure is counted exactly from the events."""

    def test_a_task_with_compactions_and_resumes(self) -> None:
        """Starts by source, fresh/stale compactions, a Stop block, cost and tokens split by resume."""
        got = seam_metrics(a_task_with_three_runs())
        assert list(got) == list(SEAM_KEYS)
        assert got == EXPECTED

    def test_nothing_reported_is_null_not_zero(self) -> None:
        """Runs without cost or usage (an exec launcher) leave cost null and tokens empty: unknown, not free."""
        got = seam_metrics([ev("dispatched", 0), ev("exited", 1, code=0), ev("dispatched", 2, 2), ev("exited", 3, 2)])
        assert (got["runs"], got["cost_usd"], got["tokens"], got["resume_cost_usd"]) == (0, None, {}, None)

    def test_garbage_values_are_ignored(self) -> None:
        """A cost that is not a number (text, a bool, NaN), negative or non-integer token counts count for nothing."""
        got = seam_metrics([
            ev("dispatched", 0),
            ev("exited", 1, total_cost_usd="lots", usage={"input_tokens": -5, "output_tokens": True,
                                                           "cache_read_input_tokens": 1.5}, num_turns=3),
            ev("exited", 2, total_cost_usd=float("nan"), usage="x", num_turns=None),
            ev("exited", 3, total_cost_usd=True, usage=[1, 2]),
        ])
        assert (got["runs"], got["cost_usd"], got["tokens"], got["turns"]) == (1, None, {}, 3)

    def test_freshness_without_the_hooks_judgement(self) -> None:
        """A compacting event without ``fresh`` is judged by its note age against fresh_within."""
        events = [ev("compacting", 0, note_age_s=100.0), ev("compacting", 1, note_age_s=400.0),
                  ev("compacting", 2, note_age_s=None)]
        got = seam_metrics(events)
        assert (got["compactions_fresh"], got["compactions_stale"]) == (1, 2)
        got = seam_metrics(events, fresh_within=1000)
        assert (got["compactions_fresh"], got["compactions_stale"]) == (2, 1)

    def test_since_counts_only_what_happened_after(self) -> None:
        """With since, earlier seams are not counted, but a later run is still known to be a resume."""
        got = seam_metrics(a_task_with_three_runs(), since=T0 + timedelta(minutes=29))
        assert got["session_starts"] == {"resume": 1}
        assert (got["compactions"], got["runs"], got["resume_runs"]) == (1, 2, 2)
        assert got["cost_usd"] == got["resume_cost_usd"] == 0.375

    def test_a_claimed_agent_is_a_start_and_a_reclaim_is_not(self) -> None:
        """Agents started outside the daemon (claim) count as starts; the same pid claiming again does not."""
        got = seam_metrics([
            ev("claimed", 0, 1, pid=10, previous_pid=None),
            ev("claimed", 1, 2, pid=10, previous_pid=10),
            ev("exited", 2, 2, total_cost_usd=1.0),
            ev("claimed", 3, 3, pid=11, previous_pid=10),
            ev("exited", 4, 3, total_cost_usd=2.0),
        ])
        assert (got["runs"], got["resume_runs"], got["resume_cost_usd"]) == (2, 1, 2.0)


class TestInTheReport:
    """`heartbeat report` shows the seams per task and in total, as JSON and as text."""

    @pytest.fixture
    def store(self, state_dir: Path, tmp_path: Path) -> FileStore:
        store = FileStore(str(state_dir))
        for task_id in ("t1", "t2"):
            tasks.new_task(store, task_id, task="T", step="s", workdir=str(tmp_path))
        store.record(a_task_with_three_runs("t1"))
        store.record([ev("dispatched", 0, 1, "t2"),
                      ev("exited", 1, 1, "t2", total_cost_usd=0.125, usage=usage(10, 1), num_turns=1)])
        return store

    def test_json_per_task_and_totals(self, store: FileStore) -> None:
        """Each task's seams, and their sum under the report's seams."""
        report = build_report(store).to_json()
        by_id = {t["id"]: t for t in report["tasks"]}
        assert by_id["t1"]["seams"] == EXPECTED
        assert by_id["t2"]["seams"]["runs"] == 1 and by_id["t2"]["seams"]["resume_runs"] == 0
        total = report["seams"]
        assert (total["runs"], total["cost_usd"], total["resume_cost_usd"]) == (4, 1.0, 0.375)
        assert total["tokens"] == {"input_tokens": 1510, "output_tokens": 311, "cache_read_input_tokens": 50}
        assert total["session_starts"] == {"startup": 1, "compact": 1, "resume": 1}

    def test_text(self, store: FileStore, hb: Callable[..., Result]) -> None:
        """The text report has a line per task with seams or cost, and a total, after the handoff table."""
        r = hb("report")
        assert r.code == 0, r.err
        lines = r.out.splitlines()
        assert "inside sessions (Claude Code hooks) and cost:" in lines
        assert ("t1: sessions 3 (compact 1, resume 1, startup 1); compactions 2 (note fresh 1, stale 1); "
                "stop blocks 1; 3 run(s) $0.8750, 1.5k in / 310 out tokens; resumes 2 run(s) $0.3750") in lines
        assert "t2: 1 run(s) $0.1250, 10 in / 1 out tokens" in lines
        assert any(line.startswith("TOTAL: ") and "4 run(s) $1.0000" in line for line in lines)
        data = json.loads(hb("report", "--json").out)
        assert data["seams"]["runs"] == 4

    def test_no_seams_no_section(self, hb: Callable[..., Result]) -> None:
        """A ledger without hook or cost events prints the report as before, with no seams section."""
        assert hb("new", "t1", "--task", "T", "--step", "s").code == 0
        assert "inside sessions" not in hb("report").out


class TestFromThePresets:
    """What the launcher presets write into ``exited`` is what the report counts."""

    @pytest.mark.parametrize("preset, log", [("claude-code", "claude_success.log"), ("codex", "codex_success.log")])
    def test_a_recorded_run_is_costed(self, preset: str, log: str) -> None:
        """A recorded stream parsed by its preset, recorded as ``exited``, shows up in runs, tokens and cost."""
        from heartbeat.presets.registry import parse_result

        info = parse_result(preset, (Path(__file__).parents[1] / "support" / "data" / log).read_bytes())
        data = info.event_data()
        m = seam_metrics([ev("dispatched", 0), ev("exited", 5, code=0, **data)])
        assert m["runs"] == 1
        assert m["tokens"].get("input_tokens") == data["input_tokens"] > 0
        assert m["tokens"].get("output_tokens") == data["output_tokens"]
        assert m["cost_usd"] == data.get("cost_usd")
        assert m["turns"] == (data.get("num_turns") or 0)
