"""The commands the agent CLIs run or a person runs to wire them: hook, hooks install/uninstall."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses


def cmd_hook(args: argparse.Namespace) -> int:
    from heartbeat.integrations.hooks import run_hook

    return run_hook(args.agent, task=args.task, state_dir=args.state_dir, config=args.config)


def cmd_hooks(args: argparse.Namespace) -> int:
    from heartbeat.integrations import claude, codex

    if args.action == "install":
        args.state_dir, args.config = _install_options(args)
    if args.agent == "codex":
        if args.mcp:
            raise BadInput("--mcp is for claude; codex reads its MCP servers from its own config.toml")
        written = (codex.install_codex(args.dir, user=args.user, state_dir=args.state_dir, config=args.config,
                                       task=args.task) if args.action == "install"
                   else codex.uninstall_codex(args.dir, user=args.user, state_dir=args.state_dir, config=args.config))
    elif args.action == "install":
        written = claude.install_claude(args.dir, user=args.user, mcp=args.mcp, state_dir=args.state_dir,
                                       config=args.config, task=args.task)
    else:
        written = claude.uninstall_claude(args.dir, user=args.user, state_dir=args.state_dir, config=args.config)
    for path in written:
        print(f"{'wrote' if args.action == 'install' else 'updated'} {path}")
    if not written:
        print("nothing to change: " + ("already installed" if args.action == "install" else "not installed"))
    elif args.agent == "codex" and args.action == "install":
        print("codex runs a new or changed hook only once it is trusted: review it with /hooks in `codex` "
              "(project hooks also need a trusted project: `codex exec --trust`), or run `codex exec "
              "--dangerously-bypass-hook-trust`")
    return 0


def _install_options(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The state dir and config the hooks are installed for: those given, else those this command
    resolved from ``$HEARTBEAT_STATE_DIR``/``$HEARTBEAT_CONFIG``/``./heartbeat.toml``, so a session
    in a terminal without those variables is served too (the config stays the state dir's source
    when it gives it)."""
    from heartbeat.config.load import find_config

    state_dir = args.state_dir or (os.environ.get("HEARTBEAT_STATE_DIR") if not args.config else None) or None
    config = find_config(args.config)
    if config and not os.path.isfile(config):
        where = "--config" if args.config else "$HEARTBEAT_CONFIG"
        raise BadInput(f"{where} names {config}, which is not a file: the hooks would find no config there")
    return (os.path.abspath(state_dir) if state_dir else None), (os.path.abspath(config) if config else None)
