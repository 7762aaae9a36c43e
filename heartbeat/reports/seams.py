"""The seams inside a live session, and what the runs cost, read back from the ledger.

``heartbeat report`` adds these per task (``seams``) and in total, next to the handoff
metrics of :mod:`heartbeat.reports.report`. They come from the events the Claude Code hooks record
(:mod:`heartbeat.integrations.hooks`) and from the ``exited`` events of launchers that report usage:

``session_starts``
    ``session_started`` events by ``source``: ``startup``, ``resume``, ``clear``, ``compact``
    (a context compaction inside a live session), ``fork``.
``compactions``, ``compactions_fresh``, ``compactions_stale``
    ``compacting`` events (PreCompact), and whether the note was fresh when the gap came:
    written within ``hooks.fresh_within`` (the hook records its judgement as ``fresh``; an
    event without it is judged by ``note_age_s`` against the default).
``stop_blocks``
    Stop-hook blocks (``stop_blocked``): the agent tried to stop without writing its note.
``sessions_ended``
    ``session_ended`` events (SessionEnd).
``runs``, ``cost_usd``, ``tokens``, ``turns``
    ``exited`` events carrying a cost (``cost_usd``, as the presets record it, or
    ``total_cost_usd``), token counts (``*_tokens`` numbers, top-level or in ``usage``) or
    ``num_turns``: how many, their summed cost, their summed token counts, turns.
``resume_runs``, ``resume_cost_usd``, ``resume_tokens``
    the same for runs that were resumes (an agent start after the task's first): what the
    handoffs cost, the price of re-deriving what the previous agent knew.

Cost and token keys are ``null`` / ``{}`` when no run reported them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from heartbeat.model import defaults
from heartbeat.model.ledger import Event, EventKind

__all__ = ["SEAM_KEYS", "seam_metrics", "seam_totals", "render_seams"]

SEAM_KEYS = (
    "session_starts",
    "compactions",
    "compactions_fresh",
    "compactions_stale",
    "stop_blocks",
    "sessions_ended",
    "runs",
    "cost_usd",
    "tokens",
    "turns",
    "resume_runs",
    "resume_cost_usd",
    "resume_tokens",
)
"""The keys of a task's ``seams`` and of the totals, in this order."""

_COUNTS = ("compactions", "compactions_fresh", "compactions_stale", "stop_blocks", "sessions_ended", "runs",
           "turns", "resume_runs")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _tokens(usage: Any) -> dict[str, int]:
    if not isinstance(usage, dict):
        return {}
    return {k: int(v) for k, v in usage.items()
            if isinstance(k, str) and k.endswith("_tokens") and isinstance(v, int) and not isinstance(v, bool)
            and v >= 0}


