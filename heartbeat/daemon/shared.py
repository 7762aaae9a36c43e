"""What every part of the daemon reads: the config, the store, the launchers, the pokes and the look lock.

One :class:`Shared` per daemon, built by the service (:mod:`.service`) before the parts and
given to each in its constructor; nothing is set on it afterwards but the config a reload
swaps, the launchers rebuilt with it, and the running agents. The parts (:mod:`.observe`,
:mod:`.act`, :mod:`.watch`, :mod:`.core`, :mod:`.leased`) each keep their own per-task
records; this holds only what is truly common. Threads: the tick (the scheduler's thread, or the caller's), the watch
worker (looks at one poked task), the worker pool (stops, notifiers, checks) and the
watchers' threads (inotify, LISTEN). Every per-task record of every part, and ``running``
here, is read and written only under :attr:`Shared.lock` (the look lock), unless its
docstring says otherwise.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from heartbeat.config.shape import Config, LauncherConfig
from heartbeat.daemon.exits import ExitWatch
from heartbeat.daemon.gates import GateEvaluator
from heartbeat.daemon.pokes import Pokes
from heartbeat.launchers.liveness import this_host
from heartbeat.model import defaults
from heartbeat.model.ledger import Event
from heartbeat.store.base import SharedStore, Store
from heartbeat.system.clock import SYSTEM, Clock
from heartbeat.system.layout import StateLayout

__all__ = ["Shared", "logger", "open_daemon_store"]


class Shared:
    """The config (swapped on reload), store, launchers, pool, look lock and the running agents."""

    def __init__(self, config: Config, store: Store, *, pokes: Pokes, dry_run: bool, log: Any, host: str,
                 clock: Clock = SYSTEM) -> None:
        self.config = config
        """Swapped whole by a reload, under :attr:`lock` between passes: read it afresh each time."""
        self.store = store
        self.dry_run = dry_run
        self.log = log
        self.host = host
        self.clock = clock
        """The wall clock (for the record) and the monotonic one (for the durations decisions act on)."""
        self.look_mono: float | None = None
        """This look's time on the monotonic clock (under :attr:`lock`); None when the caller gave
        the look its ``now`` (tests), which then stands for both clocks."""
        self.layout = StateLayout(config.state_dir)
        self.lock = threading.RLock()
        """The look lock: one look (a pass, or one poked task) at a time; guards every per-task record."""
        self.pool = ThreadPoolExecutor(max_workers=defaults.WORKER_THREADS, thread_name_prefix="heartbeat-worker")
        self.gates = GateEvaluator(config.checks, self.pool)
        self.launchers: dict[str, Any] = {}
        self.running: dict[str, str] = {}
        """Task id -> launcher name of the live agents this daemon dispatched (under :attr:`lock`):
        written by observing (alive or not) and acting (launched, settled); admission counts it."""
        self.downstreams: dict[str, set[str]] = {}
        """Upstream id -> the tasks held until it is done (an ``after``/``task:`` gate, or ``after``): the
        loop's index (under :attr:`lock`), rebuilt by a pass whose scan changed and grown by the
        watcher's look at one task, so a task written a moment ago is in it. The needs in an upstream's
        brief come from it (a scan of its own, on the file store, would move the scan cache the loop
        reads between passes)."""
        self.pokes = pokes
        """Ask for a task to be looked at soon, off the tick (any thread); an exit, at once."""
        self.exits = ExitWatch(pokes.poke_now)
        """Exit notices of the live agents' processes: the observer and the actor say whom to watch
        (under :attr:`lock`), the watcher starts and stops it; an exit pokes its task with no debounce."""
        self.build_launchers()

    def downstreams_of(self, upstream: str) -> list[str]:
        """The tasks waiting on ``upstream`` as the loop last saw them (any status; a caller keeps
        those whose ``after`` names it)."""
        return sorted(self.downstreams.get(upstream, ()))

    def build_launchers(self) -> None:
        """The launchers of the current config (null ones in a dry run)."""
        from heartbeat.launchers import make_launcher

        launchers: dict[str, Any] = {}
        for name, lc in self.config.launchers.items():
            if self.dry_run:
                lc = LauncherConfig(name=name, type="null", command=lc.command,
                                    non_retryable_exit_codes=lc.non_retryable_exit_codes)
            launchers[name] = make_launcher(lc)
        self.launchers = launchers

    def seconds(self, now: datetime) -> float:
        """This look's time in seconds on the clock durations are measured on (see :attr:`look_mono`)."""
        return self.look_mono if self.look_mono is not None else now.timestamp()

    def launcher_named(self, name: str) -> Any:
        return self.launchers.get(name) if name else None

    def record(self, event: Event) -> None:
        """Append an event with no baton write; a failure is logged, never raised (any thread)."""
        from heartbeat.model.errors import HeartbeatError

        try:
            self.store.record([event])
        except HeartbeatError as exc:
            self.log.error("ledger_write_failed", task=event.task, kind=event.kind, error=str(exc))


def open_daemon_store(config: Config, *, claim: bool = True, decisions: bool = False) -> Store:
    """The configured store as the daemon holds it (:func:`heartbeat.store.open_store` plus what a
    daemon adds): a database store also claims the database for this daemon (``claim``), never waits
    on a refusing database, and passes its URL on to the agents.
    ``decisions``: the loop's own store, whose scans keep only what decisions read of each baton
    (:func:`heartbeat.model.baton.decision_view`: a 10,000-baton state dir in far less memory)."""
    from heartbeat.model.baton import decision_view
    from heartbeat.store import URL_ENV, open_store, store_url

    url = store_url(config.store.url)
    # (refused_wait 0: the daemon's own statements never wait on a refusing database; its leases must not)
    # (lease_ttl: a transaction it leaves idle, cut off mid-write, never holds its row locks beyond its lease)
    store = open_store(config.state_dir, url, scan_view=decision_view if decisions else None, refused_wait=0.0,
                       lease_ttl=config.daemon.lease_ttl)
    if url:
        from heartbeat.store.files import ensure_private_dir

        os.environ[URL_ENV] = url  # the launchers pass it on: agents write to the same database
        ensure_private_dir(config.state_dir)  # agents' logs, the daemon lock and the vitals still live there
        if claim and isinstance(store, SharedStore):
            try:
                store.claim_daemon(this_host())  # one daemon per host id; other hosts share it through leases
            except BaseException:
                store.close()
                raise
    return store


def logger() -> Any:
    from heartbeat.system.logging import get_logger

    return get_logger("heartbeat.daemon")
