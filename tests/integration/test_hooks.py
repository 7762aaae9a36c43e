"""The compaction seam: `heartbeat hook claude` at each hook event, `heartbeat hooks install/uninstall`,
and the real Claude Code CLI firing the installed hooks.

The hook is run for real (``python -m heartbeat hook claude`` with the event on stdin). The
scripted session in ``tests/support/data/claude_session_events.json`` holds events recorded from the
real CLI where it sends them without a login, and built from the documented schema where it
does not (each event says which).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Result, clean_env

from heartbeat.config.shape import HooksConfig
from heartbeat.integrations.claude import allow_rules, install_claude, uninstall_claude
from heartbeat.integrations.hooks import handle_event
from heartbeat.model.timeparse import utcnow
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


SESSION = json.loads((ROOT / "tests" / "support" / "data" / "claude_session_events.json").read_text())["events"]


def event(name: str, cwd: Path | str, **fields: Any) -> dict[str, Any]:
    return {"session_id": "sess-1", "transcript_path": "/nonexistent/t.jsonl", "cwd": str(cwd),
            "hook_event_name": name, **fields}


def hook(hb: Callable[..., Result], ev: dict[str, Any] | str, *args: str, env: dict[str, str] | None = None) -> Result:
    text = ev if isinstance(ev, str) else json.dumps(ev)
    return hb("hook", "claude", *args, input=text, env=env)


def seam_events(state_dir: Path, task: str = "t1") -> list[tuple[str, dict[str, Any]]]:
    store = FileStore(str(state_dir))
    try:
        return [(e.kind, e.data) for e in store.ledger.events(task)
                if e.kind in ("session_started", "compacting", "stop_blocked", "stop_allowed", "session_ended")]
    finally:
        store.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def task(hb: Callable[..., Result], work: Path) -> str:
    r = hb("new", "t1", "--task", "Fix the fallback", "--step", "Read the code", "--intent",
           "Make the fallback path survive a restart", "--workdir", str(work), "--constraint", "Do not touch prod")
    assert r.code == 0, r.err
    return "t1"


class TestSessionStart:
    """SessionStart hands the agent its brief and records the seam, whatever the source."""

    @pytest.mark.parametrize("source", ["startup", "resume", "clear", "compact"])
    def test_prints_the_brief_as_additional_context(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                                    task: str, source: str) -> None:
        """The output is the documented hookSpecificOutput JSON whose additionalContext carries the brief."""
        r = hook(hb, event("SessionStart", work, source=source))
        assert r.code == 0 and r.err == ""
        out = json.loads(r.out)["hookSpecificOutput"]
        assert out["hookEventName"] == "SessionStart"
        assert "Make the fallback path survive a restart" in out["additionalContext"]
        assert "Do not touch prod" in out["additionalContext"]
        assert seam_events(state_dir) == [("session_started", {"session_id": "sess-1", "source": source})]

    def test_task_from_the_environment_wins(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                            task: str, tmp_path: Path) -> None:
        """$HEARTBEAT_TASK names the task even when the event's cwd is elsewhere."""
        r = hook(hb, event("SessionStart", tmp_path, source="startup"), env={"HEARTBEAT_TASK": "t1"})
        assert r.code == 0 and "Fix the fallback" in r.out
        r = hook(hb, event("SessionStart", tmp_path, source="startup"), "--task", "t1")
        assert r.code == 0 and "Fix the fallback" in r.out

    def test_no_task_or_two_tasks_for_the_cwd_does_nothing(self, hb: Callable[..., Result], state_dir: Path,
                                                           work: Path, task: str, tmp_path: Path) -> None:
        """A cwd no task works in, or two active tasks share, is not guessed: no output, nothing recorded."""
        r = hook(hb, event("SessionStart", tmp_path, source="startup"))
        assert (r.code, r.out, r.err) == (0, "", "")
        assert hb("new", "t2", "--task", "Other", "--step", "s", "--workdir", str(work)).code == 0
        r = hook(hb, event("SessionStart", work, source="startup"))
        assert (r.code, r.out, r.err) == (0, "", "")
        assert seam_events(state_dir) == []

    def test_a_finished_task_in_the_same_workdir_does_not_make_it_ambiguous(
            self, hb: Callable[..., Result], work: Path, task: str) -> None:
        """Of two tasks in one workdir, the one still open is the session's."""
        assert hb("new", "old", "--task", "Old", "--step", "s", "--workdir", str(work)).code == 0
        assert hb("done", "old").code == 0
        r = hook(hb, event("SessionStart", work, source="startup"))
        assert "Fix the fallback" in r.out