def _add_tokens(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _add_cost(total: float | None, cost: float | None) -> float | None:
    if cost is None:
        return total
    return round((total or 0.0) + cost, 6)


def empty() -> dict[str, Any]:
    return {"session_starts": {}, **dict.fromkeys(_COUNTS, 0), "cost_usd": None, "tokens": {},
            "resume_cost_usd": None, "resume_tokens": {}}


def seam_metrics(events: Iterable[Event], *, since: datetime | None = None,
                 fresh_within: float = defaults.HOOK_FRESH_WITHIN) -> dict[str, Any]:
    """One task's seams (keys :data:`SEAM_KEYS`) from its events in ledger order."""
    m = empty()
    m = {k: m[k] for k in SEAM_KEYS}
    starts = 0
    resume_of: dict[int, bool] = {}  # epoch -> the agent holding it is a resume (a start after the first)
    for e in events:
        data = e.data if isinstance(e.data, dict) else {}
        if e.kind in (EventKind.DISPATCHED, EventKind.CLAIMED) or (e.kind == EventKind.CREATED and e.epoch > 0):
            same = (e.kind == EventKind.CLAIMED and data.get("pid") is not None
                    and data.get("pid") == data.get("previous_pid"))
            if not same:
                starts += 1
            resume_of[e.epoch] = starts > 1  # the same process claiming again keeps its standing
        if since is not None and e.ts < since:
            continue
        if e.kind == EventKind.SESSION_STARTED:
            source = str(data.get("source") or "startup")
            m["session_starts"][source] = m["session_starts"].get(source, 0) + 1
        elif e.kind == EventKind.COMPACTING:
            m["compactions"] += 1
            fresh = data.get("fresh")
            if not isinstance(fresh, bool):
                age = _number(data.get("note_age_s"))
                fresh = age is not None and age <= fresh_within
            m["compactions_fresh" if fresh else "compactions_stale"] += 1
        elif e.kind == EventKind.STOP_BLOCKED:
            m["stop_blocks"] += 1
        elif e.kind == EventKind.SESSION_ENDED:
            m["sessions_ended"] += 1
        elif e.kind == EventKind.EXITED:
            # The presets record ``cost_usd`` and ``*_tokens`` at the top level; a launcher of
            # its own may pass Claude's own ``total_cost_usd`` and ``usage`` through.
            cost = _number(data.get("cost_usd", data.get("total_cost_usd")))
            tokens = _tokens(data.get("usage")) or _tokens(data)
            turns = data.get("num_turns")
            if cost is None and not tokens and not isinstance(turns, int):
                continue
            resume = resume_of.get(e.epoch, False)
            m["runs"] += 1
            m["cost_usd"] = _add_cost(m["cost_usd"], cost)
            _add_tokens(m["tokens"], tokens)
            if isinstance(turns, int) and not isinstance(turns, bool) and turns >= 0:
                m["turns"] += turns
            if resume:
                m["resume_runs"] += 1
                m["resume_cost_usd"] = _add_cost(m["resume_cost_usd"], cost)
                _add_tokens(m["resume_tokens"], tokens)
    return m


def seam_totals(per_task: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The sum of tasks' seams."""
    total = {k: empty()[k] for k in SEAM_KEYS}
    for m in per_task:
        for source, n in m["session_starts"].items():
            total["session_starts"][source] = total["session_starts"].get(source, 0) + n
        for key in _COUNTS:
            total[key] += m[key]
        total["cost_usd"] = _add_cost(total["cost_usd"], m["cost_usd"])
        total["resume_cost_usd"] = _add_cost(total["resume_cost_usd"], m["resume_cost_usd"])
        _add_tokens(total["tokens"], m["tokens"])
        _add_tokens(total["resume_tokens"], m["resume_tokens"])
    return total


def _any(m: dict[str, Any]) -> bool:
    return bool(m["session_starts"] or m["compactions"] or m["stop_blocks"] or m["runs"] or m["sessions_ended"])


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _line(m: dict[str, Any]) -> str:
    parts = []
    if m["session_starts"]:
        by = ", ".join(f"{src} {n}" for src, n in sorted(m["session_starts"].items()))
        parts.append(f"sessions {sum(m['session_starts'].values())} ({by})")
    if m["compactions"]:
        parts.append(f"compactions {m['compactions']} (note fresh {m['compactions_fresh']}, "
                     f"stale {m['compactions_stale']})")
    if m["stop_blocks"]:
        parts.append(f"stop blocks {m['stop_blocks']}")
    if m["runs"]:
        tokens = m["tokens"]
        cost = "cost ?" if m["cost_usd"] is None else f"${m['cost_usd']:.4f}"
        run = f"{m['runs']} run(s) {cost}"
        if tokens:
            run += f", {_k(tokens.get('input_tokens', 0))} in / {_k(tokens.get('output_tokens', 0))} out tokens"
        if m["resume_runs"]:
            resume = "?" if m["resume_cost_usd"] is None else f"${m['resume_cost_usd']:.4f}"
            run += f"; resumes {m['resume_runs']} run(s) {resume}"
        parts.append(run)
    return "; ".join(parts)


def render_seams(tasks: list[tuple[str, dict[str, Any]]], total: dict[str, Any]) -> list[str]:
    """Text lines for the report: one per task with seams or cost, then the total (none when there are none)."""
    shown = [(task_id, m) for task_id, m in tasks if _any(m)]
    if not shown:
        return []
    lines = ["", "inside sessions (Claude Code hooks) and cost:"]
    lines += [f"{task_id}: {_line(m)}" for task_id, m in shown]
    if len(shown) > 1:
        lines.append(f"TOTAL: {_line(total)}")
    return lines
