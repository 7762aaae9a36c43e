"""Serving the page: uvicorn on a TCP address or a Unix socket, in its own thread beside the daemon or alone."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from heartbeat.config.shape import Config, Listen, parse_listen
from heartbeat.model import defaults
from heartbeat.model.errors import BadInput, HeartbeatError
from heartbeat.reports.why import policy_for
from heartbeat.web.app import build_app
from heartbeat.web.guard import _TOKEN_ENV, HostCheck, check_exposure
from heartbeat.web.views import _open_line

__all__ = ["DEFAULT_LISTEN", "serve", "start_in_thread", "start_for_daemon", "run_from_cli"]

DEFAULT_LISTEN = defaults.HTTP_LISTEN
"""Where ``heartbeat web`` listens when ``--listen`` is not given: loopback only."""


# -- serving ----------------------------------------------------------------------------------


def _bind(listen: Listen) -> tuple[Any, Callable[[], None]]:
    """A listening socket and what closes it (removing a Unix socket's file if it is still the one
    bound here), or :class:`BadInput` naming the address (in use, not ours, ...)."""
    import socket

    if listen.path:
        return _bind_unix(listen.path)
    host, port = listen.host, listen.port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, port, family if host != "localhost" else socket.AF_UNSPEC,
                                   socket.SOCK_STREAM)
    except OSError as exc:
        raise BadInput(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    fam, _, _, _, addr = infos[0]
    sock = socket.socket(fam, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(defaults.WEB_BACKLOG)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    return sock, sock.close


def _bind_unix(path: str) -> tuple[Any, Callable[[], None]]:
    """A Unix socket at ``path`` that only this user can connect to (created 0600, whatever the umask).

    A socket left at ``path`` by a server that is gone is replaced; one that answers is in use;
    anything else there is refused, untouched.
    """
    import socket

    where = f"cannot listen on unix:{path}"
    if len(os.fsencode(path)) > 107:
        raise BadInput(f"{where}: the path is longer than Linux allows a socket's (107 bytes)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise BadInput(f"{where}: {exc.strerror}") from None
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise BadInput(f"{where}: something that is not a socket is there; heartbeat leaves it alone")
        if st.st_uid != os.geteuid():
            raise BadInput(f"{where}: the socket there belongs to uid {st.st_uid}, not to this user")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # a server that is gone left it
        else:
            raise BadInput(f"{where}: a server is answering there already")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
        sock.listen(defaults.WEB_BACKLOG)
        bound = os.lstat(path)
    except OSError as exc:
        sock.close()
        raise BadInput(f"{where}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)

    def close() -> None:  # (twice is harmless)
        sock.close()
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino):
                os.unlink(path)
        except OSError:
            pass

    return sock, close


class _RateLimited:
    """An event loop's exception handler that passes each kind of error on at most once per
    ``every`` seconds, with the count left out since: ``socket.accept() out of system resource``
    comes thousands of times a second while descriptors are short, and must not flood the log."""

    def __init__(self, report: Callable[[str, int], None], every: float = defaults.WEB_ERROR_LOG_EVERY) -> None:
        self.report = report
        self.every = every
        self.last: dict[str, tuple[float, int]] = {}

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "error")
        exc = context.get("exception")
        key = f"{message}: {type(exc).__name__}" if exc is not None else message
        now = time.monotonic()
        last, left_out = self.last.get(key, (float("-inf"), 0))
        if now - last < self.every:
            self.last[key] = (last, left_out + 1)
            return
        self.last[key] = (now, 0)
        self.report(f"{message}: {exc}" if exc is not None else message, left_out)


def _server(app: Any, on_error: Callable[[str, int], None], on_stop: Callable[[], None]) -> Any:
    """A uvicorn server for ``app`` whose connections and error log are bounded (see :func:`_bounded_h11`);
    ``on_stop`` runs once it has shut down (uvicorn then re-raises a SIGTERM it caught: no ``finally``
    after ``run`` would)."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        async def serve(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(_RateLimited(on_error))
            await super().serve(sockets)

        async def shutdown(self, sockets: Any = None) -> None:
            try:
                await super().shutdown(sockets)
            finally:
                on_stop()

    # No access log: a ?token= in a URL must not land in the journal.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", server_header=False,
                            proxy_headers=False, timeout_graceful_shutdown=2, http=_bounded_h11(),
                            backlog=defaults.WEB_BACKLOG)
    return Server(config)


