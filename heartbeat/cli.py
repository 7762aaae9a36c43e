"""The ``heartbeat`` command. Agents call it often, so its write paths import only what
they use: no scheduler, no watcher, no structlog, no psutil (except ``claim``)."""

from __future__ import annotations

import functools
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from heartbeat.errors import EXIT_BAD_INPUT, EXIT_ERROR, BadInput, HeartbeatError

__all__ = ["main", "build_parser"]


if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses


# -- helpers ---------------------------------------------------------------------------


def _store(args: argparse.Namespace, *, read: bool = False) -> Any:
    """The store; a read command (``read=True``) never creates a missing state dir, it says so."""
    from heartbeat.store import open_store

    if not args.state_dir and not args.config and os.environ.get("HEARTBEAT_STATE_DIR"):
        # resolve_state_dir's answer, without importing the config module: agents the
        # daemon launched have the variable set, and their writes are the hot path.
        state_dir, url = os.path.abspath(os.environ["HEARTBEAT_STATE_DIR"]), ""
    else:
        from heartbeat.config import resolve_store

        state_dir, url = resolve_store(args.state_dir, args.config)
    if read and not (url or os.environ.get("HEARTBEAT_STORE_URL")) and not os.path.isdir(state_dir):
        from heartbeat.errors import StoreError

        raise StoreError("no such state dir (a read never creates one: check --state-dir, "
                         "$HEARTBEAT_STATE_DIR or the config's state_dir)", path=state_dir)
    return open_store(state_dir, url)


def _epoch(args: argparse.Namespace) -> int | None:
    if getattr(args, "epoch", None) is not None:
        if args.epoch < 0:
            raise BadInput("--epoch must not be negative")
        return int(args.epoch)
    from heartbeat.write import epoch_from_env

    return epoch_from_env(args.id)


def _actor(args: argparse.Namespace) -> str:
    from heartbeat.write import actor_from_env

    return actor_from_env(os.environ)


