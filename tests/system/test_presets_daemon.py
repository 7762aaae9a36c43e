"""Session presets through a real daemon (tests/support/daemon_harness.py) and a fake claude that
writes its session id and exits as told."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from daemon_harness import DaemonHarness

from heartbeat.presets.common import valid_session_id

FAKE_CLAUDE = """#!{python}
import json, os, sys
argv = sys.argv[1:]
brief = sys.stdin.read()
record = os.environ["FAKE_RECORD"]
with open(record, "a") as f:
    f.write(json.dumps({{"argv": argv, "brief": brief}}) + "\\n")
runs = sum(1 for _ in open(record))
mode = os.environ["FAKE_MODES"].split(",")[min(runs, len(os.environ["FAKE_MODES"].split(","))) - 1]
flag = "--resume" if "--resume" in argv else "--session-id"
session = argv[argv.index(flag) + 1]
result = {{"type": "result", "subtype": "success", "is_error": False, "result": "ok", "session_id": session,
          "num_turns": 2, "total_cost_usd": 0.01, "terminal_reason": "completed"}}
if mode == "crash":
    print("Killed mid-turn", flush=True)
    sys.exit(1)
if mode == "error0":
    result.update(is_error=True, result="API Error: Connection error.", terminal_reason="api_error")
    print(json.dumps(result))
    sys.exit(0)
if mode == "noconv" and flag == "--resume":
    result.update(subtype="error_during_execution", is_error=True, result=None,
                  errors=["No conversation found with session ID: " + session])
    print(json.dumps(result))
    sys.exit(1)
print(json.dumps(result))
sys.exit(1)
"""


def fake_claude_daemon(tmp_path: Path, modes: str, *, session: str = "resume", max_resumes: int = 3,
                       max_attempts: int = 10) -> DaemonHarness:
    tmp_path.chmod(0o700)
    fake = tmp_path / "fake-claude"
    fake.write_text(FAKE_CLAUDE.format(python=sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record.jsonl"
    extra = f"""
[launchers.claude]
preset = "claude-code"
program = "{fake}"
session = "{session}"
max_resumes_per_session = {max_resumes}
stop_grace = "500ms"
env = {{ FAKE_RECORD = "{record}", FAKE_MODES = "{modes}" }}
"""
    # stall_after is long: a loaded machine must not turn a slow start into a "never wrote" stop.
    return DaemonHarness(tmp_path, extra=extra, max_attempts=max_attempts, stall_after="60s")


def runs(h: DaemonHarness) -> list[dict[str, Any]]:
    """The fake claude's record of its runs: whole lines only (a run may be writing its line as the
    test polls: a fresh-clone CI read one half written)."""
    path = h.root / "record.jsonl"
    whole = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in whole if line]


class TestDaemonSessions:
    """The daemon picks fresh or resumed sessions, records the one used, and settles by the result line."""

    def test_resume_after_a_crash_then_fresh_past_the_limit(self, tmp_path: Path) -> None:
        """crash → resume the same session with the note → crash → (max 1 resume) a fresh session."""
        h = fake_claude_daemon(tmp_path, "crash,crash,crash", max_resumes=1)
        try:
            h.start()
            h.new("s1", "--launcher", "claude")
            h.wait(lambda: len(runs(h)) >= 3 and len(h.events("s1", "exited")) >= 3, "three runs")
            first, second, third = runs(h)[:3]
            assert first["argv"][-2] == "--session-id"
            session = first["argv"][-1]
            assert valid_session_id(session)
            assert second["argv"][-2:] == ["--resume", session]
            assert str(second["brief"]).startswith("You are resuming this session after it ended: exit 1")
            assert "re-read the brief" in str(second["brief"])
            assert third["argv"][-2] == "--session-id" and third["argv"][-1] != session
            assert not str(third["brief"]).startswith("You are resuming")
            dispatched = h.events("s1", "dispatched")[:3]
            assert [e.data["session_resumed"] for e in dispatched] == [False, True, False]
            assert [e.data["session"] for e in dispatched][:2] == [session, session]
        finally:
            h.close()

    def test_fresh_mode_never_resumes(self, tmp_path: Path) -> None:
        """session = "fresh": every dispatch, retries included, gets a new --session-id."""
        h = fake_claude_daemon(tmp_path, "crash,crash", session="fresh")
        try:
            h.start()
            h.new("s2", "--launcher", "claude")
            h.wait(lambda: len(runs(h)) >= 2, "two runs")
            a, b = runs(h)[:2]
            assert a["argv"][-2] == b["argv"][-2] == "--session-id"
            assert a["argv"][-1] != b["argv"][-1]
        finally:
            h.close()

    def test_a_resume_that_finds_no_conversation_falls_back_to_fresh(self, tmp_path: Path) -> None:
        """"No conversation found" on --resume clears meta.session: the next dispatch starts a fresh session."""
        h = fake_claude_daemon(tmp_path, "crash,noconv,crash")
        try:
            h.start()
            h.new("s3", "--launcher", "claude")
            h.wait(lambda: len(runs(h)) >= 3, "three runs")
            first, second, third = runs(h)[:3]
            assert second["argv"][-2] == "--resume"
            assert third["argv"][-2] == "--session-id"
            assert third["argv"][-1] != first["argv"][-1]
            exited = h.events("s3", "exited")[1]
            assert exited.data["resume_failed"] is True
        finally:
            h.close()

    def test_is_error_with_exit_0_is_a_failed_attempt(self, tmp_path: Path) -> None:
        """A result line with is_error after exit 0 counts as a failed attempt (backoff), not a shift end."""
        h = fake_claude_daemon(tmp_path, "error0,crash", session="fresh")
        try:
            h.start()
            h.new("s4", "--launcher", "claude")
            exited = h.wait(lambda: h.events("s4", "exited"), "the exit")[0]
            assert exited.data["code"] == 0 and exited.data["kind"] == "failed"
            assert exited.data["is_error"] is True and exited.data["result"] == "API Error: Connection error."
            assert exited.data["cost_usd"] == 0.01 and exited.data["num_turns"] == 2
            h.wait(lambda: len(runs(h)) >= 2, "the retry")
            dispatched = h.events("s4", "dispatched")[1]
            assert "retry after a failed attempt" in dispatched.data["reason"]
            assert "Connection error" in dispatched.data["reason"]
        finally:
            h.close()


