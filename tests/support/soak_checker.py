"""The soak's independent invariant checker.

It never asks the daemon what happened. It samples what anyone could see from outside:

- the **process table** (``/proc``): every process whose environment carries
  ``HEARTBEAT_TASK`` and this state dir, grouped by process group (an agent and its shim
  share one), with start times from ``/proc/<pid>/stat``;
- the **baton files**, read and parsed with ``tomllib`` (not heartbeat's parser);
- the **ledger**, read with ``sqlite3`` directly, and the agents' own records of the
  writes they believed landed (``writes/<task>.jsonl``), and the notify command's file.

The invariants (each violation is kept with its evidence):

``two-agents``
    Never two live agent process groups for one task. Group lifetimes are intervals
    [start, last seen alive]; two of one task that overlap by more than the clock's
    granularity are a violation, whether or not one sample saw both.
``invalid-baton``
    Every baton parses, or it is garbage the soak wrote, byte-identical, until the soak
    itself repairs it. The daemon records ``invalid`` for it (and for nothing else).
``monotonic``
    A baton's revision and epoch never go backwards between samples, except across the
    soak's own hand edits (which it tells the checker about under the same lock).
``fencing``
    No write from a superseded epoch lands: every write an agent (or an escaped zombie)
    recorded as landed at revision R carried the epoch the baton had at R, per the ledger;
    every stale write the soak made with an old epoch was refused with exit 5.
``blocks-hold``
    No ``dispatched`` event between a block (``blocked``, ``bypass``, a task created
    blocked) and the next ``unblocked``; no agent process group started while the task
    was blocked (by the ledger's intervals and by the sampled batons).
    A ``bypass`` only ever follows a block that a hand edit really dropped.
``escalation-loud``
    Every ``escalated`` event is followed by a ``notified`` event (unless a human re-armed
    the task first), and every successful notifier run left its line in the notify file.
``not-dropped``
    At the end every task is done, failed, escalated, blocked on a gate still closed,
    snoozed until a time not yet passed (or just passed), or active with a live agent or
    due within the backoff; nothing else.
``ledger-agrees``
    Each baton's epoch, dispatch count and revision match the ledger; every epoch a
    sample saw has its ``dispatched`` event; dispatched epochs strictly increase.
``nothing-lost``
    Unknown keys a hand edit added are still in the baton at the end.
``daemon``
    The daemon never dies on its own, never logs an exception, and answers every SIGHUP
    (``reloaded`` / ``reload_failed``).
``not-active``
    From the ledger: no ``dispatched`` whose preceding status (replayed from the events:
    ``created``, ``blocked``/``bypass``, ``unblocked``, ``done``, ``failed``, ``escalated``,
    ``retried``, ``snoozed``, ``woke``, ``claimed``) was done, snoozed, failed or escalated
    (blocked is ``blocks-hold``'s). From the process table: no agent group whose epoch
    (``HEARTBEAT_EPOCH`` in its environment) was dispatched after its task left
    ``active``; and no agent group alive longer than ``outlive_grace`` seconds *of daemon
    up-time* after its task left ``active`` (see :func:`check_inactive_agents` for the
    rule and why the grace is what it is).
``ledger-kept``
    The ledger's row count never goes down, except by the rows of a write that crashed
    before its rename: a vanished row is a violation when its revision had already been
    seen on the baton (the write had landed) before the row was last seen. Rows the soak
    corrupted on purpose are read through the originals it recorded; any other unreadable
    row is a violation.
``tick-gap``
    While the daemon is up (between its ``READY=1`` and its ``STOPPING=1`` or its end),
    ``WATCHDOG=1`` notifications (one per tick, on a socket the soak owns) never stop for
    more than 5 x tick.
``setsid-outlived``
    A ``setsid`` grandchild of an agent (``SOAK_GRANDCHILD=1``) is not alive more than
    ``GRANDCHILD_GRACE`` after its agent's process group was last seen, unless the soak
    SIGKILLed that group's shim (nothing could stop the grandchild then).
``outside-write``
    Nothing is written through a symlink the soak planted under ``logs/``: the outside
    targets stay byte-identical (checked by the soak).
``clock-step``
    The soak steps the daemon's wall clock (forward and back, by hours, through its test
    clock's offset file: :class:`ClockStep`). For each step the daemon was up to see (serving
    at the step and up ``watch`` seconds after): it logs ``clock_stepped`` with the step's
    direction and size, and, when it had ticked before the step, its tick goes on (a
    ``WATCHDOG=1`` within ``watch`` seconds of the soak's monotonic clock); it logs no
    ``clock_stepped`` the soak did not make. No daemon
    decision in the ledger cites a duration longer than the soak has run ("hung ... for 2h",
    "step unchanged for 2h"), and no agent is stopped past ``max_runtime`` before it ran that
    long (:func:`check_stepped_decisions`). Ledger times the daemon stamped on its shifted
    clock are mapped back to the machine's (:func:`map_ledger_times`) before any check reads them.
"""

from __future__ import annotations

import bisect
import fcntl
import itertools
import json
import math
import os
import re
import socket
import sqlite3
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "Violation",
    "LedgerEvent",
    "Group",
    "GarbageRecord",
    "Checker",
    "boottime",
    "read_ledger",
    "check_blocks",
    "check_dispatch_epochs",
    "check_fencing",
    "check_overlaps",
    "check_notify",
    "check_group_starts",
    "check_bypasses",
    "epoch_at",
    "NOT_ACTIVE",
    "status_timeline",
    "check_dispatch_status",
    "check_inactive_agents",
    "TickWatch",
    "tick_gaps",
    "GRANDCHILD_GRACE",
    "ClockStep",
    "map_ledger_times",
    "check_clock_steps",
    "check_stepped_decisions",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
GRANULARITY = 2.0 / CLK_TCK + 0.005
"""Process start times are in clock ticks: intervals closer than this are not an overlap."""
STATUSES = {"active", "blocked", "snoozed", "done", "failed", "escalated", "paused"}
NOT_ACTIVE = frozenset({"blocked", "snoozed", "done", "failed", "escalated", "paused"})
_STATUS_AFTER = {"blocked": "blocked", "bypass": "blocked", "unblocked": "active", "done": "done",
                 "failed": "failed", "escalated": "escalated", "retried": "active", "snoozed": "snoozed",
                 "woke": "active", "claimed": "active"}
"""The status a task has after each kind of ledger event (kinds not listed keep it)."""
GRANDCHILD_GRACE = 2.5
"""Seconds a ``setsid`` grandchild may outlive its agent's group: the shim's stop (TERM, its
``--grace`` = the launcher's ``stop_grace``, KILL) plus the sampler's granularity and load."""


