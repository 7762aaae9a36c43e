"""The one reader of an agent's own call: which of its few shapes an argv is, read without argparse.

An agent runs ``heartbeat touch ID``, ``set ID F=V...``, ``add ID FIELD V...``, ``show ID``,
``brief ID`` and ``done ID [--note NOTE]`` many times a session. Each shape is answered on the fastest path there is
(the pulse, the daemon's relay, the CLI without argparse), and every one of those paths asks this
module, so they cannot drift apart: :func:`heartbeat.hotpath.pulse.hot_touch`,
:func:`heartbeat.hotpath.relay.relayable` and :func:`~heartbeat.hotpath.relay.is_read`,
:func:`heartbeat.tasks.write.parse_hot`,
:func:`heartbeat.cli.parser._hot_args` and ``heartbeat/__main__.py``. It imports nothing: it is
loaded by every agent call.

A call with any option (an argument starting with ``-``), other than ``done``'s ``--note`` and a
read's ``--json``, is not a hot call: argparse reads it and says what is wrong with it.
"""

from __future__ import annotations

__all__ = ["WRITES", "READS", "AGENT_COMMANDS", "HOOK_AGENTS", "HOOK_OPTIONS", "agent_call", "hook_args"]

WRITES = ("touch", "set", "add")
"""The agent's writes the CLI can run without building its parser."""

AGENT_COMMANDS = ("touch", "show", "done")
"""What an agent's relay carries besides ``set``/``add`` on a database store (relay greeting 2)."""

READS = ("show", "brief")
"""The reads any daemon's relay answers (:mod:`heartbeat.reports.reads`), with or without ``--json``."""

HOOK_AGENTS = ("claude", "codex")
"""``heartbeat hook AGENT``: the agent CLI's hook, run at every tool call of a bound session."""

HOOK_OPTIONS = ("--task", "--state-dir", "--config")
"""The options of ``heartbeat hook AGENT``, each with a value (``--task ID`` or ``--task=ID``)."""


def agent_call(argv: list[str] | tuple[str, ...]) -> tuple[str, str, tuple[str, ...], str | None] | None:
    """``(command, task, rest, note)`` for an agent's hot call, else None.

    ``touch ID``, ``show ID``, ``done ID`` and ``done ID --note NOTE`` (``rest`` empty, ``note`` the
    note or None); ``show ID --json``, ``brief ID`` and ``brief ID --json`` (``rest`` holds the
    ``--json``); ``set ID F=V...`` (``rest`` the pairs) and ``add ID FIELD V...`` (``rest`` the field
    and its values); ``hook AGENT`` (``task`` is the agent CLI's name). No other argument may start
    with ``-``.
    """
    if len(argv) < 2 or argv[1].startswith("-"):
        return None
    command, task = argv[0], argv[1]
    if command == "hook":
        return (command, task, (), None) if len(argv) == 2 and task in HOOK_AGENTS else None
    if command in READS and len(argv) == 3 and argv[2] == "--json":
        return command, task, ("--json",), None
    if command in AGENT_COMMANDS or command in READS:
        if len(argv) == 2:
            return command, task, (), None
        if command == "done" and len(argv) == 4 and argv[2] == "--note":
            return command, task, (), argv[3]
        return None
    if any(arg.startswith("-") for arg in argv):
        return None
    rest = tuple(argv[2:])
    if (command == "set" and rest) or (command == "add" and len(rest) >= 2):
        return command, task, rest, None
    return None


def hook_args(args: list[str] | tuple[str, ...]) -> tuple[str, dict[str, str], str]:
    """``heartbeat hook``'s arguments (after ``hook``): ``(agent, options, problem)``, read without argparse
    (the CLI runs the hook at every tool call). ``agent`` is "" when none was given; ``problem`` is the
    one line to say about an argument it cannot take, else "". Both the full hook
    (:func:`heartbeat.integrations.hooks.hook_main`) and the tool-call end's fast way read it here."""
    opts: dict[str, str] = {}
    agent = ""
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        key, sep, value = arg.partition("=")
        if key in HOOK_OPTIONS:
            if not sep:
                if not rest:
                    return agent, opts, f"{key} needs a value"
                value = rest.pop(0)
            opts[key] = value
        elif not agent and not arg.startswith("-"):
            agent = arg
        else:
            return agent, opts, f"unexpected argument {arg[:80]!r}"
    return agent, opts, ""
