"""An upstream's recorded session answers a downstream's question: the daemon's launch decision.

An in-process daemon (``Daemon(config, store=...)``) ticked with ``tick(now=...)``; the
upstream's launcher is the ``claude-code`` preset around a fake ``claude`` (a real process) that
records its argv and the prompt it read, and ends as its mode says: with a result text, an
error, a run of ``heartbeat answer``, or not at all (a hang).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from daemon_harness import in_process_config

FAKE_CLAUDE = """#!{python}
import json, os, subprocess, sys, time
argv = sys.argv[1:]
prompt = sys.stdin.read()
mode = open(os.environ["FAKE_MODE"]).read().strip()
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({{"argv": argv, "prompt": prompt, "task": os.environ.get("HEARTBEAT_TASK"),
                        "epoch": os.environ.get("HEARTBEAT_EPOCH")}}) + "\\n")
session = argv[argv.index("--resume") + 1] if "--resume" in argv else ""
result = {{"type": "result", "subtype": "success", "is_error": False, "session_id": session, "num_turns": 1,
          "result": "We kept the retry loop because the API drops one call in fifty."}}
if mode == "hang":
    time.sleep(600)
if mode == "error":
    result.update(is_error=True, result="API Error: Connection error.")
    print(json.dumps(result)); sys.exit(1)
if mode == "command":
    r = subprocess.run([{python!r}, "-m", "heartbeat", "answer", "critic", "q1", "Because of the flaky API."],
                       capture_output=True, text=True)
    with open(os.environ["FAKE_RECORD"], "a") as f:
        f.write(json.dumps({{"answer_cli": r.returncode, "stderr": r.stderr}}) + "\\n")
    result["result"] = "I answered with heartbeat answer."
print(json.dumps(result))
"""

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
SESSION = "5f0c1c44-8a4e-4d2b-9a57-0c6f1f3b2a10"


class Rig:
    """A daemon whose ``claude`` launcher runs the fake; ``build`` done with a session, ``critic`` after it."""

    def __init__(self, tmp_path: Path, *, mode: str = "text", session: str = SESSION, extra: str = "") -> None:
        from heartbeat.daemon import Daemon
        from heartbeat.store.files import FileStore

        tmp_path.chmod(0o700)
        fake = tmp_path / "fake-claude"
        fake.write_text(FAKE_CLAUDE.format(python=sys.executable))
        fake.chmod(0o755)
        self.record_path = tmp_path / "record.jsonl"
        self.mode_path = tmp_path / "mode"
        self.mode_path.write_text(mode)
        launchers = f"""
[launchers.agent]
type = "null"

