"""The baton: one task's state note, its validation, and its TOML form.

A baton is read with :mod:`tomllib` and written with :mod:`tomli_w`. Reading validates
every field and fails with one line naming the file and the field; keys heartbeat does
not know are kept (``extra``) and written back unchanged, so a rewrite never loses what
a human or another tool put there. Comments are not kept: TOML libraries drop them.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from heartbeat.model import defaults
from heartbeat.model.errors import BadInput, InvalidBaton
from heartbeat.model.timeparse import parse_instant, to_utc

__all__ = [
    "host_labels",
    "json_safe",
    "ID_PATTERN",
    "SCALAR_FIELDS",
    "LIST_FIELDS",
    "Status",
    "GateKind",
    "OwnerKind",
    "Gate",
    "Guarantee",
    "Guard",
    "Question",
    "QuestionTo",
    "QID_PATTERN",
    "check_guard_glob",
    "HANDOFF_FIELDS",
    "PACKAGE_PARTS",
    "OnBroken",
    "Owner",
    "Meta",
    "Baton",
    "check_id",
    "decision_view",
    "load_toml",
    "parse_baton",
    "dump_baton",
]

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")

HOST_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A host id or a host label: ``daemon.host``, ``daemon.labels``, ``host_labels``, ``file:HOST:PATH``."""

SCALAR_FIELDS = ("task", "intent", "step", "next_step", "blocked_on", "workdir", "launcher", "handoff")
"""Top-level string fields, in the order a baton is written."""

LIST_FIELDS = ("key_files", "constraints", "done", "plan", "decisions", "rejected", "unknowns")
"""Top-level list-of-string fields."""

HANDOFF_FIELDS = ("after", "guarantees", "rederived", "on_broken", "needs")
"""Fields of the handoff between tasks (``after``, ``guarantees``, ``rederived``, ``on_broken``, ``needs``);
written after the list fields, and only when set, so a baton without them reads as before."""

PACKAGE_PARTS = ("intent", "constraints", "decisions", "rejected", "unknowns", "handoff", "key_files", "guarantees")
"""What a package holds; each one empty at the upstream's ``done`` is named as missing, and a downstream's
``needs`` names some of them (re-exported as :data:`heartbeat.tasks.handoff.PACKAGE_PARTS`)."""

REQUIRED_FIELDS = ("task", "step")

_MAX_INT = 2**53
"""Integers and numbers in ``[meta]`` beyond this are refused (no counter, pid or time gets near it)."""


class Status(StrEnum):
    """Where a task stands; ``invalid`` is never stored, only shown for unreadable batons."""

    ACTIVE = "active"
    BLOCKED = "blocked"
    SNOOZED = "snoozed"
    DONE = "done"
    FAILED = "failed"
    ESCALATED = "escalated"
    PAUSED = "paused"
    INVALID = "invalid"


STORED_STATUSES = frozenset(s for s in Status if s is not Status.INVALID)
FINISHED_STATUSES = frozenset({Status.DONE, Status.FAILED})


class OwnerKind(StrEnum):
    """``meta.owner.how``: who started the agent that owns a task (stored as these strings)."""

    DISPATCH = "dispatch"
    """The daemon dispatched it: the daemon supervises it (liveness, stop, exit)."""
    CLAIM = "claim"
    """It started itself (an interactive session) and claimed the task."""


class GateKind(StrEnum):
    """How a block clears."""

    HUMAN = "human"
    FILE = "file"
    TIME = "time"
    TASK = "task"
    CHECK = "check"
    AFTER = "after"  # every listed upstream task is done (the handoff gate: ``after:A,B``)
    QUESTION = "question"  # every listed question of the task is answered (``question:q1,q2``)


class OnBroken(StrEnum):
    """What a downstream's ``verify`` does when an upstream's guarantee is broken."""

    REOPEN = "reopen"  # the upstream goes back to active; the downstream waits for it
    ESCALATE = "escalate"  # the upstream is escalated to a human; the downstream waits
    FALLBACK = "fallback"  # ``fallback:LAUNCHER``: the upstream is reopened on another launcher


def parse_on_broken(text: str) -> tuple[OnBroken, str]:
    """``reopen``, ``escalate`` or ``fallback:LAUNCHER`` as (policy, launcher); BadInput otherwise."""
    kind, sep, launcher = text.partition(":")
    try:
        policy = OnBroken(kind)
    except ValueError:
        policy = None
    if policy is None or (policy is OnBroken.FALLBACK) != bool(sep) or (
            sep and not ID_PATTERN.fullmatch(launcher)):
        raise BadInput(f"bad on_broken {text[:60]!r}: use reopen, escalate or fallback:LAUNCHER", field="on_broken")
    return policy, launcher


def check_id(task_id: object) -> str:
    """Return ``task_id`` if it is a valid task id, else raise :class:`BadInput`."""
    if not isinstance(task_id, str) or not ID_PATTERN.fullmatch(task_id):
        shown = task_id if isinstance(task_id, str) else type(task_id).__name__
        raise BadInput(
            f"bad task id {str(shown)[:80]!r}: use 1-64 of a-z 0-9 . _ -, starting with a letter or digit"
        )
    return task_id


