"""The TOML config: found, loaded and validated, with errors as ``file:line: key.path: what``.

Search order: ``--config``, ``$HEARTBEAT_CONFIG``, ``./heartbeat.toml``,
``/etc/heartbeat/heartbeat.toml``. Unknown keys are errors (a typo must not silently
fall back to a default). A config file others can write to is refused: it chooses the
programs the daemon runs.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from heartbeat import defaults
from heartbeat.baton import HOST_PATTERN, ID_PATTERN, load_toml
from heartbeat.errors import BadInput, ConfigError
from heartbeat.timeparse import parse_duration

__all__ = [
    "Config",
    "DaemonConfig",
    "StoreConfig",
    "LauncherConfig",
    "CommandConfig",
    "HooksConfig",
    "RetentionConfig",
    "find_config",
    "load_config",
    "parse_config",
    "Listen",
    "parse_listen",
    "readable_config",
    "refuse_unknown_names",
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
PRESET_KEYS = frozenset({"preset", "program", "args", "session", "max_resumes_per_session"})
"""Keys every launcher type takes for presets and sessions (:mod:`heartbeat.presets`)."""
_MIN_LOG_BYTES = 4096
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
class DaemonConfig:
    """``[daemon]``: the clock and the retry policy."""

    state_dir: str = defaults.STATE_DIR
    tick: float = defaults.TICK
    stall_after: float = defaults.STALL_AFTER
    progress_after: float = defaults.PROGRESS_AFTER
    max_attempts: int = defaults.MAX_ATTEMPTS
    max_idle_resumes: int = defaults.MAX_IDLE_RESUMES
    backoff_initial: float = defaults.BACKOFF_INITIAL
    backoff_max: float = defaults.BACKOFF_MAX
    dispatches_per_minute: int = defaults.DISPATCHES_PER_MINUTE
    max_concurrent: int = defaults.MAX_CONCURRENT
    default_launcher: str = defaults.DEFAULT_LAUNCHER
    on_spinning: str = defaults.ON_SPINNING
    inactive_grace: float = defaults.INACTIVE_GRACE
    max_limit_wait: float = defaults.MAX_LIMIT_WAIT
    """The longest a task waits for a rate or usage limit to reset before it is escalated."""
    max_cost_usd: float = defaults.MAX_COST_USD
    """What one task's runs may cost in all before it is escalated (0: no budget)."""
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
    """``claude-code``, ``codex`` or ``gemini`` (:mod:`heartbeat.presets`): ``command`` was built from it."""
    args: tuple[str, ...] = ()
    """With a preset: the user's flags, placed after the preset's and before the session's."""
    session: str = defaults.SESSION
    """``fresh`` or ``resume``: what a retry does with the previous agent's session."""
    max_resumes_per_session: int = defaults.MAX_RESUMES_PER_SESSION
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
class Config:
    """The whole config. ``path`` is the file it came from, or ``""`` for the built-in default."""

    path: str = ""
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    launchers: Mapping[str, LauncherConfig] = field(default_factory=dict)
    notify: Mapping[str, CommandConfig] = field(default_factory=dict)
    checks: Mapping[str, CommandConfig] = field(default_factory=dict)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    store: StoreConfig = field(default_factory=StoreConfig)

    @property
    def state_dir(self) -> str:
        return self.daemon.state_dir


def find_config(explicit: str | None = None, *, env: Mapping[str, str] | None = None) -> str | None:
    """The config path by the search order, or None when there is none."""
    env = os.environ if env is None else env
    if explicit:
        return explicit
    if env.get("HEARTBEAT_CONFIG"):
        return env["HEARTBEAT_CONFIG"]
    for candidate in defaults.CONFIG_PATHS:
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    return None


def readable_config(explicit: str | None = None) -> Config | None:
    """The config found by the search order, or None when there is none or it cannot be read (a
    broken config is the daemon's to report; it must not stop a task being written)."""
    from heartbeat.errors import HeartbeatError

    path = find_config(explicit)
    if path is None:
        return None
    try:
        return load_config(path)
    except HeartbeatError:
        return None


def _known(kind: str, name: str, known: Iterable[str], where: str) -> None:
    names = sorted(known)
    if name not in names:
        listed = ", ".join(names) if names else "none"
        raise BadInput(f"{where}unknown {kind} {name[:60]!r} (configured: {listed})")


