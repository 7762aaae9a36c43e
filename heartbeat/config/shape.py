"""The config's shape: one frozen dataclass per table, with the defaults a missing key takes."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from heartbeat.model import defaults
from heartbeat.model.errors import BadInput
from heartbeat.model.knobs import HandoffKnobs, PolicyKnobs

__all__ = [
    "Config",
    "DaemonConfig",
    "StoreConfig",
    "LauncherConfig",
    "CommandConfig",
    "HooksConfig",
    "RetentionConfig",
    "Listen",
    "parse_listen",
    "expand_argv",
    "LAUNCHER_PLACEHOLDERS",
    "NOTIFY_PLACEHOLDERS",
]

LAUNCHER_PLACEHOLDERS = frozenset({"id", "brief_file", "workdir", "epoch", "attempt", "state_dir", "session"})
NOTIFY_PLACEHOLDERS = frozenset({"id", "reason", "status", "epoch", "attempt"})
CHECK_PLACEHOLDERS = frozenset({"id", "workdir"})
BUILTIN_LAUNCHER_KEYS = {
    "exec": frozenset(),
    "systemd-run": frozenset({"properties", "slice", "user"}),
    "null": frozenset({"exit_code", "runtime"}),
}
PRESET_KEYS = frozenset({"preset", "program", "args", "session", "max_resumes_per_session", "irreversible"})
"""Keys every launcher type takes for presets and sessions (:mod:`heartbeat.presets.common`)."""
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


@dataclass(frozen=True)
class Listen:
    """Where the page is served: TCP ``host:port``, or the Unix socket at ``path`` (``unix:PATH``)."""

    host: str = ""
    port: int = 0
    path: str = ""

    def in_dir(self, state_dir: str) -> Listen:
        """A relative socket path is in the state dir; TCP and absolute paths are unchanged."""
        if self.path and not os.path.isabs(self.path):
            return Listen(path=os.path.join(state_dir, self.path))
        return self

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(value: str, *, what: str = "--listen") -> Listen:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) or ``unix:PATH``; :class:`BadInput` otherwise."""
    what = f"{what} " if what else ""
    if value.startswith("unix:"):
        path = value[len("unix:"):]
        if not path or "\0" in path:
            raise BadInput(f"{what}{value!r}: expected unix:PATH, e.g. unix:web.sock (in the state dir)")
        return Listen(path=path)
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise BadInput(f"{what}{value!r}: expected HOST:PORT or unix:PATH, e.g. {defaults.HTTP_LISTEN}, [::1]:8787 "
                       "or unix:web.sock")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise BadInput(f"{what}{value!r}: port {port} is out of range")
    return Listen(host=host, port=port)


@dataclass(frozen=True)
class DaemonConfig(PolicyKnobs):
    """``[daemon]``: the clock, and the policy's knobs (every field of
    :class:`~heartbeat.model.knobs.PolicyKnobs`, declared there once)."""

    state_dir: str = defaults.STATE_DIR
    tick: float = defaults.TICK
    dispatches_per_minute: int = defaults.DISPATCHES_PER_MINUTE
    max_concurrent: int = defaults.MAX_CONCURRENT
    default_launcher: str = defaults.DEFAULT_LAUNCHER
    sweep_every: float = defaults.SWEEP_EVERY
    relay: bool = True
    log_format: str = "auto"
    log_level: str = "info"
    host: str = ""
    """This daemon's host id in a shared store (empty: ``$HEARTBEAT_HOST``, else the hostname)."""
    labels: tuple[str, ...] = ()
    """What this host offers; a baton's ``host_labels`` must all be among them for it to dispatch there."""
    lease_ttl: float = defaults.LEASE_TTL
    """How long a lease on a task lasts without renewal (shared store only)."""


@dataclass(frozen=True)
class StoreConfig:
    """``[store]``: where batons and the ledger live."""

    url: str = ""
    """A ``postgresql://`` URL for the PostgreSQL store; empty: the file store in ``daemon.state_dir``."""


