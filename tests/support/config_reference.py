"""The config reference's check: ``config/heartbeat.example.toml`` names every key the code reads.

One function, so that the example's test (``tests/integration/test_config.py``) and the knob test
(``tests/integration/test_knobs.py``, which runs it over a package with one more knob) check the same."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from heartbeat.config.shape import (
    BUILTIN_LAUNCHER_KEYS,
    CommandConfig,
    DaemonConfig,
    HandoffConfig,
    HttpConfig,
    LauncherConfig,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "heartbeat.example.toml"


def undocumented(example: Path = EXAMPLE) -> list[str]:
    """Every DaemonConfig (its policy knobs too), LauncherConfig (and per-type option) and command
    field the example does not show as a key."""
    doc = tomllib.loads(example.read_text())
    missing = [f"daemon.{f.name}" for f in dataclasses.fields(DaemonConfig) if f.name not in doc["daemon"]]
    launchers = doc["launchers"].values()
    for f in dataclasses.fields(LauncherConfig):
        if f.name not in ("name", "options") and not any(f.name in launcher for launcher in launchers):
            missing.append(f"launchers.*.{f.name}")
    for kind, options in BUILTIN_LAUNCHER_KEYS.items():
        of_kind = [launcher for launcher in launchers if launcher.get("type", "exec") == kind]
        if not of_kind:
            missing.append(f"a launcher of type {kind!r}")
        missing += [f"launchers.<{kind}>.{o}" for o in options if not any(o in launcher for launcher in of_kind)]
    for section in ("notify", "checks"):
        for f in dataclasses.fields(CommandConfig):
            if f.name != "name" and not any(f.name in body for body in doc[section].values()):
                missing.append(f"{section}.*.{f.name}")
    missing += [f"http.{f.name}" for f in dataclasses.fields(HttpConfig) if f.name not in doc.get("http", {})]
    missing += [f"handoff.{f.name}" for f in dataclasses.fields(HandoffConfig) if f.name not in doc.get("handoff", {})]
    return missing
