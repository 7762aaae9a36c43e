"""What the page shows: the rows, the timeline and the log tail, read from the store and the ledger."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Status, check_id
from heartbeat.model.errors import BadInput, HeartbeatError, UnsafePath
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.policy import Policy, waiting_text
from heartbeat.model.timeparse import format_duration
from heartbeat.reports.why import State, shown_step, why
from heartbeat.system.layout import LOGS_DIR, StateLayout, log_name
from heartbeat.system.safefile import read_tail_below
from heartbeat.tasks.questions import waiting_on

__all__ = ["LOG_TAIL_BYTES", "TIMELINE_EVENTS", "LogTail", "log_tail_of", "question_rows"]

LOG_TAIL_BYTES = 64 * 1024
"""How much of the end of an agent's log the task page shows."""

TIMELINE_EVENTS = 500
"""The most recent ledger events the task page lists."""

_ROUTINE_KINDS = frozenset({EventKind.TOUCHED, EventKind.UPDATED})
"""Left out of a task's timeline unless ``?all=1``: the agent's own progress writes, which the baton shows."""

_STATUS_ORDER = ("escalated", "invalid", "blocked", "active", "paused", "snoozed", "failed", "done")


# -- the agent's log, read as hostile input ------------------------------------------------


@dataclass
class LogTail:
    """The end of an agent's log, or why there is none to show."""

    path: str
    text: str = ""
    size: int = 0
    truncated: bool = False
    problem: str = ""


def log_tail_of(state_dir: str, task_id: str, epoch: int, limit: int = LOG_TAIL_BYTES) -> LogTail:
    """The last ``limit`` bytes of ``<state_dir>/logs/<task>/<epoch>.log``, or why they are not shown.

    The agent owns that file, and could have put anything in its place: it is read by
    :func:`~heartbeat.system.safefile.read_tail_below` (no symlink followed at any step, a FIFO
    never waited on, regular files only, the read bounded whatever the file's size).
    """
    check_id(task_id)
    tail = LogTail(path=StateLayout(state_dir).log(task_id, epoch))
    try:
        data, tail.size = read_tail_below(state_dir, (LOGS_DIR, task_id), log_name(epoch), limit)
    except FileNotFoundError:
        tail.problem = "no log yet"
        return tail
    except UnsafePath as exc:
        tail.problem = f"not shown: {exc.message}"
        return tail
    except OSError as exc:
        tail.problem = f"not shown: {exc.strerror or exc} (a symlink or not a directory is never followed)"
        return tail
    if tail.size > limit:
        tail.truncated = True
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1:]  # begin at a whole line
    tail.text = data.decode("utf-8", errors="replace")
    return tail


# -- what the pages show --------------------------------------------------------------------


def _age(now: datetime, then: datetime | None) -> str:
    return "-" if then is None else format_duration(max(0.0, (now - then).total_seconds()))


def _owner_text(baton: Baton) -> str:
    owner = baton.meta.owner
    if owner is None:
        return ""
    parts = [f"pid {owner.pid}" if owner.pid is not None else "pid pending"]
    if owner.host:
        parts.append(f"on {owner.host}")
    if owner.launcher:
        parts.append(f"via {owner.launcher}")
    if owner.unit:
        parts.append(f"unit {owner.unit}")
    if owner.how:
        parts.append(f"({owner.how})")
    return " ".join(parts)


def _gate_text(baton: Baton) -> str:
    gate = baton.meta.gate
    if gate is None:
        return ""
    return f"{gate.kind.value}:{gate.target}" if gate.target else gate.kind.value


def _last_exit(baton: Baton) -> str:
    meta = baton.meta
    code = f"exit {meta.last_exit}" if meta.last_exit is not None else ""
    if meta.last_failure:
        return meta.last_failure if not code or code in meta.last_failure else f"{code}; {meta.last_failure}"
    return code


def _state_since(baton: Baton) -> datetime | None:
    """When the task entered its current state, as far as the baton tells."""
    meta = baton.meta
    if meta.status is Status.BLOCKED and meta.blocked_at is not None:
        return meta.blocked_at
    if meta.status in (Status.DONE, Status.FAILED) and meta.ended_at is not None:
        return meta.ended_at
    if meta.status is Status.ACTIVE and meta.owner is not None and meta.dispatched_at is not None:
        return meta.dispatched_at
    return meta.updated_at or meta.created_at


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else ""