@dataclass(slots=True)
class Gate:
    """What lifts a block: a human, a file appearing, a time, another task done, a check."""

    kind: GateKind = GateKind.HUMAN
    target: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> Gate:
        """Parse the CLI form: ``human``, ``file:PATH``, ``time:ISO8601``, ``task:ID``, ``check:NAME``."""
        kind_text, sep, target = spec.partition(":")
        try:
            kind = GateKind(kind_text.strip())
        except ValueError:
            raise BadInput(
                f"bad gate {spec[:80]!r}: use human, file:PATH, time:ISO8601, task:ID, after:ID,ID, "
                "question:QID or check:NAME",
                field="gate",
            ) from None
        if kind is GateKind.HUMAN:
            if target:
                raise BadInput("the human gate takes no target", field="gate")
            return cls(kind)
        if not sep or not target:
            raise BadInput(f"gate {kind.value} needs a target: {kind.value}:...", field="gate")
        if "\0" in target:
            raise BadInput("gate target contains a NUL byte", field="gate")
        if kind is GateKind.TIME:
            target = parse_instant(target, field="gate").isoformat()
        elif kind is GateKind.TASK:
            check_id(target)
        elif kind is GateKind.AFTER:
            for upstream in target.split(","):
                check_id(upstream)
        elif kind is GateKind.QUESTION:
            for qid in target.split(","):
                if not QID_PATTERN.fullmatch(qid):
                    raise BadInput(f"bad question id {qid[:20]!r}: use q1, q2, ...", field="gate")
        elif kind is GateKind.FILE and not target.startswith("/"):
            host, _, path = target.partition(":")
            if not HOST_PATTERN.fullmatch(host) or not path.startswith("/"):
                raise BadInput("a file gate needs an absolute path (file:PATH or file:HOST:PATH)", field="gate")
        elif kind is GateKind.CHECK and ":" in target:
            host, _, name = target.partition(":")
            if not HOST_PATTERN.fullmatch(host) or not name:
                raise BadInput("a check gate names a check (check:NAME or check:HOST:NAME)", field="gate")
        return cls(kind, target)

    @property
    def host(self) -> str:
        """The host that evaluates a ``file:HOST:PATH`` or ``check:HOST:NAME`` gate ("" when none is named)."""
        if self.kind is GateKind.FILE and not self.target.startswith("/") and ":" in self.target:
            return self.target.partition(":")[0]
        if self.kind is GateKind.CHECK and ":" in self.target:
            return self.target.partition(":")[0]
        return ""

    @property
    def local(self) -> str:
        """The target without its host: the path of a file gate, the name of a check gate."""
        return self.target.partition(":")[2] if self.host else self.target

    def spec(self) -> str:
        """The CLI form of this gate."""
        return self.kind.value if self.kind is GateKind.HUMAN else f"{self.kind.value}:{self.target}"


@dataclass(slots=True)
class Guarantee:
    """What a task's producer promises its consumers: a sentence, and the ``[checks.NAME]`` that proves it."""

    text: str
    check: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text}
        if self.check:
            out["check"] = self.check
        out.update(self.extra)
        return out


class GlobKind(StrEnum):
    """What a guard glob matches: a path relative to the workdir, or a shell command."""

    PROTECT = "protect"
    FORBID = "forbid"
    IRREVERSIBLE = "irreversible"


def check_guard_glob(text: object, kind: GlobKind | str) -> str:
    """``text`` if it is a guard glob the rail can match, else :class:`BadInput` in one line.

    Refused: not text, empty, longer than ``defaults.MAX_GUARD_GLOB_CHARS``, a NUL or another
    control character, more than ``defaults.MAX_GUARD_GLOB_STARS`` stars, a glob of wildcards
    only (it would refuse every call), and for ``protect`` an absolute path or one that climbs
    out of the workdir with ``..``.
    """
    name = f"--{kind}" if kind != GlobKind.IRREVERSIBLE else "irreversible"
    if not isinstance(text, str):
        raise BadInput(f"a {kind} glob must be text, got {type(text).__name__}", field=name)
    if not text.strip():
        raise BadInput(f"a {kind} glob must not be empty", field=name)
    if len(text) > defaults.MAX_GUARD_GLOB_CHARS:
        raise BadInput(f"a {kind} glob is {len(text)} characters, over {defaults.MAX_GUARD_GLOB_CHARS}", field=name)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise BadInput(f"a {kind} glob holds a control character (NUL, newline, ...): {text[:40]!r}", field=name)
    if text.count("*") > defaults.MAX_GUARD_GLOB_STARS:
        raise BadInput(f"a {kind} glob holds {text.count('*')} stars, over {defaults.MAX_GUARD_GLOB_STARS}",
                       field=name)
    if not re.sub(r"[*?/\s.\[\]!]", "", text):
        raise BadInput(f"the {kind} glob {text[:40]!r} matches everything: name what it guards", field=name)
    if kind == GlobKind.PROTECT and (text.startswith(("/", "~")) or ".." in text.split("/")):
        raise BadInput(f"a protect glob is a path relative to the workdir, got {text[:60]!r}", field=name)
    return text


