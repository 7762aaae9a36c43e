"""The verbs agents and humans use on a task: new, set, add, touch, claim, block, done, ...

Each is a small function over a :class:`~heartbeat.store.Store`, shared by the CLI and
the Python API so both enforce the same rules: ``blocked_on`` and ``meta`` change only
through block/unblock and the daemon; a finished task is not silently reopened; every
write is fenced by the caller's epoch when it has one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat.model import defaults
from heartbeat.model.baton import (
    FINISHED_STATUSES,
    ID_PATTERN,
    LIST_FIELDS,
    SCALAR_FIELDS,
    Baton,
    Gate,
    GateKind,
    GlobKind,
    Guarantee,
    Guard,
    Meta,
    Owner,
    Status,
    check_guard_glob,
    check_id,
    parse_on_broken,
)
from heartbeat.model.baton import host_labels as baton_host_labels
from heartbeat.model.errors import BadInput, Conflict, NotActive
from heartbeat.model.ledger import EventKind
from heartbeat.model.timeparse import utcnow
from heartbeat.store.base import Edit, PulseSink, Store

if TYPE_CHECKING:
    from heartbeat.config.shape import CommandConfig

__all__ = [
    "SETTABLE_FIELDS",
    "build_task",
    "new_task",
    "set_fields",
    "add_items",
    "add_guarantee",
    "add_constraint",
    "make_guard",
    "touch",
    "claim",
    "release",
    "snooze",
    "block",
    "unblock",
    "finish",
    "fail",
    "retry",
]

SETTABLE_FIELDS = tuple(f for f in SCALAR_FIELDS if f != "blocked_on")
"""Scalar fields ``set`` may change; ``blocked_on`` goes through block/unblock only."""


def build_task(
    task_id: str,
    *,
    task: str,
    step: str,
    intent: str = "",
    next_step: str = "",
    workdir: str = "",
    launcher: str = "",
    handoff: str = "",
    key_files: Sequence[str] = (),
    constraints: Sequence[str] = (),
    plan: Sequence[str] = (),
    blocked_on: str = "",
    gate: Gate | None = None,
    owner: Owner | None = None,
    after: Sequence[str] = (),
    needs: Sequence[str] = (),
    guarantees: Sequence[Guarantee] = (),
    on_broken: str = "",
    host_labels: Sequence[str] = (),
    guards: Sequence[Guard] = (),
    irreversible: Sequence[str] = (),
    now: datetime | None = None,
) -> Baton:
    """The baton :func:`new_task` creates, checked but not written. With ``owner`` it is
    claimed at once (epoch 1); with ``blocked_on`` it starts blocked.

    With ``after`` it starts blocked on the gate ``after:A,B`` (unless ``blocked_on`` says
    otherwise): it is dispatched once every upstream is done, with their packages in its brief.
    """
    check_id(task_id)
    for upstream in after:
        check_id(upstream)
    if needs:
        from heartbeat.tasks.needs import parse_parts

        needs = parse_parts(needs, task=task_id, field="needs")
        if not after:
            raise BadInput("needs are of an upstream: give --after too", task=task_id, field="needs")
    if on_broken:
        parse_on_broken(on_broken)
    for g in guarantees:
        if not g.text.strip():
            raise BadInput("a guarantee needs its text", task=task_id, field="guarantees")
    if after and not blocked_on:
        from heartbeat.tasks.handoff import after_gate

        blocked_on = f"waiting for upstream {', '.join(after)}"
        gate = after_gate(after)
    if not task.strip():
        raise BadInput("must not be empty", task=task_id, field="task")
    if not step.strip():
        raise BadInput("must not be empty", task=task_id, field="step")
    if workdir and not os.path.isabs(workdir):
        workdir = os.path.abspath(workdir)
    check_gate_target(task_id, gate)
    meta = Meta(id=task_id)
    if blocked_on:
        meta.status = Status.BLOCKED
        meta.gate = gate or Gate(GateKind.HUMAN)
        meta.blocked_at = now or utcnow()
    if owner is not None:
        meta.owner = owner
        meta.epoch = 1
    baton = Baton(
        task=task,
        step=step,
        intent=intent,
        next_step=next_step,
        workdir=workdir,
        launcher=launcher,
        handoff=handoff,
        key_files=list(key_files),
        constraints=list(constraints),
        plan=list(plan),
        blocked_on=blocked_on,
        after=list(after),
        needs=list(needs),
        guarantees=list(guarantees),
        on_broken=on_broken,
        guards=list(guards),
        irreversible=list(irreversible),
        meta=meta,
    )
    for guard in guards:  # a guard's constraint is one of the task's
        if guard.constraint not in baton.constraints:
            baton.constraints.append(guard.constraint)
    if host_labels:  # a top-level key of the baton: only daemons offering every label dispatch it
        baton.extra["host_labels"] = list(host_labels)
        baton.extra["host_labels"] = baton_host_labels(baton)
    return baton


def new_task(store: Store, task_id: str, *, actor: str = "", now: datetime | None = None,
             **fields: Any) -> Baton:
    """Create a task (the fields as :func:`build_task` takes them)."""
    return store.create(build_task(task_id, now=now, **fields), actor=actor, now=now)


def set_fields(
    store: Store,
    task_id: str,
    values: Mapping[str, str],
    *,
    expect_revision: int | None = None,
    epoch: int | None = None,
    actor: str = "",
) -> Baton:
    """Set scalar fields. ``blocked_on``, list fields and ``meta.*`` are refused with the way to do it."""
    for name, value in values.items():
        _check_settable(task_id, name)
        if name in ("task", "step") and not value.strip():
            raise BadInput("must not be empty", task=task_id, field=name)
        if name == "workdir" and value and not os.path.isabs(value):
            raise BadInput("must be an absolute path", task=task_id, field=name)
        if "\0" in value:
            raise BadInput("contains a NUL byte", task=task_id, field=name)
    with store.edit(task_id, expect_revision=expect_revision, epoch=epoch, actor=actor) as ed:
        for name, value in values.items():
            setattr(ed.baton, name, value)
    _arm_pulse(store, task_id, epoch)
    return ed.baton


def _check_settable(task_id: str, name: str) -> None:
    if name == "blocked_on":
        raise BadInput(
            "is set only through `heartbeat block` and cleared only through `heartbeat unblock --by NAME`",
            task=task_id,
            field=name,
        )
    if name == "meta" or name.startswith("meta."):
        raise BadInput("is managed by heartbeat and cannot be set", task=task_id, field=name)
    if name in LIST_FIELDS:
        raise BadInput(f"is a list: use `heartbeat add {task_id} {name} VALUE...`", task=task_id, field=name)
    if name not in SETTABLE_FIELDS:
        raise BadInput(f"unknown field (settable: {', '.join(SETTABLE_FIELDS)})", task=task_id, field=name)


def add_items(
    store: Store,
    task_id: str,
    name: str,
    items: Sequence[str],
    *,
    expect_revision: int | None = None,
    epoch: int | None = None,
    actor: str = "",
    config_path: str | None = None,
) -> Baton:
    """Append to a list field (done, plan, constraints, decisions, ..., ``rederived``, ``after``, ``needs``).

    A ``rederived`` item may teach its edges a need (:func:`heartbeat.tasks.needs.learn`, with the
    ``[handoff]`` knobs of ``config_path``, else of the config the usual search finds)."""
    if name == "guarantees":
        raise BadInput(f"use `heartbeat add {task_id} guarantees \"TEXT\" [--check NAME]`", task=task_id, field=name)
    if name in ("rederived", "after", "needs"):
        baton = _add_handoff_items(store, task_id, name, items, expect_revision=expect_revision, epoch=epoch,
                                   actor=actor)
        if name == "rederived":  # the profile may now require a part of this task's upstreams
            from heartbeat.tasks.needs import configured_handoff, learn

            learn(store, [task_id], configured_handoff(config_path), actor=actor)
        return baton
    if name not in LIST_FIELDS:
        raise BadInput(f"is not a list field (lists: {', '.join(LIST_FIELDS)})", task=task_id, field=name)
    if not items:
        raise BadInput("nothing to add", task=task_id, field=name)
    for item in items:
        if not item or "\0" in item:
            raise BadInput("items must be non-empty text", task=task_id, field=name)
    with store.edit(task_id, expect_revision=expect_revision, epoch=epoch, actor=actor) as ed:
        values = getattr(ed.baton, name)
        new = list(items) if name == "plan" else _not_in(values, items)  # a plan may repeat a step on purpose
        if not new:  # an agent re-recording what it did after a resume: nothing to write, no progress
            ed.cancel()
        values.extend(new)
    _arm_pulse(store, task_id, epoch)
    return ed.baton


def _not_in(values: Sequence[str], items: Sequence[str]) -> list[str]:
    """``items`` not already in ``values`` (nor earlier in ``items``), in order."""
    seen = set(values)
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _add_handoff_items(store: Store, task_id: str, name: str, items: Sequence[str], *,
                       expect_revision: int | None, epoch: int | None, actor: str) -> Baton:
    if not items or any(not item or "\0" in item for item in items):
        raise BadInput("items must be non-empty text", task=task_id, field=name)
    if name == "after":
        for item in items:
            check_id(item)
    if name == "needs":
        from heartbeat.tasks.needs import parse_parts

        items = parse_parts(items, task=task_id, field=name)
    with store.edit(task_id, expect_revision=expect_revision, epoch=epoch, actor=actor, links=name == "after") as ed:
        if name == "after":  # an unknown upstream or a cycle would hold the task forever, silently
            from heartbeat.tasks.handoff import check_upstreams_exist

            # Inside the links lock: `add x after y` racing `add y after x` cannot both pass.
            check_upstreams_exist(ed.load, task_id, items, field=name)
        values = getattr(ed.baton, name)
        if name == "needs" and not ed.baton.after:
            raise BadInput("needs are of an upstream: add one first (`heartbeat add ID after UP`)", task=task_id,
                           field=name)
        values.extend(i for i in items if name == "rederived" or i not in values)
        if name == "rederived":
            ed.event(EventKind.REDERIVED, items=list(items))
    return ed.baton


def add_constraint(
    store: Store,
    task_id: str,
    text: str,
    *,
    protect: Sequence[str] = (),
    forbid: Sequence[str] = (),
    expect_revision: int | None = None,
    epoch: int | None = None,
    actor: str = "",
) -> Baton:
    """Add a constraint with its guards (``--protect``/``--forbid``), which the rail enforces from the
    agent's next tool call."""
    guard = make_guard(task_id, text, protect, forbid)
    with store.edit(task_id, expect_revision=expect_revision, epoch=epoch, actor=actor) as ed:
        if len(ed.baton.guards) >= defaults.MAX_GUARDS:
            raise BadInput(f"the task has {defaults.MAX_GUARDS} guarded constraints already", task=task_id,
                           field="constraints")
        ed.baton.constraints.append(text)
        ed.baton.guards.append(guard)
    _arm_pulse(store, task_id, epoch)
    return ed.baton


