"""Pipelines: a chain or DAG of tasks created in one command from a small TOML file.

``heartbeat pipeline new NAME --from FILE.toml`` reads one ``[stages.STAGE]`` table per
stage and creates the tasks ``NAME.STAGE``, all of them or none::

    workdir = "."                    # optional: every stage's workdir (relative to the file)

    [stages.build]
    task = "Add the response cache"
    intent = "p95 latency under 200 ms"
    launcher = "claude"
    constraints = ["no new services"]
    guarantees = [{ text = "tests pass", check = "pytest" }]
    plan = ["write the cache", "write the tests"]

    [stages.review]
    task = "Review the cache"
    after = ["build"]
    on_broken = "reopen"             # or "escalate", "fallback:LAUNCHER"

Keys of a stage: ``task`` (required), ``intent``, ``step`` (default: the first plan
step), ``next_step``, ``plan``, ``launcher``, ``constraints``, ``guarantees`` (tables
``{ text, check }`` or plain sentences), ``after`` (stage names), ``needs`` (the parts of
each upstream's package the stage needs: ``needs = ["rejected", "decisions"]``), ``on_broken``,
``key_files``, ``workdir``, ``handoff``. Anything else, a cycle or an unknown stage is
refused (exit 2) naming it, before any task is created.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Guarantee, Guard, check_id, dump_baton, load_toml
from heartbeat.model.errors import AlreadyExists, BadInput, HeartbeatError, NotFound
from heartbeat.model.timeparse import utcnow
from heartbeat.store.base import start_create
from heartbeat.tasks import verbs as tasks

if TYPE_CHECKING:
    from heartbeat.store.base import Store

__all__ = ["Stage", "parse_pipeline", "create_pipeline", "tree_rows"]

_STAGE_KEYS = frozenset({"task", "intent", "step", "next_step", "plan", "launcher", "constraints", "guarantees",
                         "after", "needs", "on_broken", "key_files", "workdir", "handoff", "guards",
                         "irreversible"})
_TOP_KEYS = frozenset({"stages", "workdir"})
_TREE_LEVELS = 12
"""Indentation levels ``status`` draws before a deeper stage is shown at this depth, numbered."""


@dataclass
class Stage:
    """One stage of a pipeline, as the file gives it."""

    name: str
    task_id: str
    task: str
    step: str
    intent: str = ""
    next_step: str = ""
    plan: list[str] = field(default_factory=list)
    launcher: str = ""
    constraints: list[str] = field(default_factory=list)
    guarantees: list[Guarantee] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    on_broken: str = ""
    key_files: list[str] = field(default_factory=list)
    workdir: str = ""
    handoff: str = ""
    guards: list[Guard] = field(default_factory=list)
    """Constraints with teeth: ``guards = [{ constraint = "...", protect = [...], forbid = [...] }]``."""
    irreversible: list[str] = field(default_factory=list)


def _guards(where: str, task_id: str, value: Any) -> list[Guard]:
    """A stage's ``guards``: tables of ``constraint`` and its ``protect``/``forbid`` globs, each checked."""
    from heartbeat.tasks.verbs import make_guard

    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BadInput(f"{where}: expected a list of tables {{ constraint, protect, forbid }}")
    out = []
    for i, item in enumerate(value):
        extra = sorted(set(item) - {"constraint", "protect", "forbid"})
        if extra:
            raise BadInput(f"{where}[{i}]: unknown key {extra[0]!r} (keys: constraint, protect, forbid)")
        try:
            out.append(make_guard(task_id, _string(f"{where}[{i}].constraint", item.get("constraint", "")),
                                  _strings(f"{where}[{i}].protect", item.get("protect", [])),
                                  _strings(f"{where}[{i}].forbid", item.get("forbid", []))))
        except BadInput as exc:
            raise BadInput(f"{where}[{i}]: {exc.message}") from None
    return out


def _strings(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInput(f"{where}: expected a list of strings")
    return list(value)


def _needs(where: str, value: Any) -> list[str]:
    from heartbeat.tasks.needs import parse_parts

    parts = _strings(where, value)
    if not parts:
        return []
    try:
        return parse_parts(parts)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc.message}") from None


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{where}: expected a string")
    return value


def _guarantees(where: str, value: Any) -> list[Guarantee]:
    if not isinstance(value, list):
        raise BadInput(f"{where}: expected a list of {{ text, check }} tables")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not item["text"].strip() \
                or not isinstance(item.get("check", ""), str) or set(item) - {"text", "check"}:
            raise BadInput(f"{where}[{i}]: expected {{ text = \"...\", check = \"NAME\" }}")
        out.append(Guarantee(item["text"], item.get("check", "")))
    return out