@dataclass(slots=True)
class Guard:
    """A constraint with teeth: its text, and what the rail refuses for it (``heartbeat add ID
    constraints TEXT --protect GLOB --forbid GLOB``)."""

    constraint: str
    protect: list[str] = field(default_factory=list)
    """Globs of paths relative to the workdir no Write/Edit or shell command may name."""
    forbid: list[str] = field(default_factory=list)
    """Globs of shell commands the rail refuses."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"constraint": self.constraint}
        if self.protect:
            out["protect"] = list(self.protect)
        if self.forbid:
            out["forbid"] = list(self.forbid)
        out.update(self.extra)
        return out


QID_PATTERN = re.compile(r"q[1-9][0-9]{0,5}")
"""A question's id within its task: ``q1``, ``q2``, ..."""


class QuestionTo(StrEnum):
    """Whom a question is addressed to (``questions[].to``)."""

    UPSTREAM = "upstream"  # the upstream task named in ``upstream``: its recorded session answers
    PERSON = "person"  # a person answers (``heartbeat answer``, the page, MCP)


@dataclass(slots=True)
class Question:
    """A question a task asked across the seam (``[[questions]]``), and its answer once given.

    Open while ``answered_at`` is None. ``upstream`` names the upstream task when ``to`` is
    ``upstream``; an escalated question (``escalated_at`` set) is re-addressed to a person and
    keeps the upstream it was first asked of."""

    id: str
    to: QuestionTo
    text: str
    asked_at: datetime
    upstream: str = ""
    epoch: int = 0
    """The asker's epoch when it asked."""
    sent_at: datetime | None = None
    """When the daemon started the upstream's answering run (None until then)."""
    answer: str = ""
    answered_by: str = ""
    """``upstream:ID`` (the upstream's resumed session or its agent), ``person`` or ``person:NAME``."""
    answered_at: datetime | None = None
    escalated_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.answered_at is None

    @property
    def asked_of(self) -> str:
        """Who it was asked of, as status shows it: the upstream's id, else "a person"."""
        return self.upstream or "a person"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "to": self.to.value, "upstream": self.upstream, "text": self.text,
                               "asked_at": self.asked_at, "epoch": self.epoch}
        if self.sent_at is not None:
            out["sent_at"] = self.sent_at
        out["answer"] = self.answer
        if self.answered_by:
            out["answered_by"] = self.answered_by
        if self.answered_at is not None:
            out["answered_at"] = self.answered_at
        if self.escalated_at is not None:
            out["escalated_at"] = self.escalated_at
        out.update(self.extra)
        return out


@dataclass(slots=True)
class Owner:
    """The agent holding a task: enough to tell whether it is still alive, and how it started."""

    pid: int | None = None
    create_time: float | None = None
    host: str = ""
    launcher: str = ""
    unit: str = ""
    session: str = ""
    how: str = ""  # "dispatch" (the daemon started it) or "claim" (it started itself)
    started_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Meta:
    """The part of a baton heartbeat manages; agents do not edit it."""

    schema: int = defaults.SCHEMA
    id: str = ""
    status: Status = Status.ACTIVE
    revision: int = 0
    epoch: int = 0
    attempt: int = 0
    dispatches: int = 0
    idle_resumes: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    touched_at: datetime | None = None
    progress_at: datetime | None = None
    dispatched_at: datetime | None = None
    blocked_at: datetime | None = None
    snooze_until: datetime | None = None
    ended_at: datetime | None = None
    last_failure: str = ""
    last_exit: int | None = None
    session: str = ""
    """The agent session of the current (or last) epoch, as the launcher's output reported it."""
    session_resumes: int = 0
    """How many dispatches in a row resumed ``session`` (``session = "resume"`` launchers)."""
    wait_until: datetime | None = None
    """A rate or usage limit holds the task until then: no dispatch before it (not a failure)."""
    wait_since: datetime | None = None
    """When the first of the rate-limited runs in a row ended (``max_limit_wait`` counts from here)."""
    wait_reason: str = ""
    """What the agent's CLI said about the limit, one line."""
    limit_hits: int = 0
    """Rate-limited runs in a row (the backoff when the CLI names no reset)."""
    launch_failures: int = 0
    """Launches in a row whose agent never ran (its program missing, not executable, no workdir):
    their backoff and escalation, apart from the agent's own ``attempt``."""
    cost_usd: float = 0.0
    """What the task's runs have cost so far, summed from their result lines (``max_cost_usd``)."""
    owner: Owner | None = None
    gate: Gate | None = None
    world: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Baton:
    """A task's state note. ``extra`` holds top-level keys heartbeat does not know."""

    task: str
    step: str
    intent: str = ""
    next_step: str = ""
    blocked_on: str = ""
    workdir: str = ""
    launcher: str = ""
    handoff: str = ""
    key_files: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    guarantees: list[Guarantee] = field(default_factory=list)
    rederived: list[str] = field(default_factory=list)
    on_broken: str = ""
    needs: list[str] = field(default_factory=list)
    """The package parts this task needs from each of its upstreams (``needs = [...]``, written only when set)."""
    guards: list[Guard] = field(default_factory=list)
    """The constraints with teeth (``[[guards]]``; written only when set, so older batons read as before)."""
    irreversible: list[str] = field(default_factory=list)
    """This task's irreversible command globs (replacing the launcher's and the config's), when set."""
    questions: list[Question] = field(default_factory=list)
    """The questions this task asked across the seam (``[[questions]]``; written only when any)."""
    meta: Meta = field(default_factory=Meta)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def status(self) -> Status:
        return self.meta.status

    def copy(self) -> Baton:
        """A deep-enough copy: lists and nested meta may be mutated without touching the original."""
        meta = replace(
            self.meta,
            owner=replace(self.meta.owner, extra=_deep(self.meta.owner.extra)) if self.meta.owner else None,
            gate=replace(self.meta.gate, extra=_deep(self.meta.gate.extra)) if self.meta.gate else None,
            world=dict(self.meta.world),
            extra=_deep(self.meta.extra),
        )
        lists = {name: list(getattr(self, name)) for name in (*LIST_FIELDS, "after", "rederived", "needs",
                                                      "irreversible")}
        guarantees = [replace(g, extra=_deep(g.extra)) for g in self.guarantees]
        guards = [replace(g, protect=list(g.protect), forbid=list(g.forbid), extra=_deep(g.extra))
                  for g in self.guards]
        questions = [replace(q, extra=_deep(q.extra)) for q in self.questions]
        return replace(self, meta=meta, extra=_deep(self.extra), guarantees=guarantees, guards=guards,
                       questions=questions, **lists)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """The TOML document as plain data (also what ``show --json`` prints, with times as text)."""
        doc: dict[str, Any] = {}
        for name in SCALAR_FIELDS:
            doc[name] = getattr(self, name)
        for name in LIST_FIELDS:
            doc[name] = list(getattr(self, name))
        if self.after:
            doc["after"] = list(self.after)
        if self.guarantees:
            doc["guarantees"] = [g.to_dict() for g in self.guarantees]
        if self.rederived:
            doc["rederived"] = list(self.rederived)
        if self.on_broken:
            doc["on_broken"] = self.on_broken
        if self.needs:
            doc["needs"] = list(self.needs)
        if self.guards:
            doc["guards"] = [g.to_dict() for g in self.guards]
        if self.irreversible:
            doc["irreversible"] = list(self.irreversible)
        if self.questions:
            doc["questions"] = [q.to_dict() for q in self.questions]
        for key, value in self.extra.items():
            doc[key] = value
        doc["meta"] = _meta_to_dict(self.meta)
        return doc


