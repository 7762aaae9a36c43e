"""Needs per edge with the real ``claude`` under the daemon: what the upstream agent was told and refused.

The daemon launches the pinned ``claude`` (the ``claude-code`` preset) for the upstream task; the CLI
talks to the scripted model on 127.0.0.1, which answers a refused ``done`` as its line says (the
``heartbeat add ID PART "..."`` it names, then ``done`` again). Each test is judged by the model's own
record: the tool results the CLI sent back and the brief's needs section the model was given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_clis import agent_cli
from scripted_model import ScriptedModel, Workload, scripted_model

from tests.external.test_real_sessions import README_ARGS, STEPS, Session

pytestmark = pytest.mark.slow


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False) as m:
        yield m


def notes(s: Session, prefix: str) -> list[dict[str, Any]]:
    """The model's heartbeat commands starting with ``prefix``, each with what came back."""
    return [e for e in s.record() if e["event"] == "note" and e["command"].startswith(prefix)]


def _downstream(s: Session, task: str, upstream: str, *extra: str) -> None:
    """A downstream held by a person's gate: only the upstream's agent runs in these tests."""
    r = s.h.cli("new", task, "--task", "Review the fix", "--step", "review", "--after", upstream,
                "--blocked-on", "not run in this test", "--workdir", str(s.work), *extra)
    assert r.returncode == 0, r.stderr


class TestNeedsWithTheRealClaude:
    def test_a_declared_need_refuses_the_upstream_agents_done_until_met(self, tmp_path: Path,
                                                                      model: ScriptedModel) -> None:
        """The downstream needs `rejected`: the agent's first `done` comes back refused with the line naming
        the part, the downstream and the command (the model's record); it runs that command, and its
        second `done` finishes the task (on 4a78701 there is
        no --needs: the downstream cannot be declared)."""
        s = Session(tmp_path, model, args=README_ARGS)
        try:
            s.new("up")
            _downstream(s, "down", "up", "--needs", "rejected")
            s.h.start()
            s.h.wait(lambda: s.status("up") == "done", "the upstream done by its agent", timeout=300)
            again_cmd = 'heartbeat done up --note "all 3 steps done, needs packaged"'
            s.h.wait(lambda: notes(s, again_cmd), "the model's record of its second done", timeout=120)
            first = notes(s, 'heartbeat done up --note "all 3 steps done"')
            assert len(first) == 1 and first[0]["error"]
            assert "down needs `rejected` (declared)" in first[0]["output"]
            assert 'heartbeat add up rejected "..."' in first[0]["output"]
            filled = notes(s, "heartbeat add up rejected")
            assert len(filled) == 1 and not filled[0]["error"]
            again = notes(s, again_cmd)
            assert len(again) == 1 and not again[0]["error"]
            seen = [e for e in s.record() if e["event"] == "brief_needs"]
            assert seen and any("`down` needs `rejected` (declared)" in line for line in seen[0]["lines"])
            assert s.h.events("up", "needs_unmet") and not s.h.events("up", "done_forced")
            assert s.h.baton("up").rejected == ["packaged after the refusal"]
        finally:
            s.h.close()

    def test_a_learned_need_is_in_the_next_brief_and_refuses_the_next_upstreams_done(
            self, tmp_path: Path, model: ScriptedModel) -> None:
        """Two runs' reviews re-derived `rejected` (recorded by hand before the daemon starts): the third
        run's build agent is given the learned need with its evidence in its brief, its `done` is refused on
        it, and it packages `rejected` and finishes (on 4a78701
        nothing is learned: no need_learned event)."""
        s = Session(tmp_path, model, args=README_ARGS)
        try:
            for run in ("p1", "p2"):
                for args in (("new", f"{run}.build", "--task", "Build", "--step", "build", "--intent", "why",
                              "--workdir", str(s.work)),
                             ("new", f"{run}.review", "--task", "Review", "--step", "review", "--after",
                              f"{run}.build", "--workdir", str(s.work)),
                             ("done", f"{run}.build"),
                             ("add", f"{run}.review", "rederived", "rejected: the build had tried Redis"),
                             ("done", f"{run}.review", "--force")):
                    r = s.h.cli(*args)
                    assert r.returncode in (0, 4), r.stderr  # a blocked review cannot be done: that is fine
            [learned] = s.h.events("p2.review", "need_learned")
            evidence = "review re-derived `rejected` in 2 of the last 2 handoffs"
            assert learned.data["evidence"] == evidence
            s.new("p3.build")
            _downstream(s, "p3.review", "p3.build")
            s.h.start()
            s.h.wait(lambda: s.status("p3.build") == "done", "the third build done by its agent", timeout=300)
            again_cmd = 'heartbeat done p3.build --note "all 3 steps done, needs packaged"'
            s.h.wait(lambda: notes(s, again_cmd), "the model's record of its second done", timeout=120)
            assert not notes(s, again_cmd)[0]["error"]
            seen = [e for e in s.record() if e["event"] == "brief_needs"]
            assert seen and any(f"`p3.review` needs `rejected` (learned: {evidence})" in line
                                for line in seen[0]["lines"])
            first = notes(s, 'heartbeat done p3.build --note "all 3 steps done"')
            assert len(first) == 1 and first[0]["error"]
            assert f"p3.review needs `rejected` (learned: {evidence})" in first[0]["output"]
            assert [n["error"] for n in notes(s, "heartbeat add p3.build rejected")] == [False]
            assert s.h.baton("p3.build").rejected == ["packaged after the refusal"]
        finally:
            s.h.close()
