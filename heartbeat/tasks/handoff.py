"""The handoff between tasks: one task's finished work becoming another task's input.

A downstream task names its upstreams in ``after = [...]``. It is held (blocked on the
gate ``after:ID,ID``, which opens by itself) until every upstream is done. When an
upstream finishes, its **package** is frozen into a ``handed_off`` event of the ledger:
its intent, its constraints (its own and those it inherited, each with the task it came
from), decisions, rejected alternatives, unknowns, the handoff document, its key files
with their fingerprints at that moment, and its guarantees; the parts that were empty are
named in ``missing``. The downstream's brief carries every upstream's latest package.

Guarantees are the upstream's responsibility contract: ``done`` runs the checked ones in
the workdir and refuses to finish when one fails (:class:`~heartbeat.model.errors.GuaranteeFailed`,
a ``guarantee_failed`` event). The downstream's ``verify`` re-runs them; a broken one is
its own result (``broken``, exit 3) and triggers the downstream's ``on_broken`` policy for
that edge: ``reopen`` (the default), ``escalate`` or ``fallback:LAUNCHER``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat.model.baton import PACKAGE_PARTS, Baton, Gate, GateKind, Status
from heartbeat.model.errors import BadInput, GuaranteeFailed, HeartbeatError
from heartbeat.model.ledger import EventKind

if TYPE_CHECKING:
    from heartbeat.config.shape import CommandConfig
    from heartbeat.store.base import Store

__all__ = [
    "PACKAGE_PARTS",
    "GuaranteeResult",
    "after_gate",
    "build_package",
    "load_packages",
    "inherited_constraints",
    "run_guarantees",
    "require_guarantees",
    "describe_failed",
    "refused_done",
    "configured_checks",
    "check_upstreams",
    "pending_upstreams",
    "check_upstreams_exist",
    "cycle_through",
    "held_in_cycle",
    "show_chain",
]


HANDED_OFF = EventKind.HANDED_OFF


def after_gate(upstreams: Sequence[str]) -> Gate:
    """The gate that holds a downstream until every upstream is done: ``after:A,B``."""
    return Gate(GateKind.AFTER, ",".join(upstreams))


def pending_upstreams(baton: Baton, status_of: Callable[[str], Status | None]) -> list[str]:
    """The upstreams of ``baton`` that are not done (an unknown one counts as not done)."""
    return [u for u in baton.after if status_of(u) is not Status.DONE]


def check_upstreams_exist(load: Callable[[str], Baton], task_id: str, upstreams: Sequence[str], *,
                          field: str) -> None:
    """Refuse upstreams that would hold ``task_id`` forever: the task itself, a task that does
    not exist, or one that comes (at any distance) after ``task_id`` already, a cycle.

    ``load`` reads a baton (a store's, or an open write's :meth:`~heartbeat.store.base.Edit.load`,
    which sees every other write of ``after`` whole); a baton it cannot read ends that branch."""
    from heartbeat.model.errors import NotFound

    for upstream in upstreams:
        if upstream == task_id:
            raise BadInput("a task cannot come after itself", task=task_id, field=field)
        try:
            load(upstream)
        except NotFound:
            raise BadInput(f"unknown upstream task {upstream!r}: create it first", task=task_id,
                           field=field) from None

    def after_of(current: str) -> Sequence[str]:
        try:
            return load(current).after
        except HeartbeatError:
            return ()

    chain = cycle_through(task_id, upstreams, after_of)
    if chain:
        raise BadInput(f"would make a cycle ({show_chain(chain)}): {chain[1]} already comes after "
                       f"{task_id}", task=task_id, field=field)


def cycle_through(task_id: str, first: Iterable[str], after_of: Callable[[str], Sequence[str]]) -> list[str]:
    """The shortest chain ``task_id -> u -> ... -> task_id`` where ``u`` is one of ``first`` and
    each next id is in ``after_of`` the one before (``task_id`` comes after ``u``, which comes
    after ...), else ``[]``. A walk with its own queue (no recursion): a chain of any length."""
    came_from: dict[str, str] = {}
    queue: deque[str] = deque()
    for upstream in first:
        if upstream == task_id:
            return [task_id, task_id]
        if upstream not in came_from:
            came_from[upstream] = task_id
            queue.append(upstream)
    while queue:
        current = queue.popleft()
        for up in after_of(current):
            if up == task_id:
                back = [current]
                while back[-1] != task_id:
                    back.append(came_from[back[-1]])
                return [*reversed(back), task_id]
            if up not in came_from:
                came_from[up] = current
                queue.append(up)
    return []


def show_chain(chain: Sequence[str]) -> str:
    """``a -> b -> a``, its middle elided past eight ids."""
    shown = chain if len(chain) <= 8 else [*chain[:4], "...", *chain[-3:]]
    return " -> ".join(shown)


def held_in_cycle(task_id: str, load: Callable[[str], Baton]) -> list[str]:
    """The cycle of ``after`` (unfinished tasks only) that holds ``task_id`` for ever, else ``[]``:
    one written before writes checked for cycles, imported, or edited by hand."""
    from heartbeat.model.baton import FINISHED_STATUSES

    def after_of(current: str) -> Sequence[str]:
        try:
            baton = load(current)
        except HeartbeatError:
            return ()
        return () if baton.meta.status in FINISHED_STATUSES else baton.after

    return cycle_through(task_id, after_of(task_id), after_of)


# -- the package ---------------------------------------------------------------------------


def _fingerprints(baton: Baton) -> dict[str, str]:
    from heartbeat.system.world import fingerprint, resolve_key_file

    out: dict[str, str] = {}
    for key in baton.key_files:
        if not baton.workdir:
            out[key] = "unfingerprinted"
            continue
        try:
            out[key] = fingerprint(resolve_key_file(baton.workdir, key))
        except HeartbeatError as exc:
            out[key] = f"unsafe:{exc.message}"
    return out


def inherited_constraints(packages: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Every constraint the packages carry, once each, as ``{"text", "from"}``: ``from`` is the
    task that first set it (a constraint crosses any number of boundaries with its origin)."""
    seen: set[str] = set()
    out: list[dict[str, str]] = []
    for package in packages:
        for item in package.get("constraints", []):
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                continue
            text = item["text"]
            if text in seen:
                continue
            seen.add(text)
            out.append({"text": text, "from": str(item.get("from") or package.get("upstream") or "")})
    return out


