"""The commands the agent CLIs run or a person runs to wire them: hook, hooks install/uninstall."""

from __future__ import annotations

from typing import TYPE_CHECKING

from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses


def cmd_hook(args: argparse.Namespace) -> int:
    from heartbeat.integrations.hooks import run_hook

    return run_hook(args.agent, task=args.task, state_dir=args.state_dir, config=args.config)


def cmd_hooks(args: argparse.Namespace) -> int:
    from heartbeat.integrations import claude, codex

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
