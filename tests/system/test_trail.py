"""The trail (issue 25, items 5 and 7): what an agent did since its note, kept by its hooks.

Real files and the real ``heartbeat hook claude`` process for the hook; the trail's reader
against planted files (a symlink, a FIFO, a huge file, truncated lines); the brief's section;
and an in-process daemon ticked with an explicit ``now`` telling a hung model (no tool call in
flight) from a long tool call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import clean_env
from daemon_harness import in_process_config

from heartbeat.daemon import Daemon
from heartbeat.hotpath import trail
from heartbeat.model import policy as pol
from heartbeat.model.baton import Baton, Meta, Owner, OwnerKind, Status
from heartbeat.model.errors import UnsafePath
from heartbeat.reports.brief import render_brief
from heartbeat.store.files import FileStore
from heartbeat.system.layout import StateLayout
from heartbeat.tasks import verbs as tasks

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pre(call_id: str, command: str = "", *, tool: str = "Bash", **tool_input: str) -> dict[str, object]:
    args = {"command": command} if command else dict(tool_input)
    return {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": args, "tool_use_id": call_id,
            "cwd": "/w"}


def post(call_id: str, *, error: bool = False) -> dict[str, object]:
    return {"hook_event_name": "PostToolUse", "tool_name": "Bash", "tool_input": {}, "tool_use_id": call_id,
            "tool_response": {"is_error": error}}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    (tmp_path / "logs" / "t1").mkdir(parents=True)
    return tmp_path / "logs" / "t1" / "1.trail"


class TestTheRecord:
    """Start, end, and a kill in between."""

    def test_a_call_killed_in_flight_is_started_outcome_unknown(self, path: Path) -> None:
        """A PreToolUse with no PostToolUse is a call whose outcome is unknown; a returned one is ok or error."""
        trail.record_start(str(path), pre("a", "pay --invoice 3"), now=10)
        trail.record_end(str(path), post("a"), now=11)
        trail.record_start(str(path), pre("b", "curl -X POST https://api/send"), now=12)
        trail.record_end(str(path), post("b", error=True), now=13)
        trail.record_start(str(path), pre("c", tool="Write", file_path="/w/src/x.py", content="SECRET"), now=14)
        calls, cut = trail.read_calls(str(path))
        assert [(c.what, c.ok, c.finished) for c in calls] == [
            ("pay --invoice 3", True, True), ("curl -X POST https://api/send", False, True), ("src/x.py", None, False)]
        assert cut == 0 and "SECRET" not in path.read_text()  # never a file's contents
        lines = trail.summary_lines(calls)
        assert lines[2] == "- Write: `src/x.py` - **started, outcome unknown** (the run ended inside it)"

    def test_calls_before_the_note_and_the_note_itself_are_not_unnoted(self, path: Path) -> None:
        """Only calls started after the last note count; the agent's own heartbeat commands never."""
        trail.record_start(str(path), pre("a", "pay --invoice 1"), now=at(1).timestamp())
        trail.record_start(str(path), pre("b", 'heartbeat add t1 done "paid 1"'), now=at(2).timestamp())
        trail.record_start(str(path), pre("c", "pay --invoice 2"), now=at(4).timestamp())
        calls, _ = trail.read_calls(str(path))
        assert [c.what for c in trail.since(calls, at(3))] == ["pay --invoice 2"]
        assert [c.what for c in trail.since(calls, None)] == ["pay --invoice 1", "pay --invoice 2"]

    def test_unknown_outcomes_come_first_within_the_limit(self, path: Path) -> None:
        """Past the brief's limit the newest finished calls are listed, every unknown one kept, the rest counted."""
        trail.record_start(str(path), pre("x", "charge card"), now=1)
        for i in range(20):
            trail.record_start(str(path), pre(f"c{i}", f"ls {i}"), now=2 + i)
            trail.record_end(str(path), post(f"c{i}"), now=2.5 + i)
        calls, _ = trail.read_calls(str(path))
        lines = trail.summary_lines(calls, limit=4)
        assert "charge card" in lines[0] and "outcome unknown" in lines[0]
        assert [ln.split("`")[1] for ln in lines[1:4]] == ["ls 17", "ls 18", "ls 19"]
        assert lines[4] == "- _(17 earlier call(s) not listed)_"


    def test_credentials_in_a_command_are_not_kept(self, path: Path) -> None:
        """A bearer token or a password in a command line is masked before it is written."""
        trail.record_start(str(path), pre("a", 'curl -H "Authorization: Bearer sk-live-123" https://api/pay?token=abc&x=1'))
        trail.record_start(str(path), pre("b", "mysql --password=hunter2 -e 'select 1'"))
        text = path.read_text()
        assert "sk-live-123" not in text and "abc" not in text and "hunter2" not in text
        assert "Bearer ***" in text and "--password=***" in text


