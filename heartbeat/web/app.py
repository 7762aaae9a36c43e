"""The status page: ``heartbeat web`` (and ``[http] listen`` inside ``heartbeat run``).

Read-only, server-rendered HTML on Starlette (routing, requests, responses) served by
uvicorn, pages from Jinja2 templates with autoescaping on for every value: batons,
ledger data and agent logs are hostile input, and a step holding ``<script>`` renders
as text. A strict Content-Security-Policy (inline style and the one auto-refresh
script allowed by a per-response nonce) is the second line behind the escaping.

- ``/``: every task (status, age, step, attempt/epoch, owner, block and gate, last exit),
  filterable with ``?status=``, with counts per status, and the open questions across the
  seam (each with the ``heartbeat answer`` command that answers it);
- ``/tasks/ID``: the baton, its questions and answers, the brief the next agent would read, the
  timeline of the task's ledger events and the tail of the current agent's log;
- ``/report``: the handoff report, worst tasks first;
- ``/metrics``: Prometheus metrics (see :mod:`heartbeat.web.metrics`).

Who may ask: on TCP every request must carry the token (``Authorization: Bearer T`` or
``?token=T``, compared in constant time), loopback included, since every local user can
connect to a port; without a token the server serves only a Unix socket (``unix:PATH``,
created 0600: this user and root). A ``Host`` header naming neither the listen address
nor a configured name is refused (421), so a DNS-rebinding page reads nothing. Only GET
and HEAD are served (any other method: 405). Connections are bounded in number and in
the time a request may take to arrive, so a flood cannot take the descriptors the
daemon's clock needs when the server runs inside ``heartbeat run``."""

from __future__ import annotations

import secrets
import threading
import time
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Status, check_id, dump_baton
from heartbeat.model.errors import BadInput, HeartbeatError, NotFound
from heartbeat.model.ledger import EventKind
from heartbeat.model.timeparse import format_duration, utcnow
from heartbeat.web.guard import HostCheck, _Guard
from heartbeat.web.views import (
    _ROUTINE_KINDS,
    _STATUS_ORDER,
    TIMELINE_EVENTS,
    _age,
    _daemon_alive,
    _Entry,
    _event_row,
    _hosts_of,
    _iso,
    _list_params,
    _lost_hosts,
    _matches,
    _needs_rows,
    _row,
    _status_of,
    _templates,
    log_tail_of,
    question_rows,
)

__all__ = ["build_app"]


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

    from heartbeat.reports.brief import render_brief
    from heartbeat.reports.report import build_report
    from heartbeat.tasks.needs import needs_lines
    from heartbeat.web.metrics import HeartbeatCollector, Vitals, exposition, make_registry

    env = _templates()
    from heartbeat.ops.lease import for_store

    fleet = for_store(store)
    """A store shared by many hosts: the list has a HOST column."""
    if policy is None:
        from heartbeat.model.policy import Policy

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
        lost = _lost_hosts(store) if fleet and shown else set()
        for row in shown:  # the host holding each task (a fleet's), as `heartbeat status` shows it
            row["host"] = hosts.get(row["id"], "") or row.get("owner_host", "")
            row["host_lost"] = bool(row["host"]) and row["host"] in lost
        for row in shown:  # only this page's escalations are read from the ledger
            if row["status"] == Status.ESCALATED.value:
                found = store.ledger.events(row["id"], kinds=[EventKind.ESCALATED])
                if found:
                    row["reason"] = str(found[-1].data.get("reason", ""))
                    row["since"], row["since_at"] = _age(now, found[-1].ts), _iso(found[-1].ts)
        asked = sorted((q for e in entries if e.baton is not None and e.baton.questions
                        for q in question_rows(e.baton, now)), key=lambda q: q["asked_at"])
        keep = {"status": wanted, "q": query, "per": str(per) if per != defaults.WEB_PAGE_SIZE else ""}
        return page(request, "index.html", title="tasks", rows=shown, counts=counts, total=len(entries), fleet=fleet,
                    wanted=wanted, query=query, matched=len(matched), page_no=page_no, pages=pages, per=per,
                    first=(page_no - 1) * per + 1 if shown else 0, last=(page_no - 1) * per + len(shown),
                    prev_link=link(request, "/", **keep, page=str(page_no - 1)) if page_no > 1 else "",
                    next_link=link(request, "/", **keep, page=str(page_no + 1)) if page_no < pages else "",
                    carry_token=request.query_params.get("token", "") if token else "",
                    questions=asked[:defaults.WEB_QUESTIONS_SHOWN], questions_total=len(asked))

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
        needs_rows: list[dict[str, str]] = []
        if baton is not None:
            try:
                needs_rows = _needs_rows(store, baton)
                brief = render_brief(baton, max_attempts=max_attempts, needs=needs_lines(store, baton))
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
        log = log_tail_of(state_dir, task_id, epoch) if epoch > 0 else None
        now = utcnow()
        return page(request, "task.html", title=task_id, task_id=task_id, baton=baton, error=error,
                    row=_row(_Entry(task_id, baton, error), now, default_launcher, policy),
                    baton_text=dump_baton(baton) if baton is not None else "", brief=brief, timeline=timeline,
                    questions=question_rows(baton, now, open_only=False) if baton is not None else [],
                    hidden=hidden, routine=routine, show_all=show_all, log=log, epoch=epoch, needs=needs_rows,
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
        from heartbeat.ops.lease import for_store, list_hosts

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