def refuse_unknown_names(config: Config | None, *, launchers: Iterable[str] = (), checks: Iterable[str] = (),
                         on_broken: str = "", where: str = "") -> None:
    """Refuse a launcher, a check or an ``on_broken = "fallback:LAUNCHER"`` the config does not
    define, naming the ones it does (exit 2): a typo is caught when the task is made, not after
    its work. Without a readable config (``config`` None) nothing can be known and nothing is
    refused."""
    if config is None:
        return
    for name in launchers:
        if name:
            _known("launcher", name, config.launchers, where)
    for name in checks:
        if name:
            _known("check", name, config.checks, where)
    kind, sep, fallback = on_broken.partition(":")
    if kind == "fallback" and sep and fallback:
        _known("launcher", fallback, config.launchers, f"{where}on_broken: ")


def load_config(path: str) -> Config:
    """Read, check and parse a config file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("no such file", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path=path) from None
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:  # before fdopen, which would name the descriptor, not the file
        os.close(fd)
        raise ConfigError("is a directory, not a config file" if kind == stat.S_IFDIR else "is not a regular file",
                          path=path)
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("is not a regular file", path=path)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise ConfigError(
                f"is writable by others (mode {mode:04o}) and chooses the programs heartbeat runs; "
                f"fix it with: chmod go-w {path}",
                path=path,
            )
        if st.st_uid not in (0, os.geteuid()):
            # Its owner can chmod it and rewrite it whatever its mode says now.
            import pwd

            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = f"uid {st.st_uid}"
            raise ConfigError(
                f"belongs to {owner}, who could rewrite it and so choose the programs heartbeat runs; "
                f"it must belong to root or to this user: fix it with: chown {os.geteuid()} {path}",
                path=path,
            )
        if st.st_size > defaults.MAX_BATON_BYTES:
            raise ConfigError("is larger than 1 MiB", path=path)
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    config = parse_config(text, path=path)
    if config.http.token and mode & 0o044:
        # Whoever reads the token reads every baton through the status page.
        raise ConfigError(f"holds [http] token and is readable by others (mode {mode:04o}), who could read every "
                          f"baton through the status page with it; fix it with: chmod go-r {path} "
                          "(or set $HEARTBEAT_WEB_TOKEN instead)", path=path)
    return config


def parse_config(text: str, *, path: str = "heartbeat.toml") -> Config:
    """Parse config text; every problem is a :class:`ConfigError` naming file, line and key."""
    try:
        doc = load_toml(text)
    except BadInput as exc:
        line = None
        match = re.search(r"\(at line (\d+)", exc.message)
        if match:
            line = int(match.group(1))
        raise ConfigError(exc.message, path=path, line=line) from None
    return _Parser(text, path).parse(doc)


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


class _Parser:
    def __init__(self, text: str, path: str) -> None:
        self.lines = text.splitlines()
        self.path = path

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, path=self.path, field=key, line=self.locate(key))

    def locate(self, dotted: str) -> int | None:
        """Best-effort line of a key: TOML parsers keep no positions, so scan the text."""
        parts = dotted.split(".")
        while parts:
            found = self._find(parts)
            if found:
                return found
            parts = parts[:-1]
        return None

    def _find(self, parts: list[str]) -> int | None:
        table: list[str] = []
        header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
        assign = re.compile(r"^\s*([A-Za-z0-9_.\"' -]+?)\s*=")
        for number, line in enumerate(self.lines, 1):
            m = header.match(line)
            if m:
                table = [p.strip().strip("\"'") for p in m.group(1).split(".")]
                if table == parts:
                    return number
                continue
            m = assign.match(line)
            if m:
                key = [p.strip().strip("\"'") for p in m.group(1).split(".")]
                if table + key == parts:
                    return number
        return None

    def table(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {type(value).__name__}")
        return value

    def unknown(self, doc: dict[str, Any], allowed: set[str] | frozenset[str], prefix: str) -> None:
        for key in doc:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.error(f"{prefix}{key}", f"unknown key (known: {known})")

    def duration(self, doc: dict[str, Any], key: str, prefix: str, default: float, *, positive: bool = True) -> float:
        if key not in doc:
            return default
        try:
            value = parse_duration(doc[key])
        except BadInput as exc:
            raise self.error(f"{prefix}{key}", exc.message) from None
        if positive and value <= 0:
            raise self.error(f"{prefix}{key}", "must be more than zero")
        return value

    def integer(self, doc: dict[str, Any], key: str, prefix: str, default: int, *, minimum: int = 1) -> int:
        if key not in doc:
            return default
        value = doc[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{prefix}{key}", f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(f"{prefix}{key}", f"must be at least {minimum}")
        return value

    def money(self, doc: dict[str, Any], key: str, prefix: str, default: float) -> float:
        """An amount in USD: a finite number, 0 or more."""
        if key not in doc:
            return default
        value = doc[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(f"{prefix}{key}", f"expected an amount in USD (a number, e.g. 5 or 2.5), got {value!r}")
        if value < 0:
            raise self.error(f"{prefix}{key}", "must not be negative (0: no budget)")
        return float(value)

    def boolean(self, doc: dict[str, Any], key: str, prefix: str, default: bool) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"{prefix}{key}", f"expected true or false, got {value!r}")
        return value

    def string(self, doc: dict[str, Any], key: str, prefix: str, default: str, choices: tuple[str, ...] = ()) -> str:
        if key not in doc:
            return default
        value = doc[key]
        if not isinstance(value, str):
            raise self.error(f"{prefix}{key}", f"expected a string, got {value!r}")
        if choices and value not in choices:
            raise self.error(f"{prefix}{key}", f"must be one of {', '.join(choices)}; got {value!r}")
        if "\0" in value:
            raise self.error(f"{prefix}{key}", "contains a NUL byte")
        return value

    def command(self, doc: dict[str, Any], key: str, prefix: str, allowed: frozenset[str]) -> tuple[str, ...]:
        name = f"{prefix}{key}"
        if key not in doc:
            raise self.error(name, "missing (required): an argv list such as [\"my-agent\", \"{id}\"]")
        value = doc[key]
        if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
            raise self.error(name, "expected a non-empty list of strings (an argv; no shell is involved)")
        if not value[0] or "{" in value[0].replace("{{", "") or "\0" in "".join(value):
            raise self.error(name, "the program (first element) must be a fixed name or path, not a placeholder")
        for arg in value:
            if any(brace in _PLACEHOLDER.sub("", arg) for brace in "{}"):
                raise self.error(name, f"unbalanced brace in {arg[:60]!r}: a placeholder is {{name}}; "
                                       "write {{ or }} for a literal brace")
            unknown = placeholders_in(arg) - allowed
            if unknown:
                raise self.error(
                    name, f"unknown placeholder {{{sorted(unknown)[0]}}} (known: {', '.join(sorted(allowed))})"
                )
        return tuple(value)

    def parse(self, doc: dict[str, Any]) -> Config:
        self.unknown(doc, {"daemon", "launchers", "notify", "checks", "hooks", "http", "retention", "store"}, "")
        daemon = self.parse_daemon(self.table(doc.get("daemon", {}), "daemon"))
        launchers = {
            name: self.parse_launcher(name, self.table(body, f"launchers.{name}"))
            for name, body in self.table(doc.get("launchers", {}), "launchers").items()
        }
        notify = {
            name: self.parse_command(name, self.table(body, f"notify.{name}"), "notify", NOTIFY_PLACEHOLDERS,
                                     defaults.NOTIFY_TIMEOUT)
            for name, body in self.table(doc.get("notify", {}), "notify").items()
        }
        checks = {
            name: self.parse_command(name, self.table(body, f"checks.{name}"), "checks", CHECK_PLACEHOLDERS,
                                     defaults.CHECK_TIMEOUT)
            for name, body in self.table(doc.get("checks", {}), "checks").items()
        }
        if launchers and daemon.default_launcher not in launchers:
            raise self.error(
                "daemon.default_launcher",
                f"names launcher {daemon.default_launcher!r}, which is not configured "
                f"(configured: {', '.join(sorted(launchers))})",
            )
        http = self.parse_http(self.table(doc.get("http", {}), "http"))
        return Config(path=os.path.abspath(self.path), daemon=daemon, launchers=launchers, notify=notify,
                      checks=checks, hooks=self.parse_hooks(self.table(doc.get("hooks", {}), "hooks")),
                      http=http,
                      retention=self.parse_retention(self.table(doc.get("retention", {}), "retention")),
                      store=self.parse_store(self.table(doc.get("store", {}), "store")))

    def parse_hooks(self, doc: dict[str, Any]) -> HooksConfig:
        p = "hooks."
        self.unknown(doc, set(HooksConfig.__dataclass_fields__), p)
        return HooksConfig(
            fresh_within=self.duration(doc, "fresh_within", p, defaults.HOOK_FRESH_WITHIN),
            max_stop_blocks=self.integer(doc, "max_stop_blocks", p, defaults.HOOK_MAX_STOP_BLOCKS, minimum=0),
        )

    def parse_http(self, doc: dict[str, Any]) -> HttpConfig:
        p = "http."
        self.unknown(doc, {f for f in HttpConfig.__dataclass_fields__}, p)
        listen = self.string(doc, "listen", p, "")
        if listen:
            try:
                parse_listen(listen, what="")
            except BadInput as exc:
                raise self.error("http.listen", exc.message) from None
        hosts = doc.get("allowed_hosts", [])
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h.strip() and "\0" not in h for h in hosts):
            raise self.error("http.allowed_hosts", "expected a list of host names, e.g. [\"status.example.org\"]")
        return HttpConfig(listen=listen, token=self.string(doc, "token", p, ""), allowed_hosts=tuple(hosts))

    def parse_retention(self, doc: dict[str, Any]) -> RetentionConfig:
        p = "retention."
        self.unknown(doc, set(RetentionConfig.__dataclass_fields__), p)
        return RetentionConfig(
            keep_epochs=self.integer(doc, "keep_epochs", p, defaults.KEEP_EPOCHS),
            finished_after=self.duration(doc, "finished_after", p, defaults.FINISHED_AFTER),
            every=self.duration(doc, "every", p, defaults.GC_EVERY),
            archive_failed=self.boolean(doc, "archive_failed", p, False),
            enabled=self.boolean(doc, "enabled", p, True),
        )

    def parse_store(self, doc: dict[str, Any]) -> StoreConfig:
        self.unknown(doc, {"url"}, "store.")
        url = self.string(doc, "url", "store.", "")
        if url and not url.startswith(("postgresql://", "postgres://")):
            raise self.error("store.url", "must be a postgresql:// URL (or empty for the file store)")
        return StoreConfig(url=url)

    def parse_daemon(self, doc: dict[str, Any]) -> DaemonConfig:
        p = "daemon."
        fields_ = {f for f in DaemonConfig.__dataclass_fields__}
        self.unknown(doc, fields_, p)
        state_dir = self.string(doc, "state_dir", p, defaults.STATE_DIR)
        if not state_dir:
            raise self.error("daemon.state_dir", "must not be empty")
        if not os.path.isabs(state_dir):
            state_dir = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), state_dir))
        launcher = self.string(doc, "default_launcher", p, defaults.DEFAULT_LAUNCHER)
        if not ID_PATTERN.fullmatch(launcher):
            raise self.error("daemon.default_launcher", f"bad launcher name {launcher!r}")
        backoff_initial = self.duration(doc, "backoff_initial", p, defaults.BACKOFF_INITIAL, positive=False)
        backoff_max = self.duration(doc, "backoff_max", p, defaults.BACKOFF_MAX, positive=False)
        if backoff_max < backoff_initial:
            raise self.error("daemon.backoff_max", "must not be less than backoff_initial")
        return DaemonConfig(
            state_dir=state_dir,
            tick=self.duration(doc, "tick", p, defaults.TICK),
            stall_after=self.duration(doc, "stall_after", p, defaults.STALL_AFTER),
            progress_after=self.duration(doc, "progress_after", p, defaults.PROGRESS_AFTER),
            max_attempts=self.integer(doc, "max_attempts", p, defaults.MAX_ATTEMPTS),
            max_idle_resumes=self.integer(doc, "max_idle_resumes", p, defaults.MAX_IDLE_RESUMES),
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            dispatches_per_minute=self.integer(doc, "dispatches_per_minute", p, defaults.DISPATCHES_PER_MINUTE),
            max_concurrent=self.integer(doc, "max_concurrent", p, defaults.MAX_CONCURRENT),
            default_launcher=launcher,
            on_spinning=self.string(doc, "on_spinning", p, defaults.ON_SPINNING, ("escalate", "restart", "report")),
            inactive_grace=self.duration(doc, "inactive_grace", p, defaults.INACTIVE_GRACE, positive=False),
            max_limit_wait=self.duration(doc, "max_limit_wait", p, defaults.MAX_LIMIT_WAIT),
            max_cost_usd=self.money(doc, "max_cost_usd", p, defaults.MAX_COST_USD),
            sweep_every=self.duration(doc, "sweep_every", p, defaults.SWEEP_EVERY, positive=False),
            relay=self.boolean(doc, "relay", p, True),
            log_format=self.string(doc, "log_format", p, "auto", ("auto", "json", "console")),
            log_level=self.string(doc, "log_level", p, "info", ("debug", "info", "warning", "error")),
            **self.parse_lease_keys(doc),
        )

    def parse_lease_keys(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``daemon.host``, ``daemon.labels`` and ``daemon.lease_ttl`` (leased daemons on many hosts)."""
        p = "daemon."
        host = self.string(doc, "host", p, "")
        if host and not HOST_PATTERN.fullmatch(host):
            raise self.error("daemon.host", f"bad host id {host[:64]!r}: use letters, digits and . _ -")
        labels = doc.get("labels", [])
        if not isinstance(labels, list) or not all(isinstance(x, str) and HOST_PATTERN.fullmatch(x) for x in labels):
            raise self.error("daemon.labels", "expected a list of labels (letters, digits and . _ -)")
        lease_ttl = self.duration(doc, "lease_ttl", p, defaults.LEASE_TTL)
        return {"host": host, "labels": tuple(dict.fromkeys(labels)), "lease_ttl": lease_ttl}

    def parse_launcher(self, name: str, doc: dict[str, Any]) -> LauncherConfig:
        p = f"launchers.{name}."
        if not ID_PATTERN.fullmatch(name):
            raise self.error(f"launchers.{name}", "bad launcher name: use a-z 0-9 . _ -")
        kind = self.string(doc, "type", p, "exec")
        common = {"type", "command", "brief", "cwd", "env", "inherit_env", "stop_grace", "max_runtime",
                  "max_concurrent", "non_retryable_exit_codes", "max_log_bytes", *PRESET_KEYS}
        extra_keys = BUILTIN_LAUNCHER_KEYS.get(kind)
        if extra_keys is not None:
            self.unknown(doc, common | extra_keys, p)
        options = {k: v for k, v in doc.items() if k not in common}
        command: tuple[str, ...] = ()
        preset = self.parse_preset(doc, p)
        if preset is not None:
            command = preset["command"]
        elif kind != "null" or "command" in doc:
            command = self.command(doc, "command", p, LAUNCHER_PLACEHOLDERS)
        env = doc.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise self.error(f"{p}env", "expected a table of strings, e.g. { MODEL = \"large\" }")
        for key, value in env.items():
            if "=" in key or "\0" in key or "\0" in value or not key:
                raise self.error(f"{p}env.{key}", "bad environment variable")
        inherit = doc.get("inherit_env", True)
        if isinstance(inherit, list):
            if not all(isinstance(v, str) for v in inherit):
                raise self.error(f"{p}inherit_env", "expected true, false or a list of variable names")
            inherit_env: bool | tuple[str, ...] = tuple(inherit)
        elif isinstance(inherit, bool):
            inherit_env = inherit
        else:
            raise self.error(f"{p}inherit_env", "expected true, false or a list of variable names")
        codes = doc.get("non_retryable_exit_codes", [])
        if not isinstance(codes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 < c < 256 for c in codes
        ):
            raise self.error(f"{p}non_retryable_exit_codes", "expected a list of exit codes from 1 to 255")
        max_runtime = self.duration(doc, "max_runtime", p, 0.0) or None
        if preset is not None:
            max_runtime = max_runtime or preset["max_runtime"]
            codes = sorted(set(codes) | set(preset["non_retryable_exit_codes"]))
        max_log_bytes = self.integer(doc, "max_log_bytes", p, defaults.MAX_LOG_BYTES, minimum=0)
        if 0 < max_log_bytes < _MIN_LOG_BYTES:
            raise self.error(f"{p}max_log_bytes", f"must be 0 (no cap) or at least {_MIN_LOG_BYTES}")
        cwd = self.string(doc, "cwd", p, "{workdir}")
        unknown_ph = placeholders_in(cwd) - LAUNCHER_PLACEHOLDERS
        if unknown_ph:
            raise self.error(f"{p}cwd", f"unknown placeholder {{{sorted(unknown_ph)[0]}}}")
        return LauncherConfig(
            name=name,
            type=kind,
            command=command,
            brief=self.string(doc, "brief", p, "stdin" if preset is not None else "file", ("file", "stdin", "arg")),
            cwd=cwd,
            env=dict(env),
            inherit_env=inherit_env,
            stop_grace=self.duration(doc, "stop_grace", p, defaults.STOP_GRACE, positive=False),
            max_runtime=max_runtime,
            max_concurrent=self.integer(doc, "max_concurrent", p, 0) or None,
            non_retryable_exit_codes=tuple(codes),
            max_log_bytes=max_log_bytes,
            preset=preset["name"] if preset is not None else "",
            args=preset["args"] if preset is not None else (),
            session=self.string(doc, "session", p, defaults.SESSION, ("fresh", "resume")),
            max_resumes_per_session=self.integer(doc, "max_resumes_per_session", p, defaults.MAX_RESUMES_PER_SESSION),
            options=options,
        )

    def parse_preset(self, doc: dict[str, Any], p: str) -> dict[str, Any] | None:
        """``preset``, ``program`` and ``args``: the command a preset builds, or None without a preset."""
        if "preset" not in doc:
            for key in ("program", "args"):
                if key in doc:
                    raise self.error(f"{p}{key}", "only with a preset (preset = \"claude-code\", \"codex\" or "
                                                  "\"gemini\"); without one, put the whole argv in command")
            return None
        from heartbeat.presets import PRESETS, PresetName, preset_argv

        name = self.string(doc, "preset", p, "", tuple(PresetName))
        preset = PRESETS[PresetName(name)]
        if "command" in doc:
            raise self.error(f"{p}command", f"preset {name!r} builds the command: name the program with "
                                            "program = \"/path/to/it\" and add flags with args = [...]")
        if doc.get("brief", "stdin") != "stdin":
            raise self.error(f"{p}brief", f"preset {name!r} gives the brief on stdin; brief must be \"stdin\"")
        program = self.string(doc, "program", p, preset.program)
        if not program or "{" in program.replace("{{", ""):
            raise self.error(f"{p}program", "must be a fixed name or path, not a placeholder")
        args = doc.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
            raise self.error(f"{p}args", "expected a list of strings (flags for the agent CLI; no shell is involved)")
        for arg in args:
            unknown = placeholders_in(arg) - LAUNCHER_PLACEHOLDERS
            if unknown:
                raise self.error(f"{p}args", f"unknown placeholder {{{sorted(unknown)[0]}}} "
                                             f"(known: {', '.join(sorted(LAUNCHER_PLACEHOLDERS))})")
        return {"name": name, "args": tuple(args), "command": preset_argv(preset, program, tuple(args), resume=False),
                "max_runtime": preset.max_runtime, "non_retryable_exit_codes": preset.non_retryable_exit_codes}

    def parse_command(
        self, name: str, doc: dict[str, Any], section: str, allowed: frozenset[str], timeout: float
    ) -> CommandConfig:
        p = f"{section}.{name}."
        self.unknown(doc, {"command", "timeout"}, p)
        return CommandConfig(
            name=name,
            command=self.command(doc, "command", p, allowed),
            timeout=self.duration(doc, "timeout", p, timeout),
        )


