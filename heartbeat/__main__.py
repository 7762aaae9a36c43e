"""The ``heartbeat`` command (``bin/heartbeat`` and ``python -m heartbeat``): the entry.

What an agent's call is, :mod:`heartbeat.hotpath.argv` reads (the one reader): its touch is
answered from its pulse (:mod:`heartbeat.hotpath.pulse`), its set/add and its show/brief through
the daemon (:mod:`heartbeat.hotpath.relay`), anything else by :mod:`heartbeat.cli`. Each is imported only
when reached: this module is what every ``heartbeat`` call loads first, and an agent's touch
must cost about one interpreter start.

An agent's write that the CLI makes in this process (``touch``, ``set``, ``add``) runs with
:mod:`inspect` deferred (:mod:`heartbeat.hotpath.defer`): only this entry does that, only for
those three commands. Nothing that imports :mod:`heartbeat.cli` (the MCP server, the hooks,
tests) sees it.
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> int:
    """Run the command in ``sys.argv``; its exit code."""
    import os
    import sys

    from heartbeat.hotpath.argv import AGENT_COMMANDS, READS, WRITES, agent_call
    from heartbeat.hotpath.pulse import hot_touch

    argv = sys.argv[1:]
    call = agent_call(argv)
    command = call[0] if call is not None else None
    if command == "touch" and hot_touch(argv):
        return 0
    if "run" in argv:  # the daemon: its signals are caught before anything slow (heartbeat.system.signals)
        from heartbeat.system import signals

        if signals.is_run(argv):
            signals.catch_early()
    if command in ("set", "add", *READS) or (command in AGENT_COMMANDS and os.environ.get("HEARTBEAT_STORE_URL")):
        # written (or read) by the daemon when one runs (heartbeat.hotpath.relay); on a database
        # store its touch and done too
        from heartbeat.hotpath.relay import forward

        code = forward(argv)
        if code is not None:
            return code
    if command == "hook" and os.environ.get("HEARTBEAT_TASK"):
        return _hook(argv)
    if argv[:1] and argv[0] in WRITES:
        from heartbeat.hotpath.defer import defer_inspect

        defer_inspect()
    from heartbeat.cli.main import main as cli_main

    return cli_main()


def _hook(argv: list[str]) -> int:
    """A bound agent's ``heartbeat hook AGENT``: a ``PreToolUse`` is decided by the daemon's rail when one
    runs (:func:`heartbeat.hotpath.relay.forward_rail`), anything else (or no daemon) by the hook here."""
    import io
    import os
    import sys

    from heartbeat.hotpath.argv import HOOK_AGENTS, hook_args
    from heartbeat.hotpath.relay import forward_rail
    from heartbeat.model import defaults

    try:
        data = sys.stdin.buffer.read(defaults.MAX_HOOK_INPUT_BYTES + 1)
    except (AttributeError, OSError, ValueError):  # no stdin, or a closed one: the hook reads nothing either
        data = b""
    if forward_rail(data) is not None:
        return 0
    agent, _, problem = hook_args(argv[1:])
    if b"PostToolUse" in data and agent in HOOK_AGENTS and not problem:  # a tool call's end: its trail line alone
        from heartbeat.hotpath.defer import defer_inspect

        defer_inspect()
        from heartbeat.hotpath.trail import end_hook

        try:
            if end_hook(data, os.environ):
                return 0
        except Exception:  # the full hook below tries again and says what is wrong, in one line
            pass
    from heartbeat.integrations.hooks import hook_main

    return hook_main(argv[1:], stdin=io.BytesIO(data))


if __name__ == "__main__":
    raise SystemExit(main())