def boottime() -> float:
    """Seconds since boot, the clock ``/proc/<pid>/stat`` start times are in."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class Violation:
    """One broken invariant, with what shows it."""

    invariant: str
    task: str
    evidence: str
    at: float = field(default_factory=time.time)

    def line(self) -> str:
        return f"VIOLATION [{self.invariant}] task={self.task or '-'}: {self.evidence}"


@dataclass
class LedgerEvent:
    """A ledger row as the checker reads it (straight from SQLite)."""

    id: int
    ts: float
    task: str
    kind: str
    epoch: int
    revision: int
    actor: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Group:
    """One agent process group of one task, as the process table showed it."""

    task: str
    pgid: int
    start: float
    """Boot-clock start of the group's leader (or of its oldest member seen)."""
    first_seen: float
    last_seen: float
    """Boot-clock time a member was last read alive."""
    pids: set[int] = field(default_factory=set)
    cmd: str = ""
    start_wall: float = 0.0
    """The start on the wall clock (the ledger's), converted when first seen."""
    epoch: int | None = None
    """The dispatch's epoch (``HEARTBEAT_EPOCH`` in the members' environment), when readable."""


@dataclass
class Grandchild:
    """A ``setsid`` grandchild an agent left (``SOAK_GRANDCHILD=1``), and the agent group it came from."""

    pid: int
    task: str
    agent_pgid: int
    first_seen: float
    last_seen: float


@dataclass
class GarbageRecord:
    """Bytes the soak wrote over a baton, and what it will put back."""

    data: bytes
    original: bytes
    written_at: float
    restored_at: float | None = None


@dataclass
class _Segment:
    """A stretch of samples in which a baton kept one (revision, epoch, status)."""

    revision: int
    epoch: int
    status: str
    first: float
    last: float


def read_ledger(path: str, planted: dict[int, dict[str, Any]] | None = None,
                problems: list[str] | None = None) -> list[LedgerEvent]:
    """All events in append order, read with sqlite3 (not heartbeat's ledger class).

    A row whose ``ts`` is not a plausible number or whose ``data`` is not a JSON object is
    read through ``planted[id]`` (the original values the soak recorded when it corrupted
    the row on purpose); any other such row is described in ``problems`` and read with
    what can be read (``ts`` NaN, ``data`` empty).
    """
    if not os.path.exists(path):
        return []
    conn = sqlite3.connect(path, timeout=30)
    try:
        rows = conn.execute("SELECT id, ts, task, kind, epoch, revision, actor, data FROM events ORDER BY id").fetchall()
    finally:
        conn.close()
    out = []
    for r in rows:
        ts, data = _ts_of(r[1]), _data_of(r[7])
        if ts is None or data is None:
            original = (planted or {}).get(r[0])
            if original is not None:
                ts = ts if ts is not None else _ts_of(original.get("ts"))
                data = data if data is not None else _data_of(original.get("data"))
            if (ts is None or data is None) and problems is not None:
                problems.append(f"ledger row {r[0]} ({r[3]} of {r[2]}) is unreadable and the soak did not corrupt "
                                f"it: ts={r[1]!r:.60} data={r[7]!r:.80}")
        out.append(LedgerEvent(r[0], ts if ts is not None else math.nan, r[2], r[3], r[4], r[5], r[6], data or {}))
    return out


def _ts_of(value: object) -> float | None:
    """A ledger timestamp the checker can use: a finite number of seconds within years 2000-2200."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 946684800.0 <= value <= 7258118400.0 else None


def _data_of(value: object) -> dict[str, Any] | None:
    if value is None:
        return {}
    try:
        data = json.loads(value) if isinstance(value, (str, bytes)) else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _is_write(event: LedgerEvent) -> bool:
    """Did this event come with a baton write? A ``verified`` event is a record of the revision a
    ``heartbeat verify`` read: a slow verify may append it after later writes."""
    return event.revision > 0 and event.kind != "verified"


def _by_task(events: Iterable[LedgerEvent]) -> dict[str, list[LedgerEvent]]:
    out: dict[str, list[LedgerEvent]] = {}
    for event in events:
        out.setdefault(event.task, []).append(event)
    return out


def _is_block_start(event: LedgerEvent) -> bool:
    return event.kind in ("blocked", "bypass") or (event.kind == "created" and event.data.get("status") == "blocked")


def block_intervals(events: Sequence[LedgerEvent]) -> list[tuple[float, float]]:
    """[block start, unblock) wall-clock intervals of one task's events (open ones end at +inf)."""
    return [(lo, hi) for lo, hi, _ in _block_intervals(events)]


def _block_intervals(events: Sequence[LedgerEvent]) -> list[tuple[float, float, int]]:
    """As :func:`block_intervals`, with the ledger id of the event that started each block."""
    out: list[tuple[float, float, int]] = []
    start: LedgerEvent | None = None
    for event in events:
        if _is_block_start(event):
            if start is None:
                start = event
        elif event.kind == "unblocked" and start is not None:
            out.append((start.ts, event.ts, start.id))
            start = None
    if start is not None:
        out.append((start.ts, float("inf"), start.id))
    return out


def status_timeline(events: Sequence[LedgerEvent]) -> list[tuple[LedgerEvent, str, str]]:
    """One task's events with the status before and after each, replayed from the ledger alone."""
    out = []
    status = "active"
    for event in events:
        if event.kind == "created":
            after = str(event.data.get("status") or "active")
        else:
            after = _STATUS_AFTER.get(event.kind, status)
        out.append((event, status, after))
        status = after
    return out


def check_dispatch_status(events: Sequence[LedgerEvent]) -> list[Violation]:
    """No ``dispatched`` whose preceding status was done, snoozed, failed, escalated or paused
    without an ``unblocked``/``retried``/``woke``/``claimed`` in between (blocked: :func:`check_blocks`)."""
    out = []
    since: LedgerEvent | None = None
    for event, before, after in status_timeline(events):
        if event.kind == "dispatched" and before in NOT_ACTIVE and before != "blocked":
            what = f"{since.kind} id {since.id}" if since is not None else "creation"
            out.append(Violation("not-active", event.task,
                                 f"dispatched epoch {event.epoch} (ledger id {event.id}, revision {event.revision}) "
                                 f"while the task was {before} since {what}, with no unblock/retry/wake between"))
        if after != before:
            since = event
    return out


