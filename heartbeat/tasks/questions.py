"""Questions across the seam: a task asks its upstream (or a person) and waits on the answer.

``ask`` writes the question into the asking task's baton (``[[questions]]``) and holds the task
on the gate ``question:QID``; ``answer`` writes the answer there and, once no question the gate
names is open, lifts the gate in the same write (``unblocked``, ``gate_opened = question:...``).
The daemon finds the questions addressed to an upstream that were not sent yet
(:func:`pending_upstream`), starts the upstream's answering run and marks them sent
(:func:`mark_sent`), and re-addresses those unanswered past ``question_wait`` to a person
(:func:`escalate`).

Who may write: the asking task's own agent asks (fenced by its epoch, like every write); a person
answers; and the agent of the upstream a question is addressed to may answer it, fenced by *its own*
task's epoch: the one write across tasks an agent may make, and only to that question.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from heartbeat.model import defaults
from heartbeat.model.baton import (
    FINISHED_STATUSES,
    ID_PATTERN,
    Baton,
    Gate,
    GateKind,
    Question,
    QuestionTo,
    Status,
    check_id,
)
from heartbeat.model.errors import BadInput, Conflict, NotActive
from heartbeat.model.ledger import EventKind
from heartbeat.store.base import Edit, Store, check_fence

__all__ = [
    "PERSON",
    "UPSTREAM_BY",
    "Waiting",
    "ask",
    "answer",
    "mark_sent",
    "escalate",
    "open_questions",
    "waiting_on",
    "pending_upstream",
    "overdue",
    "check_text",
    "default_to",
]

PERSON = "person"
"""``answered_by`` of a person's answer (``person:NAME`` when the person gave a name)."""

UPSTREAM_BY = "upstream:"
"""The prefix of ``answered_by`` for an answer from the upstream task (its resumed session or agent)."""

def check_text(text: object, *, what: str, limit: int, task_id: str | None = None) -> str:
    """``text`` if it is a question's or an answer's text, else one-line :class:`BadInput`:
    not text, empty, over ``limit`` characters, a control character other than newline and tab,
    or a byte that is not UTF-8."""
    if not isinstance(text, str):
        raise BadInput(f"the {what} must be text, got {type(text).__name__}", task=task_id, field=what)
    if not text.strip():
        raise BadInput(f"the {what} is empty", task=task_id, field=what)
    if len(text) > limit:
        raise BadInput(f"the {what} is {len(text)} characters, over {limit}", task=task_id, field=what)
    bad = next((c for c in text if (ord(c) < 32 and c not in "\n\t") or 127 <= ord(c) < 160), None)
    if bad is not None:
        raise BadInput(f"the {what} holds a control character ({bad!r}): write plain text", task=task_id,
                       field=what)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"the {what} holds text that is not valid UTF-8", task=task_id, field=what) from None
    return text


def default_to(baton: Baton) -> QuestionTo:
    """Whom a question goes to when the asker does not say: its upstream when it has exactly one."""
    return QuestionTo.UPSTREAM if len(baton.after) == 1 else QuestionTo.PERSON


def _addressee(baton: Baton, to: QuestionTo | str | None, upstream: str | None) -> tuple[QuestionTo, str]:
    task_id = baton.id
    if to is None:
        to = QuestionTo.UPSTREAM if upstream else default_to(baton)
    try:
        to = QuestionTo(to)
    except ValueError:
        raise BadInput(f"--to {str(to)[:40]!r}: use upstream or person", task=task_id, field="--to") from None
    if to is QuestionTo.PERSON:
        if upstream:
            raise BadInput("--upstream names the upstream of --to upstream, not of a person", task=task_id,
                           field="--upstream")
        return to, ""
    if not baton.after:
        raise BadInput("the task has no upstream (no `after`): ask a person (--to person)", task=task_id,
                       field="--to")
    if upstream:
        check_id(upstream)
        if upstream not in baton.after:
            raise BadInput(f"{upstream!r} is not an upstream of this task (after: {', '.join(baton.after)})",
                           task=task_id, field="--upstream")
        return to, upstream
    if len(baton.after) > 1:
        raise BadInput(f"the task has upstreams {', '.join(baton.after)}: name one (--upstream UP)", task=task_id,
                       field="--upstream")
    return to, baton.after[0]


def _next_id(baton: Baton) -> str:
    return f"q{max((int(q.id[1:]) for q in baton.questions), default=0) + 1}"


