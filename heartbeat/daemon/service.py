"""The service shell around the loop: ``heartbeat run``.

:class:`Daemon` adds to :class:`~heartbeat.daemon.core.Core` what a service needs:
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
from datetime import UTC, datetime, timedelta
from typing import Any

from heartbeat import defaults, systemd
from heartbeat.clock import SYSTEM, Clock, Metronome, OffsetFileClock, clock_from_env
from heartbeat.config import Config, load_config
from heartbeat.daemon.boot import wait_for_store
from heartbeat.daemon.core import Core
from heartbeat.daemon.leased import renew_interval
from heartbeat.daemon.shared import logger, open_store
from heartbeat.errors import HeartbeatError, StoreError
from heartbeat.layout import StateLayout
from heartbeat.store.base import Store

__all__ = ["Daemon", "hold_daemon_lock", "logger", "open_store", "run_from_cli"]


class Daemon(Core):
    """The loop as a service: scheduler, watchers, signals, sd_notify, reload. See the module docstring."""

    def __init__(self, config: Config, *, store: Store | None = None, dry_run: bool = False, log: Any = None,
                 clock: Clock = SYSTEM) -> None:
        super().__init__(config, store=store, dry_run=dry_run, log=log, clock=clock)
        self._reload = threading.Event()
        self._scheduler: Any = None
        self.metronome: Metronome | None = None
        """The tick's beat (started by :meth:`start_scheduler`)."""
        self._relay_store: Store | None = None
        """The relay's database store (None: the file store's relay opens one per request)."""

    def _stop_service(self) -> None:
        if self.metronome is not None:
            self.metronome.stop()
        if self._scheduler is not None:
            try:
                self._scheduler.shutdown(wait=False)  # a stuck tick is waited for below, bounded
            except Exception:  # the scheduler may already be stopped
                pass

    def reload(self) -> bool:
        """Re-read the config (SIGHUP). An invalid new config is logged and the old one kept."""
        systemd.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            new = load_config(self.config.path)
        except HeartbeatError as exc:
            self.log.error("reload_failed", error=str(exc), keeping=self.config.path)
            systemd.notify("READY=1")
            return False
        if new.state_dir != self.config.state_dir:
            self.log.error("reload_failed", error="state_dir cannot change on reload; restart the daemon",
                           keeping=self.config.path)
            systemd.notify("READY=1")
            return False
        old_tick = self.config.daemon.tick
        # A pass in progress holds the lock (a first pass over a backlog can take seconds on a
        # loaded machine): the valid config is then staged and the next pass starts with it,
        # so a SIGHUP is answered at once instead of after the pass.
        if self.shared.lock.acquire(blocking=False):
            try:
                self.apply_config(new)
            finally:
                self.shared.lock.release()
            staged = False
        else:
            self._staged_config = new
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
        signalled = threading.Event()

        def on_term(signum: int, _frame: Any) -> None:
            self._stop.set()
            signalled.set()

        def on_hup(_signum: int, _frame: Any) -> None:
            self._reload.set()
            signalled.set()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)
        if self.lease is not None:  # displaced by another daemon with this host id: stop, agents left to it

            def on_stood_down() -> None:
                self._stop.set()
                signalled.set()

            self.lease.on_stood_down = on_stood_down
        self.vitals_dir = self.config.state_dir
        self.initialize()
        self.watcher.start()
        self.watcher.on_missed = self._tick_soon
        web = self._start_web()
        relay = self._start_relay()
        worker = threading.Thread(target=self.watcher.run_worker, name="heartbeat-watch", daemon=True)
        worker.start()
        self.start_scheduler()
        systemd.notify("READY=1", "STATUS=started")
        interval = systemd.watchdog_interval()
        if interval is not None and interval / 2 < self.config.daemon.tick:
            self.log.warning("watchdog_shorter_than_tick", watchdog_s=interval, tick=self.config.daemon.tick,
                             hint="set WatchdogSec= to more than twice the tick")
        while not self._stop.is_set():
            signalled.wait(timeout=defaults.CLOCK_CHECK_EVERY)  # (waits on the monotonic clock)
            signalled.clear()
            self.check_clock()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                self.reload()
        systemd.notify("STOPPING=1")
        if web is not None:
            web.should_exit = True
        deadline = time.monotonic() + self.stop_grace()
        if relay is not None:  # its writes under way finish beside the look in progress, by the same deadline
            self._stop_relay(relay)
        clean = self.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        exit_if_stuck(clean, deadline, self.log)
        if self.lease is not None and self.lease.stood_down:
            raise StoreError(f"another heartbeat daemon with host id {self.host!r} took this host over on the "
                             "database: this one stopped (its agents are left to that daemon); give each daemon "
                             "its own daemon.host (or $HEARTBEAT_HOST)")
        return 0

    def start_scheduler(self) -> None:
        """Start ticking on the monotonic clock (:class:`~heartbeat.clock.Metronome`), and gc and
        lease renewals in APScheduler's threads.

        The tick (and ``WATCHDOG=1`` with it) must go on across wall-clock steps: APScheduler 3
        keeps each job's next run as a wall-clock time and, after the wall clock stepped back an
        hour, would wait that hour. Its jobs are re-armed by :meth:`check_clock` when it sees a step."""
        from apscheduler.schedulers.background import BackgroundScheduler

        self.metronome = Metronome(self._safe_tick, self.config.daemon.tick, clock=self.clock)
        self.metronome.start()
        self._scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        now = self._scheduler_now()
        retention = self.config.retention
        if retention.enabled and not self.dry_run and self._keeps_files():
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

    def check_clock(self) -> float | None:
        """A wall-clock step is logged (:meth:`Core.check_clock`) and the scheduler's jobs re-armed:
        the lease renewal runs now, gc one interval from now (the tick needs nothing: it beats on
        the monotonic clock)."""
        step = super().check_clock()
        scheduler = self._scheduler
        if step is None or scheduler is None:
            return step
        now = self._scheduler_now()
        try:
            for job in scheduler.get_jobs():
                if job.id == "gc":
                    scheduler.reschedule_job("gc", trigger="interval", seconds=self.config.retention.every)
                else:
                    scheduler.modify_job(job.id, next_run_time=now)
        except Exception as exc:  # stopped meanwhile
            self.log.debug("rearm_skipped", error=repr(exc))
        return step

    def _start_relay(self) -> Any:
        """Agents' set/add written here (:mod:`heartbeat.relay`), when ``daemon.relay`` is on; on a
        database store also their touch/done/show, through a pool of ``defaults.PG_RELAY_POOL``
        connections of the relay's own (closed with it: :meth:`_stop_relay`)."""
        if not self.config.daemon.relay:
            return None
        from heartbeat.daemon.relay import RelayServer
        from heartbeat.store import store_url

        url = "" if self._keeps_files() else store_url(self.config.store.url)
        shared: Store | None = None
        if url:
            from heartbeat.store.postgres import PostgresStore

            try:  # never waits on a refusing database: agents then write by themselves, waiting there
                shared = PostgresStore(url, pool_size=defaults.PG_RELAY_POOL, wait=defaults.PG_RELAY_WAIT,
                                       refused_wait=0.0)
            except HeartbeatError as exc:
                self.log.error("relay_off", reason=str(exc))
                return None

        vitals, counting = self.vitals, threading.Lock()

        def count(code: int) -> None:
            with counting:  # (the relay answers from several threads)
                vitals.relayed += 1
                vitals.relayed_refused += code != 0

        relay = RelayServer(self.config.state_dir, lambda: open_store(self.config, claim=False), self.log,
                            on_write=count, shared=shared, store_url=url)
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

    def _start_web(self) -> Any:
        """The status page and /metrics in a thread, when ``[http] listen`` is set (the clock runs either way)."""
        http = self.config.http
        if not http.listen:
            return None
        try:
            from heartbeat import web

            token = http.token or os.environ.get("HEARTBEAT_WEB_TOKEN", "")
            listen = web.parse_listen(http.listen, what="[http] listen").in_dir(self.config.state_dir)
            web.check_exposure(listen, token)
            app = web.build_app(open_store(self.config, claim=False), state_dir=self.config.state_dir, token=token,
                                hosts=web.HostCheck(listen, http.allowed_hosts),
                                max_attempts=self.config.daemon.max_attempts,
                                default_launcher=self.config.daemon.default_launcher, vitals=self.vitals)

            def error(message: str, left_out: int) -> None:
                self.log.error("http_error", error=message, left_out=left_out)

            server, _, url = web.start_in_thread(app, listen, on_error=error)
        except ImportError as exc:
            self.log.error("http_failed", error=f"{exc}: install heartbeat[web] for [http]")
            return None
        except HeartbeatError as exc:
            self.log.error("http_failed", error=str(exc))
            return None
        self.log.info("http_serving", url=url, token=bool(token), pid=os.getpid())
        return server


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
            self.tick()
        except StoreError as exc:
            if self.lease is None:
                self.log.exception("tick_failed", error=repr(exc))
            else:  # a shared store out of reach: the lease part says so once, and once when it is back
                self.lease.unreachable(exc)
        except Exception as exc:  # the clock must keep ticking whatever one pass hit
            self.log.exception("tick_failed", error=repr(exc))

    def _safe_gc(self) -> None:
        """The ``[retention]`` job: in the scheduler's pool beside the tick, never inside it."""
        from heartbeat.retention import run_gc

        try:
            store = open_store(self.config, claim=False)  # its own: the tick's store caches scans, not thread-safe
            try:
                result = run_gc(store, self.config.retention, now=self.clock.now())
            finally:
                store.close()
            self.log.info("gc", removed_files=len(result.removed_files), removed_bytes=result.removed_bytes,
                          archived=len(result.archived), folded_rows=sum(result.folded.values()),
                          skipped=len(result.skipped), archive=result.archive_file)
        except Exception as exc:  # a failed gc is logged and retried next time; the clock is unaffected
            self.log.exception("gc_failed", error=repr(exc))


def exit_if_stuck(clean: bool, deadline: float, log: Any) -> None:
    """End the process now when a thread is still stuck at ``deadline`` (the interpreter would
    wait for it at exit for ever): SIGTERM stops the daemon within the stop grace, whatever hangs."""
    # Every thread, daemon or not: the interpreter joins the pools' workers at exit whatever their flag.
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
    if clean and not stuck:
        return
    from heartbeat.commands import kill_running

    killed = kill_running()  # a check or notifier the abandoned threads ran must not outlive us
    log.error("exit_abandoning_threads", threads=stuck, commands_killed=killed, pid=os.getpid())
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def run_from_cli(args: Any) -> int:
    """``heartbeat run [--dry-run] [--once]``."""
    from heartbeat.config import find_config
    from heartbeat.errors import ConfigError
    from heartbeat.logging import configure

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
        # A database down at boot is waited for (logged, SIGTERM still stops us), not an exit.
        store = wait_for_store(lambda: open_store(config, claim=not args.dry_run, decisions=True), logger())
        if store is None:
            return 0
        daemon = Daemon(config, store=store, dry_run=args.dry_run, clock=clock)
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

    from heartbeat.errors import DaemonRunning, StoreError, UnsafePath
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