class TestHostileFiles:
    """Nothing planted where the trail lives can hang, crash or mislead a hook or the daemon."""

    def test_a_symlink_is_neither_followed_nor_written(self, path: Path, tmp_path: Path) -> None:
        """A trail that is a link to another file: the append is refused, the target untouched, the reader sees none."""
        target = tmp_path / "precious"
        target.write_text("keep\n")
        path.symlink_to(target)
        with pytest.raises(UnsafePath):
            trail.record_start(str(path), pre("a", "x"))
        assert target.read_text() == "keep\n"
        assert trail.read_calls(str(path)) == ([], 0) and trail.activity(str(path)) == (None, None)

    def test_a_fifo_never_blocks(self, path: Path) -> None:
        """A FIFO in the trail's place: the writer and the reader return at once (no reader on the other end)."""
        os.mkfifo(path)
        done = threading.Event()

        def both() -> None:
            with pytest.raises(UnsafePath):
                trail.record_start(str(path), pre("a", "x"))
            assert trail.read_calls(str(path)) == ([], 0)
            assert trail.activity(str(path)) == (None, None)
            done.set()

        t = threading.Thread(target=both, daemon=True)
        t.start()
        t.join(10)
        assert done.is_set()

    def test_a_huge_file_is_read_at_its_tail_and_cut_on_the_next_append(self, path: Path) -> None:
        """A 20 MB planted trail: the reader reads a bounded tail and counts what it skipped; the next
        append cuts the file back under the bound."""
        with open(path, "wb") as f:
            line = json.dumps({"ev": "start", "t": 1, "id": "old", "tool": "Bash", "what": "x" * 100}).encode() + b"\n"
            f.write(line * (20 * 1024 * 1024 // len(line)))
        calls, cut = trail.read_calls(str(path))
        assert cut >= 1 and len(calls) <= 64 * 1024 // len(line) + 1  # a bounded tail, whatever the size
        trail.record_start(str(path), pre("new", "pay"), now=5)
        assert path.stat().st_size <= 64 * 1024
        calls, cut = trail.read_calls(str(path))
        assert calls[-1].what == "pay" and cut > 0

    def test_planted_times_do_not_crash_a_reader(self, path: Path) -> None:
        """NaN, negative and far-future times in planted lines are skipped by the reader and the daemon's look."""
        path.write_text('{"ev": "start", "t": NaN, "id": "a"}\n{"ev": "start", "t": -5, "id": "b"}\n'
                        '{"ev": "start", "t": 1e300, "id": "c"}\n{"ev": "session", "t": 1e20}\n')
        assert trail.read_calls(str(path)) == ([], 0)
        assert trail.activity(str(path)) == (None, None)

    def test_truncated_and_foreign_lines_are_skipped(self, path: Path) -> None:
        """A line cut short by a kill, garbage, a JSON list, an overlong line: skipped, the good ones read."""
        good = json.dumps({"ev": "start", "t": 3, "id": "g", "tool": "Bash", "what": "pay"})
        path.write_text("\n".join(["not json", "[1, 2]", '{"ev": "start", "t": "x", "id": "bad"}',
                                   json.dumps({"ev": "start", "t": 1, "id": "long", "what": "y" * 10000}),
                                   good, '{"ev": "end", "t": 4, "id": "g", "o']))
        calls, _ = trail.read_calls(str(path))
        assert [(c.key, c.finished) for c in calls] == [("g", False)]

    def test_a_bound_hook_never_writes_through_a_linked_log_dir(self, tmp_path: Path) -> None:
        """logs/<id> planted as a link to elsewhere: the hook writes nothing there (it keeps no trail)."""
        (tmp_path / "logs").mkdir()
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (tmp_path / "logs" / "t1").symlink_to(elsewhere)
        env = {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "1", "HEARTBEAT_STATE_DIR": str(tmp_path)}
        assert trail.hot_hook(pre("a", "x"), env) is False
        assert list(elsewhere.iterdir()) == []

    def test_the_layout_and_the_hooks_spell_the_same_path(self, tmp_path: Path) -> None:
        """The hooks spell the trail's path themselves (no layout import on the hot path): the two agree."""
        assert StateLayout(str(tmp_path)).trail("t1", 7) == trail.trail_path(str(tmp_path), "t1", 7)


class TestTheHook:
    """`heartbeat hook claude`, run for real, keeps the trail of an agent the daemon launched."""

    def test_pre_and_post_tool_use_of_a_launched_agent(self, tmp_path: Path) -> None:
        """The hook process appends start and end to logs/<id>/<epoch>.trail, prints nothing, exits 0;
        a planted FIFO in its place gets one stderr line and exit 0, never a hang."""
        state = tmp_path / "state"
        (state / "logs" / "t1").mkdir(parents=True)
        env = {**clean_env(), "HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "3", "HEARTBEAT_STATE_DIR": str(state)}

        def hook(event: dict[str, object]) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "heartbeat", "hook", "claude"], input=json.dumps(event),
                                  env=env, capture_output=True, text=True, timeout=30)

        for event in (pre("a", "pay --invoice 9"), post("a")):
            r = hook(event)
            assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
        calls, _ = trail.read_calls(str(state / "logs" / "t1" / "3.trail"))
        assert [(c.what, c.ok) for c in calls] == [("pay --invoice 9", True)]
        os.mkfifo(state / "logs" / "t1" / "4.trail")
        env["HEARTBEAT_EPOCH"] = "4"
        r = hook(pre("b", "x"))
        assert r.returncode == 0 and "FIFO" in r.stderr and len(r.stderr.splitlines()) == 1


class TestTheBrief:
    """The successor's brief carries what the last run did since its note, never cut."""

    def test_section_survives_a_tiny_budget(self) -> None:
        """Even at a budget that cuts the context, the unnoted calls stay (they are essentials)."""
        baton = Baton(meta=Meta(id="t1"), task="Bill", intent="Paid once", step="Pay", done=["x"] * 40)
        lines = ["- Bash: `pay --invoice 2` - ok"]
        text = render_brief(baton, budget=50, unnoted=lines).text
        assert "## Since the last note, the last run did" in text and "`pay --invoice 2` - ok" in text

    def test_show_and_brief_print_it(self, tmp_path: Path) -> None:
        """`heartbeat show --json` has `unnoted`, `heartbeat brief` the section, from the task's trail."""
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        store = FileStore(str(state))
        tasks.new_task(store, "t1", task="Bill", intent="Paid once", step="Pay")
        store.close()
        (state / "logs" / "t1").mkdir(parents=True)
        trail.record_start(str(state / "logs" / "t1" / "0.trail"), pre("a", "pay --invoice 2"))
        env = clean_env()
        base = [sys.executable, "-m", "heartbeat", "--state-dir", str(state)]
        shown = subprocess.run([*base, "show", "t1", "--json"], env=env, capture_output=True, text=True, timeout=30)
        assert json.loads(shown.stdout)["unnoted"]["calls"][0]["what"] == "pay --invoice 2", shown.stderr
        brief = subprocess.run([*base, "brief", "t1"], env=env, capture_output=True, text=True, timeout=30)
        assert "`pay --invoice 2` - **started, outcome unknown**" in brief.stdout, brief.stderr


class TestAnotherHost:
    """On a shared store the trail file stays on the host the agent ran on; the ledger keeps its part."""

    def test_a_reader_without_the_file_is_briefed_from_the_exited_event(self, tmp_path: Path) -> None:
        """No trail file here (another host's state dir): the brief carries what the run's `exited` event
        kept, the unknown outcome marked (the same section as from the file)."""
        from heartbeat.model.ledger import Event
        from heartbeat.reports.brief import unnoted_for

        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        store = FileStore(str(state))
        baton = tasks.new_task(store, "t1", task="Bill", intent="Paid once", step="Pay")
        kept = {"calls": 3, "unknown": 1, "last": [
            {"tool": "Bash", "what": "pay --invoice 2", "started": "2030-01-01T00:00:00+00:00", "outcome": "unknown"},
            {"tool": "Write", "what": "steps/02.txt", "started": "2030-01-01T00:00:01+00:00", "outcome": "ok"}]}
        store.record([Event(task="t1", kind="exited", ts=at(10) + timedelta(days=3650), epoch=0, actor="daemon",
                            data={"code": None, "signal": 9, "unnoted": kept})])
        found = unnoted_for(str(tmp_path / "elsewhere"), store, store.load("t1"))
        store.close()
        assert found is not None and found.cut == 1
        lines = found.lines()
        assert "`pay --invoice 2` - **started, outcome unknown**" in lines[0] and "`steps/02.txt` - ok" in lines[1]
        assert baton.id == "t1"


class TestHungModel:
    """With a trail, a silence with no tool call in flight is a hung model (hang_after), not stall_after."""

    @pytest.mark.parametrize(("tool_running", "silent", "action"), [
        (False, 100.0, pol.Action.NOTHING),
        (False, 121.0, pol.Action.STOP_THEN_DISPATCH),
        (True, 500.0, pol.Action.NOTHING),  # inside a long tool call: working
        (True, 601.0, pol.Action.STOP_THEN_DISPATCH),
        (None, 500.0, pol.Action.NOTHING),  # no trail (no hooks): stall_after alone, as before
    ])
    def test_the_decision(self, tool_running: bool | None, silent: float, action: pol.Action) -> None:
        """The table: hang_after 120 s with no call in flight, stall_after 600 s inside one or without a trail."""
        meta = Meta(id="t1", status=Status.ACTIVE, epoch=1, dispatched_at=at(0), dispatches=1,
                    owner=Owner(how=OwnerKind.DISPATCH, pid=12345, started_at=at(0)))
        obs = pol.Observation(alive=True, tool_running=tool_running, silent_for=silent, running_for=silent,
                              unchanged_for=0.0)
        d = pol.decide(Baton(meta=meta, task="x", step="s"), obs, at(silent), pol.Policy(hang_after=120, stall_after=600))
        assert d.action == action, d
        if action is pol.Action.STOP_THEN_DISPATCH:
            assert d.stalled_why == (pol.StallReason.MODEL_HUNG if tool_running is False else pol.StallReason.NEVER_WROTE)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Daemon]:
    state, config = in_process_config(tmp_path, daemon='stall_after = "10m"\nhang_after = "2m"')
    d = Daemon(config, store=FileStore(str(state)))
    yield d
    d.shutdown(timeout=5)


