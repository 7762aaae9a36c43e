"""The brief: what the next instance of an agent reads first, rendered from a baton.

Sections, in this order (DESIGN.md, "The brief"):

1. the intent, in one sentence;
2. the constraints, loudly, then what the task's downstreams need of its package (declared,
   learned or pinned: ``done`` is refused until each part is filled);
3. where things stand: task, status, step, next step, block and gate, attempt N of M
   and how the previous attempt ended (so a retry knows it is a retry);
4. the minimum context: done (the last ten), plan, decisions, rejected alternatives, unknowns;
5. pointers: each key file, marked when it changed since the baton was written, and
   the longer handoff document;
6. how to keep the baton (the commands), for an agent that has never seen heartbeat.

A brief fits a budget of tokens, estimated as UTF-8 bytes / 4 (no tokenizer: the
estimate errs on the generous side for English, and is the same on every machine).
When it does not fit, units are cut from the end: whole list items, then whole
sections, never the intent or the constraints, and the brief says what was left out.
A missing intent or missing constraints are warned about, in the brief and by the
CLI on stderr: those are the handoffs that fail silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from heartbeat.hotpath.trail import Unnoted
from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Status
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.timeparse import format_duration, utcnow
from heartbeat.system.world import world_changes

__all__ = ["RECENT_DONE", "Brief", "render_brief", "estimate_tokens", "note_time", "unnoted_for"]

_OMITTED_PREFIX = "_Left out to fit"
_NOTE_KINDS = (EventKind.UPDATED, EventKind.DONE, EventKind.FAILED, EventKind.BLOCKED, EventKind.SNOOZED,
               EventKind.CREATED)

RECENT_DONE = 10
"""Done items the brief lists, the most recent; earlier ones are one line (the plan marks them too).

A task three days in has hundreds; listing them all would push the decisions, the
rejected alternatives and the pointers out of the budget, and those matter more."""


def estimate_tokens(text: str) -> int:
    """Tokens a text costs, estimated as UTF-8 bytes / 4, rounded up."""
    return (len(text.encode("utf-8")) + 3) // 4


@dataclass
class Brief:
    """A rendered brief: markdown ``text`` within ``budget``, and what was warned about or cut."""

    task_id: str
    text: str
    warnings: list[str] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    tokens: int = 0
    budget: int = defaults.BRIEF_BUDGET
    changed: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The brief as data (what ``heartbeat brief --json`` prints)."""
        return {
            "id": self.task_id,
            "text": self.text,
            "tokens": self.tokens,
            "budget": self.budget,
            "warnings": list(self.warnings),
            "omitted": list(self.omitted),
            "changed": [dict(c) for c in self.changed],
        }


@dataclass
class _Unit:
    """One cuttable piece of the brief: a heading, a line, a list item."""

    text: str
    section: str
    label: str = ""  # what the omission note calls it ("done", "key files"); "" for headings
    required: bool = False


