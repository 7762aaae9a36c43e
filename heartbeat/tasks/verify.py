"""``heartbeat verify``: does a baton still hold, for the agent about to act on it?

Verify's checks, in order: the caller's epoch has been superseded (5), the task is not
active (4), an upstream's guarantee broke or the world changed since the baton was written
(3: :mod:`heartbeat.system.world`'s fingerprints, :mod:`heartbeat.tasks.handoff`'s packages), else fresh (0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat.model.baton import Baton, OnBroken, Status, parse_on_broken
from heartbeat.model.errors import (
    EXIT_CONFLICT,
    EXIT_NOT_ACTIVE,
    EXIT_OK,
    EXIT_STALE,
    BadInput,
    HeartbeatError,
    NotActive,
)
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.policy import REOPENED
from heartbeat.model.timeparse import utcnow
from heartbeat.system.world import GIT_HEAD_KEY, world_changes
from heartbeat.tasks import handoff
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.handoff import after_gate

if TYPE_CHECKING:
    from heartbeat.config.shape import CommandConfig
    from heartbeat.store.base import Store

__all__ = ["VerifyResult", "verify", "apply_broken"]


@dataclass
class VerifyResult:
    """What ``heartbeat verify`` found. ``code``: 0 fresh, 3 stale, 4 not active, 5 superseded."""

    task_id: str
    code: int
    status: str  # fresh | stale | broken | blocked | held | not_active | superseded (the ``verified`` event's ``result``)
    message: str
    changed: list[dict[str, str]] = field(default_factory=list)
    task_status: str = ""
    epoch: int = 0
    caller_epoch: int | None = None
    revision: int = 0
    checked: list[str] = field(default_factory=list)
    verified_at: datetime | None = None
    broken: list[dict[str, Any]] = field(default_factory=list)
    """Upstream guarantees that no longer hold (status ``broken``, exit 3)."""
    actions: list[str] = field(default_factory=list)
    """What the edge's ``on_broken`` policy did about them."""
    unchecked: list[str] = field(default_factory=list)
    """Upstream guarantees whose check this config does not define."""

    @property
    def ok(self) -> bool:
        return self.code == EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.task_id,
            "code": self.code,
            "result": self.status,
            "message": self.message,
            "changed": [dict(c) for c in self.changed],
            "task_status": self.task_status,
            "epoch": self.epoch,
            "caller_epoch": self.caller_epoch,
            "revision": self.revision,
            "checked": list(self.checked),
            "verified_at": self.verified_at.isoformat() if self.verified_at else None,
            "broken": [dict(b) for b in self.broken],
            "actions": list(self.actions),
            "unchecked": list(self.unchecked),
        }

    def render_text(self) -> str:
        lines = [f"{self.status}: {self.message}"]
        for b in self.broken:
            lines.append(f"  upstream {b['upstream']}: guarantee {b['guarantee']!r} broken "
                         f"(check {b['check']} {b['detail']})")
        for action in self.actions:
            lines.append(f"  policy: {action}")
        for item in self.unchecked:
            lines.append(f"  not checked: {item}")
        for c in self.changed:
            lines.append(f"  {c['key']}: {c['change']} ({_short(c['was'])} -> {_short(c['now'])})")
        return "\n".join(lines)


def _short(value: str) -> str:
    if value.startswith("sha256:"):
        return value[:19]
    return value if len(value) <= 60 else value[:57] + "..."


def verify(
    store: Store,
    task_id: str,
    *,
    epoch: int | None = None,
    actor: str = "",
    now: datetime | None = None,
    record: bool = True,
    checks: Mapping[str, CommandConfig] | None = None,
) -> VerifyResult:
    """Does the baton still hold for a caller at ``epoch``? Records a ``verified`` event.

    Superseded (5) is checked before not active (4), before broken and stale (3): an
    agent whose epoch has moved on must stop whatever the world looks like. A task with
    upstreams (``after``) also re-runs their guarantees (``checks``: the config's
    ``[checks.NAME]``, None reads the config) and compares their key files with the
    fingerprints of their packages; a broken guarantee triggers the edge's ``on_broken``
    policy when ``record`` is set.
    """
    now = now or utcnow()
    baton = store.load(task_id)
    meta = baton.meta
    checked = sorted(k for k in meta.world if k in set(baton.key_files) | {GIT_HEAD_KEY})
    result = VerifyResult(task_id, EXIT_OK, "fresh", "", task_status=meta.status.value, epoch=meta.epoch,
                          caller_epoch=epoch, revision=meta.revision, checked=checked, verified_at=now)
    if epoch is not None and epoch != meta.epoch:
        result.code, result.status = EXIT_CONFLICT, "superseded"
        relation = "has been superseded by" if epoch < meta.epoch else "is ahead of"
        result.message = (f"{task_id}: your epoch {epoch} {relation} the task's epoch {meta.epoch}: "
                          "another agent holds this task; stop and do not write")
    elif cycle := _held_by_cycle(store, baton):
        result.code, result.status = EXIT_NOT_ACTIVE, "held"
        result.message = (f"{task_id} is held for ever by a cycle of `after` ({handoff.show_chain(cycle)}): "
                          "no task in it can be dispatched until one of them is done")
    elif meta.status is not Status.ACTIVE:
        result.code = EXIT_NOT_ACTIVE
        if meta.status is Status.BLOCKED:
            result.status = "blocked"
            gate = meta.gate.spec() if meta.gate else "human"
            result.message = f"{task_id} is blocked on {' '.join(baton.blocked_on.split())!r} (gate {gate})"
        else:  # done, failed, escalated, snoozed, paused: not "blocked", which would send a reader to a gate
            result.status = "not_active"
            result.message = f"{task_id} is {meta.status.value}, not active: nothing to act on under this baton"
    else:
        result.changed = world_changes(baton)
        if baton.after:
            packages = handoff.load_packages(store, baton)
            if checks is None and any(g.get("check") for p in packages for g in p.get("guarantees") or []
                                      if isinstance(g, dict)):
                checks = handoff.configured_checks()
            changed, result.broken, result.unchecked = handoff.check_upstreams(packages, checks or {})
            result.changed.extend(changed)
        if result.broken:
            result.code, result.status = EXIT_STALE, "broken"
            names = ", ".join(sorted({b["upstream"] for b in result.broken}))
            result.message = (f"{task_id}: {len(result.broken)} upstream guarantee(s) broken ({names}): "
                              "do not build on it; the edge's policy applies")
            if record:
                result.actions = apply_broken(store, baton, result.broken, actor=actor, now=now)
        elif result.changed:
            result.code, result.status = EXIT_STALE, "stale"
            result.message = (f"{task_id}: the world changed since the baton was written (revision "
                              f"{meta.revision}): {len(result.changed)} change(s); re-read before acting")
        else:
            what = f"{len(checked)} fingerprint(s)" if checked else "nothing fingerprinted"
            result.message = f"{task_id} is active at epoch {meta.epoch} and the world matches the baton ({what})"
    if record:
        store.record([Event(task=task_id, kind=EventKind.VERIFIED, ts=now, epoch=epoch if epoch is not None else meta.epoch,
                            revision=meta.revision, actor=actor,
                            data={"result": result.status, "changed": [c["key"] for c in result.changed],
                                  **({"broken": [b["upstream"] for b in result.broken]} if result.broken else {})})])
    return result


