"""The TOML config: found, loaded and validated, with errors as ``file:line: key.path: what``.

Search order: ``--config``, ``$HEARTBEAT_CONFIG``, ``./heartbeat.toml``,
``/etc/heartbeat/heartbeat.toml``. Unknown keys are errors (a typo must not silently
fall back to a default). A config file others can write to is refused: it chooses the
programs the daemon runs."""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable, Mapping
from typing import Any

from heartbeat.config.shape import (
    _PLACEHOLDER,
    BUILTIN_LAUNCHER_KEYS,
    CHECK_PLACEHOLDERS,
    LAUNCHER_PLACEHOLDERS,
    NOTIFY_PLACEHOLDERS,
    PRESET_KEYS,
    CommandConfig,
    Config,
    DaemonConfig,
    GuardsConfig,
    HandoffConfig,
    HooksConfig,
    HttpConfig,
    LauncherConfig,
    RetentionConfig,
    StoreConfig,
    parse_listen,
    placeholders_in,
)
from heartbeat.model import defaults
from heartbeat.model.baton import HOST_PATTERN, ID_PATTERN, load_toml
from heartbeat.model.errors import BadInput, ConfigError, UnsafePath
from heartbeat.model.knobs import HANDOFF_KNOBS, KNOBS, Knob, KnobKind
from heartbeat.model.timeparse import parse_duration
from heartbeat.system.safefile import open_regular

__all__ = [
    "find_config",
    "load_config",
    "parse_config",
    "readable_config",
    "refuse_unknown_names",
]
_MIN_LOG_BYTES = 4096




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
    from heartbeat.model.errors import HeartbeatError

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
        fd = open_regular(path, follow=True)  # a FIFO is refused at once, never waited on
    except FileNotFoundError:
        raise ConfigError("no such file", path=path) from None
    except UnsafePath as exc:
        raise ConfigError("is a directory, not a config file" if "a directory" in exc.message
                          else "is not a regular file", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path=path) from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
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
        self.unknown(doc, {"daemon", "launchers", "notify", "checks", "hooks", "guards", "http", "retention",
                         "store", "handoff"}, "")
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
                      guards=self.parse_guards(self.table(doc.get("guards", {}), "guards")),
                      handoff=self.parse_handoff(self.table(doc.get("handoff", {}), "handoff")),
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

    def parse_handoff(self, doc: dict[str, Any]) -> HandoffConfig:
        p = "handoff."
        self.unknown(doc, set(HandoffConfig.__dataclass_fields__), p)
        knobs = {k.name: self.knob(doc, k, p) for k in HANDOFF_KNOBS}
        if knobs["learn_after"] > knobs["learn_window"]:
            raise self.error("handoff.learn_after", f"is {knobs['learn_after']}, more than learn_window "
                             f"({knobs['learn_window']}): it could never be met")
        return HandoffConfig(**knobs)

    def parse_guards(self, doc: dict[str, Any]) -> GuardsConfig:
        self.unknown(doc, set(GuardsConfig.__dataclass_fields__), "guards.")
        found = self.globs(doc, "guards.")
        return GuardsConfig(irreversible=defaults.IRREVERSIBLE if found is None else found)

    def globs(self, doc: dict[str, Any], p: str) -> tuple[str, ...] | None:
        """``irreversible``: a list of command globs (None when the key is absent)."""
        from heartbeat.model.baton import GlobKind, check_guard_glob

        if "irreversible" not in doc:
            return None
        value = doc["irreversible"]
        if not isinstance(value, list):
            raise self.error(f"{p}irreversible", "expected a list of command globs, e.g. [\"git push*\"]")
        if len(value) > defaults.MAX_GUARD_GLOBS:
            raise self.error(f"{p}irreversible", f"{len(value)} globs, over {defaults.MAX_GUARD_GLOBS}")
        for glob in value:
            try:
                check_guard_glob(glob, GlobKind.IRREVERSIBLE)
            except BadInput as exc:
                raise self.error(f"{p}irreversible", exc.message) from None
        return tuple(value)

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
        knobs = {k.name: self.knob(doc, k, p) for k in KNOBS}
        if knobs["backoff_max"] < knobs["backoff_initial"]:
            raise self.error("daemon.backoff_max", "must not be less than backoff_initial")
        return DaemonConfig(
            state_dir=state_dir,
            tick=self.duration(doc, "tick", p, defaults.TICK),
            dispatches_per_minute=self.integer(doc, "dispatches_per_minute", p, defaults.DISPATCHES_PER_MINUTE),
            max_concurrent=self.integer(doc, "max_concurrent", p, defaults.MAX_CONCURRENT),
            default_launcher=launcher,
            sweep_every=self.duration(doc, "sweep_every", p, defaults.SWEEP_EVERY, positive=False),
            relay=self.boolean(doc, "relay", p, True),
            log_format=self.string(doc, "log_format", p, "auto", ("auto", "json", "console")),
            log_level=self.string(doc, "log_level", p, "info", ("debug", "info", "warning", "error")),
            **self.parse_lease_keys(doc),
            **knobs,
        )

    def knob(self, doc: dict[str, Any], k: Knob, prefix: str) -> Any:
        """One policy knob (:mod:`heartbeat.model.knobs`), read and bounded by its kind."""
        if k.kind is KnobKind.DURATION:
            return self.duration(doc, k.name, prefix, k.default, positive=not k.zero_ok)
        if k.kind is KnobKind.COUNT:
            return self.integer(doc, k.name, prefix, k.default, minimum=k.minimum)
        if k.kind is KnobKind.MONEY:
            return self.money(doc, k.name, prefix, k.default)
        if k.kind is KnobKind.SWITCH:
            return self.boolean(doc, k.name, prefix, k.default)
        return self.string(doc, k.name, prefix, k.default, k.choices)

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
            irreversible=self.globs(doc, p),
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
        from heartbeat.presets.common import PresetName
        from heartbeat.presets.registry import PRESETS, preset_argv

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
        from heartbeat.presets.common import hooks_off_arg

        off = hooks_off_arg(name, args)
        if off:
            raise self.error(f"{p}args", f"{off} switches {preset.program}'s hooks off, and with them the rail "
                                         "(heartbeat's PreToolUse check): remove it")
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