def render_brief(
    baton: Baton,
    *,
    budget: int = defaults.BRIEF_BUDGET,
    max_attempts: int | None = None,
    now: datetime | None = None,
    epoch: int | None = None,
    upstream: Sequence[Mapping[str, Any]] = (),
    essentials_first: bool = False,
    brief_file: str = "",
    unnoted: Sequence[str] = (),
    needs: Sequence[str] = (),
) -> Brief:
    """Render the brief for ``baton`` within ``budget`` tokens.

    ``essentials_first`` (a hook's context, which the agent CLI caps): the current and next
    step and the block are never cut, the note-keeping commands come right after them and are
    never cut either, and what is cut is left to ``heartbeat brief ID`` (and ``brief_file``,
    when there is one) by name.

    ``max_attempts`` is the policy's bound (shown as "attempt N of M"); ``epoch`` is the
    caller's epoch, warned about when it has been superseded. The baton is expected as
    the dispatch wrote it: ``meta.attempt`` already counts the dispatch being briefed.
    Key files are fingerprinted afresh (this reads the workdir) and compared with
    ``meta.world``.

    ``upstream`` holds the packages of the task's upstreams (``after``), newest first
    (:func:`heartbeat.tasks.handoff.load_packages`). Their constraints join the task's own,
    each marked ``(inherited from ID)``, and are never cut; the packages follow the
    constraints, newest first, so the budget keeps them before the task's own context.

    ``needs`` holds the lines of what this task's downstreams need of its package
    (:func:`heartbeat.tasks.needs.needs_lines`): they follow the constraints and are never cut,
    since ``done`` is refused while one is empty.

    ``unnoted`` holds the lines of what the last run did since its last note
    (:meth:`heartbeat.hotpath.trail.Unnoted.lines`): they follow where things stand and are never cut,
    so a successor does not repeat an effect no file shows.
    """
    now = now or utcnow()
    budget = max(1, int(budget))
    meta = baton.meta
    task_id = meta.id
    warnings: list[str] = []
    intent = _one_line(baton.intent)
    if not intent:
        warnings.append(
            f"no intent: the next agent cannot tell why this task exists; "
            f"set it with `heartbeat set {task_id} intent=\"...\"`"
        )
    constraints = [_one_line(c) for c in baton.constraints if c.strip()]
    inherited = _inherited(baton, upstream)
    waiting = [u for u in baton.after if u not in {str(p.get("upstream")) for p in upstream}]
    if waiting:
        warnings.append(f"no package yet from upstream {', '.join(waiting)}: it has not finished")
    if not constraints and not inherited:
        warnings.append(
            f"no constraints recorded: if there is anything the next agent must not do, "
            f"add it with `heartbeat add {task_id} constraints \"...\"`"
        )
    if epoch is not None and epoch != meta.epoch:
        warnings.append(
            f"your epoch {epoch} is not the task's epoch {meta.epoch}: another agent holds this task now; "
            "your writes will be refused"
        )
    changed = world_changes(baton)
    if changed:
        keys = ", ".join(c["key"] for c in changed)
        warnings.append(
            f"the world changed since the baton was written ({keys}): run `heartbeat verify {task_id}` "
            "before doing anything you cannot undo"
        )

    units: list[_Unit] = []

    def add(text: str, section: str, label: str = "", required: bool = False) -> None:
        units.append(_Unit(text, section, label, required))

    add(f"# Brief: {task_id} - {_one_line(baton.task)}\n", "header", required=True)
    if warnings:
        add("\n".join(f"> **WARNING:** {w}" for w in warnings) + "\n", "header", required=True)

    add("\n## Intent\n", "intent", required=True)
    add((intent or "_(none recorded)_") + "\n", "intent", required=True)

    add("\n## Constraints - DO NOT BREAK THESE\n", "constraints", required=True)
    if constraints or inherited:
        guarded = _guard_notes(baton)
        for c in constraints:
            add(f"- **{c}**{guarded.get(c, '')}\n", "constraints", required=True)
        for text, origin in inherited:
            add(f"- **{text}** _(inherited from `{origin}`)_\n", "constraints", required=True)
    else:
        add("_(none recorded)_\n", "constraints", required=True)

    if needs:
        add("\n## What your downstreams need - `done` is refused until each is filled\n", "needs", required=True)
        for line in needs:
            add(_one_line(line) + "\n", "needs", required=True)

    for package in upstream:
        for text, label in _package_lines(package):
            add(text, "upstream", label)

    add("\n## Where things stand\n", "state", required=essentials_first)
    for line in _state_lines(baton, max_attempts, now, epoch):
        essential = essentials_first and line.startswith(_ESSENTIAL_STATE)
        add(line + "\n", "state", "where things stand", required=essential)
    if unnoted:
        add("\n## Since the last note, the last run did\n", "unnoted", required=True)
        add("Not in the note: each may have had its effect already (a file, an API call, a message, a payment). "
            "Check before repeating any, above all one whose outcome is unknown; then note it.\n",
            "unnoted", required=True)
        for line in unnoted:
            add(line + "\n", "unnoted", required=True)
    exchange = _question_lines(baton)
    if exchange:
        add("\n## Questions you asked across the seam\n", "questions", required=True)
        for line in exchange:
            add(line + "\n", "questions", required=True)
    if essentials_first:
        add("\n## Keeping the baton\n", "howto", required=True)
        for line in _howto_lines(task_id):
            add(line + "\n", "howto", required=True)

    earlier = max(0, len(baton.done) - RECENT_DONE)
    context = (
        ("done", "Done" + (f" (the last {RECENT_DONE})" if earlier else ""), baton.done[earlier:]),
        ("plan", "Plan", _plan_items(baton)),
        ("decisions", "Decisions", baton.decisions),
        ("rejected", "Rejected alternatives (do not retry these)", baton.rejected),
        ("unknowns", "Unknowns (be wary)", baton.unknowns),
    )
    if any(items for _, _, items in context):
        add("\n## Context\n", "context")
        for label, title, items in context:
            if not items:
                continue
            add(f"\n{title}:\n", "context")
            if label == "done" and earlier:
                add(f"- _({earlier} earlier step(s) done: `heartbeat show {task_id}`)_\n", "context", label)
            for item in items:
                add(f"- {_one_line(item)}\n", "context", label)

    by_key = {c["key"]: c for c in changed}
    pointers: list[tuple[str, str]] = []
    if baton.workdir:
        pointers.append((f"- Workdir: `{baton.workdir}`\n", "workdir"))
    for key_file in baton.key_files:
        mark = ""
        if key_file in by_key:
            mark = f" - **CHANGED since the baton was written: {by_key[key_file]['change']}**"
        elif key_file not in meta.world and meta.world:
            mark = " - (not fingerprinted)"
        pointers.append((f"- `{key_file}`{mark}\n", "key files"))
    head = by_key.get(":git-head")
    if head:
        pointers.append((f"- git HEAD - **CHANGED since the baton was written: {head['change']}**\n", "git head"))
    if baton.handoff:
        pointers.append((f"- Longer handoff document: `{baton.handoff}` (read it next)\n", "handoff document"))
    if pointers:
        add("\n## Pointers\n", "pointers")
        for text, label in pointers:
            add(text, "pointers", label)

    if not essentials_first:
        add("\n## Keeping the baton\n", "howto")
        for line in _howto_lines(task_id):
            add(line + "\n", "howto", "how to keep the baton")

    brief = _fit(task_id, units, budget, warnings, changed, brief_file=brief_file)
    if earlier:
        brief.omitted.insert(0, f"done ({earlier} earlier items, summarized)")
    return brief