class TestNeverBreaksTheAgent:
    """Whatever comes in, the hook exits 0 with at most one line on stderr."""

    @pytest.mark.parametrize("stdin", ["not json", "[1, 2]", "", "[" * 100000])
    def test_garbage_on_stdin(self, hb: Callable[..., Result], state_dir: Path, task: str, stdin: str) -> None:
        """Not JSON, not an object, empty, nested too deep: one stderr line, exit 0, nothing recorded."""
        r = hook(hb, stdin)
        assert r.code == 0 and r.out == ""
        assert len(r.err.strip().splitlines()) == 1 and r.err.startswith("heartbeat hook: ")
        assert seam_events(state_dir) == []

    def test_an_oversized_event(self, hb: Callable[..., Result], work: Path, task: str) -> None:
        """An event over the input bound is refused, not read whole."""
        r = hook(hb, json.dumps(event("SessionStart", work, source="x" * (2 * 1024 * 1024))))
        assert r.code == 0 and r.out == "" and "larger than" in r.err

    def test_an_unknown_task_in_the_environment(self, hb: Callable[..., Result], work: Path, task: str) -> None:
        """$HEARTBEAT_TASK naming no baton: one line, exit 0 (never 2, which would block a Stop)."""
        r = hook(hb, event("Stop", work, stop_hook_active=False), env={"HEARTBEAT_TASK": "nope"})
        assert r.code == 0 and r.out == "" and "nope" in r.err and len(r.err.splitlines()) == 1

    def test_no_state_dir_is_left_alone(self, tmp_path: Path, work: Path) -> None:
        """Without a state dir the hook does nothing but say so (one line), and creates none."""
        missing = tmp_path / "no-state"
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "--state-dir", str(missing), "hook", "claude"],
                              input=json.dumps(event("SessionStart", work, source="startup")), text=True,
                              capture_output=True, env=clean_env(), timeout=60)
        assert (proc.returncode, proc.stdout) == (0, "")
        assert proc.stderr == f"heartbeat hook: no state dir at {missing}: nothing to brief (a hook never creates one)\n"
        assert not missing.exists()

    def test_a_bad_option_still_exits_0(self, hb: Callable[..., Result], work: Path, task: str) -> None:
        """Even a malformed command line in settings.json cannot make the hook exit 2."""
        r = hook(hb, event("Stop", work), "--bogus")
        assert r.code == 0 and "unexpected argument" in r.err

    def test_the_hook_loads_nothing_heavy(self, state_dir: Path, work: Path, task: str) -> None:
        """`hook claude` imports no argparse, scheduler, watcher, structlog, psutil or MCP SDK."""
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "heartbeat", "hook", "claude"],
                              input=json.dumps(event("Stop", work)), text=True, capture_output=True,
                              env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)), timeout=60)
        assert proc.returncode == 0
        modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                   if line.startswith("import time:")}
        assert "heartbeat.integrations.hooks" in modules  # the measurement works
        roots = {name.split(".")[0] for name in modules}
        heavy = {"argparse", "apscheduler", "watchdog", "structlog", "psutil", "mcp"}
        assert not roots & heavy, sorted(roots & heavy)


class TestPreCompactAndSessionEnd:
    """PreCompact records the compaction and how old the note was; SessionEnd records the end."""

    def test_compacting_with_a_fresh_note(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                          task: str) -> None:
        """A note written just now is fresh at the compaction."""
        assert hb("set", "t1", "step=Patch the fallback").code == 0
        r = hook(hb, event("PreCompact", work, trigger="auto", custom_instructions=""))
        assert (r.code, r.out) == (0, "")
        [(kind, data)] = seam_events(state_dir)
        assert kind == "compacting" and data["trigger"] == "auto" and data["fresh"] is True
        assert 0 <= data["note_age_s"] < 60

    def test_compacting_with_a_stale_note(self, file_store: FileStore, work: Path) -> None:
        """A note older than hooks.fresh_within is stale at the compaction; its age is recorded."""
        tasks.new_task(file_store, "t1", task="T", step="s", workdir=str(work))
        later = utcnow() + timedelta(minutes=30)
        handle_event(event("PreCompact", work, trigger="manual"), file_store, env={},
                     hooks=HooksConfig(fresh_within=300), now=later)
        [e] = [e for e in file_store.ledger.events("t1") if e.kind == "compacting"]
        assert e.data["fresh"] is False and e.data["trigger"] == "manual"
        assert 1790 <= e.data["note_age_s"] <= 1810

    def test_session_end_records_the_reason(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                            task: str) -> None:
        """SessionEnd is recorded with its reason and prints nothing."""
        r = hook(hb, event("SessionEnd", work, reason="prompt_input_exit"))
        assert (r.code, r.out) == (0, "")
        assert seam_events(state_dir) == [("session_ended", {"session_id": "sess-1", "reason": "prompt_input_exit"})]