[launchers.claude]
preset = "claude-code"
program = "{fake}"
stop_grace = "500ms"
env = {{ FAKE_RECORD = "{self.record_path}", FAKE_MODE = "{self.mode_path}", PYTHONPATH = "{Path.cwd()}" }}
{extra}
"""
        self.state, self.config = in_process_config(tmp_path, launchers=launchers)
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.store = FileStore(str(self.state))
        self.daemon = Daemon(self.config, store=self.store)
        self._daemons = [self.daemon]
        self.new_pair(session)

    def new_pair(self, session: str) -> None:
        from heartbeat.model.baton import Status
        from heartbeat.tasks import verbs

        verbs.new_task(self.store, "build", task="Build the client", step="Write it", launcher="claude",
                       workdir=str(self.work), now=T0)
        with self.store.edit("build", actor="test", now=T0) as ed:  # as a finished dispatch leaves it
            ed.baton.meta.status = Status.DONE
            ed.baton.meta.epoch, ed.baton.meta.attempt, ed.baton.meta.session = 1, 1, session
        verbs.new_task(self.store, "critic", task="Review the client", step="Read it", launcher="agent",
                       after=["build"], workdir=str(self.work), now=T0)
        if self.store.load("critic").meta.status is Status.BLOCKED:  # (the daemon's after: gate, opened)
            verbs.unblock(self.store, "critic", by="gate:after:build", note="", gate_opened="after:build")

    def second_daemon(self) -> Any:
        from heartbeat.daemon import Daemon
        from heartbeat.store.files import FileStore

        d = Daemon(self.config, store=FileStore(str(self.state)))
        self._daemons.append(d)
        return d

    def ask(self, text: str = "Why did you keep the retry loop?") -> str:
        from heartbeat.tasks import questions

        return questions.ask(self.store, "critic", text, to="upstream", now=T0)

    def question(self, qid: str = "q1") -> Any:
        return next(q for q in self.store.load("critic").questions if q.id == qid)

    def runs(self) -> list[dict[str, Any]]:
        if not self.record_path.exists():
            return []
        return [json.loads(line) for line in self.record_path.read_text().splitlines()]

    def events(self, task: str, kind: str) -> list[Any]:
        return self.store.ledger.events(task, kinds=[kind])

    def tick_until(self, done: Any, what: str, *, start: datetime, timeout: float = 30.0,
                   daemon: Any = None) -> datetime:
        """Tick (``now`` moving on a second a pass from ``start``) until ``done()``; the last ``now``."""
        daemon = daemon or self.daemon
        deadline = time.monotonic() + timeout
        now = start
        while time.monotonic() < deadline:
            daemon.tick(now=now)
            if done():
                return now
            now += timedelta(seconds=1)
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def close(self) -> None:
        """Stop the answering runs still under way (a hung fake), then the daemons."""
        for d in self._daemons:
            for run in list(d.answers.runs.values()):
                launcher = d.shared.launchers.get(run.launcher)
                if launcher is not None and run.owner is not None:
                    launcher.stop(run.owner, grace=0.5)
            d.shutdown()


def frozen(baton: Any) -> tuple[Any, ...]:
    m = baton.meta
    return m.status, m.epoch, m.attempt, m.dispatches, m.owner, m.session, m.revision


class TestTheAnsweringRun:
    """The upstream's session is resumed once, with the question, and its answer reaches the asker."""

    def test_the_resumed_session_s_result_is_the_answer_and_the_upstream_is_untouched(self, tmp_path: Path) -> None:
        """A question to ``build`` starts one resumed run of build's session (``--resume SESSION``,
        the question on stdin, ``heartbeat answer critic q1`` allowed), bound to build's epoch; its
        result text becomes q1's answer by ``upstream:build``, the gate lifts, and build's baton
        (status, epoch, attempt, owner, revision) is as it was."""
        rig = Rig(tmp_path)
        try:
            before = frozen(rig.store.load("build"))
            rig.ask()
            assert rig.store.load("critic").meta.status.value == "blocked"
            rig.daemon.tick(now=T0)
            assert rig.question().sent_at == T0
            assert [e.data["qid"] for e in rig.events("build", "answer_started")] == ["q1"]
            rig.tick_until(lambda: not rig.question().open, "the answer", start=T0 + timedelta(seconds=1))
            q = rig.question()
            assert q.answer == "We kept the retry loop because the API drops one call in fifty."
            assert q.answered_by == "upstream:build"
            assert rig.store.load("critic").meta.status.value == "active"
            [run] = rig.runs()
            assert run["argv"][-2:] == ["--resume", SESSION], run["argv"]
            assert "Why did you keep the retry loop?" in run["prompt"] and "heartbeat answer critic q1" in run["prompt"]
            allowed = run["argv"][run["argv"].index("--allowedTools") + 1]
            assert "Bash(heartbeat answer critic q1:*)" in allowed.split(",")
            assert not [r for r in allowed.split(",") if r.startswith("Bash(heartbeat answer") and "q1" not in r]
            assert (run["task"], run["epoch"]) == ("build", "1")
            [ended] = rig.events("build", "answer_run")
            assert ended.data["outcome"] == "answered_from_result" and ended.data["asker"] == "critic"
            assert frozen(rig.store.load("build")) == before
            assert not rig.events("build", "dispatched")
        finally:
            rig.close()

    def test_sent_once_across_ticks_and_two_daemons(self, tmp_path: Path) -> None:
        """Ticks of this daemon and of a second daemon on the same state dir start one run; a look that
        saw the question unsent (a daemon racing the first) is refused by ``mark_sent`` and starts none
        (fails without the mark: two runs of one session)."""
        rig = Rig(tmp_path, mode="hang")
        try:
            rig.ask()
            stale = rig.store.load("critic")
            rig.daemon.tick(now=T0)
            other = rig.second_daemon()
            for i in range(1, 4):
                rig.daemon.tick(now=T0 + timedelta(seconds=i))
                other.tick(now=T0 + timedelta(seconds=i))
            other.answers.send(stale, stale.questions[0], T0 + timedelta(seconds=5))
            deadline = time.monotonic() + 15
            while not rig.runs() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # a second run, had one started, records itself within this
            assert len(rig.runs()) == 1
            assert len(rig.events("build", "answer_started")) == 1
            assert other.answers.runs == {}
        finally:
            rig.close()

    def test_nothing_for_an_answered_question(self, tmp_path: Path) -> None:
        """A question a person answered before the daemon looked starts no run."""
        from heartbeat.tasks import questions

        rig = Rig(tmp_path)
        try:
            rig.ask()
            questions.answer(rig.store, "critic", "q1", "Ask me, not it.", by="person", now=T0)
            for i in range(3):
                rig.daemon.tick(now=T0 + timedelta(seconds=i))
            assert rig.runs() == [] and not rig.events("build", "answer_started")
            assert rig.question().sent_at is None
        finally:
            rig.close()

    def test_the_session_s_own_heartbeat_answer_stands(self, tmp_path: Path) -> None:
        """A session that answers with ``heartbeat answer critic q1 "..."`` (bound to build, a done
        task) has that answer kept; its final text is not written over it."""
        rig = Rig(tmp_path, mode="command")
        try:
            rig.ask()
            rig.tick_until(lambda: bool(rig.events("build", "answer_run")), "the run's end", start=T0)
            cli = [r for r in rig.runs() if "answer_cli" in r]
            assert cli and cli[0]["answer_cli"] == 0, cli
            q = rig.question()
            assert (q.answer, q.answered_by) == ("Because of the flaky API.", "upstream:build")
            assert rig.events("build", "answer_run")[0].data["outcome"] == "answered"
        finally:
            rig.close()


