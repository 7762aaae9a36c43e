"""Questions across the seam with the real ``claude`` (issue 27, item 3): the builder's resumed session answers.

A builder → critic pipeline under a real daemon, both tasks run by the pinned ``claude`` through
the ``claude-code`` preset against the scripted model on 127.0.0.1. The builder does its steps
and ``done``; the critic's session runs ``heartbeat ask critic "..." --to upstream`` and ends its
turn; the daemon resumes the builder's recorded session with the question. What happened is read
from the scripted model's own record and the requests it got: the resumed request carries the
builder's earlier conversation and the question, and the critic's next dispatch carries the
exchange.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_clis import agent_cli
from scripted_model import ScriptedModel, Workload, scripted_model

from tests.external.test_real_sessions import README_ARGS, STEPS, Session

pytestmark = pytest.mark.slow

QUESTION = "Why did you keep the retry loop in the client?"


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS), sees_files=False) as m:
        yield m


def texts(body: dict[str, Any]) -> str:
    return json.dumps(body.get("messages") or [])


def pipeline(tmp_path: Path, model: ScriptedModel) -> Session:
    s = Session(tmp_path, model, args=README_ARGS)
    s.control(ask={"task": "critic", "text": QUESTION})
    s.h.start()
    s.new("build")
    s.new("critic", "--after", "build")
    return s


def question_seen(s: Session) -> list[dict[str, Any]]:
    return [e for e in s.record() if e["event"] == "question_seen"]


class TestTheBuildersSessionAnswers:
    """The critic asks; the daemon resumes the builder's own session; the answer reaches the critic."""

    @pytest.mark.parametrize("by_command", [False, True], ids=["final-text", "heartbeat-answer"])
    def test_the_resumed_builder_answers_and_the_critic_goes_on(self, tmp_path: Path, model: ScriptedModel,
                                                                by_command: bool) -> None:
        """The scripted model's record: the builder's steps, then a ``question_seen`` in the builder's
        session whose request holds its own earlier step writes and the question; q1's answer (the
        run's last text, or its ``heartbeat answer``) names those steps, by ``upstream:build``; the
        builder's baton keeps its epoch, attempt and done; a probe of the resumed session (a shell
        command) is refused by the rail; the critic's next dispatch's request carries the exchange
        and the critic finishes its steps without asking again."""
        s = pipeline(tmp_path, model)
        try:
            if by_command:
                s.control(ask={"task": "critic", "text": QUESTION}, answer_by_command=True)
            s.h.wait(lambda: s.status("build") == "done", "the builder finishing", timeout=300)
            if by_command:  # a shell command the resumed session tries after its answer (not the builder's own)
                s.control(ask={"task": "critic", "text": QUESTION}, answer_by_command=True, probes=["touch stray"])
            build = s.h.wait(lambda: (b := s.h.baton("build")).meta.owner is None and b.meta.session and b,
                             "the builder's run settled, its session recorded", timeout=60)
            epoch, attempt, session = build.meta.epoch, build.meta.attempt, build.meta.session
            s.h.wait(lambda: question_seen(s), "the builder's resumed session asked", timeout=240)
            seen = question_seen(s)[0]
            assert seen["session"] == session and seen["upstream"] == "build" and seen["qid"] == "q1"
            assert seen["steps_in_context"] == ["01.txt", "02.txt", "03.txt"], seen
            assert QUESTION in seen["question"]
            s.h.wait(lambda: s.h.baton("critic").questions and not s.h.baton("critic").questions[0].open,
                     "q1 answered", timeout=240)
            q = s.h.baton("critic").questions[0]
            assert q.answered_by == "upstream:build" and "01.txt, 02.txt, 03.txt" in q.answer, q
            [ended] = s.h.wait(lambda: s.h.events("build", "answer_run"), "the answering run's end", timeout=120)
            assert ended.data["outcome"] == ("answered" if by_command else "answered_from_result")
            after = s.h.baton("build")
            assert (after.meta.status.value, after.meta.epoch, after.meta.attempt) == ("done", epoch, attempt)
            if by_command:
                probes = [e for e in s.record() if e["event"] == "refused" and e["command"] == "touch stray"]
                assert probes and "done" in probes[0]["reason"], s.record()
            s.h.wait(lambda: s.status("critic") == "done", "the critic finishing", timeout=300)
            critic_steps = [e for e in s.record() if e["event"] == "step_done" and e.get("task") == "critic"]
            assert [e["step"] for e in critic_steps] == list(STEPS)
            asks = [e for e in s.record() if e["event"] == "note" and e["command"].startswith("heartbeat ask critic")]
            assert len(asks) == 1 and not asks[0]["error"], asks
            later = [b for b in model.bodies if "heartbeat show critic" in json.dumps(b)
                     and q.answer in texts(b) and QUESTION in texts(b)]
            assert later, "no request of the critic's next dispatch carries the exchange"
        finally:
            s.h.close()


