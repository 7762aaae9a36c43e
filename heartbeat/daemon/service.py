"""The service around the loop: ``heartbeat run``.

:class:`Daemon` is composition: it builds the parts, each given its dependencies in its
constructor (the loop :class:`~heartbeat.daemon.core.Loop`, the observer, the actor, the
watcher, the lease part, and the relay when it serves), and adds what a service needs:
the tick every ``tick`` seconds of the monotonic clock (coalesced, one at a time), gc and
lease renewals in APScheduler (re-armed when the wall clock steps), the watchers
(:mod:`.watch`), signal handlers that only set flags (SIGHUP reloads, SIGTERM/SIGINT stop),
systemd notifications (READY, WATCHDOG from the tick, STATUS with counts by state), the
``[retention]`` job and the ``[http]`` page. :func:`run_from_cli` takes the state dir's
daemon lock and runs it.

Stopping the daemon leaves agents running; a restarted daemon re-adopts them from
their batons (owner pid + create time) instead of launching duplicates.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from heartbeat.config.load import load_config
from heartbeat.config.shape import Config
from heartbeat.daemon.act import Actor
from heartbeat.daemon.answers import AnswerPart
from heartbeat.daemon.boot import wait_for_store
from heartbeat.daemon.changes import ChangeFeed
from heartbeat.daemon.core import Loop
from heartbeat.daemon.leased import lease_part, renew_interval
from heartbeat.daemon.observe import Observer
from heartbeat.daemon.overdue import OverdueQuestions
from heartbeat.daemon.pokes import Pokes
from heartbeat.daemon.shared import Shared, logger, open_daemon_store
from heartbeat.daemon.vitals import Vitals
from heartbeat.daemon.watch import Watcher
from heartbeat.launchers.liveness import this_host
from heartbeat.model import defaults
from heartbeat.model.errors import GcBusy, HeartbeatError, StoreError
from heartbeat.store.base import Archiving, FileBacked, Store
from heartbeat.system import signals as early_signals
from heartbeat.system import systemd
from heartbeat.system.clock import SYSTEM, Clock, Metronome, OffsetFileClock, clock_from_env
from heartbeat.system.layout import StateLayout

__all__ = ["Daemon", "PageStarter", "hold_daemon_lock", "logger", "open_daemon_store", "run_from_cli"]


class PageStarter(Protocol):
    """Starts the status page and /metrics for ``config``'s ``[http]`` in a thread of its own: a
    function that stops it, or None when it did not start (the starter logs why). ``vitals``: the
    loop's, for /metrics. The command line gives :func:`heartbeat.web.server.start_for_daemon`; the
    daemon, below the faces, never imports the page itself."""

    def __call__(self, config: Config, vitals: Any, log: Any) -> Callable[[], None] | None: ...


_STAND_IN = 3
"""With a tick at most CLOCK_CHECK_EVERY, the main thread looks at the clock this many times less often."""


class Daemon:
    """The daemon: a service that has a loop, an observer, an actor, a watcher, a lease part
    and a relay, and drives them (scheduler, signals, sd_notify, reload). See the module docstring.

    Every part is built here and given what it needs in its constructor: the common
    :class:`~heartbeat.daemon.shared.Shared` (config, store, launchers, pokes, look lock),
    the lease part (None on the file store), and the service's own methods where a part must
    reach back (a wall-clock step re-arms the scheduler, a stood-down lease stops the daemon,
    a lost change feed ticks soon)."""

    def __init__(self, config: Config, *, store: Store | None = None, dry_run: bool = False, log: Any = None,
                 clock: Clock = SYSTEM, page: PageStarter | None = None) -> None:
        if config.daemon.host and not os.environ.get("HEARTBEAT_HOST", "").strip():
            os.environ["HEARTBEAT_HOST"] = config.daemon.host  # this_host(), the launchers and the agents agree
        store = store if store is not None else open_daemon_store(config, claim=not dry_run, decisions=True)
        if isinstance(store, FileBacked):  # a held baton lock must not stall every task
            store.lock_wait = defaults.DAEMON_LOCK_WAIT
        log = log if log is not None else logger()
        self.store = store
        self.log = log
        self.clock = clock
        self._stop = threading.Event()
        self._signalled = threading.Event()
        """Set with any flag the main thread of :meth:`serve` must answer (a stop, a reload)."""
        self._reload = threading.Event()
        self._scheduler: Any = None
        self.metronome: Metronome | None = None
        """The tick's beat (started by :meth:`start_scheduler`)."""
        self.relay: Any = None
        """The relay server (:mod:`.relay`) while :meth:`serve` runs with ``daemon.relay``."""
        self._relay_store: Store | None = None
        """The relay's database store (None: the file store's relay opens one per request)."""
        self._page = page
        """Starts the ``[http]`` page when :meth:`serve` runs (:class:`PageStarter`); None: no page."""
        self.pokes = Pokes(log)
        self.shared = Shared(config, store, pokes=self.pokes, dry_run=dry_run, log=log, host=this_host(), clock=clock)
        self.host = self.shared.host
        vitals = Vitals.start(self.host)
        """Ticks, histograms, takeovers and lease health: plain numbers the loop and the lease part count
        and ``/metrics`` reads (:mod:`.vitals`)."""
        self.lease = lease_part(self.shared, vitals=vitals, on_stood_down=self._stood_down)
        self.observer = Observer(self.shared, self.lease)
        self.actor = Actor(self.shared, self.lease)
        self.answers = AnswerPart(self.shared, self.lease, self.actor)
        changes = ChangeFeed(config.daemon.sweep_every)
        self.watcher = Watcher(self.shared, changes, on_missed=self._tick_soon)
        self.loop = Loop(self.shared, observer=self.observer, actor=self.actor, answers=self.answers,
                         watcher=self.watcher, lease=self.lease, changes=changes, vitals=vitals,
                         overdue=OverdueQuestions(self.shared, self.actor), on_step=self._rearm)

    # -- life cycle --------------------------------------------------------------------

    def initialize(self, now: datetime | None = None) -> None:
        """Seed the dispatch budget from the ledger, so a restart does not relaunch everything at once."""
        seconds = self.clock.monotonic() if now is None else now.timestamp()
        now = now or self.clock.now()
        self.actor.seed_budget(now, seconds)
        if self.lease is not None:
            self.lease.start()
        config = self.shared.config
        self.log.info("started", state_dir=config.state_dir, tick=config.daemon.tick,
                      launchers=sorted(self.shared.launchers), dry_run=self.shared.dry_run, pid=os.getpid())

    def tick(self, now: datetime | None = None) -> dict[str, int]:
        """One pass of the loop over every task (:meth:`Loop.tick`): what the metronome beats, and ``--once``."""
        return self.loop.tick(now)

    def evaluate(self, task_id: str, now: datetime | None = None) -> None:
        """One look at one task (:meth:`Loop.evaluate`): what the watch worker runs for a poke."""
        self.loop.evaluate(task_id, now)

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop the scheduler and watchers; agents keep running (they are re-adopted on the next start).

        Waits at most ``timeout`` seconds (default :meth:`stop_grace`) for a look in progress
        to finish, never for ever: a thread stuck in a tick must not keep the daemon from
        stopping. Returns False when one is still stuck (the store is then left open to it).
        """
        deadline = time.monotonic() + (self.stop_grace() if timeout is None else timeout)
        self._stop.set()
        self.pokes.wake_all()
        if self.metronome is not None:
            self.metronome.stop()
        if self._scheduler is not None:
            try:
                self._scheduler.shutdown(wait=False)  # a stuck tick is waited for below, bounded
            except Exception:  # the scheduler may already be stopped
                pass
        self.watcher.stop(timeout=min(5.0, deadline - time.monotonic()))
        self.shared.pool.shutdown(wait=False, cancel_futures=True)
        self.shared.gates.close()
        if self.lease is not None:
            self.lease.close()
        lock = self.shared.lock
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self.log.error("shutdown_stuck", pid=os.getpid(),
                           reason="a look is still running after the grace; stopping without it")
            return False
        try:
            self.loop.save_vitals(final=True)  # the last passes' counts, which the cadence may not have written
            self.store.close()
        finally:
            lock.release()
        self.log.info("stopped", pid=os.getpid())
        return True

    def stop_grace(self) -> float:
        """How long a stop may wait for work in flight: the longest ``stop_grace`` of the launchers."""
        return max((lc.stop_grace for lc in self.shared.config.launchers.values()), default=defaults.STOP_GRACE)

    def _stood_down(self) -> None:
        """The lease part's: another daemon with this host id took the host over; stop (agents left to it)."""
        self._stop.set()
        self._signalled.set()

    def reload(self) -> bool:
        """Re-read the config (SIGHUP). An invalid new config is logged and the old one kept."""
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        config = self.shared.config
        try:
            new = load_config(config.path)
        except HeartbeatError as exc:
            self.log.error("reload_failed", error=str(exc), keeping=config.path)
            systemd.notify("READY=1", _refused(str(exc)))
            return False
        if new.state_dir != config.state_dir:
            self.log.error("reload_failed", error="state_dir cannot change on reload; restart the daemon",
                           keeping=config.path)
            systemd.notify("READY=1", _refused("state_dir cannot change on reload; restart the daemon"))
            return False
        old_tick = config.daemon.tick
        # A pass in progress holds the lock (a first pass over a backlog can take seconds on a
        # loaded machine): the valid config is then staged and the next pass starts with it,
        # so a SIGHUP is answered at once instead of after the pass.
        if self.shared.lock.acquire(blocking=False):
            try:
                self.loop.apply_config(new)
            finally:
                self.shared.lock.release()
            staged = False
        else:
            self.loop.stage_config(new)
            staged = True
        if self.metronome is not None and new.daemon.tick != old_tick:
            self.metronome.set_interval(new.daemon.tick)
        self.log.info("reloaded", config=new.path, tick=new.daemon.tick, launchers=sorted(new.launchers),
                      staged=staged)
        systemd.notify("READY=1")
        return True

    def serve(self) -> int:
        """Run until SIGTERM/SIGINT: the scheduler ticks, the watcher reacts, SIGHUP reloads."""
        # Handlers only set flags; the main thread, waiting on ``signalled``, does the work.
        signalled = self._signalled
        foreign = {t.ident for t in threading.enumerate()}  # not ours to wait for at the stop (a host process's)

        def on_term(signum: int, _frame: Any) -> None:
            self._stop.set()
            signalled.set()

        def on_hup(_signum: int, _frame: Any) -> None:
            self._reload.set()
            signalled.set()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)
        if self._early_signals():
            self.shutdown()
            return 0
        config = self.shared.config
        self.loop.vitals_dir = config.state_dir
        self.initialize()
        self.watcher.start()
        stop_page = self._start_page()
        self.relay = relay = self._start_relay()
        worker = threading.Thread(target=self.pokes.run, args=(self.loop.evaluate, self._stop),
                                  name="heartbeat-watch", daemon=True)
        worker.start()
        self.start_scheduler()
        systemd.notify("READY=1", "STATUS=started")
        interval = systemd.watchdog_interval()
        if interval is not None and interval / 2 < config.daemon.tick:
            self.log.warning("watchdog_shorter_than_tick", watchdog_s=interval, tick=config.daemon.tick,
                             hint="set WatchdogSec= to more than twice the tick")
        while not self._stop.is_set():
            # (waits on the monotonic clock) Ticks as frequent as the clock's looks look themselves:
            # this thread then only stands in for a tick that is late (an idle daemon's wake-ups cost).
            often = self.shared.config.daemon.tick <= defaults.CLOCK_CHECK_EVERY
            signalled.wait(timeout=defaults.CLOCK_CHECK_EVERY * (_STAND_IN if often else 1))
            signalled.clear()
            if self.loop.clock.monotonic() - self.loop.steps.checked_at >= defaults.CLOCK_CHECK_EVERY:
                self.loop.check_clock()  # (a tick at least as frequent has just looked: no second look)
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                self.reload()
        systemd.notify("STOPPING=1")
        if stop_page is not None:
            stop_page()
        deadline = time.monotonic() + self.stop_grace()
        if relay is not None:  # its writes under way finish beside the look in progress, by the same deadline
            self._stop_relay(relay)
        clean = self.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        exit_if_stuck(clean, deadline, self.log, foreign=foreign)
        if self.lease is not None and self.lease.stood_down:
            raise StoreError(f"another heartbeat daemon with host id {self.host!r} took this host over on the "
                             "database: this one stopped (its agents are left to that daemon); give each daemon "
                             "its own daemon.host (or $HEARTBEAT_HOST)")
        return 0

    def _early_signals(self) -> bool:
        """Answer what came while ``heartbeat run`` started (:mod:`heartbeat.system.signals`): True for a
        stop (nothing is started), a SIGHUP becomes a reload once the daemon serves."""
        taken = early_signals.take()
        stop = next((sig for sig in taken if sig != signal.SIGHUP), None)
        if stop is not None:
            self.log.info("stop_during_start", signal=signal.Signals(stop).name, pid=os.getpid(),
                          reason="stopping before anything starts")
            return True
        if taken:
            self.log.info("reload_during_start", signal="SIGHUP", reason="the config is re-read once started")
            self._reload.set()
            self._signalled.set()
        return False

    def start_scheduler(self) -> None:
        """Start ticking on the monotonic clock (:class:`~heartbeat.system.clock.Metronome`), and gc and
        lease renewals in APScheduler's threads.

        The tick (and ``WATCHDOG=1`` with it) must go on across wall-clock steps: APScheduler 3
        keeps each job's next run as a wall-clock time and, after the wall clock stepped back an
        hour, would wait that hour. Its jobs are re-armed by :meth:`check_clock` when it sees a step."""
        from apscheduler.schedulers.background import BackgroundScheduler

        config = self.shared.config
        self.metronome = Metronome(self._safe_tick, config.daemon.tick, clock=self.clock)
        self.metronome.start()
        self._scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        now = self._scheduler_now()
        retention = config.retention
        if retention.enabled and not self.shared.dry_run and isinstance(self.store, Archiving):
            self._scheduler.add_job(self._safe_gc, "interval", seconds=retention.every, id="gc",
                                    next_run_time=now + timedelta(seconds=min(retention.every,
                                                                              defaults.GC_FIRST_DELAY_MAX)))
        if self.lease is not None:  # renewals in a job of their own: a long pass must not starve them
            self._scheduler.add_job(self.lease.renew, "interval", seconds=renew_interval(self.shared), id="lease")
            self.lease.start_watch()
        self._scheduler.start()

    def _scheduler_now(self) -> datetime:
        """The machine's wall clock, as APScheduler reads it."""
        return datetime.now(UTC)

    def _rearm(self, step: float) -> None:
        """The loop saw the wall clock step (:meth:`Loop.check_clock`, which logs it): the scheduler's
        jobs are re-armed, the lease renewal runs now, gc one interval from now (the tick needs
        nothing: it beats on the monotonic clock)."""
        scheduler = self._scheduler
        if scheduler is None:
            return
        now = self._scheduler_now()
        try:
            for job in scheduler.get_jobs():
                if job.id == "gc":
                    scheduler.reschedule_job("gc", trigger="interval", seconds=self.shared.config.retention.every)
                else:
                    scheduler.modify_job(job.id, next_run_time=now)
        except Exception as exc:  # stopped meanwhile
            self.log.debug("rearm_skipped", error=repr(exc))

    def _start_relay(self) -> Any:
        """Agents' set/add written here (:mod:`heartbeat.hotpath.relay`), when ``daemon.relay`` is on; on a
        database store also their touch/done/show, through a pool of ``defaults.PG_RELAY_POOL``
        connections of the relay's own (closed with it: :meth:`_stop_relay`)."""
        config = self.shared.config
        if not config.daemon.relay:
            return None
        from heartbeat.daemon.relay import RelayServer
        from heartbeat.store import store_url

        url = "" if self._keeps_files() else store_url(config.store.url)
        shared: Store | None = None
        if url:
            from heartbeat.store.postgres.connection import idle_limit
            from heartbeat.store.postgres.store import PostgresStore

            try:  # never waits on a refusing database: agents then write by themselves, waiting there
                shared = PostgresStore(url, pool_size=defaults.PG_RELAY_POOL, wait=defaults.PG_RELAY_WAIT,
                                       refused_wait=0.0, idle_timeout=idle_limit(config.daemon.lease_ttl))
            except HeartbeatError as exc:
                self.log.error("relay_off", reason=str(exc))
                return None

        vitals, counting = self.loop.vitals, threading.Lock()

        def count(code: int) -> None:
            with counting:  # (the relay answers from several threads)
                vitals.relayed += 1
                vitals.relayed_refused += code != 0

        relay = RelayServer(config.state_dir, lambda: open_daemon_store(config, claim=False), self.log,
                            on_write=count, shared=shared, store_url=url, max_attempts=config.daemon.max_attempts,
                            irreversible=config.irreversible)
        if relay.start():
            self._relay_store = shared
            return relay
        if shared is not None:
            shared.close()
        return None

    def _stop_relay(self, relay: Any) -> None:
        """Stop the relay (its writes under way get the stop grace), then close its database store."""
        relay.stop(wait=self.stop_grace())
        store, self._relay_store = self._relay_store, None
        if store is not None:
            store.close()

    def _start_page(self) -> Callable[[], None] | None:
        """The status page and /metrics in a thread, when ``[http] listen`` is set (the clock runs either
        way): started by the page starter the command line gave (the daemon imports no face)."""
        config = self.shared.config
        if not config.http.listen:
            return None
        if self._page is None:
            self.log.error("http_failed", error="[http] listen is set, but this daemon was built without a page "
                           "to serve (`heartbeat run` gives it one)")
            return None
        return self._page(config, self.loop.vitals, self.log)

    def _tick_soon(self) -> None:
        """The store's change feed may have missed writes: run a pass now rather than at the next tick."""
        if self.metronome is not None:
            self.metronome.soon()

    def _keeps_files(self) -> bool:
        """Whether gc has files to collect: the file store's batons and ledger (logs are gc'd with them)."""
        from heartbeat.store.files import FileStore

        return isinstance(self.store, FileStore)

    def _safe_tick(self) -> None:
        try:
            self.loop.tick()
        except StoreError as exc:
            if self.lease is None:
                self.log.exception("tick_failed", error=repr(exc))
            else:  # a shared store out of reach: the lease part says so once, and once when it is back
                self.lease.unreachable(exc)
        except Exception as exc:  # the clock must keep ticking whatever one pass hit
            self.log.exception("tick_failed", error=repr(exc))

    def _safe_gc(self) -> None:
        """The ``[retention]`` job: in the scheduler's pool beside the tick, never inside it."""
        from heartbeat.ops.retention import run_gc

        try:
            config = self.shared.config
            store = open_daemon_store(config, claim=False)  # its own: the tick's store caches scans, not thread-safe
            try:
                result = run_gc(store, config.retention, now=self.clock.now())
            finally:
                store.close()
            self.log.info("gc", removed_files=len(result.removed_files), removed_bytes=result.removed_bytes,
                          archived=len(result.archived), folded_rows=sum(result.folded.values()),
                          skipped=len(result.skipped), archive=result.archive_file)
        except GcBusy as exc:  # another host's daemon (or `heartbeat gc`) is at it: its run does the work
            self.log.info("gc_skipped", why=str(exc))
        except Exception as exc:  # a failed gc is logged and retried next time; the clock is unaffected
            self.log.exception("gc_failed", error=repr(exc))


