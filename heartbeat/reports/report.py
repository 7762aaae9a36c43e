"""Handoff metrics: what outputs never show, read back from the ledger (and the current batons).

``heartbeat report`` replays each task's events in order and counts, per task and in
``totals`` (keys exactly as below):

``dispatches``
    agent starts: a ``dispatched`` event (the daemon started an agent), a ``claimed``
    event (an agent started outside it; a re-claim by the same pid is not a new start)
    or a ``created`` event with an epoch (``new --claim``).
``resumes``
    starts after the task's first start.
``clean_resumes``
    resumes whose first progress write (the first write that changes ``step`` or grows
    ``done``; notes-only writes are not judged) moved forward: the step became one not
    done before (and not an earlier plan step), or ``done`` grew with items not done
    before, or the task was marked done.
``redone_steps``
    after a resume, the step changed to one already recorded in ``done`` or passed in
    the ``plan`` (an earlier plan step than the furthest one reached).
``skipped_steps``
    in a task with a ``plan``: plan steps jumped past by a step change, never recorded
    done and never the current step. Each plan step counts once.
``bypassed_blocks``
    ``bypass`` events (the daemon saw a hand edit drop a block), plus blocks left with
    no ``unblocked`` event in between: an agent started, the task was marked done,
    snoozed or woken while blocked, or the current baton is no longer blocked.
``stale_resumes``
    resumes whose first ``verify`` said stale, or, when the successor did not verify
    before its first write, where the world (key file fingerprints) changed between the
    last write before the gap and that first write. A first ``verify`` that said fresh
    settles it: what the agent changes after checking is its own work.
``idle_resumes``
    resumes whose agent ended (``exited``, ``released``, the next start, or the task
    finishing) without moving the step or growing ``done``.
``spinning``, ``escalations``
    ``spinning`` and ``escalated`` events.
``guarantee_failures``
    ``guarantee_failed`` events: a ``done`` refused (exit 4) because one of the task's own
    checked guarantees failed.
``unnoted_calls``
    at each seam where an agent's run ended (``exited``), the tool calls its trail shows after
    its last note (``unnoted`` in the event: the hooks' record, :mod:`heartbeat.hotpath.trail`), those
    whose outcome is unknown named in the incident: work the ledger cannot otherwise see, the
    sliver a successor may repeat.
``done_while_blocked``
    writes that grew ``done`` (or marked the task done) while the task was blocked, by anyone
    but the daemon: work that went on past a person's block (the step in flight finishing,
    or an agent that ignored it), counted even when the block was kept.
``mean_time_to_resume_s``
    mean over resumes of: the gap's start (``stalled``, else the previous agent's
    ``exited``/``released``; moved to a later ``woke``/``unblocked``/``retried``, since
    waiting on purpose is not a slow resume) to the successor's first write. ``null``
    when nothing was measured.
``duration_s``
    for finished tasks (done or failed): ``created`` to the last ``done``/``failed``;
    ``null`` otherwise. In ``totals``: the sum over finished tasks.

With ``since``, each occurrence counts when it happened at or after ``since`` (a
resume and what is judged about it count at the resume's start), but the replay always
starts at the beginning, so a start after ``since`` is still known to be a resume.

Tasks are listed worst first by a failure score (see :data:`SCORE_WEIGHTS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from heartbeat.model.baton import Baton, Status
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.timeparse import format_duration, utcnow
from heartbeat.reports.seams import render_seams, seam_metrics, seam_totals
from heartbeat.store.base import Store

__all__ = ["METRIC_KEYS", "SCORE_WEIGHTS", "TaskReport", "Report", "build_report", "task_metrics", "failure_score",
           "task_incidents"]

METRIC_KEYS = (
    "dispatches",
    "resumes",
    "clean_resumes",
    "redone_steps",
    "skipped_steps",
    "bypassed_blocks",
    "stale_resumes",
    "idle_resumes",
    "spinning",
    "escalations",
    "guarantee_failures",
    "unnoted_calls",
    "done_while_blocked",
    "mean_time_to_resume_s",
    "duration_s",
)
"""The metric keys, per task and in ``totals``, in this order."""

_COUNT_KEYS = METRIC_KEYS[:13]

SCORE_WEIGHTS = {
    "bypassed_blocks": 5,
    "escalations": 5,
    "stale_resumes": 3,
    "redone_steps": 3,
    "skipped_steps": 3,
    "idle_resumes": 2,
    "spinning": 2,
    "guarantee_failures": 2,
    "done_while_blocked": 5,
    "unnoted_calls": 1,
    "unclean_resumes": 1,
}
"""How much each failure weighs in the sort order; ``unclean_resumes`` = resumes - clean_resumes."""

_DAEMON_KINDS = frozenset({
    EventKind.DISPATCHED, EventKind.EXITED, EventKind.STALLED, EventKind.STOPPED, EventKind.SPINNING,
    EventKind.ESCALATED, EventKind.NOTIFIED, EventKind.BYPASS, EventKind.LAUNCHED, EventKind.ADOPTED,
    EventKind.WOKE, EventKind.INVALID, EventKind.VERIFIED,
})
_AGENT_WRITE_KINDS = frozenset({EventKind.UPDATED, EventKind.TOUCHED, EventKind.BLOCKED, EventKind.SNOOZED,
                                EventKind.RELEASED, EventKind.DONE, EventKind.FAILED})
_BLOCK_BREAKERS = frozenset({EventKind.CLAIMED, EventKind.DISPATCHED, EventKind.DONE, EventKind.SNOOZED, EventKind.WOKE})


def failure_score(metrics: dict[str, Any]) -> int:
    """The sort key of the report: weighted failures (see :data:`SCORE_WEIGHTS`)."""
    unclean = max(0, int(metrics["resumes"]) - int(metrics["clean_resumes"]))
    score = unclean * SCORE_WEIGHTS["unclean_resumes"]
    for key, weight in SCORE_WEIGHTS.items():
        if key != "unclean_resumes":
            score += int(metrics[key]) * weight
    return score


@dataclass
class _Agent:
    """One agent start and what is judged about it."""

    start: Event
    epoch: int
    resume: bool
    step_at_start: str
    world_at_start: dict[str, str]
    gap_from: datetime | None
    counted: bool  # the start is inside the report window
    progressed: bool = False
    judged: bool = False  # stale or not has been decided
    clean_judged: bool = False
    first_write: bool = False
    verified: bool = False
    ended: bool = False


@dataclass
class _Replay:
    """A task's history replayed event by event."""

    plan: list[str]
    since: datetime | None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNT_KEYS, 0))
    incidents: list[dict[str, Any]] = field(default_factory=list)
    ttr: list[float] = field(default_factory=list)
    step: str = ""
    done: set[str] = field(default_factory=set)
    ever_current: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    plan_pos: dict[str, int] = field(default_factory=dict)
    reach: int = -1  # the furthest plan index that has been current or done
    skip_from: int = 0  # plan steps before this index have been judged for skipping
    world: dict[str, str] = field(default_factory=dict)
    blocked: bool = False
    bypass_derived: bool = False  # this block's bypass was already counted from the events
    resumed: bool = False
    starts: int = 0
    agent: _Agent | None = None
    gap_stalled: datetime | None = None
    gap_ended: datetime | None = None
    gap_waited: datetime | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    active_in_window: bool = False

    def within(self, ts: datetime) -> bool:
        return self.since is None or ts >= self.since

    def count(self, key: str, ts: datetime, epoch: int, detail: str) -> None:
        if self.within(ts):
            self.counts[key] += 1
            self.incidents.append({"metric": key, "ts": ts.isoformat(), "epoch": epoch, "detail": detail})

    def __post_init__(self) -> None:
        for i, step in enumerate(self.plan):
            self.plan_pos.setdefault(step, i)

    def visit(self, step: str) -> None:
        """``step`` has been current or done: it moves how far along the plan the task got."""
        self.reach = max(self.reach, self.plan_pos.get(step, -1))

    def passed(self, step: str, reach: int) -> bool:
        return step in self.plan_pos and self.plan_pos[step] < reach

    # -- the replay -------------------------------------------------------------------

    def feed(self, e: Event) -> None:
        if self.within(e.ts):
            self.active_in_window = True
        data = e.data if isinstance(e.data, dict) else {}
        kind = e.kind
        if kind == EventKind.CREATED:
            self.created_at = e.ts
            self.step = str(data.get("step", ""))
            self.ever_current.add(self.step)
            self.visit(self.step)
            self.blocked = data.get("status") == Status.BLOCKED.value
        if self.blocked and kind in _BLOCK_BREAKERS:
            self.count("bypassed_blocks", e.ts, e.epoch, f"{kind} while blocked, with no unblock")
            self.blocked = False
            self.bypass_derived = True
        if self._is_start(e):
            self._start(e)
        if isinstance(data.get("world"), dict):
            self.world = {str(k): str(v) for k, v in data["world"].items()}
        if kind == EventKind.VERIFIED:
            self._verified(e, data)
        was_blocked = self.blocked
        progress = self._content(e, data)
        if was_blocked and e.actor != "daemon" and (kind == EventKind.DONE or (
                kind == EventKind.UPDATED and progress and self._done_grew(data))):
            self.count("done_while_blocked", e.ts, e.epoch, f"{kind} while blocked: work went on past the block")
        if kind == EventKind.EXITED and isinstance(data.get("unnoted"), dict):
            self._unnoted(e, data["unnoted"])
        agent = self.agent
        mine = agent is not None and not agent.ended and e.epoch == agent.epoch and e.actor != "daemon"
        if agent is not None and mine and kind in _AGENT_WRITE_KINDS and not agent.first_write:
            agent.first_write = True
            if agent.resume and agent.gap_from is not None and agent.counted:
                self.ttr.append(max(0.0, (e.ts - agent.gap_from).total_seconds()))
        if agent is not None and mine and kind == EventKind.UPDATED:
            self._judge_stale(agent, e)
        if kind == EventKind.BLOCKED:
            self.blocked = True
            self.bypass_derived = False
        elif kind == EventKind.UNBLOCKED:
            self.blocked = False
            self.bypass_derived = False
        elif kind == EventKind.BYPASS:
            if not self.bypass_derived:  # not already counted when an agent walked past the block
                self.count("bypassed_blocks", e.ts, e.epoch,
                           f"a hand edit dropped the block on {data.get('was_on', '')!r}")
            self.bypass_derived = False
            self.blocked = bool(data.get("on"))  # the daemon holds the task blocked again
        elif kind == EventKind.SPINNING:
            self.count("spinning", e.ts, e.epoch, f"alive but on step {data.get('step', '')!r} since "
                                                  f"{data.get('since', '?')}")
        elif kind == EventKind.ESCALATED:
            self.count("escalations", e.ts, e.epoch, str(data.get("reason", "")))
        elif kind == EventKind.GUARANTEE_FAILED:
            failed = [f for f in data.get("failed") or [] if isinstance(f, dict)]
            self.count("guarantee_failures", e.ts, e.epoch, "done refused: " + "; ".join(
                f"guarantee {str(f.get('guarantee', ''))!r} failed (check {f.get('check', '')} {f.get('detail', '')})"
                for f in failed))
        if kind == EventKind.STALLED:
            self.gap_stalled = e.ts
        elif kind in (EventKind.EXITED, EventKind.RELEASED):
            self.gap_ended = e.ts
        elif kind in (EventKind.WOKE, EventKind.UNBLOCKED, EventKind.RETRIED):
            self.gap_waited = e.ts
        if kind in (EventKind.DONE, EventKind.FAILED):
            self.finished_at = e.ts
        if agent is not None and not agent.ended:
            if progress or kind == EventKind.DONE:
                agent.progressed = True
            if (kind in (EventKind.EXITED, EventKind.RELEASED, EventKind.DONE, EventKind.FAILED)
                    and (e.epoch == agent.epoch or not e.epoch)):
                self._end(agent, e)

    @staticmethod
    def _done_grew(data: dict[str, Any]) -> bool:
        changed = data.get("changed")
        return isinstance(changed, dict | list) and "done" in changed

    def _unnoted(self, e: Event, unnoted: dict[str, Any]) -> None:
        calls = unnoted.get("calls")
        if not isinstance(calls, int) or calls <= 0 or not self.within(e.ts):
            return
        self.counts["unnoted_calls"] += calls
        last = [c for c in unnoted.get("last") or [] if isinstance(c, dict)]
        unknown = [str(c.get("what", ""))[:80] for c in last if c.get("outcome") == "unknown"]
        detail = f"the run of epoch {e.epoch} ended with {calls} call(s) after its last note"
        if unknown:
            detail += f", outcome unknown: {'; '.join(unknown)}"
        self.incidents.append({"metric": "unnoted_calls", "ts": e.ts.isoformat(), "epoch": e.epoch,
                               "detail": detail})

    def _is_start(self, e: Event) -> bool:
        if e.kind == EventKind.DISPATCHED:
            return True
        if e.kind == EventKind.CREATED:
            return e.epoch > 0
        if e.kind == EventKind.CLAIMED:
            data = e.data
            if self.agent is not None and not self.agent.ended and data.get("pid") is not None \
                    and data.get("pid") == data.get("previous_pid"):
                self.agent.epoch = e.epoch  # the same process claimed again: same agent, new epoch
                return False
            return True
        return False

    def _start(self, e: Event) -> None:
        if self.agent is not None and not self.agent.ended:
            self._end(self.agent, e)
        resume = self.starts > 0
        self.starts += 1
        gap_from = self.gap_stalled or self.gap_ended
        if self.gap_waited is not None and (gap_from is None or self.gap_waited > gap_from):
            gap_from = self.gap_waited  # ready again only from the wake / unblock / retry
        counted = self.within(e.ts)
        self.agent = _Agent(start=e, epoch=e.epoch, resume=resume, step_at_start=self.step,
                            world_at_start=dict(self.world), gap_from=gap_from, counted=counted)
        self.gap_stalled = self.gap_ended = self.gap_waited = None
        if counted:
            self.counts["dispatches"] += 1
        if resume:
            self.resumed = True
            if counted:
                self.counts["resumes"] += 1

    def _end(self, agent: _Agent, e: Event) -> None:
        agent.ended = True
        if agent.resume and not agent.progressed:
            how = "the next start" if e.kind in (EventKind.DISPATCHED, EventKind.CLAIMED) else e.kind
            self._count_for(agent, "idle_resumes", f"ended ({how}) without moving from step "
                                                   f"{agent.step_at_start!r}")

    def _count_for(self, agent: _Agent, key: str, detail: str) -> None:
        """Count something judged about a resume, at the resume's start."""
        self.count(key, agent.start.ts, agent.epoch, detail)

    def _verified(self, e: Event, data: dict[str, Any]) -> None:
        agent = self.agent
        if agent is None or agent.ended or not agent.resume or agent.verified or e.epoch != agent.epoch:
            return
        agent.verified = True
        if agent.judged:
            return
        if data.get("result") == "stale":
            agent.judged = True
            changed = ", ".join(str(k) for k in data.get("changed") or [])
            self._count_for(agent, "stale_resumes", f"verify said stale ({changed})")
        elif data.get("result") == "fresh":
            agent.judged = True  # it checked before acting: what it changes afterwards is its own work

    def _judge_stale(self, agent: _Agent, e: Event) -> None:
        if agent.judged or not agent.resume:
            return
        agent.judged = True
        changed = sorted(k for k in agent.world_at_start.keys() & self.world.keys()
                         if agent.world_at_start[k] != self.world[k])
        if changed:
            self._count_for(agent, "stale_resumes", f"the world changed across the handoff: {', '.join(changed)}")

    def _content(self, e: Event, data: dict[str, Any]) -> bool:
        """Apply a step change / done growth; judge clean, redone and skipped. True on progress."""
        if e.kind in _DAEMON_KINDS or e.kind == EventKind.CREATED:
            return False
        changed = data.get("changed") or []
        step_changed = "from_step" in data and "step" in changed
        added: list[str] = []
        if "done" in changed and isinstance(data.get("done"), list):
            added = [str(item) for item in data["done"]]
        if not step_changed and not added and e.kind != EventKind.DONE:
            return False
        new_step = str(data.get("step", self.step)) if step_changed else self.step
        back = step_changed and (new_step in self.done or self.passed(new_step, self.reach))
        was_done = new_step in self.done
        new_items = [item for item in dict.fromkeys(added) if item not in self.done]
        self.done.update(new_items)
        for item in new_items:
            self.visit(item)
        agent = self.agent
        if agent is not None and not agent.ended and agent.resume and e.epoch == agent.epoch \
                and not agent.clean_judged:
            agent.clean_judged = True
            forward = (step_changed and not back) or (not step_changed and bool(new_items)) or (
                not step_changed and not added and e.kind == EventKind.DONE)
            if forward and agent.counted:
                self.counts["clean_resumes"] += 1
        if step_changed:
            if back and self.resumed:
                where = "recorded done" if was_done else "passed in the plan"
                self.count("redone_steps", e.ts, e.epoch, f"back to {new_step!r}, already {where}")
            j = self.plan_pos.get(new_step, -1)
            for step in self.plan[self.skip_from:max(j, self.skip_from)]:
                if step not in self.done and step not in self.ever_current and step not in self.skipped:
                    self.skipped.add(step)
                    self.count("skipped_steps", e.ts, e.epoch, f"jumped past plan step {step!r} to {new_step!r}")
            self.skip_from = max(self.skip_from, j)
            self.step = new_step
            self.ever_current.add(new_step)
            self.visit(new_step)
        return True

    def finish(self, baton: Baton | None, now: datetime) -> None:
        if self.agent is not None and not self.agent.ended and baton is not None \
                and baton.meta.status in (Status.DONE, Status.FAILED):
            self.agent.ended = True  # finished without an end event: nothing to judge
        if self.blocked and baton is not None and baton.meta.status is not Status.BLOCKED:
            self.count("bypassed_blocks", now, baton.meta.epoch,
                       f"the baton is {baton.meta.status.value} but no unblock was recorded (a hand edit)")