_NO_ITEMS = cast(list[str], ())
"""The lists a decision view leaves out: one empty tuple for all of them (appending to it raises)."""


def decision_view(baton: Baton) -> Baton:
    """What the daemon's decisions read of ``baton``, for the thousands it keeps between looks:
    ``meta``, ``step``, ``blocked_on``, ``workdir``, ``launcher``, ``after``, ``on_broken``, ``needs`` and
    ``questions`` (the daemon sends, escalates and shows them).

    The note's prose and lists (``task``, ``intent``, ``plan``, ``done``, ``constraints``, ...)
    are left out: the daemon renders a brief from a fresh read at dispatch, and every write
    re-reads the baton under its lock, so a view is only ever looked at, never written back
    (its left-out lists are one shared empty tuple: appending to one raises).
    """
    return Baton(task="", step=baton.step, blocked_on=baton.blocked_on, workdir=baton.workdir,
                 launcher=baton.launcher, after=baton.after, on_broken=baton.on_broken, needs=baton.needs,
                 meta=baton.meta, questions=baton.questions,
                 key_files=_NO_ITEMS, constraints=_NO_ITEMS, done=_NO_ITEMS, plan=_NO_ITEMS,
                 decisions=_NO_ITEMS, rejected=_NO_ITEMS, unknowns=_NO_ITEMS, rederived=_NO_ITEMS,
                 guarantees=cast(list[Guarantee], ()), extra=baton.extra if not baton.extra else {})


def _deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


_META_TIMES = ("created_at", "updated_at", "touched_at", "progress_at", "dispatched_at", "blocked_at", "snooze_until",
               "ended_at", "wait_until", "wait_since")
_META_INTS = ("schema", "revision", "epoch", "attempt", "dispatches", "idle_resumes")


def _meta_to_dict(meta: Meta) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": meta.schema,
        "id": meta.id,
        "status": meta.status.value,
        "revision": meta.revision,
        "epoch": meta.epoch,
        "attempt": meta.attempt,
        "dispatches": meta.dispatches,
        "idle_resumes": meta.idle_resumes,
    }
    for name in _META_TIMES:
        value = getattr(meta, name)
        if value is not None:
            out[name] = value
    if meta.last_failure:
        out["last_failure"] = meta.last_failure
    if meta.last_exit is not None:
        out["last_exit"] = meta.last_exit
    if meta.session:
        out["session"] = meta.session
    if meta.session_resumes:
        out["session_resumes"] = meta.session_resumes
    if meta.wait_reason:
        out["wait_reason"] = meta.wait_reason
    if meta.limit_hits:
        out["limit_hits"] = meta.limit_hits
    if meta.launch_failures:
        out["launch_failures"] = meta.launch_failures
    if meta.cost_usd:
        out["cost_usd"] = meta.cost_usd
    out.update(meta.extra)
    if meta.owner is not None:
        owner: dict[str, Any] = {}
        for f in fields(Owner):
            if f.name == "extra":
                continue
            value = getattr(meta.owner, f.name)
            if value is not None and value != "":
                owner[f.name] = value
        owner.update(meta.owner.extra)
        out["owner"] = owner
    if meta.gate is not None:
        out["gate"] = {"kind": meta.gate.kind.value, "target": meta.gate.target, **meta.gate.extra}
    if meta.world:
        out["world"] = dict(meta.world)
    return out


