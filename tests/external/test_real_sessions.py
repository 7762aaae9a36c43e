"""Real sessions: the real ``claude`` CLI runs whole agent loops against the scripted model.

The daemon launches the pinned ``claude`` through the ``claude-code`` preset with the
README's config; ``claude`` sends its Messages API requests to the scripted model on
127.0.0.1 (``tests/support/scripted_model``), runs the tool calls it answers with (``Write``,
``Bash``: the real ``heartbeat`` commands against the real state dir), fires its hooks and
resumes its sessions. What the agent did is read from the model's own record (built from
the tool results the CLI sent back), independent of heartbeat's ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_clis import agent_cli
from daemon_harness import DaemonHarness, toml_list
from scripted_model import ScriptedModel, Workload, scripted_model, step_file

pytestmark = pytest.mark.slow

STEPS = ("Survey the module", "Write the fix", "Run the tests")
README_ARGS = ["--model", "sonnet", "--permission-mode", "acceptEdits"]
"""The README's Claude Code launcher args."""
BIN = Path(sys.executable).parent
"""Where this venv's ``heartbeat`` is: on the agent's PATH, as an installed heartbeat is."""


def claude_env(model: ScriptedModel, home: Path) -> dict[str, str]:
    """The agent's environment: the scripted model as the API, a throwaway HOME, no other traffic."""
    return {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-scripted-model",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def claude_launcher(model: ScriptedModel, home: Path, *, args: list[str], session: str = "fresh") -> str:
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in claude_env(model, home).items())
    return f"""
[launchers.claude]
preset = "claude-code"
program = "{agent_cli("claude")}"
args = {toml_list(args)}
session = "{session}"
inherit_env = ["LANG"]
env = {{ {env} }}
"""


class Session:
    """A scripted model, a workdir and a daemon whose ``claude`` launcher talks to the model."""

    def __init__(self, root: Path, model: ScriptedModel, *, args: list[str], session: str = "fresh") -> None:
        root.chmod(0o700)
        self.model = model
        self.work = root / "work"
        self.work.mkdir()
        home = self.home = root / "home"
        home.mkdir()
        # claude never touches: only its notes are proof of life, so stall_after is generous
        self.h = DaemonHarness(root, extra=claude_launcher(model, home, args=args, session=session),
                               stall_after="180s", max_attempts=4)

    def new(self, task: str, *extra: str) -> None:
        plan = [a for s in STEPS for a in ("--plan", s)]
        r = self.h.cli("new", task, "--task", "Fix the fallback path", "--intent", "Users get blank answers",
                       "--step", STEPS[0], "--next", STEPS[1], *plan, "--workdir", str(self.work),
                       "--launcher", "claude", *extra)
        assert r.returncode == 0, r.stderr

    def control(self, **controls: Any) -> None:
        path = self.model.log_dir / "controls.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(controls))
        os.replace(tmp, path)

    def record(self) -> list[dict[str, Any]]:
        return self.model.brain.record.entries()

    def status(self, task: str) -> str:
        return self.h.baton(task).meta.status.value

    def transcript_holds_result(self, session: str, path: str) -> bool:
        """Whether claude's own transcript of ``session`` holds a tool result naming ``path``.

        claude 2.1.332 appends its transcript a moment after each turn: a kill within about a
        second of a tool call can leave the call out, and a resume then redoes it."""
        for transcript in (self.home / ".claude" / "projects").glob(f"*/{session}.jsonl"):
            for line in transcript.read_text(errors="replace").splitlines():
                entry = json.loads(line) if line.startswith("{") else {}
                content = (entry.get("message") or {}).get("content")
                if isinstance(content, list) and any(
                        c.get("type") == "tool_result" and path in json.dumps(c.get("content")) for c in content):
                    return True
        return False


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False) as m:
        yield m