BOUND = {"HEARTBEAT_TASK": "t1"}
"""The environment of a session bound to task t1 (the daemon sets it for its agents)."""


class TestStop:
    """Stop blocks a bound session at most once per session when the note was not written since it started."""

    def start(self, hb: Callable[..., Result], work: Path, env: dict[str, str] | None = None) -> None:
        assert hook(hb, event("SessionStart", work, source="startup"), env=env).code == 0

    def stop(self, hb: Callable[..., Result], work: Path, env: dict[str, str] | None = BOUND, **fields: Any) -> str:
        r = hook(hb, event("Stop", work, stop_hook_active=False, **fields), env=env)
        assert r.code == 0 and r.err == "", r.err
        return r.out

    def test_blocks_once_naming_the_commands(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                             task: str) -> None:
        """No note since the start: a block whose reason names `heartbeat set`/`add` for this task."""
        self.start(hb, work, BOUND)
        out = json.loads(self.stop(hb, work, last_assistant_message="done"))
        assert out["decision"] == "block"
        assert "heartbeat set t1 step=" in out["reason"] and "heartbeat add t1 done" in out["reason"]

    def test_never_when_stop_hook_active(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                         task: str) -> None:
        """The stop that follows a block (stop_hook_active) is let through: no loop."""
        self.start(hb, work, BOUND)
        assert json.loads(self.stop(hb, work))["decision"] == "block"
        r = hook(hb, event("Stop", work, stop_hook_active=True), env=BOUND)
        assert (r.code, r.out) == (0, "")

    def test_at_most_once_per_session(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                      task: str) -> None:
        """Turn after turn without a note (a client that never sets stop_hook_active), one session is
        blocked once, not once per turn; another session gets its own one block."""
        self.start(hb, work, BOUND)
        assert [bool(self.stop(hb, work)) for _ in range(4)] == [True, False, False, False]
        kinds = [k for k, _ in seam_events(state_dir)]
        assert kinds == ["session_started", "stop_blocked", "stop_allowed", "stop_allowed", "stop_allowed"]
        assert hook(hb, event("SessionStart", work, source="startup", session_id="sess-2"), env=BOUND).code == 0
        assert [bool(self.stop(hb, work, session_id="sess-2")) for _ in range(2)] == [True, False]

    def test_max_stop_blocks_from_the_config(self, file_store: FileStore, work: Path) -> None:
        """hooks.max_stop_blocks = 2 allows two blocks in a session; 0 never blocks."""
        tasks.new_task(file_store, "t1", task="T", step="s", workdir=str(work))
        for limit, expected in ((2, [True, True, False]), (0, [False, False, False])):
            handle_event(event("SessionStart", work, source="startup", session_id=f"s{limit}"), file_store, env=BOUND)
            got = [bool(handle_event(event("Stop", work, stop_hook_active=False, session_id=f"s{limit}"), file_store,
                                     env=BOUND, hooks=HooksConfig(max_stop_blocks=limit)).stdout) for _ in range(3)]
            assert got == expected

    def test_a_written_note_lets_it_stop(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                         task: str) -> None:
        """After `heartbeat set` the stop goes through; a later turn without a write is the session's one block."""
        self.start(hb, work, BOUND)
        assert hb("set", "t1", "step=Patch the fallback").code == 0
        assert self.stop(hb, work) == ""
        assert [bool(self.stop(hb, work)) for _ in range(3)] == [True, False, False]

    def test_a_touch_is_not_a_note(self, hb: Callable[..., Result], work: Path, task: str) -> None:
        """`touch` says alive, not where things stand: it does not satisfy the Stop hook."""
        self.start(hb, work, BOUND)
        assert hb("touch", "t1").code == 0
        assert "decision" in self.stop(hb, work)

    @pytest.mark.parametrize("verb", [("done", "t1"), ("block", "t1", "--on", "a human")])
    def test_not_when_the_task_is_no_longer_active(self, hb: Callable[..., Result], work: Path, task: str,
                                                   verb: tuple[str, ...]) -> None:
        """A done or blocked task is not held up at its stop."""
        self.start(hb, work, BOUND)
        assert hb(*verb).code == 0
        assert self.stop(hb, work) == ""

    def test_not_for_a_superseded_agent(self, file_store: FileStore, work: Path) -> None:
        """An agent whose epoch was superseded is not asked to write a note it may no longer write."""
        tasks.new_task(file_store, "t1", task="T", step="s", workdir=str(work))
        with file_store.edit("t1") as ed:
            ed.baton.meta.epoch = 3
        stale = {**BOUND, "HEARTBEAT_EPOCH": "2"}
        handle_event(event("SessionStart", work, source="startup"), file_store, env=stale)
        assert handle_event(event("Stop", work, stop_hook_active=False), file_store, env=stale).stdout == ""
        current = {**BOUND, "HEARTBEAT_EPOCH": "3"}
        assert handle_event(event("Stop", work, stop_hook_active=False), file_store, env=current).stdout