def make_guard(task_id: str, text: str, protect: Sequence[str], forbid: Sequence[str]) -> Guard:
    """A constraint's guard, each glob checked (one-line :class:`BadInput` for a hostile one)."""
    if not text.strip() or "\0" in text:
        raise BadInput("a constraint needs its text", task=task_id, field="constraints")
    if len(protect) + len(forbid) > defaults.MAX_GUARD_GLOBS:
        raise BadInput(f"over {defaults.MAX_GUARD_GLOBS} globs for one constraint", task=task_id, field="constraints")
    try:
        return Guard(text, [check_guard_glob(g, GlobKind.PROTECT) for g in protect],
                     [check_guard_glob(g, GlobKind.FORBID) for g in forbid])
    except BadInput as exc:
        raise BadInput(exc.message, task=task_id, field=exc.field) from None


def add_guarantee(
    store: Store,
    task_id: str,
    text: str,
    *,
    check: str = "",
    expect_revision: int | None = None,
    epoch: int | None = None,
    actor: str = "",
) -> Baton:
    """Add a guarantee: what this task promises its consumers, with the ``[checks.NAME]`` proving it."""
    if not text.strip() or "\0" in text:
        raise BadInput("a guarantee needs its text", task=task_id, field="guarantees")
    if check and not ID_PATTERN.fullmatch(check):
        raise BadInput(f"bad check name {check[:40]!r}", task=task_id, field="--check")
    with store.edit(task_id, expect_revision=expect_revision, epoch=epoch, actor=actor) as ed:
        ed.baton.guarantees.append(Guarantee(text, check))
    return ed.baton