class TestToAPerson:
    """What no resumed session can answer goes to a person, with the reason."""

    def test_a_missing_session_goes_to_a_person(self, tmp_path: Path) -> None:
        """An upstream that recorded no session: no run, q1 re-addressed to a person, the reason in
        the ledger."""
        rig = Rig(tmp_path, session="")
        try:
            rig.ask()
            rig.daemon.tick(now=T0)
            q = rig.question()
            assert q.to.value == "person" and q.escalated_at is not None and q.sent_at is None
            [moved] = rig.events("critic", "question_readdressed")
            assert moved.data["reason"] == "build recorded no session to resume"
            assert rig.runs() == []
        finally:
            rig.close()

    def test_a_failed_run_goes_to_a_person(self, tmp_path: Path) -> None:
        """A resumed run whose result is an error: q1 to a person, ``answer_run`` says failed."""
        rig = Rig(tmp_path, mode="error")
        try:
            rig.ask()
            rig.tick_until(lambda: bool(rig.events("build", "answer_run")), "the run's end", start=T0)
            assert rig.events("build", "answer_run")[0].data["outcome"] == "failed"
            q = rig.question()
            assert q.open and q.to.value == "person"
            [moved] = rig.events("critic", "question_readdressed")
            assert "API Error: Connection error." in moved.data["reason"]
        finally:
            rig.close()

    def test_a_hung_run_is_stopped_and_goes_to_a_person(self, tmp_path: Path) -> None:
        """A run whose output stays silent past ANSWER_HANG is stopped, its process gone, q1 to a person."""
        from heartbeat.model import defaults

        rig = Rig(tmp_path, mode="hang")
        try:
            rig.ask()
            rig.daemon.tick(now=T0)
            deadline = time.monotonic() + 15
            while not rig.runs() and time.monotonic() < deadline:
                time.sleep(0.05)
            rig.daemon.tick(now=T0 + timedelta(seconds=1))
            late = T0 + timedelta(seconds=defaults.ANSWER_HANG + 5)
            rig.tick_until(lambda: bool(rig.events("build", "answer_run")), "the stop", start=late)
            [ended] = rig.events("build", "answer_run")
            assert ended.data["outcome"] == "stopped" and "silent" in ended.data["reason"]
            assert rig.question().to.value == "person"
        finally:
            rig.close()