def check_inactive_agents(groups: Sequence[Group], events: Sequence[LedgerEvent], *, outlive_grace: float,
                          up_between: Callable[[float, float], float] = lambda lo, hi: hi - lo,
                          margin: float = 0.05, outlived: list[float] | None = None) -> list[Violation]:
    """Agent process groups on a task that is not active, judged from the process table and the ledger.

    The daemon's rule (``policy.decide``): it never dispatches a task that is not active, but an
    agent already running when its task turns blocked, done, snoozed or failed by another hand
    is *not* stopped (blocked/done: "nothing"; snoozed: "the agent is ending its shift"): it is
    told by ``verify`` (exit 4) and by its next ``done`` being refused. So the rule checked is:

    1. a group whose epoch's ``dispatched`` event came after its task left ``active`` (no
       unblock/retry/wake between) is a violation at once; a group whose epoch is unknown is
       judged by its start time instead (started inside a not-active stretch, ``margin`` apart);
    2. a group still alive ``outlive_grace`` seconds of daemon up-time after its task left
       ``active`` is a violation: the soak passes the launcher's ``max_runtime`` +
       ``stop_grace`` + two ticks + 1 s, the longest any agent of an *active* task may run.
       An agent that blocks or finishes its own task, then lingers a moment, stays far inside it.

    ``outlived`` collects, for each group still alive when its task left ``active``, how many
    seconds (of daemon up-time) it lived on: the soak reports how often that path was tried.
    """
    out = []
    timeline = status_timeline(events)
    dispatch_of: dict[int, tuple[int, str]] = {}  # epoch -> (position, status before)
    stretches: list[tuple[float, float, str, int]] = []  # not-active (from, until, status, position)
    for pos, (event, before, after) in enumerate(timeline):
        if event.kind == "dispatched":
            dispatch_of[event.epoch] = (pos, before)
        if after in NOT_ACTIVE and before not in NOT_ACTIVE:
            stretches.append((event.ts, float("inf"), after, pos))
        elif after not in NOT_ACTIVE and before in NOT_ACTIVE and stretches:
            lo, _hi, what, p = stretches[-1]
            stretches[-1] = (lo, event.ts, what, p)
    for g in groups:
        if g.epoch is not None and g.epoch in dispatch_of:
            pos, before = dispatch_of[g.epoch]
            if before in NOT_ACTIVE:
                out.append(Violation("not-active", g.task, f"agent process group {g.pgid} ({g.cmd}) of epoch {g.epoch} "
                                                           f"runs a dispatch made while the task was {before}"))
                continue
            mine = [s for s in stretches if s[3] > pos]
        else:
            mine = []
            for lo, hi, what, _p in stretches:
                if lo + margin < g.start_wall < hi - margin:
                    out.append(Violation("not-active", g.task, f"agent process group {g.pgid} ({g.cmd}, epoch "
                                                               f"{g.epoch}) started at {g.start_wall:.3f} while the "
                                                               f"task was {what} (from {lo:.3f} to {hi:.3f})"))
                    break
            else:
                mine = [s for s in stretches if s[0] >= g.start_wall]
        last_alive = g.last_seen + (g.start_wall - g.start if g.start_wall else 0.0)
        for lo, hi, what, _p in mine:  # each time its task left active after its dispatch
            alive_for = up_between(lo, min(hi, last_alive))
            if outlived is not None and last_alive > lo:
                outlived.append(alive_for)
            if alive_for > outlive_grace:
                out.append(Violation("not-active", g.task,
                                     f"agent process group {g.pgid} ({g.cmd}, epoch {g.epoch}) was still alive "
                                     f"{alive_for:.1f}s of daemon up-time after its task became {what} at {lo:.3f} "
                                     f"(grace {outlive_grace:.1f}s; last seen {last_alive:.3f})"))
                break
    return out


def check_blocks(events: Sequence[LedgerEvent]) -> list[Violation]:
    """No ``dispatched`` between a block and the next ``unblocked`` (one task's events, in order)."""
    out = []
    held: LedgerEvent | None = None
    for event in events:
        if _is_block_start(event):
            held = held or event
        elif event.kind == "unblocked":
            held = None
        elif event.kind == "dispatched" and held is not None:
            out.append(Violation("blocks-hold", event.task,
                                 f"dispatched epoch {event.epoch} (ledger id {event.id}) while blocked since "
                                 f"{held.kind} id {held.id} ({held.data.get('on') or held.data.get('was_on') or ''!r}, "
                                 f"gate {held.data.get('gate')}) with no unblocked in between"))
    return out


def check_dispatch_epochs(events: Sequence[LedgerEvent], baton: dict[str, Any] | None,
                          seen_epochs: Iterable[int] = ()) -> list[Violation]:
    """Dispatched epochs strictly increase and agree with the final baton and the sampled epochs."""
    out = []
    task = events[0].task if events else ""
    dispatched = [e for e in events if e.kind == "dispatched"]
    epochs = [e.epoch for e in dispatched]
    for before, after in itertools.pairwise(dispatched):
        if after.epoch <= before.epoch:
            out.append(Violation("ledger-agrees", task, f"dispatched epoch {after.epoch} (id {after.id}) after "
                                                        f"epoch {before.epoch} (id {before.id})"))
    missing = sorted({e for e in seen_epochs if e > 0} - set(epochs))
    if missing:
        out.append(Violation("ledger-agrees", task, f"batons were sampled at epochs {missing} with no dispatched "
                                                    f"event (dispatched: {epochs})"))
    if baton is not None:
        meta = baton.get("meta", {})
        epoch, dispatches, revision = meta.get("epoch", 0), meta.get("dispatches", 0), meta.get("revision", 0)
        if epoch != (max(epochs) if epochs else 0):
            out.append(Violation("ledger-agrees", task, f"baton epoch {epoch} but dispatched epochs {epochs}"))
        if dispatches != len(dispatched):
            out.append(Violation("ledger-agrees", task, f"baton meta.dispatches = {dispatches} but the ledger has "
                                                        f"{len(dispatched)} dispatched events"))
        revisions = [e.revision for e in events if _is_write(e)]
        if revisions and revision != max(revisions):
            out.append(Violation("ledger-agrees", task, f"baton revision {revision} but the ledger's last "
                                                        f"revision is {max(revisions)}"))
    written = [e for e in events if _is_write(e)]
    for before, after in itertools.pairwise(written):
        if after.revision < before.revision or after.epoch < before.epoch:
            out.append(Violation("monotonic", task, f"ledger went back: id {before.id} rev {before.revision} "
                                                    f"epoch {before.epoch} -> id {after.id} rev {after.revision} "
                                                    f"epoch {after.epoch}"))
            break
    return out