def touch(store: Store, task_id: str, *, epoch: int | None = None, actor: str = "") -> Baton:
    """A heartbeat: "alive, still on this step". Not progress.

    An agent's touch, ``set`` or ``add`` (``epoch`` given) on a file store then arms its
    pulse, so that its next touches in the coalescing window need no baton write
    (:mod:`heartbeat.hotpath.pulse`): this one is such a pulse when one is armed, as the CLI's
    ``touch`` is (the baton returned is read back, the pulse its ``touched_at``)."""
    if epoch is not None and isinstance(store, PulseSink) and store.pulse(task_id, epoch):
        return store.load(task_id)
    with store.edit(task_id, epoch=epoch, actor=actor, touch=True) as ed:
        pass
    _arm_pulse(store, task_id, epoch)
    return ed.baton


def _arm_pulse(store: Store, task_id: str, epoch: int | None) -> None:
    """After an agent's own write (``epoch`` given): its next touches may be pulses (file store only)."""
    if epoch is not None and isinstance(store, PulseSink):
        store.arm_pulse(task_id, epoch)


def _require(ed: Edit, allowed: set[Status] | frozenset[Status], verb: str) -> None:
    status = ed.old.meta.status
    if status not in allowed:
        raise NotActive(f"cannot {verb}: the task is {status.value}", task=ed.old.id)


