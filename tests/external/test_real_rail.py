"""The rail with the real ``claude`` under the daemon: what the agent's tool calls got back.

The daemon launches the pinned ``claude`` through the ``claude-code`` preset (which passes the
rail with ``--settings``: no ``hooks install``); the CLI talks to the scripted model on
127.0.0.1. Each test is judged by the model's own record, built from the tool results the CLI
sent back (``refused`` with the text the model read), and by the files in the workdir, not by
heartbeat's report.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_clis import agent_cli
from scripted_model import ScriptedModel, Workload, scripted_model, step_file

from tests.external.test_real_sessions import README_ARGS, STEPS, Session

pytestmark = pytest.mark.slow

RAIL = "heartbeat refused"
"""How every refusal of the rail starts, as the model reads it."""


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    # step 2 also writes prod.cfg: a careless model that lost a constraint it read
    with scripted_model(tmp_path / "model", Workload(steps=STEPS, touches={STEPS[1]: "prod.cfg"}),
                        sees_files=False) as m:
        yield m


def refused(s: Session, needle: str = "") -> list[dict[str, Any]]:
    """The calls the rail refused, by the model's record (``needle``: in the reason it read)."""
    return [e for e in s.record() if e["event"] == "refused" and RAIL in e["reason"] and needle in e["reason"]]


def rail_events(s: Session, task: str) -> list[str]:
    return [e.data["rule"] for e in s.h.events(task, "rail_refused")]


def held(s: Session) -> bool:
    return any(e["event"] == "held" for e in s.record())


class TestTheRailStopsTheAgent:
    """A block, a takeover, a guarded path, a stale world: the agent's next tool call is refused."""

    def test_a_block_set_while_the_agent_works_stops_its_next_tool_call(self, tmp_path: Path,
                                                                        model: ScriptedModel) -> None:
        """The model holds its answer after step 1's write; a person blocks the task; released, the
        agent's notes go through (heartbeat's own commands) and its next write, step 2, is refused at
        once, not after the daemon's grace (fails on 4c852cf: step 2 was written after the block)."""
        s = Session(tmp_path, model, args=README_ARGS)
        s.control(hold_after_step=1)
        try:
            s.h.start()
            s.new("blk", "--constraint", "Keep the fallback path")
            s.h.wait(lambda: held(s), "the model holding step 1", timeout=180)
            assert s.h.cli("block", "blk", "--on", "Dana's review of the fallback").returncode == 0
            s.control()
            s.h.wait(lambda: refused(s, "is blocked"), "the rail refusing the agent's next call", timeout=120)
            first = refused(s, "is blocked")[0]
            assert first["kind"] == "write"  # (step 2's first write: the extra file it touches)
            assert "Dana's review of the fallback" in first["reason"]
            assert not (s.work / step_file(1)).exists() and not (s.work / "prod.cfg").exists()
            assert [e["step"] for e in s.record() if e["event"] == "step_done"] == [STEPS[0]]
            notes = [e for e in s.record() if e["event"] == "note" and f'done "{STEPS[0]}"' in e["command"]]
            assert notes and not notes[0]["error"]  # its note, after the block, went through
            assert "not_active" in rail_events(s, "blk")
        finally:
            s.h.close()

    def test_a_superseded_agents_tool_calls_are_refused(self, tmp_path: Path, model: ScriptedModel) -> None:
        """A person takes the task over (``claim --force``) while the agent holds after step 1: the old
        agent's next write is refused as superseded, its side effects stop (fails on 4c852cf: it went
        on writing steps, only its notes fenced)."""
        s = Session(tmp_path, model, args=README_ARGS)
        s.control(hold_after_step=1)
        try:
            s.h.start()
            s.new("zmb")
            s.h.wait(lambda: held(s), "the model holding step 1", timeout=180)
            r = s.h.cli("claim", "zmb", "--force", "--pid", str(os.getpid()))
            assert r.returncode == 0, r.stderr
            s.control()
            s.h.wait(lambda: refused(s, "superseded"), "the rail refusing the zombie's call", timeout=120)
            assert not (s.work / step_file(1)).exists() and not (s.work / step_file(2)).exists()
            assert [e["step"] for e in s.record() if e["event"] == "step_done"] == [STEPS[0]]
            assert "superseded" in rail_events(s, "zmb")
        finally:
            s.h.close()

    def test_a_careless_models_write_to_a_guarded_path_is_refused_and_recorded(
            self, tmp_path: Path, model: ScriptedModel) -> None:
        """The constraint says "Leave prod.cfg alone", which this model does not heed; its guard
        (``--protect prod.cfg``) does: the write is refused, the file never exists, the ledger records it
        (fails on 4c852cf: prod.cfg written)."""
        s = Session(tmp_path, model, args=README_ARGS)
        try:
            s.h.start()
            s.new("grd", "--constraint", "Leave prod.cfg alone", "--protect", "prod.cfg")
            s.h.wait(lambda: refused(s, "protected"), "the rail refusing the write to prod.cfg", timeout=240)
            [refusal] = refused(s, "protected")
            assert refusal["kind"] == "write" and refusal["path"] == str(s.work / "prod.cfg")
            assert "Leave prod.cfg alone" in refusal["reason"]
            assert not (s.work / "prod.cfg").exists()
            assert not [e for e in s.record() if e["event"] == "touched"]
            s.h.wait(lambda: "protected" in rail_events(s, "grd"), "the refusal in the ledger")
            [event] = s.h.events("grd", "rail_refused")
            assert event.data["tool"] == "Write" and event.data["matched"] == "prod.cfg"
        finally:
            s.h.close()

    def test_an_irreversible_command_on_a_stale_world_is_refused_until_verify_is_fresh(
            self, tmp_path: Path, model: ScriptedModel) -> None:
        """The key file changes after the baton was written: the agent's ``git push`` is refused with
        what changed (the rail ran verify: stale). Once the agent's note is written (the world
        fingerprinted again) the same push passes the rail (verify fresh), whatever claude then makes
        of it (fails on 4c852cf: nothing ran verify, the push went to the CLI)."""
        s = Session(tmp_path, model, args=README_ARGS)
        push, again = "git push origin main", "git push origin main --follow-tags"
        try:
            (s.work / "schema.sql").write_text("create table a;\n")
            s.new("irr", "--key-file", "schema.sql")
            (s.work / "schema.sql").write_text("create table b;\n")  # the world moved since the baton
            s.control(probes=[push])
            s.h.start()
            s.h.wait(lambda: refused(s, "stale"), "the rail refusing the push", timeout=240)
            [first] = refused(s, "stale")
            assert first["command"] == push and "schema.sql" in first["reason"]
            s.h.wait(lambda: any(e["event"] == "note" and e["command"].startswith("heartbeat add") and not e["error"]
                                 for e in s.record()), "the agent's note", timeout=120)
            s.control(probes=[push, again])
            s.h.wait(lambda: any(e.get("command") == again for e in s.record()), "the second push", timeout=120)
            [second] = [e for e in s.record() if e.get("command") == again]
            assert RAIL not in second.get("reason", "") + second.get("output", "")
            results = [e.data["result"] for e in s.h.events("irr", "verified") if e.actor == "rail"]
            assert results[0] == "stale" and results[-1] == "fresh", results
        finally:
            s.h.close()