def check_bypasses(events: Sequence[LedgerEvent], drops: Iterable[int],
                   found: Iterable[int] = ()) -> list[Violation]:
    """A ``bypass`` only follows a block that a hand edit dropped.

    ``drops`` are the revisions at which the soak dropped a block by hand (its edits keep the
    revision). A bypass must come after a block start (not after an ``unblocked``), and the soak
    must have dropped that block: a drop at a revision from the block's to the bypass's.

    After a restore the baton's revision is behind the ledger's until the next write continues
    above it (with a ``restored`` event naming the revision it found). ``found`` are the baton
    revisions the soak's drops left on disk (a plain drop keeps the revision; a restore leaves the
    copy's): a bypass is also accounted for by a ``restored`` event since its block that found an
    unblocked baton at one of them.
    """
    out = []
    task = events[0].task if events else ""
    drop_revisions = sorted(drops)
    found_revisions = set(found)
    last: LedgerEvent | None = None
    restored_since: list[LedgerEvent] = []
    for event in events:
        if event.kind == "restored":
            restored_since.append(event)
        if event.kind == "bypass":
            if last is None or last.kind == "unblocked":
                word = f"{last.kind} (id {last.id})" if last else "none"
                out.append(Violation("blocks-hold", task, f"bypass (id {event.id}, revision {event.revision}) with no "
                                                          f"block to bypass: the last word was {word}"))
            elif not any(last.revision <= r < event.revision for r in drop_revisions) and not any(
                    r.data.get("status") != "blocked" and r.data.get("found_revision") in found_revisions
                    for r in restored_since):
                out.append(Violation("blocks-hold", task, f"bypass (id {event.id}, revision {event.revision}) of the "
                                                          f"block at revision {last.revision}, which no hand edit "
                                                          f"dropped (drops at {drop_revisions})"))
        if _is_block_start(event) or event.kind == "unblocked":
            last = event
            restored_since = []
    return out


def epoch_at(written: Sequence[LedgerEvent], revisions: Sequence[int], revision: int) -> int | None:
    """The baton's epoch at ``revision``: the epoch of the last write event at or before it.

    ``written`` are one task's events with a revision, in order; ``revisions`` their
    revisions (a sorted list for bisect). Coalesced touches lose rows but never an epoch
    change: a dispatch is always a row of its own.
    """
    i = bisect.bisect_right(revisions, revision)
    if i == 0:
        return None
    return written[i - 1].epoch


def check_fencing(events: Sequence[LedgerEvent], writes: Sequence[dict[str, Any]]) -> list[Violation]:
    """Every write an agent recorded as landed at revision R carried the baton's epoch at R."""
    out = []
    task = events[0].task if events else ""
    written = [e for e in events if _is_write(e)]
    revisions = [e.revision for e in written]
    if any(b < a for a, b in itertools.pairwise(revisions)):
        return out  # reported by check_dispatch_epochs; bisect needs them sorted
    non_touch = {(e.revision, e.epoch) for e in written if e.kind != "touched"}
    for w in writes:
        rev, epoch = w.get("r"), w.get("e")
        if rev is None or epoch is None:
            continue
        at = epoch_at(written, revisions, rev)
        who = "escaped zombie" if w.get("z") else "agent"
        if at is None:
            out.append(Violation("fencing", task, f"{who} pid {w.get('pid')} recorded a {w.get('k')} write at "
                                                  f"revision {rev} (epoch {epoch}) that the ledger never saw"))
        elif at != epoch:
            out.append(Violation("fencing", task, f"{who} pid {w.get('pid')} of epoch {epoch} landed a "
                                                  f"{w.get('k')} write at revision {rev}, when the baton was at "
                                                  f"epoch {at}: a superseded write"))
        elif w.get("k") != "touch" and (rev, epoch) not in non_touch:
            out.append(Violation("ledger-agrees", task, f"{who} pid {w.get('pid')} recorded a {w.get('k')} write "
                                                        f"at revision {rev} epoch {epoch} with no ledger event"))
    return out


def check_overlaps(groups: Sequence[Group]) -> list[Violation]:
    """Two agent groups of one task alive at one instant (beyond the clock's granularity)."""
    out = []
    ordered = sorted(groups, key=lambda g: g.start)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if b.start >= a.last_seen:
                break
            if a.pids & b.pids:
                continue  # one process seen in two groups (it changed its group): not two agents
            both_from = max(a.start, b.start)
            both_until = min(a.last_seen, b.last_seen)
            if both_until - both_from > GRANULARITY:
                off = a.start_wall - a.start if a.start_wall else 0.0
                out.append(Violation(
                    "two-agents", a.task,
                    f"process groups {a.pgid} ({a.cmd}; started {a.start + off:.3f}, last seen alive "
                    f"{a.last_seen + off:.3f}, pids {sorted(a.pids)}) and {b.pgid} ({b.cmd}; started "
                    f"{b.start + off:.3f}, last seen alive {b.last_seen + off:.3f}, pids "
                    f"{sorted(b.pids)}) were alive together for {both_until - both_from:.3f}s"))
    return out


def check_group_starts(groups: Sequence[Group], events: Sequence[LedgerEvent],
                       margin: float = 0.05) -> list[Violation]:
    """No agent group of a task started inside one of its ledger block intervals.

    A group whose epoch was dispatched *before* the block began (the block landed on a
    running dispatch: a human blocked a working agent) did not start on a blocked task.
    """
    out = []
    intervals = _block_intervals(events)
    dispatched = {e.epoch: e.id for e in events if e.kind == "dispatched"}
    for g in groups:
        start = g.start_wall
        for lo, hi, start_id in intervals:
            if lo + margin < start < hi - margin:
                if g.epoch is not None and dispatched.get(g.epoch, start_id + 1) < start_id:
                    continue
                out.append(Violation("blocks-hold", g.task,
                                     f"agent process group {g.pgid} ({g.cmd}) started at {start:.3f}, inside a "
                                     f"block from {lo:.3f} to {hi:.3f} (ledger)"))
    return out


def check_notify(events: Sequence[LedgerEvent], lines: Sequence[str], notifier: str) -> list[Violation]:
    """Every ``escalated`` event is followed by a ``notified`` event (code 0), unless a human re-armed
    the task first (``retried``: the escalation was seen); each successful notifier run left its line."""
    out = []
    task = events[0].task if events else ""
    notified = [e for e in events if e.kind == "notified" and e.data.get("name") == notifier]
    for esc in (e for e in events if e.kind == "escalated"):
        after = [n for n in notified if n.id > esc.id]
        if not after:
            if not any(e.kind == "retried" and e.id > esc.id for e in events):
                out.append(Violation("escalation-loud", task, f"escalated (id {esc.id}, {esc.data.get('reason')!r}) "
                                                              "but no notified event followed"))
        elif all(n.data.get("code") != 0 for n in after):
            out.append(Violation("escalation-loud", task, f"escalated (id {esc.id}) but the notifier failed: "
                                                          f"{[n.data for n in after]}"))
    ran = sum(1 for n in notified if n.data.get("code") == 0)
    count = sum(1 for line in lines if line.split("\t", 1)[0] == task)
    if count < ran:
        out.append(Violation("escalation-loud", task, f"the notifier reported {ran} successful runs but its file has "
                                                      f"{count} lines for the task"))
    return out