def _print_json(value: Any) -> None:
    from heartbeat.baton import json_safe

    json.dump(json_safe(value), sys.stdout, ensure_ascii=False, indent=2, default=_json_default, allow_nan=False)
    sys.stdout.write("\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _age(seconds: float) -> str:
    from heartbeat.timeparse import format_duration

    return format_duration(max(0.0, seconds))


# -- commands: writing -------------------------------------------------------------------


def cmd_new(args: argparse.Namespace) -> int:
    from heartbeat import tasks
    from heartbeat.baton import Gate, check_id

    check_id(args.id)
    gate = Gate.parse(args.gate) if args.gate else None
    if gate and not args.blocked_on:
        raise BadInput("--gate goes with --blocked-on")
    owner = _claiming_owner(args) if args.claim else None
    guarantees = _guarantees(args.guarantee or [])
    _refuse_unknown_names(args, launchers=[args.launcher or ""], checks=[g.check for g in guarantees],
                          on_broken=args.on_broken or "")
    store = _store(args)
    after = _upstreams(store, args.id, args.after or [])
    try:
        workdir = args.workdir or os.getcwd()
    except FileNotFoundError:
        raise BadInput("the current directory no longer exists: pass --workdir DIR") from None
    baton = tasks.new_task(
        store,
        args.id,
        task=args.task,
        step=args.step,
        intent=args.intent or "",
        next_step=args.next or "",
        workdir=workdir,
        launcher=args.launcher or "",
        handoff=args.handoff or "",
        key_files=args.key_file or [],
        constraints=args.constraint or [],
        plan=args.plan or [],
        blocked_on=args.blocked_on or "",
        gate=gate,
        owner=owner,
        after=after,
        guarantees=guarantees,
        on_broken=args.on_broken or "",
        host_labels=args.host_label or [],
        actor=_actor(args),
    )
    if args.claim:
        print(baton.meta.epoch)
    return 0


def _refuse_unknown_names(args: argparse.Namespace, **names: Any) -> None:
    """A launcher or check the config does not define: exit 2 naming the configured ones."""
    from heartbeat.config import readable_config, refuse_unknown_names

    refuse_unknown_names(readable_config(getattr(args, "config", None)), **names)


def _upstreams(store: Any, task_id: str, after: Sequence[str]) -> list[str]:
    """``--after`` ids, each an existing task: a typo must not hold a task forever."""
    from heartbeat.baton import check_id
    from heartbeat.handoff import check_upstreams_exist

    out: list[str] = []
    for upstream in after:
        check_id(upstream)
        if upstream not in out:
            out.append(upstream)
    check_upstreams_exist(store, task_id, out, field="--after")
    return out


def _guarantees(specs: Sequence[str]) -> list[Any]:
    """``--guarantee TEXT`` or ``--guarantee TEXT::CHECK`` (the check a ``[checks.NAME]``)."""
    from heartbeat.baton import Guarantee

    out = []
    for spec in specs:
        text, sep, check = spec.rpartition("::")
        out.append(Guarantee(text, check.strip()) if sep else Guarantee(spec))
    return out


def _claiming_owner(args: argparse.Namespace) -> Any:
    from heartbeat.baton import Owner
    from heartbeat.liveness import identify, this_host
    from heartbeat.timeparse import utcnow

    pid = getattr(args, "pid", None)
    if pid is not None and pid <= 0:
        raise BadInput(f"must be a process id above 0, got {pid}", field="--pid")
    pid = pid or os.getppid()
    found = identify(pid)
    if found is None:
        raise BadInput(f"no running process with pid {pid}", field="--pid")
    return Owner(pid=pid, create_time=found[1], host=this_host(), how="claim", started_at=utcnow())


def cmd_set(args: argparse.Namespace) -> int:
    _set(_store(args), args, _epoch(args), _actor(args))
    return 0


def _set(store: Any, args: argparse.Namespace, epoch: int | None, actor: str) -> None:
    from heartbeat import write

    values = write.assignments(tuple(args.pairs))
    if values.get("launcher") or values.get("on_broken"):
        _refuse_unknown_names(args, launchers=[values.get("launcher", "")], on_broken=values.get("on_broken", ""))
    write.apply(store, write.Write("set", args.id, pairs=tuple(args.pairs), expect_revision=args.expect_revision),
                epoch=epoch, actor=actor)


def cmd_add(args: argparse.Namespace) -> int:
    if args.field != "guarantees" and getattr(args, "check", None):
        raise BadInput("--check goes with `add ID guarantees TEXT`")
    _add(_store(args), args, _epoch(args), _actor(args))
    return 0


def _add(store: Any, args: argparse.Namespace, epoch: int | None, actor: str) -> None:
    from heartbeat import write

    if args.field == "guarantees" and getattr(args, "check", None):
        _refuse_unknown_names(args, checks=[args.check])
    write.apply(store, write.Write("add", args.id, field=args.field, values=tuple(args.values),
                                   check=getattr(args, "check", None) or "", expect_revision=args.expect_revision),
                epoch=epoch, actor=actor)


def cmd_touch(args: argparse.Namespace) -> int:
    from heartbeat import tasks

    tasks.touch(_store(args), args.id, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_claim(args: argparse.Namespace) -> int:
    from heartbeat import tasks
    from heartbeat.baton import check_id

    check_id(args.id)
    baton = tasks.claim(_store(args), args.id, _claiming_owner(args), force=args.force, actor=_actor(args))
    print(baton.meta.epoch)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from heartbeat import tasks

    tasks.release(_store(args), args.id, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_snooze(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from heartbeat import tasks
    from heartbeat.timeparse import parse_duration, parse_instant, utcnow

    if bool(args.until) == bool(args.for_):
        raise BadInput("give one of --until ISO8601 or --for DURATION")
    if args.until:
        until = parse_instant(args.until, field="--until")
    else:
        until = utcnow() + timedelta(seconds=parse_duration(args.for_, field="--for"))
    tasks.snooze(_store(args), args.id, until, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_block(args: argparse.Namespace) -> int:
    from heartbeat import tasks
    from heartbeat.baton import Gate

    gate = Gate.parse(args.gate)
    tasks.block(_store(args), args.id, args.on, gate, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_unblock(args: argparse.Namespace) -> int:
    from heartbeat import tasks

    tasks.unblock(_store(args), args.id, by=args.by, note=args.note or "")
    return 0


def cmd_done(args: argparse.Namespace) -> int:
    from heartbeat import tasks

    tasks.finish(_store(args), args.id, note=args.note or "", epoch=_epoch(args), actor=_actor(args),
                 checks=_checks(args) if args.config else None)
    return 0


def _checks(args: argparse.Namespace) -> Any:
    """The config's ``[checks.NAME]`` (for guarantees), or none when no config is found."""
    from heartbeat.handoff import configured_checks

    return configured_checks(args.config)


def cmd_fail(args: argparse.Namespace) -> int:
    from heartbeat import tasks

    tasks.fail(_store(args), args.id, reason=args.reason, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from heartbeat import tasks

    tasks.retry(_store(args), args.id, by=args.by, note=args.note or "")
    return 0


# -- commands: reading -------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    from heartbeat.baton import dump_baton

    baton = _store(args, read=True).load(args.id)
    if args.json:
        _print_json(baton.to_dict())
    else:
        sys.stdout.write(dump_baton(baton))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from heartbeat.policy import waiting_text
    from heartbeat.timeparse import utcnow

    store = _store(args, read=True)
    entries = store.scan()
    now = utcnow()
    leases = _lease_rows(store)
    ids = {entry.id for entry in entries}
    rows = []
    for entry in entries:
        if entry.baton is None:
            rows.append({"id": entry.id, "status": "invalid", "step": "", "attempt": None, "epoch": None,
                         "revision": None, "age_s": None, "owner_pid": None, "error": str(entry.error)})
            continue
        meta = entry.baton.meta
        last = meta.touched_at or meta.updated_at
        rows.append({
            "id": entry.id,
            "status": meta.status.value,
            "step": entry.baton.step,
            "attempt": meta.attempt,
            "epoch": meta.epoch,
            "revision": meta.revision,
            "age_s": round((now - last).total_seconds(), 3) if last else None,
            "owner_pid": meta.owner.pid if meta.owner else None,
            "blocked_on": entry.baton.blocked_on,
            "waiting": waiting_text(entry.baton, now),
            "error": None,
            "after": list(entry.baton.after),
            "missing_upstreams": _missing_upstreams(entry.baton, ids),
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
        from heartbeat.pipeline import tree_rows

        ordered = tree_rows(rows)
        rows, cells = [r for _, r in ordered], {id(r): cell for cell, r in ordered}
    for r in rows:
        step = r["error"] if r["status"] == "invalid" else (
            f"{r['step']}  [blocked on: {r['blocked_on']}]" if r["blocked_on"] else
            f"[{r['waiting']}] {r['step']}" if r.get("waiting") else r["step"])
        if r.get("missing_upstreams"):
            step += f"  [held: upstream {', '.join(r['missing_upstreams'])} does not exist]"
        cols = [cells[id(r)], r["status"], "-" if r["attempt"] is None else str(r["attempt"]),
                "-" if r["epoch"] is None else str(r["epoch"]), "-" if r["age_s"] is None else _age(r["age_s"])]
        if leases is not None:
            cols += [r.get("host") or "-", _lease_cell(r.get("lease_s"))]
        table.append((*cols, " ".join(str(step).split())))
    n = len(header) - 1
    widths = [max(len(row[i]) for row in table) for i in range(n)]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:n])) + "  " + row[n][:100])
    return 0


def _lease_rows(store: Any) -> dict[str, Any] | None:
    """Each task's owner host and lease on a shared store; None on the file store (one host, no leases)."""
    from heartbeat.lease import for_store, lease_rows

    return lease_rows(store) if for_store(store) else None


def _lease_cell(left: float | None) -> str:
    if left is None:
        return "-"
    return _age(left) if left >= 0 else f"expired {_age(-left)} ago"


def cmd_hosts(args: argparse.Namespace) -> int:
    """``heartbeat hosts``: the daemons sharing this database and their last renewal."""
    from heartbeat.lease import for_store, list_hosts

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


def cmd_pipeline(args: argparse.Namespace) -> int:
    from heartbeat.pipeline import create_pipeline, parse_pipeline

    if args.action != "new":
        raise BadInput(f"unknown pipeline action {args.action!r}: use `heartbeat pipeline new NAME --from FILE.toml`")
    if not args.from_:
        raise BadInput("--from FILE.toml is required")
    import stat

    try:
        fd = os.open(args.from_, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not hang us
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise BadInput(f"{args.from_}: not a regular file")
            text = handle.read(1024 * 1024 + 1).decode("utf-8")
    except OSError as exc:
        raise BadInput(f"{args.from_}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{args.from_}: not UTF-8 text") from None
    if len(text) > 1024 * 1024:
        raise BadInput(f"{args.from_}: larger than 1 MiB")
    try:
        stages = parse_pipeline(args.name, text, base_dir=os.path.dirname(os.path.abspath(args.from_)))
    except BadInput as exc:
        raise BadInput(f"{args.from_}: {exc.message}") from None
    for stage in stages:
        _refuse_unknown_names(args, launchers=[stage.launcher], checks=[g.check for g in stage.guarantees],
                              on_broken=stage.on_broken, where=f"{args.from_}: stages.{stage.name}: ")
    try:
        workdir = os.getcwd()
    except FileNotFoundError:
        raise BadInput("the current directory no longer exists") from None
    created = create_pipeline(_store(args), args.name, stages, workdir=workdir, actor=_actor(args))
    print(f"created pipeline {args.name}: {', '.join(created)}")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from heartbeat.baton import check_id

    check_id(args.id)
    store = _store(args, read=True)
    events = store.ledger.events(args.id)
    if args.json:
        _print_json({"task": args.id, "events": [e.to_json() for e in events]})
        return 0
    for e in events:
        shown = {k: (f"<{len(v)} fingerprints>" if k == "world" and isinstance(v, dict) else v)
                 for k, v in e.data.items()}  # the hashes are in --json; one line stays readable
        data = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in shown.items() if v not in ("", None, []))
        print(f"{e.ts.isoformat(timespec='seconds')}  {e.kind:<11} epoch={e.epoch} rev={e.revision} "
              f"by={e.actor or '-'}  {data}".rstrip())
    return 0


def _missing_upstreams(baton: Any, ids: set[str]) -> list[str]:
    """The upstreams (``after``, or an ``after:``/``task:`` gate) an unfinished task waits on that do
    not exist: nothing will ever open its way."""
    from heartbeat.baton import FINISHED_STATUSES, GateKind

    if baton.meta.status in FINISHED_STATUSES:
        return []
    held = list(baton.after)
    gate = baton.meta.gate
    if gate is not None and gate.kind in (GateKind.AFTER, GateKind.TASK):
        held += [t for t in gate.target.split(",") if t and t not in held]
    return [t for t in held if t not in ids]


def cmd_brief(args: argparse.Namespace) -> int:
    from heartbeat.brief import render_brief

    if args.budget is not None and args.budget < 1:
        raise BadInput("--budget must be a positive number of tokens")
    store = _store(args, read=True)
    baton = store.load(args.id)
    kwargs: dict[str, Any] = {"max_attempts": _max_attempts(args), "epoch": _epoch(args)}
    if args.budget is not None:
        kwargs["budget"] = args.budget
    if baton.after:
        from heartbeat.handoff import load_packages

        kwargs["upstream"] = load_packages(store, baton)
    brief = render_brief(baton, **kwargs)
    for warning in brief.warnings:
        print(f"heartbeat: warning: {args.id}: {warning}", file=sys.stderr)
    if args.json:
        _print_json(brief.to_json())
    else:
        sys.stdout.write(brief.text)
    return 0


def _max_attempts(args: argparse.Namespace) -> int:
    """The config's max_attempts for "attempt N of M"; the default when there is no readable config."""
    from heartbeat import defaults
    from heartbeat.config import find_config, load_config

    path = find_config(args.config)
    if path is None:
        return defaults.MAX_ATTEMPTS
    try:
        return load_config(path).daemon.max_attempts
    except HeartbeatError:
        return defaults.MAX_ATTEMPTS  # a broken config must not keep an agent from its brief


def cmd_verify(args: argparse.Namespace) -> int:
    from heartbeat.verify import verify

    store = _store(args, read=True)
    checks = None
    if args.config:
        checks = _checks(args)
    result = verify(store, args.id, epoch=_epoch(args), actor=_actor(args), checks=checks)
    if args.json:
        _print_json(result.to_json())
    else:
        print(result.render_text())
    return result.code


def cmd_report(args: argparse.Namespace) -> int:
    from heartbeat.report import build_report
    from heartbeat.timeparse import parse_instant

    since = parse_instant(args.since, field="--since") if args.since else None
    if getattr(args, "edges", False):
        from heartbeat.edges import build_edges

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


def cmd_gc(args: argparse.Namespace) -> int:
    from heartbeat.retention import gc_from_cli

    return gc_from_cli(args)


# -- commands: setup ---------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from heartbeat.starter import write_starter

    path = write_starter(args.dir, force=args.force)
    print(f"wrote {path}")
    print(f"next: heartbeat --config {path} check-config")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    import shutil

    from heartbeat.config import find_config, load_config

    path = find_config(args.config)
    if path is None:
        raise BadInput("no config found (tried --config, $HEARTBEAT_CONFIG, ./heartbeat.toml, "
                       "/etc/heartbeat/heartbeat.toml)")
    config = load_config(path)
    from heartbeat.launchers import make_launcher

    for launcher in config.launchers.values():
        make_launcher(launcher, path=path)  # an unknown type or bad options: exit 2 with the key
        program = launcher.command[0] if launcher.command else ""
        if "/" in program and not os.path.isabs(program) and "{workdir}" in launcher.cwd:
            print(f"heartbeat: warning: {path}: launchers.{launcher.name}.command: {program!r} is a relative "
                  "path, found in each task's working directory, which a baton chooses: use an absolute path",
                  file=sys.stderr)
        elif program and not shutil.which(program) and not os.path.isfile(program):
            print(f"heartbeat: warning: {path}: launchers.{launcher.name}.{'program' if launcher.preset else 'command'}: "
                  f"{program!r} is not on PATH", file=sys.stderr)
    print(f"ok: {path}: state_dir {config.state_dir}, {len(config.launchers)} launcher(s), "
          f"{len(config.checks)} check(s), {len(config.notify)} notifier(s)")
    if getattr(args, "explain", False):
        from heartbeat.presets import explain

        for launcher in config.launchers.values():
            print("\n".join(explain(launcher)))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from heartbeat.daemon import run_from_cli
    from heartbeat.web import start_for_daemon  # [http]: the daemon is given its page, it imports no face

    return run_from_cli(args, page=start_for_daemon)


def cmd_web(args: argparse.Namespace) -> int:
    from heartbeat.web import run_from_cli

    return run_from_cli(args)


def cmd_metrics(args: argparse.Namespace) -> int:
    from heartbeat.metrics import run_from_cli

    return run_from_cli(args)


def cmd_db(args: argparse.Namespace) -> int:
    """``heartbeat db upgrade|status``: the PostgreSQL store's schema."""
    from heartbeat.config import resolve_store

    url = resolve_store(args.state_dir, args.config)[1]
    if not url:
        raise BadInput("no database store configured: set [store] url or $HEARTBEAT_STORE_URL")
    try:
        from heartbeat.store import postgres
    except ImportError:
        raise BadInput("a PostgreSQL store needs the extra heartbeat[postgres]: pip install 'heartbeat[postgres]'") from None
    ours = postgres.SCHEMA_VERSION
    if args.action == "upgrade":
        before, after = postgres.upgrade(url)
        if after > ours:
            print(f"schema at version {after}, newer than this heartbeat ({ours}) but usable by it (nothing to do)")
        else:
            print(f"schema at version {after}" + (f" (was {before})" if before != after else " (nothing to do)"))
        return 0
    conn = postgres.connect(url)
    try:
        found, floor = postgres.schema_state(conn)
    finally:
        conn.close()
    print(f"schema version {found} (min_reader {floor}); this heartbeat uses {ours}")
    return 0 if postgres.schema_refusal(found, floor, "") is None else EXIT_ERROR


def cmd_export(args: argparse.Namespace) -> int:
    from heartbeat.transfer import write_export

    store = _store(args)
    try:
        if args.to and args.to != "-":
            import io
            from contextlib import ExitStack

            from heartbeat.safefile import open_atomic

            with ExitStack() as stack:
                try:  # 0600: an export holds every baton
                    raw = stack.enter_context(open_atomic(args.to, 0o600))
                except OSError as exc:
                    raise BadInput(f"{args.to}: cannot write: {exc.strerror}") from None
                out = io.TextIOWrapper(raw, encoding="utf-8")
                counts = write_export(store, out)
                out.flush()
                out.detach()  # open_atomic fsyncs, closes and renames the file it opened
        else:
            counts = write_export(store, sys.stdout)
    finally:
        store.close()
    for line in counts.skipped:
        print(f"heartbeat: left out invalid baton {line}", file=sys.stderr)
    print(f"heartbeat: {counts.summary('exported')}", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from heartbeat.transfer import import_lines

    store = _store(args)
    try:
        if args.file == "-":
            counts = import_lines(store, sys.stdin, where="<stdin>")
        else:
            try:
                with open(args.file, encoding="utf-8") as f:
                    counts = import_lines(store, f, where=args.file)
            except (OSError, UnicodeDecodeError) as exc:
                raise BadInput(f"{args.file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        store.close()
    print(counts.summary("imported"))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from heartbeat.transfer import migrate, open_exact

    if os.path.realpath(args.from_) == os.path.realpath(args.to):
        raise BadInput("--from and --to are the same store")
    # A daemon writing either side meanwhile would leave the target a stale copy that exits 0:
    # both state dirs' daemon locks are held for the migration, so none can start either.
    locks = [_hold_for_migrate(args.from_, "--from", must_exist=True), _hold_for_migrate(args.to, "--to")]
    try:
        source = open_exact(args.from_, must_exist=True)
        try:
            target = open_exact(args.to)
            try:
                _refuse_database_daemons(source, "--from", args.from_)
                _refuse_database_daemons(target, "--to", args.to)
                result, skipped = migrate(source, target, where=args.from_)
            finally:
                target.close()
        finally:
            source.close()
    finally:
        for fd in locks:
            if fd is not None:
                os.close(fd)
    for line in skipped:
        print(f"heartbeat: left out invalid baton {line}", file=sys.stderr)
    print(result.summary("copied"))
    return 0


def _refuse_database_daemons(store: object, option: str, where: str) -> None:
    """DaemonRunning when a daemon runs on the database store ``store`` (it holds no state dir's
    lock file: its lock is in the database)."""
    from heartbeat.errors import DaemonRunning
    from heartbeat.store.base import SharedStore

    pids = store.daemon_backends() if isinstance(store, SharedStore) else []
    if pids:
        label = store.label if isinstance(store, SharedStore) else where
        raise DaemonRunning(f"{option} {label}: a daemon is running on this database (server pid "
                            f"{', '.join(map(str, pids))}); stop it first (systemctl stop heartbeat on its "
                            "host), then migrate")


def _hold_for_migrate(where: str, option: str, *, must_exist: bool = False) -> int | None:
    """The daemon lock of the state dir ``where`` (None for a database URL), or DaemonRunning
    saying how to stop the daemon that holds it."""
    from heartbeat.daemon.service import hold_daemon_lock
    from heartbeat.errors import DaemonRunning

    if where.startswith(("postgresql://", "postgres://")):
        return None
    if must_exist and not os.path.isdir(where):
        raise BadInput(f"{where}: no such state dir")
    try:
        return hold_daemon_lock(where)
    except DaemonRunning as exc:
        pid = exc.holder or "unknown"
        raise DaemonRunning(f"{option} {where}: a daemon (pid {pid}) is running on it; stop it first "
                            f"(systemctl stop heartbeat, or kill -TERM {pid}), then migrate") from None


def cmd_demo(args: argparse.Namespace) -> int:
    from heartbeat.demo import run_demo

    return run_demo(args)


def cmd_hook(args: argparse.Namespace) -> int:
    from heartbeat.hooks import run_hook

    return run_hook(args.agent, task=args.task, state_dir=args.state_dir, config=args.config)


def cmd_hooks(args: argparse.Namespace) -> int:
    from heartbeat import hooks

    if args.agent == "codex":
        if args.mcp:
            raise BadInput("--mcp is for claude; codex reads its MCP servers from its own config.toml")
        written = (hooks.install_codex(args.dir, user=args.user, state_dir=args.state_dir, config=args.config,
                                       task=args.task) if args.action == "install"
                   else hooks.uninstall_codex(args.dir, user=args.user, state_dir=args.state_dir, config=args.config))
    elif args.action == "install":
        written = hooks.install_claude(args.dir, user=args.user, mcp=args.mcp, state_dir=args.state_dir,
                                       config=args.config, task=args.task)
    else:
        written = hooks.uninstall_claude(args.dir, user=args.user, state_dir=args.state_dir, config=args.config)
    for path in written:
        print(f"{'wrote' if args.action == 'install' else 'updated'} {path}")
    if not written:
        print("nothing to change: " + ("already installed" if args.action == "install" else "not installed"))
    elif args.agent == "codex" and args.action == "install":
        print("codex runs a new or changed hook only once it is trusted: review it with /hooks in `codex` "
              "(project hooks also need a trusted project: `codex exec --trust`), or run `codex exec "
              "--dangerously-bypass-hook-trust`")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from heartbeat.mcp_server import serve

    return serve(state_dir=args.state_dir, config=args.config)


# -- the parser --------------------------------------------------------------------------


@functools.cache
def _parser_class() -> type[argparse.ArgumentParser]:
    # Made on first use, not at import: subclassing would load argparse on every call.
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # one line, exit 2, as every other bad input
            raise BadInput(f"{self.prog}: {message}")

    return Parser


class _Skipped:
    """Stands in for the parser of a command that is not being run: every call is a no-op."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


Argument = tuple[str, dict[str, Any]]
"""One ``add_argument`` call as data: the name or flag, and its keyword arguments."""

GLOBAL_OPTIONS: tuple[Argument, ...] = (
    ("--config", {"help": "config file (else $HEARTBEAT_CONFIG, ./heartbeat.toml, /etc/heartbeat/)"}),
    ("--state-dir", {"help": "state dir (else $HEARTBEAT_STATE_DIR, else the config's)"}),
)
"""The options before (or, hoisted, after) the command word."""

_GLOBAL_FLAGS = tuple(name for name, _ in GLOBAL_OPTIONS)
_GLOBAL_PREFIXES = tuple(f"{name}=" for name in _GLOBAL_FLAGS)


def _command_in(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (after the global options), or None when there is none."""
    args = iter(argv)
    for arg in args:
        if arg in _GLOBAL_FLAGS:
            next(args, None)
        elif arg.startswith(_GLOBAL_PREFIXES):
            continue
        elif arg.startswith("-"):
            return None
        else:
            return arg
    return None


def _hoist_global_options(argv: Sequence[str]) -> list[str]:
    """``--config``/``--state-dir`` moved in front of the command wherever they were given, so
    ``heartbeat status --state-dir D`` works like ``heartbeat --state-dir D status``. Nothing
    after ``--`` moves."""
    front: list[str] = []
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            rest.append(arg)
            rest.extend(args)
            break
        if arg in _GLOBAL_FLAGS:
            front.append(arg)
            value = next(args, None)
            if value is not None:
                front.append(value)
        elif arg.startswith(_GLOBAL_PREFIXES):
            front.append(arg)
        else:
            rest.append(arg)
    return front + rest


def _int64(text: str) -> int:
    """An integer option: a number that fits the ledger's 64 bits, or one line and exit 2."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text[:40]} is out of range (at most {2**63 - 1})")
    return value


_ID: Argument = ("id", {"help": "task id"})
_EPOCH: Argument = ("--epoch", {"type": _int64, "help": "your epoch (else $HEARTBEAT_EPOCH); a superseded one is "
                                "refused"})
_EXPECT_REVISION: Argument = ("--expect-revision", {"type": _int64, "help": "refuse (exit 5) if the baton moved "
                                                    "past this revision"})

AGENT_WRITES: dict[str, tuple[Callable[[argparse.Namespace], int], str, tuple[Argument, ...]]] = {
    "set": (cmd_set, "set scalar fields", (_ID, ("pairs", {"nargs": "+", "metavar": "FIELD=VALUE"}), _EPOCH,
                                           _EXPECT_REVISION)),
    "add": (cmd_add, "append to a list field", (_ID, ("field", {}), ("values", {"nargs": "+", "metavar": "VALUE"}),
                                                _EPOCH, _EXPECT_REVISION,
                                                ("--check", {"help": "with `guarantees`: the [checks.NAME] proving "
                                                             "it"}))),
    "touch": (cmd_touch, "heartbeat: alive, still on this step", (_ID, _EPOCH)),
}
"""The commands an agent calls often, each as (function, help, arguments in order): build_parser
declares them from here and :func:`_hot_args` reads them from here, so the two cannot disagree."""


def _dest(argument: Argument) -> str:
    """The attribute argparse stores ``argument`` under."""
    name, options = argument
    return str(options.get("dest") or name.lstrip("-").replace("-", "_"))


def _hot_args(argv: Sequence[str]) -> Any:
    """What the parser would return for an agent's :data:`AGENT_WRITES` call given without any
    option (``touch ID``, ``set ID F=V...``, ``add ID FIELD V...``), or None for anything else.

    Why a second reader beside argparse: importing argparse and building even one subparser costs
    an agent more than its whole write (``scripts/bench_cli.py``). It reads only positionals, from
    the declarations build_parser uses (a name, at most one ``nargs="+"`` last), and gives every
    option its declared default; a call with any option, or anything it does not read, goes to
    argparse. ``tests/integration/test_cli.py`` checks that both give the same namespace, for any arguments.
    """
    if not argv or argv[0] not in AGENT_WRITES or any(arg.startswith("-") for arg in argv):
        return None
    func, _, arguments = AGENT_WRITES[argv[0]]
    values: dict[str, Any] = {_dest(option): option[1].get("default") for option in GLOBAL_OPTIONS}
    values.update(command=argv[0], func=func)
    rest = list(argv[1:])
    for argument in (a for a in arguments if not a[0].startswith("-")):
        options = argument[1]
        if options.get("nargs") == "+":
            if not rest:
                return None
            values[_dest(argument)], rest = rest, []
        elif options.get("nargs") is not None or not rest:
            return None  # a form this reader does not know (or a missing argument): argparse decides
        else:
            values[_dest(argument)] = rest.pop(0)
    if rest:
        return None
    values.update((_dest(a), a[1].get("default")) for a in arguments if a[0].startswith("-"))
    return types.SimpleNamespace(**values)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; ``only`` builds just that command's subparser (argparse spends
    milliseconds per subparser, and an agent's ``touch`` should not pay for all of them)."""
    import argparse

    parser_class = _parser_class()
    parser = parser_class(prog="heartbeat", description="Keep long-running agent work alive across seams.")
    for name, options in GLOBAL_OPTIONS:
        parser.add_argument(name, **options)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)

    def command(name: str, func: Callable[[argparse.Namespace], int], help_: str, *, task: bool = True,
                write: bool = False, json_: bool = False) -> argparse.ArgumentParser:
        if only is not None and name != only:
            return cast(argparse.ArgumentParser, _Skipped())
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=func)
        if task:
            p.add_argument(_ID[0], **_ID[1])
        if write:
            p.add_argument(_EPOCH[0], **_EPOCH[1])
        if json_:
            p.add_argument("--json", action="store_true", help="print one JSON document")
        return p

    p = command("init", cmd_init, "write a starter config and state dir", task=False)
    p.add_argument("dir", nargs="?", default=".", help="where (default: here)")
    p.add_argument("--force", action="store_true", help="overwrite an existing heartbeat.toml")
    p = command("check-config", cmd_check_config, "validate the config", task=False)
    p.add_argument("--explain", action="store_true",
                   help="print each launcher as it will run: program, argv, brief, env, session, exit handling")
    p = command("run", cmd_run, "the daemon (what systemd starts)", task=False)
    p.add_argument("--dry-run", action="store_true", help="decide and log, but launch nothing")
    p.add_argument("--once", action="store_true", help="one tick, then exit")
    p = command("demo", cmd_demo, "a self-contained run: an agent is killed mid-task and its successor resumes",
                task=False)
    p.add_argument("--keep", action="store_true", help="keep the demo's state dir")

    p = command("new", cmd_new, "create a task", write=False)
    p.add_argument("--task", required=True, help="what the task is")
    p.add_argument("--step", required=True, help="the current step")
    p.add_argument("--intent", help="why the task exists")
    p.add_argument("--next", help="the next step")
    p.add_argument("--workdir", help="the task's working directory (default: here)")
    p.add_argument("--launcher", help="a [launchers.NAME] of the config")
    p.add_argument("--handoff", help="path to a longer briefing")
    p.add_argument("--key-file", action="append", help="a key file, relative to the workdir (repeatable)")
    p.add_argument("--constraint", action="append", help="a constraint (repeatable)")
    p.add_argument("--plan", action="append", help="a plan step, in order (repeatable)")
    p.add_argument("--blocked-on", help="start blocked on this")
    p.add_argument("--gate", help="how the block clears: human|file:[HOST:]PATH|time:ISO8601|task:ID|"
                   "check:[HOST:]NAME")
    p.add_argument("--claim", action="store_true", help="claim it for the calling process; prints the epoch")
    p.add_argument("--pid", type=_int64, help="with --claim: the owner's pid (default: the caller's parent)")
    p.add_argument("--after", action="append", help="an upstream task: held until it is done, then briefed with "
                   "its package (repeatable)")
    p.add_argument("--guarantee", action="append", help="what this task promises its consumers: TEXT or "
                   "TEXT::CHECK, CHECK a [checks.NAME] that `done` and the consumers' `verify` run (repeatable)")
    p.add_argument("--on-broken", help="when an upstream's guarantee breaks: reopen (default), escalate or "
                   "fallback:LAUNCHER")
    p.add_argument("--host-label", action="append", help="on a shared store, only a daemon whose daemon.labels "
                   "include this label dispatches the task (repeatable)")

    p = command("show", cmd_show, "print a baton", json_=True)
    for name, (func, help_, arguments) in AGENT_WRITES.items():
        p = command(name, func, help_, task=False)
        for argument, options in arguments:
            p.add_argument(argument, **options)
    p = command("claim", cmd_claim, "take the task for an agent the daemon did not start; prints the epoch")
    p.add_argument("--pid", type=_int64, help="the owner's pid (default: the caller's parent)")
    p.add_argument("--force", action="store_true", help="take it even from a live agent")
    command("release", cmd_release, "hand the task back to the daemon", write=True)
    p = command("snooze", cmd_snooze, "end the shift; the daemon wakes the task later", write=True)
    p.add_argument("--until", help="ISO 8601 time")
    p.add_argument("--for", dest="for_", help="a duration: 30m, 2h")
    p = command("block", cmd_block, "block the task", write=True)
    p.add_argument("--on", required=True, help="what it is blocked on")
    p.add_argument("--gate", default="human", help="human|file:PATH|time:ISO8601|task:ID|check:NAME")
    p = command("unblock", cmd_unblock, "lift a block (a named human)")
    p.add_argument("--by", required=True, help="who")
    p.add_argument("--note")
    p = command("done", cmd_done, "mark the task done", write=True)
    p.add_argument("--note")
    p = command("fail", cmd_fail, "mark the task failed", write=True)
    p.add_argument("--reason", required=True)
    p = command("retry", cmd_retry, "re-arm an escalated or failed task")
    p.add_argument("--by", required=True, help="who")
    p.add_argument("--note")
    command("status", cmd_status, "one row per task", task=False, json_=True)
    p = command("pipeline", cmd_pipeline, "create a chain or DAG of tasks from a TOML file", task=False)
    p.add_argument("action", choices=["new"], help="new")
    p.add_argument("name", help="the pipeline's name: its tasks are NAME.STAGE")
    p.add_argument("--from", dest="from_", required=True, metavar="FILE.toml", help="one [stages.STAGE] per stage")
    command("log", cmd_log, "the ledger's events for one task", json_=True)
    p = command("brief", cmd_brief, "what the next agent reads first: intent, constraints, state, context, pointers",
                json_=True)
    p.add_argument("--budget", type=_int64, help="tokens (UTF-8 bytes / 4) the brief may use (default 4000)")
    p.add_argument("--epoch", type=_int64, help="your epoch (else $HEARTBEAT_EPOCH): warned about when superseded")
    p = command("verify", cmd_verify, "does the baton still hold? 0 fresh, 3 stale, 4 not active, 5 superseded",
                json_=True)
    p.add_argument("--epoch", type=_int64, help="your epoch (else $HEARTBEAT_EPOCH): exit 5 when superseded")
    p = command("report", cmd_report, "handoff quality from the ledger, per task and in total", task=False,
                json_=True)
    p.add_argument("--since", help="count only what happened at or after this ISO 8601 time")
    p.add_argument("--edges", action="store_true", help="profile the handoffs between tasks (upstream -> "
                   "downstream, and by launcher pair) instead")
    p = command("hook", cmd_hook, "run by Claude Code or Codex at a hook event (JSON on stdin); always exits 0",
                task=False)
    p.add_argument("agent", choices=["claude", "codex"])
    p.add_argument("--task", help="the task (else $HEARTBEAT_TASK, else the one whose workdir is the event's cwd)")
    p = command("hooks", cmd_hooks, "install or uninstall heartbeat's Claude Code / Codex hooks (and Codex's "
                "AGENTS.md section)", task=False)
    p.add_argument("action", choices=["install", "uninstall"])
    p.add_argument("agent", choices=["claude", "codex"])
    p.add_argument("--dir", help="the project directory (default: here)")
    p.add_argument("--user", action="store_true", help="~/.claude/settings.json or $CODEX_HOME/hooks.json instead of "
                   "the project's")
    p.add_argument("--mcp", action="store_true", help="claude: also register `heartbeat mcp` in the project's .mcp.json")
    p.add_argument("--task", help="pin the task id (else $HEARTBEAT_TASK or the workdir decides)")
    command("mcp", cmd_mcp, "serve the batons over MCP on stdio (needs heartbeat[mcp])", task=False)
    p = command("web", cmd_web, "the read-only status page (needs heartbeat[web])", task=False)
    p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8787; a token is required) or unix:PATH "
                   "(a 0600 socket; relative: in the state dir)")
    p.add_argument("--token", help="require this token (else $HEARTBEAT_WEB_TOKEN): Authorization: Bearer, or ?token=")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="also answer requests for this host name (else [http] allowed_hosts); repeatable")
    p = command("metrics", cmd_metrics, "Prometheus metrics, printed or written for node_exporter (needs heartbeat[web])",
                task=False)
    p.add_argument("--textfile", help="write them atomically to this file (name it *.prom, in the collector's dir)")
    p = command("gc", cmd_gc, "bounded disk: prune old epochs' logs, archive long-done tasks, fold touches "
                "([retention])", task=False, json_=True)
    p.add_argument("--dry-run", action="store_true", help="print what would be removed, archived and folded; "
                   "change nothing")
    p.add_argument("--now", help=argparse.SUPPRESS)  # ISO 8601: ages are judged from this instant (simulations)


    p = command("db", cmd_db, "the PostgreSQL store's schema: upgrade (idempotent) or status", task=False)
    p.add_argument("action", choices=["upgrade", "status"])
    command("hosts", cmd_hosts, "the daemons sharing a PostgreSQL store: state, agents, last lease renewal",
            task=False, json_=True)
    p = command("export", cmd_export, "write the store's batons (verbatim) and ledger as JSON Lines", task=False)
    p.add_argument("--to", help="file to write (default: stdout)")
    p = command("import", cmd_import, "read an export into the store; ids it has already are kept", task=False)
    p.add_argument("file", help="an export (- for stdin)")
    p = command("migrate", cmd_migrate, "copy batons and ledger between stores, idempotently", task=False)
    p.add_argument("--from", dest="from_", required=True, metavar="STATE_DIR|URL", help="the source store")
    p.add_argument("--to", required=True, metavar="URL|STATE_DIR", help="the target store")
    if only is not None and only not in sub.choices:
        return build_parser()  # not a command: the full parser says so, and lists the commands
    return parser


def _version() -> str:
    from heartbeat import __version__

    return f"heartbeat {__version__}"


def _check_utf8(argv: Sequence[str]) -> None:
    """Refuse arguments holding bytes that are not UTF-8: a baton is UTF-8 text, and Python
    would carry such bytes as lone surrogates that no file or ledger row can hold."""
    for number, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadInput(f"argument {number} is not valid UTF-8 (byte {exc.start}): {arg[:40]!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        if _command_in(argv) == "hook":  # run by Claude Code at every turn: no argparse, never exit 2
            rest = list(argv)
            rest.remove("hook")
            if "-h" in rest or "--help" in rest:
                build_parser("hook").parse_args(["hook", "--help"])  # prints the usage and exits 0
            from heartbeat.hooks import hook_main

            return hook_main(rest)
        _check_utf8(argv)
        args = _hot_args(argv)
        if args is None:
            argv = _hoist_global_options(argv)
            args = build_parser(_command_in(argv)).parse_args(argv)
        if not getattr(args, "func", None):
            build_parser().print_help(sys.stderr)
            return EXIT_BAD_INPUT
        return int(args.func(args))
    except HeartbeatError as exc:
        print(f"heartbeat: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_ERROR
    except OSError as exc:  # e.g. stdout on a full disk: one line, as every other error
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"heartbeat: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
