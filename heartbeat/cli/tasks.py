"""The commands on one task: new, set, add, touch, claim, release, snooze, block, unblock, ask, answer, done,
fail, retry, pause, resume, rm, show, log, logs, brief, verify, and pipeline."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses
from heartbeat.cli.common import _actor, _checks, _epoch, _max_attempts, _print_json, _store, _where

# -- commands: writing -------------------------------------------------------------------


def cmd_new(args: argparse.Namespace) -> int:
    from heartbeat.model.baton import Gate, check_id
    from heartbeat.tasks import verbs as tasks

    check_id(args.id)
    gate = Gate.parse(args.gate) if args.gate else None
    if gate and not args.blocked_on:
        raise BadInput("--gate goes with --blocked-on")
    owner = _claiming_owner(args) if args.claim else None
    guarantees = _guarantees(args.guarantee or [])
    guards = _new_guards(args)
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
        constraints=[c for c in args.constraint or [] if c not in {g.constraint for g in guards}],
        guards=guards,
        irreversible=args.irreversible or [],
        plan=args.plan or [],
        blocked_on=args.blocked_on or "",
        gate=gate,
        owner=owner,
        after=after,
        needs=args.needs or [],
        guarantees=guarantees,
        on_broken=args.on_broken or "",
        host_labels=args.host_label or [],
        actor=_actor(args),
    )
    if args.claim:
        print(baton.meta.epoch)
    return 0


def _new_guards(args: argparse.Namespace) -> list[Any]:
    """``new``'s ``--protect``/``--forbid``, each guarding the ``--constraint`` given before it."""
    from heartbeat.tasks.verbs import make_guard

    globs: dict[str, tuple[list[str], list[str]]] = {}
    last = ""
    for kind, value in getattr(args, "guard_order", []):
        if kind == "constraint":
            last = value
        elif not last:
            raise BadInput(f"--{kind} guards the --constraint given before it: give one first")
        else:
            globs.setdefault(last, ([], []))[0 if kind == "protect" else 1].append(value)
    return [make_guard(args.id, text, protect, forbid) for text, (protect, forbid) in globs.items()]


def _refuse_unknown_names(args: argparse.Namespace, **names: Any) -> None:
    """A launcher or check the config does not define: exit 2 naming the configured ones."""
    from heartbeat.config.load import readable_config, refuse_unknown_names

    refuse_unknown_names(readable_config(getattr(args, "config", None)), **names)


def _upstreams(store: Any, task_id: str, after: Sequence[str]) -> list[str]:
    """``--after`` ids, each an existing task: a typo must not hold a task forever."""
    from heartbeat.model.baton import check_id
    from heartbeat.tasks.handoff import check_upstreams_exist

    out: list[str] = []
    for upstream in after:
        check_id(upstream)
        if upstream not in out:
            out.append(upstream)
    check_upstreams_exist(store.load, task_id, out, field="--after")
    return out


def _guarantees(specs: Sequence[str]) -> list[Any]:
    """``--guarantee TEXT`` or ``--guarantee TEXT::CHECK`` (the check a ``[checks.NAME]``)."""
    from heartbeat.model.baton import Guarantee

    out = []
    for spec in specs:
        text, sep, check = spec.rpartition("::")
        out.append(Guarantee(text, check.strip()) if sep else Guarantee(spec))
    return out


def _claiming_owner(args: argparse.Namespace) -> Any:
    from heartbeat.launchers.liveness import identify, this_host
    from heartbeat.model.baton import Owner
    from heartbeat.model.timeparse import utcnow

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
    from heartbeat.tasks import write

    values = write.assignments(tuple(args.pairs))
    if values.get("launcher") or values.get("on_broken"):
        _refuse_unknown_names(args, launchers=[values.get("launcher", "")], on_broken=values.get("on_broken", ""))
    write.apply(store, write.Write("set", args.id, pairs=tuple(args.pairs), expect_revision=args.expect_revision),
                epoch=epoch, actor=actor)


def cmd_add(args: argparse.Namespace) -> int:
    if args.field != "guarantees" and getattr(args, "check", None):
        raise BadInput("--check goes with `add ID guarantees TEXT`")
    if (getattr(args, "protect", None) or getattr(args, "forbid", None)) and (
            args.field != "constraints" or len(args.values) != 1):
        raise BadInput("--protect and --forbid go with `add ID constraints \"TEXT\"` (one constraint)")
    _add(_store(args), args, _epoch(args), _actor(args))
    return 0


