"""``heartbeat verify``: does a baton still hold, for the agent about to act on it?

Verify's checks, in order: the caller's epoch has been superseded (5), the task is not
active (4), an upstream's guarantee broke or the world changed since the baton was written
(3: :mod:`heartbeat.world`'s fingerprints, :mod:`heartbeat.handoff`'s packages), else fresh (0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat import handoff
from heartbeat.errors import EXIT_CONFLICT, EXIT_NOT_ACTIVE, EXIT_OK, EXIT_STALE
from heartbeat.world import GIT_HEAD_KEY, world_changes

if TYPE_CHECKING:
    from heartbeat.config import CommandConfig
    from heartbeat.store.base import Store

__all__ = ["VerifyResult", "verify"]


@dataclass
class VerifyResult:
    """What ``heartbeat verify`` found. ``code``: 0 fresh, 3 stale, 4 not active, 5 superseded."""

    task_id: str
    code: int
    status: str  # fresh | stale | blocked | superseded (the ``verified`` event's ``result``)
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
    from heartbeat.baton import Status
    from heartbeat.ledger import Event
    from heartbeat.timeparse import utcnow

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
    elif meta.status is not Status.ACTIVE:
        result.code, result.status = EXIT_NOT_ACTIVE, "blocked"
        if meta.status is Status.BLOCKED:
            gate = meta.gate.spec() if meta.gate else "human"
            result.message = f"{task_id} is blocked on {' '.join(baton.blocked_on.split())!r} (gate {gate})"
        else:
            result.message = f"{task_id} is {meta.status.value}, not active"
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
                result.actions = handoff.apply_broken(store, baton, result.broken, actor=actor, now=now)
        elif result.changed:
            result.code, result.status = EXIT_STALE, "stale"
            result.message = (f"{task_id}: the world changed since the baton was written (revision "
                              f"{meta.revision}): {len(result.changed)} change(s); re-read before acting")
        else:
            what = f"{len(checked)} fingerprint(s)" if checked else "nothing fingerprinted"
            result.message = f"{task_id} is active at epoch {meta.epoch} and the world matches the baton ({what})"
    if record:
        store.record([Event(task=task_id, kind="verified", ts=now, epoch=epoch if epoch is not None else meta.epoch,
                            revision=meta.revision, actor=actor,
                            data={"result": result.status, "changed": [c["key"] for c in result.changed],
                                  **({"broken": [b["upstream"] for b in result.broken]} if result.broken else {})})])
    return result
