"""The commands that operate a state: init, check-config, gc, db, export, import, migrate, demo."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from heartbeat.model.errors import EXIT_ERROR, BadInput

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses
from heartbeat.cli.common import _store


def cmd_gc(args: argparse.Namespace) -> int:
    from heartbeat.ops.retention import gc_from_cli

    return gc_from_cli(args)


# -- commands: setup ---------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    from heartbeat.ops.starter import write_starter

    path = write_starter(args.dir, force=args.force)
    print(f"wrote {path}")
    print(f"next: heartbeat --config {path} check-config")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from heartbeat.config.check import problems
    from heartbeat.config.load import find_config, load_config

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
    found = problems(config)
    for problem in found:  # each its own line, the key and the fix in it, as the config's own errors
        print(f"heartbeat: {problem.line(path)}", file=sys.stderr)
    if not found:
        print(f"ok: {path}: state_dir {config.state_dir}, {len(config.launchers)} launcher(s), "
              f"{len(config.checks)} check(s), {len(config.notify)} notifier(s)")
    if getattr(args, "explain", False):
        from heartbeat.presets.registry import explain

        for launcher in config.launchers.values():
            print("\n".join(explain(launcher)))
    return 2 if found else 0


def cmd_db(args: argparse.Namespace) -> int:
    """``heartbeat db upgrade|status``: the PostgreSQL store's schema."""
    from heartbeat.config.load import resolve_store

    url = resolve_store(args.state_dir, args.config)[1]
    if not url:
        raise BadInput("no database store configured: set [store] url or $HEARTBEAT_STORE_URL")
    try:
        from heartbeat.store.postgres import connection, schema
    except ImportError:
        from heartbeat.system.extras import Extra, install_hint

        raise BadInput(f"a PostgreSQL store needs the postgres extra: {install_hint(Extra.POSTGRES)}") from None
    ours = schema.SCHEMA_VERSION
    if args.action == "upgrade":
        before, after = schema.upgrade(url)
        if after > ours:
            print(f"schema at version {after}, newer than this heartbeat ({ours}) but usable by it (nothing to do)")
        else:
            print(f"schema at version {after}" + (f" (was {before})" if before != after else " (nothing to do)"))
        return 0
    conn = connection.connect(url)
    try:
        found, floor = schema.schema_state(conn)
    finally:
        conn.close()
    print(f"schema version {found} (min_reader {floor}); this heartbeat uses {ours}")
    return 0 if schema.schema_refusal(found, floor, "") is None else EXIT_ERROR


def cmd_export(args: argparse.Namespace) -> int:
    from heartbeat.ops.transfer import write_export

    store = _store(args)
    try:
        if args.to and args.to != "-":
            import io
            from contextlib import ExitStack

            from heartbeat.system.safefile import open_atomic

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
    from heartbeat.ops.transfer import import_lines

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
    from heartbeat.ops.transfer import migrate, open_exact

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
    from heartbeat.model.errors import DaemonRunning
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
    from heartbeat.model.errors import DaemonRunning

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
    from heartbeat.ops.demo import run_demo

    return run_demo(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    from heartbeat.cli.doctor import run_from_cli

    return run_from_cli(args)