def exit_if_stuck(clean: bool, deadline: float, log: Any, *, foreign: Collection[int | None] = ()) -> None:
    """End the process now when a thread is still stuck at ``deadline`` (the interpreter would
    wait for it at exit for ever): SIGTERM stops the daemon within the stop grace, whatever hangs.
    ``foreign``: the idents of the threads alive before ``serve`` began (a process that runs the
    daemon in itself, a test's worker): not the daemon's, never waited for, never a reason to exit."""
    # Every thread the daemon's run started, daemon or not: the interpreter joins the pools' workers at exit.
    def waited(t: threading.Thread) -> bool:
        return t is not threading.current_thread() and t.name != defaults.PG_WATCHDOG_THREAD and t.ident not in foreign

    for thread in threading.enumerate():
        if waited(thread):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threading.enumerate() if waited(t) and t.is_alive()]
    if clean and not stuck:
        return
    from heartbeat.system.commands import kill_running

    killed = kill_running()  # a check or notifier the abandoned threads ran must not outlive us
    log.error("exit_abandoning_threads", threads=stuck, commands_killed=killed, pid=os.getpid())
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def run_from_cli(args: Any, *, page: PageStarter | None = None) -> int:
    """``heartbeat run [--dry-run] [--once]``; ``page`` serves ``[http]`` (the command line gives it)."""
    from heartbeat.config.load import find_config
    from heartbeat.model.errors import ConfigError
    from heartbeat.system.logging import configure

    path = find_config(args.config)
    if path is None:
        raise ConfigError("no config found (tried --config, $HEARTBEAT_CONFIG, ./heartbeat.toml, "
                          "/etc/heartbeat/heartbeat.toml): run `heartbeat init`")
    config = load_config(path)
    try:
        clock = clock_from_env()  # the machine's, unless a test gave it a shifted one
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    lock_fd = hold_daemon_lock(config.state_dir)  # --once and --dry-run too: they dispatch (or decide) as well
    try:
        configure(fmt=config.daemon.log_format, level=config.daemon.log_level)
        if config.daemon.host and not os.environ.get("HEARTBEAT_HOST", "").strip():
            os.environ["HEARTBEAT_HOST"] = config.daemon.host  # the store's claim below is made under this host id
        if args.once:  # one pass answers no SIGHUP: the default handlers are back
            early_signals.release()
        if early_signals.stop_requested() is not None:
            logger().info("stop_during_start", pid=os.getpid(), reason="stopping before anything starts")
            return 0
        # A database down at boot is waited for (logged, SIGTERM still stops us), not an exit.
        store = wait_for_store(lambda: open_daemon_store(config, claim=not args.dry_run, decisions=True), logger())
        if store is None:
            return 0
        daemon = Daemon(config, store=store, dry_run=args.dry_run, clock=clock, page=page)
        if isinstance(clock, OffsetFileClock):
            daemon.log.warning("test_clock", path=clock.path, shift_s=clock.shift,
                               hint=f"{defaults.TEST_CLOCK_ENV} is a test seam: the wall clock is shifted by that file")
        if args.once:
            daemon.initialize()
            daemon.tick()
            daemon.shared.pool.shutdown(wait=True)
            if daemon.lease is not None:  # the host's row marked stopped: the next run takes it at once
                daemon.lease.close()
            daemon.store.close()
            return 0
        return daemon.serve()
    finally:
        os.close(lock_fd)


def hold_daemon_lock(state_dir: str) -> int:
    """Take ``<state_dir>/daemon.lock`` (an flock held until the returned descriptor is closed) or
    raise :class:`DaemonRunning` naming the holder's pid: two clocks on one state dir would both
    dispatch, past ``max_concurrent`` and into each other's tasks."""
    import errno
    import fcntl
    import stat

    from heartbeat.model.errors import DaemonRunning, StoreError, UnsafePath
    from heartbeat.store.files import ensure_private_dir

    ensure_private_dir(state_dir)
    path = StateLayout(state_dir).daemon_lock
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath("is a symbolic link; heartbeat does not follow links in its state dir",
                             path=path) from None
        raise StoreError(f"cannot open the daemon lock: {exc.strerror}", path=path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath("is not a regular file (a FIFO, device or directory)", path=path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            running = DaemonRunning(f"another daemon (pid {holder}) is running on this state dir; "
                                    "one daemon per state dir", path=state_dir)
            running.holder = holder
            raise running from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refused(error: str) -> str:
    """The ``STATUS=`` of a refused reload: the daemon runs on as before, not on the broken file."""
    return f"STATUS=reload refused, running on the config loaded before: {' '.join(error.split())[:400]}"
