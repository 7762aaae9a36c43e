"""The edge profile: which handoffs between tasks are clean and which lose context.

``heartbeat report --edges`` reads every downstream's ``after`` from the batons and the
ledger's events, and counts per upstream→downstream edge (keys exactly as below):

``handoffs``
    the upstream's ``handed_off`` events (each ``done`` freezes one package for every
    downstream).
``missing``, ``missing_parts``
    handoffs whose package had empty parts, and which parts (intent, constraints,
    decisions, rejected, unknowns, handoff, key_files, guarantees).
``rederived``
    items the downstream said it had to re-derive (``heartbeat add ID rederived ...``);
    a downstream with several upstreams counts them on each of its edges.
``guarantee_failed``
    the upstream's own ``done`` refused because one of its checked guarantees failed (its
    ``guarantee_failed`` events): a producer that cannot meet its promise.
``broken``
    the upstream's guarantees the downstream's ``verify`` found broken.
``reopens``
    times the downstream's ``verify`` sent the upstream back to work (``reopen`` or
    ``fallback:``; ``escalate`` counts as broken only).
``time_to_progress_s``
    mean over handoffs of: the upstream's ``done`` to the downstream's first progress
    (a step change, ``done`` growing, or the downstream finishing); ``null`` when none.

``role``, ``needs``
    the edge's role (what recurs across pipeline runs: ``*.build->*.review``) and its effective
    needs, each ``{"part", "source", "evidence"}`` with ``source`` ``declared``, ``learned`` (the
    evidence: "review re-derived `rejected` in 2 of the last 3 handoffs") or ``pinned``
    (:mod:`heartbeat.tasks.needs`).
``asked``, ``answered``, ``escalated``
    questions the downstream asked of the upstream (``heartbeat ask``: its ``asked`` events naming
    the upstream), those answered, and those escalated to a person unanswered.
``time_to_answer_s``
    mean over the answered questions of the time from asking to the answer (``answered``'s
    ``wait_s``); ``null`` when none was answered.

``pairs`` holds the same counts summed by (upstream launcher, downstream launcher), with
``edges`` the number of edges in the pair. Both lists are worst first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat.model.ledger import Event, EventKind

if TYPE_CHECKING:
    from heartbeat.store.base import Store

__all__ = ["EdgeReport", "build_edges", "COUNTS", "QUESTION_COUNTS"]

COUNTS = ("handoffs", "missing", "rederived", "guarantee_failed", "broken", "reopens")
QUESTION_COUNTS = ("asked", "answered", "escalated")
"""The questions across the seam counted per edge (beside :data:`COUNTS`; not in the edge's score)."""
_WEIGHTS = {"broken": 3, "reopens": 3, "guarantee_failed": 2, "missing": 1, "rederived": 1}


@dataclass
class _Profile:
    upstream: str
    downstream: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*COUNTS, *QUESTION_COUNTS), 0))
    missing_parts: set[str] = field(default_factory=set)
    waits: list[float] = field(default_factory=list)
    needs: list[dict[str, str]] = field(default_factory=list)
    answer_waits: list[float] = field(default_factory=list)

    @property
    def score(self) -> int:
        return sum(self.counts[k] * w for k, w in _WEIGHTS.items())

    def to_json(self, upstream_key: str = "upstream", downstream_key: str = "downstream") -> dict[str, Any]:
        out: dict[str, Any] = {upstream_key: self.upstream, downstream_key: self.downstream}
        out.update(self.counts)
        out["missing_parts"] = sorted(self.missing_parts)
        out["time_to_progress_s"] = round(sum(self.waits) / len(self.waits), 3) if self.waits else None
        out["time_to_answer_s"] = (round(sum(self.answer_waits) / len(self.answer_waits), 3)
                                   if self.answer_waits else None)
        # the order of the JSON: handoffs, missing, missing_parts, rederived, broken, reopens, time;
        # then the questions
        order = [upstream_key, downstream_key, "handoffs", "missing", "missing_parts", "rederived",
                 "guarantee_failed", "broken", "reopens", "time_to_progress_s", *QUESTION_COUNTS, "time_to_answer_s"]
        row = {k: out[k] for k in order}
        if upstream_key == "upstream":
            from heartbeat.tasks.needs import edge_role

            row["role"] = edge_role(self.upstream, self.downstream)
            row["needs"] = list(self.needs)
        return row


@dataclass
class EdgeReport:
    """Edges and launcher pairs, worst first."""

    edges: list[dict[str, Any]]
    pairs: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"edges": self.edges, "pairs": self.pairs}

    def render_text(self) -> str:
        if not self.edges:
            return "edge report: no handoffs between tasks (no task lists `after`)"
        lines = [f"edge report: {len(self.edges)} edge(s), worst first"]
        lines.extend(_table([(f"{e['upstream']} -> {e['downstream']}", e) for e in self.edges], "EDGE"))
        needing = [e for e in self.edges if e.get("needs")]
        if needing:
            lines.append("")
            lines.append("needs (done is refused while one is empty):")
            for e in needing:
                for n in e["needs"]:
                    why = f": {n['evidence']}" if n["evidence"] else ""
                    lines.append(f"  {e['upstream']} -> {e['downstream']}: `{n['part']}` ({n['source']}{why})")
        lines.append("")
        lines.append("by launcher pair:")
        lines.extend(_table([(f"{p['upstream_launcher']} -> {p['downstream_launcher']}", p) for p in self.pairs],
                            "LAUNCHERS"))
        return "\n".join(lines)


