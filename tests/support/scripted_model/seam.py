"""A builder and a critic across one handoff: the scripted mind for the learning bench (issue 27).

:class:`SeamBrain` plays both sides of a ``NAME.build → NAME.review`` pipeline, telling which one it
is from the brief's title (``# Brief: NAME.build - ...``). Like :class:`~.brain.Brain` it keeps no
state per session: everything is read back from the conversation the CLI sends.

- **The builder** reads its baton (``heartbeat show ID --json``), writes ``design.md`` in its workdir
  (its decision, the alternative it rejected and why, an unknown), notes the decision and the unknown
  (``heartbeat add ID decisions|unknowns``) and finishes (``heartbeat done``). It leaves the part
  :attr:`Seam.part` (``rejected``) out of its note **unless its conversation says that part is
  required**: its brief saying a downstream needs it (unless :attr:`Seam.reads_needs` is off: a careless
  builder), or a refused ``done`` naming it (then it adds the part and runs ``done`` again).
- **The builder, resumed with a question**: when the conversation holds a prompt that names
  ``heartbeat answer DOWN qN``, it answers from its own earlier conversation (the ``Rejected:`` line
  of the ``design.md`` it wrote in this session) with that command; a session that does not hold that
  write cannot answer from memory and says so. A refused ``answer`` command ends the turn with the
  answer as its last text (the run's result).
- **The critic** reads its baton and its brief's upstream package. When the package names the part
  as missing it asks (``heartbeat ask ID "..." --to upstream``) and ends its turn; a later run whose
  baton holds the answer records the part as re-derived (``heartbeat add ID rederived
  "rejected: ANSWER"``) and goes on. Then it writes ``review.md`` and finishes.

What it records beside :class:`~.brain.Brain`'s tool-result entries (``note`` for every heartbeat
command with its outcome, ``touched`` for each file): one ``request`` entry per request, with the
role, the task, the session, whether the conversation **carried the part** (the pipeline's rejected
alternative, by its exact words: the witness that the package or the answer reached the critic), and
for a builder answering a question whether the request **carried its earlier conversation** (its own
``design.md`` write and ``done``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from .brain import Brain, Call, Conversation, Record, Reply, Workload, _shell, _write

__all__ = ["Seam", "SeamBrain", "title_task"]

_TITLE = re.compile(r"^# Brief: (\S+) - ", re.MULTILINE)
_ANSWER = re.compile(r"heartbeat answer ([A-Za-z0-9][A-Za-z0-9._-]*) (q\d+)\b")
_UPSTREAM = re.compile(r"^## Upstream handoff: (\S+)", re.MULTILINE)
_MISSING = re.compile(r"_Missing from this package \(not recorded by (\S+?)\): ([^_\n]+)_")


@dataclass(frozen=True)
class Seam:
    """The handoff's facts: the part the builder leaves out, and the words of each pipeline's."""

    part: str = "rejected"
    reads_needs: bool = True
    """False: a careless builder, deaf to what its brief says a downstream needs (only a refused
    ``done`` that names the part makes it add the part)."""

    def decision(self, pipeline: str) -> str:
        return f"{pipeline}: key the response cache by user id"

    def alternative(self, pipeline: str) -> str:
        """The rejected alternative, by exact words (the witness looks for them)."""
        return f"{pipeline}: keying the cache by URL, rejected because two users would share one entry"

    def unknown(self, pipeline: str) -> str:
        return f"{pipeline}: the eviction size under load"


def title_task(conv: Conversation) -> str:
    """The task of the conversation's first brief (``# Brief: ID - TASK``), or ""."""
    for text in conv.texts:
        m = _TITLE.search(text)
        if m:
            return m.group(1)
    return ""


