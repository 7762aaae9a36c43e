"""The SessionStart context with one field too long for it (issue 24, item 10): the long field is cut,
the essentials stay."""

from __future__ import annotations

from pathlib import Path

from heartbeat.integrations.hooks import context_length, session_context
from heartbeat.model import defaults
from heartbeat.store.files import FileStore
from tests.external.test_hook_context import CONSTRAINTS, big_task, load


def test_a_long_intent_is_cut_and_the_constraints_and_step_kept(tmp_path: Path) -> None:
    """A 9,500-character intent: the context fits, holds every constraint, the step and next step and
    the note-keeping commands, and the intent's start, saying where it was cut. Before: a 412-character
    pointer holding none of them."""
    state, work = tmp_path / "state", tmp_path / "work"
    state.mkdir(mode=0o700)
    work.mkdir()
    task_id = big_task(state, work)
    store = FileStore(str(state))
    try:
        with store.edit(task_id, actor="test") as ed:
            ed.baton.intent = "Cut broker costs by 60% " + "and keep every message in flight " * 290
    finally:
        store.close()
    baton = load(state, task_id)
    assert len(baton.intent) > 9_500
    text = session_context(baton, "startup", {})
    assert context_length(text) <= defaults.CLAUDE_HOOK_CONTEXT_LIMIT
    for c in CONSTRAINTS:
        assert c in text, c
    assert "Replay the dead-letter queue" in text and "Switch the consumers over" in text
    assert "Cut broker costs by 60%" in text and f"characters in all, the whole in `heartbeat brief {task_id}`" in text
    for command in (f"heartbeat set {task_id} step=", f"heartbeat add {task_id} done", f"heartbeat done {task_id}"):
        assert command in text, command
