"""Questions across the seam with the real ``claude`` under the daemon, judged by the scripted model.

The daemon launches the pinned ``claude`` (the ``claude-code`` preset) against the scripted model
on 127.0.0.1. The model runs ``heartbeat ask`` as a probe (a tool call the real CLI executes), so
the task is held on its question; what proves the answer reached the next agent is the request
the next run's ``claude`` sent the model (:attr:`ScriptedModel.bodies`), not heartbeat's report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_clis import agent_cli
from scripted_model import ScriptedModel, Workload, scripted_model

from tests.external.test_real_sessions import README_ARGS, STEPS, Session

pytestmark = pytest.mark.slow

QUESTION = "Why was the fallback path kept instead of removed?"
ANSWER = "Removing it broke offline users in March; keep it."
ASK = f'heartbeat ask {{task}} "{QUESTION}"'


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False) as m:
        yield m


def asked(s: Session, task: str) -> list[dict[str, object]]:
    """The model's record of its `heartbeat ask` calls, with what the CLI printed."""
    return [e for e in s.record() if e["event"] == "note" and str(e["command"]).startswith(f"heartbeat ask {task} ")]


class TestTheRealAgentAsks:
    def test_a_person_answers_and_the_next_run_is_briefed_with_it(self, tmp_path: Path,
                                                                 model: ScriptedModel) -> None:
        """claude runs `heartbeat ask` (q1 on stdout), the task is held and its agent ends; a person answers;
        the daemon's next dispatch's request to the model carries "a person answered: ..." and the task
        finishes."""
        s = Session(tmp_path, model, args=README_ARGS)
        s.control(probes=[ASK.format(task="qa")])
        try:
            s.h.start()
            s.new("qa")
            s.h.wait(lambda: asked(s, "qa"), "the agent asking", timeout=240)
            (call,) = asked(s, "qa")
            assert not call["error"] and str(call["output"]).strip() == "q1"
            s.control()  # the next run asks nothing
            s.h.wait(lambda: s.status("qa") == "blocked" and s.h.baton("qa").meta.owner is None,
                     "the task held on its question, its agent ended", timeout=120)
            baton = s.h.baton("qa")
            assert baton.meta.gate is not None and baton.meta.gate.spec() == "question:q1"
            assert s.h.cli("status").stdout.count("waiting on q1 to a person") == 1
            model.bodies.clear()
            r = s.h.cli("answer", "qa", "q1", ANSWER, "--by", "ana")
            assert r.returncode == 0, r.stderr
            s.h.wait(lambda: any(ANSWER in json.dumps(b) for b in model.bodies),
                     "the next run's request carrying the answer", timeout=180)
            carried = next(json.dumps(b) for b in model.bodies if ANSWER in json.dumps(b))
            assert f"You asked a person (q1): {QUESTION} - ana answered: {ANSWER}" in carried
            s.h.wait(lambda: s.status("qa") == "done", "the task finished after the answer", timeout=240)
            assert len(asked(s, "qa")) == 1  # asked once, answered once
            [answered] = s.h.events("qa", "answered")
            assert answered.data["by"] == "person:ana" and answered.data["wait_s"] > 0
        finally:
            s.h.close()

    def test_an_unanswered_question_escalates_to_a_person(self, tmp_path: Path, model: ScriptedModel) -> None:
        """Nobody answers within question_wait: question_escalated, the notifier run with the question, the
        task still held and shown escalated in status."""
        s = Session(tmp_path, model, args=README_ARGS)
        notes = tmp_path / "notified"
        s.h.write_config(s.h.config_text().replace("[daemon]\n", '[daemon]\nquestion_wait = "3s"\n', 1) + f"""
[notify.ops]
command = ["sh", "-c", "printf '%s|%s\\\\n' \\"$0\\" \\"$1\\" >> {notes}", "{{id}}", "{{reason}}"]
""")
        s.control(probes=[ASK.format(task="qe")])
        try:
            s.h.start()
            s.new("qe")
            s.h.wait(lambda: asked(s, "qe"), "the agent asking", timeout=240)
            s.control()
            s.h.wait(lambda: s.h.events("qe", "question_escalated"), "the escalation", timeout=120)
            [event] = s.h.events("qe", "question_escalated")
            assert event.data["qid"] == "q1" and event.data["wait_s"] >= 3
            s.h.wait(lambda: notes.exists() and "qe|question q1 to a person unanswered" in notes.read_text(),
                     "the notifier", timeout=60)
            assert QUESTION in notes.read_text()
            assert s.status("qe") == "blocked"
            line = next(x for x in s.h.cli("status").stdout.splitlines() if x.startswith("qe"))
            assert "waiting on q1 to a person" in line and "escalated to a person" in line
        finally:
            s.h.close()
