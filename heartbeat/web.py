"""The status page: ``heartbeat web`` (and ``[http] listen`` inside ``heartbeat run``).

Read-only, server-rendered HTML on Starlette (routing, requests, responses) served by
uvicorn, pages from Jinja2 templates with autoescaping on for every value: batons,
ledger data and agent logs are hostile input, and a step holding ``<script>`` renders
as text. A strict Content-Security-Policy (inline style and the one auto-refresh
script allowed by a per-response nonce) is the second line behind the escaping.

- ``/``: every task (status, age, step, attempt/epoch, owner, block and gate, last exit),
  filterable with ``?status=``, with counts per status;
- ``/tasks/ID``: the baton, the brief the next agent would read, the timeline of the
  task's ledger events and the tail of the current agent's log;
- ``/report``: the handoff report, worst tasks first;
- ``/metrics``: Prometheus metrics (see :mod:`heartbeat.metrics`).

Who may ask: on TCP every request must carry the token (``Authorization: Bearer T`` or
``?token=T``, compared in constant time), loopback included, since every local user can
connect to a port; without a token the server serves only a Unix socket (``unix:PATH``,
created 0600: this user and root). A ``Host`` header naming neither the listen address
nor a configured name is refused (421), so a DNS-rebinding page reads nothing. Only GET
and HEAD are served (any other method: 405). Connections are bounded in number and in
the time a request may take to arrive, so a flood cannot take the descriptors the
daemon's clock needs when the server runs inside ``heartbeat run``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from heartbeat import defaults
from heartbeat.baton import Baton, Status, check_id, dump_baton
from heartbeat.config import Config, Listen, parse_listen
from heartbeat.errors import BadInput, HeartbeatError, NotFound
from heartbeat.layout import LOGS_DIR, StateLayout, log_name
from heartbeat.ledger import Event, EventKind
from heartbeat.policy import Policy, waiting_text
from heartbeat.timeparse import format_duration, utcnow
from heartbeat.why import State, policy_for, why

__all__ = ["DEFAULT_LISTEN", "LOG_TAIL_BYTES", "TIMELINE_EVENTS", "Listen", "HostCheck", "LogTail", "parse_listen",
           "is_loopback", "check_exposure", "read_log_tail", "build_app", "serve", "start_in_thread", "start_for_daemon",
           "run_from_cli"]

DEFAULT_LISTEN = defaults.HTTP_LISTEN
"""Where ``heartbeat web`` listens when ``--listen`` is not given: loopback only."""

LOG_TAIL_BYTES = 64 * 1024
"""How much of the end of an agent's log the task page shows."""

TIMELINE_EVENTS = 500
"""The most recent ledger events the task page lists."""

_ROUTINE_KINDS = frozenset({EventKind.TOUCHED, EventKind.UPDATED})
"""Left out of a task's timeline unless ``?all=1``: the agent's own progress writes, which the baton shows."""

_STATUS_ORDER = ("escalated", "invalid", "blocked", "active", "paused", "snoozed", "failed", "done")
_TOKEN_ENV = "HEARTBEAT_WEB_TOKEN"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- listening: where, and who may ask ----------------------------------------------------


def is_loopback(host: str) -> bool:
    """Only a loopback address (or ``localhost``) keeps the page on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere


def check_exposure(listen: Listen, token: str) -> None:
    """Refuse to serve TCP without a token: every local user can connect to a port, loopback too.

    A Unix socket is created 0600 (:func:`_bind_unix`): only this user (and root) can connect.
    """
    if not listen.path and not token:
        raise BadInput(f"refusing to serve {listen} without a token (any local user can connect to a TCP port, "
                       f"loopback too): set --token, ${_TOKEN_ENV} or [http] token, or listen on unix:PATH")


def _strip_port(header: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``1.2.3.4``, ``[::1]``, each with an optional ``:port``),
    lowercased, without the port and a trailing dot; None when it is not one of those shapes."""
    value = header.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket:
            return None
    else:
        name, bracket, rest = value.partition(":")
        rest = bracket + rest
    if rest and not (rest[0] == ":" and rest[1:].isdigit()):
        return None
    return name.rstrip(".") or None