def _parse_proc_stat(raw: bytes) -> tuple[bytes, int, int] | None:
    fields = raw[raw.rfind(b")") + 2:].split()
    if len(fields) < 20:
        return None
    return fields[0], int(fields[2]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            parts = handle.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(os.path.basename(p.decode(errors="replace")) if i == 0 else p.decode(errors="replace")
                    for i, p in enumerate(parts[:6]) if p)
    return text[:120]


class Checker:
    """Samples processes and batons, checks as it goes, and checks the ledger at the end.

    The soak's hand edits go through :meth:`hand_edit`, which holds the baton's flock (so
    no heartbeat write interleaves) and the checker's lock (so no sample reads half of
    the story) while it replaces the file and resets the baseline.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.batons_dir = os.path.join(self.state_dir, "batons")
        self.locks_dir = os.path.join(self.state_dir, "locks")
        self.wall_offset = time.time() - boottime()
        self.lock = threading.Lock()
        self.violations: list[Violation] = []
        self._reported: set[str] = set()
        self.groups: dict[tuple[str, int], Group] = {}
        self.groups_by_task: dict[str, list[Group]] = {}
        self.live: dict[str, list[Group]] = {}
        """The last process sample: live agent groups per task."""
        self.zombie_pids: set[int] = set()
        self.grandchildren: dict[int, Grandchild] = {}
        self.grandchildren_alive: set[int] = set()
        self.grandchildren_exempt: set[int] = set()
        self.shim_killed: set[int] = set()
        """Agent groups whose shim the soak SIGKILLed: their setsid grandchildren cannot be stopped."""
        self.max_rev_seen: dict[str, int] = {}
        """The highest revision the samples ever read per task (a restore does not lower it)."""
        self.planted_rows: dict[int, dict[str, Any]] = {}
        """Ledger rows the soak corrupted on purpose: id -> the original ``ts`` and ``data``."""
        self._ledger_rows: dict[int, tuple[str, int, str]] = {}
        self._ledger_max_id = 0
        self._ledger_snapshot: dict[str, int] = {}
        self.ledger_samples = 0
        self.ledger_rows_superseded = 0
        self.rewritten: set[str] = set()
        """Tasks whose committed ledger rows vanished (their later rows may reuse revisions)."""
        self._class_cache: dict[tuple[int, int], tuple[str, str, int | None, int] | None] = {}
        self.proc_samples = 0
        self.baton_samples = 0
        self.garbage: dict[str, GarbageRecord] = {}
        self.garbage_history: list[tuple[str, GarbageRecord]] = []
        self.garbage_seen_intact = 0
        self.expected_keys: dict[str, dict[str, Any]] = {}
        self.drops: dict[str, list[int]] = {}
        """Revisions at which the soak dropped a task's block by hand."""
        self.drops_found: dict[str, list[int]] = {}
        """The baton revision each of those drops left on disk (a restore leaves its copy's)."""
        self.latest: dict[str, dict[str, Any]] = {}
        """The last parsed baton per task."""
        self._stat: dict[str, tuple[int, ...]] = {}
        self._base: dict[str, tuple[int, int]] = {}
        self.segments: dict[str, list[_Segment]] = {}
        self.seen_epochs: dict[str, set[int]] = {}
        self.known_tasks: set[str] = set()

    # -- reporting ---------------------------------------------------------------------

    def violate(self, invariant: str, task: str, evidence: str, *, key: str | None = None) -> None:
        """Record a violation (once per ``key``) and print it at once with its evidence."""
        k = key or f"{invariant}:{task}:{evidence}"
        if k in self._reported:
            return
        self._reported.add(k)
        v = Violation(invariant, task, evidence)
        self.violations.append(v)
        print(v.line(), flush=True)

    def extend(self, violations: Iterable[Violation]) -> None:
        for v in violations:
            self.violate(v.invariant, v.task, v.evidence)

    # -- the process table -------------------------------------------------------------

    def _classify(self, pid: int) -> tuple[str, str, int | None, int] | None:
        """(kind, task, epoch, agent pgid) of a process of this state dir's agents, or None.

        kind is ``agent``, ``zombie`` (``SOAK_ZOMBIE=1``: an escaped writer the soak keeps on
        purpose) or ``grandchild`` (``SOAK_GRANDCHILD=1``: a ``setsid`` child an agent left,
        with ``SOAK_AGENT_PGID`` naming the agent's group).
        """
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                raw = handle.read()
        except OSError:
            return None
        task = state = ""
        kind = "agent"
        epoch: int | None = None
        agent_pgid = 0
        for item in raw.split(b"\0"):
            if item.startswith(b"HEARTBEAT_TASK="):
                task = item[15:].decode(errors="replace")
            elif item.startswith(b"HEARTBEAT_STATE_DIR="):
                state = item[20:].decode(errors="replace")
            elif item.startswith(b"HEARTBEAT_EPOCH="):
                value = item[16:]  # any process's environment: another test may hold a 5,000-digit epoch
                epoch = int(value) if value.isdigit() and len(value) <= 18 else None
            elif item == b"SOAK_ZOMBIE=1":
                kind = "zombie"
            elif item == b"SOAK_GRANDCHILD=1" and kind != "zombie":
                kind = "grandchild"
            elif item == b"SOAK_OUTSIDER=1":  # the soak's own command in an agent's environment
                return None
            elif item.startswith(b"SOAK_AGENT_PGID="):
                agent_pgid = int(item[16:]) if item[16:].isdigit() and len(item) <= 34 else 0
        if not task or not state or os.path.abspath(state) != self.state_dir:
            return None
        return (kind, task, epoch, agent_pgid)

    def sample_processes(self) -> dict[str, list[Group]]:
        """One pass over ``/proc``: live agent groups per task; checks overlaps as it goes."""
        found: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
        epochs: dict[tuple[str, int], int] = {}
        grandchildren: list[tuple[int, str, int, float]] = []
        try:
            names = os.listdir("/proc")
        except OSError:
            return {}
        cache, self._class_cache = self._class_cache, {}  # keep only what is still running
        for name in names:
            if not name.isdigit():
                continue
            pid = int(name)
            seen_at = boottime()  # before the read: alive then, if it had started by then
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    raw = handle.read()
            except OSError:
                continue
            parsed = _parse_proc_stat(raw)
            if parsed is None:
                continue
            state, pgid, start_ticks = parsed
            if state in (b"Z", b"X", b"x"):
                continue
            key = (pid, start_ticks)
            if key in cache:
                cls = self._class_cache[key] = cache[key]
            else:
                cls = self._classify(pid)
                # A child between fork and exec still has its parent's environment (an agent's
                # child that will exec a zombie looks like the agent): decide for good only
                # once the process is a second old.
                if seen_at - start_ticks / CLK_TCK > 1.0:
                    self._class_cache[key] = cls
            if cls is None:
                continue
            kind, task, epoch, agent_pgid = cls
            if kind == "zombie":
                self.zombie_pids.add(pid)
                continue
            if kind == "grandchild":
                grandchildren.append((pid, task, agent_pgid, seen_at))
                continue
            found.setdefault((task, pgid), []).append((pid, start_ticks / CLK_TCK, seen_at))
            if epoch is not None:
                epochs[(task, pgid)] = epoch
        self.proc_samples += 1
        live: dict[str, list[Group]] = {}
        touched: set[str] = set()
        for (task, pgid), members in found.items():
            leader = next((m for m in members if m[0] == pgid), None)
            start = leader[1] if leader else min(m[1] for m in members)
            last = max(m[2] for m in members)
            group = self.groups.get((task, pgid))
            if group is None or (leader is not None and abs(group.start - start) > 0.5):
                group = Group(task=task, pgid=pgid, start=start, first_seen=last, last_seen=last,
                              cmd=_cmdline(members[-1][0]), start_wall=start + time.time() - boottime())
                self.groups[(task, pgid)] = group
                self.groups_by_task.setdefault(task, []).append(group)
            group.last_seen = max(group.last_seen, last)
            group.start = min(group.start, start)
            if group.epoch is None:
                group.epoch = epochs.get((task, pgid))
            group.pids.update(m[0] for m in members)
            live.setdefault(task, []).append(group)
            touched.add(task)
        self.live = live
        self._check_grandchildren(grandchildren, live)
        for task in touched:
            mine = self.groups_by_task.get(task, [])
            if len(mine) > 1:
                for v in check_overlaps(mine):
                    self.violate(v.invariant, v.task, v.evidence,
                                 key=f"two-agents:{task}:{v.evidence.split(' were')[0][:60]}")
        return live

    def _check_grandchildren(self, seen: list[tuple[int, str, int, float]], live: dict[str, list[Group]]) -> None:
        """A ``setsid`` grandchild alive ``GRANDCHILD_GRACE`` after its agent's group was last seen."""
        alive_now = set()
        for pid, task, agent_pgid, seen_at in seen:
            alive_now.add(pid)
            gc = self.grandchildren.get(pid)
            if gc is None or gc.task != task:
                gc = self.grandchildren[pid] = Grandchild(pid, task, agent_pgid, seen_at, seen_at)
            gc.last_seen = seen_at
            if any(g.pgid == agent_pgid for g in live.get(task, ())):
                continue
            group = self.groups.get((task, agent_pgid))
            orphan_since = group.last_seen if group is not None else gc.first_seen
            if agent_pgid in self.shim_killed:
                self.grandchildren_exempt.add(pid)
                continue
            if seen_at - orphan_since > GRANDCHILD_GRACE:
                self.violate("setsid-outlived", task,
                             f"setsid grandchild pid {pid} of agent group {agent_pgid} (epoch "
                             f"{group.epoch if group else '?'}) still alive {seen_at - orphan_since:.1f}s after "
                             f"its agent's group was last seen", key=f"setsid:{pid}")
        self.grandchildren_alive = alive_now

    def groups_of(self, task: str) -> list[Group]:
        return list(self.groups_by_task.get(task, ()))

    # -- the batons --------------------------------------------------------------------

    def _lock_fd(self, task: str) -> int:
        fd = os.open(os.path.join(self.locks_dir, f"{task}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def hand_edit(self, task: str, change: Callable[[bytes], bytes | None], *, garbage: bool = False,
                  restore: bool = False) -> bytes | None:
        """Replace a baton by hand (as a careful human would: under its lock). Returns the new bytes.

        ``change`` gets the current bytes and returns the new ones, or None to leave it.
        """
        path = os.path.join(self.batons_dir, f"{task}.toml")
        with self.lock:
            fd = self._lock_fd(task)
            try:
                try:
                    with open(path, "rb") as handle:
                        old = handle.read()
                except FileNotFoundError:
                    return None
                if task in self.garbage and not restore:
                    return None
                new = change(old)
                if new is None:
                    return None
                tmp = os.path.join(self.batons_dir, f".soak-{task}.{os.getpid()}.tmp")
                with open(tmp, "wb") as handle:
                    handle.write(new)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.chmod(tmp, 0o600)
                os.replace(tmp, path)
            finally:
                os.close(fd)
            now = time.time()
            if garbage:
                record = GarbageRecord(data=new, original=old, written_at=now)
                self.garbage[task] = record
                self.garbage_history.append((task, record))
            elif restore:
                record = self.garbage.pop(task)
                record.restored_at = now
            doc = _loads(new)
            if doc is not None:
                meta = doc.get("meta", {})
                self._base[task] = (int(meta.get("revision", 0)), int(meta.get("epoch", 0)))
                self.max_rev_seen[task] = max(int(meta.get("revision", 0)), self.max_rev_seen.get(task, 0))
                self.latest[task] = doc
            self._stat.pop(task, None)
            return new

    def sample_batons(self) -> None:
        """Read every baton that changed since the last sample; check parse, garbage and monotonicity."""
        known = set(self.known_tasks)  # tasks this checker has read a baton of: none may go missing
        try:
            listing = list(os.scandir(self.batons_dir))
        except OSError:
            return
        present = set()
        for de in listing:
            name = de.name
            if name.startswith(".") or not name.endswith(".toml"):
                continue
            task = name[:-5]
            present.add(task)
            before_stat = time.time()  # the content seen at the stat was there at this time already
            try:
                st = de.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if self._stat.get(task) == key:
                segs = self.segments.get(task)
                if segs:
                    segs[-1].last = before_stat
                continue
            with self.lock:
                self._sample_one(task, de.path)
                self._stat[task] = key
        self.baton_samples += 1
        for task in known - present:
            self.violate("invalid-baton", task, "the baton file disappeared", key=f"gone:{task}")

    def _sample_one(self, task: str, path: str) -> None:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return
        now = time.time()  # after the read: the content was certainly there by now
        self.known_tasks.add(task)
        record = self.garbage.get(task)
        if record is not None:
            if data == record.data:
                self.garbage_seen_intact += 1
                self._segment(task, -1, -1, "invalid", now)
            else:
                self.violate("invalid-baton", task,
                             f"the soak's garbage ({len(record.data)} bytes) was replaced by {len(data)} other bytes "
                             f"before the soak repaired it: {data[:120]!r}")
            return
        doc = _loads(data)
        problem = _baton_problem(doc)
        if problem:
            self.violate("invalid-baton", task, f"unreadable baton the soak did not write ({problem}): {data[:160]!r}")
            return
        assert doc is not None
        meta = doc["meta"]
        rev, epoch, status = int(meta["revision"]), int(meta["epoch"]), str(meta["status"])
        base = self._base.get(task)
        if base is not None and (rev < base[0] or epoch < base[1]):
            self.violate("monotonic", task, f"(revision, epoch) went from {base} to {(rev, epoch)}")
        self._base[task] = (rev, epoch)
        self.latest[task] = doc
        self.max_rev_seen[task] = max(rev, self.max_rev_seen.get(task, 0))
        self.seen_epochs.setdefault(task, set()).add(epoch)
        self._segment(task, rev, epoch, status, now)

    def _segment(self, task: str, rev: int, epoch: int, status: str, now: float) -> None:
        # Only blocked stretches are kept (and the current one): they are all the checks need.
        segs = self.segments.setdefault(task, [])
        if segs and (segs[-1].revision, segs[-1].epoch, segs[-1].status) == (rev, epoch, status):
            segs[-1].last = now
            return
        if segs and segs[-1].status != "blocked":
            segs.pop()
        segs.append(_Segment(rev, epoch, status, now, now))

    def check_sampled_blocks(self, margin: float = 0.05) -> None:
        """No group started while the sampled baton sat blocked at one revision around its start."""
        for g in list(self.groups.values()):
            if g.task in self.rewritten:
                continue  # its history was rewritten (ledger-kept): a restore may have put a block back
            start = g.start_wall
            for seg in self.segments.get(g.task, ()):  # blocked stretches (and each task's last)
                if g.epoch is not None and g.epoch <= seg.epoch:
                    continue  # its dispatch is older than this blocked revision: the block landed on it
                if seg.status == "blocked" and seg.first + margin < start < seg.last - margin:
                    self.violate("blocks-hold", g.task,
                                 f"agent process group {g.pgid} ({g.cmd}) started at {start:.3f} while the baton sat "
                                 f"blocked at revision {seg.revision} from {seg.first:.3f} to {seg.last:.3f} (samples)")

    # -- the ledger's rows ---------------------------------------------------------------

    def sample_ledger(self) -> None:
        """Read the rows added since the last sample; find rows that vanished and judge them.

        A vanished row is a violation unless it is the event of a write that crashed before its
        rename (``supersede``): such a write's revision was never on the baton, so the samples
        taken before the row was last seen had not read that revision (or a higher one).
        """
        path = os.path.join(self.state_dir, "ledger.sqlite3")
        if not os.path.exists(path):
            return
        with self.lock:
            snapshot = dict(self.max_rev_seen)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            new = conn.execute("SELECT id, task, revision, kind FROM events WHERE id > ?",
                               (self._ledger_max_id,)).fetchall()
            count = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            for row_id, task, revision, kind in new:
                self._ledger_rows[row_id] = (str(task), int(revision or 0), str(kind))
                self._ledger_max_id = max(self._ledger_max_id, row_id)
            gone: list[int] = []
            if count < len(self._ledger_rows):
                present = {r[0] for r in conn.execute("SELECT id FROM events")}
                gone = [i for i in self._ledger_rows if i not in present]
        finally:
            conn.close()
        by_task: dict[str, list[tuple[int, int, str]]] = {}
        for row_id in gone:
            task, revision, kind = self._ledger_rows.pop(row_id)
            by_task.setdefault(task, []).append((row_id, revision, kind))
        for task, rows in by_task.items():
            seen = self._ledger_snapshot.get(task, 0)
            landed = [r for r in rows if r[1] <= seen]
            # A coalesced touch row is updated in place (its revision rises after we read it): a
            # crashed touch can thus take one touch row with it; judge touches only beside others.
            if landed and any(kind != "touched" for _i, _r, kind in landed):
                self.rewritten.add(task)
                self.violate("ledger-kept", task,
                             f"{len(rows)} ledger rows vanished, {len(landed)} of them of revisions the baton had "
                             f"already reached (highest seen {seen}): ids/revisions/kinds {sorted(landed)[:8]}",
                             key=f"ledger-kept:{task}:{min(r[0] for r in landed)}")
            else:
                self.ledger_rows_superseded += len(rows)
        self._ledger_snapshot = snapshot
        self.ledger_samples += 1

    # -- the end -----------------------------------------------------------------------

    def final_baton(self, task: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.batons_dir, f"{task}.toml"), "rb") as handle:
                return _loads(handle.read())
        except OSError:
            return None


def _loads(data: bytes) -> dict[str, Any] | None:
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _baton_problem(doc: dict[str, Any] | None) -> str:
    """Why ``doc`` is not a baton (a minimal, independent check), or ``""``."""
    if doc is None:
        return "not TOML"
    for name in ("task", "step"):
        if not isinstance(doc.get(name), str):
            return f"{name} is not a string"
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        return "no [meta]"
    for name in ("revision", "epoch"):
        if not isinstance(meta.get(name), int) or meta[name] < 0:
            return f"meta.{name} is not a non-negative integer"
    if meta.get("status") not in STATUSES:
        return f"meta.status {meta.get('status')!r}"
    return ""


class TickWatch:
    """The daemon's ticks, seen from outside: a datagram socket given to it as ``NOTIFY_SOCKET``.

    The daemon sends ``WATCHDOG=1`` after every tick, ``READY=1`` when it starts serving (and
    after a reload), ``STOPPING=1`` when it shuts down. The soak owns the socket, so the
    beats are the daemon's own (agents never get ``NOTIFY_SOCKET``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.beats: list[tuple[float, str]] = []
        """(wall time, ``READY`` | ``WATCHDOG`` | ``STOPPING`` | ``RELOADING``), in arrival order."""
        self.mono_beats: list[tuple[float, str]] = []
        """The same, stamped on the monotonic clock (what the clock-step check measures on)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-tickwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            now, mono = time.time(), time.monotonic()
            for line in data.decode(errors="replace").splitlines():
                name = line.split("=", 1)[0]
                if name in ("READY", "WATCHDOG", "STOPPING", "RELOADING"):
                    self.beats.append((now, name))
                    self.mono_beats.append((mono, name))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def tick_gaps(beats: Sequence[tuple[float, str]], up: Sequence[tuple[float, float]], limit: float,
              now: float | None = None, startup: float = 0.0, first_pass: float = 0.0) -> list[tuple[float, float]]:
    """Stretches longer than ``limit`` without a beat while the daemon was up and serving.

    ``up`` are the daemon's (start, end) intervals (end may be +inf), start being when it
    said it started (its first log line). The clock is due from its first ``READY``; a
    daemon that never gets there is judged from ``start + startup`` (so one stuck before
    its first tick is caught too). The first pass after a start reads every baton cold and
    the ledger's blocks, so its ``WATCHDOG`` may come up to ``first_pass`` after ``READY``
    (when that is more than ``limit``; a reload's beats meanwhile do not end it); every later
    beat is due within ``limit``. Serving stops at
    ``STOPPING`` (or the interval's end); every beat of any kind ends a gap. Returns (from,
    to) of each gap.
    """
    now = time.time() if now is None else now
    out = []
    for start, end in up:
        end = min(end, now)
        inside = [(t, name) for t, name in beats if start <= t <= end]
        stop = next((t for t, name in inside if name == "STOPPING"), end)
        last = next((t for t, name in inside if name == "READY"), start + startup)
        first = first_pass > limit  # the first pass runs until the first WATCHDOG after READY
        for t, name in inside:
            if t <= last:
                continue
            if t > stop:
                break
            if first and name != "WATCHDOG":
                continue  # a reload's RELOADING/READY during the first pass is not its end
            if t - last > (first_pass if first else limit):
                out.append((last, t))
            last, first = t, False
        allowed = first_pass if first else limit
        if stop - last > allowed:
            out.append((last, stop))
    return out


@dataclass
class ClockStep:
    """A step of the daemon's wall clock the soak made (by rewriting its test clock's offset file)."""

    wall: float
    """When, on the machine's wall clock (the soak's own, which never steps)."""
    mono: float
    """When, on the soak's monotonic clock."""
    before: float
    """The daemon's shift before the step (seconds)."""
    after: float
    """And after it."""
    watched: bool = False
    """The daemon was serving (``READY``) at the step and stayed up ``watch`` seconds after it (set by
    the soak): it must log the step."""
    ticking: bool = False
    """Watched, and the daemon had ticked since it started (its first pass, which may take
    ``FIRST_PASS``, was over): its tick must go on within ``watch``."""

    @property
    def size(self) -> float:
        return self.after - self.before


def map_ledger_times(events: Sequence[LedgerEvent], offsets: Iterable[float], lo: float,
                     hi: float) -> tuple[list[LedgerEvent], int]:
    """Ledger times on the machine's clock: an event stamped by a daemon whose wall clock was shifted by one
    of ``offsets`` is shifted back. A time inside [lo, hi] (the soak's run, machine clock) stays; any other is
    moved by the one offset that puts it inside (the soak steps by more than its whole run, so at most one
    does). Returns the events and how many were moved."""
    shifts = sorted({o for o in offsets if o != 0.0})
    out, moved = [], 0
    for e in events:
        if not lo <= e.ts <= hi:
            o = next((o for o in shifts if lo <= e.ts - o <= hi), None)
            if o is not None:
                e = replace(e, ts=e.ts - o)
                moved += 1
        out.append(e)
    return out, moved


def check_clock_steps(steps: Sequence[ClockStep], lines: Sequence[tuple[float, str, float]],
                      beats: Sequence[tuple[float, str]], *, watch: float,
                      tolerance: float = 5.0) -> list[Violation]:
    """Each watched step has its ``clock_stepped`` line and a tick after it; no line without a step.

    ``lines``: (machine wall time of the log line, ``direction``, ``seconds``); ``beats``: (the soak's
    monotonic time, name) of the daemon's notifications. A line belongs to a step when it came after it
    (0.5 s of log-stamp slack), says the step's direction, and its size is the step's within
    ``tolerance`` seconds (a step made while the daemon started may be logged late, once it serves); a
    watched step's line must come within ``watch`` + 2 s."""
    out = []
    used: set[int] = set()
    for step in steps:
        direction = "back" if step.size < 0 else "forward"
        match = next((i for i, (t, d, secs) in enumerate(lines)
                      if i not in used and step.wall - 0.5 <= t and d == direction
                      and abs(secs - abs(step.size)) <= tolerance), None)
        if match is not None:
            used.add(match)
        if not step.watched:
            continue
        if match is None or lines[match][0] > step.wall + watch + 2.0:
            out.append(Violation("clock-step", "", f"no clock_stepped line ({direction}, {abs(step.size):.0f}s) "
                                                   f"within {watch + 2.0:g}s of the step the soak made at "
                                                   f"{step.wall:.3f}"))
        if step.ticking and not any(name == "WATCHDOG" and step.mono < m <= step.mono + watch for m, name in beats):
            out.append(Violation("clock-step", "", f"no tick within {watch:g}s (monotonic) after the {direction} "
                                                   f"step of {abs(step.size):.0f}s at {step.wall:.3f}"))
    for i, (t, d, secs) in enumerate(lines):
        if i not in used:
            out.append(Violation("clock-step", "", f"the daemon logged clock_stepped ({d}, {secs}s) at {t:.3f} "
                                                   "with no step made by the soak"))
    return out


_DURATION = re.compile(r"\b(?:for|after) ((?:\d+(?:\.\d+)?(?:ms|d|h|m|s))+)\b")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _durations(text: str) -> list[float]:
    """The durations a daemon's reason cites ("hung: alive but silent for 2h3s" -> [7203.0])."""
    return [sum(float(n) * _UNIT[u] for n, u in _PART.findall(m)) for m in _DURATION.findall(text)]


def check_stepped_decisions(events: Sequence[LedgerEvent], groups: Sequence[Group], *, span: float,
                            max_runtime: float, margin: float = 1.0) -> list[Violation]:
    """No daemon decision measured across a clock step (one task's events, times already mapped).

    - a daemon event (stopped, escalated, stalled, spinning, exited, ...) whose reason cites a duration
      longer than ``span`` (the soak's whole run): no agent was silent, spinning or waiting that long;
    - a ``stopped`` event for ``max_runtime`` less than ``max_runtime`` - ``margin`` seconds after its
      epoch's ``dispatched`` event (the daemon counts a run from its dispatch, which may come seconds
      before the agent's process on a loaded machine), or, with no such event, after the epoch's
      agent group started."""
    out = []
    for e in events:
        if e.actor != "daemon":
            continue
        for value in e.data.values():
            if isinstance(value, str) and any(d > span for d in _durations(value)):
                out.append(Violation("clock-step", e.task, f"{e.kind} (id {e.id}, epoch {e.epoch}) cites a duration "
                                                           f"longer than the soak's {span:.0f}s: {value!r:.160}"))
                break
        if e.kind == "stopped" and "max_runtime" in str(e.data.get("reason", "")):
            starts = [d.ts for d in events if d.kind == "dispatched" and d.epoch == e.epoch and d.id < e.id] or [
                g.start_wall for g in groups if g.epoch == e.epoch and g.start_wall]
            if starts and e.ts - min(starts) < max_runtime - margin:
                ran = e.ts - min(starts)
                out.append(Violation("clock-step", e.task, f"stopped past max_runtime ({max_runtime:g}s) {ran:.1f}s "
                                                           f"after its dispatch (id {e.id}, epoch {e.epoch})"))
    return out