class TestBinding:
    """Only a session bound to the task is held up at its stop; a person's session in the workdir never is."""

    def test_a_persons_session_in_the_workdir_is_never_blocked(self, hb: Callable[..., Result], state_dir: Path,
                                                              work: Path, task: str) -> None:
        """Found by its cwd alone (no $HEARTBEAT_TASK), a session gets the brief but no Stop block, ever."""
        r = hook(hb, event("SessionStart", work, source="startup"))
        assert "Fix the fallback" in r.out
        for _ in range(3):
            r = hook(hb, event("Stop", work, stop_hook_active=False))
            assert (r.code, r.out, r.err) == (0, "", "")
        assert [k for k, _ in seam_events(state_dir)] == ["session_started"]

    def test_a_session_bound_to_another_task_is_not_blocked_for_this_one(
            self, hb: Callable[..., Result], state_dir: Path, work: Path, task: str) -> None:
        """--task in the hook command names the task, but only the session's environment binds it."""
        r = hook(hb, event("SessionStart", work, source="startup"), "--task", "t1")
        assert "Fix the fallback" in r.out
        assert hook(hb, event("Stop", work, stop_hook_active=False), "--task", "t1").out == ""

    def test_explicit_binding_by_the_environment(self, hb: Callable[..., Result], state_dir: Path, tmp_path: Path,
                                                 task: str) -> None:
        """A person binds a session by starting it with HEARTBEAT_TASK=t1: blocked once, wherever its cwd."""
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        assert hook(hb, event("SessionStart", elsewhere, source="startup"), env=BOUND).code == 0
        assert json.loads(hook(hb, event("Stop", elsewhere, stop_hook_active=False), env=BOUND).out)["decision"] \
            == "block"


class TestSubdirectories:
    """A session started below a task's workdir belongs to that task."""

    def test_a_subdirectory_is_matched(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                       task: str) -> None:
        """cwd = workdir/src/deep: the brief is given and the seam recorded."""
        deep = work / "src" / "deep"
        deep.mkdir(parents=True)
        r = hook(hb, event("SessionStart", deep, source="startup"))
        assert "Fix the fallback" in r.out
        assert seam_events(state_dir) == [("session_started", {"session_id": "sess-1", "source": "startup"})]

    def test_the_deepest_open_workdir_wins(self, hb: Callable[..., Result], work: Path, task: str) -> None:
        """A task in workdir/sub owns sessions there; t1 (in workdir) keeps the rest; a sibling path is no match."""
        sub = work / "sub"
        sub.mkdir()
        assert hb("new", "t2", "--task", "Inner", "--step", "s", "--workdir", str(sub)).code == 0
        assert "Inner" in hook(hb, event("SessionStart", sub / ".", source="startup")).out
        assert "Fix the fallback" in hook(hb, event("SessionStart", work, source="startup")).out
        sibling = work.parent / (work.name + "-other")
        sibling.mkdir()
        assert hook(hb, event("SessionStart", sibling, source="startup")).out == ""
        assert hb("done", "t2").code == 0
        assert "Fix the fallback" in hook(hb, event("SessionStart", sub, source="startup")).out


class TestCommandsCarryTheInstallOptions:
    """Every command the hook prints carries the --state-dir/--config it was installed with."""

    def test_state_dir_and_config(self, tmp_path: Path, work: Path) -> None:
        """Installed with --config (and --state-dir): the brief's and the Stop reason's commands carry both."""
        state = tmp_path / "st"
        config = tmp_path / "hb.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
        env = clean_env()
        run = [sys.executable, "-m", "heartbeat", "--config", str(config)]
        assert subprocess.run([*run, "new", "t1", "--task", "T", "--step", "s", "--workdir", str(work)],
                              env=env, capture_output=True, timeout=60).returncode == 0
        hook_argv = [*run, "--state-dir", str(state), "hook", "claude"]
        outs = []
        for ev in (event("SessionStart", work, source="startup"), event("Stop", work, stop_hook_active=False)):
            proc = subprocess.run(hook_argv, input=json.dumps(ev), text=True, capture_output=True,
                                  env={**env, "HEARTBEAT_TASK": "t1"}, timeout=60)
            assert proc.returncode == 0 and proc.stderr == "", proc.stderr
            outs.append(proc.stdout)
        context = json.loads(outs[0])["hookSpecificOutput"]["additionalContext"]
        reason = json.loads(outs[1])["reason"]
        prefix = f"`heartbeat --state-dir {state} --config {config} "
        for text in (context, reason):
            assert prefix + "set t1 " in text
            assert "`heartbeat set" not in text and "`heartbeat add" not in text
        assert prefix + "add t1 done" in context


