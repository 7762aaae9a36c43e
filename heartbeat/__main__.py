"""The ``heartbeat`` command (``bin/heartbeat`` and ``python -m heartbeat``): the entry.

An agent's touch is answered from its pulse (:mod:`heartbeat.pulse`), its set/add through the
daemon (:mod:`heartbeat.relay`), anything else by :mod:`heartbeat.cli`. Each is imported only
when reached: this module is what every ``heartbeat`` call loads first, and an agent's touch
must cost about one interpreter start.

An agent's write that the CLI makes in this process (``touch``, ``set``, ``add``) runs with
:mod:`inspect` deferred (:func:`_defer_inspect`): only this entry does that, only for those three
commands, each a process that writes once and exits. Nothing that imports :mod:`heartbeat.cli`
(the MCP server, the hooks, tests) sees it.
"""

from __future__ import annotations

__all__ = ["main"]

_AGENT_WRITES = (["touch"], ["set"], ["add"])


def main() -> int:
    """Run the command in ``sys.argv``; its exit code."""
    import os
    import sys

    from heartbeat.pulse import hot_touch

    argv = sys.argv[1:]
    if hot_touch(argv):
        return 0
    if "run" in argv:  # the daemon: its signals are caught before anything slow (heartbeat.signals)
        from heartbeat import signals

        if signals.is_run(argv):
            signals.catch_early()
    if argv[:1] in (["set"], ["add"]) or (argv[:1] in (["touch"], ["show"], ["done"])
                                          and os.environ.get("HEARTBEAT_STORE_URL")):  # written by the daemon
        # when one runs (heartbeat.relay); on a database store its touch, done and show too
        from heartbeat.relay import forward

        code = forward(argv)
        if code is not None:
            return code
    if argv[:1] in _AGENT_WRITES:
        _defer_inspect()
    from heartbeat.cli import main as cli_main

    return cli_main()


def _defer_inspect() -> None:
    """Put a stand-in for :mod:`inspect` in ``sys.modules`` that imports it on first use.

    :mod:`dataclasses` imports inspect (with ast, dis and tokenize: about an interpreter start) for
    one call, made only for a class without a docstring, which an agent's write never makes.
    importlib's LazyLoader would not do: it needs importlib.util, and the import system reads
    ``__spec__`` from every module it finds in ``sys.modules``, which makes a lazy module load.
    """
    import sys
    import types

    class Deferred(types.ModuleType):
        def __getattr__(self, attr: str) -> object:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            __import__(self.__name__)
            module = sys.modules[self.__name__]
            self.__dict__.update(module.__dict__)  # whoever bound the stand-in now reads the module's own names
            return getattr(module, attr)

    if "dataclasses" not in sys.modules and "inspect" not in sys.modules:
        sys.modules["inspect"] = Deferred("inspect")


if __name__ == "__main__":
    raise SystemExit(main())
