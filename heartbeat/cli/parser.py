"""The command line's grammar: global options anywhere, the agent's hot arguments read without argparse,
and the parser of every command."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from heartbeat.hotpath.argv import agent_call
from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses

__all__ = ["build_parser"]


# -- the parser --------------------------------------------------------------------------


@functools.cache
def _parser_class() -> type[argparse.ArgumentParser]:
    # Made on first use, not at import: subclassing would load argparse on every call.
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # one line, exit 2, as every other bad input
            command = self.prog.removeprefix("heartbeat").strip()  # main prints the one "heartbeat: "
            raise BadInput(f"{command}: {message}" if command else message)

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


@functools.cache
def _lazy(group: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``heartbeat.cli.GROUP``, imported when it runs: a call loads its own
    group's module (and what that imports) alone, never every command's. One function per command,
    so every parser's namespace holds the same one."""

    def run(args: argparse.Namespace) -> int:
        module = __import__(f"heartbeat.cli.{group}", fromlist=[name])
        return int(getattr(module, name)(args))

    run.__name__ = run.__qualname__ = name
    return run


_ID: Argument = ("id", {"help": "task id"})
_EPOCH: Argument = ("--epoch", {"type": _int64, "help": "your epoch (else $HEARTBEAT_EPOCH); a superseded one is "
                                "refused"})
_EXPECT_REVISION: Argument = ("--expect-revision", {"type": _int64, "help": "refuse (exit 5) if the baton moved "
                                                    "past this revision"})

