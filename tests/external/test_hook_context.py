"""The SessionStart hook's context fits the CLI's limit (issue 16, item 4).

Claude Code passes a hook's ``additionalContext`` on whole up to a limit and replaces a longer
one with a ~2 KB preview and a file path. The pinned release's limit is measured here with the
real ``claude`` against the scripted model (what the model receives), and the hook's context is
kept under it: essentials first, never cut, the rest by reference.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_clis import agent_cli
from conftest import clean_env
from scripted_model import ScriptedModel, Workload, scripted_model

from heartbeat.integrations.claude import install_claude
from heartbeat.integrations.hooks import command_prefix, context_length, session_context
from heartbeat.model import defaults
from heartbeat.model.baton import Baton
from heartbeat.reports.brief import render_brief
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks

BIN = Path(sys.executable).parent
PREVIEW = "<persisted-output>"
"""What claude 2.1.332 puts around the preview of a hook context over its limit."""

CONSTRAINTS = [f"Constraint {i:02d}: do not change the wire format of message type {i} without a migration"
               for i in range(12)]


def big_task(state: Path, work: Path, task_id: str = "big", *, constraints: list[str] = CONSTRAINTS) -> str:
    """A task three days in: dozens of steps done, decisions, rejected ideas and key files, blocked.
    Its whole brief is about 14 KB (the size that lost its tail to the CLI's preview)."""
    store = FileStore(str(state))
    try:
        tasks.new_task(store, task_id, task="Migrate the message bus to the new broker",
                       intent="Cut broker costs by 60% without losing a message in flight",
                       step="Replay the dead-letter queue", next_step="Switch the consumers over",
                       workdir=str(work), constraints=constraints,
                       key_files=[f"src/bus/module_{i:02d}.py" for i in range(30)],
                       plan=[f"Step {i:02d} of the migration, with its checks" for i in range(40)],
                       blocked_on="waiting for the ops team to open port 5671")
        with store.edit(task_id, actor="test") as ed:
            b = ed.baton
            b.done = [f"Step {i:02d} of the migration, with its checks" for i in range(25)]
            b.decisions = [f"Decision {i:02d}: kept the old serializer for topic group {i} because the consumers "
                           f"pin its byte layout; revisit once every consumer runs version 4 or later" for i in range(42)]
            b.rejected = [f"Rejected {i:02d}: dual-writing both brokers for group {i} doubles the cost" for i in range(20)]
            b.unknowns = [f"Unknown {i:02d}: whether partition {i} keeps its order across the switch" for i in range(10)]
    finally:
        store.close()
    return task_id


def load(state: Path, task_id: str) -> Baton:
    store = FileStore(str(state))
    try:
        return store.load(task_id)
    finally:
        store.close()


def assert_essentials(text: str, task_id: str, constraints: list[str] = CONSTRAINTS) -> None:
    """Intent, every constraint, the step, the next step, the block and the note-keeping commands."""
    assert "Cut broker costs by 60% without losing a message in flight" in text
    for c in constraints:
        assert c in text, c
    assert "Replay the dead-letter queue" in text and "Switch the consumers over" in text
    assert "waiting for the ops team to open port 5671" in text
    for command in (f"heartbeat set {task_id} step=", f"heartbeat add {task_id} done", f"heartbeat done {task_id}",
                    f"heartbeat verify {task_id}", f"heartbeat brief {task_id}"):
        assert command in text, command


class TestHookContextFits:
    """The hook's context stays under the CLI's limit with its essentials whole."""

    def test_the_default_budget_is_under_the_limit(self) -> None:
        """HOOK_BRIEF_BUDGET tokens (4 bytes each, at least one UTF-16 unit per byte) leave room for the
        hook's own lines under CLAUDE_HOOK_CONTEXT_LIMIT; the launcher's brief budget would not."""
        assert defaults.HOOK_BRIEF_BUDGET * 4 + 1000 <= defaults.CLAUDE_HOOK_CONTEXT_LIMIT
        assert defaults.BRIEF_BUDGET * 4 > defaults.CLAUDE_HOOK_CONTEXT_LIMIT  # why the hook has its own

    def test_a_big_brief_keeps_its_essentials_and_names_the_rest(self, tmp_path: Path) -> None:
        """A 14 KB brief: the context is under the limit, carries every essential, and sends the agent
        to `heartbeat brief ID` and its brief file for what was left out (fails on c684e38: the hook
        gave the whole 14 KB brief, which the CLI swapped for a preview)."""
        state, work = tmp_path / "state", tmp_path / "work"
        state.mkdir(mode=0o700)
        work.mkdir()
        task_id = big_task(state, work)
        baton = load(state, task_id)
        assert len(render_brief(baton).text) > 13_000
        env = {"HEARTBEAT_TASK": task_id, "HEARTBEAT_BRIEF": str(state / "logs" / task_id / "3.brief.md")}
        text = session_context(baton, "startup", env)
        assert context_length(text) <= defaults.CLAUDE_HOOK_CONTEXT_LIMIT
        assert_essentials(text, task_id)
        assert "_Left out to fit" in text and env["HEARTBEAT_BRIEF"] in text
        # the commands come before the context that may be cut
        assert text.index(f"heartbeat add {task_id} done") < text.index("## Context")

    def test_essentials_over_the_limit_point_at_the_whole_brief(self, tmp_path: Path) -> None:
        """Constraints alone over the limit: the context says how many and where to read them, within the
        limit, instead of letting the CLI cut them into a preview."""
        state, work = tmp_path / "state", tmp_path / "work"
        state.mkdir(mode=0o700)
        work.mkdir()
        many = [f"Constraint {i:03d}: " + "never " * 30 + "do this" for i in range(80)]
        task_id = big_task(state, work, constraints=many)
        text = session_context(load(state, task_id), "compact", {})
        assert context_length(text) <= defaults.CLAUDE_HOOK_CONTEXT_LIMIT
        assert f"its {len(many)} constraints" in text and f"`heartbeat brief {task_id}`" in text

    def test_a_long_command_prefix_is_counted_too(self, tmp_path: Path) -> None:
        """Hooks installed with a long --state-dir/--config print every command with it: the context
        still fits, every command carries the prefix, and the essentials stay whole."""
        state, work = tmp_path / "state", tmp_path / "work"
        state.mkdir(mode=0o700)
        work.mkdir()
        task_id = big_task(state, work)
        prefix = "heartbeat --state-dir /srv/" + "very-long-directory-name/" * 8 + "state"
        text = session_context(load(state, task_id), "startup", {}, prefix=prefix)
        assert context_length(text) <= defaults.CLAUDE_HOOK_CONTEXT_LIMIT
        assert f"`{prefix} add {task_id} done" in text and "`heartbeat add" not in text
        assert_essentials(text.replace(prefix, "heartbeat"), task_id)

    def test_the_limit_is_counted_as_the_cli_counts(self, tmp_path: Path) -> None:
        """Characters outside the BMP count twice (JavaScript's length), so emoji cannot push it over."""
        assert context_length("a😀é") == 4
        state, work = tmp_path / "state", tmp_path / "work"
        state.mkdir(mode=0o700)
        work.mkdir()
        emoji = [f"Constraint {i}: 🚫 " + "😀" * 100 for i in range(20)]
        task_id = big_task(state, work, constraints=emoji)
        text = session_context(load(state, task_id), "startup", {})
        assert context_length(text) <= defaults.CLAUDE_HOOK_CONTEXT_LIMIT


# -- with the real CLI ----------------------------------------------------------------------

def claude_env(model: ScriptedModel, home: Path) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith(("ANTHROPIC_", "CLAUDE", "HEARTBEAT_"))}
    env.update(PATH=f"{BIN}:/usr/local/bin:/usr/bin:/bin", HOME=str(home), ANTHROPIC_BASE_URL=model.url,
               ANTHROPIC_API_KEY="sk-scripted-model", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
               DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1")
    return env


def run_claude(model: ScriptedModel, work: Path, home: Path) -> str:
    """One ``claude -p`` turn in ``work``; the text of the first request the model received."""
    before = len(model.bodies)
    proc = subprocess.run([str(agent_cli("claude")), "-p", "--output-format", "stream-json", "--verbose"],
                          input="Say OK.", text=True, capture_output=True, cwd=str(work),
                          env=claude_env(model, home), timeout=180)
    assert len(model.bodies) > before, f"exit {proc.returncode}: {proc.stderr[-500:]}"
    return json.dumps(model.bodies[before], ensure_ascii=False)


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=("Answer",)), sees_files=False) as m:
        yield m


