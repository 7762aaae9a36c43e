"""The daemon's start on a store that is not there yet: wait for the database, retrying, instead of exiting.

At boot PostgreSQL may come up after heartbeat (or be restarting): exiting at once made
systemd's start limit give up on the unit within a minute. :func:`wait_for_store` tries to
open the store, and while the database is unreachable (:class:`~heartbeat.model.errors.StoreUnreachable`;
any other error, a bad schema or URL, still ends the start with its one-line message) it
logs one ``store_waiting`` line per try with the reason and the next wait (doubling from
:data:`~heartbeat.model.defaults.STORE_WAIT_INITIAL` to :data:`~heartbeat.model.defaults.STORE_WAIT_MAX`),
tells systemd ``STATUS=waiting for the store: ...`` and extends its start timeout, and
stops at once on SIGTERM/SIGINT. Each try runs in a thread of its own, so a try blocked
in a connect does not hold the stop back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from heartbeat.model import defaults
from heartbeat.model.errors import StoreUnreachable
from heartbeat.store.base import Store
from heartbeat.system import systemd

__all__ = ["wait_for_store"]


def wait_for_store(opener: Callable[[], Store], log: Any, *,
                   initial: float = defaults.STORE_WAIT_INITIAL,
                   maximum: float = defaults.STORE_WAIT_MAX) -> Store | None:
    """The store ``opener`` returns, once it can; None when SIGTERM/SIGINT came first.

    Raises what ``opener`` raises other than :class:`StoreUnreachable`. Installs its own
    SIGTERM/SIGINT handlers for the wait and puts the previous ones back.
    """
    stop = threading.Event()

    def on_term(_signum: int, _frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_term) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        wait, attempt = initial, 0
        while True:
            attempt += 1
            try_ = _Try(opener)
            while not try_.done.wait(0.1) and not stop.is_set():
                pass
            if stop.is_set():
                log.info("store_wait_stopped", attempts=attempt, reason="SIGTERM while waiting for the store")
                if try_.done.is_set():  # (a try still under way is left behind: the process is ending)
                    _close(try_.store)
                return None
            error = try_.error
            if error is None:
                if attempt > 1:
                    log.info("store_reached", attempts=attempt)
                assert try_.store is not None
                return try_.store
            if not isinstance(error, StoreUnreachable):
                raise error
            log.warning("store_waiting", attempt=attempt, error=str(error), retry_in_s=wait)
            systemd.notify(f"STATUS=waiting for the store (try {attempt}): {error}",
                           f"EXTEND_TIMEOUT_USEC={int((wait + defaults.PG_CONNECT_TIMEOUT * 2 + 30) * 1_000_000)}",
                           "WATCHDOG=1")
            if stop.wait(wait):
                log.info("store_wait_stopped", attempts=attempt, reason="SIGTERM while waiting for the store")
                return None
            wait = min(wait * 2, maximum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Try:
    """One try at opening the store, in a thread of its own; ``done`` is set when it ends."""

    def __init__(self, opener: Callable[[], Store]) -> None:
        self.opener = opener
        self.store: Store | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, name="heartbeat-store-open", daemon=True).start()

    def _run(self) -> None:
        try:
            self.store = self.opener()
        except BaseException as exc:  # handed to the main thread
            self.error = exc
        finally:
            self.done.set()


def _close(store: Store | None) -> None:
    if store is not None:
        try:
            store.close()
        except Exception:  # it is being dropped either way
            pass