class TestHungModelInTheDaemon:
    """An in-process daemon, ticked with an explicit ``now``, over a trail the test writes as the hooks do."""

    def dispatch(self, d: Daemon) -> str:
        tasks.new_task(d.store, "t1", task="x", intent="y", step="s")
        d.tick(now=at(0))
        d.tick(now=at(1))  # the daemon's first look at the running agent: its ages count from here
        baton = d.store.load("t1")
        assert baton.meta.owner is not None
        path = d.shared.layout.trail("t1", baton.meta.epoch)
        trail.record_session(path, "startup", now=at(1).timestamp())
        return path

    def stopped(self, d: Daemon) -> list[str]:
        return [str(e.data.get("why")) for e in d.store.ledger.events("t1", kinds=["stopped"])]

    def test_a_model_that_answers_nothing_is_stopped_after_hang_after(self, loop: Daemon) -> None:
        """The last call returned at 10 s; nothing since: not stopped at 120 s, stopped as model_hung at
        131 s, ten minutes before stall_after (fails on 4c852cf: no hang_after, nothing stopped until 10 min)."""
        path = self.dispatch(loop)
        trail.record_start(path, pre("a", "ls"), now=at(9).timestamp())
        trail.record_end(path, post("a"), now=at(10).timestamp())
        loop.tick(now=at(120))
        assert self.stopped(loop) == []
        loop.tick(now=at(131))
        assert self.stopped(loop) == ["model_hung"]

    def test_an_agent_inside_a_long_tool_call_is_working(self, loop: Daemon) -> None:
        """A call started at 10 s and still running: not stopped at 9 minutes; at stall_after it is, as silent."""
        path = self.dispatch(loop)
        trail.record_start(path, pre("a", "make test"), now=at(10).timestamp())
        for minute in range(1, 10):
            loop.tick(now=at(60 * minute))
        assert self.stopped(loop) == []
        loop.tick(now=at(10 + 601))
        assert self.stopped(loop) == ["hung"]

    def test_without_a_trail_nothing_changes(self, loop: Daemon, tmp_path: Path) -> None:
        """No trail (the hooks are not wired in): a silent agent gets stall_after, as before."""
        tasks.new_task(loop.store, "t1", task="x", intent="y", step="s")
        loop.tick(now=at(0))
        loop.tick(now=at(300))
        assert self.stopped(loop) == []