AGENT_WRITES: dict[str, tuple[Callable[[argparse.Namespace], int], str, tuple[Argument, ...]]] = {
    "set": (_lazy("tasks", "cmd_set"), "set scalar fields",
            (_ID, ("pairs", {"nargs": "+", "metavar": "FIELD=VALUE"}), _EPOCH, _EXPECT_REVISION)),
    "add": (_lazy("tasks", "cmd_add"), "append to a list field",
            (_ID, ("field", {}), ("values", {"nargs": "+", "metavar": "VALUE"}), _EPOCH, _EXPECT_REVISION,
             ("--check", {"help": "with `guarantees`: the [checks.NAME] proving it"}),
             ("--protect", {"action": "append", "metavar": "GLOB",
                            "help": "with `constraints`: a path glob (relative to the workdir) the rail refuses to "
                            "let the agent write or name in a command (repeatable)"}),
             ("--forbid", {"action": "append", "metavar": "COMMAND_GLOB",
                           "help": "with `constraints`: a shell command glob the rail refuses (repeatable)"}))),
    "touch": (_lazy("tasks", "cmd_touch"), "heartbeat: alive, still on this step", (_ID, _EPOCH)),
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
    argparse. ``tests/integration/test_cli.py`` checks that both give the same namespace, for any arguments. Which
    calls it reads at all, :func:`heartbeat.hotpath.argv.agent_call` says, as for every hot path.
    """
    call = agent_call(list(argv))
    if call is None or call[0] not in AGENT_WRITES:
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


def _ordered_action() -> Any:
    import argparse

    class Ordered(argparse._AppendAction):
        """``append``, also keeping every ``--constraint``/``--protect``/``--forbid`` in the order given."""

        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            order = list(getattr(namespace, "guard_order", None) or [])
            namespace.guard_order = [*order, (self.dest, values)]

    return Ordered


def cmd_help(args: argparse.Namespace) -> int:
    return _help([])


def _help(rest: Sequence[str]) -> int:
    """``heartbeat help``: every command; ``help COMMAND``: its options (as ``COMMAND --help``), on stdout."""
    if rest:
        build_parser(rest[0]).parse_args([rest[0], "--help"])  # prints and exits 0; an unknown one: exit 2
    build_parser().print_help(sys.stdout)
    return 0


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

    def command(name: str, func: Callable[[argparse.Namespace], int] | str, help_: str, *, task: bool = True,
                write: bool = False, json_: bool = False) -> argparse.ArgumentParser:
        """``func``: the function, or ``"GROUP.NAME"`` of a module of heartbeat.cli, imported when it runs."""
        if only is not None and name != only:
            return cast(argparse.ArgumentParser, _Skipped())
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=_lazy(*func.split(".", 1)) if isinstance(func, str) else func)
        if task:
            p.add_argument(_ID[0], **_ID[1])
        if write:
            p.add_argument(_EPOCH[0], **_EPOCH[1])
        if json_:
            p.add_argument("--json", action="store_true", help="print one JSON document")
        return p

    p = command("init", "state.cmd_init", "write a starter config and state dir", task=False)
    p.add_argument("dir", nargs="?", default=".", help="where (default: here)")
    p.add_argument("--force", action="store_true", help="overwrite an existing heartbeat.toml")
    p = command("check-config", "state.cmd_check_config", "validate the config", task=False)
    p.add_argument("--explain", action="store_true",
                   help="print each launcher as it will run: program, argv, brief, env, session, exit handling")
    command("doctor", "state.cmd_doctor", "check, as this user, what the config cannot say: the state dir, the "
            "daemon, the hooks", task=False)
    p = command("run", "serve.cmd_run", "the daemon (what systemd starts)", task=False)
    p.add_argument("--dry-run", action="store_true", help="decide and log, but launch nothing")
    p.add_argument("--once", action="store_true", help="one tick, then exit")
    p = command("demo", "state.cmd_demo", "a self-contained run: an agent is killed mid-task and its successor resumes",
                task=False)
    p.add_argument("--keep", action="store_true", help="keep the demo's state dir")

    p = command("new", "tasks.cmd_new", "create a task", write=False)
    _Ordered = _ordered_action()
    p.add_argument("--task", required=True, help="what the task is")
    p.add_argument("--step", required=True, help="the current step")
    p.add_argument("--intent", help="why the task exists")
    p.add_argument("--next", help="the next step")
    p.add_argument("--workdir", help="the task's working directory (default: here)")
    p.add_argument("--launcher", help="a [launchers.NAME] of the config")
    p.add_argument("--handoff", help="path to a longer briefing")
    p.add_argument("--key-file", action="append", help="a key file, relative to the workdir (repeatable)")
    p.add_argument("--constraint", action=_Ordered, help="a constraint (repeatable)")
    p.add_argument("--protect", action=_Ordered, metavar="GLOB", help="the --constraint before it protects this "
                   "path glob, relative to the workdir: the rail refuses writes to it and commands naming it "
                   "(repeatable)")
    p.add_argument("--forbid", action=_Ordered, metavar="COMMAND_GLOB", help="the --constraint before it forbids "
                   "shell commands matching this glob (repeatable)")
    p.add_argument("--irreversible", action="append", metavar="COMMAND_GLOB", help="a command glob that needs a "
                   "fresh verify (replaces the launcher's and the config's; repeatable)")
    p.add_argument("--plan", action="append", help="a plan step, in order (repeatable)")
    p.add_argument("--blocked-on", help="start blocked on this")
    p.add_argument("--gate", help="how the block clears: human|file:[HOST:]PATH|time:ISO8601|task:ID|"
                   "check:[HOST:]NAME")
    p.add_argument("--claim", action="store_true", help="claim it for the calling process; prints the epoch")
    p.add_argument("--pid", type=_int64, help="with --claim: the owner's pid (default: the caller's parent)")
    p.add_argument("--after", action="append", help="an upstream task: held until it is done, then briefed with "
                   "its package (repeatable)")
    p.add_argument("--needs", action="append", metavar="PART[,PART]", help="the parts of each upstream's package "
                   "this task needs (intent, constraints, decisions, rejected, unknowns, handoff, key_files, "
                   "guarantees): the upstream's `done` is refused while one is empty (repeatable)")
    p.add_argument("--guarantee", action="append", help="what this task promises its consumers: TEXT or "
                   "TEXT::CHECK, CHECK a [checks.NAME] that `done` and the consumers' `verify` run (repeatable)")
    p.add_argument("--on-broken", help="when an upstream's guarantee breaks: reopen (default), escalate or "
                   "fallback:LAUNCHER")
    p.add_argument("--host-label", action="append", help="on a shared store, only a daemon whose daemon.labels "
                   "include this label dispatches the task (repeatable)")

    p = command("show", "tasks.cmd_show", "print a baton", json_=True)
    for name, (func, help_, arguments) in AGENT_WRITES.items():
        p = command(name, func, help_, task=False)
        for argument, options in arguments:
            p.add_argument(argument, **options)
    p = command("claim", "tasks.cmd_claim", "take the task for an agent the daemon did not start; prints the epoch")
    p.add_argument("--pid", type=_int64, help="the owner's pid (default: the caller's parent)")
    p.add_argument("--force", action="store_true", help="take it even from a live agent")
    command("release", "tasks.cmd_release", "hand the task back to the daemon", write=True)
    p = command("snooze", "tasks.cmd_snooze", "end the shift; the daemon wakes the task later", write=True)
    p.add_argument("--until", help="ISO 8601 time")
    p.add_argument("--for", dest="for_", help="a duration: 30m, 2h")
    p = command("block", "tasks.cmd_block", "block the task", write=True)
    p.add_argument("--on", required=True, help="what it is blocked on")
    p.add_argument("--gate", default="human", help="human|file:PATH|time:ISO8601|task:ID|check:NAME")
    p = command("unblock", "tasks.cmd_unblock", "lift a block (a named human)")
    p.add_argument("--by", required=True, help="who")
    p.add_argument("--note")
    p = command("done", "tasks.cmd_done", "mark the task done", write=True)
    p.add_argument("--note")
    p.add_argument("--force", action="store_true", help="a person's: finish although a downstream's need is "
                   "unmet (recorded in the ledger; refused to an agent the daemon launched)")
    p = command("needs", "tasks.cmd_needs", "what a task needs of each upstream's package, and where each need "
                "came from (declared, learned, pinned); --pin/--drop change them", json_=True)
    p.add_argument("--pin", action="append", metavar="PART", help="require this part of every upstream (repeatable)")
    p.add_argument("--drop", action="append", metavar="PART", help="stop requiring this part, whatever required it "
                   "(repeatable)")
    p.add_argument("--by", help="who (default: your login name)")
    p = command("ask", "tasks.cmd_ask", "ask a question across the seam and wait on the answer; prints its id",
                write=True)
    p.add_argument("question", help="the question (plain text)")
    p.add_argument("--to", choices=["upstream", "person"], help="whom to ask (default: the task's upstream when it "
                   "has exactly one, else a person)")
    p.add_argument("--upstream", metavar="UP", help="with --to upstream and several upstreams: which one")
    p = command("answer", "tasks.cmd_answer", "answer a task's question (a person, or the agent of the upstream "
                "it was asked of)")
    p.add_argument("qid", help="the question's id (q1, q2, ...)")
    p.add_argument("text", help="the answer (plain text)")
    p.add_argument("--by", help="who answers (default: person; an agent answers as its own upstream task)")
    p.add_argument("--epoch", type=_int64, help="an upstream's agent: its epoch (else $HEARTBEAT_EPOCH)")
    p = command("fail", "tasks.cmd_fail", "mark the task failed", write=True)
    p.add_argument("--reason", required=True)
    p = command("retry", "tasks.cmd_retry", "re-arm an escalated or failed task")
    p.add_argument("--by", required=True, help="who")
    p.add_argument("--note")
    p = command("pause", "tasks.cmd_pause", "hold a task: nothing is dispatched until `resume` (a running agent is "
                "stopped after inactive_grace)")
    p.add_argument("--by", help="who (default: your login name)")
    p.add_argument("--reason")
    p = command("resume", "tasks.cmd_resume", "make a paused task active again")
    p.add_argument("--by", help="who (default: your login name)")
    p = command("rm", "tasks.cmd_rm", "archive a task and forget it: its baton and ledger go into archive/ (as gc's), "
                "one `archived` event stays; refused for a running task or one others depend on")
    p.add_argument("--by", help="who (default: your login name)")
    command("help", cmd_help, "this list, or `help COMMAND`: that command's options", task=False)
    p = command("status", "watch.cmd_status", "one row per task", task=False, json_=True)
    p.add_argument("--watch", nargs="?", type=float, const=_watch_default(), metavar="SECONDS",
                   help="redraw every SECONDS (default 2) until Ctrl-C")
    p = command("pipeline", "tasks.cmd_pipeline", "create a chain or DAG of tasks from a TOML file", task=False)
    p.add_argument("action", choices=["new"], help="new")
    p.add_argument("name", help="the pipeline's name: its tasks are NAME.STAGE")
    p.add_argument("--from", dest="from_", required=True, metavar="FILE.toml", help="one [stages.STAGE] per stage")
    command("log", "tasks.cmd_log", "the ledger's events for one task", json_=True)
    p = command("logs", "tasks.cmd_logs", "the agent's own output: logs/ID/EPOCH.log of the current epoch")
    p.add_argument("--epoch", type=_int64, help="this epoch's output instead of the current one's")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended, until Ctrl-C")
    p = command("brief", "tasks.cmd_brief", "what the next agent reads first: intent, constraints, state, context, pointers",
                json_=True)
    p.add_argument("--budget", type=_int64, help="tokens (UTF-8 bytes / 4) the brief may use (default 4000)")
    p.add_argument("--epoch", type=_int64, help="your epoch (else $HEARTBEAT_EPOCH): warned about when superseded")
    p = command("verify", "tasks.cmd_verify", "does the baton still hold? 0 fresh, 3 stale, 4 not active, 5 superseded",
                json_=True)
    p.add_argument("--epoch", type=_int64, help="your epoch (else $HEARTBEAT_EPOCH): exit 5 when superseded")
    p = command("report", "watch.cmd_report", "handoff quality from the ledger, per task and in total", task=False,
                json_=True)
    p.add_argument("--since", help="count only what happened at or after this ISO 8601 time")
    p.add_argument("--edges", action="store_true", help="profile the handoffs between tasks (upstream -> "
                   "downstream, and by launcher pair) instead")
    p = command("hook", "agents.cmd_hook", "run by Claude Code or Codex at a hook event (JSON on stdin); always exits 0",
                task=False)
    p.add_argument("agent", choices=["claude", "codex"])
    p.add_argument("--task", help="the task (else $HEARTBEAT_TASK, else the one whose workdir is the event's cwd)")
    p = command("hooks", "agents.cmd_hooks", "install or uninstall heartbeat's Claude Code / Codex hooks (and Codex's "
                "AGENTS.md section)", task=False)
    p.add_argument("action", choices=["install", "uninstall"])
    p.add_argument("agent", choices=["claude", "codex"])
    p.add_argument("--dir", help="the project directory (default: here)")
    p.add_argument("--user", action="store_true", help="~/.claude/settings.json or $CODEX_HOME/hooks.json instead of "
                   "the project's")
    p.add_argument("--mcp", action="store_true", help="claude: also register `heartbeat mcp` in the project's .mcp.json")
    p.add_argument("--task", help="pin the task id (else $HEARTBEAT_TASK or the workdir decides)")
    command("mcp", "serve.cmd_mcp", "serve the batons over MCP on stdio (needs the mcp extra)", task=False)
    p = command("web", "serve.cmd_web", "the read-only status page (needs the web extra)", task=False)
    p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8787; a token is required) or unix:PATH "
                   "(a 0600 socket; relative: in the state dir)")
    p.add_argument("--token", help="require this token (else $HEARTBEAT_WEB_TOKEN): Authorization: Bearer, or ?token=")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="also answer requests for this host name (else [http] allowed_hosts); repeatable")
    p = command("metrics", "serve.cmd_metrics",
                "Prometheus metrics, printed or written for node_exporter (needs the web extra)", task=False)
    p.add_argument("--textfile", help="write them atomically to this file (name it *.prom, in the collector's dir)")
    p = command("gc", "state.cmd_gc", "bounded disk: prune old epochs' logs, archive long-done tasks, fold touches "
                "([retention])", task=False, json_=True)
    p.add_argument("--dry-run", action="store_true", help="print what would be removed, archived and folded; "
                   "change nothing")
    p.add_argument("--now", help=argparse.SUPPRESS)  # ISO 8601: ages are judged from this instant (simulations)


    p = command("db", "state.cmd_db", "the PostgreSQL store's schema: upgrade (idempotent) or status", task=False)
    p.add_argument("action", choices=["upgrade", "status"])
    command("hosts", "watch.cmd_hosts", "the daemons sharing a PostgreSQL store: state, agents, last lease renewal",
            task=False, json_=True)
    p = command("export", "state.cmd_export", "write the store's batons (verbatim) and ledger as JSON Lines", task=False)
    p.add_argument("--to", help="file to write (default: stdout)")
    p = command("import", "state.cmd_import", "read an export into the store; ids it has already are kept", task=False)
    p.add_argument("file", help="an export (- for stdin)")
    p = command("migrate", "state.cmd_migrate", "copy batons and ledger between stores, idempotently", task=False)
    p.add_argument("--from", dest="from_", required=True, metavar="STATE_DIR|URL", help="the source store")
    p.add_argument("--to", required=True, metavar="URL|STATE_DIR", help="the target store")
    if only is not None and only not in sub.choices:
        return build_parser()  # not a command: the full parser says so, and lists the commands
    return parser


def _watch_default() -> float:
    from heartbeat.model import defaults

    return defaults.STATUS_WATCH_INTERVAL


def _version() -> str:
    from heartbeat import __version__

    return f"heartbeat {__version__}"