class TestScriptedCompaction:
    """A whole session with a compaction, its hook events fed in order, is what `report` counts."""

    def test_report_counts_it(self, hb: Callable[..., Result], state_dir: Path, work: Path, task: str) -> None:
        """Two session starts (startup, compact), one compaction with a fresh note, one Stop block (once per
        session, the compaction does not start a new one), one end."""
        outputs = []
        for step in SESSION:
            ev = dict(step["event"], cwd=str(work))
            if ev["hook_event_name"] == "PreCompact":  # the agent obeyed the block before the compaction
                assert hb("set", "t1", "step=Patch the fallback", "next_step=Run the tests").code == 0
            r = hook(hb, ev, env=BOUND)
            assert r.code == 0 and r.err == "", r.err
            outputs.append((ev["hook_event_name"], r.out))
        assert [bool(out) for _, out in outputs] == [True, True, False, False, True, False, False]
        r = hb("report", "--json")
        assert r.code == 0, r.err
        [t] = json.loads(r.out)["tasks"]
        seams = t["seams"]
        assert seams["session_starts"] == {"startup": 1, "compact": 1}
        assert (seams["compactions"], seams["compactions_fresh"], seams["compactions_stale"]) == (1, 1, 0)
        assert (seams["stop_blocks"], seams["sessions_ended"]) == (1, 1)
        text = hb("report").out
        assert "t1: sessions 2 (compact 1, startup 1); compactions 1 (note fresh 1, stale 0); stop blocks 1" in text


def _settings(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


FOREIGN = {
    "permissions": {"allow": ["Bash(npm test)"]},
    "env": {"FOO": "1"},
    "hooks": {
        "SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "echo mine"}]}],
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "/usr/local/bin/guard"}]}],
    },
}