def resolve_state_dir(
    state_dir: str | None = None, config_path: str | None = None, *, env: Mapping[str, str] | None = None
) -> str:
    """Where the batons are: ``--state-dir``, then ``--config``'s, then ``$HEARTBEAT_STATE_DIR``,
    then the config found by the search order. Agents launched by the daemon have the
    variable set, so their frequent writes never parse the config."""
    env = os.environ if env is None else env
    if state_dir:
        return os.path.abspath(state_dir)
    if not config_path and env.get("HEARTBEAT_STATE_DIR"):
        return os.path.abspath(env["HEARTBEAT_STATE_DIR"])
    path = find_config(config_path, env=env)
    if path is None:
        raise ConfigError(
            "no config found (tried --config, $HEARTBEAT_CONFIG, ./heartbeat.toml, "
            "/etc/heartbeat/heartbeat.toml): run `heartbeat init` or pass --state-dir"
        )
    return load_config(path).state_dir


def resolve_store(
    state_dir: str | None = None, config_path: str | None = None, *, env: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """(state dir, store URL) as :func:`resolve_state_dir` finds them; the URL is
    ``$HEARTBEAT_STORE_URL``, else the config's ``[store] url``, else empty (the file store)."""
    env = os.environ if env is None else env
    url = env.get("HEARTBEAT_STORE_URL", "").strip()
    if url:
        if not state_dir and not env.get("HEARTBEAT_STATE_DIR") and find_config(config_path, env=env) is None:
            return "", url  # a database needs no state dir to read and write batons
        return resolve_state_dir(state_dir, config_path, env=env), url
    if state_dir:
        return os.path.abspath(state_dir), ""
    if not config_path and env.get("HEARTBEAT_STATE_DIR"):
        return os.path.abspath(env["HEARTBEAT_STATE_DIR"]), ""
    path = find_config(config_path, env=env)
    if path is None:
        return resolve_state_dir(state_dir, config_path, env=env), ""  # raises, naming the search order
    config = load_config(path)
    return config.state_dir, config.store.url