class SeamBrain(Brain):
    """Decides each turn of a builder or a critic (see the module docstring)."""

    def __init__(self, record: Record, *, seam: Seam | None = None, controls: Any = None) -> None:
        super().__init__(Workload(steps=()), record, controls=controls, sees_files=False)
        self.seam = seam or Seam()

    def decide(self, conv: Conversation) -> Reply:
        task = title_task(conv)
        if conv.tools and task:
            self._seen(conv, task)
        return super().decide(conv)

    def _next(self, conv: Conversation) -> Reply:
        task = title_task(conv)
        if not task:
            return Reply(text="No task in this conversation.")
        question = self._question(conv)
        if question is not None:
            return self._answer(conv, task, *question)
        baton = self._baton(conv, task)
        if baton is None:
            return _shell("Read the task's baton", f"heartbeat show {task} --json")
        if task.endswith(".review"):
            return self._critic(conv, task, baton)
        return self._builder(conv, task, baton)

    # -- the witness ---------------------------------------------------------------------------

    def _seen(self, conv: Conversation, task: str) -> None:
        pipeline = task.split(".", 1)[0]
        question = self._question(conv)
        role = "answer" if question is not None else ("critic" if task.endswith(".review") else "builder")
        entry: dict[str, Any] = {"role": role, "task": task, "pipeline": pipeline, "session": conv.session,
                                 "carried": self.seam.alternative(pipeline) in conv.text,
                                 "calls": len(conv.calls)}
        if role == "builder":
            entry["required"] = self._brief_requires(conv)
        if question is not None:
            entry["history"] = self._design(conv, task) is not None and any(
                c.command.startswith(f"heartbeat done {task} ") for c in conv.calls)
            entry["asker"], entry["qid"] = question
        self.record.write("request", **entry)

    # -- the builder ---------------------------------------------------------------------------

    def _design(self, conv: Conversation, task: str) -> Call | None:
        """This session's own write of ``design.md``, when the conversation holds it."""
        for call in conv.calls:
            result = conv.results.get(call.id)
            if call.path.endswith("/design.md") and result is not None and not result.is_error:
                return call
        return None

    def _brief_requires(self, conv: Conversation) -> bool:
        """Whether the brief says a downstream needs the part (a line naming `PART` and a need)."""
        part = f"`{self.seam.part}`"
        return any(part in line and re.search(r"\bneed", line, re.IGNORECASE)
                   for text in conv.texts for line in text.splitlines())

    def _required(self, conv: Conversation) -> bool:
        """Whether the conversation says the part is required: the brief, or a refused ``done``."""
        if self.seam.reads_needs and self._brief_requires(conv):
            return True
        return any(self._refused_for_part(conv, c) for c in conv.calls)

    def _refused_for_part(self, conv: Conversation, call: Call) -> bool:
        result = conv.results.get(call.id)
        return (call.command.startswith("heartbeat done ") and result is not None and result.is_error
                and self.seam.part in result.text)

    def _builder(self, conv: Conversation, task: str, baton: dict[str, Any]) -> Reply:
        pipeline = task.split(".", 1)[0]
        seam = self.seam
        workdir = str(baton.get("workdir") or self._cwd(conv))
        design = self._design(conv, task)
        if design is None:
            text = (f"# Design of {pipeline}\nDecision: {seam.decision(pipeline)}\n"
                    f"Rejected: {seam.alternative(pipeline)}\nUnknown: {seam.unknown(pipeline)}\n")
            return _write(os.path.join(workdir, "design.md"), text, conv, text="Writing the design.")
        issued = [c.command for c in conv.calls]
        for command in (f'heartbeat add {task} decisions "{seam.decision(pipeline)}"',
                        f'heartbeat add {task} unknowns "{seam.unknown(pipeline)}"'):
            if command not in issued:
                return _shell("Record the handoff", command)
        add_part = f'heartbeat add {task} {seam.part} "{seam.alternative(pipeline)}"'
        if self._required(conv) and add_part not in issued:
            return _shell(f"Record the {seam.part} part a downstream needs", add_part)
        finish = f'heartbeat done {task} --note "built {pipeline}; the design is in design.md"'
        dones = [c for c in conv.calls if c.command == finish]
        if not dones:
            return _shell("Mark the task done", finish)
        last = conv.results.get(dones[-1].id)
        if last is not None and not last.is_error:
            return Reply(text=f"{task} is done and handed off.")
        # a refused done: once the part is added after it (the refusal names it), done again
        last_done = max(i for i, command in enumerate(issued) if command == finish)
        if add_part in issued and issued.index(add_part) > last_done:
            return _shell("Mark the task done again", finish)
        reason = last.text.strip().splitlines()[0] if last is not None and last.text.strip() else "refused"
        return Reply(text=f"Stopping: done was refused ({reason[:200]}).")

    # -- the builder, resumed with a question ---------------------------------------------------

    def _question(self, conv: Conversation) -> tuple[str, str] | None:
        """The (asker, qid) of a question put to this session and not answered in it yet."""
        asked = None
        for text in conv.texts:
            for m in _ANSWER.finditer(text):
                asked = (m.group(1), m.group(2))
        if asked is None or asked[0] == title_task(conv):
            return None  # (an asker's own brief may name the command a person answers with)
        return asked

    def _answer(self, conv: Conversation, task: str, asker: str, qid: str) -> Reply:
        design = self._design(conv, task)
        line = next((x[len("Rejected: "):] for x in design.content.splitlines() if x.startswith("Rejected: ")),
                    None) if design is not None else None
        answer = line or "I have no record of that in this session."
        command = f'heartbeat answer {asker} {qid} "{answer}"'
        calls = [c for c in conv.calls if c.command == command]
        if not calls:
            return _shell("Answer the downstream's question", command)
        result = conv.results.get(calls[-1].id)
        if result is not None and not result.is_error:
            return Reply(text=f"Answered {asker}'s {qid}.")
        return Reply(text=answer)  # the command was refused: the run's result is the answer

    # -- the critic ----------------------------------------------------------------------------

    def _gap(self, conv: Conversation) -> str:
        """The upstream whose package (in the brief) names the part missing, or ""."""
        for text in conv.texts:
            for m in _MISSING.finditer(text):
                if self.seam.part in [p.strip() for p in m.group(2).split(",")]:
                    return m.group(1)
        return ""

    def _critic(self, conv: Conversation, task: str, baton: dict[str, Any]) -> Reply:
        seam = self.seam
        workdir = str(baton.get("workdir") or self._cwd(conv))
        issued = [c.command for c in conv.calls]
        upstream = self._gap(conv)
        if upstream:
            questions = [q for q in baton.get("questions") or () if isinstance(q, dict)]
            answered = [q for q in questions if str(q.get("answer") or "").strip()]
            ask = f'heartbeat ask {task} "Which alternatives did {upstream} reject, and why?" --to upstream'
            asks = [c for c in conv.calls if c.command == ask]
            if answered:
                rederive = f'heartbeat add {task} rederived "{seam.part}: {answered[-1]["answer"]}"'
                if rederive not in issued:
                    return _shell("Record the part the upstream's package lacked", rederive)
            elif not questions and not asks:
                return _shell("Ask the upstream what its package left out", ask)
            elif asks and conv.results.get(asks[-1].id) is not None and not conv.results[asks[-1].id].is_error:
                return Reply(text=f"Asked {upstream}; waiting for the answer.")
            elif questions:
                return Reply(text="Still waiting for the answer to my question.")
            elif f'heartbeat add {task} rederived "{seam.part}: unknown"' not in issued:
                return _shell("Note the gap the question could not fill",
                              f'heartbeat add {task} rederived "{seam.part}: unknown"')
        review = os.path.join(workdir, "review.md")
        if not any(c.path == review for c in conv.calls):
            return _write(review, f"# Review of {task}\nApproved.\n", conv, text="Writing the review.")
        finish = f'heartbeat done {task} --note "reviewed"'
        if finish not in issued:
            return _shell("Mark the review done", finish)
        return Reply(text=f"{task} is done.")