class TestTheAgentKeepsItsNote:
    """Issue 16: with the README's config, every heartbeat command the agent ran was refused headless."""

    def test_readme_config_finishes_a_task_and_allows_nothing_else(self, tmp_path: Path, model: ScriptedModel) -> None:
        """acceptEdits (the README's args): the agent reads its baton, notes each step and finishes the
        task; commands that are not heartbeat's own on this task are still refused (fails on c684e38:
        every heartbeat command refused with 'This command requires approval', the task never done)."""
        s = Session(tmp_path, model, args=README_ARGS)
        pwned = s.work / "pwned"
        write = "python3 -c \"open('pwned', 'w')\""  # acceptEdits itself allows touch, mkdir, ... in the workdir
        probes = [
            "heartbeat done other-task --note x",
            "heartbeat show real1",
            f'heartbeat add real done "x" && {write}',
            f"heartbeat touch real; {write}",
            f"heartbeat touch real | {write}",
            f'heartbeat set real step="$({write})"',
            "heartbeat show $HEARTBEAT_TASK",
            write,
        ]
        s.control(probes=probes)
        try:
            s.h.start()
            s.new("real")
            s.h.wait(lambda: s.status("real") == "done", "the task done by the agent", timeout=240)
            record = s.record()
            notes = [e for e in record if e["event"] == "note" and e["command"] not in probes]
            assert notes[0]["command"] == "heartbeat show real --json"
            assert [e["command"] for e in notes if e["error"]] == []
            assert [e["step"] for e in record if e["event"] == "step_done"] == list(STEPS)
            baton = s.h.baton("real")
            assert baton.done == list(STEPS)
            refused = {e["command"] for e in record if e["event"] == "refused"}
            assert refused == set(probes), [e for e in record if e["event"] in ("refused", "shell")]
            assert not pwned.exists()
            assert len(s.h.events("real", "dispatched")) == 1
        finally:
            s.h.close()

    def test_default_permission_mode_keeps_the_note_too(self, tmp_path: Path, model: ScriptedModel) -> None:
        """Default mode (no --permission-mode): the CLI refuses the agent's Write, and the agent's
        heartbeat commands still go through: it reads its baton and blocks the task, naming why
        (fails on c684e38: the show and the block are refused too, and the task stays active)."""
        s = Session(tmp_path, model, args=["--model", "sonnet"])
        try:
            s.h.start()
            s.new("real")
            s.h.wait(lambda: s.status("real") == "blocked", "the agent's own block", timeout=240)
            baton = s.h.baton("real")
            assert baton.blocked_on == f"the CLI refused to write {step_file(0)}"
            # the model learns how its last command went from the CLI's next request
            notes = s.h.wait(lambda: [e["command"] for e in s.record() if e["event"] == "note"][1:] and
                             [e for e in s.record() if e["event"] == "note"], "the block in the model's record")
            assert [(e["command"], e["error"]) for e in notes] == [
                ("heartbeat show real --json", False),
                (f'heartbeat block real --on "the CLI refused to write {step_file(0)}"', False)]
            record = s.record()
            assert [e["kind"] for e in record if e["event"] == "refused"] == ["write"]
        finally:
            s.h.close()


class TestKilledMidTask:
    """SIGKILL mid-step: the successor finishes, redoing at most the step in flight (by the model's record)."""

    @pytest.mark.parametrize("session", ["fresh", "resume"])
    def test_successor_finishes_redoing_at_most_the_step_in_flight(
            self, tmp_path: Path, model: ScriptedModel, session: str) -> None:
        """The model holds its answer after step 2's file is written and before its note; the agent is
        killed there. The successor (a fresh session from the brief, or the same session resumed) ends
        the task with every step done once, except step 2 at most twice. The resumed session redoes
        nothing (fails on c684e38 in resume mode: a killed agent whose notes had moved the step got a
        fresh session, the daemon counting only attempts without progress as retries)."""
        s = Session(tmp_path, model, args=README_ARGS, session=session)
        s.control(hold_after_step=2)
        try:
            s.h.start()
            s.new("real")
            s.h.wait(lambda: any(e["event"] == "held" for e in s.record()), "the model holding step 2", timeout=180)
            [first] = s.h.events("real", "dispatched")
            if session == "resume":  # claude writes its transcript a moment late: kill after it holds the write
                s.h.wait(lambda: s.transcript_holds_result(first.data["session"], step_file(1)),
                         "step 2's write in claude's transcript", timeout=30)
            groups = s.h.live_agents("real")["real"]
            s.control()  # the successor gets answers
            for pgid in groups:
                os.killpg(pgid, signal.SIGKILL)
            s.h.wait(lambda: s.status("real") == "done", "the successor finishing", timeout=240)
            done = [e["step"] for e in s.record() if e["event"] == "step_done"]
            assert set(done) == set(STEPS)
            assert [st for st in STEPS if done.count(st) > 1] in ([], [STEPS[1]])
            assert done.count(STEPS[1]) <= 2 and all(done.count(st) == 1 for st in (STEPS[0], STEPS[2]))
            dispatched = s.h.events("real", "dispatched")
            assert len(dispatched) == 2
            second = dispatched[1].data
            if session == "resume":  # the same session, resumed: its transcript holds step 2's write
                assert second["session_resumed"] is True and second["session"] == first.data["session"]
                assert done == list(STEPS)
            else:  # a fresh session from the brief: step 2's note was not written, so step 2 is redone
                assert second["session_resumed"] is False and second["session"] != first.data["session"]
                assert done == [STEPS[0], STEPS[1], STEPS[1], STEPS[2]]
            assert s.h.baton("real").done == list(STEPS)
        finally:
            s.h.close()