def _add(store: Any, args: argparse.Namespace, epoch: int | None, actor: str) -> None:
    from heartbeat.tasks import write

    if args.field == "guarantees" and getattr(args, "check", None):
        _refuse_unknown_names(args, checks=[args.check])
    write.apply(store, write.Write("add", args.id, field=args.field, values=tuple(args.values),
                                   check=getattr(args, "check", None) or "", expect_revision=args.expect_revision,
                                   protect=tuple(getattr(args, "protect", None) or ()),
                                   forbid=tuple(getattr(args, "forbid", None) or ())),
                epoch=epoch, actor=actor, config_path=args.config)


def cmd_touch(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.touch(_store(args), args.id, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_claim(args: argparse.Namespace) -> int:
    from heartbeat.model.baton import check_id
    from heartbeat.tasks import verbs as tasks

    check_id(args.id)
    baton = tasks.claim(_store(args), args.id, _claiming_owner(args), force=args.force, actor=_actor(args))
    print(baton.meta.epoch)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.release(_store(args), args.id, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_snooze(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from heartbeat.model.timeparse import parse_duration, parse_instant, utcnow
    from heartbeat.tasks import verbs as tasks

    if bool(args.until) == bool(args.for_):
        raise BadInput("give one of --until ISO8601 or --for DURATION")
    if args.until:
        until = parse_instant(args.until, field="--until")
    else:
        until = utcnow() + timedelta(seconds=parse_duration(args.for_, field="--for"))
    tasks.snooze(_store(args), args.id, until, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_block(args: argparse.Namespace) -> int:
    from heartbeat.model.baton import Gate
    from heartbeat.tasks import verbs as tasks

    gate = Gate.parse(args.gate)
    tasks.block(_store(args), args.id, args.on, gate, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_unblock(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.unblock(_store(args), args.id, by=args.by, note=args.note or "")
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    from heartbeat.tasks import questions

    qid = questions.ask(_store(args), args.id, args.question, to=args.to, upstream=args.upstream,
                        epoch=_epoch(args), actor=_actor(args))
    print(qid)
    return 0


def cmd_answer(args: argparse.Namespace) -> int:
    from heartbeat.tasks import questions
    from heartbeat.tasks.write import answerer_from_env

    by, epoch = answerer_from_env(args.by, args.epoch)
    questions.answer(_store(args), args.id, args.qid, args.text, by=by, epoch=epoch, actor=_actor(args))
    return 0


def cmd_done(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    if args.force:
        from heartbeat.tasks.write import refuse_agent_force

        refuse_agent_force(args.id)
    actor = _actor(args)
    tasks.finish(_store(args), args.id, note=args.note or "", epoch=_epoch(args),
                 actor=_login() if args.force and actor == "cli" else actor,
                 checks=_checks(args) if args.config else None, force=args.force, config_path=args.config)
    return 0


def cmd_needs(args: argparse.Namespace) -> int:
    """``heartbeat needs DOWN [--pin PART] [--drop PART]``: the edges' effective needs, where each came from."""
    from heartbeat.model.baton import check_id
    from heartbeat.tasks import needs

    check_id(args.id)
    store = _store(args, read=not (args.pin or args.drop))
    if args.pin or args.drop:
        from heartbeat.tasks.write import refuse_agent_force

        refuse_agent_force(args.id, what="pin or drop a need")
        needs.pin(store, args.id, pin_parts=needs.parse_parts(args.pin or [], field="--pin") if args.pin else [],
                  drop_parts=needs.parse_parts(args.drop or [], field="--drop") if args.drop else [],
                  by=args.by or _login())
    baton = store.load(args.id)
    edges = [{"upstream": u, "role": needs.edge_role(u, baton.id),
              "needs": [n.to_json() for n in needs.edge_needs(store, baton, u)]} for u in baton.after]
    if args.json:
        _print_json({"task": baton.id, "edges": edges})
        return 0
    if not edges:
        print(f"{baton.id}: no upstream (`after`), so no needs")
    for edge in edges:
        shown = "; ".join(f"{n['part']} ({n['source']}{': ' + n['evidence'] if n['evidence'] else ''})"
                          for n in edge["needs"]) or "nothing"
        print(f"{edge['upstream']} -> {baton.id} (role {edge['role']}): needs {shown}")
    return 0


def cmd_fail(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.fail(_store(args), args.id, reason=args.reason, epoch=_epoch(args), actor=_actor(args))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.retry(_store(args), args.id, by=args.by, note=args.note or "")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.pause(_store(args), args.id, by=args.by or _login(), reason=args.reason or "")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from heartbeat.tasks import verbs as tasks

    tasks.resume(_store(args), args.id, by=args.by or _login())
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """``heartbeat rm ID``: archived as gc archives (baton and ledger into ``archive/``), then gone
    from the store; one ``archived`` event by the person stays."""
    from heartbeat.model.baton import check_id
    from heartbeat.model.timeparse import utcnow
    from heartbeat.ops.retention import remove_task

    check_id(args.id)
    store = _store(args, read=True)
    try:
        result = remove_task(store, args.id, now=utcnow(), actor=args.by or _login())
    finally:
        store.close()
    print(f"removed {args.id}: archived ({result.archived_rows} ledger rows and the baton) into "
          f"{result.archive_file}")
    return 0



def _login() -> str:
    """Who a person's command is by when ``--by`` is not given: the login name."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


# -- commands: reading -------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    from heartbeat.reports.reads import show_text

    sys.stdout.write(show_text(_store(args, read=True), _where(args)[0], args.id, as_json=args.json))
    return 0






def cmd_pipeline(args: argparse.Namespace) -> int:
    from heartbeat.tasks.pipeline import create_pipeline, parse_pipeline

    if args.action != "new":
        raise BadInput(f"unknown pipeline action {args.action!r}: use `heartbeat pipeline new NAME --from FILE.toml`")
    if not args.from_:
        raise BadInput("--from FILE.toml is required")
    from heartbeat.model.errors import UnsafePath
    from heartbeat.system.safefile import read_regular

    try:
        text = read_regular(args.from_, 1024 * 1024 + 1, follow=True).decode("utf-8")  # a FIFO must not hang us
    except UnsafePath:
        raise BadInput(f"{args.from_}: not a regular file") from None
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
    from heartbeat.model.baton import check_id

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


LOG_CHUNK = 1 << 16
"""Bytes read from an agent's log at a time: a huge log is streamed, never held whole."""


def cmd_logs(args: argparse.Namespace) -> int:
    """``heartbeat logs ID [--epoch N] [-f]``: the agent's own output, ``logs/<id>/<epoch>.log``
    (the current epoch unless given), read through no symlink and never blocking on a FIFO;
    ``-f`` keeps printing what is appended, polling, until interrupted."""
    import time

    from heartbeat.model import defaults
    from heartbeat.model.baton import check_id
    from heartbeat.model.errors import NotFound, UnsafePath
    from heartbeat.system.layout import LOGS_DIR
    from heartbeat.system.safefile import open_dir, open_regular

    check_id(args.id)
    if args.epoch is not None and args.epoch < 0:
        raise BadInput("--epoch must not be negative")
    state_dir = _where(args)[0]
    epoch = args.epoch
    if epoch is None:
        epoch = _store(args, read=True).load(args.id).meta.epoch
    name = f"{epoch}.log"
    where = os.path.join(state_dir, LOGS_DIR, args.id, name)
    try:
        dir_fd = open_dir(state_dir, LOGS_DIR, args.id, create=False)
        try:
            fd = open_regular(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:
        raise NotFound(f"no output of epoch {epoch} (no {where}: no agent was launched in it, or gc pruned it)",
                       task=args.id) from None
    except UnsafePath as exc:
        raise UnsafePath(f"{exc.message} (nothing was read)", path=where) from None
    except OSError as exc:
        raise BadInput(f"{where}: {exc.strerror}") from None
    out = sys.stdout.buffer
    try:
        while True:
            chunk = os.read(fd, LOG_CHUNK)
            if chunk:
                out.write(chunk)
                continue
            out.flush()
            if not args.follow:
                return 0
            time.sleep(defaults.LOGS_FOLLOW_POLL)
            if os.fstat(fd).st_size < os.lseek(fd, 0, os.SEEK_CUR):  # the daemon cut it (max_log_bytes)
                sys.stderr.write(f"heartbeat: {where}: cut to its tail by the daemon (the rest is in "
                                 f"{name}.1); following from its start\n")
                os.lseek(fd, 0, os.SEEK_SET)
    except KeyboardInterrupt:
        out.flush()
        return 0
    finally:
        os.close(fd)


def cmd_brief(args: argparse.Namespace) -> int:
    from heartbeat.reports.reads import brief_text

    if args.budget is not None and args.budget < 1:
        raise BadInput("--budget must be a positive number of tokens")
    store = _store(args, read=True)
    out, warnings = brief_text(store, _where(args)[0], args.id, as_json=args.json, max_attempts=_max_attempts(args),
                               epoch=_epoch(args), budget=args.budget)
    sys.stderr.write(warnings)
    sys.stdout.write(out)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from heartbeat.tasks.verify import verify

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


