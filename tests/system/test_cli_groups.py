"""A command loads its own group of the command line (``heartbeat/cli/``), never every group's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

GROUPS = {"tasks", "watch", "state", "serve", "agents"}


def _cli_modules(state_dir: Path, *argv: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "heartbeat", *argv], capture_output=True,
                          text=True, timeout=60, env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)))
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return {n.split(".")[2] for n in names if n.startswith("heartbeat.cli.") and n.split(".")[2] in GROUPS}


@pytest.mark.parametrize(("argv", "group"), [
    (["status"], "watch"),
    (["show", "nothing-here"], "tasks"),
    (["check-config"], "state"),
    (["hooks", "--help"], None),
])
def test_a_command_loads_only_its_group(tmp_path: Path, argv: list[str], group: str | None) -> None:
    """``heartbeat status`` imports ``heartbeat.cli.watch`` and none of tasks, state, serve, agents."""
    assert _cli_modules(tmp_path / "state", *argv) == ({group} if group else set())