DOCS_STEPS = ("Reproduce", "Write a failing test", "Fix")


class TestTheDocsAsWritten:
    """docs/agents.md's Claude Code section, copy-pasted: its config and its commands, headless."""

    def test_the_claude_code_config_and_commands_work_as_written(self, tmp_path: Path) -> None:
        """The config block verbatim, the shell block with /srv/repo moved into a temp dir, `claude` on
        PATH and the scripted model as the API: the daemon's claude finishes the task, notes every step,
        keeps the task's constraint (its first step would write config/prod.yaml), and fires the hooks
        `hooks install claude` wrote (fails on c684e38: the agent's heartbeat commands are refused)."""
        import re

        import psutil

        from heartbeat.store.files import FileStore

        claude = agent_cli("claude")
        text = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
        section = text[text.index("### The config"):]
        config = re.search(r"```toml\n(.*?)```", section, re.S)
        commands = re.search(r"```sh\n(.*?)```", section, re.S)
        assert config and commands
        tmp_path.chmod(0o700)
        where, repo, home = tmp_path / "agents", tmp_path / "repo", tmp_path / "home"
        for d in (where, repo, home):
            d.mkdir()
        (where / "heartbeat.toml").write_text(config.group(1))
        script = commands.group(1).replace("/srv/repo", str(repo))
        assert script.rstrip().endswith("heartbeat run")
        setup = script.rstrip()[: -len("heartbeat run")]
        workload = Workload(steps=DOCS_STEPS, touches={DOCS_STEPS[0]: "config/prod.yaml"})
        with scripted_model(tmp_path / "model", workload) as model:
            env = {**claude_env(model, home), "LANG": "C.UTF-8",
                   "PATH": f"{BIN}:{claude.parent}:/usr/local/bin:/usr/bin:/bin"}
            r = subprocess.run(["bash", "-ec", setup], cwd=where, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115
            daemon = subprocess.Popen(["bash", "-c", "exec heartbeat run"], cwd=where, env=env, stdout=log,
                                      stderr=subprocess.STDOUT)
            log.close()
            store = FileStore(str(where / "state"))
            try:
                deadline = time.monotonic() + 240
                while store.load("fix-fallback").meta.status.value != "done":
                    assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()[-2000:]
                    assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()[-2000:]
                    time.sleep(0.1)
                baton = store.load("fix-fallback")
                assert baton.done == list(DOCS_STEPS)
                record = model.brain.record.entries()
                assert [e for e in record if e["event"] == "refused"] == []
                assert [e["step"] for e in record if e["event"] == "step_done"] == list(DOCS_STEPS)
                assert not (repo / "config" / "prod.yaml").exists()
                assert [e for e in record if e["event"] == "skipped_touch"]
                kinds = {e.kind for e in store.ledger.events("fix-fallback")}
                assert "session_started" in kinds  # the hook install wrote fired in the daemon's claude
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=30)
                for proc in psutil.process_iter():
                    try:
                        if proc.environ().get("HEARTBEAT_STATE_DIR") == str(where / "state"):
                            proc.kill()
                    except psutil.Error:
                        pass
                store.close()


