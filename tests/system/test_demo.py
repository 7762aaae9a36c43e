"""`heartbeat demo`, the README's first command: it runs to the end and shows what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import clean_env


class TestDemo:
    def test_the_demo_runs_both_acts_and_says_so(self, tmp_path: Path) -> None:
        """A real daemon resumes a killed agent, holds a block until a human lifts it, and carries a
        builder's package to a critic, whose broken-guarantee verify reopens the builder; exit 0."""
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "demo"], capture_output=True, text=True,
                              timeout=300, env=clean_env(TMPDIR=str(tmp_path)), cwd=str(tmp_path),
                              stdin=subprocess.DEVNULL)
        out = proc.stdout
        assert proc.returncode == 0, (out[-2000:], proc.stderr[-2000:])
        assert "Killed the agent (SIGKILL)" in out and "dispatched a successor" in out
        assert "no step redone" in out and "A blocked task is never dispatched" in out
        assert "Act 2" in out
        assert "_(inherited from `feature.builder`)_" in out  # the constraint crossed the boundary
        assert "Decisions of feature.builder:" in out
        assert "broken (exit 3)" in out and "the builder is back to work" in out
        assert "That is heartbeat" in out
        # both acts' tasks end done; the report and the edge report are printed
        for task in ("deploy", "feature.builder", "feature.critic", "fix-fallback"):
            assert any(line.split()[:2] == [task, "done"] or line.split()[1:3] == [task, "done"]
                       for line in out.splitlines() if task in line), task
        assert "edge report" in out
