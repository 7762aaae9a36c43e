"""The soak's constants, its records of planted files and commands in flight, and small helpers."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]


PRESETS: dict[str, dict[str, Any]] = {
    "short": {"tasks": 60, "duration": 45.0, "drain": 35.0, "max_concurrent": 10},
    "long": {"tasks": 300, "duration": 1800.0, "drain": 120.0, "max_concurrent": 16},
}
"""``--short`` is sized for CI (about 80 s in all); ``--long`` is the one docs/development.md reports."""

NON_RETRYABLE = 75
NOTIFIER = "file"
DAEMON_ERRORS = {"tick_failed", "task_failed", "evaluate_failed", "stop_failed", "dispatch_unrecorded",
                 "ledger_write_failed", "launch_failed"}
"""Daemon log events that mean something went wrong inside it (each one is a violation)."""
PLANT_EXCUSES = {"launch_failed", "dispatch_unrecorded"}
"""Daemon errors that are the right answer to a file the soak planted in the task's logs or workdir."""
TICKS = ("150ms", "200ms", "300ms")
"""The ticks a good SIGHUP picks from; a tick gap is judged against the longest (5 x 300 ms)."""
RETRY_SOON = {"fifo_logs", "symlink_logs", "fifo_workdir", "race", "restore_baton", "corrupt_ledger",
              "second_daemon", "hold_lock", "hup_broken", "live_migrate", "clock_step"}
"""Faults that, finding nothing to act on (no daemon up, no candidate task), are tried again within
a second instead of waiting their whole interval: the short soak must try each of them."""
MIGRATE_WITHIN = 8.0
"""Seconds a live migration gets to meet the running daemon (start and reach its lock, on a loaded
machine) before the soak may stop that daemon."""
SECOND_DAEMON_WITHIN = 8.0
"""Seconds a second daemon gets to start and be refused by the running one (its interpreter start
takes seconds on a loaded machine), during which the soak does not stop that daemon."""
STEP_WATCH = 5.0
"""Seconds after a clock step the soak holds off its daemon kills: the daemon looks for a step every
second (``CLOCK_CHECK_EVERY``) and must log ``clock_stepped`` and tick again within this."""
STEP_HOURS = 2.0
"""The least clock step, in hours: every step is longer than the whole soak (``--long`` runs about
32 minutes), so a duration measured across one is beyond anything an agent really did."""
TEST_CLOCK_ENV = "HEARTBEAT_TEST_CLOCK_OFFSET_FILE"
"""The daemon's test clock (``heartbeat.model.defaults.TEST_CLOCK_ENV``): its wall clock is the machine's
plus the seconds written in this file."""
LOCK_HOLDERS = ("second daemon", "migrate")
"""Background commands that take the daemon lock: stopped before the soak restarts its daemon."""
STARTUP_GRACE = 3.0
"""Seconds from the daemon's ``started`` line to its ``READY`` before a missing tick counts (start-up
on a loaded machine; from ``READY`` on, the clock is due). A daemon stuck at start is still caught."""
FIRST_PASS = 10.0
"""Seconds the first pass after a daemon start may take (every baton parsed cold, the ledger's blocks
read) before its missing tick counts; from its first tick on, the clock is due every 5 x tick."""
STOP_WITHIN = 10.0
"""Seconds a SIGTERMed daemon gets to exit (the issue asks for stop_grace + 1 s; a clean stop took
2.3 s under this machine's load, hence the margin; the longest is reported as max_sigterm_stop_ms)."""
GIT_SHARE = 0.3
"""The share of tasks with a git workdir of their own and a key file (the workdir attacks' targets)."""
FIFO_WAITS = frozenset({"wait_for_partner", "fifo_open"})
"""The kernel's names (``/proc/PID/wchan``) for a process blocked opening a FIFO."""

