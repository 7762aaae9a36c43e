"""What changed since the last look: the watcher's reports, and when a full sweep is due.

Between sweeps the daemon trusts its watcher: a tick looks only at the batons the watcher
reported (:meth:`heartbeat.store.base.Store.scan` with ``only``), so a quiet state dir costs
nothing per baton. A full sweep (every baton ``stat``'ed) is the safety net. It comes

- every ``daemon.sweep_every`` seconds (``0``: every tick, as without a watcher);
- at the first tick, and whenever no watcher runs;
- at the next tick after the watcher said it lost events (an inotify queue overflow) or was
  (re)started: a change made while it was not watching raised no event.

:class:`ChangeFeed` is plain bookkeeping with the clock passed in, so the rule is tested
without sleeping; the daemon feeds it from the watcher's thread and reads it from the tick's.
"""

from __future__ import annotations

import threading

__all__ = ["ChangeFeed"]


class ChangeFeed:
    """The tasks reported changed since the last tick, and whether the next tick must sweep."""

    def __init__(self, sweep_every: float) -> None:
        self.sweep_every = sweep_every
        self._lock = threading.Lock()
        self._changed: set[str] = set()
        self._watching = False
        self._lost = True
        self._last_sweep: float | None = None
        self.sweeps = 0
        """Full sweeps so far (a report for tests and the debug log)."""
        self.lost_reason = ""
        """Why the next tick sweeps early (empty when it does not)."""

    def changed(self, task_id: str) -> None:
        """The watcher saw ``<task_id>``'s baton written, created, moved or removed."""
        with self._lock:
            self._changed.add(task_id)

    def watching(self) -> None:
        """A watcher (re)started: trust it once a sweep has caught up with what it did not see."""
        with self._lock:
            self._watching = True
            self._lost, self.lost_reason = True, "the watcher started"

    def lost(self, reason: str) -> None:
        """The watcher dropped events or stopped: the next tick sweeps (and so does every tick
        while no watcher runs)."""
        with self._lock:
            self._lost, self.lost_reason = True, reason

    def stopped(self) -> None:
        """No watcher runs any more: every tick sweeps."""
        with self._lock:
            self._watching = False
            self._lost, self.lost_reason = True, "no watcher runs"

    def take(self, now: float) -> set[str] | None:
        """The tasks to look at this tick, or None for a full sweep; ``now`` in seconds (a clock
        that went back since the last sweep makes this one a sweep)."""
        with self._lock:
            changed, self._changed = self._changed, set()
            due = (not self._watching or self._lost or self._last_sweep is None
                   or not 0 <= now - self._last_sweep < self.sweep_every)
            if not due:
                return changed
            self._last_sweep = now
            if self._watching:
                self._lost, self.lost_reason = False, ""
            self.sweeps += 1
            return None