def claim(
    store: Store,
    task_id: str,
    owner: Owner,
    *,
    force: bool = False,
    alive: bool | None = None,
    actor: str = "",
) -> Baton:
    """Take the task for an agent the daemon did not start; bumps and returns the epoch.

    A task held by another live agent is refused (exit 5) unless ``force``; its epoch is
    bumped either way so the previous holder's writes are fenced off from now on.
    """
    from heartbeat.launchers.liveness import is_alive

    with store.edit(task_id, actor=actor) as ed:
        _require(ed, {Status.ACTIVE, Status.SNOOZED, Status.PAUSED}, "claim")
        current = ed.old.meta.owner
        same = current is not None and current.pid == owner.pid and current.host == owner.host
        held = alive if alive is not None else is_alive(current)
        if current is not None and not same and held and not force:
            raise Conflict(
                f"held by a live agent (pid {current.pid} on {current.host or 'this host'}); "
                "release it first or pass --force",
                task=task_id,
            )
        meta = ed.baton.meta
        meta.epoch += 1
        meta.owner = owner
        meta.status = Status.ACTIVE
        meta.snooze_until = None
        ed.event(EventKind.CLAIMED, pid=owner.pid, host=owner.host, previous_pid=current.pid if current else None)
    return ed.baton


def release(store: Store, task_id: str, *, epoch: int | None = None, actor: str = "") -> Baton:
    """Hand the task back to the daemon: the owner is cleared and, if unfinished, a successor is due."""
    with store.edit(task_id, epoch=epoch, actor=actor) as ed:
        previous = ed.old.meta.owner
        ed.baton.meta.owner = None
        ed.event(EventKind.RELEASED, pid=previous.pid if previous else None)
    return ed.baton


def snooze(store: Store, task_id: str, until: datetime, *, epoch: int | None = None, actor: str = "") -> Baton:
    """End the shift: status snoozed; the daemon wakes the task with a fresh agent at ``until``."""
    with store.edit(task_id, epoch=epoch, actor=actor) as ed:
        _require(ed, {Status.ACTIVE, Status.SNOOZED}, "snooze")
        ed.baton.meta.status = Status.SNOOZED
        ed.baton.meta.snooze_until = until
        ed.event(EventKind.SNOOZED, until=until.isoformat())
    return ed.baton