# Seconds between faults of each kind: uniform in (low, high).
FAULTS: dict[str, tuple[float, float]] = {
    "daemon_kill": (2.5, 7.0),
    "daemon_term": (12.0, 25.0),
    "hup_good": (4.0, 9.0),
    "hup_broken": (7.0, 14.0),
    "agent_kill": (0.3, 1.2),
    "shim_kill": (3.0, 7.0),
    "agent_only_kill": (2.0, 5.0),
    "drop_block": (1.0, 2.5),
    "benign_edit": (1.0, 2.5),
    "garbage": (2.0, 5.0),
    "stale_write": (1.5, 3.5),
    "new_task": (3.0, 6.0),
    "fifo_logs": (2.0, 5.0),
    "symlink_logs": (3.0, 7.0),
    "fifo_workdir": (3.0, 7.0),
    "race": (1.0, 2.5),
    "restore_baton": (2.5, 6.0),
    "corrupt_ledger": (6.0, 12.0),
    "second_daemon": (6.0, 12.0),
    "hold_lock": (3.0, 7.0),
    "live_migrate": (6.0, 12.0),
    "clock_step": (7.0, 13.0),
}


def parse_seconds(text: str) -> float:
    from heartbeat.model.timeparse import parse_duration

    return float(parse_duration(text))


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEARTBEAT_", "SOAK_"))}
    env.pop("NOTIFY_SOCKET", None)
    return env


@dataclass
class Plant:
    """A FIFO or link the soak planted, and how to put things back."""

    path: str
    kind: str
    """``fifo``, ``link`` (under ``logs/<id>/``), ``logs-dir-link`` or ``workdir-fifo``."""
    task: str
    original: bytes | None = None
    moved: str | None = None
    planted_at: float = 0.0
    until: float = 0.0


@dataclass
class Pending:
    """A command the soak runs in the background (a CLI call, a second daemon), judged when it ends."""

    what: str
    task: str
    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    started: float
    deadline: float
    expect: set[int] | None
    holder: int = 0
    """For a second daemon (or a live migration): the pid of the daemon running when it was started."""
    main_gone_at: float | None = None
    """For a second daemon (or a live migration): when (wall clock) the soak stopped the first one
    (the second may then take over; the migration may then copy)."""
    target: str = ""
    """For a live migration: its target state dir."""
    stuck_on_fifo: str = ""
    """What the kernel said this command's process waited in (``wait_for_partner``: opening a FIFO
    no one has opened for the other end) when the soak removed its task's planted FIFO; empty if it
    was not stuck there."""
    ended_at: float | None = None
    """When the process ended (monotonic), noted by a thread waiting on it: the soak's own loop may
    look late, so its clock at the look is not the command's end."""

    def __post_init__(self) -> None:
        threading.Thread(target=self._note_end, name=f"wait-{self.proc.pid}", daemon=True).start()

    def _note_end(self) -> None:
        self.proc.wait()
        self.ended_at = time.monotonic()


def _first_timestamp(text: str) -> float | None:
    """The wall-clock time of the first JSON log line in a daemon's output, if any."""
    for line in text.splitlines():
        try:
            stamp = json.loads(line).get("timestamp")
            return datetime.fromisoformat(str(stamp)).timestamp()
        except (ValueError, AttributeError, TypeError):
            continue
    return None


def _loads(data: bytes) -> dict[str, Any] | None:
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _restorable(live: dict[str, Any], old: dict[str, Any]) -> bool:
    """May the soak's human copy ``old`` (a baton's [meta]) back over ``live``?"""
    try:
        if live.get("epoch") != old.get("epoch") or int(live["revision"]) <= int(old["revision"]):
            return False
    except (KeyError, TypeError, ValueError):
        return False
    status, old_status = live.get("status"), old.get("status")
    finished = ("done", "failed", "escalated")
    if status in finished or old_status in finished:
        return False
    return status == old_status or "blocked" in (status, old_status)


def _ts(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return None