@dataclass(frozen=True)
class LauncherConfig:
    """``[launchers.NAME]``: how to start an agent."""

    name: str
    type: str = "exec"
    command: tuple[str, ...] = ()
    brief: str = "file"
    cwd: str = "{workdir}"
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: bool | tuple[str, ...] = True
    stop_grace: float = defaults.STOP_GRACE
    max_runtime: float | None = None
    max_concurrent: int | None = None
    non_retryable_exit_codes: tuple[int, ...] = ()
    max_log_bytes: int = defaults.MAX_LOG_BYTES
    """The agent's log is cut to its tail past this size (0: never)."""
    preset: str = ""
    """``claude-code``, ``codex`` or ``gemini`` (:mod:`heartbeat.presets.common`): ``command`` was built from it."""
    args: tuple[str, ...] = ()
    """With a preset: the user's flags, placed after the preset's and before the session's."""
    session: str = defaults.SESSION
    """``fresh`` or ``resume``: what a retry does with the previous agent's session."""
    max_resumes_per_session: int = defaults.MAX_RESUMES_PER_SESSION
    irreversible: tuple[str, ...] | None = None
    """The rail's irreversible command globs for this launcher's agents (None: ``[guards]``'s)."""
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandConfig:
    """``[notify.NAME]`` and ``[checks.NAME]``: a command run with a timeout."""

    name: str
    command: tuple[str, ...]
    timeout: float


@dataclass(frozen=True)
class HooksConfig:
    """``[hooks]``: what ``heartbeat hook claude`` does at the seams inside a live session."""

    fresh_within: float = defaults.HOOK_FRESH_WITHIN
    max_stop_blocks: int = defaults.HOOK_MAX_STOP_BLOCKS


@dataclass(frozen=True)
class HttpConfig:
    """``[http]``: the status page and ``/metrics`` served by ``heartbeat run`` (needs the web extra)."""

    listen: str = ""
    """``HOST:PORT`` or ``unix:PATH`` (relative: in the state dir); empty: no server in the daemon."""
    token: str = ""
    """Required on TCP, loopback too (else ``$HEARTBEAT_WEB_TOKEN``); a Unix socket needs none."""
    allowed_hosts: tuple[str, ...] = ()
    """Names the page answers in a ``Host`` header besides its listen address (DNS rebinding)."""


@dataclass(frozen=True)
class RetentionConfig:
    """``[retention]``: what ``heartbeat gc`` (and the daemon's daily gc) keeps, archives and folds."""

    keep_epochs: int = defaults.KEEP_EPOCHS
    finished_after: float = defaults.FINISHED_AFTER
    every: float = defaults.GC_EVERY
    archive_failed: bool = False
    """Archive failed tasks too (after the same ``finished_after``); by default a failure waits for a human."""
    enabled: bool = True
    """Whether the daemon runs gc by itself (``heartbeat gc`` works either way)."""


@dataclass(frozen=True)
class HandoffConfig(HandoffKnobs):
    """``[handoff]``: how an edge's profile drives packaging (learned needs); every field is a knob of
    :class:`~heartbeat.model.knobs.HandoffKnobs`, declared there once."""


@dataclass(frozen=True)
class GuardsConfig:
    """``[guards]``: what the rail (``heartbeat hook``'s ``PreToolUse``) holds for every task."""

    irreversible: tuple[str, ...] = defaults.IRREVERSIBLE
    """Shell command globs that need a fresh ``verify`` (a launcher's or a baton's own list replaces it)."""


@dataclass(frozen=True)
class Config:
    """The whole config. ``path`` is the file it came from, or ``""`` for the built-in default."""

    path: str = ""
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    launchers: Mapping[str, LauncherConfig] = field(default_factory=dict)
    notify: Mapping[str, CommandConfig] = field(default_factory=dict)
    checks: Mapping[str, CommandConfig] = field(default_factory=dict)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    handoff: HandoffConfig = field(default_factory=HandoffConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    store: StoreConfig = field(default_factory=StoreConfig)

    @property
    def state_dir(self) -> str:
        return self.daemon.state_dir

    def irreversible(self, launcher: str) -> tuple[str, ...]:
        """The irreversible globs of ``launcher``'s agents: its own, else ``[guards]``'s."""
        lc = self.launchers.get(launcher) or self.launchers.get(self.daemon.default_launcher)
        return lc.irreversible if lc is not None and lc.irreversible is not None else self.guards.irreversible


def expand_argv(argv: tuple[str, ...] | list[str], values: Mapping[str, object]) -> list[str]:
    """Substitute ``{name}`` per argument; ``{{``/``}}`` are literal braces.

    Values are inserted as text into one argument each: they can never split into
    more arguments, reach a shell, or become the program (``argv[0]`` is checked to
    hold no placeholder when the config is loaded).
    """
    def one(arg: str) -> str:
        def sub(match: re.Match[str]) -> str:
            token = match.group(0)
            if token == "{{":
                return "{"
            if token == "}}":
                return "}"
            return str(values.get(match.group(1), ""))

        return _PLACEHOLDER.sub(sub, arg)

    return [one(arg) for arg in argv]


def placeholders_in(arg: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(arg) if m.group(1) is not None}