def _is_unspecified(host: str) -> bool:
    """``0.0.0.0`` or ``::``: listening on every address of the machine."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


class HostCheck:
    """Which ``Host`` headers this server answers: a DNS-rebinding page sends its own name.

    An address literal cannot be rebound; a name can. Served: the listen address itself, any
    address literal when listening on a wildcard address, ``localhost`` (and the loopback
    literals) when listening on loopback, a wildcard or a Unix socket, and the names of
    ``[http] allowed_hosts`` (``--allow-host``). The port is not compared: a rebinding page
    already uses the right one.
    """

    def __init__(self, listen: Listen, names: Iterable[str] = ()) -> None:
        self.names: set[str] = set()
        self.addresses: set[Any] = set()
        self.any_address = _is_unspecified(listen.host)
        for name in (*names, listen.host):
            # As a Host header spells it ("name", "name:8443", "[::1]"), a bare IPv6 address bracketed.
            bare_v6 = name.count(":") > 1 and not name.startswith("[")
            self._add(_strip_port(f"[{name}]" if bare_v6 else name))
        if listen.path or is_loopback(listen.host) or self.any_address:
            self.names.add("localhost")
            self.addresses.update((ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")))

    def _add(self, host: str | None) -> None:
        if not host:
            return
        try:
            self.addresses.add(ipaddress.ip_address(host))
        except ValueError:
            self.names.add(host)

    def allows(self, header: str) -> bool:
        host = _strip_port(header)
        if host is None:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names
        return self.any_address or address in self.addresses


# -- the agent's log, read as hostile input ------------------------------------------------


@dataclass
class LogTail:
    """The end of an agent's log, or why there is none to show."""

    path: str
    text: str = ""
    size: int = 0
    truncated: bool = False
    problem: str = ""


def read_log_tail(state_dir: str, task_id: str, epoch: int, limit: int = LOG_TAIL_BYTES) -> LogTail:
    """The last ``limit`` bytes of ``<state_dir>/logs/<task>/<epoch>.log``.

    The agent owns that file, and could have put anything in its place: no component
    of the path is followed if it is a symlink (``O_NOFOLLOW`` at each step, relative
    to the directory before it), the file is opened ``O_NONBLOCK`` (a FIFO can never
    hang the page) and read only when ``fstat`` says it is a regular file, and the read
    is bounded whatever the file's size.
    """
    check_id(task_id)
    tail = LogTail(path=StateLayout(state_dir).log(task_id, epoch))
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in (LOGS_DIR, task_id):
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
            fd = os.open(log_name(epoch), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1])
            fds.append(fd)
        except FileNotFoundError:
            tail.problem = "no log yet"
            return tail
        except OSError as exc:
            tail.problem = f"not shown: {exc.strerror or exc} (a symlink or not a directory is never followed)"
            return tail
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            tail.problem = "not shown: not a regular file"
            return tail
        tail.size = st.st_size
        start = max(0, st.st_size - limit)
        data = os.pread(fd, limit, start)
        if start > 0:
            tail.truncated = True
            newline = data.find(b"\n")
            if 0 <= newline < len(data) - 1:
                data = data[newline + 1:]  # begin at a whole line
        tail.text = data.decode("utf-8", errors="replace")
        return tail
    except OSError as exc:
        tail.problem = f"not shown: {exc.strerror or exc}"
        return tail
    finally:
        for opened in reversed(fds):
            os.close(opened)


# -- what the pages show --------------------------------------------------------------------


def _age(now: datetime, then: datetime | None) -> str:
    return "-" if then is None else format_duration(max(0.0, (now - then).total_seconds()))


def _owner_text(baton: Baton) -> str:
    owner = baton.meta.owner
    if owner is None:
        return ""
    parts = [f"pid {owner.pid}" if owner.pid is not None else "pid pending"]
    if owner.host:
        parts.append(f"on {owner.host}")
    if owner.launcher:
        parts.append(f"via {owner.launcher}")
    if owner.unit:
        parts.append(f"unit {owner.unit}")
    if owner.how:
        parts.append(f"({owner.how})")
    return " ".join(parts)


def _gate_text(baton: Baton) -> str:
    gate = baton.meta.gate
    if gate is None:
        return ""
    return f"{gate.kind.value}:{gate.target}" if gate.target else gate.kind.value


