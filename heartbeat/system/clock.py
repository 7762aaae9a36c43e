"""The daemon's two clocks: the wall clock for the record, the monotonic clock for durations.

A baton's timestamps, the ledger's, a snooze's end and a ``time:`` gate are wall-clock
instants. The wall clock can step: NTP correcting a drift, a VM resumed from a snapshot, a
person fixing the date. Durations the daemon acts on (how long an agent has been silent, has
not moved its step, has run, has been waiting) are measured on the monotonic clock, which
never steps (:mod:`heartbeat.daemon.ages`); :class:`StepWatch` notices a step by comparing
the two, so the daemon can say so in its log and re-arm its scheduled jobs (APScheduler 3
keeps their next runs as wall-clock times). The tick itself beats on the monotonic clock
(:class:`Metronome`): a wall clock stepped back an hour cannot hold it for that hour.

:class:`ShiftedClock` is a wall clock shifted in-process, for tests (as huey's tests pass
``now``): the daemon reads every wall-clock time through its :class:`Clock`.
:class:`OffsetFileClock` is the same for a daemon in another process (``heartbeat run`` given
:data:`~heartbeat.model.defaults.TEST_CLOCK_ENV`, a test seam): its shift is read from a file, so the
soak steps a real daemon's wall clock with no libfaketime (whose 0.9.10 breaks ``time.sleep``
when the monotonic clock is left alone).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from heartbeat.model import defaults
from heartbeat.model.errors import UnsafePath
from heartbeat.system.safefile import read_regular

__all__ = ["Clock", "Metronome", "OffsetFileClock", "ShiftedClock", "StepWatch", "SystemClock", "SYSTEM",
           "clock_from_env"]


class Clock(Protocol):
    """Where the daemon reads the time."""

    def now(self) -> datetime:
        """The wall clock, UTC."""

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (only differences mean anything)."""


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM = SystemClock()


class ShiftedClock:
    """The system's clocks with the wall clock shifted by :meth:`step`, in this process only
    (for tests: a clock step without touching the machine's clock)."""

    def __init__(self) -> None:
        self.shift = timedelta(0)

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (negative: back)."""
        self.shift += timedelta(seconds=seconds)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.shift

    def monotonic(self) -> float:
        return time.monotonic()


class OffsetFileClock:
    """The system's clocks with the wall clock shifted by the seconds written in ``path`` (a
    number, negative: behind), re-read at every look; for tests only (the soak steps a real
    daemon's wall clock by rewriting the file). The monotonic clock is the machine's.

    A file unreadable or not a finite number at start raises :class:`ValueError` (one line);
    later, the last good shift holds until the file reads well again."""

    def __init__(self, path: str) -> None:
        self.path = path
        shift = self._read()
        if shift is None:
            raise ValueError(f"{defaults.TEST_CLOCK_ENV}={path}: not a readable file holding a number of seconds")
        self.shift = shift

    def _read(self) -> float | None:
        try:
            value = float(read_regular(self.path, 64, follow=True).decode("ascii").strip())
        except (OSError, UnsafePath, ValueError, UnicodeDecodeError):
            return None
        return value if abs(value) < 1e9 else None  # (also refuses nan and inf)

    def now(self) -> datetime:
        shift = self._read()
        if shift is not None:
            self.shift = shift
        return datetime.now(UTC) + timedelta(seconds=self.shift)

    def monotonic(self) -> float:
        return time.monotonic()


def clock_from_env(env: dict[str, str] | None = None) -> Clock:
    """The machine's clocks, or an :class:`OffsetFileClock` when :data:`~heartbeat.model.defaults.TEST_CLOCK_ENV`
    names a file (a test seam; raises :class:`ValueError` for a file it cannot read)."""
    path = (os.environ if env is None else env).get(defaults.TEST_CLOCK_ENV)
    return OffsetFileClock(path) if path else SYSTEM


class StepWatch:
    """Notices the wall clock stepping: the wall clock less the monotonic one is constant while
    both run (NTP slews them together); a change of more than ``tolerance`` is a step."""

    def __init__(self, clock: Clock, tolerance: float = defaults.CLOCK_STEP_TOLERANCE) -> None:
        self.clock = clock
        self.tolerance = tolerance
        self._lock = threading.Lock()
        self._offset = self._read()
        self.steps = 0
        """Steps noticed so far."""
        self.checked_at = clock.monotonic()
        """When (monotonic) the last :meth:`check` ran."""

    def _read(self) -> float:
        return self.clock.now().timestamp() - self.clock.monotonic()

    def check(self) -> float | None:
        """The size of a step since the last check (seconds, negative: back), or None."""
        with self._lock:
            self.checked_at = self.clock.monotonic()
            offset = self._read()
            step = offset - self._offset
            if abs(step) <= self.tolerance:
                return None
            self._offset = offset
            self.steps += 1
            return step


class Metronome:
    """Calls ``beat`` every ``interval`` seconds of the monotonic clock, in a thread of its own:
    one call at a time, beats missed while one ran coalesced into one, :meth:`soon` for one now.
    A beat that raises is the caller's to catch (the daemon's tick catches everything)."""

    def __init__(self, beat: Callable[[], object], interval: float, *, clock: Clock = SYSTEM,
                 name: str = "heartbeat-tick") -> None:
        self.beat = beat
        self.interval = interval
        self.clock = clock
        self.name = name
        self.beats = 0
        self._asked = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """The first beat at once, then one every ``interval``."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def soon(self) -> None:
        """A beat now (after the one running, if any), then every ``interval`` from it."""
        self._asked = True
        self._wake.set()

    def set_interval(self, seconds: float) -> None:
        """A new interval, counted from the last beat."""
        self.interval = seconds
        self._wake.set()

    def stop(self) -> None:
        """No beat after the one running (if any); does not wait for it."""
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        last: float | None = None
        while not self._stop.is_set():
            if last is not None and not self._asked:
                wait = last + self.interval - self.clock.monotonic()
                if wait > 0:
                    self._wake.wait(wait)  # (a lock's timed wait: on the monotonic clock)
                    self._wake.clear()
                    continue  # stopped, asked, a new interval, or time: look again
            self._asked = False
            last = self.clock.monotonic()
            self.beat()
            self.beats += 1
