"""The commands that look at every task: status, hosts, report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses
from heartbeat.cli.common import _age, _cycle, _missing_upstreams, _print_json, _progress, _store


def cmd_status(args: argparse.Namespace) -> int:
    """``heartbeat status [--json] [--watch [N]]``: one row per task; ``--watch`` redraws every N
    seconds (clearing a terminal first) until Ctrl-C."""
    if getattr(args, "watch", None) is None:
        return _status_once(args)
    import math
    import sys
    import time

    from heartbeat.model.timeparse import utcnow

    if args.json:
        raise BadInput("--watch redraws a table for a person: without --json (a program polls `status --json`)")
    if not (math.isfinite(args.watch) and 0 < args.watch <= 86400):
        raise BadInput(f"--watch takes a number of seconds above 0 (at most a day), got {args.watch:g}")
    try:
        while True:
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(f"every {args.watch:g}s: {utcnow().isoformat(timespec='seconds')}  (Ctrl-C to stop)\n")
            _status_once(args)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _status_once(args: argparse.Namespace) -> int:
    from heartbeat.model.policy import waiting_text
    from heartbeat.model.timeparse import utcnow
    from heartbeat.reports.why import FAILING_STATES, shown_step, why

    store = _store(args, read=True)
    entries = store.scan()
    now = utcnow()
    leases = _lease_rows(store)
    ids = {entry.id for entry in entries}
    batons = {entry.id: entry.baton for entry in entries if entry.baton is not None}
    statuses = {entry.id: entry.baton.meta.status for entry in entries if entry.baton is not None}
    policy = _status_policy(args)
    rows = []
    for entry in entries:
        if entry.baton is None:
            rows.append({"id": entry.id, "status": "invalid", "step": "", "attempt": None, "epoch": None,
                         "revision": None, "age_s": None, "owner_pid": None, "error": str(entry.error)})
            continue
        meta = entry.baton.meta
        last = meta.touched_at or meta.updated_at
        state = why(entry.baton, now, policy, statuses.get)
        rows.append({
            "id": entry.id,
            "status": meta.status.value,
            "step": shown_step(entry.baton),
            "attempt": meta.attempt,
            "epoch": meta.epoch,
            "revision": meta.revision,
            "age_s": round((now - last).total_seconds(), 3) if last else None,
            "owner_pid": meta.owner.pid if meta.owner else None,
            "blocked_on": entry.baton.blocked_on,
            "waiting": waiting_text(entry.baton, now),
            "state": state.state.value,
            "why": state.text,
            "last_failure": meta.last_failure,
            "progress": _progress(entry.baton),
            "error": state.text if state.state in FAILING_STATES else None,
            "after": list(entry.baton.after),
            "missing_upstreams": _missing_upstreams(entry.baton, ids),
            "cycle": _cycle(entry.baton, batons),
            "questions": _question_rows(entry.baton, now),
        })
        if leases is not None:
            held = leases.get(entry.id)
            rows[-1]["host"] = held.host if held else (meta.owner.host if meta.owner else "")
            rows[-1]["lease_s"] = round(held.left, 1) if held and held.left is not None else None
    if args.json:
        _print_json({"tasks": rows})
        return 0
    if not rows:
        print("no tasks")
        return 0
    header: tuple[str, ...] = ("ID", "STATUS", "ATTEMPT", "EPOCH", "AGE", "STEP")
    if leases is not None:  # a shared store: which host holds each task, and for how long
        header = ("ID", "STATUS", "ATTEMPT", "EPOCH", "AGE", "HOST", "LEASE", "STEP")
    table = [header]
    cells = {id(r): r["id"] for r in rows}
    if any(r.get("after") for r in rows):  # pipelines as trees: each downstream under its upstream
        from heartbeat.tasks.pipeline import tree_rows

        ordered = tree_rows(rows)
        rows, cells = [r for _, r in ordered], {id(r): cell for cell, r in ordered}
    for r in rows:
        asking = r["status"] == "blocked" and any(q["waiting"] for q in r.get("questions") or ())
        step = r["error"] if r["status"] == "invalid" else (
            f"{r['step']}  [{r['why']}]" if asking else
            f"{r['step']}  [blocked on: {r['blocked_on']}]" if r["blocked_on"] else
            f"[{r['why']}] {r['step']}" if r.get("why") and r["status"] == "active" else r["step"])
        if r.get("missing_upstreams"):
            step += f"  [held: upstream {', '.join(r['missing_upstreams'])} does not exist]"
        if r.get("cycle"):
            from heartbeat.tasks.handoff import show_chain

            step += f"  [held: a cycle of after, {show_chain(r['cycle'])}]"
        if r.get("progress"):
            step = f"({r['progress']}) {step}"
        shown = r["state"] if r["status"] == "active" and r.get("state") not in (None, "running", "due") else r["status"]
        cols = [cells[id(r)], shown, "-" if r["attempt"] is None else str(r["attempt"]),
                "-" if r["epoch"] is None else str(r["epoch"]), "-" if r["age_s"] is None else _age(r["age_s"])]
        if leases is not None:
            cols += [r.get("host") or "-", _lease_cell(r.get("lease_s"))]
        table.append((*cols, " ".join(str(step).split())))
    n = len(header) - 1
    widths = [max(len(row[i]) for row in table) for i in range(n)]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:n])) + "  " + row[n][:100])
    return 0


def _question_rows(baton: Any, now: Any) -> list[dict[str, Any]]:
    """The task's open questions as ``status --json`` shows them (answered ones: ``show``)."""
    from heartbeat.tasks.questions import open_questions, waiting_on

    waiting = waiting_on(baton)
    held = {q.id for q in waiting.questions} if waiting is not None else set()
    return [{"id": q.id, "to": q.to.value, "upstream": q.upstream, "text": q.text,
             "asked_at": q.asked_at.isoformat(), "age_s": round((now - q.asked_at).total_seconds(), 3),
             "sent": q.sent_at is not None, "escalated": q.escalated_at is not None, "waiting": q.id in held}
            for q in open_questions(baton)]