class TestCodexExecResume:
    """The same seam with the real ``codex``: the builder's thread is resumed with ``exec resume ID -``."""

    def test_the_builder_s_codex_thread_answers_a_person_s_question_for_the_critic(
            self, tmp_path: Path) -> None:
        """A builder run by codex finishes; a person asks for the critic (``heartbeat ask critic ... --to
        upstream``); the daemon resumes the builder's codex thread: the model's record shows the resumed
        request holding the thread's own step writes and the question, and codex's last agent message
        becomes q1's answer by ``upstream:build``; the builder's epoch and attempt stay."""
        from daemon_harness import DaemonHarness, toml_list
        from scripted_model.responses import codex_args

        from tests.external.test_codex import NO_TMP, codex_env

        codex = agent_cli("codex")
        root = tmp_path
        root.chmod(0o700)
        for name in ("work", "home/.codex"):
            (root / name).mkdir(parents=True)
        steps = STEPS
        with scripted_model(root / "model", Workload(steps=steps), sees_files=False, wires=("responses",)) as model:
            env = codex_env(root)
            args = ["--sandbox", "workspace-write", "-c", "allow_login_shell=false", *NO_TMP, *codex_args(model.url)]
            extra = f"""
[launchers.codex]
preset = "codex"
program = "{codex}"
args = {toml_list(args)}
inherit_env = ["LANG"]
env = {{ PATH = "{env['PATH']}", HOME = "{env['HOME']}", CODEX_HOME = "{env['CODEX_HOME']}", SCRIPTED_KEY = "sk-scripted" }}

[launchers.sleeper]
command = ["sleep", "600"]
stop_grace = "1s"
"""
            h = DaemonHarness(root, extra=extra, stall_after="180s", max_attempts=2)
            try:
                h.start()
                for task, more in (("build", ["--launcher", "codex"]),
                                   ("critic", ["--launcher", "sleeper", "--after", "build"])):
                    r = h.cli("new", task, "--task", "Fix empty responses", "--step", steps[0], "--next", steps[1],
                              *[a for st in steps for a in ("--plan", st)], "--workdir", str(root / "work"), *more)
                    assert r.returncode == 0, r.stderr
                h.wait(lambda: h.baton("build").meta.status.value == "done", "the builder finishing", timeout=300)
                h.wait(lambda: h.baton("critic").meta.status.value == "active", "the critic starting", timeout=60)
                build = h.wait(lambda: (b := h.baton("build")).meta.owner is None and b.meta.session and b,
                               "the builder's run settled, its thread recorded", timeout=60)
                r = h.cli("ask", "critic", QUESTION, "--to", "upstream")
                assert r.returncode == 0 and r.stdout.strip() == "q1", r.stderr
                h.wait(lambda: not h.baton("critic").questions[0].open, "q1 answered", timeout=240)
                seen = [e for e in model.brain.record.entries() if e["event"] == "question_seen"]
                assert seen and seen[0]["session"] == build.meta.session, seen
                assert seen[0]["steps_in_context"] == ["01.txt", "02.txt", "03.txt"], seen
                q = h.baton("critic").questions[0]
                assert q.answered_by == "upstream:build" and "01.txt, 02.txt, 03.txt" in q.answer, q
                [ended] = h.wait(lambda: h.events("build", "answer_run"), "the run's end", timeout=60)
                assert ended.data["outcome"] == "answered_from_result", ended.data
                after = h.baton("build")
                assert (after.meta.epoch, after.meta.attempt, after.meta.status.value) == \
                    (build.meta.epoch, build.meta.attempt, "done")
            finally:
                h.close()