def _row(entry: Any, now: datetime, default_launcher: str, policy: Any = None,
         status_of: Callable[[str], Status | None] | None = None) -> dict[str, Any]:
    baton: Baton | None = entry.baton
    if baton is None:
        return {"id": entry.id, "status": "invalid", "error": str(entry.error), "age": "-", "step": "",
                "attempt": "", "epoch": "", "owner": "", "blocked_on": "", "gate": "", "last_exit": "",
                "launcher": "", "waiting": "", "title": "", "since": "", "since_at": "", "wake_at": "", "reason": "",
                "badge": "invalid", "state": "invalid", "why": "", "asking": "", "asking_escalated": False}
    meta = baton.meta
    since = _state_since(baton)
    held = why(baton, now, policy or Policy(), status_of)
    asking = waiting_on(baton)
    # An active task's badge says how it is doing: a launch failing or a retry backing off is not
    # "active" at a glance (as supervisord's BACKOFF/FATAL, systemd's auto-restart).
    badge = held.state.value if meta.status is Status.ACTIVE and held.state in _BADGED else meta.status.value
    return {
        "id": entry.id,
        "status": meta.status.value,
        "badge": badge,
        "state": held.state.value,
        "why": held.text if meta.status is Status.ACTIVE else "",
        "error": "",
        "title": baton.task,
        "since": _age(now, since),
        "since_at": _iso(since),
        "wake_at": _iso(meta.snooze_until) if meta.status is Status.SNOOZED else "",
        "reason": "",
        "age": _age(now, meta.touched_at or meta.updated_at),
        "step": shown_step(baton),
        "next_step": baton.next_step,
        "attempt": meta.attempt,
        "epoch": meta.epoch,
        "owner": _owner_text(baton),
        "owner_host": meta.owner.host if meta.owner is not None else "",
        "blocked_on": baton.blocked_on,
        "gate": _gate_text(baton),
        "last_exit": _last_exit(baton),
        "launcher": baton.launcher or default_launcher,
        "waiting": waiting_text(baton, now),
        "asking": asking.describe(now) if asking is not None else "",
        "asking_escalated": asking is not None and asking.escalated,
    }


def question_rows(baton: Baton, now: datetime, *, open_only: bool = True) -> list[dict[str, Any]]:
    """A task's questions as the page lists them, each with the command that answers it."""
    shown = [q for q in baton.questions if q.open or not open_only]
    return [{"task": baton.id, "id": q.id, "asked_of": q.asked_of, "text": q.text, "age": _age(now, q.asked_at),
             "asked_at": _iso(q.asked_at), "escalated": q.escalated_at is not None, "open": q.open,
             "answer": q.answer, "answered_by": q.answered_by, "answered_at": _iso(q.answered_at),
             "command": f'heartbeat answer {baton.id} {q.id} "..."'} for q in shown]


def _hosts_of(store: Any) -> dict[str, str]:
    """Task id -> the host holding its lease on a shared store (empty when it cannot be read)."""
    from heartbeat.ops.lease import lease_rows

    try:
        return {task_id: row.host for task_id, row in lease_rows(store).items()}
    except HeartbeatError:
        return {}


def _lost_hosts(store: Any) -> set[str]:
    """The hosts of a shared store past their lease_ttl unrenewed: their shims stopped their
    agents, so a task they hold runs nothing (empty when the hosts cannot be read)."""
    from heartbeat.ops.lease import list_hosts

    try:
        return {h.host for h in list_hosts(store) if h.state == "lost"}
    except HeartbeatError:
        return set()


def _daemon_alive(vitals: Any) -> bool:
    """Whether the daemon that wrote ``vitals`` still runs: its pid alive and started when it said
    (a reused pid is not it). Another host's daemon cannot be seen from here: counted alive."""
    from heartbeat.launchers.liveness import this_host

    if vitals.host and vitals.host != this_host():
        return True
    try:
        import psutil

        started = psutil.Process(vitals.pid).create_time()
    except (psutil.Error, ValueError, OSError):
        return False
    return abs(started - vitals.started_at) < 30


_BADGED = frozenset({State.LAUNCH_FAILING, State.BACKING_OFF, State.ESCALATING, State.RATE_LIMITED,
                     State.WAITING_UPSTREAM})
"""The states of an active task its badge names instead of "active"."""


def _status_of(entry: Any) -> str:
    return entry.baton.meta.status.value if entry.baton is not None else "invalid"


def _matches(entry: Any, query: str) -> bool:
    """``?q=``: a case-insensitive substring of the task's id, title, step or block."""
    if not query:
        return True
    needle = query.casefold()
    baton: Baton | None = entry.baton
    fields = [entry.id] if baton is None else [entry.id, baton.task, baton.step, baton.blocked_on]
    return any(needle in f.casefold() for f in fields)