def _last_exit(baton: Baton) -> str:
    meta = baton.meta
    code = f"exit {meta.last_exit}" if meta.last_exit is not None else ""
    if meta.last_failure:
        return meta.last_failure if not code or code in meta.last_failure else f"{code}; {meta.last_failure}"
    return code


def _state_since(baton: Baton) -> datetime | None:
    """When the task entered its current state, as far as the baton tells."""
    meta = baton.meta
    if meta.status is Status.BLOCKED and meta.blocked_at is not None:
        return meta.blocked_at
    if meta.status in (Status.DONE, Status.FAILED) and meta.ended_at is not None:
        return meta.ended_at
    if meta.status is Status.ACTIVE and meta.owner is not None and meta.dispatched_at is not None:
        return meta.dispatched_at
    return meta.updated_at or meta.created_at


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else ""


def _row(entry: Any, now: datetime, default_launcher: str, policy: Any = None,
         status_of: Callable[[str], Status | None] | None = None) -> dict[str, Any]:
    baton: Baton | None = entry.baton
    if baton is None:
        return {"id": entry.id, "status": "invalid", "error": str(entry.error), "age": "-", "step": "",
                "attempt": "", "epoch": "", "owner": "", "blocked_on": "", "gate": "", "last_exit": "",
                "launcher": "", "waiting": "", "title": "", "since": "", "since_at": "", "wake_at": "", "reason": "",
                "badge": "invalid", "state": "invalid", "why": ""}
    meta = baton.meta
    since = _state_since(baton)
    held = why(baton, now, policy or Policy(), status_of)
    # An active task's badge says how it is doing: a launch failing or a retry backing off is not
    # "active" at a glance (as supervisord's BACKOFF/FATAL, systemd's auto-restart).
    badge = held.state.value if meta.status is Status.ACTIVE and held.state in _BADGED else meta.status.value
    return {
        "id": entry.id,
        "status": meta.status.value,
        "badge": badge,
        "state": held.state.value,
        "why": held.text if meta.status is Status.ACTIVE else "",
        "error": "",
        "title": baton.task,
        "since": _age(now, since),
        "since_at": _iso(since),
        "wake_at": _iso(meta.snooze_until) if meta.status is Status.SNOOZED else "",
        "reason": "",
        "age": _age(now, meta.touched_at or meta.updated_at),
        "step": baton.step,
        "next_step": baton.next_step,
        "attempt": meta.attempt,
        "epoch": meta.epoch,
        "owner": _owner_text(baton),
        "owner_host": meta.owner.host if meta.owner is not None else "",
        "blocked_on": baton.blocked_on,
        "gate": _gate_text(baton),
        "last_exit": _last_exit(baton),
        "launcher": baton.launcher or default_launcher,
        "waiting": waiting_text(baton, now),
    }


def _hosts_of(store: Any) -> dict[str, str]:
    """Task id -> the host holding its lease on a shared store (empty when it cannot be read)."""
    from heartbeat.lease import lease_rows

    try:
        return {task_id: row.host for task_id, row in lease_rows(store).items()}
    except HeartbeatError:
        return {}


def _daemon_alive(vitals: Any) -> bool:
    """Whether the daemon that wrote ``vitals`` still runs: its pid alive and started when it said
    (a reused pid is not it). Another host's daemon cannot be seen from here: counted alive."""
    from heartbeat.liveness import this_host

    if vitals.host and vitals.host != this_host():
        return True
    try:
        import psutil

        started = psutil.Process(vitals.pid).create_time()
    except (psutil.Error, ValueError, OSError):
        return False
    return abs(started - vitals.started_at) < 30


_BADGED = frozenset({State.LAUNCH_FAILING, State.BACKING_OFF, State.ESCALATING, State.RATE_LIMITED,
                     State.WAITING_UPSTREAM})
"""The states of an active task its badge names instead of "active"."""


def _status_of(entry: Any) -> str:
    return entry.baton.meta.status.value if entry.baton is not None else "invalid"


def _matches(entry: Any, query: str) -> bool:
    """``?q=``: a case-insensitive substring of the task's id, title, step or block."""
    if not query:
        return True
    needle = query.casefold()
    baton: Baton | None = entry.baton
    fields = [entry.id] if baton is None else [entry.id, baton.task, baton.step, baton.blocked_on]
    return any(needle in f.casefold() for f in fields)


