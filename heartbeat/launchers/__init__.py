"""Launchers: how the daemon starts an agent, and the registry that finds one by type name.

``[launchers.NAME] type = "..."`` names a built-in type (:data:`BUILTIN`), an entry point
of the group ``heartbeat.launchers`` (a third party's package), or a dotted path
``"package.module:Class"``. Whatever it names must be a class built as ``Class(config)``
that has the methods of :class:`~heartbeat.launchers.base.Launcher`.

Importing this package is cheap: the types are imported only when resolved, and the
names of :mod:`heartbeat.launchers.base` are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from heartbeat.model.errors import ConfigError

if TYPE_CHECKING:
    from heartbeat.config.shape import LauncherConfig
    from heartbeat.launchers.base import ExitStatus, Launcher, LaunchError, LaunchRequest, build_argv, build_env

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "resolve",
    "make_launcher",
    "Launcher",
    "LaunchRequest",
    "ExitStatus",
    "LaunchError",
    "build_argv",
    "build_env",
]

ENTRY_POINT_GROUP = "heartbeat.launchers"
"""The entry-point group third-party launcher types register under."""

BUILTIN: dict[str, str] = {
    "exec": "heartbeat.launchers.exec:ExecLauncher",
    "systemd-run": "heartbeat.launchers.systemd_run:SystemdRunLauncher",
    "null": "heartbeat.launchers.null:NullLauncher",
}
"""The types that ship with heartbeat, as dotted paths (imported when first resolved)."""

_BASE_NAMES = frozenset({"Launcher", "LaunchRequest", "ExitStatus", "LaunchError", "build_argv", "build_env"})


def __getattr__(name: str) -> Any:
    if name in _BASE_NAMES:
        from heartbeat.launchers import base

        return getattr(base, name)
    raise AttributeError(name)


def _field(type_name: str) -> str:
    return "type" if not type_name else f"type {type_name!r}"


def _import_dotted(spec: str, type_name: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"launcher {_field(type_name)}: a dotted path must read \"package.module:Class\"")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"launcher {_field(type_name)}: cannot import {module_name}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"launcher {_field(type_name)}: {module_name} has no {attr}") from None
    return obj


def _entry_point(type_name: str) -> Any | None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == type_name:
            try:
                return ep.load()
            except Exception as exc:  # a broken third-party package: say which, do not crash
                raise ConfigError(
                    f"launcher {_field(type_name)}: entry point {ep.value} failed to load: {exc}"
                ) from None
    return None


def _check(obj: Any, type_name: str) -> type[Launcher]:
    if not callable(obj):
        raise ConfigError(f"launcher {_field(type_name)}: {obj!r} is not a class")
    missing = [m for m in ("launch", "alive", "exit_status", "stop", "reap") if not callable(getattr(obj, m, None))]
    if missing:
        raise ConfigError(
            f"launcher {_field(type_name)}: {getattr(obj, '__qualname__', obj)!r} is not a launcher "
            f"(missing {', '.join(missing)}; see heartbeat.launchers.base.Launcher)"
        )
    return obj


def resolve(type_name: str) -> type[Launcher]:
    """The launcher class for ``type_name``: built-in, entry point, or ``"package.module:Class"``.

    Raises :class:`ConfigError` naming the type when nothing matches or the match is not
    a launcher.
    """
    if type_name in BUILTIN:
        return _check(_import_dotted(BUILTIN[type_name], type_name), type_name)
    found = _entry_point(type_name)
    if found is not None:
        return _check(found, type_name)
    if ":" in type_name:
        return _check(_import_dotted(type_name, type_name), type_name)
    known = ", ".join(sorted(BUILTIN))
    raise ConfigError(
        f"unknown launcher type {type_name!r} (built-in: {known}; or an entry point of "
        f"{ENTRY_POINT_GROUP!r}, or \"package.module:Class\")"
    )


def make_launcher(config: LauncherConfig, *, path: str | None = None) -> Launcher:
    """A launcher for ``[launchers.NAME]``; a bad type or bad options are a :class:`ConfigError`.

    ``path`` (the config file) is named in the error, so ``check-config`` can report it.
    """
    try:
        cls = resolve(config.type)
    except ConfigError as exc:
        raise ConfigError(exc.message, path=path, field=f"launchers.{config.name}.type") from None
    try:
        launcher = cls(config)  # type: ignore[call-arg]
    except ConfigError as exc:
        raise ConfigError(exc.message, path=path or exc.path, field=exc.field, line=exc.line) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cannot set up launcher {config.name!r} (type {config.type!r}): {exc}",
                          path=path, field=f"launchers.{config.name}") from None
    return launcher