def note_time(events: Sequence[Event]) -> datetime | None:
    """When the note was last written by anyone but the daemon (``events``: the task's ledger, oldest
    first): a content write or a status verb. The trail's calls after it are the unnoted ones."""
    for e in reversed(events):
        if e.kind in _NOTE_KINDS and e.actor != "daemon" and (e.kind != EventKind.UPDATED or e.data.get("changed")):
            return e.ts
    return None


def unnoted_for(state_dir: str, store: Any, baton: Baton, *, epoch: int | None = None) -> Unnoted | None:
    """What the task's newest run (of ``epoch``, default the baton's, else the one before it) did since
    its note was last written, from its trail in the local ``state_dir`` (:mod:`heartbeat.hotpath.trail`) and
    the ledger's last note write. None when there is nothing unnoted, or no trail can be read."""
    from heartbeat.hotpath.trail import unnoted

    events = store.ledger.events(baton.id)
    note_at = note_time(events)
    epoch = baton.meta.epoch if epoch is None else epoch
    found = unnoted(state_dir, baton.id, epoch, note_at) if state_dir else None
    return found if found is not None else _unnoted_in_ledger(events, epoch, note_at)


def _unnoted_in_ledger(events: Sequence[Event], epoch: int, note_at: datetime | None) -> Unnoted | None:
    """What the ``exited`` event of the run of ``epoch`` (or the one before) kept of its trail: the
    unnoted calls as the daemon that saw the run end copied them, for a reader on another host of
    a shared store (the trail file stays on the host the agent ran on)."""
    from heartbeat.hotpath.trail import Call

    for e in reversed(events):
        kept = e.data.get("unnoted") if e.kind == EventKind.EXITED else None
        if not isinstance(kept, dict) or e.epoch not in (epoch, epoch - 1) or (note_at is not None and e.ts < note_at):
            continue
        calls = []
        for i, c in enumerate(kept.get("last") or []):
            if not isinstance(c, dict):
                continue
            try:
                started = datetime.fromisoformat(str(c.get("started", ""))).timestamp()
            except ValueError:
                started = e.ts.timestamp()
            outcome = c.get("outcome")
            calls.append(Call(key=str(i), tool=str(c.get("tool", "?"))[:80], what=str(c.get("what", ""))[:400],
                              started=started, ended=None if outcome == "unknown" else started,
                              ok=None if outcome == "unknown" else outcome == "ok"))
        total = kept.get("calls")
        cut = max(0, total - len(calls)) if isinstance(total, int) else 0
        return Unnoted(e.epoch, tuple(calls), cut) if calls else None
    return None