def _list_params(params: Any) -> tuple[str, int, int]:
    """``?q=``, ``?page=`` and ``?per=`` of the task list, checked: (query, page, per page)."""
    query = params.get("q", "").strip()
    if len(query) > defaults.WEB_QUERY_MAX:
        raise BadInput(f"q is {len(query)} characters: at most {defaults.WEB_QUERY_MAX}")
    numbers = {}
    for name, default, most in (("page", 1, 10**9), ("per", defaults.WEB_PAGE_SIZE, defaults.WEB_PAGE_MAX)):
        raw = params.get(name, "")
        try:
            value = int(raw) if raw else default
        except ValueError:
            raise BadInput(f"{name} {raw[:40]!r}: expected a whole number") from None
        if not 1 <= value <= most:
            raise BadInput(f"{name} {value}: expected 1 to {most}")
        numbers[name] = value
    return query, numbers["page"], numbers["per"]


_SUMMARY_KEYS: dict[str, tuple[str, ...]] = {
    EventKind.DISPATCHED: ("launcher", "attempt", "reason", "resume"),
    EventKind.EXITED: ("kind", "code", "signal", "duration_s", "progress", "pid"),
    EventKind.STALLED: ("why",),
    EventKind.RATE_LIMITED: ("until", "source", "hits", "reason"),
    EventKind.BLOCKED: ("on", "gate"),
    EventKind.UNBLOCKED: ("by", "note", "gate"),
    EventKind.ESCALATED: ("reason",),
    EventKind.BYPASS: ("was", "on"),
}


def _event_row(event: Event) -> dict[str, Any]:
    """One timeline line: the event's kind, when, who, and its data as ``key=value`` (hashes elided)."""
    data = dict(event.data)
    first = [k for k in _SUMMARY_KEYS.get(event.kind, ()) if k in data]
    rest = sorted(k for k in data if k not in first)
    details = []
    for key in (*first, *rest):
        value = data[key]
        if value in ("", None, [], {}):
            continue
        if key == "world" and isinstance(value, dict):
            value = f"<{len(value)} fingerprints>"
        elif key == "duration_s" and isinstance(value, int | float):
            value = format_duration(float(value))
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        details.append((key, value if isinstance(value, str) else str(value)))
    seam = event.kind in (EventKind.STALLED, EventKind.EXITED, EventKind.DISPATCHED, EventKind.CLAIMED,
                          EventKind.RELEASED, EventKind.SESSION_STARTED, EventKind.COMPACTING, EventKind.SESSION_ENDED)
    alarm = event.kind in (EventKind.ESCALATED, EventKind.BYPASS, EventKind.SPINNING, EventKind.INVALID)
    return {"ts": event.ts.strftime("%Y-%m-%d %H:%M:%S"), "kind": event.kind, "epoch": event.epoch,
            "revision": event.revision, "actor": event.actor, "details": details,
            "tone": "alarm" if alarm else ("seam" if seam else "")}


# -- the application -------------------------------------------------------------------------


class _Guard:
    """ASGI middleware, before anything else runs: the Host header (:class:`HostCheck`), only
    GET/HEAD, and the token when one is set."""

    def __init__(self, app: ASGIApp, token: str, hosts: HostCheck | None) -> None:
        self.app = app
        self.token = token.encode()
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        host = request.headers.get("host", "")
        if self.hosts is not None and not self.hosts.allows(host):
            # 421 Misdirected Request: a page served under another name (DNS rebinding) reads nothing.
            shown = host.encode("ascii", "backslashreplace").decode()[:100]
            response = PlainTextResponse(f"host {shown!r} is not served here: add it to [http] allowed_hosts "
                                         "(heartbeat web --allow-host)\n", 421)
        elif scope["method"] not in ("GET", "HEAD"):
            response = PlainTextResponse("read-only: this server answers GET and HEAD only\n", 405,
                                         headers={"Allow": "GET, HEAD"})
        elif self.token and not self._authorized(request):
            response = PlainTextResponse("a token is required: Authorization: Bearer TOKEN, or ?token=TOKEN\n", 401,
                                         headers={"WWW-Authenticate": 'Bearer realm="heartbeat"'})
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _authorized(self, request: Any) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        candidate = given.strip() if scheme.lower() == "bearer" else request.query_params.get("token", "")
        # compare_digest on bytes of any length is constant-time in the length of the secret.
        return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), self.token)