def ask(store: Store, task_id: str, text: str, *, to: QuestionTo | str | None = None, upstream: str | None = None,
        epoch: int | None = None, now: datetime | None = None, actor: str = "") -> str:
    """Ask a question and hold the task on ``question:QID``; returns the new question's id.

    ``to`` None: the task's upstream when it has exactly one (``after``), else a person. ``to =
    upstream`` with several upstreams needs ``upstream``. A task asks while active or snoozed, or
    while it already waits on a question (the gate then names both); otherwise :class:`NotActive`.
    """
    check_id(task_id)
    check_text(text, what="question", limit=defaults.MAX_QUESTION_CHARS, task_id=task_id)
    with store.edit(task_id, epoch=epoch, actor=actor, now=now) as ed:
        baton, meta = ed.baton, ed.baton.meta
        gate = meta.gate
        waiting = meta.status is Status.BLOCKED and gate is not None and gate.kind is GateKind.QUESTION
        if meta.status not in (Status.ACTIVE, Status.SNOOZED) and not waiting:
            held = f" on {baton.blocked_on[:60]!r}" if meta.status is Status.BLOCKED else ""
            raise NotActive(f"cannot ask: the task is {meta.status.value}{held}", task=task_id)
        if len(baton.questions) >= defaults.MAX_QUESTIONS:
            raise BadInput(f"the task has asked {defaults.MAX_QUESTIONS} questions already", task=task_id,
                           field="questions")
        addressed, up = _addressee(baton, to, upstream)
        qid = _next_id(baton)
        asker_epoch = meta.epoch
        baton.questions.append(Question(id=qid, to=addressed, text=text, asked_at=ed.now, upstream=up,
                                        epoch=asker_epoch))
        held_on = [*(gate.target.split(",") if waiting and gate is not None else ()), qid]
        new_gate = Gate(GateKind.QUESTION, ",".join(held_on))
        baton.blocked_on = _blocked_on(baton, held_on)
        meta.status = Status.BLOCKED
        meta.gate = new_gate
        meta.snooze_until = None
        if not waiting:
            meta.blocked_at = ed.now
        ed.event(EventKind.ASKED, qid=qid, to=addressed.value, upstream=up, text=text[:defaults.QUESTION_EVENT_CHARS])
        ed.event(EventKind.BLOCKED, on=baton.blocked_on, gate=new_gate.spec())
    return qid


def _blocked_on(baton: Baton, qids: list[str]) -> str:
    by_id = {q.id: q for q in baton.questions}
    whom = sorted({by_id[q].asked_of for q in qids if q in by_id})
    return f"waiting on {', '.join(qids)} to {', '.join(whom)}"


def _find(ed: Edit, qid: str) -> Question:
    question = next((q for q in ed.baton.questions if q.id == qid), None)
    if question is None:
        known = ", ".join(q.id for q in ed.baton.questions) or "none"
        raise BadInput(f"no question {qid[:20]!r} on this task (its questions: {known})", task=ed.old.id,
                       field="qid")
    return question


def _check_by(task_id: str, by: str) -> str:
    if by == PERSON:
        return by
    kind, sep, name = by.partition(":")
    if sep and kind == PERSON and name.strip() and len(name) <= 64 and name.isprintable():
        return by
    if sep and kind + ":" == UPSTREAM_BY and ID_PATTERN.fullmatch(name):
        return by
    raise BadInput(f"answered by {by[:40]!r}: use person, person:NAME or upstream:ID", task=task_id, field="by")


def answer(store: Store, task_id: str, qid: str, text: str, *, by: str, epoch: int | None = None,
           now: datetime | None = None, actor: str = "") -> None:
    """Answer question ``qid`` of ``task_id``; the gate lifts once no question it names is open.

    ``by``: ``person``, ``person:NAME``, or ``upstream:UP`` for the upstream the question was asked
    of (no other upstream may answer it). ``epoch`` with ``upstream:UP``: the answer comes from UP's
    agent and is fenced by UP's epoch (a superseded agent of UP is refused). Answering twice is a
    :class:`Conflict`, an unknown ``qid`` :class:`BadInput`; either way nothing is written.
    """
    check_id(task_id)
    _check_by(task_id, by)
    check_text(text, what="answer", limit=defaults.MAX_ANSWER_CHARS, task_id=task_id)
    from_upstream = by.startswith(UPSTREAM_BY)
    if epoch is not None:
        if not from_upstream:
            raise BadInput("an epoch fences an upstream's answer (by upstream:ID) only", task=task_id, field="by")
        check_fence(store.load(by[len(UPSTREAM_BY):]), expect_revision=None, epoch=epoch)
    with store.edit(task_id, actor=actor or by, now=now) as ed:
        question = _find(ed, qid)
        if from_upstream and by[len(UPSTREAM_BY):] != question.upstream:
            raise BadInput(f"{qid} was asked of {question.asked_of}, not of {by[len(UPSTREAM_BY):]!r}",
                           task=task_id, field="by")
        if not question.open:
            raise Conflict(f"{qid} was answered already, by {question.answered_by or 'someone'}", task=task_id)
        question.answer, question.answered_by, question.answered_at = text, by, ed.now
        ed.event(EventKind.ANSWERED, qid=qid, by=by, to=question.to.value, upstream=question.upstream,
                 wait_s=round((ed.now - question.asked_at).total_seconds(), 3))
        _lift_if_answered(ed)