def echo_hook(work: Path, length: int) -> None:
    """A SessionStart hook whose context is ``length`` units: BEGIN, filler lines, END."""
    script = work.parent / "echo_hook.py"
    script.write_text(
        "import json, sys\n"
        "n = int(sys.argv[1])\n"
        "body = 'BEGIN-MARK ' + ''.join(f'filler line {i:05d}.\\n' for i in range(n // 18 + 2))\n"
        "body = body[: n - len(' END-MARK')] + ' END-MARK'\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'SessionStart', 'additionalContext': body}}))\n")
    settings = work / ".claude" / "settings.json"
    settings.parent.mkdir(exist_ok=True)
    command = f"{sys.executable} {script} {length}"
    settings.write_text(json.dumps({"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": command}]}]}}))


@pytest.mark.slow
class TestWithTheRealCLI:
    """What the model receives from the pinned ``claude``, through the scripted model's request log."""

    def test_the_pinned_release_passes_exactly_the_limit(self, tmp_path: Path, model: ScriptedModel) -> None:
        """A context of CLAUDE_HOOK_CONTEXT_LIMIT units reaches the model whole; one more is swapped for a
        preview (the measurement behind the default; a new pin that moves the limit fails here)."""
        home = tmp_path / "home"
        home.mkdir()
        seen = {}
        for length in (defaults.CLAUDE_HOOK_CONTEXT_LIMIT, defaults.CLAUDE_HOOK_CONTEXT_LIMIT + 1):
            work = tmp_path / f"w{length}"
            work.mkdir()
            echo_hook(work, length)
            request = run_claude(model, work, home)
            assert "BEGIN-MARK" in request
            seen[length] = ("END-MARK" in request, PREVIEW in request)
        assert seen == {defaults.CLAUDE_HOOK_CONTEXT_LIMIT: (True, False),
                        defaults.CLAUDE_HOOK_CONTEXT_LIMIT + 1: (False, True)}

    def test_a_big_brief_reaches_the_model_with_every_essential(self, tmp_path: Path, model: ScriptedModel) -> None:
        """`hooks install claude` in a task's workdir, a 14 KB brief: the model's first request holds the
        intent, every constraint, the step, the next step, the block and the note-keeping commands, and
        no preview (fails on c684e38: the context was previewed, its tail and the commands lost)."""
        state, work, home = tmp_path / "state", tmp_path / "work", tmp_path / "home"
        state.mkdir(mode=0o700)
        work.mkdir()
        home.mkdir()
        task_id = big_task(state, work)
        install_claude(str(work), state_dir=str(state))
        request = run_claude(model, work, home)
        assert PREVIEW not in request
        prefix = command_prefix(str(state))  # the hook prints its commands with the --state-dir it was given
        assert f"{prefix} add {task_id} done" in request
        assert_essentials(request.replace(prefix, "heartbeat"), task_id)
