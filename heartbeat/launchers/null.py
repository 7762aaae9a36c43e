"""``type = "null"``: launches nothing; for tests and ``heartbeat run --dry-run``.

Each launch is recorded in :attr:`NullLauncher.launches` and pretends an agent runs under
a fake pid (above any real ``pid_max``, so it can never be mistaken for a process) for
``runtime`` seconds (default: forever), then exits with ``exit_code`` (default 0). A stop
is recorded in :attr:`NullLauncher.stops` and ends the pretend agent as if by SIGTERM.
No process is started or signalled, and nothing is written to disk.

Options: ``exit_code = 0``, ``runtime = "30s"`` (a duration). Tests may pass a ``clock``
(seconds, monotonic) to move time without sleeping.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from heartbeat.config.shape import LauncherConfig
from heartbeat.launchers.base import ExitStatus, LaunchRequest, build_argv, build_env
from heartbeat.launchers.liveness import is_alive, this_host
from heartbeat.model.baton import Owner
from heartbeat.model.errors import BadInput, ConfigError
from heartbeat.model.timeparse import parse_duration, utcnow

__all__ = ["NullLauncher", "FakeAgent", "FAKE_PID_BASE"]

FAKE_PID_BASE = 1 << 23
"""Fake pids start here: above Linux's largest ``pid_max`` (2**22), so never a real process."""

_pids = itertools.count(FAKE_PID_BASE)


@dataclass
class FakeAgent:
    """One pretend agent: what it was launched with and how long it runs."""

    request: LaunchRequest
    owner: Owner
    argv: list[str]
    env: dict[str, str]
    started: float
    runtime: float | None
    exit_code: int
    stopped_at: float | None = None


class NullLauncher:
    """Records launches and pretends agents run (see the module doc)."""

    def __init__(self, config: LauncherConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = config.name
        self.config = config
        self.clock = clock
        options = dict(config.options)
        unknown = set(options) - {"exit_code", "runtime"}
        if unknown:
            raise ConfigError(f"unknown option {sorted(unknown)[0]!r} (known: exit_code, runtime)",
                              field=f"launchers.{config.name}")
        code = options.get("exit_code", 0)
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise ConfigError(f"expected an exit code from 0 to 255, got {code!r}",
                              field=f"launchers.{config.name}.exit_code")
        self.exit_code: int = code
        self.runtime: float | None = None
        if "runtime" in options:
            try:
                self.runtime = parse_duration(options["runtime"])
            except BadInput as exc:
                raise ConfigError(exc.message, field=f"launchers.{config.name}.runtime") from None
        self.launches: list[LaunchRequest] = []
        self.stops: list[Owner] = []
        self.kills: list[Owner] = []
        self.agents: dict[int, FakeAgent] = {}

    def launch(self, req: LaunchRequest) -> Owner:
        # Build argv and env as a real launcher would, so a dry run surfaces the same errors.
        argv = build_argv(self.config, req) if self.config.command else []
        env = build_env(self.config, req)
        pid = next(_pids)
        now = self.clock()
        owner = Owner(pid=pid, create_time=time.time(), host=this_host(), launcher=self.name,
                      session=req.session, how="dispatch", started_at=utcnow())
        self.launches.append(req)
        self.agents[pid] = FakeAgent(req, owner, argv, env, now, self.runtime, self.exit_code)
        return owner

    def _ended(self, agent: FakeAgent) -> float | None:
        """The clock time the pretend agent ended, or None while it runs."""
        if agent.stopped_at is not None:
            return agent.stopped_at
        if agent.runtime is not None and self.clock() - agent.started >= agent.runtime:
            return agent.started + agent.runtime
        return None

    def alive(self, owner: Owner) -> bool:
        agent = self.agents.get(owner.pid or -1)
        if agent is None:
            # Not ours (a dry run over real batons): the truth about a real process.
            return is_alive(owner)
        return self._ended(agent) is None

    def exit_status(self, owner: Owner, exit_file: str) -> ExitStatus | None:
        agent = self.agents.get(owner.pid or -1)
        if agent is None:
            return None
        ended = self._ended(agent)
        if ended is None:
            return None
        ended_at = (agent.owner.started_at or utcnow()) + timedelta(seconds=ended - agent.started)
        if agent.stopped_at is not None:
            return ExitStatus(code=None, signal=int(signal.SIGTERM), ended_at=ended_at)
        return ExitStatus(code=agent.exit_code, signal=None, ended_at=ended_at)

    def stop(self, owner: Owner, *, grace: float) -> bool:
        self.stops.append(owner)
        agent = self.agents.get(owner.pid or -1)
        if agent is not None and self._ended(agent) is None:
            agent.stopped_at = self.clock()
        return True

    def kill(self, owner: Owner) -> bool:
        self.kills.append(owner)
        return self.stop(owner, grace=0.0)

    def reap(self) -> None:
        return None
