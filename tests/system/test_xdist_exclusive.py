"""The ``exclusive`` mark under pytest-xdist (tests/conftest.py): while such a test runs, no other
worker runs one. ``scripts/test`` runs the suite on four workers (or ``HEARTBEAT_TEST_WORKERS``); no
test of it carries the mark now."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT, clean_env

INNER = '''
import json, os, time
import pytest

def record(name):
    path = os.environ["EXCLUSIVE_LOG"]
    start = time.time()
    time.sleep(0.4)
    with open(path, "a") as f:
        f.write(json.dumps([name, start, time.time()]) + "\\n")

@pytest.mark.exclusive
def test_alone():
    record("alone")

@pytest.mark.parametrize("i", range(8))
def test_other(i):
    record(f"other{i}")
'''


class TestExclusiveMark:
    """An exclusive test's run overlaps no other test's run on the other worker."""

    def test_no_other_test_runs_beside_an_exclusive_one(self, tmp_path: Path) -> None:
        """Two workers, one exclusive test among eight others of 0.4 s each: no interval overlaps it."""
        suite = tmp_path / "suite"
        suite.mkdir()
        (suite / "conftest.py").write_text(
            "from tests.conftest import _exclusive_under_xdist  # noqa: F401  (the suite's own fixture)\n")
        (suite / "test_inner.py").write_text(textwrap.dedent(INNER))
        log = tmp_path / "runs.jsonl"
        env = {k: v for k, v in clean_env(EXCLUSIVE_LOG=str(log), PYTHONPATH=str(ROOT)).items()
               if not k.startswith(("PYTEST_", "PYTHONHASHSEED"))}  # not this run's worker identity
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "load",
             "-o", "markers=exclusive: alone", "--rootdir", str(suite), "--basetemp", str(tmp_path / "base"),
             str(suite)],
            capture_output=True, text=True, env=env, timeout=120, cwd=str(suite))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(runs) == 9
        [(_, a_start, a_end)] = [r for r in runs if r[0] == "alone"]
        overlapping = [r for r in runs if r[0] != "alone" and r[1] < a_end and r[2] > a_start]
        assert overlapping == [], (a_start, a_end, overlapping)
