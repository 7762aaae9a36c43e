"""The real ``codex`` (pinned 0.171.0) running whole sessions against the scripted model on 127.0.0.1.

codex reaches the scripted Responses API through a provider given on its command line
(``tests/support/scripted_model/responses.py``: ``codex_args``); no login, no network. It runs the
model's shell calls in its real ``workspace-write`` sandbox and fires the hooks
``heartbeat hooks install codex`` wrote. The model's own record (``model.jsonl``: each step
it wrote, from the tool results codex sent back) is the independent witness of redone work.

codex runs a hook only once a person has trusted it (``/hooks`` in the TUI); these runs
pass ``--dangerously-bypass-hook-trust``, the flag codex documents for automation that vets
its hook sources itself, in a CODEX_HOME of their own that holds heartbeat's hooks only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from daemon_harness import DaemonHarness, toml_list
from scripted_model import Workload, scripted_model
from scripted_model.brain import Brain, Conversation, Reply
from scripted_model.responses import codex_args

pytestmark = pytest.mark.slow

STEPS = ("Reproduce the blank answer", "Write the failing test", "Patch the fallback", "Run the suite")
BYPASS = "--dangerously-bypass-hook-trust"
BIN = os.path.dirname(sys.executable)
"""Where this test run's ``heartbeat`` script is: codex's shell must find it on PATH."""
NO_TMP = ["-c", "sandbox_workspace_write.exclude_slash_tmp=true",
          "-c", "sandbox_workspace_write.exclude_tmpdir_env_var=true"]
"""The tests' state dirs live under /tmp, which codex's sandbox leaves writable by default: taken
out, a state dir is writable only when the preset makes it so, as it is for a state dir elsewhere."""


@pytest.fixture
def codex() -> Path:
    from agent_clis import agent_cli

    return agent_cli("codex")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    tmp_path.chmod(0o700)
    for name in ("work", "home/.codex"):
        (tmp_path / name).mkdir(parents=True)
    yield tmp_path


def codex_env(root: Path, **extra: str) -> dict[str, str]:
    """codex's environment: its own HOME and CODEX_HOME, the scripted provider's key, this heartbeat on PATH."""
    env = clean_env(HOME=str(root / "home"), CODEX_HOME=str(root / "home" / ".codex"), SCRIPTED_KEY="sk-scripted",
                    **extra)
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def seams(state: Path, task: str) -> list[tuple[str, dict[str, Any]]]:
    from heartbeat.store.files import FileStore

    store = FileStore(str(state))
    try:
        return [(e.kind, e.data) for e in store.ledger.events(task)
                if e.kind in ("session_started", "compacting", "stop_blocked", "stop_allowed", "session_ended")]
    finally:
        store.close()


class LazyBrain(Brain):
    """Ends its first turn without doing anything; follows the brief once a hook tells it to."""

    def decide(self, conv: Conversation) -> Reply:
        if "<hook_prompt" not in conv.text:
            self._witness(conv)
            return Reply(text="Nothing to do here.")
        return super().decide(conv)


class TestRealCodexHooks:
    """`heartbeat hooks install codex` wires heartbeat into the real codex: its hooks fire with the
    Claude Code wire (SessionStart context, Stop decision block)."""

    def test_the_brief_reaches_the_model_and_a_bound_stop_is_held_up_once(self, codex: Path, root: Path,
                                                                        tmp_path: Path) -> None:
        """A bound session (HEARTBEAT_TASK) prompted with nothing but "hello": the SessionStart hook's brief
        is in the model's first request; the model stops without a note, the Stop hook blocks once, its
        reason comes back as codex's continuation prompt, and the model then does the task and keeps the note."""
        state, work = root / "state", root / "work"
        state.mkdir(mode=0o700)
        env = codex_env(root, HEARTBEAT_STATE_DIR=str(state), HEARTBEAT_TASK="t1")
        hb = [sys.executable, "-m", "heartbeat"]
        r = subprocess.run([*hb, "new", "t1", "--task", "Fix the fallback", "--step", STEPS[0], "--intent",
                            "Users get blank answers", "--workdir", str(work)], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        # installed from a shell without HEARTBEAT_STATE_DIR (it would be baked in): the hook finds the
        # state dir in codex's environment, as an agent the daemon launched does
        install_env = {k: v for k, v in env.items() if k != "HEARTBEAT_STATE_DIR"}
        r = subprocess.run([*hb, "hooks", "install", "codex", "--user", "--dir", str(work)], env=install_env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "hooks.json" in r.stdout and "/hooks" in r.stdout, r.stderr
        hooks_file = root / "home" / ".codex" / "hooks.json"
        commands = {h["command"] for groups in json.loads(hooks_file.read_text())["hooks"].values()
                    for g in groups for h in g["hooks"]}
        assert len(commands) == 1 and next(iter(commands)).endswith("hook codex # heartbeat-hook")

        with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False,
                            wires=("responses",)) as model:
            model.brain.__class__ = LazyBrain
            proc = subprocess.run([str(codex), "exec", "--json", "--skip-git-repo-check", "--sandbox",
                                   "workspace-write", "-c", "allow_login_shell=false", BYPASS,
                                   *codex_args(model.url), "hello"], stdin=subprocess.DEVNULL, cwd=str(work),
                                  env=env, capture_output=True, text=True, timeout=240)
            bodies = list(model.bodies)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        thread = json.loads(proc.stdout.splitlines()[0])["thread_id"]
        first = json.dumps(bodies[0]["input"])
        assert "this session works on task 't1'" in first and "Users get blank answers" in first
        prompts = [item for body in bodies for item in body["input"]
                   if item.get("role") == "user" and "<hook_prompt" in json.dumps(item)]
        assert prompts and "heartbeat set t1 step=" in json.dumps(prompts[0])
        kinds = [(k, d.get("source") or d.get("why") or d.get("reason")) for k, d in seams(state, "t1")]
        assert kinds[0] == ("session_started", "startup") and kinds[1][0] == "stop_blocked"
        assert [k for k, _ in kinds].count("stop_blocked") == 1 and kinds[-1][0] == "session_ended"
        assert all(d["session_id"] == thread for _, d in seams(state, "t1"))
        done = subprocess.run([*hb, "show", "t1", "--json"], env=env, capture_output=True, text=True, timeout=60)
        baton = json.loads(done.stdout)
        assert baton["done"] == list(STEPS) and baton["meta"]["status"] == "done"

    def test_a_persons_session_is_briefed_but_never_held_up(self, codex: Path, root: Path, tmp_path: Path) -> None:
        """Unbound (no HEARTBEAT_TASK), started in a subdirectory of the task's workdir: codex's SessionStart
        hook finds the task by its cwd and briefs the session; its Stop is never blocked."""
        state, work = root / "state", root / "work"
        state.mkdir(mode=0o700)
        sub = work / "src"
        sub.mkdir()
        env = codex_env(root, HEARTBEAT_STATE_DIR=str(state))
        hb = [sys.executable, "-m", "heartbeat"]
        assert subprocess.run([*hb, "new", "t1", "--task", "Fix the fallback", "--step", STEPS[0],
                               "--workdir", str(work)], env=env, capture_output=True, timeout=60).returncode == 0
        assert subprocess.run([*hb, "hooks", "install", "codex", "--user", "--dir", str(work)], env=env,
                              capture_output=True, timeout=60).returncode == 0
        with scripted_model(tmp_path / "model", Workload(steps=STEPS), wires=("responses",)) as model:
            model.brain.__class__ = LazyBrain
            proc = subprocess.run([str(codex), "exec", "--json", "--skip-git-repo-check", BYPASS,
                                   *codex_args(model.url), "hello"], stdin=subprocess.DEVNULL, cwd=str(sub),
                                  env=env, capture_output=True, text=True, timeout=240)
            bodies = list(model.bodies)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert len(bodies) == 1 and "this session works on task 't1'" in json.dumps(bodies[0]["input"])
        assert [k for k, _ in seams(state, "t1")] == ["session_started", "session_ended"]


class TestDaemonWithRealCodex:
    """The daemon runs the real codex through its preset against the scripted model."""

    @pytest.mark.parametrize("session", ["fresh", "resume"])
    def test_sigkill_mid_task_the_successor_finishes_redoing_at_most_the_step_in_flight(
            self, codex: Path, root: Path, tmp_path: Path, session: str) -> None:
        """codex is SIGKILLed while the model holds the answer to step 2's write (before its note); the
        daemon's successor (a fresh thread, or `exec resume` of the killed one) finishes all four steps,
        and the model's own record shows at most step 2 written twice. The sandbox keeps /tmp read-only,
        so the note is kept only because the preset makes the state dir writable; the hooks fire in
        both runs, each bound to the task."""
        model_dir = tmp_path / "model"
        with scripted_model(model_dir, Workload(steps=STEPS), sees_files=False, wires=("responses",)) as model:
            env = codex_env(root)
            args = ["--sandbox", "workspace-write", "-c", "allow_login_shell=false", *NO_TMP, BYPASS,
                    *codex_args(model.url)]
            extra = f"""
[launchers.codex]
preset = "codex"
program = "{codex}"
args = {toml_list(args)}
session = "{session}"
inherit_env = ["LANG"]
env = {{ PATH = "{env['PATH']}", HOME = "{env['HOME']}", CODEX_HOME = "{env['CODEX_HOME']}", SCRIPTED_KEY = "sk-scripted" }}
"""
            h = DaemonHarness(root, extra=extra, stall_after="90s", max_attempts=3)
            try:
                r = h.cli("hooks", "install", "codex", "--user", "--dir", str(root / "work"), env=env)
                assert r.returncode == 0, r.stderr
                (model_dir / "controls.json").write_text(json.dumps({"hold_after_step": 2}))
                h.start()
                r = h.cli("new", "fix", "--task", "Fix empty responses", "--intent", "Users get blank answers",
                          "--step", STEPS[0], "--next", STEPS[1], "--workdir", str(root / "work"),
                          "--launcher", "codex")
                assert r.returncode == 0, r.stderr
                h.wait(lambda: any(e["event"] == "held" for e in model.brain.record.entries()),
                       "the model holding step 2's answer", timeout=180)
                assert len(h.live_agents("fix")) == 1
                h.kill_agents()
                (model_dir / "controls.json").write_text("{}")
                baton = h.wait(lambda: (b := h.baton("fix")).meta.status.value == "done" and b,
                               "the successor to finish", timeout=240)
            finally:
                h.close()
            record = model.brain.record
            steps_done = record.steps_done()
        assert baton.done == list(STEPS)
        assert set(steps_done) == set(STEPS)
        assert set(record.redone()) <= {STEPS[1]}, steps_done
        dispatched = h.events("fix", "dispatched")
        assert len(dispatched) == 2
        exited = h.events("fix", "exited")
        assert exited[0].data["signal"] == 9 and exited[0].data["kind"] == "failed", exited[0].data
        first_thread = exited[0].data["session_id"]
        assert dispatched[1].data["session_resumed"] is (session == "resume")
        notes = [e for e in record.entries() if e["event"] == "note"]
        assert notes and not any(e["error"] for e in notes), [e for e in notes if e["error"]][:2]
        started = [d for k, d in seams(h.state, "fix") if k == "session_started"]
        assert [d["source"] for d in started] == ["startup", "resume" if session == "resume" else "startup"]
        assert started[0]["session_id"] == first_thread
        assert (started[1]["session_id"] == first_thread) is (session == "resume")
