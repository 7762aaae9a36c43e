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
is all the baton offers; a live agent's own age, read from the kernel on the boot clock
(:func:`heartbeat.launchers.liveness.process_age`), bounds every stamp of its run then (each is at or
after its dispatch), so a daemon restarted after a step neither stops it for ``max_runtime``
nor calls it silent. A dead agent's run seen only once is *unobserved*: its length is not
stated in the record (:meth:`Ages.observed`).

Only a task with an owner has its ages read. A task without one (most of thousands: done,
snoozed, blocked) keeps just the time of its last look (:meth:`Ages.unowned`): the write that
gives it an owner (a dispatch, a claim) stamps ``touched_at`` and the owner's ``started_at``
anew, so its stamps are new since that look either way.
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
    unobserved: set[str] = field(default_factory=set)
    """Names whose current value was first seen with nothing but the wall clock to age it."""


class Ages:
    """Per task, the ages of named timestamps (see the module docstring)."""

    def __init__(self) -> None:
        self.memory: dict[str, TaskAges] = {}
        self._unowned_looked: dict[str, float] = {}
        """Tasks without an owner: the monotonic time of their last look (and nothing else)."""

    def forget(self, task_id: str) -> None:
        self.memory.pop(task_id, None)
        self._unowned_looked.pop(task_id, None)

    def unowned(self, task_id: str, mono: float) -> None:
        """A look at a task without an owner: its ages are not read, only this look is remembered."""
        self.memory.pop(task_id, None)
        self._unowned_looked[task_id] = mono

    def observed(self, task_id: str, name: str) -> bool:
        """Whether the age of ``name`` rests on more than the wall clock (see the module docstring)."""
        mem = self.memory.get(task_id)
        return mem is None or name not in mem.unobserved

    def measure(self, task_id: str, stamps: dict[str, datetime | None], now: datetime,
                mono: float, *, bound: float | None = None) -> dict[str, float | None]:
        """The age in seconds of each of ``stamps`` (None for a missing one) at this look
        (``now`` on the wall clock, ``mono`` on the monotonic one); ``bound``, when known, is the
        most any of them can be (the live agent's own age)."""
        mem = self.memory.get(task_id)
        if mem is None:
            mem = self.memory[task_id] = TaskAges(looked=self._unowned_looked.pop(task_id, None))
        ages: dict[str, float | None] = {}
        for name, value in stamps.items():
            if value is None:
                mem.seen.pop(name, None)
                ages[name] = None
                continue
            seen = mem.seen.get(name)
            if seen is None or seen.value != value:
                age = max(0.0, (now - value).total_seconds())
                mem.unobserved.discard(name)
                if mem.looked is not None:  # new since the previous look: no older than it
                    age = min(age, max(0.0, mono - mem.looked))
                elif bound is not None:  # first sight: no older than the agent itself
                    age = min(age, max(0.0, bound))
                else:
                    mem.unobserved.add(name)
                seen = mem.seen[name] = _Seen(value, mono - age)
            ages[name] = max(0.0, mono - seen.since)
        for name in set(mem.seen) - set(stamps):
            del mem.seen[name]
            mem.unobserved.discard(name)
        mem.looked = mono
        return ages
