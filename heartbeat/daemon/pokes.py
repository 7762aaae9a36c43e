"""Tasks to look at soon, off the tick: the pokes, and the worker that answers them.

Anyone may poke a task (the store's change feed, a gate file appearing, an agent's exit,
the actor after a stop or a raced dispatch): it is queued, debounced
(:data:`heartbeat.model.defaults.WATCH_DEBOUNCE`) and looked at by one worker thread
(:meth:`Pokes.run`, started by the service with the loop's ``evaluate``). An exit pokes
with no debounce (:meth:`Pokes.poke_now`): the successor starts at once, whatever the tick.

Built first, before any part: every part that pokes is given it in its constructor, so
nothing is wired in after construction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from heartbeat.model import defaults

__all__ = ["Pokes"]


class Pokes:
    """The queue of poked tasks (thread-safe) and the worker's loop over it."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self._wake = threading.Condition()
        self._pending: dict[str, float] = {}
        """Task id -> monotonic time of its last poke (under ``_wake``)."""

    def poke(self, task_id: str) -> None:
        """Ask for ``task_id`` to be looked at soon (debounced), off the tick. Any thread."""
        with self._wake:
            self._pending[task_id] = time.monotonic()
            self._wake.notify()

    def poke_now(self, task_id: str) -> None:
        """Ask for ``task_id`` to be looked at at once, without the debounce (an agent's exit). Any thread."""
        with self._wake:
            self._pending[task_id] = time.monotonic() - defaults.WATCH_DEBOUNCE
            self._wake.notify()

    def wake_all(self) -> None:
        """Wake the worker (a stop: it sees ``stop`` set and returns)."""
        with self._wake:
            self._wake.notify_all()

    def run(self, evaluate: Callable[[str], None], stop: threading.Event) -> None:
        """The worker's loop until ``stop``: look at each poked task (``evaluate``) once its debounce has passed."""
        debounce = defaults.WATCH_DEBOUNCE
        while not stop.is_set():
            with self._wake:
                if not self._pending:
                    self._wake.wait(timeout=5.0)
                    continue
                now_m = time.monotonic()
                ready = [t for t, at in self._pending.items() if now_m - at >= debounce]
                if not ready:
                    wait = min(debounce - (now_m - at) for at in self._pending.values())
                    self._wake.wait(timeout=max(wait, 0.001))
                    continue
                for task_id in ready:
                    del self._pending[task_id]
            for task_id in ready:
                try:
                    evaluate(task_id)
                except Exception as exc:
                    self.log.exception("evaluate_failed", task=task_id, error=repr(exc))