def build_package(store: Store, baton: Baton, *, note: str = "") -> dict[str, Any]:
    """What ``baton`` hands to its downstreams when it finishes (the ``handed_off`` event's data)."""
    own = [c for c in baton.constraints if c.strip()]
    constraints = [{"text": c, "from": baton.id} for c in own]
    known = set(own)
    for item in inherited_constraints(load_packages(store, baton)):
        if item["text"] not in known:
            known.add(item["text"])
            constraints.append(item)
    package: dict[str, Any] = {
        "upstream": baton.id,
        "task": baton.task,
        "intent": baton.intent,
        "constraints": constraints,
        "decisions": list(baton.decisions),
        "rejected": list(baton.rejected),
        "unknowns": list(baton.unknowns),
        "handoff": baton.handoff,
        "workdir": baton.workdir,
        "key_files": _fingerprints(baton),
        "guarantees": [g.to_dict() for g in baton.guarantees],
        "launcher": baton.launcher,
        "note": note,
    }
    package["missing"] = [part for part in PACKAGE_PARTS if not package[part] or (
        part == "intent" and not str(package[part]).strip())]
    return package


def load_packages(store: Store, baton: Baton) -> list[dict[str, Any]]:
    """The latest package of each upstream of ``baton`` that has finished, newest first.

    Each package gets ``done_at`` (when it was frozen) next to its ledger data.
    """
    found: list[tuple[datetime, dict[str, Any]]] = []
    for upstream in baton.after:
        events = store.ledger.events(upstream, kinds=[HANDED_OFF])
        if not events:
            continue
        latest = events[-1]
        package = dict(latest.data)
        package["upstream"] = upstream
        package["done_at"] = latest.ts.isoformat()
        found.append((latest.ts, package))
    found.sort(key=lambda pair: pair[0], reverse=True)
    return [package for _, package in found]


# -- guarantees ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GuaranteeResult:
    """How one checked guarantee fared: ``code`` is the check's exit (None: timed out, or no such check)."""

    text: str
    check: str
    ok: bool
    code: int | None
    detail: str
    configured: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"guarantee": self.text, "check": self.check, "ok": self.ok, "code": self.code, "detail": self.detail}


def configured_checks(config_path: str | None = None) -> dict[str, CommandConfig]:
    """The ``[checks.NAME]`` of the config found by the usual search, or none when there is no config."""
    from heartbeat.config.load import find_config, load_config

    path = find_config(config_path)
    if path is None:
        return {}
    return dict(load_config(path).checks)