class TestInstall:
    """`hooks install/uninstall claude|codex` merge idempotently and remove exactly what they added."""

    def test_install_keeps_foreign_keys_and_is_idempotent(self, hb: Callable[..., Result], work: Path,
                                                          state_dir: Path) -> None:
        """Every key and hook already there stays; a second install changes nothing; uninstall restores it."""
        settings = work / ".claude" / "settings.json"
        settings.parent.mkdir()
        settings.write_text(json.dumps(FOREIGN, indent=4))
        r = hb("hooks", "install", "claude", "--dir", str(work))
        assert r.code == 0 and str(settings) in r.out, r.err
        doc = _settings(settings)
        assert doc["permissions"] == FOREIGN["permissions"] and doc["env"] == FOREIGN["env"]
        assert _settings(work / ".claude" / "settings.local.json") == {
            "permissions": {"allow": allow_rules(state_dir=str(state_dir))}}  # ($HEARTBEAT_STATE_DIR, baked in)
        foreign_pre = FOREIGN["hooks"]["PreToolUse"]
        assert doc["hooks"]["PreToolUse"][:len(foreign_pre)] == foreign_pre  # the rail goes after a person's own
        assert doc["hooks"]["SessionStart"][0] == FOREIGN["hooks"]["SessionStart"][0]
        for name in ("SessionStart", "PreCompact", "Stop", "SessionEnd", "PreToolUse", "PostToolUse"):
            ours = [h for g in doc["hooks"][name] for h in g["hooks"] if "hook claude" in h["command"]]
            assert len(ours) == 1 and ours[0]["type"] == "command" and ours[0]["timeout"] == 30
        before = settings.read_bytes()
        r = hb("hooks", "install", "claude", "--dir", str(work))
        assert r.code == 0 and "already installed" in r.out
        assert settings.read_bytes() == before
        assert hb("hooks", "uninstall", "claude", "--dir", str(work)).code == 0
        assert _settings(settings) == FOREIGN and not (work / ".claude" / "settings.local.json").exists()  # install made it
        r = hb("hooks", "uninstall", "claude", "--dir", str(work))
        assert r.code == 0 and "not installed" in r.out

    def test_install_allows_exactly_heartbeats_agent_commands(self, work: Path) -> None:
        """The rules name each agent command, as the brief writes it and with the install's global options,
        on the task when one is given; uninstall takes them out and keeps a person's own rules."""
        path, _ = install_claude(str(work), state_dir=str(work / "st"), task="t1")
        assert path.endswith(".claude/settings.local.json")  # claude -p takes no allow rule from settings.json
        allow = json.loads(Path(path).read_text())["permissions"]["allow"]
        assert "Bash(heartbeat set t1:*)" in allow and "Bash(heartbeat done t1:*)" in allow \
            and "Bash(heartbeat ask t1:*)" in allow
        assert f"Bash(heartbeat --state-dir {work / 'st'} set t1:*)" in allow and "mcp__heartbeat" in allow
        assert len(allow) == 2 * 10 + 1 and not any("run" in r or "new" in r or "gc" in r for r in allow)
        doc = json.loads(Path(path).read_text())
        doc["permissions"]["allow"].append("Bash(heartbeat status)")
        Path(path).write_text(json.dumps(doc))
        uninstall_claude(str(work))
        assert json.loads(Path(path).read_text()) == {"permissions": {"allow": ["Bash(heartbeat status)"]}}

    def test_install_into_nothing_and_back(self, work: Path) -> None:
        """No settings file: install creates one; uninstall removes the files it created, now empty."""
        local, path = install_claude(str(work), state_dir=str(work / "st"))
        assert json.loads(Path(local).read_text())["permissions"]["allow"] == allow_rules(state_dir=str(work / "st"))
        doc = json.loads(Path(path).read_text())
        assert set(doc["hooks"]) == {"SessionStart", "PreCompact", "Stop", "SessionEnd", "PreToolUse", "PostToolUse"}
        assert "--state-dir" in doc["hooks"]["Stop"][0]["hooks"][0]["command"]
        assert uninstall_claude(str(work)) == [local, path]
        assert not os.path.exists(path) and not os.path.exists(local)

    def test_user_settings(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """--user writes ~/.claude/settings.json."""
        home = tmp_path / "home"
        home.mkdir()
        r = hb("hooks", "install", "claude", "--user", env={"HOME": str(home)})
        assert r.code == 0, r.err
        assert "Stop" in _settings(home / ".claude" / "settings.json")["hooks"]

    @pytest.mark.parametrize("content", ["{not json", "[]", '{"hooks": "yes"}', '{"hooks": {"Stop": {}}}',
                                         '{"hooks": {"Stop": [1]}}', "\xff\xfe", '{"big": 1e400}',
                                         '{"n": NaN}', '{"n": [-Infinity]}'])
    def test_garbage_settings_are_left_untouched(self, hb: Callable[..., Result], work: Path, content: str) -> None:
        """A settings file heartbeat cannot merge into: one line, exit 2, the bytes unchanged."""
        settings = work / ".claude" / "settings.json"
        settings.parent.mkdir()
        settings.write_bytes(content.encode("latin-1"))
        for action in ("install", "uninstall"):
            r = hb("hooks", action, "claude", "--dir", str(work))
            assert r.code == 2 and len(r.err.splitlines()) == 1 and "left untouched" in r.err, r.err
            assert settings.read_bytes() == content.encode("latin-1")

    def test_a_number_json_cannot_hold_is_refused_not_rewritten(self, hb: Callable[..., Result], work: Path) -> None:
        """1e400 would be read as infinity and written back as `Infinity` (not JSON; Claude Code could no
        longer read its settings): refused with one line, the file untouched."""
        settings = work / ".claude" / "settings.json"
        settings.parent.mkdir()
        settings.write_text('{"model": "sonnet", "feedbackSurveyRate": 1e400}\n')
        r = hb("hooks", "install", "claude", "--dir", str(work))
        assert r.code == 2 and "1e400" in r.err and len(r.err.splitlines()) == 1, r.err
        assert settings.read_text() == '{"model": "sonnet", "feedbackSurveyRate": 1e400}\n'

    def test_a_persons_hook_that_mentions_heartbeat_is_kept(self, hb: Callable[..., Result], work: Path) -> None:
        """Only what heartbeat wrote (marked) is heartbeat's: a person's notify hook naming it survives
        install, re-install and uninstall."""
        settings = work / ".claude" / "settings.json"
        settings.parent.mkdir()
        mine = {"type": "command", "command": "notify-send 'heartbeat hook claude finished'"}
        also = {"type": "command", "command": "heartbeat hook claude --task t1 | tee /tmp/log"}
        doc = {"hooks": {"Stop": [{"hooks": [mine, also]}]}}
        settings.write_text(json.dumps(doc))
        for action in ("install", "install", "uninstall"):
            assert hb("hooks", action, "claude", "--dir", str(work)).code == 0
            stop = _settings(settings)["hooks"]["Stop"]
            assert stop[0] == {"hooks": [mine, also]}, (action, stop)
        assert _settings(settings) == doc

    def test_a_second_install_for_another_state_dir_is_kept(self, work: Path, tmp_path: Path) -> None:
        """Two heartbeat installs (two state dirs) share a settings file: each install replaces only its own
        hook; uninstall with --state-dir removes only that one, without it all of heartbeat's."""
        a, b = str(tmp_path / "a"), str(tmp_path / "b")
        path = work / ".claude" / "settings.json"
        assert str(path) in install_claude(str(work), state_dir=a)
        install_claude(str(work), state_dir=b)
        assert install_claude(str(work), state_dir=a) == []
        stop = [h["command"] for g in _settings(Path(path))["hooks"]["Stop"] for h in g["hooks"]]
        assert len(stop) == 2 and any(a in c for c in stop) and any(b in c for c in stop)
        assert all(c.endswith(" # heartbeat-hook") for c in stop)
        uninstall_claude(str(work), state_dir=a)
        stop = [h["command"] for g in _settings(Path(path))["hooks"]["Stop"] for h in g["hooks"]]
        assert len(stop) == 1 and b in stop[0]
        install_claude(str(work), state_dir=a)
        uninstall_claude(str(work))
        assert not Path(path).exists() and not (work / ".claude" / "settings.local.json").exists()

    def test_a_hook_written_before_the_marker_is_replaced(self, work: Path, tmp_path: Path) -> None:
        """An install by an older heartbeat (its exact command, no marker) is recognised: no duplicate."""
        settings = work / ".claude" / "settings.json"
        settings.parent.mkdir()
        old = f"{sys.executable} -m heartbeat hook claude --state-dir {tmp_path / 'st'}"
        settings.write_text(json.dumps({"hooks": {name: [{"hooks": [{"type": "command", "command": old}]}]
                                                  for name in ("SessionStart", "PreCompact", "Stop", "SessionEnd")}}))
        install_claude(str(work), state_dir=str(tmp_path / "st"))
        for name in ("SessionStart", "PreCompact", "Stop", "SessionEnd"):
            [only] = [h["command"] for g in _settings(settings)["hooks"][name] for h in g["hooks"]]
            assert only.endswith(" # heartbeat-hook")

    def test_mcp_registration(self, hb: Callable[..., Result], work: Path) -> None:
        """--mcp adds the heartbeat server to .mcp.json next to the others; uninstall removes only it."""
        mcp = work / ".mcp.json"
        other = {"mcpServers": {"db": {"command": "db-mcp", "args": []}}, "x": 1}
        mcp.write_text(json.dumps(other))
        assert hb("hooks", "install", "claude", "--dir", str(work), "--mcp").code == 0
        servers = _settings(mcp)["mcpServers"]
        assert servers["db"] == other["mcpServers"]["db"]
        assert servers["heartbeat"]["args"][-1] == "mcp" and servers["heartbeat"]["type"] == "stdio"
        assert hb("hooks", "uninstall", "claude", "--dir", str(work)).code == 0
        assert _settings(mcp) == other

    def test_codex_agents_md(self, hb: Callable[..., Result], work: Path) -> None:
        """A marked section is appended to AGENTS.md once, and removed exactly."""
        agents = work / "AGENTS.md"
        agents.write_text("# Project rules\n\nRun the tests.\n")
        original = agents.read_text()
        assert hb("hooks", "install", "codex", "--dir", str(work)).code == 0
        text = agents.read_text()
        assert text.startswith(original) and "heartbeat --state-dir" in text and "heartbeat:begin" in text
        assert hb("hooks", "install", "codex", "--dir", str(work)).out.startswith("nothing to change")
        assert agents.read_text() == text
        assert hb("hooks", "uninstall", "codex", "--dir", str(work)).code == 0
        assert agents.read_text() == original

    def test_codex_file_created_and_removed(self, hb: Callable[..., Result], work: Path) -> None:
        """An AGENTS.md that held only heartbeat's section goes away with it."""
        assert hb("hooks", "install", "codex", "--dir", str(work), "--task", "t1").code == 0
        assert "state brief t1" in (work / "AGENTS.md").read_text()  # (the state dir install found is baked in)
        assert hb("hooks", "uninstall", "codex", "--dir", str(work)).code == 0
        assert not (work / "AGENTS.md").exists()

    def test_codex_an_agents_md_too_large_to_read_is_left_whole(self, hb: Callable[..., Result], work: Path) -> None:
        """An AGENTS.md larger than the read limit is refused untouched: it was read only up to the
        limit and written back cut there, losing the rest of a person's file."""
        agents = work / "AGENTS.md"
        original = "# Project rules\n" + "Run the tests before every commit.\n" * 140_000 + "THE LAST RULE\n"
        agents.write_text(original)
        r = hb("hooks", "install", "codex", "--dir", str(work))
        assert r.code == 2 and "larger than" in r.err and len(r.err.strip().splitlines()) == 1, r.err
        assert agents.read_text() == original

    @pytest.mark.parametrize("name", [".claude/settings.json", "AGENTS.md"])
    def test_a_fifo_instead_of_a_file_is_refused_without_hanging(self, hb: Callable[..., Result], work: Path,
                                                                 name: str) -> None:
        """A FIFO where a settings file or AGENTS.md belongs (anything in a workdir can make one) is
        refused with one line: opening it to read waited for a writer for ever."""
        fifo = work / name
        fifo.parent.mkdir(exist_ok=True)
        os.mkfifo(fifo)
        agent = "claude" if name.startswith(".claude") else "codex"
        try:
            r = hb("hooks", "install", agent, "--dir", str(work), timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"hooks install {agent} hung on a FIFO at {name}") from None
        assert r.code == 2 and "not a regular file" in r.err, r.err
        assert fifo.is_fifo()

    def test_codex_hooks_json(self, hb: Callable[..., Result], work: Path, tmp_path: Path) -> None:
        """codex: the four hooks merge into .codex/hooks.json next to a person's own (kept, with the file's
        other keys); --user writes $CODEX_HOME/hooks.json and, without --dir, no AGENTS.md."""
        hooks_json = work / ".codex" / "hooks.json"
        hooks_json.parent.mkdir()
        mine = {"hooks": [{"type": "command", "command": "notify-send 'heartbeat hook codex ran'"}]}
        hooks_json.write_text(json.dumps({"description": "team hooks", "hooks": {"Stop": [mine]}}))
        r = hb("hooks", "install", "codex", "--dir", str(work))
        assert r.code == 0 and "/hooks" in r.out, r.err
        doc = _settings(hooks_json)
        assert doc["description"] == "team hooks" and doc["hooks"]["Stop"][0] == mine
        for name in ("SessionStart", "PreCompact", "Stop", "SessionEnd"):
            [ours] = [h for g in doc["hooks"][name] for h in g["hooks"] if h["command"].endswith("# heartbeat-hook")]
            assert " hook codex " in ours["command"] and ours["timeout"] == (3 if name == "SessionEnd" else 30)
        assert hb("hooks", "uninstall", "codex", "--dir", str(work)).code == 0
        assert _settings(hooks_json) == {"description": "team hooks", "hooks": {"Stop": [mine]}}
        codex_home = tmp_path / "codex-home"
        assert hb("hooks", "install", "codex", "--user", env={"CODEX_HOME": str(codex_home)}).code == 0
        assert "Stop" in _settings(codex_home / "hooks.json")["hooks"]
        assert not (tmp_path / "AGENTS.md").exists()  # the hook runs from tmp_path: no project was named


class TestHooksConfig:
    """`[hooks]` in the config: documented in the example, checked like every other section."""

    def test_the_example_documents_every_key(self) -> None:
        """Every HooksConfig field is a key of config/heartbeat.example.toml's [hooks]."""
        import dataclasses
        import tomllib

        doc = tomllib.loads((ROOT / "config" / "heartbeat.example.toml").read_text())
        assert {f.name for f in dataclasses.fields(HooksConfig)} == set(doc["hooks"])

    @pytest.mark.parametrize(("body", "message"), [
        ('fresh_within = "soon"', "hooks.fresh_within"),
        ("max_stop_blocks = -1", "hooks.max_stop_blocks: must be at least 0"),
        ("max_stop_block = 2", "hooks.max_stop_block: unknown key"),
    ])
    def test_bad_values_are_refused(self, body: str, message: str) -> None:
        """A bad [hooks] value is a ConfigError naming the key."""
        from heartbeat.config.load import parse_config
        from heartbeat.model.errors import ConfigError

        with pytest.raises(ConfigError, match=message):
            parse_config(f"[hooks]\n{body}\n")

    def test_values_reach_the_hook(self, tmp_path: Path, work: Path) -> None:
        """The hook reads max_stop_blocks from the config it finds: 0 never blocks."""
        state = tmp_path / "st"
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state}"\n[hooks]\nmax_stop_blocks = 0\n')
        env = clean_env()
        run = [sys.executable, "-m", "heartbeat", "--config", str(config)]
        assert subprocess.run([*run, "new", "t1", "--task", "T", "--step", "s", "--workdir", str(work)],
                              env=env, capture_output=True, timeout=60).returncode == 0
        for ev in (event("SessionStart", work, source="startup"), event("Stop", work, stop_hook_active=False)):
            proc = subprocess.run([*run, "hook", "claude"], input=json.dumps(ev), text=True, capture_output=True,
                                  env=env, timeout=60)
            assert proc.returncode == 0 and proc.stderr == ""
        assert proc.stdout == ""

    def test_help(self, hb: Callable[..., Result]) -> None:
        """`hook claude --help` prints the usage (and, like every hook call, exits 0)."""
        r = hb("hook", "claude", "--help")
        assert r.code == 0 and "usage: heartbeat hook" in r.out
