"""How old a baton's timestamps are, on the daemon's own monotonic clock.

The durations that stop agents and escalate tasks (silent past ``stall_after``, the step
unchanged past ``progress_after``, running past ``max_runtime``, a launch past its timeout)
are ages of wall-clock timestamps in the baton (``touched_at``, ``progress_at``,
``dispatched_at``, the owner's ``started_at``), kept there for the record. Measured against
the wall clock, a step of that clock would age them all at once: an hour forward and every
healthy agent looks silent and spinning for an hour.

So the daemon ages them itself: it notes, on the monotonic clock, when it first saw each
timestamp's current value, and counts from there. The wall clock is read once per value,
when it first appears, and trusted only as far as the daemon's own observations allow: a
value that is new since the daemon's previous look is at most as old as that look, and never
older than nothing. At the daemon's first sight of a task (a start, a restart) the wall clock
is all there is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["Ages", "TaskAges"]


@dataclass(slots=True)
class _Seen:
    value: datetime
    since: float
    """Monotonic seconds from which the value's age counts."""


@dataclass(slots=True)
class TaskAges:
    """What the daemon saw of one task's timestamps (under the look lock)."""

    looked: float | None = None
    """Monotonic time of the previous look."""
    seen: dict[str, _Seen] = field(default_factory=dict)


class Ages:
    """Per task, the ages of named timestamps (see the module docstring)."""

    def __init__(self) -> None:
        self.memory: dict[str, TaskAges] = {}

    def forget(self, task_id: str) -> None:
        self.memory.pop(task_id, None)

    def measure(self, task_id: str, stamps: dict[str, datetime | None], now: datetime,
                mono: float) -> dict[str, float | None]:
        """The age in seconds of each of ``stamps`` (None for a missing one) at this look
        (``now`` on the wall clock, ``mono`` on the monotonic one)."""
        mem = self.memory.get(task_id)
        if mem is None:
            mem = self.memory[task_id] = TaskAges()
        ages: dict[str, float | None] = {}
        for name, value in stamps.items():
            if value is None:
                mem.seen.pop(name, None)
                ages[name] = None
                continue
            seen = mem.seen.get(name)
            if seen is None or seen.value != value:
                age = max(0.0, (now - value).total_seconds())
                if mem.looked is not None:  # new since the previous look: no older than it
                    age = min(age, max(0.0, mono - mem.looked))
                seen = mem.seen[name] = _Seen(value, mono - age)
            ages[name] = max(0.0, mono - seen.since)
        for name in set(mem.seen) - set(stamps):
            del mem.seen[name]
        mem.looked = mono
        return ages
