"""The closed sets of words heartbeat stores (event kinds, owner kinds, stall reasons) are StrEnums
whose values are exactly the strings on disk and in the database."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from heartbeat.model.baton import OwnerKind
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.policy import StallReason
from heartbeat.model.timeparse import utcnow
from heartbeat.store.ledger import SqliteLedger

ON_DISK_EVENT_KINDS = {
    "created", "updated", "touched", "restored", "rederived", "claimed", "released", "snoozed", "woke",
    "blocked", "unblocked", "bypass", "done", "handed_off", "failed", "retried", "reopened", "verified",
    "guarantee_failed", "guarantee_broken", "dispatched", "launched", "adopted", "exited", "stalled",
    "spinning", "stopped", "escalated", "notified", "invalid", "session_started", "compacting",
    "session_ended", "stop_allowed", "stop_blocked", "archived", "compacted", "upstream_missing", "rate_limited",
    "taken_over", "rail_refused", "paused", "resumed", "needs_unmet", "done_forced", "need_learned", "need_pinned",
    "need_dropped",
    "asked", "answered", "question_escalated", "answer_started", "answer_run", "question_readdressed",
}


class TestStoredWords:
    """Enum values are the historical strings; what is written is the plain string."""

    def test_event_kinds_are_the_strings_ledgers_hold(self) -> None:
        """EventKind's values are exactly the kinds ledgers already hold, no more and no fewer."""
        assert {k.value for k in EventKind} == ON_DISK_EVENT_KINDS

    def test_owner_kinds_and_stall_reasons_keep_their_strings(self) -> None:
        """owner.how and a stall's why keep the strings batons and ledgers hold."""
        assert {k.value for k in OwnerKind} == {"dispatch", "claim"}
        assert {r.value for r in StallReason} == {"owner_dead", "exited", "silent", "never_wrote", "hung",
                                                   "model_hung", "spinning", "max_runtime", "inactive"}

    def test_an_enum_kind_is_stored_as_its_plain_string(self, tmp_path: Path) -> None:
        """An event recorded with an EventKind and a StallReason lands in SQLite as the plain strings."""
        path = tmp_path / "ledger.sqlite3"
        ledger = SqliteLedger(str(path))
        try:
            ledger.append([Event(task="t", kind=EventKind.STALLED, ts=utcnow(), data={"why": StallReason.HUNG})])
        finally:
            ledger.close()
        conn = sqlite3.connect(path)
        try:
            rows = conn.execute("SELECT kind, typeof(kind), data FROM events").fetchall()
        finally:
            conn.close()
        assert rows[0][:2] == ("stalled", "text") and json.loads(rows[0][2]) == {"why": "hung"}
