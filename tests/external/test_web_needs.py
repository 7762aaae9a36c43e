"""The task page's Needs table, rendered by headless Chromium: a learned need with its evidence, a
declared one, a pinned one by a hostile name that stays text (issue 27, items 1 and 2)."""

from __future__ import annotations

import html
import re

import pytest

from tests.support.daemon_harness import DaemonHarness
from tests.support.web_scenario import chromium, start_web

pytestmark = pytest.mark.slow

HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


def test_the_task_page_shows_each_edges_needs_and_their_evidence(tmp_path_factory: pytest.TempPathFactory) -> None:
    """/tasks/p3.review lists its edge's needs: `rejected` learned (with the evidence), `decisions`
    declared, `key_files` pinned by a name that is HTML (escaped, never run); /tasks/p3.build lists
    them as its downstream's."""
    root = tmp_path_factory.mktemp("webneeds")
    root.chmod(0o700)
    h = DaemonHarness(root)
    for run in ("p1", "p2", "p3"):
        for args in (("new", f"{run}.build", "--task", "Build", "--step", "build", "--intent", "why"),
                     ("new", f"{run}.review", "--task", "Review", "--step", "review", "--after", f"{run}.build",
                      *(("--needs", "decisions") if run == "p3" else ()))):
            assert h.cli(*args).returncode == 0
    for run in ("p1", "p2"):
        for args in (("done", f"{run}.build"), ("add", f"{run}.review", "rederived", "rejected: Redis was tried")):
            r = h.cli(*args)
            assert r.returncode == 0, r.stderr
    r = h.cli("needs", "p3.review", "--pin", "key_files", "--by", HOSTILE)
    assert r.returncode == 0, r.stderr
    server = start_web(h)
    try:
        dom = chromium(server.at("tasks/p3.review"))
        up = chromium(server.at("tasks/p3.build"))
    finally:
        server.stop()
    table = dom.split('<table id="needs">', 1)[1].split("</table>", 1)[0]
    found = dict(re.findall(r'<tr data-part="([a-z_]+)" data-source="([a-z]+)"', table))
    assert found == {"decisions": "declared", "rejected": "learned", "key_files": "pinned"}
    assert "review re-derived `rejected` in 2 of the last 2 handoffs" in html.unescape(table)
    assert "<img" not in table and "&lt;img" in table and "pwned" not in dom.split("<title>", 1)[1][:80]
    upstream = up.split('<table id="needs">', 1)[1].split("</table>", 1)[0]
    assert "its downstream needs" in upstream and 'data-part="rejected"' in upstream
    brief = html.unescape(up.split('<pre id="brief">', 1)[1].split("</pre>", 1)[0])
    assert "`p3.review` needs `rejected` (learned: review re-derived" in brief
