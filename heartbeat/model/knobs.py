"""The policy's knobs, declared once: each is one line of :class:`PolicyKnobs`.

A knob is a field of :class:`PolicyKnobs` made with :func:`knob`: its name, its type, its default
(from :mod:`heartbeat.model.defaults`), its kind with its bounds, and a one-line doc. Everything
else derives from that line:

- :class:`heartbeat.model.policy.Policy` and :class:`heartbeat.config.shape.DaemonConfig` both
  inherit the fields, so ``policy.stall_after`` and ``config.daemon.stall_after`` are typed and
  have the same default;
- the ``[daemon]`` parse (:mod:`heartbeat.config.load`) reads every knob by its kind, with the
  kind's one-line errors (``daemon.stall_after: must be more than zero``);
- the daemon builds each launcher's policy from :func:`knob_values` of the config (no list of
  names to keep in step);
- the config reference's check (``config/heartbeat.example.toml`` documents every ``[daemon]``
  field) sees the new field.

Adding a knob: its default in ``defaults.py``, one line here, and its key with a comment in the
example config; then read it in :func:`heartbeat.model.policy.decide`. This module is in ``model``
and imports nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from heartbeat.model import defaults

__all__ = ["KnobKind", "Knob", "knob", "PolicyKnobs", "KNOBS", "knob_values", "HandoffKnobs", "HANDOFF_KNOBS"]

_T = TypeVar("_T")
_META = "heartbeat.knob"


class KnobKind(StrEnum):
    """How a knob is written in the config, and so how it is read and bounded."""

    DURATION = "duration"  # "10m", "1h30m" or seconds; more than zero (``zero_ok``: 0 too, meaning off)
    COUNT = "count"  # an integer, at least ``minimum``
    MONEY = "money"  # an amount in USD, 0 or more (0: no budget)
    CHOICE = "choice"  # one of ``choices``
    SWITCH = "switch"  # true or false


@dataclass(frozen=True)
class Knob:
    """One knob as declared: what the parse, the policy and the docs check read."""

    name: str
    kind: KnobKind
    default: Any
    doc: str
    zero_ok: bool = False
    """A duration: 0 is allowed (it means off or none)."""
    minimum: int = 1
    """A count: the least value allowed."""
    choices: tuple[str, ...] = ()
    """A choice: the words allowed."""


def knob(default: _T, kind: KnobKind, doc: str, *, zero_ok: bool = False, minimum: int = 1,
         choices: tuple[str, ...] = ()) -> _T:
    """A field of :class:`PolicyKnobs` (typed as its default for the type checker; a dataclass
    field with the knob's spec in its metadata at run time)."""
    spec = Knob(name="", kind=kind, default=default, doc=doc, zero_ok=zero_ok, minimum=minimum, choices=choices)
    made: _T = field(default=default, metadata={_META: spec})
    return made


@dataclass(frozen=True)
class PolicyKnobs:
    """The knobs ``[daemon]`` sets and :func:`heartbeat.model.policy.decide` reads, one line each."""

    stall_after: float = knob(defaults.STALL_AFTER, KnobKind.DURATION,
                              "Silence (no write, touch or output) after which a task is stalled.")
    hang_after: float = knob(defaults.HANG_AFTER, KnobKind.DURATION, zero_ok=True,
                             doc="Silence without a tool call in flight after which the model counts as hung (0: off).")
    progress_after: float = knob(defaults.PROGRESS_AFTER, KnobKind.DURATION,
                                 "How long an alive, touching agent may stay on one step before it is spinning.")
    max_attempts: int = knob(defaults.MAX_ATTEMPTS, KnobKind.COUNT,
                             "Dispatches without progress before the task is escalated.")
    max_idle_resumes: int = knob(defaults.MAX_IDLE_RESUMES, KnobKind.COUNT,
                                 "Exits 0 without progress in a row before the task is escalated.")
    backoff_initial: float = knob(defaults.BACKOFF_INITIAL, KnobKind.DURATION, zero_ok=True,
                                  doc="The wait before the first re-dispatch after a failed attempt; doubles each time.")
    backoff_max: float = knob(defaults.BACKOFF_MAX, KnobKind.DURATION, zero_ok=True,
                              doc="The cap on the backoff (not less than backoff_initial).")
    on_spinning: str = knob(defaults.ON_SPINNING, KnobKind.CHOICE, choices=("escalate", "restart", "report"),
                            doc="What a spinning agent gets: escalate, restart (a failed attempt) or report.")
    inactive_grace: float = knob(defaults.INACTIVE_GRACE, KnobKind.DURATION, zero_ok=True,
                                 doc="How long an agent may run on once its task is no longer active.")
    max_limit_wait: float = knob(defaults.MAX_LIMIT_WAIT, KnobKind.DURATION,
                                 "The longest a task waits for a rate or usage limit to reset before it is escalated.")
    max_cost_usd: float = knob(defaults.MAX_COST_USD, KnobKind.MONEY,
                               "What one task's runs may cost in all before it is escalated (0: no budget).")
    question_wait: float = knob(defaults.QUESTION_WAIT, KnobKind.DURATION, zero_ok=True,
                                doc="How long a question across the seam waits unanswered before it escalates "
                                    "to a person (0: never).")


def _declared_in(cls: type) -> tuple[Knob, ...]:
    """The knobs of a knob class (:class:`PolicyKnobs`, :class:`HandoffKnobs`), in its order, with their names."""
    found = []
    for f in fields(cls):
        spec = f.metadata.get(_META)
        if not isinstance(spec, Knob):
            raise TypeError(f"{cls.__name__}.{f.name} is not made with knob(): declare it as the others are")
        found.append(Knob(name=f.name, kind=spec.kind, default=spec.default, doc=spec.doc, zero_ok=spec.zero_ok,
                          minimum=spec.minimum, choices=spec.choices))
    return tuple(found)


KNOBS: tuple[Knob, ...] = _declared_in(PolicyKnobs)
"""Every knob of :class:`PolicyKnobs`, in its order, with its name."""


@dataclass(frozen=True)
class HandoffKnobs:
    """The knobs ``[handoff]`` sets and :func:`heartbeat.tasks.needs.learn` reads, one line each."""

    learn: bool = knob(defaults.LEARN_NEEDS, KnobKind.SWITCH,
                       "Whether an edge's profile turns a part it keeps losing into a required need.")
    learn_after: int = knob(defaults.LEARN_AFTER, KnobKind.COUNT,
                            "In how many of the last learn_window handoffs a part must be lost to be learned.")
    learn_window: int = knob(defaults.LEARN_WINDOW, KnobKind.COUNT,
                             "How many of an edge role's latest handoffs the learning rule looks at.")
    learn_from: str = knob(defaults.LEARN_FROM, KnobKind.CHOICE, choices=("rederived", "rederived+missing"),
                           doc="What counts as a part lost: re-derived by the downstream, or also empty in the package.")


HANDOFF_KNOBS: tuple[Knob, ...] = _declared_in(HandoffKnobs)
"""Every knob of :class:`HandoffKnobs`, in its order, with its name."""


def knob_values(source: PolicyKnobs) -> dict[str, Any]:
    """The knobs' values of ``source`` (a :class:`DaemonConfig` or a :class:`Policy`), by name: the
    keyword arguments that carry them into another (``Policy(**knob_values(config.daemon))``)."""
    return {k.name: getattr(source, k.name) for k in KNOBS}
