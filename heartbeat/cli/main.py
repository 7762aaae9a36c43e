"""The ``heartbeat`` command. Agents call it often, so its write paths import only what
they use: no scheduler, no watcher, no structlog, no psutil (except ``claim``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from heartbeat.cli.common import _refuse_foreign
from heartbeat.cli.parser import _command_in, _help, _hoist_global_options, _hot_args, build_parser
from heartbeat.model.errors import EXIT_BAD_INPUT, EXIT_ERROR, BadInput, HeartbeatError

__all__ = ["main"]


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
            from heartbeat.integrations.hooks import hook_main

            return hook_main(rest)
        if _command_in(argv) == "help":
            return _help(argv[argv.index("help") + 1:])
        _check_utf8(argv)
        args = _hot_args(argv)
        if args is None:
            argv = _hoist_global_options(argv)
            args = build_parser(_command_in(argv)).parse_args(argv)
        if not getattr(args, "func", None):
            build_parser().print_help(sys.stderr)
            return EXIT_BAD_INPUT
        _refuse_foreign(args)
        return int(args.func(args))
    except HeartbeatError as exc:  # one prefix: a message that names the command already is not doubled
        print(f"heartbeat: {str(exc).removeprefix('heartbeat ')}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_ERROR
    except OSError as exc:  # e.g. stdout on a full disk: one line, as every other error
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"heartbeat: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