def _inherited(baton: Baton, upstream: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Upstream constraints not already the task's own, once each, with the task each came from."""
    from heartbeat.tasks.handoff import inherited_constraints

    own = {_one_line(c) for c in baton.constraints}
    out = []
    for item in inherited_constraints(upstream):
        text = _one_line(item["text"])
        if text and text not in own:
            own.add(text)
            out.append((text, item["from"] or "?"))
    return out


def _package_lines(package: Mapping[str, Any]) -> list[tuple[str, str]]:
    """One upstream's package as brief units: (text, omission label); "" labels are headings."""
    uid = str(package.get("upstream", "?"))
    label = f"upstream {uid}"
    done_at = str(package.get("done_at", ""))[:19]
    lines: list[tuple[str, str]] = [(f"\n## Upstream handoff: {uid} (done {done_at})\n", "")]
    lines.append((f"- Task: {_one_line(str(package.get('task', '')))}\n", label))
    intent = _one_line(str(package.get("intent") or ""))
    lines.append((f"- Intent: {intent or '_(none recorded)_'}\n", label))
    if package.get("note"):
        lines.append((f"- Finished with: {_one_line(str(package['note']))}\n", label))
    missing = [m for m in package.get("missing") or [] if isinstance(m, str)]
    if missing:
        lines.append((f"- _Missing from this package (not recorded by {uid}): {', '.join(missing)}_\n", label))
    guarantees = [g for g in package.get("guarantees") or [] if isinstance(g, dict)]
    if guarantees:
        lines.append((f"\nGuarantees {uid} made (`heartbeat verify` re-checks them):\n", ""))
        for g in guarantees:
            check = f" [check: {g['check']}]" if g.get("check") else " [unchecked]"
            lines.append((f"- {_one_line(str(g.get('text', '')))}{check}\n", f"{label} guarantees"))
    for key, title in (("decisions", "Decisions"), ("rejected", "Rejected alternatives (do not retry these)"),
                       ("unknowns", "Unknowns (be wary)")):
        items = [i for i in package.get(key) or [] if isinstance(i, str)]
        if items:
            lines.append((f"\n{title} of {uid}:\n", ""))
            lines.extend((f"- {_one_line(i)}\n", f"{label} {key}") for i in items)
    if package.get("handoff"):
        lines.append((f"- Handoff document of {uid}: `{package['handoff']}` (read it)\n", label))
    key_files = package.get("key_files") or {}
    if isinstance(key_files, dict) and key_files:
        lines.append((f"\nKey files of {uid} (in `{package.get('workdir', '')}`, fingerprinted when it finished):\n",
                      ""))
        lines.extend((f"- `{k}`\n", f"{label} key files") for k in key_files)
    return lines


def _fit(task_id: str, units: list[_Unit], budget: int, warnings: list[str], changed: list[dict[str, str]],
         *, brief_file: str = "") -> Brief:
    """Keep the longest prefix of units that fits (required units always), and say what was cut."""
    full = "".join(u.text for u in units)
    if estimate_tokens(full) <= budget:
        return Brief(task_id, full, warnings, [], estimate_tokens(full), budget, changed)
    required = [u for u in units if u.required]
    optional = [u for u in units if not u.required]
    sizes = [len(u.text.encode("utf-8")) for u in optional]
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    base = sum(len(u.text.encode("utf-8")) for u in required)
    totals = _label_counts(optional)
    dropped_counts: dict[str, int] = {}
    # Cutting from the end: the longest prefix of the optional units that fits together
    # with the note saying what was cut after it.
    cut_at = 0
    for n in range(len(optional), -1, -1):
        if n < len(optional) and optional[n].label:
            label = optional[n].label
            dropped_counts[label] = dropped_counts.get(label, 0) + 1
        note = _omission_note(task_id, _labels(totals, dropped_counts), budget, brief_file)
        if (base + prefix[n] + len(note.encode("utf-8")) + 3) // 4 <= budget:
            cut_at = n
            break
    while cut_at > 0 and not optional[cut_at - 1].label:
        cut_at -= 1  # a heading whose items were all cut goes too
    dropped = optional[cut_at:]
    omitted = _labels(totals, _label_counts(dropped))
    keep = {id(u) for u in optional[:cut_at]}
    kept = [u for u in units if u.required or id(u) in keep]
    text = "".join(u.text for u in kept) + _omission_note(task_id, omitted, budget, brief_file)
    tokens = estimate_tokens(text)
    if tokens > budget:
        warnings = [*warnings, f"the intent and constraints alone take {tokens} tokens, over the budget of {budget}"]
    return Brief(task_id, text, warnings, omitted, tokens, budget, changed)


def _label_counts(units: list[_Unit]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for u in units:
        if u.label:
            counts[u.label] = counts.get(u.label, 0) + 1
    return counts


def _labels(totals: dict[str, int], cut: dict[str, int]) -> list[str]:
    """``["done (3 of 5)", "key files"]``: what was cut, in the brief's order."""
    out = []
    for label, total in totals.items():
        n = cut.get(label, 0)
        if n:
            out.append(label if n == total else f"{label} ({n} of {total})")
    return out


def _omission_note(task_id: str, labels: list[str], budget: int, brief_file: str = "") -> str:
    if not labels:
        return ""
    where = (f"Read `{brief_file}` or run `heartbeat brief {task_id}` for the whole brief"
             if brief_file else f"Run `heartbeat brief {task_id}` for the whole brief")
    return (
        f"\n{_OMITTED_PREFIX} the budget of {budget} tokens: {', '.join(labels)}. "
        f"{where}, `heartbeat show {task_id}` for the whole baton._\n"
    )


def _guard_notes(baton: Baton) -> dict[str, str]:
    """What the rail enforces for each guarded constraint (by its one-line text), as the brief marks it."""
    notes: dict[str, list[str]] = {}
    for guard in baton.guards:
        held = [f"protects `{g}`" for g in guard.protect] + [f"forbids `{g}`" for g in guard.forbid]
        notes.setdefault(_one_line(guard.constraint), []).extend(held)
    return {text: f" _(enforced by heartbeat's rail: {', '.join(held)})_" for text, held in notes.items() if held}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _plan_items(baton: Baton) -> list[str]:
    done = set(baton.done)
    items = []
    for step in baton.plan:
        if step == baton.step:
            items.append(f"[current] {step}")
        elif step in done:
            items.append(f"[done] {step}")
        else:
            items.append(f"[ ] {step}")
    return items


def _next_step(baton: Baton) -> str:
    """The next step as recorded, unless it is the current one (``next_step`` left behind when the
    step moved on): then the plan's step after the current one, else "not recorded"."""
    recorded = _one_line(baton.next_step)
    if recorded and recorded != _one_line(baton.step):
        return recorded
    plan = [_one_line(p) for p in baton.plan]
    current = _one_line(baton.step)
    if current in plan:
        later = [p for p in plan[plan.index(current) + 1:] if p not in baton.done and p != current]
        if later:
            return f"{later[0]} _(from the plan)_"
    return "_(not recorded)_"


_ESSENTIAL_STATE = ("- Step (current):", "- Next step:", "- **Blocked on:")
"""The state lines a hook's context never cuts (``essentials_first``)."""


def _state_lines(baton: Baton, max_attempts: int | None, now: datetime, epoch: int | None) -> list[str]:
    meta = baton.meta
    lines = [f"- Task: {_one_line(baton.task)}", f"- Status: {meta.status.value}"]
    lines.append(f"- Step (current): **{_one_line(baton.step)}**")
    lines.append(f"- Next step: {_next_step(baton)}")
    if meta.status is Status.BLOCKED or baton.blocked_on:
        gate = meta.gate.spec() if meta.gate else "human"
        lines.append(f"- **Blocked on: {_one_line(baton.blocked_on) or '(unspecified)'}** (clears by gate: {gate}); "
                     "do not work around it")
    if meta.status is Status.SNOOZED and meta.snooze_until:
        lines.append(f"- Snoozed until {meta.snooze_until.isoformat()}")
    bound = f" of {max_attempts}" if max_attempts else ""
    if meta.attempt > 0:
        line = f"- Attempt {meta.attempt}{bound} since the last progress"
        if meta.attempt > 1:
            line += f" - **this is a retry**: {meta.attempt - 1} earlier attempt(s) on this step made no progress"
        lines.append(line)
    ended = _previous_end(baton)
    if ended:
        lines.append(f"- Previous attempt ended: {ended}")
    if meta.progress_at:
        lines.append(f"- Last progress: {format_duration(max(0.0, (now - meta.progress_at).total_seconds()))} ago")
    line = f"- Epoch: {meta.epoch} (write with HEARTBEAT_EPOCH={meta.epoch}), revision {meta.revision}"
    if meta.dispatches:
        line += f"; the daemon has dispatched this task {meta.dispatches} time(s)"
    lines.append(line)
    return lines


def _previous_end(baton: Baton) -> str:
    meta = baton.meta
    parts = []
    if meta.last_failure:
        parts.append(_one_line(meta.last_failure))
    if meta.last_exit is not None:
        parts.append(f"exit code {meta.last_exit}")
    return "; ".join(parts)


def _question_lines(baton: Baton) -> list[str]:
    """The task's exchanges: "you asked build (q1): ... - build answered: ...", and those still open."""
    lines = []
    for q in baton.questions:
        asked = f"- You asked {q.asked_of} ({q.id}): {_capped(q.text, baton.id)}"
        if q.open:
            whom = "a person (escalated: unanswered in time)" if q.escalated_at else q.asked_of
            lines.append(f"{asked} - not answered yet (waiting on {whom})")
            continue
        by = q.answered_by
        who = by.removeprefix("upstream:") if by.startswith("upstream:") else (
            by.removeprefix("person:") if by.startswith("person:") else "a person")
        lines.append(f"{asked} - {who} answered: {_capped(q.answer, baton.id)}")
    return lines


def _capped(text: str, task_id: str) -> str:
    text = _one_line(text)
    if len(text) <= defaults.QUESTION_BRIEF_CHARS:
        return text
    return text[:defaults.QUESTION_BRIEF_CHARS] + f"... (the rest: `heartbeat show {task_id}`)"


def _howto_lines(task_id: str) -> list[str]:
    return [
        f"- Before anything you cannot undo: `heartbeat verify {task_id}` (0 = the note still holds)",
        f"- When the step changes: `heartbeat set {task_id} step=\"...\" next_step=\"...\"`",
        f"- When a step is finished: `heartbeat add {task_id} done \"...\"`; "
        f"decisions/rejected/unknowns/constraints the same way",
        f"- Still working, same step: `heartbeat touch {task_id}`",
        f"- Stuck on something outside your control: `heartbeat block {task_id} --on \"...\"`",
        f"- A gap the handoff left (why a decision, what was rejected) that only the upstream or a person "
        f"knows: `heartbeat ask {task_id} \"...\"` (prints its id; you are held until it is answered, then the "
        f"answer is in your next brief: end your turn after asking)",
        f"- Ending your shift (context full, turn over): record the step and next_step, then exit 0; "
        f"to resume later instead: `heartbeat snooze {task_id} --for 30m`",
        f"- All finished: `heartbeat done {task_id} --note \"...\"`",
    ]