def _list_params(params: Any) -> tuple[str, int, int]:
    """``?q=``, ``?page=`` and ``?per=`` of the task list, checked: (query, page, per page)."""
    query = params.get("q", "").strip()
    if len(query) > defaults.WEB_QUERY_MAX:
        raise BadInput(f"q is {len(query)} characters: at most {defaults.WEB_QUERY_MAX}")
    numbers = {}
    for name, default, most in (("page", 1, 10**9), ("per", defaults.WEB_PAGE_SIZE, defaults.WEB_PAGE_MAX)):
        raw = params.get(name, "")
        try:
            value = int(raw) if raw else default
        except ValueError:
            raise BadInput(f"{name} {raw[:40]!r}: expected a whole number") from None
        if not 1 <= value <= most:
            raise BadInput(f"{name} {value}: expected 1 to {most}")
        numbers[name] = value
    return query, numbers["page"], numbers["per"]


_SUMMARY_KEYS: dict[str, tuple[str, ...]] = {
    EventKind.DISPATCHED: ("launcher", "attempt", "reason", "resume"),
    EventKind.EXITED: ("kind", "code", "signal", "duration_s", "progress", "pid"),
    EventKind.STALLED: ("why",),
    EventKind.RATE_LIMITED: ("until", "source", "hits", "reason"),
    EventKind.BLOCKED: ("on", "gate"),
    EventKind.UNBLOCKED: ("by", "note", "gate"),
    EventKind.ESCALATED: ("reason",),
    EventKind.BYPASS: ("was", "on"),
}


def _needs_rows(store: Any, baton: Baton) -> list[dict[str, str]]:
    """The task view's needs: of each upstream edge (this task needs) and of each downstream edge
    (its downstreams need of this task), each with where it came from and its evidence."""
    from heartbeat.tasks.needs import downstream_needs, edge_needs, edge_role, role_events

    by_role = role_events(store)
    rows = [{"edge": f"{u} -> {baton.id}", "role": edge_role(u, baton.id), "side": "needs of its upstream",
             **n.to_json()} for u in baton.after for n in edge_needs(store, baton, u, by_role=by_role)]
    rows.extend({"edge": f"{baton.id} -> {d}", "role": edge_role(baton.id, d), "side": "its downstream needs",
                 **n.to_json()} for d, found in downstream_needs(store, baton.id) for n in found)
    return rows


def _event_row(event: Event) -> dict[str, Any]:
    """One timeline line: the event's kind, when, who, and its data as ``key=value`` (hashes elided)."""
    data = dict(event.data)
    first = [k for k in _SUMMARY_KEYS.get(event.kind, ()) if k in data]
    rest = sorted(k for k in data if k not in first)
    details = []
    for key in (*first, *rest):
        value = data[key]
        if value in ("", None, [], {}):
            continue
        if key == "world" and isinstance(value, dict):
            value = f"<{len(value)} fingerprints>"
        elif key == "duration_s" and isinstance(value, int | float):
            value = format_duration(float(value))
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        details.append((key, value if isinstance(value, str) else str(value)))
    seam = event.kind in (EventKind.STALLED, EventKind.EXITED, EventKind.DISPATCHED, EventKind.CLAIMED,
                          EventKind.RELEASED, EventKind.SESSION_STARTED, EventKind.COMPACTING, EventKind.SESSION_ENDED)
    alarm = event.kind in (EventKind.ESCALATED, EventKind.BYPASS, EventKind.SPINNING, EventKind.INVALID)
    return {"ts": event.ts.strftime("%Y-%m-%d %H:%M:%S"), "kind": event.kind, "epoch": event.epoch,
            "revision": event.revision, "actor": event.actor, "details": details,
            "tone": "alarm" if alarm else ("seam" if seam else "")}


def _templates() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("heartbeat.web", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["duration"] = lambda seconds: format_duration(float(seconds))
    return env


@dataclass
class _Entry:
    """A stand-in for a store entry, to render the task page's row like the list's."""

    id: str
    baton: Baton | None
    error: str


def _open_line(url: str, token: str, terminal: bool) -> str:
    """What to open: the URL with its token for the person at a terminal; elsewhere (a journal, a
    log file others may read) the token is not written out."""
    if not token or not url.startswith("http"):
        return ""
    if terminal:
        return f"; open {url}?{urlencode({'token': token})}"
    return f"; open {url}?token=TOKEN (the --token or $HEARTBEAT_WEB_TOKEN; not printed: stderr is no terminal)"