def _held_by_cycle(store: Store, baton: Baton) -> list[str]:
    """The cycle of ``after`` an active or blocked task is caught in (written before cycles were
    checked inside the write, imported, or edited by hand), else ``[]``."""
    if not baton.after or baton.meta.status not in (Status.ACTIVE, Status.BLOCKED):
        return []
    return handoff.held_in_cycle(baton.meta.id, store.load)


def apply_broken(store: Store, downstream: Baton, broken: Sequence[Mapping[str, Any]], *, actor: str = "",
                 now: datetime | None = None) -> list[str]:
    """Apply the downstream's ``on_broken`` policy to each upstream with a broken guarantee.

    The upstream is reopened (active, ``last_failure`` naming the guarantee and the
    downstream), escalated, or reopened on the fallback launcher; the downstream is blocked
    on ``after:UPSTREAM`` so it waits. Returns one line per action taken.
    """
    now = now or utcnow()
    policy, fallback = parse_on_broken(downstream.on_broken or OnBroken.REOPEN.value)
    by_upstream: dict[str, list[Mapping[str, Any]]] = {}
    for item in broken:
        by_upstream.setdefault(str(item["upstream"]), []).append(item)
    actions: list[str] = []
    events = [Event(task=downstream.id, kind=EventKind.GUARANTEE_BROKEN, ts=now, epoch=downstream.meta.epoch,
                    revision=downstream.meta.revision, actor=actor,
                    data={"upstream": u, "broken": [dict(i) for i in items], "policy": downstream.on_broken
                          or OnBroken.REOPEN.value}) for u, items in by_upstream.items()]
    store.record(events)
    for upstream, items in by_upstream.items():
        first = items[0]
        why = (f"guarantee {first['guarantee']!r} broke for {downstream.id} "
               f"(check {first['check']} {first['detail']})")
        try:
            with store.edit(upstream, actor=actor or downstream.id, now=now) as ed:
                if ed.old.meta.status is not Status.DONE:
                    ed.cancel()  # already reopened by another consumer: nothing to do twice
                    continue
                meta = ed.baton.meta
                meta.last_failure = why
                meta.attempt = 0
                meta.idle_resumes = 0
                if policy is OnBroken.ESCALATE:
                    meta.status = Status.ESCALATED
                    ed.event(EventKind.ESCALATED, reason=why, by=downstream.id)
                else:
                    meta.status = Status.ACTIVE
                    # The dispatch's reason is this, not the last agent's clean exit ("ended its shift").
                    meta.last_exit = None
                    meta.last_failure = f"{REOPENED}{downstream.id}: {why}"
                    if policy is OnBroken.FALLBACK:
                        ed.baton.launcher = fallback
                    ed.event(EventKind.REOPENED, by=downstream.id, reason=why, policy=policy.value,
                             launcher=ed.baton.launcher)
        except HeartbeatError as exc:
            actions.append(f"{upstream}: could not apply {policy.value}: {exc}")
            continue
        verb = {"reopen": "reopened", "escalate": "escalated", "fallback": f"reopened on launcher {fallback}"}
        actions.append(f"{upstream} {verb[policy.value]}: {why}")
    waiting = list(by_upstream)
    try:
        tasks.block(store, downstream.id, f"upstream {', '.join(waiting)} must hold its guarantees again",
                    after_gate(waiting), actor=actor or downstream.id)
        actions.append(f"{downstream.id} waits (gate after:{','.join(waiting)})")
    except (NotActive, BadInput) as exc:
        actions.append(f"{downstream.id}: could not wait: {exc}")
    return actions