def _bounded_h11() -> type:
    """uvicorn's h11 protocol, bounded: at most :data:`~heartbeat.model.defaults.WEB_MAX_CONNECTIONS`
    connections (one more is closed as it is accepted) and :data:`~heartbeat.model.defaults.WEB_REQUEST_TIMEOUT`
    seconds for each request to arrive (uvicorn's keep-alive timeout starts only after a response,
    so a client that never sends one would hold its descriptor for ever). ``limit_concurrency`` is
    no bound here: it answers 503 to requests, and an idle connection sends none."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        _request_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > defaults.WEB_MAX_CONNECTIONS:
                transport.abort()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
            self._request_timer = self.loop.call_later(defaults.WEB_REQUEST_TIMEOUT, self._request_late)

        def _request_late(self) -> None:
            # No request under way (none came, or the last one was answered): close; one in flight finishes.
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.abort()

    return BoundedH11


def serve(app: Any, listen: Listen, *, on_ready: Callable[[str], None] | None = None,
          on_error: Callable[[str, int], None]) -> None:
    """Serve ``app`` until SIGINT/SIGTERM (uvicorn's own handlers)."""
    sock, close = _bind(listen)
    try:
        server = _server(app, on_error, close)
        if on_ready is not None:
            on_ready(_url(sock))
        server.run(sockets=[sock])
    finally:
        close()


def start_in_thread(app: Any, listen: Listen, *, on_error: Callable[[str, int], None]
                    ) -> tuple[Any, threading.Thread, str]:
    """Serve ``app`` from a daemon thread (inside ``heartbeat run``); set ``server.should_exit`` to stop."""
    sock, close = _bind(listen)
    server = _server(app, on_error, close)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            close()

    thread = threading.Thread(target=run, name="heartbeat-web", daemon=True)
    thread.start()
    return server, thread, _url(sock)


def _url(sock: Any) -> str:
    import socket

    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def start_for_daemon(config: Config, vitals: Any, log: Any) -> Callable[[], None] | None:
    """The page and /metrics inside ``heartbeat run`` (``[http] listen``), served from a thread: a
    function that stops it, or None when it did not start (logged as ``http_failed``: the clock runs
    either way). The command line hands it to the daemon
    (:class:`heartbeat.daemon.service.PageStarter`), which imports no face."""
    from heartbeat.daemon.shared import open_daemon_store

    http = config.http
    try:
        token = http.token or os.environ.get(_TOKEN_ENV, "")
        listen = parse_listen(http.listen, what="[http] listen").in_dir(config.state_dir)
        check_exposure(listen, token)
        app = build_app(open_daemon_store(config, claim=False), state_dir=config.state_dir, token=token,
                        hosts=HostCheck(listen, http.allowed_hosts), max_attempts=config.daemon.max_attempts,
                        default_launcher=config.daemon.default_launcher, vitals=vitals, policy=policy_for(config))

        def error(message: str, left_out: int) -> None:
            log.error("http_error", error=message, left_out=left_out)

        server, _, url = start_in_thread(app, listen, on_error=error)
    except ImportError as exc:
        from heartbeat.system.extras import Extra, install_hint

        log.error("http_failed", error=f"{exc}: [http] needs the web extra: {install_hint(Extra.WEB)}")
        return None
    except HeartbeatError as exc:
        log.error("http_failed", error=str(exc))
        return None
    log.info("http_serving", url=url, token=bool(token), pid=os.getpid())

    def stop() -> None:
        server.should_exit = True

    return stop


def run_from_cli(args: Any) -> int:
    """``heartbeat web [--listen HOST:PORT|unix:PATH] [--token T] [--allow-host NAME]...``."""
    import sys

    from heartbeat.web.metrics import open_state, require_extra

    require_extra("starlette", "uvicorn", "jinja2", "prometheus_client")
    token = args.token if args.token is not None else os.environ.get(_TOKEN_ENV, "")
    listen = parse_listen(args.listen or DEFAULT_LISTEN)
    check_exposure(listen, token)
    state = open_state(args)
    store, state_dir = state.store, state.state_dir
    listen = listen.in_dir(state_dir)
    hosts = HostCheck(listen, [*state.allowed_hosts, *(args.allow_host or ())])
    app = build_app(store, state_dir=state_dir, token=token, hosts=hosts, max_attempts=state.max_attempts,
                    default_launcher=state.default_launcher, policy=state.policy)

    def ready(url: str) -> None:
        print(f"heartbeat web: serving {state_dir} at {url} (writes only answers{', token required' if token else ''})"
              f"{_open_line(url, token, sys.stderr.isatty())}", file=sys.stderr, flush=True)

    def error(message: str, left_out: int) -> None:
        more = f" (and {left_out} more like it since)" if left_out else ""
        print(f"heartbeat web: {message}{more}", file=sys.stderr, flush=True)

    try:
        serve(app, listen, on_ready=ready, on_error=error)
    finally:
        store.close()
    return 0
