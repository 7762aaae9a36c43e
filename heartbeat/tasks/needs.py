"""'Ready', agreed per edge: the parts of a package a downstream needs, declared or learned.

A downstream declares the parts it needs from each of its upstreams (``needs = [...]`` on its
baton: ``heartbeat new DOWN --after UP --needs rejected,decisions``, a pipeline stage's
``needs``, ``heartbeat add DOWN needs PART``). The profile adds to them: when a part was lost
(re-derived by the downstream, or, with ``[handoff] learn_from = "rederived+missing"``,
empty in the package) in ``learn_after`` of an edge role's last ``learn_window`` handoffs, it
becomes a **learned** need of that role, a ``need_learned`` event with its evidence. A person
pins (``need_pinned``) or drops (``need_dropped``) a need with ``heartbeat needs DOWN``.

An edge's **role** is what recurs across pipeline runs: for two stages of one pipeline
(``p1.build -> p1.review``) it is their stage names, ``*.build -> *.review``, so what
``p1``'s review kept re-deriving is required of ``p2.build``; for any other pair it is the
two task ids, ``build -> review``.

The effective needs of an edge = (declared + learned + pinned) - dropped, where for each part the
role's latest ``need_*`` event decides (learned or pinned: needed; dropped: not, even when
declared) and a part no event names is needed when the downstream declares it. They are read
from the ledger's events on every store, never kept elsewhere.

The upstream's ``done`` is refused (:class:`~heartbeat.model.errors.NeedsUnmet`, exit 4, a
``needs_unmet`` event) while any needed part of its package is empty; a person may pass
``--force`` (a ``done_forced`` event naming what was unmet and by whom); an agent the daemon
launched may not.

A re-derived item names its part by a prefix: ``heartbeat add review rederived "rejected: the
upstream had tried Redis"`` counts for ``rejected``; an item with no known prefix is counted by
``report --edges`` but teaches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from heartbeat.model.baton import PACKAGE_PARTS, Baton
from heartbeat.model.errors import BadInput, HeartbeatError, NeedsUnmet
from heartbeat.model.ledger import Event, EventKind

if TYPE_CHECKING:
    from heartbeat.config.shape import HandoffConfig
    from heartbeat.store.base import Store

__all__ = [
    "NeedSource",
    "Need",
    "Lost",
    "parse_parts",
    "part_of",
    "edge_role",
    "role_name",
    "effective",
    "learned_parts",
    "edge_needs",
    "role_events",
    "downstream_needs",
    "needs_lines",
    "require_needs",
    "learn",
    "pin",
    "fill_command",
    "configured_handoff",
]

NEED_EVENTS = (EventKind.NEED_LEARNED, EventKind.NEED_PINNED, EventKind.NEED_DROPPED)


class NeedSource(StrEnum):
    """Where a need of an edge comes from."""

    DECLARED = "declared"
    LEARNED = "learned"
    PINNED = "pinned"


@dataclass(frozen=True)
class Need:
    """One part an edge's downstream needs, where the need came from and why (``evidence``)."""

    part: str
    source: NeedSource
    evidence: str = ""

    def describe(self) -> str:
        """``declared``, ``learned: review re-derived `rejected` in 2 of the last 3 handoffs``, ``pinned by ann``."""
        return f"{self.source.value}: {self.evidence}" if self.evidence else self.source.value

    def to_json(self) -> dict[str, str]:
        return {"part": self.part, "source": self.source.value, "evidence": self.evidence}


def parse_parts(values: Iterable[str], *, task: str | None = None, field: str = "needs") -> list[str]:
    """Package parts from ``values`` (each may be ``a,b``), in order, once each; anything else is
    refused in one line naming the valid parts."""
    out: list[str] = []
    for value in values:
        for raw in str(value).split(","):
            part = raw.strip()
            if part not in PACKAGE_PARTS:
                raise BadInput(f"unknown part {part[:40]!r}: a need is one of {', '.join(PACKAGE_PARTS)}",
                               task=task, field=field)
            if part not in out:
                out.append(part)
    if not out:
        raise BadInput(f"name at least one part: {', '.join(PACKAGE_PARTS)}", task=task, field=field)
    return out


_PART_PREFIX = re.compile(r"\s*`?([A-Za-z_-]+)`?\s*:")