def _replay(events: Iterable[Event], baton: Baton | None, since: datetime | None, now: datetime) -> _Replay:
    replay = _Replay(plan=list(baton.plan) if baton is not None else [], since=since)
    for e in events:
        replay.feed(e)
    replay.finish(baton, now)
    return replay


def _metrics(replay: _Replay, baton: Baton | None) -> dict[str, Any]:
    metrics: dict[str, Any] = dict(replay.counts)
    metrics["mean_time_to_resume_s"] = round(sum(replay.ttr) / len(replay.ttr), 3) if replay.ttr else None
    duration = None
    if baton is not None and baton.meta.status in (Status.DONE, Status.FAILED):
        start = replay.created_at or baton.meta.created_at
        end = replay.finished_at or baton.meta.updated_at
        if start is not None and end is not None and replay.within(end):
            duration = round(max(0.0, (end - start).total_seconds()), 3)
    metrics["duration_s"] = duration
    return metrics


def task_metrics(
    events: Iterable[Event], baton: Baton | None, *, since: datetime | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The metrics of one task (keys :data:`METRIC_KEYS`) from its events in ledger order."""
    return _metrics(_replay(events, baton, since, now or utcnow()), baton)


@dataclass
class TaskReport:
    """One task's line in the report."""

    id: str
    status: str
    step: str
    metrics: dict[str, Any]
    score: int
    incidents: list[dict[str, Any]] = field(default_factory=list)
    seams: dict[str, Any] = field(default_factory=dict)
    """Seams inside sessions and run cost (:mod:`heartbeat.reports.seams`)."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "step": self.step, "score": self.score,
                "metrics": dict(self.metrics), "incidents": list(self.incidents), "seams": dict(self.seams)}


@dataclass
class Report:
    """The handoff report: tasks worst first, and totals."""

    tasks: list[TaskReport]
    totals: dict[str, Any]
    since: datetime | None = None
    generated_at: datetime | None = None
    seams: dict[str, Any] = field(default_factory=dict)
    """The tasks' seams summed (:func:`heartbeat.reports.seams.seam_totals`)."""
    unreadable_rows: int = 0
    """Ledger rows skipped because they cannot be read (a hand edit, a bit flip)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "generated_at": self.generated_at.isoformat() if self.generated_at else None,
            "unreadable_ledger_rows": self.unreadable_rows,
            "since": self.since.isoformat() if self.since else None,
            "tasks": [t.to_json() for t in self.tasks],
            "totals": dict(self.totals),
            "seams": dict(self.seams),
            "score_weights": dict(SCORE_WEIGHTS),
        }

    def render_text(self) -> str:
        """A table an operator reads in ten seconds: worst tasks first, zeros as dots."""
        window = f" since {self.since.isoformat(timespec='seconds')}" if self.since else ""
        skipped = (f"\nledger: {self.unreadable_rows} unreadable row(s) skipped; the figures leave them out"
                   if self.unreadable_rows else "")
        if not self.tasks:
            return f"no handoffs to report{window}{skipped}"
        cols = (("STARTS", "dispatches"), ("RESUMES", "resumes"), ("CLEAN", "clean_resumes"),
                ("REDONE", "redone_steps"), ("SKIPPED", "skipped_steps"), ("BYPASS", "bypassed_blocks"),
                ("STALE", "stale_resumes"), ("IDLE", "idle_resumes"), ("SPIN", "spinning"), ("ESC", "escalations"),
                ("GUAR", "guarantee_failures"), ("UNNOTED", "unnoted_calls"), ("BLKWORK", "done_while_blocked"))
        header = ("TASK", "STATUS", "SCORE", *(c for c, _ in cols), "TTR", "DURATION")
        rows: list[tuple[str, ...]] = [header]

        def num(value: Any) -> str:
            return "." if not value else str(value)

        def secs(value: Any) -> str:
            return "-" if value is None else format_duration(float(value))

        for t in self.tasks:
            m = t.metrics
            rows.append((t.id, t.status, num(t.score), *(num(m[k]) for _, k in cols),
                         secs(m["mean_time_to_resume_s"]), secs(m["duration_s"])))
        tot = self.totals
        rows.append((f"TOTAL ({len(self.tasks)})", "", num(sum(t.score for t in self.tasks)),
                     *(num(tot[k]) for _, k in cols), secs(tot["mean_time_to_resume_s"]), secs(tot["duration_s"])))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [f"handoff report{window}: {len(self.tasks)} task(s), worst first"]
        for i, r in enumerate(rows):
            if i == len(rows) - 1:
                lines.append("  ".join("-" * w for w in widths))
            lines.append("  ".join(cell.ljust(widths[j]) if j < 2 else cell.rjust(widths[j])
                                   for j, cell in enumerate(r)).rstrip())
        worst = [t for t in self.tasks if t.incidents][:3]
        if worst:
            lines.append("")
            for t in worst:
                inc = t.incidents[-1]
                more = f" (+{len(t.incidents) - 1} more: heartbeat report --json)" if len(t.incidents) > 1 else ""
                lines.append(f"{t.id}: {inc['metric']}: {inc['detail']}{more}")
        lines.append("")
        lines.append("SCORE = 5 x (bypass + esc + blkwork) + 3 x (stale + redone + skipped) + 2 x (idle + spin + guar) "
                     "+ 1 x (unclean resumes + unnoted); UNNOTED = calls after the last note at a seam; "
                     "BLKWORK = done while blocked; TTR = mean time to resume")
        lines += render_seams([(t.id, t.seams) for t in self.tasks if t.seams], self.seams)
        return "\n".join(lines) + skipped


def task_incidents(
    events: Iterable[Event], baton: Baton | None, *, since: datetime | None = None, now: datetime | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]], list[float]]:
    """One task's metrics, incidents and times to resume: all that the report takes from it
    (gc folds a task's rows only when this stays the same)."""
    replay = _replay(events, baton, since, now or utcnow())
    return _metrics(replay, baton), replay.incidents, replay.ttr


def _add_archived(store: Store, by_task: dict[str, list[Event]], batons: dict[str, Baton | None],
                  statuses: dict[str, str]) -> None:
    """Tasks gc archived count as before: their archived events (then any live ones) and their
    archived baton; gc's own ``archived``/``compacted`` rows are bookkeeping, not history."""
    from heartbeat.store.archive import RETENTION_KINDS, read_archived

    for task_id, events in list(by_task.items()):
        if any(e.kind in RETENTION_KINDS for e in events):
            by_task[task_id] = [e for e in events if e.kind not in RETENTION_KINDS]
    for task_id, (baton, events) in read_archived(store).items():
        by_task[task_id] = [e for e in events if e.kind not in RETENTION_KINDS] + by_task.get(task_id, [])
        if task_id not in batons:
            batons[task_id] = baton
            statuses[task_id] = baton.meta.status.value if baton else "archived"


def build_report(store: Store, *, since: datetime | None = None, now: datetime | None = None) -> Report:
    """Replay the ledger (and read the current batons) into per-task metrics and totals."""
    now = now or utcnow()
    by_task: dict[str, list[Event]] = {}
    for e in store.ledger.events():
        by_task.setdefault(e.task, []).append(e)
    batons: dict[str, Baton | None] = {}
    statuses: dict[str, str] = {}
    for entry in store.scan():
        batons[entry.id] = entry.baton
        statuses[entry.id] = entry.baton.meta.status.value if entry.baton else Status.INVALID.value
    _add_archived(store, by_task, batons, statuses)
    tasks: list[TaskReport] = []
    ttr_all: list[float] = []
    for task_id in sorted(set(by_task) | set(batons)):
        baton = batons.get(task_id)
        replay = _replay(by_task.get(task_id, []), baton, since, now)
        if since is not None and not (replay.active_in_window or replay.incidents):
            continue
        ttr_all.extend(replay.ttr)
        metrics = _metrics(replay, baton)
        status = statuses.get(task_id, "gone")
        tasks.append(TaskReport(task_id, status, baton.step if baton else "", metrics, failure_score(metrics),
                                replay.incidents, seam_metrics(by_task.get(task_id, []), since=since)))
    tasks.sort(key=lambda t: (-t.score, t.id))
    totals: dict[str, Any] = {k: sum(int(t.metrics[k]) for t in tasks) for k in _COUNT_KEYS}
    totals["mean_time_to_resume_s"] = round(sum(ttr_all) / len(ttr_all), 3) if ttr_all else None
    durations = [t.metrics["duration_s"] for t in tasks if t.metrics["duration_s"] is not None]
    totals["duration_s"] = round(sum(durations), 3) if durations else None
    return Report(tasks, totals, since=since, generated_at=now, seams=seam_totals(t.seams for t in tasks),
                  unreadable_rows=len(getattr(store.ledger, "unreadable", {})))