def pause(store: Store, task_id: str, *, by: str, reason: str = "") -> Baton:
    """Hold an active (or snoozed) task: nothing is dispatched until :func:`resume`; a running agent
    gets ``inactive_grace`` to end on its own, then is stopped (no failed attempt)."""
    if not by.strip():
        raise BadInput("name who pauses the task (--by NAME)", task=task_id, field="by")
    with store.edit(task_id, actor=by) as ed:
        _require(ed, {Status.ACTIVE, Status.SNOOZED, Status.PAUSED}, "pause")
        ed.baton.meta.status = Status.PAUSED
        ed.event(EventKind.PAUSED, by=by, reason=reason, was=ed.old.meta.status.value)
    return ed.baton


def resume(store: Store, task_id: str, *, by: str) -> Baton:
    """Make a paused task active again: the daemon dispatches it at its next look."""
    if not by.strip():
        raise BadInput("name who resumes the task (--by NAME)", task=task_id, field="by")
    with store.edit(task_id, actor=by) as ed:
        _require(ed, {Status.PAUSED}, "resume")
        ed.baton.meta.status = Status.ACTIVE
        ed.baton.meta.snooze_until = None
        ed.event(EventKind.RESUMED, by=by)
    return ed.baton


def block(
    store: Store, task_id: str, on: str, gate: Gate, *, epoch: int | None = None, actor: str = ""
) -> Baton:
    """Block the task on ``on`` until ``gate`` opens or a human unblocks it."""
    check_gate_target(task_id, gate)
    if not on.strip():
        raise BadInput("say what the task is blocked on", task=task_id, field="blocked_on")
    with store.edit(task_id, epoch=epoch, actor=actor) as ed:
        _require(ed, {Status.ACTIVE, Status.SNOOZED, Status.PAUSED, Status.BLOCKED}, "block")
        _refuse_over_a_question(ed)
        meta = ed.baton.meta
        ed.baton.blocked_on = on
        meta.status = Status.BLOCKED
        meta.gate = gate
        meta.blocked_at = ed.now
        meta.snooze_until = None
        ed.event(EventKind.BLOCKED, on=on, gate=gate.spec())
    return ed.baton


def _refuse_over_a_question(ed: Edit) -> None:
    """A block over a task's open question would swap its ``question:`` gate for another, and the
    answer would then lift nothing: refused, naming the way out."""
    from heartbeat.tasks.questions import waiting_on

    waiting = waiting_on(ed.old)
    if waiting is not None:
        qids = ", ".join(q.id for q in waiting.questions)
        raise NotActive(f"cannot block: the task waits on its question {qids} (answer it with `heartbeat answer "
                        f"{ed.old.id} QID \"...\"`, or lift the wait with `heartbeat unblock {ed.old.id} --by NAME`)",
                        task=ed.old.id)


def unblock(store: Store, task_id: str, *, by: str, note: str = "", gate_opened: str = "") -> Baton:
    """Lift a block. ``by`` names the human (or ``gate:<spec>`` when the daemon saw a gate open)."""
    if not by.strip():
        raise BadInput("name who unblocks (--by NAME)", task=task_id, field="by")
    with store.edit(task_id, actor=by) as ed:
        _require(ed, {Status.BLOCKED}, "unblock")
        meta = ed.baton.meta
        was_on, gate = ed.old.blocked_on, ed.old.meta.gate
        ed.baton.blocked_on = ""
        meta.status = Status.ACTIVE
        meta.gate = None
        meta.blocked_at = None
        meta.attempt = 0
        meta.idle_resumes = 0
        ed.event(EventKind.UNBLOCKED, by=by, note=note, was_on=was_on, gate=gate.spec() if gate else "human",
                 gate_opened=gate_opened)
    return ed.baton