class _Reader:
    """Validates one parsed document, naming the file and field of the first problem."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, field_name: str, message: str) -> InvalidBaton:
        return InvalidBaton(message, path=self.path, field=field_name)

    def string(self, data: dict[str, Any], key: str, name: str, *, required: bool = False) -> str:
        if key not in data:
            if required:
                raise self.fail(name, "missing (required)")
            return ""
        value = data.pop(key)
        if not isinstance(value, str):
            raise self.fail(name, f"expected a string, got {_describe(value)}")
        if required and not value.strip():
            raise self.fail(name, "must not be empty")
        return value

    def strings(self, data: dict[str, Any], key: str, name: str) -> list[str]:
        if key not in data:
            return []
        value = data.pop(key)
        if not isinstance(value, list):
            raise self.fail(name, f"expected a list of strings, got {_describe(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(f"{name}[{i}]", f"expected a string, got {_describe(item)}")
        return list(value)

    def integer(self, data: dict[str, Any], key: str, name: str, default: int | None) -> int | None:
        if key not in data:
            return default
        value = data.pop(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"expected an integer, got {_describe(value)}")
        if abs(value) > _MAX_INT:  # the ledger stores 64-bit integers; counters never get near this
            raise self.fail(name, f"out of range, got {_describe(value)}")
        if value < 0 and key != "last_exit":
            raise self.fail(name, f"must not be negative, got {value}")
        return value

    def number(self, data: dict[str, Any], key: str, name: str) -> float | None:
        if key not in data:
            return None
        value = data.pop(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"expected a number, got {_describe(value)}")
        if abs(value) > _MAX_INT or not math.isfinite(value):  # inf, nan: no process started then
            raise self.fail(name, f"out of range, got {_describe(value)}")
        return float(value)

    def time(self, data: dict[str, Any], key: str, name: str) -> datetime | None:
        if key not in data:
            return None
        value = data.pop(key)
        try:
            if isinstance(value, datetime):
                return to_utc(value)
            if isinstance(value, str):
                return parse_instant(value)
        except BadInput as exc:
            if isinstance(value, datetime):
                raise self.fail(name, exc.message) from None
        raise self.fail(name, f"expected a date-time, got {_describe(value)}")

    def table(self, data: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
        if key not in data:
            return None
        value = data.pop(key)
        if not isinstance(value, dict):
            raise self.fail(name, f"expected a table, got {_describe(value)}")
        return dict(value)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f"a string {value[:40]!r}"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def baton_from_dict(doc: dict[str, Any], *, path: str, expected_id: str | None = None) -> Baton:
    """Validate a parsed baton document; ``expected_id`` is the id its file name gives."""
    r = _Reader(path)
    data = dict(doc)
    meta_doc = r.table(data, "meta", "meta") or {}
    meta = _meta_from_dict(r, meta_doc, expected_id)
    values: dict[str, Any] = {}
    for name in SCALAR_FIELDS:
        values[name] = r.string(data, name, name, required=name in REQUIRED_FIELDS)
    for name in LIST_FIELDS:
        values[name] = r.strings(data, name, name)
    values["after"] = r.strings(data, "after", "after")
    values["guarantees"] = _guarantees(r, data)
    values["rederived"] = r.strings(data, "rederived", "rederived")
    values["on_broken"] = r.string(data, "on_broken", "on_broken")
    values["needs"] = r.strings(data, "needs", "needs")
    values["guards"] = _guards(r, data)
    values["questions"] = _questions(r, data)
    values["irreversible"] = r.strings(data, "irreversible", "irreversible")
    if len(values["irreversible"]) > defaults.MAX_GUARD_GLOBS:
        raise r.fail("irreversible", f"{len(values['irreversible'])} globs, over {defaults.MAX_GUARD_GLOBS}")
    for i, glob in enumerate(values["irreversible"]):
        try:
            check_guard_glob(glob, GlobKind.IRREVERSIBLE)
        except BadInput as exc:
            raise r.fail(f"irreversible[{i}]", exc.message) from None
    baton = Baton(meta=meta, extra=dict(data), **values)  # a fresh dict: the popped one keeps its size
    for i, upstream in enumerate(baton.after):
        if not ID_PATTERN.fullmatch(upstream):
            raise r.fail(f"after[{i}]", f"bad task id {upstream[:64]!r}")
        if upstream == meta.id:
            raise r.fail(f"after[{i}]", "a task cannot come after itself")
        if upstream in baton.after[:i]:
            raise r.fail(f"after[{i}]", f"{upstream!r} is listed twice")
    for i, part in enumerate(baton.needs):
        if part not in PACKAGE_PARTS:
            raise r.fail(f"needs[{i}]", f"unknown part {part[:40]!r} (parts: {', '.join(PACKAGE_PARTS)})")
    if baton.on_broken:
        try:
            parse_on_broken(baton.on_broken)
        except BadInput as exc:
            raise r.fail("on_broken", exc.message) from None
    if baton.workdir and (not baton.workdir.startswith("/") or "\0" in baton.workdir):
        raise r.fail("workdir", "must be an absolute path")
    if baton.launcher and not ID_PATTERN.fullmatch(baton.launcher):
        raise r.fail("launcher", f"bad launcher name {baton.launcher[:40]!r}")
    for i, key_file in enumerate(baton.key_files):
        if not key_file or "\0" in key_file:
            raise r.fail(f"key_files[{i}]", "must be a non-empty path")
    if meta.status is Status.BLOCKED and meta.gate is None:
        meta.gate = Gate(GateKind.HUMAN)
    return baton


def _guarantees(r: _Reader, data: dict[str, Any]) -> list[Guarantee]:
    if "guarantees" not in data:
        return []
    value = data.pop("guarantees")
    if not isinstance(value, list):
        raise r.fail("guarantees", f"expected an array of tables {{ text, check }}, got {_describe(value)}")
    out = []
    for i, item in enumerate(value):
        name = f"guarantees[{i}]"
        if not isinstance(item, dict):
            raise r.fail(name, f"expected a table {{ text, check }}, got {_describe(item)}")
        item = dict(item)
        text = r.string(item, "text", f"{name}.text", required=True)
        check = r.string(item, "check", f"{name}.check")
        if check and not ID_PATTERN.fullmatch(check):
            raise r.fail(f"{name}.check", f"bad check name {check[:40]!r}")
        out.append(Guarantee(text, check, extra=dict(item)))
    return out


def _guards(r: _Reader, data: dict[str, Any]) -> list[Guard]:
    if "guards" not in data:
        return []
    value = data.pop("guards")
    if not isinstance(value, list):
        raise r.fail("guards", f"expected an array of tables {{ constraint, protect, forbid }}, got {_describe(value)}")
    if len(value) > defaults.MAX_GUARDS:
        raise r.fail("guards", f"{len(value)} guards, over {defaults.MAX_GUARDS}")
    out = []
    for i, item in enumerate(value):
        name = f"guards[{i}]"
        if not isinstance(item, dict):
            raise r.fail(name, f"expected a table {{ constraint, protect, forbid }}, got {_describe(item)}")
        item = dict(item)
        text = r.string(item, "constraint", f"{name}.constraint", required=True)
        globs = {kind: r.strings(item, kind, f"{name}.{kind}") for kind in (GlobKind.PROTECT, GlobKind.FORBID)}
        if sum(len(g) for g in globs.values()) > defaults.MAX_GUARD_GLOBS:
            raise r.fail(name, f"over {defaults.MAX_GUARD_GLOBS} globs")
        for kind, items in globs.items():
            for j, glob in enumerate(items):
                try:
                    check_guard_glob(glob, kind)
                except BadInput as exc:
                    raise r.fail(f"{name}.{kind}[{j}]", exc.message) from None
        out.append(Guard(text, globs[GlobKind.PROTECT], globs[GlobKind.FORBID], extra=dict(item)))
    return out


def _questions(r: _Reader, data: dict[str, Any]) -> list[Question]:
    if "questions" not in data:
        return []
    value = data.pop("questions")
    if not isinstance(value, list):
        raise r.fail("questions", f"expected an array of tables {{ id, to, text, ... }}, got {_describe(value)}")
    if len(value) > defaults.MAX_QUESTIONS:
        raise r.fail("questions", f"{len(value)} questions, over {defaults.MAX_QUESTIONS}")
    out: list[Question] = []
    for i, item in enumerate(value):
        name = f"questions[{i}]"
        if not isinstance(item, dict):
            raise r.fail(name, f"expected a table {{ id, to, text, ... }}, got {_describe(item)}")
        item = dict(item)
        qid = r.string(item, "id", f"{name}.id", required=True)
        if not QID_PATTERN.fullmatch(qid):
            raise r.fail(f"{name}.id", f"bad question id {qid[:20]!r}: use q1, q2, ...")
        if any(q.id == qid for q in out):
            raise r.fail(f"{name}.id", f"{qid!r} is listed twice")
        to_text = r.string(item, "to", f"{name}.to", required=True)
        try:
            to = QuestionTo(to_text)
        except ValueError:
            raise r.fail(f"{name}.to", f"expected upstream or person, got {to_text[:40]!r}") from None
        text = r.string(item, "text", f"{name}.text", required=True)
        asked_at = r.time(item, "asked_at", f"{name}.asked_at")
        if asked_at is None:
            raise r.fail(f"{name}.asked_at", "missing (required)")
        question = Question(
            id=qid, to=to, text=text, asked_at=asked_at,
            upstream=r.string(item, "upstream", f"{name}.upstream"),
            epoch=r.integer(item, "epoch", f"{name}.epoch", 0) or 0,
            sent_at=r.time(item, "sent_at", f"{name}.sent_at"),
            answer=r.string(item, "answer", f"{name}.answer"),
            answered_by=r.string(item, "answered_by", f"{name}.answered_by"),
            answered_at=r.time(item, "answered_at", f"{name}.answered_at"),
            escalated_at=r.time(item, "escalated_at", f"{name}.escalated_at"),
        )
        if question.upstream and not ID_PATTERN.fullmatch(question.upstream):
            raise r.fail(f"{name}.upstream", f"bad task id {question.upstream[:64]!r}")
        if to is QuestionTo.UPSTREAM and not question.upstream:
            raise r.fail(f"{name}.upstream", "a question to an upstream names it")
        if to is QuestionTo.PERSON and question.upstream and question.escalated_at is None:
            raise r.fail(f"{name}.upstream", "a question to a person names no upstream (unless escalated)")
        if (question.answered_at is None) != (not question.answer):
            raise r.fail(f"{name}.answer", "an answer and its answered_at come together")
        question.extra = dict(item)
        out.append(question)
    return out


def _meta_from_dict(r: _Reader, doc: dict[str, Any], expected_id: str | None) -> Meta:
    schema = r.integer(doc, "schema", "meta.schema", defaults.SCHEMA)
    assert schema is not None
    if schema > defaults.SCHEMA:
        raise r.fail(
            "meta.schema",
            f"written by a newer heartbeat (schema {schema}; this one reads up to {defaults.SCHEMA}): upgrade heartbeat",
        )
    if schema < 1:
        raise r.fail("meta.schema", f"unknown schema {schema}")
    task_id = r.string(doc, "id", "meta.id") or (expected_id or "")
    if expected_id is not None and task_id != expected_id:
        raise r.fail("meta.id", f"is {task_id[:64]!r} but the file is named for {expected_id!r}")
    if task_id and not ID_PATTERN.fullmatch(task_id):
        raise r.fail("meta.id", f"bad task id {task_id[:64]!r}")
    status_text = r.string(doc, "status", "meta.status") or Status.ACTIVE.value
    try:
        status = Status(status_text)
    except ValueError:
        status = Status.INVALID
    if status not in STORED_STATUSES:
        raise r.fail("meta.status", f"unknown status {status_text[:40]!r}")
    meta = Meta(schema=schema, id=task_id, status=status)
    for name in _META_INTS[1:]:
        value = r.integer(doc, name, f"meta.{name}", 0)
        setattr(meta, name, value)
    for name in _META_TIMES:
        setattr(meta, name, r.time(doc, name, f"meta.{name}"))
    meta.last_failure = r.string(doc, "last_failure", "meta.last_failure")
    meta.last_exit = r.integer(doc, "last_exit", "meta.last_exit", None)
    meta.session = r.string(doc, "session", "meta.session")
    meta.session_resumes = r.integer(doc, "session_resumes", "meta.session_resumes", 0) or 0
    meta.wait_reason = r.string(doc, "wait_reason", "meta.wait_reason")
    meta.limit_hits = r.integer(doc, "limit_hits", "meta.limit_hits", 0) or 0
    meta.launch_failures = r.integer(doc, "launch_failures", "meta.launch_failures", 0) or 0
    meta.cost_usd = r.number(doc, "cost_usd", "meta.cost_usd") or 0.0
    if meta.cost_usd < 0:
        raise r.fail("meta.cost_usd", f"must not be negative, got {meta.cost_usd}")
    owner_doc = r.table(doc, "owner", "meta.owner")
    if owner_doc is not None:
        meta.owner = Owner(
            pid=r.integer(owner_doc, "pid", "meta.owner.pid", None),
            create_time=r.number(owner_doc, "create_time", "meta.owner.create_time"),
            host=r.string(owner_doc, "host", "meta.owner.host"),
            launcher=r.string(owner_doc, "launcher", "meta.owner.launcher"),
            unit=r.string(owner_doc, "unit", "meta.owner.unit"),
            session=r.string(owner_doc, "session", "meta.owner.session"),
            how=r.string(owner_doc, "how", "meta.owner.how"),
            started_at=r.time(owner_doc, "started_at", "meta.owner.started_at"),
            extra=dict(owner_doc),
        )
    gate_doc = r.table(doc, "gate", "meta.gate")
    if gate_doc is not None:
        kind_text = r.string(gate_doc, "kind", "meta.gate.kind") or GateKind.HUMAN.value
        try:
            kind = GateKind(kind_text)
        except ValueError:
            raise r.fail("meta.gate.kind", f"unknown gate kind {kind_text[:40]!r}") from None
        meta.gate = Gate(kind, r.string(gate_doc, "target", "meta.gate.target"), extra=dict(gate_doc))
    world_doc = r.table(doc, "world", "meta.world")
    if world_doc is not None:
        for key, value in world_doc.items():
            if not isinstance(value, str):
                raise r.fail(f"meta.world.{key}", f"expected a string, got {_describe(value)}")
        meta.world = world_doc
    meta.extra = dict(doc)  # a fresh dict: the one its known keys were popped from keeps its size
    return meta


# A key of more than MAX_NESTING dotted parts (``a.a.a...`` in a key or a table header):
# tomllib's time grows with the square of the parts, so such a key is refused before parsing.
_KEY_PART = r"""(?:[A-Za-z0-9_-]++|"(?:[^"\\\n]|\\.)*+"|'[^'\n]*+')"""
_DOT_PART = rf"\.[ \t]*+{_KEY_PART}[ \t]*+"
_LONG_DOTTED_KEY = re.compile(rf"{_DOT_PART}(?:{_DOT_PART}){{{defaults.MAX_NESTING - 1}}}")  # starts with a
# literal dot, so the regex engine skips straight from dot to dot
# Strings and comments, to tell a long dotted key from text that merely looks like one.
_STRINGS_AND_COMMENTS = re.compile(
    r'''"""(?:[^"\\]|\\[\s\S]|"(?!""))*+"""(?:"{1,2}(?!"))?'''
    r"|'''[\s\S]*?'''(?:'{1,2}(?!'))?"
    r'''|"(?:[^"\\\n]|\\.)*+"|'[^'\n]*+'|\#[^\n]*+'''
)