def part_of(item: str) -> str:
    """The package part a re-derived item names by its prefix (``"rejected: ..."``), else ""."""
    match = _PART_PREFIX.match(item)
    if not match:
        return ""
    part = match.group(1).lower().replace("-", "_")
    return part if part in PACKAGE_PARTS else ""


def edge_role(upstream: str, downstream: str) -> str:
    """What an edge is across runs: ``*.build->*.review`` for two stages of one pipeline
    (``p1.build``, ``p1.review``), else the ids, ``build->review``."""
    up_pipeline, _, up_stage = upstream.rpartition(".")
    down_pipeline, _, down_stage = downstream.rpartition(".")
    if up_pipeline and up_pipeline == down_pipeline:
        return f"*.{up_stage}->*.{down_stage}"
    return f"{upstream}->{downstream}"


def role_name(task_id: str, other: str) -> str:
    """How the evidence names ``task_id`` on its edge with ``other``: its stage name in a pipeline."""
    pipeline, _, stage = task_id.rpartition(".")
    return stage if pipeline and pipeline == other.rpartition(".")[0] else task_id


# -- the pure parts ------------------------------------------------------------------------


def effective(declared: Sequence[str], events: Sequence[Event]) -> list[Need]:
    """An edge's needs from its downstream's declared parts and its role's ``need_*`` events (in
    append order): for each part the latest event decides; a part none names is needed if declared."""
    decided: dict[str, Need | None] = {}
    for event in events:
        part = str(event.data.get("part", ""))
        if part not in PACKAGE_PARTS:
            continue
        if event.kind == EventKind.NEED_DROPPED:
            decided[part] = None
        elif event.kind == EventKind.NEED_LEARNED:
            decided[part] = Need(part, NeedSource.LEARNED, str(event.data.get("evidence", "")))
        elif event.kind == EventKind.NEED_PINNED:
            decided[part] = Need(part, NeedSource.PINNED, f"pinned by {event.data.get('by') or event.actor or '?'}")
    out = [need for need in decided.values() if need is not None]
    out.extend(Need(part, NeedSource.DECLARED) for part in declared if part in PACKAGE_PARTS and part not in decided)
    order = {part: i for i, part in enumerate(PACKAGE_PARTS)}
    return sorted(out, key=lambda n: order[n.part])


@dataclass(frozen=True)
class Lost:
    """One handoff of an edge role as the learning rule sees it: when, and which parts it lost."""

    at: datetime
    rederived: frozenset[str] = frozenset()
    missing: frozenset[str] = frozenset()