def _templates() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("heartbeat", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["duration"] = lambda seconds: format_duration(float(seconds))
    return env


def build_app(store: Any, *, state_dir: str, token: str = "", hosts: HostCheck | None = None,
              max_attempts: int = defaults.MAX_ATTEMPTS, default_launcher: str = defaults.DEFAULT_LAUNCHER,
              vitals: Any = None, policy: Any = None) -> Any:
    """The ASGI application over ``store`` (read-only). ``hosts``: the Host headers answered (None:
    any, for an app mounted behind something that checks them); ``vitals``: the daemon's own, when
    in-process."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, Response
    from starlette.routing import Route

    from heartbeat.brief import render_brief
    from heartbeat.metrics import HeartbeatCollector, Vitals, exposition, make_registry
    from heartbeat.report import build_report

    env = _templates()
    from heartbeat.lease import for_store

    fleet = for_store(store)
    """A store shared by many hosts: the list has a HOST column."""
    if policy is None:
        from heartbeat.policy import Policy

        policy = Policy(max_attempts=max_attempts)
    registry = make_registry(HeartbeatCollector(store, state_dir=state_dir, default_launcher=default_launcher,
                                                vitals=vitals, policy=policy))

    def link(request: Request, path: str, **params: str) -> str:
        """A URL on this server, carrying ``?token=`` along when the page was opened with one."""
        query = {k: v for k, v in params.items() if v}
        if token and "token" in request.query_params:
            query["token"] = request.query_params["token"]
        return f"{path}?{urlencode(query)}" if query else path

    def daemon_line(now: datetime) -> tuple[str, str]:
        current = vitals if vitals is not None else Vitals.load(state_dir)
        if current is None or current.last_tick_at is None:
            return "no daemon has ticked in this state dir", "alarm"
        ago = max(0.0, now.timestamp() - current.last_tick_at)
        if vitals is None and not _daemon_alive(current):  # the file of a daemon that is gone
            return f"daemon not running (stopped {format_duration(ago)} ago)", "alarm"
        return f"daemon pid {current.pid} last ticked {format_duration(ago)} ago", ("alarm" if ago > 300 else "")

    def page(request: Request, template: str, status_code: int = 200, *, refresh: bool = True,
             **context: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        now = utcnow()
        daemon, daemon_tone = daemon_line(now)
        html = env.get_template(template).render(
            request=request, link=lambda path, **p: link(request, path, **p), nonce=nonce, now=now.isoformat(
                timespec="seconds"), state_dir=state_dir, daemon=daemon, daemon_tone=daemon_tone,
            refresh_ms=defaults.WEB_REFRESH_SECONDS * 1000 if refresh else 0, **context)
        headers = {
            "Content-Security-Policy": (f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
                                        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                        "form-action 'self'; frame-ancestors 'none'"),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        }
        return HTMLResponse(html, status_code=status_code, headers=headers)

    def index(request: Request) -> HTMLResponse:
        params = request.query_params
        wanted = params.get("status", "")
        known = {s.value for s in Status}
        if wanted and wanted not in known:
            return page(request, "error.html", 400, title="unknown status",
                        message=f"unknown status {wanted!r}: one of {', '.join(_STATUS_ORDER)}")
        try:
            query, page_no, per = _list_params(params)
        except BadInput as exc:
            return page(request, "error.html", 400, title="bad query", message=exc.message)
        now = utcnow()
        entries = store.scan()
        counts = {s: 0 for s in _STATUS_ORDER}
        for entry in entries:
            status = entry.baton.meta.status.value if entry.baton is not None else "invalid"
            counts[status] = counts.get(status, 0) + 1
        rank = {s: i for i, s in enumerate(_STATUS_ORDER)}
        matched = [e for e in entries if (not wanted or _status_of(e) == wanted) and _matches(e, query)]
        matched.sort(key=lambda e: (rank.get(_status_of(e), len(rank)), e.id))
        pages = max(1, -(-len(matched) // per))
        page_no = min(page_no, pages)
        statuses = {e.id: e.baton.meta.status for e in entries if e.baton is not None}
        shown = [_row(e, now, default_launcher, policy, statuses.get)
                 for e in matched[(page_no - 1) * per:page_no * per]]
        hosts = _hosts_of(store) if fleet else {}
        for row in shown:  # the host holding each task (a fleet's), as `heartbeat status` shows it
            row["host"] = hosts.get(row["id"], "") or row.get("owner_host", "")
        for row in shown:  # only this page's escalations are read from the ledger
            if row["status"] == Status.ESCALATED.value:
                found = store.ledger.events(row["id"], kinds=[EventKind.ESCALATED])
                if found:
                    row["reason"] = str(found[-1].data.get("reason", ""))
                    row["since"], row["since_at"] = _age(now, found[-1].ts), _iso(found[-1].ts)
        keep = {"status": wanted, "q": query, "per": str(per) if per != defaults.WEB_PAGE_SIZE else ""}
        return page(request, "index.html", title="tasks", rows=shown, counts=counts, total=len(entries), fleet=fleet,
                    wanted=wanted, query=query, matched=len(matched), page_no=page_no, pages=pages, per=per,
                    first=(page_no - 1) * per + 1 if shown else 0, last=(page_no - 1) * per + len(shown),
                    prev_link=link(request, "/", **keep, page=str(page_no - 1)) if page_no > 1 else "",
                    next_link=link(request, "/", **keep, page=str(page_no + 1)) if page_no < pages else "",
                    carry_token=request.query_params.get("token", "") if token else "")

    def task(request: Request) -> HTMLResponse:
        task_id = request.path_params["task_id"]
        try:
            check_id(task_id)
        except HeartbeatError:
            return page(request, "error.html", 404, title="no such task", message=f"no task {task_id!r}")
        baton: Baton | None = None
        error = ""
        try:
            baton = store.load(task_id)
        except NotFound:
            if not store.ledger.events(task_id, kinds=[EventKind.CREATED]):
                return page(request, "error.html", 404, title="no such task", message=f"no task {task_id!r}")
            error = "the baton is gone (the ledger still has its history)"
        except HeartbeatError as exc:
            error = str(exc)
        brief = None
        if baton is not None:
            try:
                brief = render_brief(baton, max_attempts=max_attempts)
            except HeartbeatError as exc:
                error = f"the brief cannot be rendered: {exc}"
        events = store.ledger.events(task_id)
        show_all = request.query_params.get("all") == "1"
        routine = sum(1 for e in events if e.kind in _ROUTINE_KINDS)
        listed = [e for e in events if show_all or e.kind not in _ROUTINE_KINDS]
        hidden = max(0, len(listed) - TIMELINE_EVENTS)
        timeline = [_event_row(e) for e in reversed(listed[hidden:])]
        current = baton.meta.epoch if baton is not None else max((e.epoch for e in events), default=0)
        epoch = current
        asked = request.query_params.get("epoch", "")
        if asked:  # an older epoch's log (gc may have pruned it: the page then says "no log yet")
            if not asked.isdigit() or not 1 <= int(asked) <= max(current, 1):
                return page(request, "error.html", 400, title="bad epoch",
                            message=f"epoch {asked[:40]!r}: expected 1 to {max(current, 1)}")
            epoch = int(asked)
        log = read_log_tail(state_dir, task_id, epoch) if epoch > 0 else None
        now = utcnow()
        return page(request, "task.html", title=task_id, task_id=task_id, baton=baton, error=error,
                    row=_row(_Entry(task_id, baton, error), now, default_launcher, policy),
                    baton_text=dump_baton(baton) if baton is not None else "", brief=brief, timeline=timeline,
                    hidden=hidden, routine=routine, show_all=show_all, log=log, epoch=epoch,
                    epochs=list(range(max(1, current - 50), current + 1)) if current > 1 else [])

    report_cache: list[tuple[float, Any]] = []
    report_lock = threading.Lock()

    def report(request: Request) -> HTMLResponse:
        # The report replays the whole ledger: built at most once per WEB_REPORT_CACHE_SECONDS, one at a time.
        with report_lock:
            if not report_cache or time.monotonic() - report_cache[0][0] > defaults.WEB_REPORT_CACHE_SECONDS:
                report_cache[:] = [(time.monotonic(), build_report(store))]
            built = report_cache[0][1]
        return page(request, "report.html", title="handoff report", report=built.to_json(), refresh=False,
                    cache_s=int(defaults.WEB_REPORT_CACHE_SECONDS))

    def hosts_page(request: Request) -> HTMLResponse:
        """What ``heartbeat hosts`` prints: the daemons sharing a PostgreSQL store."""
        from heartbeat.lease import for_store, list_hosts

        if not for_store(store):
            return page(request, "hosts.html", title="hosts", shared=False, hosts=[])
        rows = [{"host": h.host, "state": h.state, "pid": h.pid, "running": f"{h.running}/{h.capacity}",
                 "renewed": format_duration(h.age), "renewed_at": _iso(h.renewed_at),
                 "lease_ttl": format_duration(h.lease_ttl), "labels": ", ".join(h.labels) or "-",
                 "started_at": _iso(h.started_at)} for h in list_hosts(store)]
        return page(request, "hosts.html", title="hosts", shared=True, hosts=rows)

    def metrics(request: Request) -> Response:
        body, content_type = exposition(registry, request.headers.get("accept", ""))
        return Response(body, media_type=content_type, headers={"Cache-Control": "no-store"})

    async def not_found(request: Request, exc: Exception) -> HTMLResponse:
        return page(request, "error.html", 404, title="not found", message=f"nothing at {request.url.path}")

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/tasks/{task_id:str}", task, methods=["GET"]),
        Route("/report", report, methods=["GET"]),
        Route("/hosts", hosts_page, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found})
    return _Guard(app, token, hosts)


@dataclass
class _Entry:
    """A stand-in for a store entry, to render the task page's row like the list's."""

    id: str
    baton: Baton | None
    error: str


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
    """uvicorn's h11 protocol, bounded: at most :data:`~heartbeat.defaults.WEB_MAX_CONNECTIONS`
    connections (one more is closed as it is accepted) and :data:`~heartbeat.defaults.WEB_REQUEST_TIMEOUT`
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
    from heartbeat.daemon.shared import open_store

    http = config.http
    try:
        token = http.token or os.environ.get(_TOKEN_ENV, "")
        listen = parse_listen(http.listen, what="[http] listen").in_dir(config.state_dir)
        check_exposure(listen, token)
        app = build_app(open_store(config, claim=False), state_dir=config.state_dir, token=token,
                        hosts=HostCheck(listen, http.allowed_hosts), max_attempts=config.daemon.max_attempts,
                        default_launcher=config.daemon.default_launcher, vitals=vitals, policy=policy_for(config))

        def error(message: str, left_out: int) -> None:
            log.error("http_error", error=message, left_out=left_out)

        server, _, url = start_in_thread(app, listen, on_error=error)
    except ImportError as exc:
        from heartbeat.extras import Extra, install_hint

        log.error("http_failed", error=f"{exc}: [http] needs the web extra: {install_hint(Extra.WEB)}")
        return None
    except HeartbeatError as exc:
        log.error("http_failed", error=str(exc))
        return None
    log.info("http_serving", url=url, token=bool(token), pid=os.getpid())

    def stop() -> None:
        server.should_exit = True

    return stop


def _open_line(url: str, token: str, terminal: bool) -> str:
    """What to open: the URL with its token for the person at a terminal; elsewhere (a journal, a
    log file others may read) the token is not written out."""
    if not token or not url.startswith("http"):
        return ""
    if terminal:
        return f"; open {url}?{urlencode({'token': token})}"
    return f"; open {url}?token=TOKEN (the --token or $HEARTBEAT_WEB_TOKEN; not printed: stderr is no terminal)"


def run_from_cli(args: Any) -> int:
    """``heartbeat web [--listen HOST:PORT|unix:PATH] [--token T] [--allow-host NAME]...``."""
    import sys

    from heartbeat.metrics import open_state, require_extra

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
        print(f"heartbeat web: serving {state_dir} at {url} (read-only{', token required' if token else ''})"
              f"{_open_line(url, token, sys.stderr.isatty())}", file=sys.stderr, flush=True)

    def error(message: str, left_out: int) -> None:
        more = f" (and {left_out} more like it since)" if left_out else ""
        print(f"heartbeat web: {message}{more}", file=sys.stderr, flush=True)

    try:
        serve(app, listen, on_ready=ready, on_error=error)
    finally:
        store.close()
    return 0