def finish(store: Store, task_id: str, *, note: str = "", epoch: int | None = None, actor: str = "",
           checks: Mapping[str, CommandConfig] | None = None, force: bool = False,
           config_path: str | None = None) -> Baton:
    """Mark the task done, once its checked guarantees hold and its downstreams' needs are met, and
    freeze its package for its downstreams.

    A downstream's need (declared, learned or pinned: :mod:`heartbeat.tasks.needs`) whose part is
    empty refuses with :class:`~heartbeat.model.errors.NeedsUnmet` (exit 4); ``force`` (a person's
    ``done --force``) finishes anyway and records what was unmet.

    The guarantees' checks run before the baton is locked (``checks``: the config's
    ``[checks.NAME]``; None reads the config found by the usual search). A failing one
    refuses with :class:`~heartbeat.model.errors.GuaranteeFailed` (exit 4) and changes nothing
    but the ledger's ``guarantee_failed`` event.
    """
    from heartbeat.tasks import handoff, needs

    current = store.load(task_id)
    if current.meta.status in {Status.ACTIVE, Status.SNOOZED, Status.PAUSED, Status.ESCALATED}:
        if epoch is not None and epoch != current.meta.epoch:
            from heartbeat.store.base import check_fence

            check_fence(current, expect_revision=None, epoch=epoch)
        handoff.require_guarantees(store, current, checks, actor=actor)
        needs.require_needs(store, current, force=force, actor=actor)
    with store.edit(task_id, epoch=epoch, actor=actor) as ed:
        _require(ed, {Status.ACTIVE, Status.SNOOZED, Status.PAUSED, Status.ESCALATED}, "mark done")
        ed.baton.meta.status = Status.DONE
        ed.baton.meta.snooze_until = None
        ed.event(EventKind.DONE, note=note)
        ed.event(handoff.HANDED_OFF, **handoff.build_package(store, ed.baton, note=note))
    # A new handoff can teach only with learn_from "missing" (its empty parts): re-derived parts are
    # learned when the downstream records them, and a clean handoff only ever lowers a count.
    config = needs.configured_handoff(config_path)
    if config.learn and "missing" in config.learn_from.split("+"):
        needs.learn(store, [task_id], config, actor=actor)
    return ed.baton


def fail(store: Store, task_id: str, *, reason: str, epoch: int | None = None, actor: str = "") -> Baton:
    """Mark the task failed; nothing more is dispatched until ``retry``."""
    if not reason.strip():
        raise BadInput("say why (--reason TEXT)", task=task_id, field="reason")
    with store.edit(task_id, epoch=epoch, actor=actor) as ed:
        if ed.old.meta.status in FINISHED_STATUSES:
            raise NotActive(f"cannot fail: the task is {ed.old.meta.status.value}", task=task_id)
        ed.baton.meta.status = Status.FAILED
        ed.baton.meta.last_failure = reason
        ed.event(EventKind.FAILED, reason=reason)
    return ed.baton


def retry(store: Store, task_id: str, *, by: str, note: str = "") -> Baton:
    """Re-arm an escalated or failed task: attempts reset, the daemon dispatches it again."""
    if not by.strip():
        raise BadInput("name who re-arms the task (--by NAME)", task=task_id, field="by")
    with store.edit(task_id, actor=by) as ed:
        _require(ed, {Status.ESCALATED, Status.FAILED}, "retry")
        meta = ed.baton.meta
        meta.status = Status.ACTIVE
        meta.attempt = 0
        meta.idle_resumes = 0
        meta.wait_until = meta.wait_since = None  # a person's retry does not wait for a limit it escalated for
        meta.wait_reason, meta.limit_hits = "", 0
        meta.launch_failures = 0
        ed.event(EventKind.RETRIED, by=by, note=note, was=ed.old.meta.status.value)
    return ed.baton


def check_gate_target(task_id: str, gate: Gate | None) -> None:
    """Refuse a ``task:ID`` gate on the task itself: it could only open once the task is done."""
    if gate is not None and gate.kind is GateKind.TASK and gate.target == task_id:
        raise BadInput(f"--gate task:{task_id} names the task itself; it would never open", task=task_id)
