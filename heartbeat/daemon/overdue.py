"""Overdue questions: one unanswered past ``daemon.question_wait`` escalates to a person.

Each pass hands the scan's entries to :meth:`OverdueQuestions.pass_`. A question that has waited
``question_wait`` is re-addressed to a person (:func:`heartbeat.tasks.questions.escalate`: event
``question_escalated``), logged, and announced as an escalation is: the ``[notify.*]`` commands
run with ``{reason}`` naming the question. The task stays held on its question (a person answers
it with ``heartbeat answer``); it is not the task that failed, so its status does not change.

Cheap at rest: the part remembers when the next open question falls due, and while the scan
says nothing changed and that time has not come it looks at no baton.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from heartbeat.daemon.act import Actor
from heartbeat.daemon.shared import Shared
from heartbeat.model.baton import FINISHED_STATUSES, Baton
from heartbeat.model.errors import HeartbeatError
from heartbeat.model.timeparse import format_duration
from heartbeat.store.base import Entry
from heartbeat.tasks import questions

__all__ = ["OverdueQuestions"]


class OverdueQuestions:
    """Escalates the questions nobody answered in time (see the module docstring)."""

    def __init__(self, shared: Shared, actor: Actor) -> None:
        self.shared = shared
        self.actor = actor
        self._due: datetime | None = None
        """When the next open question falls due (None: none is open), as of the last look."""
        self._looked = False

    def pass_(self, entries: Sequence[Entry], now: datetime) -> int:
        """Escalate what is overdue at ``now``; how many were escalated."""
        sh = self.shared
        wait = sh.config.daemon.question_wait
        if wait <= 0:
            return 0
        if self._looked and sh.store.scan_unchanged and (self._due is None or now < self._due):
            return 0
        self._looked = True
        batons = [e.baton for e in entries if e.baton is not None and e.baton.questions]
        escalated = 0
        for task_id, question in questions.overdue(batons, now, wait):
            try:
                if not questions.escalate(sh.store, task_id, question.id, now=now):
                    continue
                baton = sh.store.load(task_id)
            except HeartbeatError as exc:  # written or broken meanwhile: the next pass looks again
                sh.log.info("raced", task=task_id, action="question_escalated", reason=str(exc))
                continue
            escalated += 1
            reason = (f"question {question.id} to {question.asked_of} unanswered for "
                      f"{format_duration((now - question.asked_at).total_seconds())}: {question.text[:200]}")
            sh.log.warning("question_escalated", task=task_id, qid=question.id, upstream=question.upstream,
                           reason=reason)
            self.actor.notify(baton, reason)
        self._due = _next_due(batons, wait)
        return escalated


def _next_due(batons: Sequence[Baton], wait: float) -> datetime | None:
    due = [q.asked_at + timedelta(seconds=wait) for b in batons if b.meta.status not in FINISHED_STATUSES
           for q in b.questions if q.open and q.escalated_at is None]
    return min(due, default=None)