def _table(rows: list[tuple[str, dict[str, Any]]], title: str) -> list[str]:
    header = (title, "HANDOFFS", "MISSING", "REDERIVED", "GUAR-FAILED", "BROKEN", "REOPENS", "TO-PROGRESS",
              "ASKED", "ANSWERED", "ESCALATED", "TO-ANSWER", "MISSING PARTS")
    table: list[tuple[str, ...]] = [header]
    for name, r in rows:
        wait, answer = r["time_to_progress_s"], r["time_to_answer_s"]
        table.append((name, *(str(r[k]) if r[k] else "." for k in COUNTS),
                      "-" if wait is None else f"{wait:.1f}s", *(str(r[k]) if r[k] else "." for k in QUESTION_COUNTS),
                      "-" if answer is None else f"{answer:.1f}s", ", ".join(r["missing_parts"]) or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row[:-1])) + "  " + row[-1] for row in table]


_QUESTION_KINDS: dict[str, str] = {EventKind.ASKED: "asked", EventKind.ANSWERED: "answered",
                                    EventKind.QUESTION_ESCALATED: "escalated"}


def _progress(e: Event) -> bool:
    return e.kind == EventKind.DONE or (e.kind == EventKind.UPDATED and ("step" in e.data or "done" in e.data))


def build_edges(store: Store, *, since: datetime | None = None) -> EdgeReport:
    """Profile every upstream→downstream edge named by a baton's ``after``."""
    batons = {e.id: e.baton for e in store.scan() if e.baton is not None}
    events: dict[str, list[Event]] = {}

    def of(task_id: str) -> list[Event]:
        if task_id not in events:
            events[task_id] = store.ledger.events(task_id)
        return events[task_id]

    def within(e: Event) -> bool:
        return since is None or e.ts >= since

    from heartbeat.tasks.needs import edge_needs, role_events

    by_role = role_events(store)
    profiles: list[_Profile] = []
    for downstream, baton in sorted(batons.items()):
        for upstream in baton.after:
            p = _Profile(upstream, downstream)
            p.needs = [n.to_json() for n in edge_needs(store, baton, upstream, by_role=by_role)]
            down = of(downstream)
            progress = [e.ts for e in down if _progress(e)]
            for e in of(upstream):
                if not within(e):
                    continue
                if e.kind == EventKind.HANDED_OFF:
                    p.counts["handoffs"] += 1
                    missing = [m for m in e.data.get("missing") or [] if isinstance(m, str)]
                    if missing:
                        p.counts["missing"] += 1
                        p.missing_parts.update(missing)
                    after = [t for t in progress if t > e.ts]
                    if after:
                        p.waits.append((after[0] - e.ts).total_seconds())
                elif e.kind == EventKind.GUARANTEE_FAILED:
                    p.counts["guarantee_failed"] += 1
                elif e.kind == EventKind.REOPENED and e.data.get("by") == downstream:
                    p.counts["reopens"] += 1
            for e in down:
                if not within(e):
                    continue
                if e.kind == EventKind.REDERIVED:
                    p.counts["rederived"] += len(e.data.get("items") or [])
                elif e.kind == EventKind.GUARANTEE_BROKEN and e.data.get("upstream") == upstream:
                    p.counts["broken"] += len(e.data.get("broken") or [])
                elif e.data.get("upstream") == upstream and e.kind in _QUESTION_KINDS:
                    p.counts[_QUESTION_KINDS[e.kind]] += 1
                    wait = e.data.get("wait_s")
                    if e.kind == EventKind.ANSWERED and isinstance(wait, (int, float)) and wait >= 0:
                        p.answer_waits.append(float(wait))
            profiles.append(p)

    def launcher(task_id: str) -> str:
        b = batons.get(task_id)
        return (b.launcher if b is not None else "") or "default"

    pairs: dict[tuple[str, str], tuple[_Profile, list[int]]] = {}
    for p in profiles:
        key = (launcher(p.upstream), launcher(p.downstream))
        pair, n = pairs.setdefault(key, (_Profile(*key), [0]))
        n[0] += 1
        for k in (*COUNTS, *QUESTION_COUNTS):
            pair.counts[k] += p.counts[k]
        pair.missing_parts |= p.missing_parts
        pair.waits.extend(p.waits)
        pair.answer_waits.extend(p.answer_waits)

    def worst(p: _Profile) -> tuple[int, float, str, str]:
        wait = sum(p.waits) / len(p.waits) if p.waits else 0.0
        return (-p.score, -wait, p.upstream, p.downstream)

    edges = [p.to_json() for p in sorted(profiles, key=worst)]
    pair_rows = []
    for pair, n in sorted(pairs.values(), key=lambda v: worst(v[0])):
        row = pair.to_json("upstream_launcher", "downstream_launcher")
        row = {"upstream_launcher": row["upstream_launcher"], "downstream_launcher": row["downstream_launcher"],
               "edges": n[0], **{k: v for k, v in row.items() if not k.endswith("_launcher")}}
        pair_rows.append(row)
    return EdgeReport(edges, pair_rows)