def _lease_rows(store: Any) -> dict[str, Any] | None:
    """Each task's owner host and lease on a shared store; None on the file store (one host, no leases)."""
    from heartbeat.ops.lease import for_store, lease_rows

    return lease_rows(store) if for_store(store) else None


def _lease_cell(left: float | None) -> str:
    if left is None:
        return "-"
    return _age(left) if left >= 0 else f"expired {_age(-left)} ago"


def cmd_hosts(args: argparse.Namespace) -> int:
    """``heartbeat hosts``: the daemons sharing this database and their last renewal."""
    from heartbeat.ops.lease import for_store, list_hosts

    store = _store(args, read=True)
    if not for_store(store):
        raise BadInput("hosts are a shared store's: set [store] url or $HEARTBEAT_STORE_URL "
                       "(the file store has one host and no leases)")
    hosts = list_hosts(store)
    if args.json:
        _print_json({"hosts": [{"host": h.host, "state": h.state, "pid": h.pid, "labels": list(h.labels),
                                "capacity": h.capacity, "running": h.running, "lease_ttl_s": h.lease_ttl,
                                "renewed_at": h.renewed_at.isoformat(), "renewed_s_ago": round(h.age, 1),
                                "started_at": h.started_at.isoformat(),
                                "stopped_at": h.stopped_at.isoformat() if h.stopped_at else None}
                               for h in hosts]})
        return 0
    if not hosts:
        print("no daemon has run on this database")
        return 0
    table = [("HOST", "STATE", "PID", "RUNNING", "RENEWED", "LEASE_TTL", "LABELS")]
    for h in hosts:
        table.append((h.host, h.state, str(h.pid), f"{h.running}/{h.capacity}", f"{_age(h.age)} ago",
                      _age(h.lease_ttl), ",".join(h.labels) or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from heartbeat.model.timeparse import parse_instant
    from heartbeat.reports.report import build_report

    since = parse_instant(args.since, field="--since") if args.since else None
    if getattr(args, "edges", False):
        from heartbeat.reports.edges import build_edges

        edge_report = build_edges(_store(args, read=True), since=since)
        if args.json:
            _print_json(edge_report.to_json())
        else:
            print(edge_report.render_text())
        return 0
    report = build_report(_store(args, read=True), since=since)
    if args.json:
        _print_json(report.to_json())
    else:
        print(report.render_text())
    return 0


def _status_policy(args: argparse.Namespace) -> Any:
    """The retry knobs ``why`` reads, from the config when one is found."""
    from heartbeat.config.load import readable_config
    from heartbeat.reports.why import policy_for

    return policy_for(readable_config(getattr(args, "config", None)))
