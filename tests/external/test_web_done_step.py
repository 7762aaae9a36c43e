"""The page's list shows a done task's step as the one it ended on, as ``heartbeat status`` does
(issue 26, item 12): the last of its ``done``, not the step it was made with."""

from __future__ import annotations

import re

import pytest

from tests.external.test_web import get
from tests.support.daemon_harness import DaemonHarness
from tests.support.web_scenario import start_web

pytestmark = pytest.mark.slow


def test_a_done_tasks_row_shows_its_last_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("donestep")
    root.chmod(0o700)
    h = DaemonHarness(root)
    h.new("t", step="write the parser")
    for args in (("add", "t", "done", "write the parser", "ship it"), ("done", "t")):
        assert h.cli(*args).returncode == 0
    server = start_web(h)
    try:
        code, body, _ = get(server.at())
    finally:
        server.stop()
    row = re.search(r'<tr data-task="t">.*?</tr>', body, re.S)
    assert code == 200 and row and "ship it" in row.group(0) and "write the parser" not in row.group(0), row