def _lift_if_answered(ed: Edit) -> None:
    meta = ed.baton.meta
    gate = meta.gate
    if meta.status is not Status.BLOCKED or gate is None or gate.kind is not GateKind.QUESTION:
        return
    if any(q.id in gate.target.split(",") and q.open for q in ed.baton.questions):
        return
    was_on = ed.baton.blocked_on
    ed.baton.blocked_on = ""
    meta.status = Status.ACTIVE
    meta.gate = None
    meta.blocked_at = None
    meta.idle_resumes = 0
    ed.event(EventKind.UNBLOCKED, by=ed.actor, note="", was_on=was_on, gate=gate.spec(), gate_opened=gate.spec())


def mark_sent(store: Store, task_id: str, qid: str, *, now: datetime | None = None, actor: str = "daemon") -> None:
    """Record that the daemon started the upstream's answering run for ``qid`` (``sent_at``).

    :class:`Conflict` when it was sent already, answered, or re-addressed to a person: the caller
    lost a race and must not start a run."""
    with store.edit(task_id, actor=actor, now=now) as ed:
        question = _find(ed, qid)
        if question.sent_at is not None:
            raise Conflict(f"{qid} was sent to {question.upstream} already", task=task_id)
        if not question.open or question.to is not QuestionTo.UPSTREAM:
            raise Conflict(f"{qid} is no longer waiting on {question.asked_of}", task=task_id)
        question.sent_at = ed.now


def escalate(store: Store, task_id: str, qid: str, *, now: datetime | None = None, actor: str = "daemon") -> bool:
    """Re-address an open question to a person (``question_escalated``); False when it was answered
    or escalated meanwhile (nothing written)."""
    with store.edit(task_id, actor=actor, now=now) as ed:
        question = _find(ed, qid)
        if not question.open or question.escalated_at is not None:
            ed.cancel()
            return False
        waited = round((ed.now - question.asked_at).total_seconds(), 3)
        was = question.to
        question.to, question.escalated_at = QuestionTo.PERSON, ed.now
        ed.event(EventKind.QUESTION_ESCALATED, qid=qid, to=QuestionTo.PERSON.value, was=was.value,
                 upstream=question.upstream, wait_s=waited)
        gate = ed.baton.meta.gate
        if ed.baton.meta.status is Status.BLOCKED and gate is not None and gate.kind is GateKind.QUESTION:
            ed.baton.blocked_on = _blocked_on(ed.baton, gate.target.split(","))
    return True


def open_questions(baton: Baton) -> list[Question]:
    """The questions of ``baton`` not answered yet, in the order asked."""
    return [q for q in baton.questions if q.open]


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a task held on its questions waits on, as status shows it."""

    questions: tuple[Question, ...]
    since: datetime

    @property
    def escalated(self) -> bool:
        return any(q.escalated_at is not None for q in self.questions)

    def describe(self, now: datetime) -> str:
        """``waiting on q1 to build, 12m`` (``..., escalated to a person``)."""
        from heartbeat.model.timeparse import format_duration

        whom = ", ".join(sorted({q.asked_of for q in self.questions}))
        text = f"waiting on {', '.join(q.id for q in self.questions)} to {whom}, " \
               f"{format_duration((now - self.since).total_seconds())}"
        return text + (", escalated to a person" if self.escalated else "")


def waiting_on(baton: Baton) -> Waiting | None:
    """The open questions a task's ``question:`` gate holds it on, or None when it is not so held."""
    meta, gate = baton.meta, baton.meta.gate
    if meta.status is not Status.BLOCKED or gate is None or gate.kind is not GateKind.QUESTION:
        return None
    held = gate.target.split(",")
    found = tuple(q for q in baton.questions if q.id in held and q.open)
    if not found:
        return None
    return Waiting(found, min(q.asked_at for q in found))


def pending_upstream(batons: Iterable[Baton]) -> list[tuple[str, Question]]:
    """Each question addressed to an upstream, not answered and not sent yet, with its asker's id
    (askers that finished are left out), in the order the batons and their questions come."""
    out: list[tuple[str, Question]] = []
    for baton in batons:
        if baton.meta.status in FINISHED_STATUSES:
            continue
        out.extend((baton.id, q) for q in baton.questions
                   if q.open and q.to is QuestionTo.UPSTREAM and q.sent_at is None)
    return out


def overdue(batons: Iterable[Baton], now: datetime, wait: float) -> list[tuple[str, Question]]:
    """Each open question, not escalated, asked at least ``wait`` seconds before ``now`` (``wait``
    0: none), with its asker's id: what the daemon escalates to a person."""
    if wait <= 0:
        return []
    return [(b.id, q) for b in batons if b.meta.status not in FINISHED_STATUSES for q in b.questions
            if q.open and q.escalated_at is None and (now - q.asked_at).total_seconds() >= wait]
