"""The commands that serve: run (the daemon), web, metrics, mcp."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses


def cmd_run(args: argparse.Namespace) -> int:
    from heartbeat.daemon import run_from_cli
    from heartbeat.web.server import start_for_daemon  # [http]: the daemon is given its page, it imports no face

    return run_from_cli(args, page=start_for_daemon)


def cmd_web(args: argparse.Namespace) -> int:
    from heartbeat.web.server import run_from_cli

    return run_from_cli(args)


def cmd_metrics(args: argparse.Namespace) -> int:
    from heartbeat.web.metrics import run_from_cli

    return run_from_cli(args)


def cmd_mcp(args: argparse.Namespace) -> int:
    from heartbeat.integrations.mcp_server import serve

    return serve(state_dir=args.state_dir, config=args.config)
