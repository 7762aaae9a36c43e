"""The commands that serve: run (the daemon), web, metrics, mcp."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses


def cmd_run(args: argparse.Namespace) -> int:
    from heartbeat.daemon import run_from_cli

    return run_from_cli(args, page=_daemon_page)  # [http]: the daemon is given its page, it imports no face


def cmd_web(args: argparse.Namespace) -> int:
    from heartbeat.web.server import run_from_cli

    return run_from_cli(args)


def cmd_metrics(args: argparse.Namespace) -> int:
    from heartbeat.web.metrics import run_from_cli

    return run_from_cli(args)


def cmd_mcp(args: argparse.Namespace) -> int:
    from heartbeat.integrations.mcp_server import serve

    return serve(state_dir=args.state_dir, config=args.config)


def _daemon_page(config: Any, vitals: Any, log: Any) -> Any:
    """:func:`heartbeat.web.server.start_for_daemon`, imported only when ``[http] listen`` asks for a page
    (a daemon without one does not carry the web module's 1.7 MB)."""
    from heartbeat.web.server import start_for_daemon

    return start_for_daemon(config, vitals, log)