def parse_pipeline(name: str, text: str, *, base_dir: str) -> list[Stage]:
    """The stages of pipeline ``name``, in an order where every upstream comes first."""
    check_id(name)
    doc = load_toml(text)
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} (a pipeline file has [stages.NAME] tables and workdir)")
    stages_doc = doc.get("stages")
    if not isinstance(stages_doc, dict) or not stages_doc:
        raise BadInput("no stages: add one [stages.NAME] table per stage")
    default_workdir = _string("workdir", doc.get("workdir", ""))
    stages: dict[str, Stage] = {}
    for stage_name, body in stages_doc.items():
        where = f"stages.{stage_name}"
        task_id = f"{name}.{stage_name}"
        try:
            check_id(task_id)
        except BadInput:
            raise BadInput(f"{where}: {task_id!r} is not a valid task id (a-z 0-9 . _ -, at most 64)") from None
        if not isinstance(body, dict):
            raise BadInput(f"{where}: expected a table")
        extra = sorted(set(body) - _STAGE_KEYS)
        if extra:
            raise BadInput(f"{where}: unknown key {extra[0]!r} (keys: {', '.join(sorted(_STAGE_KEYS))})")
        if not isinstance(body.get("task"), str) or not body["task"].strip():
            raise BadInput(f"{where}.task: required: what the stage is")
        plan = _strings(f"{where}.plan", body.get("plan", []))
        step = _string(f"{where}.step", body.get("step", plan[0] if plan else "start"))
        workdir = _string(f"{where}.workdir", body.get("workdir", default_workdir))
        if workdir:
            workdir = os.path.abspath(os.path.join(base_dir, workdir))
        stages[stage_name] = Stage(
            name=stage_name, task_id=task_id, task=body["task"], step=step,
            intent=_string(f"{where}.intent", body.get("intent", "")),
            next_step=_string(f"{where}.next_step", body.get("next_step", plan[1] if len(plan) > 1 else "")),
            plan=plan,
            launcher=_string(f"{where}.launcher", body.get("launcher", "")),
            constraints=_strings(f"{where}.constraints", body.get("constraints", [])),
            guarantees=_guarantees(f"{where}.guarantees", body.get("guarantees", [])),
            after=_strings(f"{where}.after", body.get("after", [])),
            needs=_needs(f"{where}.needs", body.get("needs", [])),
            on_broken=_string(f"{where}.on_broken", body.get("on_broken", "")),
            key_files=_strings(f"{where}.key_files", body.get("key_files", [])),
            workdir=workdir,
            handoff=_string(f"{where}.handoff", body.get("handoff", "")),
            guards=_guards(f"{where}.guards", task_id, body.get("guards", [])),
            irreversible=_strings(f"{where}.irreversible", body.get("irreversible", [])),
        )
    for stage in stages.values():
        for upstream in stage.after:
            if upstream not in stages:
                raise BadInput(f"stages.{stage.name}.after: unknown stage {upstream!r}")
            if upstream == stage.name:
                raise BadInput(f"stages.{stage.name}.after: a stage cannot come after itself")
    return _topological(stages)


def _topological(stages: Mapping[str, Stage]) -> list[Stage]:
    """Upstreams first; a cycle is refused naming it (``a -> b -> a``).

    A depth-first walk with its own stack, not Python's: a chain of any length is one
    loop, never a RecursionError."""
    order: list[Stage] = []
    state: dict[str, int] = {}  # 1 visiting (on the path), 2 done
    for root in stages:
        if state.get(root) == 2:
            continue
        path: list[str] = [root]
        pending: list[Iterator[str]] = [iter(stages[root].after)]
        state[root] = 1
        while path:
            upstream = next(pending[-1], None)
            if upstream is None:
                name = path.pop()
                pending.pop()
                state[name] = 2
                order.append(stages[name])
                continue
            if state.get(upstream) == 2:
                continue
            if state.get(upstream) == 1:
                cycle = [*path[path.index(upstream):], upstream]
                shown = cycle if len(cycle) <= 8 else [*cycle[:4], "...", *cycle[-3:]]
                raise BadInput(f"the stages form a cycle of {len(cycle) - 1}: {' -> '.join(shown)}")
            state[upstream] = 1
            path.append(upstream)
            pending.append(iter(stages[upstream].after))
    return order


