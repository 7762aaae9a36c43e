"""The real claude -p (pinned in tests/support/agent_clis.py, not logged in, a temp HOME, the
scripted model on 127.0.0.1) fires the installed hooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Result, clean_env

from heartbeat.integrations.claude import install_claude
from tests.integration import test_hooks as hooks
from tests.integration.test_hooks import FOREIGN, seam_events

work, task = hooks.work, hooks.task  # the fixtures of tests/integration/test_hooks.py, used here too


class TestRealClaude:
    """The real `claude -p` (pinned, not logged in, temp HOME, no network) fires the installed hooks."""

    def run_claude(self, claude: Path, work: Path, home: Path, *args: str, prompt: str) -> list[dict[str, Any]]:
        env = {k: v for k, v in clean_env().items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))}
        env["HOME"] = str(home)
        proc = subprocess.run([str(claude), "-p", "--output-format", "stream-json", "--verbose", *args],
                              input=prompt, text=True, capture_output=True, cwd=str(work), env=env, timeout=180)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, f"exit {proc.returncode}: {proc.stderr[-500:]}"
        return lines

    def test_session_start_carries_the_brief_and_compact_is_counted(
            self, hb: Callable[..., Result], state_dir: Path, work: Path, task: str, tmp_path: Path) -> None:
        """SessionStart: the stream shows the hook's output with the brief and the ledger has the seam;
        `/compact` on the resumed session fires the real PreCompact, which `report` counts."""
        from agent_clis import agent_cli

        claude = agent_cli("claude")
        home = tmp_path / "home"
        home.mkdir()
        r = hb("--state-dir", str(state_dir), "hooks", "install", "claude", "--dir", str(work))
        assert r.code == 0, r.err
        lines = self.run_claude(claude, work, home, prompt="hello")
        session = next(line["session_id"] for line in lines if line.get("session_id"))
        [response] = [line for line in lines if line.get("subtype") == "hook_response"
                      and line.get("hook_event") == "SessionStart"]
        context = json.loads(response["stdout"])["hookSpecificOutput"]["additionalContext"]
        assert "Make the fallback path survive a restart" in context and response["exit_code"] == 0
        result = lines[-1]
        assert result["type"] == "result" and result["is_error"] is True  # not logged in
        # The CLI took it as context: its transcript holds the brief as a hook_additional_context
        # attachment, and in the API request it built (never sent: not logged in).
        [transcript] = (home / ".claude" / "projects").glob(f"*/{session}.jsonl")
        records = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
        attached = [r["attachment"] for r in records if isinstance(r.get("attachment"), dict)
                    and r["attachment"].get("type") == "hook_additional_context"]
        assert attached and "Make the fallback path survive a restart" in json.dumps(attached)
        assert any(r.get("type") == "api-request-blob" and "Make the fallback path survive a restart" in json.dumps(r)
                   for r in records)
        seams = seam_events(state_dir)
        assert seams[0] == ("session_started", {"session_id": session, "source": "startup"})
        assert seams[-1][0] == "session_ended" and seams[-1][1]["session_id"] == session

        self.run_claude(claude, work, home, "--resume", session, prompt="/compact")
        kinds = [(k, d.get("source") or d.get("trigger") or d.get("reason")) for k, d in seam_events(state_dir)]
        assert ("session_started", "resume") in kinds and ("compacting", "manual") in kinds
        [t] = json.loads(hb("report", "--json").out)["tasks"]
        assert t["seams"]["compactions"] == 1
        assert t["seams"]["session_starts"] == {"startup": 1, "resume": 1}

    def test_a_bound_person_session_claims_its_task(
            self, hb: Callable[..., Result], state_dir: Path, work: Path, task: str, tmp_path: Path) -> None:
        """issue 26 item 10: `HEARTBEAT_TASK=t1 claude` (a person's session, no HEARTBEAT_EPOCH) claims the
        task at SessionStart for the claude process itself, so the daemon, which dispatches no agent onto
        a task a live process holds, does not start a second, headless one; the context says so."""
        from agent_clis import agent_cli

        from heartbeat.store.files import FileStore

        claude = agent_cli("claude")
        home = tmp_path / "home"
        home.mkdir()
        assert hb("--state-dir", str(state_dir), "hooks", "install", "claude", "--dir", str(work)).code == 0
        env = {k: v for k, v in clean_env().items() if not k.startswith(("ANTHROPIC_", "CLAUDE", "HEARTBEAT_"))}
        env.update(HOME=str(home), HEARTBEAT_TASK=task)
        proc = subprocess.Popen([str(claude), "-p", "--output-format", "stream-json", "--verbose"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(work), env=env)
        out, _ = proc.communicate("hello", timeout=180)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        [response] = [line for line in lines if line.get("subtype") == "hook_response"
                      and line.get("hook_event") == "SessionStart"]
        context = json.loads(response["stdout"])["hookSpecificOutput"]["additionalContext"]
        assert context.startswith(f"heartbeat: this session claimed task {task!r} (epoch 1, pid {proc.pid})"), context
        store = FileStore(str(state_dir))
        try:
            [claimed] = [e for e in store.ledger.events(task) if e.kind == "claimed"]
            baton = store.load(task)
        finally:
            store.close()
        assert claimed.actor == "hook" and claimed.data["pid"] == proc.pid
        assert baton.meta.epoch == 1 and baton.meta.owner is not None and baton.meta.owner.pid == proc.pid

    def test_settings_written_by_install_are_accepted(self, work: Path, tmp_path: Path, state_dir: Path) -> None:
        """Claude Code reads the merged settings without a settings error (hooks listed under their events)."""
        from agent_clis import agent_cli

        claude = agent_cli("claude")
        settings = work / ".claude" / "settings.json"
        settings.parent.mkdir()
        settings.write_text(json.dumps(FOREIGN))
        install_claude(str(work), state_dir=str(state_dir))
        home = tmp_path / "home"
        home.mkdir()
        lines = self.run_claude(claude, work, home, prompt="hello")
        names = {line.get("hook_name") for line in lines if line.get("subtype") == "hook_started"}
        assert "SessionStart:startup" in names
        assert os.path.isfile(settings)


class TestRealClaudeSessions:
    """The real `claude -p` against the scripted model on 127.0.0.1: a bound session is held up at most
    once, whatever its turns; a person's session in a subdirectory is briefed and never held up."""

    def run(self, claude: Path, cwd: Path, env: dict[str, str], *args: str) -> str:
        proc = subprocess.run([str(claude), "-p", "--output-format", "stream-json", "--verbose", *args],
                              input="hello", text=True, capture_output=True, cwd=str(cwd), env=env, timeout=240)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines and lines[-1].get("type") == "result", f"exit {proc.returncode}: {proc.stderr[-800:]}"
        assert lines[-1]["is_error"] is False, lines[-1]
        return str(lines[-1]["session_id"])

    def test_once_per_session_across_turns_and_never_a_persons(self, tmp_path: Path, work: Path) -> None:
        """Turn 1 of a bound session stops without a note: blocked once, the reason (its commands carrying
        --state-dir) reaches the model. Turn 2 (--resume, still no note): not blocked again. An unbound
        session started in workdir/src: briefed, its stop never blocked."""
        from agent_clis import agent_cli
        from scripted_model import Workload, scripted_model
        from scripted_model.brain import Brain, Conversation, Reply

        class Idle(Brain):
            def decide(self, conv: Conversation) -> Reply:
                return Reply(text="Nothing to do.")

        claude = agent_cli("claude")
        state = tmp_path / "st"
        state.mkdir(mode=0o700)
        hb = [sys.executable, "-m", "heartbeat", "--state-dir", str(state)]
        assert subprocess.run([*hb, "new", "t1", "--task", "Fix the fallback", "--step", "Read the code",
                               "--workdir", str(work)], env=clean_env(), capture_output=True, timeout=60).returncode == 0
        home = tmp_path / "home"
        home.mkdir()
        # --user: in a workdir that is no git repository, claude 2.1.332 read no workdir/.claude/ from workdir/src
        assert subprocess.run([*hb, "hooks", "install", "claude", "--user"], env=clean_env(HOME=str(home)),
                              capture_output=True, timeout=60).returncode == 0
        with scripted_model(tmp_path / "model", Workload(steps=("s",)), wires=("anthropic",)) as model:
            model.brain.__class__ = Idle
            env = clean_env(HOME=str(home), ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="sk-scripted",
                            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
            env = {k: v for k, v in env.items() if not k.startswith("CLAUDE_CODE_") or k.endswith("_TRAFFIC")}
            bound = {**env, "HEARTBEAT_TASK": "t1"}
            session = self.run(claude, work, bound)
            reasons = [b for b in model.bodies if "has not been written since this session" in json.dumps(b)]
            assert reasons and f"heartbeat --state-dir {state} set t1 step=" in json.dumps(reasons[0])
            assert self.run(claude, work, bound, "--resume", session) == session
            sub = work / "src"
            sub.mkdir()
            person = self.run(claude, sub, env)
        mine = [(k, d) for k, d in seam_events(state) if d.get("session_id") == session]
        assert [k for k, _ in mine].count("stop_blocked") == 1
        assert [k for k, _ in mine if k in ("session_started", "stop_blocked")] == [
            "session_started", "stop_blocked", "session_started"]
        theirs = [k for k, d in seam_events(state) if d.get("session_id") == person]
        assert theirs[0] == "session_started" and "stop_blocked" not in theirs


