"""The agent's write without :mod:`inspect`: a stand-in module that imports it on first use.

Only ``heartbeat/__main__.py`` installs it, only for an agent's ``touch``, ``set`` and ``add`` and the
hook at a tool call's end (each a process that writes once and exits); nothing that imports
:mod:`heartbeat.cli` (the MCP server, the hooks, tests) sees it.
"""

from __future__ import annotations

__all__ = ["defer_inspect"]


def defer_inspect() -> None:
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
