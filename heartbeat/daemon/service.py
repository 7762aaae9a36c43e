"""The service shell around the loop: ``heartbeat run``.

:class:`Daemon` adds to :class:`~heartbeat.daemon.core.Core` what a service needs:
APScheduler ticking every ``tick`` (coalesced, one instance at a time), the watchers
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
from datetime import datetime, timedelta
from typing import Any

from heartbeat import defaults, systemd
from heartbeat.config import Config, load_config
from heartbeat.daemon.core import Core
from heartbeat.daemon.leased import renew_interval
from heartbeat.errors import HeartbeatError, StoreError
from heartbeat.layout import StateLayout
from heartbeat.liveness import this_host
from heartbeat.store.base import Store
from heartbeat.timeparse import utcnow

__all__ = ["Daemon", "hold_daemon_lock", "logger", "open_store", "run_from_cli"]


class Daemon(Core):
    """The loop as a service: scheduler, watchers, signals, sd_notify, reload. See the module docstring."""

    def __init__(self, config: Config, *, store: Store | None = None, dry_run: bool = False, log: Any = None) -> None:
        super().__init__(config, store=store, dry_run=dry_run, log=log)
        self._reload = threading.Event()
        self._scheduler: Any = None

    def _stop_service(self) -> None:
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
        if self._scheduler is not None and new.daemon.tick != old_tick:
            self._scheduler.reschedule_job("tick", trigger="interval", seconds=new.daemon.tick)
        self.log.info("reloaded", config=new.path, tick=new.daemon.tick, launchers=sorted(new.launchers),
                      staged=staged)
        systemd.notify("READY=1")
        return True

    def serve(self) -> int:
        """Run until SIGTERM/SIGINT: the scheduler ticks, the watcher reacts, SIGHUP reloads."""
        from apscheduler.schedulers.background import BackgroundScheduler

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
        self.vitals_dir = self.config.state_dir
        self.initialize()
        self.watcher.start()
        self.watcher.on_missed = self._tick_soon
        web = self._start_web()
        relay = self._start_relay()
        worker = threading.Thread(target=self.watcher.run_worker, name="heartbeat-watch", daemon=True)
        worker.start()
        self._scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self._scheduler.add_job(self._safe_tick, "interval", seconds=self.config.daemon.tick, id="tick",
                                next_run_time=datetime.now().astimezone())
        retention = self.config.retention
        if retention.enabled and not self.dry_run and self._keeps_files():
            self._scheduler.add_job(self._safe_gc, "interval", seconds=retention.every, id="gc",
                                    next_run_time=datetime.now().astimezone() + timedelta(
                                        seconds=min(retention.every, defaults.GC_FIRST_DELAY_MAX)))
        if self.lease is not None:  # renewals in a job of their own: a long pass must not starve them
            self._scheduler.add_job(self.lease.renew, "interval", seconds=renew_interval(self.shared), id="lease")
            self.lease.start_watch()
        systemd.notify("READY=1", "STATUS=started")
        self._scheduler.start()
        interval = systemd.watchdog_interval()
        if interval is not None and interval / 2 < self.config.daemon.tick:
            self.log.warning("watchdog_shorter_than_tick", watchdog_s=interval, tick=self.config.daemon.tick,
                             hint="set WatchdogSec= to more than twice the tick")
        while not self._stop.is_set():
            signalled.wait(timeout=5.0)
            signalled.clear()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                self.reload()
        systemd.notify("STOPPING=1")
        if web is not None:
            web.should_exit = True
        deadline = time.monotonic() + self.stop_grace()
        if relay is not None:  # its writes under way finish beside the look in progress, by the same deadline
            relay.stop(wait=self.stop_grace())
        clean = self.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        exit_if_stuck(clean, deadline, self.log)
        return 0

    def _start_relay(self) -> Any:
        """Agents' set/add written here (:mod:`heartbeat.relay`), when ``daemon.relay`` is on (file store)."""
        if not self.config.daemon.relay or not self._keeps_files():
            return None
        from heartbeat.daemon.relay import RelayServer

        vitals, counting = self.vitals, threading.Lock()

        def count(code: int) -> None:
            with counting:  # (the relay answers from several threads)
                vitals.relayed += 1
                vitals.relayed_refused += code != 0

        relay = RelayServer(self.config.state_dir, lambda: open_store(self.config, claim=False), self.log,
                            on_write=count)
        return relay if relay.start() else None

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
        if self._scheduler is not None:
            try:
                self._scheduler.modify_job("tick", next_run_time=datetime.now().astimezone())
            except Exception:  # stopped meanwhile
                pass

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
                result = run_gc(store, self.config.retention, now=utcnow())
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


def open_store(config: Config, *, claim: bool = True, decisions: bool = False) -> Store:
    """The configured store; a database store also claims the database for this daemon (``claim``).
    ``decisions``: the loop's own store, whose scans keep only what decisions read of each baton
    (:func:`heartbeat.baton.decision_view`: a 10,000-baton state dir in far less memory)."""
    from heartbeat.baton import decision_view
    from heartbeat.store import URL_ENV, store_url
    from heartbeat.store import open_store as open_any

    url = store_url(config.store.url)
    store = open_any(config.state_dir, url, scan_view=decision_view if decisions else None)
    if url:
        from heartbeat.store.files import ensure_private_dir

        os.environ[URL_ENV] = url  # the launchers pass it on: agents write to the same database
        ensure_private_dir(config.state_dir)  # agents' logs, the daemon lock and the vitals still live there
        claim_daemon = getattr(store, "claim_daemon", None)
        if claim and claim_daemon is not None:
            try:
                claim_daemon(this_host())  # one daemon per host id; other hosts share it through leases
            except BaseException:
                store.close()
                raise
    return store


def logger() -> Any:
    from heartbeat.logging import get_logger

    return get_logger("heartbeat.daemon")


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
    lock_fd = hold_daemon_lock(config.state_dir)  # --once and --dry-run too: they dispatch (or decide) as well
    try:
        configure(fmt=config.daemon.log_format, level=config.daemon.log_level)
        from heartbeat.daemon.boot import wait_for_store

        if config.daemon.host and not os.environ.get("HEARTBEAT_HOST", "").strip():
            os.environ["HEARTBEAT_HOST"] = config.daemon.host  # the store's claim below is made under this host id
        # A database down at boot is waited for (logged, SIGTERM still stops us), not an exit.
        store = wait_for_store(lambda: open_store(config, claim=not args.dry_run, decisions=True), logger())
        if store is None:
            return 0
        daemon = Daemon(config, store=store, dry_run=args.dry_run)
        if args.once:
            daemon.initialize()
            daemon.tick()
            daemon.shared.pool.shutdown(wait=True)
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
            raise DaemonRunning(f"another daemon (pid {holder}) is running on this state dir; "
                                "one daemon per state dir", path=state_dir) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