def host_labels(baton: Baton) -> list[str]:
    """The baton's ``host_labels`` (a top-level list of labels): every one must be among a
    daemon's ``daemon.labels`` for that daemon to dispatch the task. BadInput if malformed."""
    value = baton.extra.get("host_labels", [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and HOST_PATTERN.fullmatch(v) for v in value):
        raise BadInput("host_labels must be a list of labels (letters, digits and . _ -)", task=baton.meta.id,
                       field="host_labels")
    return sorted(set(value))


def json_safe(value: Any) -> Any:
    """``value`` with every inf and nan spelled as TOML spells them: JSON has neither, and a
    baton's unknown keys may hold them."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def load_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads`` with bounds: any input gives a document or :class:`BadInput`.

    Refused: keys of more than :data:`~heartbeat.model.defaults.MAX_NESTING` dotted parts
    (quadratic parse time), documents nested deeper than that (a rewrite would overflow
    the stack), integers too long to convert, and whatever tomllib itself rejects.
    """
    if text.count(".") >= defaults.MAX_NESTING and _LONG_DOTTED_KEY.search(text):
        stripped = _STRINGS_AND_COMMENTS.sub(lambda m: "" if m.group().startswith("#") else "s", text)
        if _LONG_DOTTED_KEY.search(stripped):
            raise BadInput(f"nested too deeply: a key has more than {defaults.MAX_NESTING} dotted parts")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"not valid TOML: {exc}") from None
    except RecursionError:
        raise BadInput("not valid TOML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise BadInput(f"not valid TOML: {exc}") from None
    _check_bounds(doc, defaults.MAX_NESTING)
    return doc


def _check_bounds(doc: dict[str, Any], limit: int) -> None:
    """Refuse nesting deeper than ``limit`` (the document itself is 1) and integers outside
    64 bits, which TOML does not allow and which could not be written back (tomllib reads
    ``0xfff...`` of any length)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise BadInput(f"nested more than {limit} tables or arrays deep")
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            elif isinstance(child, int) and not -(2**63) <= child < 2**63:
                raise BadInput(f"not valid TOML: an integer of {child.bit_length()} bits (TOML integers are 64-bit)")


def parse_baton(text: str | bytes, *, path: str, expected_id: str | None = None) -> Baton:
    """Parse and validate a baton's TOML text, raising :class:`InvalidBaton` with file and field."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidBaton(f"not UTF-8 text (byte {exc.start})", path=path) from None
    try:
        doc = load_toml(text)
    except BadInput as exc:
        raise InvalidBaton(exc.message, path=path) from None
    return baton_from_dict(doc, path=path, expected_id=expected_id)


def dump_baton(baton: Baton) -> str:
    """The TOML text of a baton: known fields first, in DESIGN.md's order, then unknown keys.

    Strings with line breaks are written as multi-line strings, readable by a human,
    unless some string holds a carriage return: tomli_w turns ``\\r\\n`` into ``\\n`` in
    multi-line strings, and a rewrite must not change what it does not own.

    A baton the parser would refuse is not written: :class:`BadInput` names the field
    (a launcher name that is not a name, a relative workdir, nesting past the limit), so
    no writer can turn a task invalid.
    """
    import tomli_w

    doc = baton.to_dict()
    try:
        baton_from_dict(doc, path="")  # the parser's own rules, on the data about to be written
        _check_bounds(doc, defaults.MAX_NESTING)
    except BadInput as exc:
        raise BadInput(exc.message, task=baton.meta.id or None, field=exc.field) from None
    text = tomli_w.dumps(doc, multiline_strings=not _has_carriage_return(doc))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Python keeps undecodable bytes of argv as lone surrogates, which no UTF-8 file can hold.
        where = next((name for name, value in doc.items() if not _encodable(value)), None)
        raise BadInput("holds text that is not valid UTF-8 (an undecodable byte in an argument?)",
                       task=baton.meta.id or None, field=where) from None
    return text


def _encodable(value: Any) -> bool:
    import json

    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _has_carriage_return(value: Any) -> bool:
    if isinstance(value, str):
        return "\r" in value
    if isinstance(value, dict):
        return any(_has_carriage_return(k) or _has_carriage_return(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_carriage_return(v) for v in value)
    return False