def learned_parts(handoffs: Sequence[Lost], *, after: int, window: int, sources: Sequence[str] = ("rederived",),
                  since: Mapping[str, datetime] | None = None, needed: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
    """The parts the rule learns: part -> (handoffs that lost it, handoffs looked at).

    For each part not already ``needed``, look at the role's latest ``window`` handoffs made after
    ``since[part]`` (the part's last ``need_*`` event: a drop is not overturned by the evidence it
    was dropped against); the part is learned when at least ``after`` of them lost it (re-derived,
    or, with ``missing`` in ``sources``, empty)."""
    since = since or {}
    needed = set(needed)
    out: dict[str, tuple[int, int]] = {}
    ordered = sorted(handoffs, key=lambda h: h.at)
    for part in PACKAGE_PARTS:
        if part in needed:
            continue
        start = since.get(part)
        looked = [h for h in ordered if start is None or h.at > start][-window:]
        lost = sum(1 for h in looked if ("rederived" in sources and part in h.rederived)
                   or ("missing" in sources and part in h.missing))
        if looked and lost >= after:
            out[part] = (lost, len(looked))
    return out


# -- reading the store ---------------------------------------------------------------------


def role_events(store: Store, cache: dict[str, list[Event]] | None = None) -> dict[str, list[Event]]:
    """Every ``need_*`` event by role, in append order (``cache``, when given, is returned as is)."""
    if cache is not None:
        return cache
    out: dict[str, list[Event]] = {}
    for event in store.ledger.events(kinds=list(NEED_EVENTS)):
        out.setdefault(str(event.data.get("role", "")), []).append(event)
    return out


def edge_needs(store: Store, downstream: Baton, upstream: str, *,
               by_role: dict[str, list[Event]] | None = None) -> list[Need]:
    """The effective needs of the edge ``upstream -> downstream``."""
    by_role = role_events(store, by_role)
    return effective(downstream.needs, by_role.get(edge_role(upstream, downstream.id), []))


def downstream_needs(store: Store, upstream: str, *,
                     downstreams: Iterable[str] | None = None) -> list[tuple[str, list[Need]]]:
    """Each downstream of ``upstream`` (a baton listing it in ``after``) with the needs of its edge,
    those with none left out. ``downstreams``: the candidates' ids, loaded one by one instead of a
    scan of every baton (the daemon knows them from its pass)."""
    if downstreams is None:
        downs = [e.baton for e in store.scan() if e.baton is not None and upstream in e.baton.after]
    else:
        downs = []
        for task_id in downstreams:
            try:
                baton = store.load(task_id)
            except HeartbeatError:
                continue
            if upstream in baton.after:
                downs.append(baton)
    if not downs:
        return []
    by_role = role_events(store)
    out = []
    for down in sorted(downs, key=lambda b: b.id):
        found = edge_needs(store, down, upstream, by_role=by_role)
        if found:
            out.append((down.id, found))
    return out


def fill_command(task_id: str, part: str, prefix: str = "heartbeat") -> str:
    """The command that fills ``part`` of ``task_id``'s package."""
    if part == "intent":
        return f'{prefix} set {task_id} intent="..."'
    if part == "handoff":
        return f"{prefix} set {task_id} handoff=PATH"
    if part == "guarantees":
        return f'{prefix} add {task_id} guarantees "TEXT" [--check NAME]'
    return f'{prefix} add {task_id} {part} "..."'


def _empty_parts(store: Store, baton: Baton) -> set[str]:
    from heartbeat.tasks.handoff import build_package

    return set(build_package(store, baton)["missing"])


def needs_lines(store: Store, baton: Baton, *, downstreams: Iterable[str] | None = None) -> list[str]:
    """The brief's and ``show``'s lines on what ``baton``'s downstreams need of its package, each
    saying where the need came from and, when the part is empty now, the command that fills it."""
    found = downstream_needs(store, baton.id, downstreams=downstreams)
    if not found:
        return []
    empty = _empty_parts(store, baton)
    lines = []
    for down, needs in found:
        for need in needs:
            state = f" - **EMPTY: fill it with `{fill_command(baton.id, need.part)}`**" if need.part in empty else ""
            lines.append(f"- `{down}` needs `{need.part}` ({need.describe()}){state}")
    return lines


def _unmet(store: Store, baton: Baton) -> list[tuple[str, Need]]:
    found = downstream_needs(store, baton.id)
    if not found:
        return []
    empty = _empty_parts(store, baton)
    return [(down, need) for down, needs in found for need in needs if need.part in empty]


def require_needs(store: Store, baton: Baton, *, force: bool = False, actor: str = "") -> None:
    """Refuse ``done`` while a downstream's need is unmet: a ``needs_unmet`` event, then
    :class:`NeedsUnmet` (exit 4) naming the part, the downstream and the command that fills it.
    With ``force`` (a person's) the done goes on and a ``done_forced`` event records what was unmet."""
    unmet = _unmet(store, baton)
    if not unmet:
        return
    from heartbeat.model.timeparse import utcnow

    data: dict[str, Any] = {"unmet": [{"downstream": d, **n.to_json()} for d, n in unmet]}
    kind = EventKind.NEEDS_UNMET
    if force:
        kind = EventKind.DONE_FORCED
        data["by"] = actor
    store.record([Event(task=baton.id, kind=kind, ts=utcnow(), epoch=baton.meta.epoch,
                        revision=baton.meta.revision, actor=actor, data=data)])
    if force:
        return
    parts = "; ".join(f"{d} needs `{n.part}` ({n.describe()})" for d, n in unmet)
    fills = ", ".join(dict.fromkeys(f"`{fill_command(baton.id, n.part)}`" for _, n in unmet))
    raise NeedsUnmet(f"cannot mark done: {parts}: fill it with {fills}", task=baton.id)


# -- learning and pinning ------------------------------------------------------------------


def configured_handoff(config_path: str | None = None) -> HandoffConfig:
    """The ``[handoff]`` table of the config found by the usual search, or the defaults (also for a
    config that cannot be read: that is the daemon's to report, and must not stop a task's write)."""
    from heartbeat.config.load import readable_config
    from heartbeat.config.shape import HandoffConfig

    config = readable_config(config_path)
    return HandoffConfig() if config is None else config.handoff


def _role_handoffs(store: Store, role: str, batons: Sequence[Baton]) -> list[Lost]:
    """Every handoff on an edge of ``role``: the upstream's ``handed_off`` events, each with the
    parts its package missed and the parts the downstream re-derived before the next one."""
    out: list[Lost] = []
    for down in batons:
        for upstream in down.after:
            if edge_role(upstream, down.id) != role:
                continue
            handed = store.ledger.events(upstream, kinds=[EventKind.HANDED_OFF])
            rederived = store.ledger.events(down.id, kinds=[EventKind.REDERIVED])
            for i, event in enumerate(handed):
                until = handed[i + 1].ts if i + 1 < len(handed) else None
                parts = {part_of(str(item)) for r in rederived if r.ts >= event.ts and (until is None or r.ts < until)
                         for item in r.data.get("items") or []}
                parts.discard("")
                missing = {m for m in event.data.get("missing") or [] if isinstance(m, str)}
                out.append(Lost(event.ts, frozenset(parts), frozenset(missing)))
    return out


def _evidence(down_name: str, part: str, lost: int, looked: int, sources: Sequence[str]) -> str:
    what = "re-derived" if tuple(sources) == ("rederived",) else "lacked" if "rederived" in sources else "missed"
    return f"{down_name} {what} `{part}` in {lost} of the last {looked} handoffs"


def learn(store: Store, task_ids: Iterable[str], config: HandoffConfig | None = None, *,
          actor: str = "") -> list[Event]:
    """Run the learning rule over every edge role ``task_ids`` stand on (as upstream or downstream)
    and record a ``need_learned`` event, with its evidence, for each part it newly requires."""
    config = config if config is not None else configured_handoff()
    if not config.learn:
        return []
    ids = set(task_ids)
    batons = [e.baton for e in store.scan() if e.baton is not None]
    roles: dict[str, tuple[str, str]] = {}
    for down in batons:
        for upstream in down.after:
            if down.id in ids or upstream in ids:
                roles.setdefault(edge_role(upstream, down.id), (upstream, down.id))
    if not roles:
        return []
    from heartbeat.model.timeparse import utcnow

    by_role = role_events(store)
    recorded: list[Event] = []
    for role, (upstream, down_id) in sorted(roles.items()):
        events = by_role.get(role, [])
        since: dict[str, datetime] = {}
        for event in events:
            since[str(event.data.get("part", ""))] = event.ts
        down = next(b for b in batons if b.id == down_id)
        needed = {n.part for n in effective(down.needs, events)}
        sources = config.learn_from.split("+")
        found = learned_parts(_role_handoffs(store, role, batons), after=config.learn_after,
                              window=config.learn_window, sources=sources, since=since, needed=needed)
        now = utcnow()
        for part, (lost, looked) in found.items():
            evidence = _evidence(role_name(down_id, upstream), part, lost, looked, sources)
            recorded.append(Event(task=down_id, kind=EventKind.NEED_LEARNED, ts=now, actor=actor,
                                  data={"role": role, "upstream": upstream, "part": part, "evidence": evidence,
                                        "lost": lost, "looked": looked}))
    if recorded:
        store.record(recorded)
    return recorded


def pin(store: Store, downstream: str, *, pin_parts: Sequence[str] = (), drop_parts: Sequence[str] = (),
        by: str) -> list[Event]:
    """A person's ``need_pinned``/``need_dropped`` events for every upstream edge of ``downstream``."""
    if not by.strip():
        raise BadInput("name who pins or drops (--by NAME)", task=downstream, field="by")
    both = set(pin_parts) & set(drop_parts)
    if both:
        raise BadInput(f"{sorted(both)[0]!r} is both pinned and dropped: pick one", task=downstream)
    baton = store.load(downstream)
    if not baton.after:
        raise BadInput("has no upstream (`after`): a need is of an edge", task=downstream)
    from heartbeat.model.timeparse import utcnow

    now = utcnow()
    events = []
    for upstream in baton.after:
        role = edge_role(upstream, downstream)
        for kind, parts in ((EventKind.NEED_PINNED, pin_parts), (EventKind.NEED_DROPPED, drop_parts)):
            for part in parts:
                events.append(Event(task=downstream, kind=kind, ts=now, epoch=baton.meta.epoch, actor=by,
                                    data={"role": role, "upstream": upstream, "part": part, "by": by}))
    store.record(events)
    return events