class TestTheRailOfAnAnsweringSession:
    """The resumed session is bound to its done task: it may answer, it may not work."""

    def view(self) -> Any:
        from heartbeat.model.baton import Status
        from heartbeat.tasks.rail import RailView

        return RailView(task="build", status=Status.DONE, epoch=1, caller_epoch=1, workdir="/work")

    def test_its_heartbeat_answer_passes_the_rail(self) -> None:
        """``heartbeat answer critic q1 "..."`` from a session bound to the done ``build`` is allowed
        (fails before the rail knew ``answer``: refused as a call of a done task)."""
        from heartbeat.tasks.rail import ToolCall, decide

        call = ToolCall(tool="Bash", command='heartbeat answer critic q1 "Because of the flaky API."')
        assert decide(call, self.view()).allow

    def test_its_other_calls_are_refused_as_for_any_done_task(self) -> None:
        """A write, a shell command, or ``answer`` chained to another command: refused, not active."""
        from heartbeat.tasks.rail import Rule, ToolCall, decide

        for call in (ToolCall(tool="Write", paths=("/work/client.py",)), ToolCall(tool="Bash", command="make test"),
                     ToolCall(tool="Bash", command='heartbeat answer critic q1 "x" && rm -rf /work')):
            decision = decide(call, self.view())
            assert not decision.allow and decision.rule is Rule.NOT_ACTIVE, call


class TestTheUpstreamComesBack:
    """The session is the upstream's: its own agent comes first."""

    def test_a_reopened_upstream_stops_the_answering_run(self, tmp_path: Path) -> None:
        """build reopened (active again) while its session answers: the run is stopped, q1 goes to a
        person, and no two processes hold build's session (fails without the check: the run answers on
        beside build's next dispatch)."""
        from heartbeat.model.baton import Status

        rig = Rig(tmp_path, mode="hang")
        try:
            rig.ask()
            rig.daemon.tick(now=T0)
            deadline = time.monotonic() + 15
            while not rig.runs() and time.monotonic() < deadline:
                time.sleep(0.05)
            rig.mode_path.write_text("text")  # (build's own next run, dispatched below, ends at once)
            with rig.store.edit("build", actor="test") as ed:  # as a downstream's broken guarantee reopens it
                ed.baton.meta.status = Status.BLOCKED
                ed.baton.blocked_on = "reopened for the test"
            with rig.store.edit("build", actor="test") as ed:
                ed.baton.meta.status, ed.baton.blocked_on = Status.ACTIVE, ""
            rig.tick_until(lambda: bool(rig.events("build", "answer_run")), "the stop", start=T0 + timedelta(seconds=1))
            [ended] = rig.events("build", "answer_run")
            assert ended.data["outcome"] == "stopped" and "its own agent needs the session" in ended.data["reason"]
            assert rig.question().to.value == "person"
        finally:
            rig.close()
