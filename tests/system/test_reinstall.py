"""Reinstalling heartbeat under a running daemon: it says "restart me" instead of every agent dying (issue 26, item 14).

The README's second command turns ``.venv``'s heartbeat into an editable install while a daemon
from the first may still run: the daemon's shim path is gone, and each dispatch died at once
with python's ``can't open file .../shim.py`` (exit 2, counted as the agent's failure). Now the
launch fails before any process starts, as a failed launch whose reason says to restart.

A real daemon runs from a copy of the package (``PYTHONPATH``); the copy is removed under it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import DaemonHarness

import heartbeat

pytestmark = pytest.mark.slow


class CopiedHost(DaemonHarness):
    """A daemon whose heartbeat is a copy at ``root/pkg`` (removable under it)."""

    def __init__(self, root: Path, **kwargs: object) -> None:
        super().__init__(root, **kwargs)  # type: ignore[arg-type]
        self.pkg = root / "pkg"
        shutil.copytree(Path(heartbeat.__file__).parent, self.pkg / "heartbeat",
                        ignore=shutil.ignore_patterns("__pycache__"))

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(self.config), "run"],
                                     stdout=log, stderr=subprocess.STDOUT, cwd=str(self.root),
                                     env={**self.env(), "PYTHONPATH": str(self.pkg)})
        log.close()
        self.wait_log(lambda e: e.get("event") == "started" and e.get("pid") == self.proc.pid, "daemon start")


def test_a_daemon_whose_files_were_removed_says_restart_it(tmp_path: Path) -> None:
    """The first task runs; heartbeat's files are removed; the next dispatch is a failed launch saying
    to restart the daemon, in the log, the ledger and `status`, and no agent attempt is spent."""
    tmp_path.chmod(0o700)
    h = CopiedHost(tmp_path, stall_after="1h")
    try:
        h.start()
        h.new("before", plan=1)
        h.wait(lambda: h.events("before", "launched"), "the first agent launched")
        shutil.rmtree(h.pkg)
        h.new("after", plan=1)
        exited = h.wait(lambda: h.events("after", "exited"), "the launch after the removal settled")
        assert exited[0].data["kind"] == "launch-failed", exited[0].data
        assert "heartbeat's own files moved under this running daemon" in exited[0].data["error"]
        assert "restart the daemon" in exited[0].data["error"]
        assert h.baton("after").meta.attempt == 0
        row = json.loads(h.cli("status", "--json").stdout)["tasks"]
        [after] = [r for r in row if r["id"] == "after"]
        assert after["state"] == "launch-failing" and "restart the daemon" in after["why"], after
        assert not os.path.exists(h.pkg)
    finally:
        h.close()