def create_pipeline(store: Store, name: str, stages: Sequence[Stage], *, workdir: str, actor: str = "") -> list[str]:
    """Create every stage's task, or none: ids and values are checked before the first is written."""
    taken = []
    for stage in stages:
        try:
            store.load(stage.task_id)
            taken.append(stage.task_id)
        except NotFound:
            pass
        except BadInput:
            taken.append(stage.task_id)  # an invalid baton holds the id too
    if taken:
        raise AlreadyExists(f"task {taken[0]} already exists: nothing was created (pick another pipeline name)")
    # Every stage's baton is built, fingerprinted (a key file outside the workdir is refused
    # here) and serialised before the first is written: a refusal leaves nothing behind.
    now = utcnow()
    batons: list[Baton] = []
    for stage in stages:
        where = f"stages.{stage.name}"
        try:
            baton = tasks.build_task(
                stage.task_id, task=stage.task, step=stage.step, intent=stage.intent,
                next_step=stage.next_step, workdir=stage.workdir or workdir, launcher=stage.launcher,
                handoff=stage.handoff, key_files=stage.key_files, constraints=stage.constraints, plan=stage.plan,
                after=[f"{name}.{u}" for u in stage.after], needs=stage.needs, guarantees=stage.guarantees,
                on_broken=stage.on_broken, guards=stage.guards, irreversible=stage.irreversible, now=now)
            size = len(dump_baton(start_create(baton, now)).encode("utf-8"))
        except HeartbeatError as exc:
            field = getattr(exc, "field", "")
            raise BadInput(f"{where}: {field + ': ' if field else ''}{exc.message}: nothing was created") from None
        if size > defaults.MAX_BATON_BYTES:
            raise BadInput(f"{where}: the baton would be {size} bytes; a baton may be at most "
                           f"{defaults.MAX_BATON_BYTES}: nothing was created")
        batons.append(baton)
    created: list[str] = []
    try:
        # Downstreams first, the stages that come after nothing last: once a stage can be dispatched,
        # every stage after it exists, so the daemon's first brief of it names its downstreams' needs.
        for baton in _downstreams_first(batons):
            store.create(baton, actor=actor, now=now)
            created.append(baton.meta.id)
    except Exception as exc:
        if created:  # a race (another writer took an id between the check and here): say exactly what exists
            raise BadInput(f"created {', '.join(created)} but then failed: {exc}") from exc
        raise
    return [b.meta.id for b in batons if b.meta.id in created]


def _downstreams_first(batons: Sequence[Baton]) -> list[Baton]:
    """``batons`` (a pipeline's stages, a DAG) in an order where each comes before every stage it
    comes after: the reverse of a topological order, the stages with no ``after`` last."""
    by_id = {b.meta.id: b for b in batons}
    placed: set[str] = set()
    upstreams_first: list[Baton] = []
    while len(placed) < len(by_id):
        ready = [b for b in batons if b.meta.id not in placed
                 and all(u in placed or u not in by_id for u in b.after)]
        if not ready:  # a cycle is refused before this; never loop on one
            ready = [b for b in batons if b.meta.id not in placed]
        for b in ready:
            placed.add(b.meta.id)
            upstreams_first.append(b)
    return upstreams_first[::-1]


def tree_rows(rows: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Status rows with pipelines as trees: (id cell, row), a downstream indented under its upstream.

    A task with several upstreams appears once, under the last of them, marked
    ``(after A, B)``; tasks outside any pipeline keep their place and their plain id.
    """
    by_id = {r["id"]: r for r in rows}
    after = {r["id"]: [u for u in r.get("after") or [] if u in by_id] for r in rows}
    children: dict[str, list[str]] = {}
    for task_id, ups in after.items():
        if ups:
            children.setdefault(ups[-1], []).append(task_id)
    out: list[tuple[str, dict[str, Any]]] = []
    placed: set[str] = set()

    def place(root: str) -> None:  # depth first with its own stack: a chain of any length
        stack = [(root, 0)]
        while stack:
            task_id, depth = stack.pop()
            if task_id in placed:
                continue
            placed.add(task_id)
            ups = after[task_id]
            cell = task_id
            if depth:  # a long chain is shown flat past a few levels, each cell saying its depth
                cell = "   " * min(depth - 1, _TREE_LEVELS) + "└─ " + (
                    f"[{depth}] " if depth > _TREE_LEVELS else "") + task_id
            if len(ups) > 1:
                cell += f" (after {', '.join(ups)})"
            out.append((cell, by_id[task_id]))
            stack.extend((child, depth + 1) for child in sorted(children.get(task_id, []), reverse=True))

    for r in rows:
        if not after[r["id"]]:
            place(r["id"])
    for r in rows:  # a cycle written by hand: still shown, once
        place(r["id"])
    return out
