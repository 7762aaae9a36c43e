"""The learning bench's smoke (``scripts/bench_learning.py --quick``), so the bench cannot rot.

Two builder → critic handoffs of the real ``claude`` under one daemon, learning on and learned after
one: the first handoff's critic asks, the builder's resumed session answers, the critic records the
part as re-derived; the profile learns the need, and the second handoff carries the part without a
question. Judged by the scripted model's own record as the bench reports it, and by the ledger.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_clis import agent_cli

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench_learning.py"


class TestTheLearningBenchSmoke:
    """The bench's quick mode runs end to end and its figures say what the loop did."""

    def test_a_question_then_a_learned_need_then_no_question(self) -> None:
        """p1: one question, answered by the builder's resumed session (which carried its earlier
        conversation), one part re-derived, the package without it; p2: the learned need reached the
        builder (its brief named it, or its done was refused naming it), the package held the part, the
        critic's first request carried its words, no question."""
        agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
        r = subprocess.run([sys.executable, str(BENCH), "--quick", "--json"], capture_output=True, text=True,
                           timeout=240, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
        [arm] = json.loads(r.stdout)["learning on"]
        first, second = arm["handoffs"]
        assert first["finished"] and second["finished"], arm
        assert (first["questions"], first["rederived"], first["packaged"]) == (1, 1, False), first
        assert first["answered_by"] == ["upstream:p1.build"], first
        assert first["resumed_history"] and all(first["resumed_history"]), first
        assert not first["critic_carried_first"], first
        assert len(arm["learned"]) == 1 and "rejected" in arm["learned"][0], arm["learned"]
        assert (second["questions"], second["rederived"]) == (0, 0), second
        # (the daemon's dispatch brief can miss a downstream created with its upstream: then the refused
        # done is what tells the builder; the bench reports which, see docs/development.md)
        assert second["required_in_brief"] or len(second["refusals"]) == 1, second
        assert all("`rejected`" in line for line in second["refusals"]), second
        assert second["packaged"] and second["critic_carried_first"], second
        assert second["runs"] < first["runs"] and second["input_tokens"] < first["input_tokens"], (first, second)
        assert arm["stages_per_agent_minute"] > 0
