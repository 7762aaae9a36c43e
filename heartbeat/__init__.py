"""heartbeat: keep long-running agent work alive across the seams between invocations.

The Python API is :func:`open_task`; the rest lives in one module per concept (see the
"Code map" in docs/development.md). Importing this package is cheap: nothing heavy is loaded until used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs an agent's touch more than its write

__version__ = "0.1.0"
__all__ = ["__version__", "open_task", "Task", "Baton", "HeartbeatError"]

if TYPE_CHECKING:
    from typing import Any

    from heartbeat.api import Task, open_task
    from heartbeat.model.baton import Baton
    from heartbeat.model.errors import HeartbeatError


def __getattr__(name: str) -> Any:
    if name in ("open_task", "Task"):
        from heartbeat import api

        return getattr(api, name)
    if name == "Baton":
        from heartbeat.model.baton import Baton

        return Baton
    if name == "HeartbeatError":
        from heartbeat.model.errors import HeartbeatError

        return HeartbeatError
    raise AttributeError(name)