class TestCompactionInAPersonsSession:
    """/compact in a person's own claude session (no daemon): the hooks hand the state back."""

    def test_the_request_after_compact_carries_intent_constraints_and_step(self, tmp_path: Path) -> None:
        """A person runs claude in the task's workdir (hooks installed, acceptEdits): the session keeps its
        note (the install's permission rules), ends after step 1; `/compact` on it (the model's summary says
        nothing of the task); the next request the model gets holds the SessionStart(compact) hook's
        context with the intent, every constraint and the current step."""
        from scripted_model.anthropic import conversation

        claude = agent_cli("claude")
        tmp_path.chmod(0o700)
        work, home, state = tmp_path / "work", tmp_path / "home", tmp_path / "state"
        work.mkdir()
        home.mkdir()
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state}"\n')
        constraints = ("Do not touch config/prod.yaml", "Keep the public API stable")
        with scripted_model(tmp_path / "model", Workload(steps=DOCS_STEPS)) as model:
            env = {**claude_env(model, home), "LANG": "C.UTF-8", "HEARTBEAT_CONFIG": str(config)}

            def run(*argv: str, stdin: str | None = None) -> list[dict[str, Any]]:
                proc = subprocess.run(argv, input=stdin, cwd=work, env=env, capture_output=True, text=True,
                                      timeout=180)
                assert proc.returncode == 0, proc.stderr[-1000:]
                return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]

            hb = str(BIN / "heartbeat")
            run(hb, "new", "fix", "--task", "Fix the fallback path", "--intent", "Users get blank answers",
                "--step", DOCS_STEPS[0], "--next", DOCS_STEPS[1], *[a for s in DOCS_STEPS for a in ("--plan", s)],
                *[a for c in constraints for a in ("--constraint", c)], "--workdir", str(work))
            # --task: the install's rules that write are per task (for any task, the daemon's agents in this
            # workdir could write each other's notes: tests/external/test_own_task.py)
            run(hb, "hooks", "install", "claude", "--dir", str(work), "--task", "fix")
            person = [str(claude), "-p", "--output-format", "stream-json", "--verbose", "--permission-mode",
                      "acceptEdits"]
            path = model.log_dir / "controls.json"
            path.write_text(json.dumps({"stop_after_step": 1}))
            session = run(*person, stdin="Work on the task in this directory.")[-1]["session_id"]
            assert FileStoreView(state).step("fix") == DOCS_STEPS[1]  # the person's session kept its note
            path.write_text("{}")
            before = len(model.bodies)
            run(*person, "--resume", session, stdin="/compact")
            asked = [conversation(b) for b in model.bodies[before:]]
            assert any("create a detailed summary" in c.texts[-1] for c in asked)
            run(*person, "--resume", session, stdin="Continue with the task.")
            after = [conversation(b) for b in model.bodies[before + len(asked):]]
            first = after[0]
            assert not any("(session startup)" in t for t in first.texts)  # the pre-compact context is gone
            [compact] = [t for t in first.texts if "(session compact)" in t]
            assert "Users get blank answers" in compact and DOCS_STEPS[1] in compact
            assert all(c in compact for c in constraints)
            sources = [e.data.get("source") for e in FileStoreView(state).events("fix", "session_started")]
            assert sources == ["startup", "resume", "compact", "resume"]
            assert FileStoreView(state).status("fix") == "done"


class FileStoreView:
    """Read-only looks at a state dir (a fresh store each time: the person's CLI writes it)."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def _load(self, task: str) -> Any:
        from heartbeat.store.files import FileStore

        store = FileStore(str(self.state))
        try:
            return store.load(task), store.ledger.events(task)
        finally:
            store.close()

    def step(self, task: str) -> str:
        return str(self._load(task)[0].step)

    def status(self, task: str) -> str:
        return str(self._load(task)[0].meta.status.value)

    def events(self, task: str, kind: str) -> list[Any]:
        return [e for e in self._load(task)[1] if e.kind == kind]
