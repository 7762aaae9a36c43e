"""The ledger's events: an append-only record of every write, dispatch, exit, block and unblock.

What an event is (:class:`Event`, its :class:`EventKind`), what a store's ledger does (:class:`Ledger`),
and the counts read back from events. The ledgers themselves live with their stores: SQLite and
in-memory in :mod:`heartbeat.store.ledger`, PostgreSQL in :mod:`heartbeat.store.postgres.ledger`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

__all__ = [
    "COUNTED",
    "Event",
    "EventKind",
    "Ledger",
    "PendingWrite",
    "count_label",
    "retired_counts",
    "tally",
]


class EventKind(StrEnum):
    """The closed set of words the ledger records as an event's ``kind`` (stored as these strings).

    :attr:`Event.kind` stays a plain ``str``: a ledger written by a newer heartbeat may hold a
    kind this one does not know, and it is carried, never refused.
    """

    CREATED = "created"
    UPDATED = "updated"
    TOUCHED = "touched"
    RESTORED = "restored"
    REDERIVED = "rederived"
    CLAIMED = "claimed"
    RELEASED = "released"
    SNOOZED = "snoozed"
    WOKE = "woke"
    PAUSED = "paused"
    RESUMED = "resumed"
    BLOCKED = "blocked"
    UNBLOCKED = "unblocked"
    BYPASS = "bypass"
    DONE = "done"
    HANDED_OFF = "handed_off"
    FAILED = "failed"
    RETRIED = "retried"
    REOPENED = "reopened"
    VERIFIED = "verified"
    GUARANTEE_FAILED = "guarantee_failed"
    GUARANTEE_BROKEN = "guarantee_broken"
    UPSTREAM_MISSING = "upstream_missing"
    DISPATCHED = "dispatched"
    LAUNCHED = "launched"
    ADOPTED = "adopted"
    EXITED = "exited"
    STALLED = "stalled"
    RATE_LIMITED = "rate_limited"
    SPINNING = "spinning"
    STOPPED = "stopped"
    ESCALATED = "escalated"
    NOTIFIED = "notified"
    INVALID = "invalid"
    SESSION_STARTED = "session_started"
    COMPACTING = "compacting"
    SESSION_ENDED = "session_ended"
    STOP_ALLOWED = "stop_allowed"
    STOP_BLOCKED = "stop_blocked"
    ARCHIVED = "archived"
    COMPACTED = "compacted"
    TAKEN_OVER = "taken_over"
    RAIL_REFUSED = "rail_refused"
    NEEDS_UNMET = "needs_unmet"
    DONE_FORCED = "done_forced"
    NEED_LEARNED = "need_learned"
    NEED_PINNED = "need_pinned"
    NEED_DROPPED = "need_dropped"
    ASKED = "asked"
    ANSWERED = "answered"
    QUESTION_ESCALATED = "question_escalated"
    ANSWER_STARTED = "answer_started"
    """The daemon resumed an upstream's session to answer a downstream's question (on the upstream)."""
    ANSWER_RUN = "answer_run"
    """That answering run ended: its ``outcome`` (answered, answered_from_result, failed, stopped, lost)."""
    QUESTION_READDRESSED = "question_readdressed"
    """A question to an upstream was given to a person instead (on the asker; ``reason``: one line)."""


@dataclass
class Event:
    """One thing that happened to a task."""

    task: str
    kind: str
    ts: datetime
    epoch: int = 0
    revision: int = 0
    actor: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    id: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts.isoformat(),
            "task": self.task,
            "kind": self.kind,
            "epoch": self.epoch,
            "revision": self.revision,
            "actor": self.actor,
            "data": self.data,
        }


COUNTED: dict[str, str] = {
    EventKind.DISPATCHED: "launcher", EventKind.EXITED: "kind", EventKind.STALLED: "why",
    EventKind.ESCALATED: "", EventKind.BYPASS: "", EventKind.SPINNING: "", EventKind.COMPACTING: "",
    EventKind.GUARANTEE_FAILED: "", EventKind.ASKED: "", EventKind.ANSWERED: "", EventKind.QUESTION_ESCALATED: "",
}
"""The event kinds the metrics count, and the data key each is labelled by ("": no label).
gc keeps their counts in the ``archived`` event that replaces a retired task's rows
(:func:`tally`), so a counter read from the ledger never goes down when gc runs."""


def count_label(kind: str, raw: object) -> str:
    """The label a counted event of ``kind`` is counted under, from its data value ``raw``."""
    if not COUNTED.get(kind):
        return ""
    text = "" if raw is None else str(raw)
    return text or ("" if kind == EventKind.DISPATCHED else "unknown")


def tally(events: Sequence[Event]) -> dict[str, dict[str, int]]:
    """Counted kind -> label -> how many of ``events`` (kinds counted none of omitted)."""
    out: dict[str, dict[str, int]] = {}
    for event in events:
        if event.kind in COUNTED:
            key = COUNTED[event.kind]
            label = count_label(event.kind, event.data.get(key) if key else None)
            by_label = out.setdefault(event.kind, {})
            by_label[label] = by_label.get(label, 0) + 1
    return out


def retired_counts(data: object) -> dict[str, dict[str, int]]:
    """The counts an ``archived`` event's data keeps of its task's retired rows: its ``counted``
    (:func:`tally`), else (an archive written before it was kept) its ``kinds``, unlabelled.
    Anything malformed counts nothing (a row is a record, never trusted to be well formed)."""
    out: dict[str, dict[str, int]] = {}
    if not isinstance(data, dict):
        return out

    def count(value: object) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    counted = data.get("counted")
    if isinstance(counted, dict):
        for kind, by_label in counted.items():
            if kind in COUNTED and isinstance(by_label, dict):
                for label, n in by_label.items():
                    if isinstance(label, str) and count(n):
                        out.setdefault(kind, {})[label] = out.get(kind, {}).get(label, 0) + count(n)
        return out
    kinds = data.get("kinds")
    if isinstance(kinds, dict):
        for kind, n in kinds.items():
            if kind in COUNTED and count(n):
                label = count_label(kind, None)
                out.setdefault(kind, {})[label] = out.get(kind, {}).get(label, 0) + count(n)
    return out


@dataclass(frozen=True)
class PendingWrite:
    """A baton write whose events go in before its rename, and how to tell later whether it landed.

    ``base`` and ``new`` identify the baton the write replaces and the one it writes (the
    store's choice, e.g. ``"<revision>@<touched_at>"``; ``""`` for no baton). Once the rename
    is done the store calls :meth:`Ledger.landed` and the write is pending no more. A write
    still pending at the task's next write (made under the baton's lock) was cut short: if
    the baton that next write found (its own ``base``) is still this write's ``base``, the
    rename never happened and its events, exactly those, are removed; anything else (its
    ``new``: it died just after the rename; a hand edit or a restored backup) keeps them.
    """

    task: str
    base: str
    new: str


class Ledger(Protocol):
    """Where events go. Implementations must keep events in append order (ids increase)."""

    def append(self, events: Sequence[Event], *, write: PendingWrite | None = None) -> None:
        """Record events durably, in order; a ``touched`` event may be merged into the
        task's previous touch of the same minute instead of adding a row.

        ``write`` marks the events as those of a baton write not yet renamed into place,
        and first settles the task's previous pending write (see :class:`PendingWrite`):
        the events of a writer killed between its append and its rename are removed by the
        next write, and only those. Committed events are never removed.
        """

    def landed(self, write: PendingWrite) -> None:
        """The write's baton is in place: its events are committed history from now on."""

    def highest_revision(self, task: str, base: str = "") -> int:
        """The highest revision recorded for ``task`` by writes that landed (0 if none), for a
        writer that found the baton ``base``: a baton restored from a backup is recognised
        by a revision below it."""

    def events(
        self, task: str | None = None, *, since: datetime | None = None, kinds: Iterable[str] | None = None
    ) -> list[Event]:
        """Events in append order, optionally for one task, since a time, of some kinds."""

    def fold(self, task: str, ids: Sequence[int], events: Sequence[Event]) -> int:
        """In one transaction: remove ``task``'s rows ``ids`` and append ``events`` (retention's
        summaries, :mod:`heartbeat.ops.retention`). Returns how many rows went."""

    def count(self) -> int:
        """How many rows the ledger holds."""

    def close(self) -> None:
        """Release resources; the ledger may be reopened by a new instance."""