def run_guarantees(
    task_id: str, workdir: str, guarantees: Iterable[Mapping[str, Any]], checks: Mapping[str, CommandConfig]
) -> list[GuaranteeResult]:
    """Run each checked guarantee's command in ``workdir`` (no shell, its own process group,
    killed at the check's timeout). A check the config does not define fails: the promise
    cannot be shown to hold."""
    from heartbeat.config.shape import expand_argv
    from heartbeat.system.commands import run_command

    results = []
    for g in guarantees:
        name = str(g.get("check") or "")
        text = str(g.get("text") or "")
        if not name:
            continue
        config = checks.get(name)
        if config is None:
            results.append(GuaranteeResult(text, name, False, None, f"no [checks.{name}] in the config",
                                           configured=False))
            continue
        argv = expand_argv(config.command, {"id": task_id, "workdir": workdir})
        cwd = workdir if workdir and os.path.isdir(workdir) else None
        result = run_command(argv, timeout=config.timeout, cwd=cwd)
        if result.ok:
            results.append(GuaranteeResult(text, name, True, 0, "ok"))
        else:
            detail = result.error or f"exit {result.code}"
            results.append(GuaranteeResult(text, name, False, result.code, detail))
    return results


def require_guarantees(store: Store, baton: Baton, checks: Mapping[str, CommandConfig] | None,
                       *, actor: str = "") -> None:
    """Refuse ``done`` when a checked guarantee fails: a ``guarantee_failed`` event, then
    :class:`GuaranteeFailed` (exit 4) naming the guarantee and the check's exit."""
    if not any(g.check for g in baton.guarantees):
        return
    if checks is None:
        checks = configured_checks()
    results = run_guarantees(baton.id, baton.workdir, [g.to_dict() for g in baton.guarantees], checks)
    failed = [r for r in results if not r.ok]
    if not failed:
        return
    from heartbeat.model.ledger import Event
    from heartbeat.model.timeparse import utcnow

    data = [r.to_json() for r in failed]
    store.record([Event(task=baton.id, kind=EventKind.GUARANTEE_FAILED, ts=utcnow(), epoch=baton.meta.epoch,
                        revision=baton.meta.revision, actor=actor, data={"failed": data})])
    raise GuaranteeFailed(f"cannot mark done: {describe_failed(data)}", task=baton.id)


def describe_failed(failed: Sequence[Mapping[str, Any]]) -> str:
    """Every failed guarantee of a ``guarantee_failed`` event in one line, each with its check and
    what happened (an exit, a timeout, a check the config lacks): none is summed up as "1 more"."""
    parts = [f"guarantee {str(f.get('guarantee', ''))!r} failed (check {f.get('check', '')}: {f.get('detail', '')})"
             for f in failed]
    return "; ".join(parts) if len(parts) < 2 else f"{len(parts)} guarantees failed: " + "; ".join(
        p.removeprefix("guarantee ").replace(" failed (", " (", 1) for p in parts)


def refused_done(store: Store, task_id: str, epoch: int) -> str:
    """What the latest ``done`` refused in ``epoch`` said (:func:`describe_failed`), or "" when none was."""
    events = [e for e in store.ledger.events(task_id, kinds=[EventKind.GUARANTEE_FAILED]) if e.epoch == epoch]
    if not events:
        return ""
    failed = [f for f in events[-1].data.get("failed") or [] if isinstance(f, dict)]
    return f"done refused: {describe_failed(failed)}" if failed else ""


# -- the downstream's verify ---------------------------------------------------------------


def check_upstreams(
    packages: Sequence[Mapping[str, Any]], checks: Mapping[str, CommandConfig]
) -> tuple[list[dict[str, str]], list[dict[str, Any]], list[str]]:
    """What the downstream's verify finds at its boundaries: changed upstream key files
    (``{"key": "upstream:ID:PATH", ...}``, like a stale file), broken upstream guarantees, and
    the guarantees it could not check (no such ``[checks.NAME]`` here: reported, never
    counted as broken, so a missing config cannot reopen an upstream)."""
    from heartbeat.system.world import MISSING, describe_change, fingerprint, resolve_key_file

    changed: list[dict[str, str]] = []
    broken: list[dict[str, Any]] = []
    unchecked: list[str] = []
    for package in packages:
        upstream = str(package.get("upstream", ""))
        workdir = str(package.get("workdir") or "")
        key_files = package.get("key_files") or {}
        if workdir and isinstance(key_files, dict):
            for path, was in key_files.items():
                if not isinstance(was, str) or not was.startswith(("sha256:", "stat:", "dir:", MISSING)):
                    continue
                try:
                    now = fingerprint(resolve_key_file(workdir, path))
                except HeartbeatError as exc:
                    now = f"unsafe:{exc.message}"
                if now != was:
                    changed.append({"key": f"upstream:{upstream}:{path}", "was": was, "now": now,
                                    "change": describe_change(path, was, now)})
        guarantees = [g for g in package.get("guarantees") or [] if isinstance(g, dict)]
        for result in run_guarantees(upstream, workdir, guarantees, checks):
            if not result.configured:
                unchecked.append(f"{upstream}: {result.text!r} ({result.detail})")
            elif not result.ok:
                broken.append({"upstream": upstream, **result.to_json()})
    return changed, broken, unchecked
