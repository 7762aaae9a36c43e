#!/usr/bin/env python3
"""The chaos soak: a real daemon, hundreds of misbehaving agents, faults at random, and an
independent checker asserting the invariants all along.

    .venv/bin/python scripts/soak.py --short                  # CI: ~60 tasks, ~45 s of chaos
    .venv/bin/python scripts/soak.py --long                   # 300 tasks, 30 min of chaos
    .venv/bin/python scripts/soak.py --tasks 100 --duration 120 --seed 7 --tick 200ms \\
        [--state DIR] [--keep] [--json FILE]

A real ``heartbeat run`` (short tick) serves tasks whose agents (``scripts/chaos_agent.py``)
work, touch, block, finish, crash, hang, spin, snooze, leave processes behind, escape
into a new session and keep writing, and exit with the launcher's non-retryable code, at
random. Meanwhile the soak:

- SIGKILLs agents (the whole process group; sometimes only the shim, or only the agent);
- SIGKILLs the daemon and restarts it, and sometimes stops it cleanly (SIGTERM);
- sends SIGHUP with a good config (a changed tick) and with a broken one (then repairs it
  and sends SIGHUP again);
- hand-edits batons: drops blocks, adds keys heartbeat does not know, writes garbage over
  them (binary junk, a torn half, a wrong type) and later puts the original back;
- opens file gates, unblocks human gates through the CLI, re-arms escalated tasks;
- writes with a superseded epoch through the CLI (must be refused, exit 5);
- plants FIFOs and symlinks where the daemon, the shim or the CLI will open: the next
  epoch's ``.exit``, ``.log``, ``.pid``, ``.brief.md`` under ``logs/<id>/`` (FIFOs, and links
  to files outside the state dir), the whole ``logs/<id>`` directory swapped for a link to
  an outside directory, and ``.git/HEAD``, a ref or a key file in a task's git workdir (then
  runs ``heartbeat verify`` / ``set`` on that task); after a few seconds it cleans up as a
  human would (opens the FIFO so whoever is stuck on it gets EOF, removes it, puts the file
  or directory back);
- races the daemon: ``block``, ``done`` or ``snooze`` written 0-200 ms after a task became
  dispatchable (created, unblocked or re-armed);
- copies batons aside and later copies one back (a backup restored: lower revision);
- corrupts ledger rows (``data = '{oops'``, a timestamp out of range or of the wrong type),
  runs ``heartbeat report``, and repairs the row a few seconds later;
- starts a second ``heartbeat run`` (or ``run --once`` / ``--dry-run``) on the same state
  dir: it must exit 1 at once naming the running daemon's pid;
- migrates the live store (``heartbeat migrate --from STATE --to`` a fresh dir) beside the
  running daemon: it must exit 1 naming the daemon's pid and how to stop it, and write no
  baton to the target (a daemon stopped by the soak meanwhile may let it copy: counted);
- holds a baton's lock (``locks/<id>.lock``, flock) from another process for 1-3 s;
- steps the daemon's wall clock by hours, forward and back (its test clock: ``heartbeat run``
  given ``HEARTBEAT_TEST_CLOCK_OFFSET_FILE`` reads its wall clock as the machine's plus the
  seconds in that file), and holds off its daemon kills for ``STEP_WATCH`` seconds so the
  daemon is there to see it: it must log ``clock_stepped``, tick on, and stop or escalate no
  agent over the step. The agents, the CLI and the soak keep the machine's clock; the checker
  maps the ledger times the daemon stamped on its shifted clock back to the machine's.

Agents may also leave a ``setsid`` grandchild behind (``chaos_agent.py``, behaviour
``setsid-child``), which must not outlive its agent's shift.

Then it stops the chaos (agents turn calm, every file gate opens), lets the daemon drain,
and checks the end state. The checker (``tests/support/soak_checker.py``) samples the process
table every 50 ms and the batons every 200 ms, and reads the ledger with sqlite3 at the
end; see its docstring for the invariants. Prints a summary; exit 0 when no invariant was
violated, 1 otherwise (the state dir is then kept for inspection).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import traceback
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from soak_checker import (  # noqa: E402  (tests/ is not a package)
    Checker,
    ClockStep,
    TickWatch,
    check_blocks,
    check_bypasses,
    check_clock_steps,
    check_dispatch_epochs,
    check_dispatch_status,
    check_fencing,
    check_group_starts,
    check_inactive_agents,
    check_notify,
    check_stepped_decisions,
    map_ledger_times,
    read_ledger,
    tick_gaps,
)

__all__ = ["main", "PRESETS"]

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
RELEASE_SLACK = 1.0
"""Seconds from the soak releasing a planted FIFO to the end of a command that was stuck on it."""

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


class Soak:
    """One soak run: its directory, config, daemon, chaos, checker and figures."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.stale_rng = random.Random(f"{args.seed}:stale")
        """How each stale write is made (apart from ``rng``: the faults stay the seed's)."""
        if args.state:
            self.root = Path(args.state).resolve()
            if (self.root / "state").exists():
                raise SystemExit(f"soak: {self.root} holds an earlier run: give --state a new directory")
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(prefix="heartbeat-soak-"))
        os.chmod(self.root, 0o700)
        self.state = self.root / "state"
        self.state.mkdir(mode=0o700, exist_ok=True)
        for sub in ("gates", "writes", "work", "outside", "copies"):
            (self.root / sub).mkdir(exist_ok=True)
        self.config_path = self.root / "heartbeat.toml"
        self.log_path = self.root / "daemon.log"
        self.notify_path = self.root / "notified.tsv"
        self.notify_path.touch()
        self.env = clean_env()
        self.tick = args.tick
        self.counts: Counter[str] = Counter()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_intervals: list[list[float]] = []
        self.daemon_spans: list[list[float]] = []
        self.restart_at: float | None = None
        self.config_broken = False
        self.config_broken_at = float("-inf")
        self.hup_expect: list[tuple[int, str, float]] = []
        self._log_offset = 0
        self._log_partial = b""
        self.log_events: list[dict[str, Any]] = []
        self.checker = Checker(str(self.state))
        self.tasks: list[str] = []
        self.gate_plans: dict[str, float | None] = {}
        self.unblock_plans: dict[tuple[str, str], float | None] = {}
        self.retry_plans: dict[tuple[str, int], float | None] = {}
        self.garbage_restore: dict[str, float] = {}
        self.stale_markers: list[tuple[str, str, int]] = []
        self.next_fault = {name: time.monotonic() + self.rng.uniform(*span) for name, span in FAULTS.items()}
        self.stop_sampling = threading.Event()
        self.sampler_errors: list[str] = []
        self.calm = False
        self._task_seq = 0
        self._edit_seq = 0
        self.tick_watch = TickWatch(str(self.root / "notify.sock"))
        self.clock_file = self.root / "clock-offset"
        self.clock_file.write_text("0\n")
        self.clock_shift = 0.0
        self.clock_steps: list[ClockStep] = []
        self.step_waits = 0
        """Tries that found the daemon serving but still in its first pass (a step waits for a few)."""
        self.step_lines: list[tuple[float, str, float]] = []
        """The daemon's ``clock_stepped`` lines: (log time, direction, seconds)."""
        self.step_size = max(STEP_HOURS * 3600.0, 2.0 * (args.duration + args.drain) + 600.0)
        self.started_wall = time.time()
        self.env_daemon = {**self.env, "NOTIFY_SOCKET": str(self.root / "notify.sock"),
                           TEST_CLOCK_ENV: str(self.clock_file)}
        self.ticks_used = {self.tick}
        self.plants: list[Plant] = []
        self.plant_removed_at: dict[str, float] = {}
        self.plant_windows: list[tuple[str, float, float]] = []
        self.outside: dict[str, bytes] = {}
        self.git_tasks: set[str] = set()
        self.copies: dict[str, list[tuple[bytes, dict[str, Any]]]] = {}
        self.restored_tasks: set[str] = set()
        self.held: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
        self.pending: list[Pending] = []
        self.corrupt_repairs: list[tuple[float, int, str, Any, Any]] = []
        self.count_lock = threading.Lock()
        self.race_threads: list[threading.Thread] = []
        self._plant_seq = 0
        self.waiting_for_slot: set[str] = set()
        """Tasks whose last word from the daemon is "waiting: capacity full" (due, held for a slot)."""
        self.activity: list[float] = []
        """Times of the daemon's log lines: a long tick that logs work (settles, launches) is not stuck."""
        self.gaps_seen: set[str] = set()
        for i in range(3):
            self.outside_file(f"victim-{i}.txt", f"outside the state dir {i}\n".encode())

    # -- config and daemon -------------------------------------------------------------

    def config_text(self, *, broken: bool = False) -> str:
        if broken:
            return self.rng.choice([
                "[daemon\nthis is not toml",
                f'[daemon]\nstate_dir = "{self.state}"\ntick = "soon"\n',
                f'[daemon]\nstate_dir = "{self.state}"\n[launchers.chaos]\ntype = "exec"\ncommand = []\n',
            ])
        agent = [sys.executable, str(ROOT / "scripts" / "chaos_agent.py"), "--root", str(self.root),
                 "--seed", str(self.args.seed), "--step-time", "0.08"]
        if "setsid_child" in self.args.skip:
            agent += ["--without", "setsid-child"]
        # A notifier takes a while (a pager, a mail): the daemon may be killed while it runs.
        notify = ["/bin/sh", "-c", 'sleep 0.3; printf "%s\\t%s\\n" "$1" "$2" >> "$3"', "notify", "{id}", "{reason}",
                  str(self.notify_path)]
        return f"""\
[daemon]
state_dir = {json.dumps(str(self.state))}
tick = "{self.tick}"
stall_after = "2s"
progress_after = "3s"
max_attempts = 3
max_idle_resumes = 3
backoff_initial = "200ms"
backoff_max = "2s"
max_concurrent = {self.args.max_concurrent}
dispatches_per_minute = 5000
default_launcher = "chaos"
log_format = "json"
log_level = "info"

[launchers.chaos]
type = "exec"
command = {json.dumps(agent)}
stop_grace = "300ms"
max_runtime = "5s"
non_retryable_exit_codes = [{NON_RETRYABLE}]

[notify.{NOTIFIER}]
command = {json.dumps(notify)}
timeout = "5s"
"""

    def write_config(self, *, broken: bool = False) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(self.config_text(broken=broken))
        os.replace(tmp, self.config_path)
        self.config_broken = broken
        if broken:
            self.config_broken_at = time.monotonic()

    def daemon_alive(self) -> bool:
        return self.daemon is not None and self.daemon.poll() is None

    def start_daemon(self) -> bool:
        """Start the daemon and wait for its ``started`` line. One that exits at start (e.g. over a
        corrupt ledger row) is a violation, and the soak tries again a second later, as a human would."""
        if self.config_broken:
            self.write_config()
        self.finish_pending(second_daemons_only=True)  # never two daemons (or a migration's lock) at a restart
        launched_at = time.time()
        with open(self.log_path, "ab") as log:
            self.daemon = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(self.config_path), "run"],
                                           stdout=log, stderr=subprocess.STDOUT, env=self.env_daemon,
                                           cwd=str(self.root))
        pid = self.daemon.pid
        deadline = time.monotonic() + 30
        while not (found := [e for e in self.read_log()[-50:] if e.get("event") == "started" and e.get("pid") == pid]):
            if self.daemon.poll() is not None:
                self.read_log()
                self.checker.violate("daemon", "", f"the daemon exited {self.daemon.returncode} at start; log tail: "
                                                   f"{self.tail()[-600:]}", key=f"start-failed:{self.tail()[-200:]}")
                self.counts["daemon_failed_starts"] += 1
                self.restart_at = time.monotonic() + 1.0
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start within 30 s; see {self.log_path}")
            time.sleep(0.02)
        self.daemon_intervals.append([time.time(), float("inf")])
        try:  # for the tick gaps: the clock must tick from the moment the daemon says it started
            said = datetime.fromisoformat(str(found[-1].get("timestamp"))).timestamp()
        except ValueError:
            said = launched_at
        self.daemon_spans.append([max(launched_at, said), float("inf")])
        self.counts["daemon_starts"] += 1
        self.restart_at = None
        # A daemon killed before it ever ticked tests only its start-up (which takes seconds on a
        # loaded machine): the next kill or stop comes a whole interval after this start.
        for name in ("daemon_kill", "daemon_term"):
            if name in self.next_fault:
                self.next_fault[name] = max(self.next_fault[name], time.monotonic() + self.rng.uniform(*FAULTS[name]))
        return True

    def stop_daemon(self, sig: int) -> None:
        if not self.daemon_alive():
            return
        assert self.daemon is not None
        self.daemon.send_signal(sig)
        sent = time.monotonic()
        try:
            self.daemon.wait(timeout=STOP_WITHIN)
            if sig == signal.SIGTERM:
                took = round(1000 * (time.monotonic() - sent))
                self.counts["max_sigterm_stop_ms"] = max(self.counts["max_sigterm_stop_ms"], took)
        except subprocess.TimeoutExpired:
            self.checker.violate("daemon", "", f"the daemon did not stop within {STOP_WITHIN:g} s of SIGTERM "
                                               f"(stop_grace is 300 ms); SIGKILLed")
            self.daemon.kill()
            self.daemon.wait()
        for job in self.pending:
            if job.what.startswith(LOCK_HOLDERS) and job.main_gone_at is None:
                job.main_gone_at = time.time()
        self.daemon_intervals[-1][1] = self.daemon_spans[-1][1] = time.time()
        self.read_log()
        self.hup_expect = []

    def read_log(self) -> list[dict[str, Any]]:
        """New daemon log lines, parsed; daemon errors and SIGHUP answers are checked here."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._log_offset)
                data = handle.read()
        except FileNotFoundError:
            return self.log_events
        self._log_offset += len(data)
        data = self._log_partial + data
        lines = data.split(b"\n")
        self._log_partial = lines.pop()
        for raw in lines:
            if not raw.strip():
                continue
            try:
                event = json.loads(raw)
            except ValueError:
                text = raw.decode(errors="replace")
                if "Traceback" in text or "Error" in text:
                    self.checker.violate("daemon", "", f"non-JSON output from the daemon: {text[:300]}")
                continue
            name = event.get("event")
            if name in DAEMON_ERRORS:
                task = str(event.get("task", ""))
                if self.garbage_at(task, event.get("timestamp")):
                    self.counts["daemon_errors_over_garbage"] += 1  # e.g. a dispatch whose owner could not be recorded
                elif name in PLANT_EXCUSES and self.planted_at(task, event.get("timestamp")):
                    self.counts["daemon_errors_over_planted_files"] += 1  # a launch refused over a planted FIFO
                else:
                    self.counts[f"daemon logged {name}"] += 1
                    what = str(event.get("error") or event.get("reason") or "")[:160]
                    self.checker.violate("daemon", task, f"the daemon logged {name} (first of "
                                                         f"`daemon logged {name}` in the counts): "
                                                         f"{json.dumps(event)[:600]}",
                                         key=f"daemonlog:{name}:{task}:{what}")
            if name == "waiting" and "capacity full" in str(event.get("reason", "")):
                self.waiting_for_slot.add(str(event.get("task", "")))
            elif name in ("dispatched", "decision") and event.get("action") != "dispatch":
                self.waiting_for_slot.discard(str(event.get("task", "")))
            if isinstance(name, str) and not name.startswith(("Execution of job", "Running job", "Job ")):
                with contextlib.suppress(ValueError):  # the daemon's own work (not the scheduler's "skipped")
                    self.activity.append(datetime.fromisoformat(str(event.get("timestamp"))).timestamp())
            if name in ("started", "reloaded", "reload_failed", "stopped"):
                self.log_events.append(event)
            if name == "invalid_baton":
                self.counts["invalid_logged"] += 1
            if name == "clock_stepped":
                with contextlib.suppress(ValueError, TypeError):
                    self.step_lines.append((datetime.fromisoformat(str(event.get("timestamp"))).timestamp(),
                                            str(event.get("direction")), float(event.get("seconds"))))
        return self.log_events

    def garbage_at(self, task: str, stamp: object) -> bool:
        """Did the soak's garbage stand over ``task``'s baton at the log time ``stamp`` (give or take 2 s)?"""
        try:
            ts = datetime.fromisoformat(str(stamp)).timestamp()
        except ValueError:
            return False
        return any(t == task and r.written_at - 2.0 <= ts <= (r.restored_at or time.time()) + 2.0
                   for t, r in self.checker.garbage_history)

    def planted_at(self, task: str, stamp: object) -> bool:
        """Did a file the soak planted stand in ``task``'s logs dir or workdir at log time ``stamp`` (± 2 s)?"""
        try:
            ts = datetime.fromisoformat(str(stamp)).timestamp()
        except ValueError:
            return False
        return any(t == task and lo - 2.0 <= ts <= hi + 2.0 for t, lo, hi in self.plant_windows) or any(
            p.task == task and p.planted_at - 2.0 <= ts for p in self.plants)

    def check_hups(self, final: bool = False) -> None:
        """Every SIGHUP is answered: ``reloaded`` for a good config, ``reload_failed`` for a broken one."""
        remaining = []
        for index, expected, sent in self.hup_expect:
            answers = [e.get("event") for e in self.log_events[index:] if e.get("event") in ("reloaded", "reload_failed")]
            if answers:
                self.counts["sighups_answered"] += 1
                if answers[0] != expected:
                    self.checker.violate("daemon", "", f"a SIGHUP expecting {expected} was answered {answers[0]}")
            elif final or time.time() - sent > 10:
                self.checker.violate("daemon", "", f"a SIGHUP sent {time.time() - sent:.1f}s ago was never answered "
                                                   f"(expected {expected})")
            else:
                remaining.append((index, expected, sent))
        self.hup_expect = remaining

    def hup(self, *, broken: bool) -> bool:
        """Write the config and send SIGHUP; one at a time (two close together would merge into one reload)."""
        self.read_log()
        self.check_hups()
        if not self.daemon_alive() or self.hup_expect:
            return False
        assert self.daemon is not None
        self.write_config(broken=broken)
        self.hup_expect.append((len(self.log_events), "reload_failed" if broken else "reloaded", time.time()))
        self.daemon.send_signal(signal.SIGHUP)
        self.counts["sighup_broken" if broken else "sighup_good"] += 1
        return True

    # -- tasks -------------------------------------------------------------------------

    def create_task(self, store: Any) -> str:
        from heartbeat.model.baton import Gate
        from heartbeat.tasks import verbs as tasks

        self._task_seq += 1
        task_id = f"t{self._task_seq:04d}"
        steps = [f"step {i + 1}" for i in range(self.rng.randint(3, 8))]
        blocked_on, gate = "", None
        roll = self.rng.random()
        if roll < 0.08:
            blocked_on = "the soak's file gate at creation"
            gate = Gate.parse(f"file:{self.root / 'gates' / f'{task_id}.created'}")
        elif roll < 0.12:
            blocked_on = "a human, at creation"
            gate = Gate.parse("human")
        workdir, key_files = str(self.root / "work"), []
        if self.rng.random() < GIT_SHARE:
            workdir, key_files = self.git_workdir(task_id), ["notes.md"]
            self.git_tasks.add(task_id)
        tasks.new_task(store, task_id, task=f"soak task {task_id}", step="start", intent="survive the soak",
                       workdir=workdir, key_files=key_files, plan=steps, blocked_on=blocked_on, gate=gate,
                       actor="soak")
        self.tasks.append(task_id)
        return task_id

    def git_workdir(self, task_id: str) -> str:
        """A workdir of its own that reads as a git checkout (HEAD, a branch ref) with a key file."""
        work = self.root / "work" / task_id
        (work / ".git" / "refs" / "heads").mkdir(parents=True, exist_ok=True)
        (work / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        (work / ".git" / "refs" / "heads" / "main").write_text(f"{self.rng.getrandbits(160):040x}\n")
        (work / "notes.md").write_text(f"notes of {task_id}\n")
        return str(work)

    # -- the samplers --------------------------------------------------------------------

    def _sampler(self, what: str, interval: float) -> None:
        fn = {"processes": self.checker.sample_processes, "batons": self.checker.sample_batons,
              "ledger": self.checker.sample_ledger}[what]
        while not self.stop_sampling.is_set():
            try:
                fn()
            except Exception:
                self.sampler_errors.append(traceback.format_exc())
                print(f"soak: the {what} sampler failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            self.stop_sampling.wait(interval)

    # -- faults ----------------------------------------------------------------------------

    def live_groups(self) -> list[Any]:
        return [g for groups in list(self.checker.live.values()) for g in groups]

    def fault(self, name: str) -> bool:
        """Inject one fault; False when it found nothing to act on (the soak tries again soon)."""
        rng = self.rng
        if name == "daemon_kill" and self.daemon_alive():
            self.stop_daemon(signal.SIGKILL)
            self.counts["daemon_sigkills"] += 1
            self.restart_at = time.monotonic() + rng.uniform(0.0, 1.5)
        elif name == "daemon_term" and self.daemon_alive():
            self.stop_daemon(signal.SIGTERM)
            self.counts["daemon_sigterms"] += 1
            self.restart_at = time.monotonic() + rng.uniform(0.0, 1.0)
        elif name == "hup_good":
            self.tick = rng.choice(TICKS)
            self.ticks_used.add(self.tick)
            self.hup(broken=False)
        elif name == "hup_broken" and not self.config_broken:
            if not self.hup(broken=True):
                return False  # no daemon up, or a SIGHUP not answered yet: tried again soon (RETRY_SOON)
            self.next_fault["hup_repair"] = time.monotonic() + rng.uniform(0.3, 1.5)
        elif name == "hup_repair":
            if not self.config_broken:
                del self.next_fault["hup_repair"]
            elif not self.daemon_alive():
                self.write_config()  # it will start with the good one
                del self.next_fault["hup_repair"]
            elif self.hup(broken=False):
                del self.next_fault["hup_repair"]
            else:
                self.next_fault["hup_repair"] = time.monotonic() + 0.2  # the broken one is not answered yet
        elif name in ("agent_kill", "shim_kill", "agent_only_kill"):
            self.kill_agent(name)
        elif name == "drop_block":
            self.drop_block()
        elif name == "benign_edit":
            self.benign_edit()
        elif name == "garbage":
            self.write_garbage()
        elif name == "stale_write":
            self.stale_write()
        elif name == "new_task":
            from heartbeat.store.files import FileStore

            store = FileStore(str(self.state))
            try:
                self.create_task(store)
                self.counts["tasks_added_midway"] += 1
            finally:
                store.close()
        elif name == "fifo_logs":
            return self.plant_in_logs(symlink=False)
        elif name == "symlink_logs":
            return self.plant_in_logs(symlink=True)
        elif name == "fifo_workdir":
            return self.plant_in_workdir()
        elif name == "race":
            return self.race()
        elif name == "restore_baton":
            return self.restore_baton()
        elif name == "corrupt_ledger":
            return self.corrupt_ledger()
        elif name == "second_daemon":
            return self.second_daemon()
        elif name == "hold_lock":
            return self.hold_lock()
        elif name == "live_migrate":
            return self.live_migrate()
        elif name == "clock_step":
            return self.step_clock()
        return True

    def kill_agent(self, how: str) -> None:
        groups = self.live_groups()
        if not groups:
            return
        g = self.rng.choice(groups)
        try:
            if how == "agent_kill":
                self.checker.shim_killed.add(g.pgid)  # its setsid grandchildren can no longer be stopped
                os.killpg(g.pgid, signal.SIGKILL)
            elif how == "shim_kill":
                self.checker.shim_killed.add(g.pgid)
                os.kill(g.pgid, signal.SIGKILL)  # the shim leads the group: the agent is orphaned
            else:
                others = sorted(p for p in g.pids if p != g.pgid)
                if not others:
                    return
                os.kill(others[-1], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        self.counts[how + "s"] += 1

    def pick_task(self, predicate: Any) -> str | None:
        candidates = [t for t, doc in list(self.checker.latest.items())
                      if t not in self.checker.garbage and t not in self.held and predicate(doc)]
        return self.rng.choice(candidates) if candidates else None

    def drop_block(self) -> None:
        task = self.pick_task(lambda d: d.get("meta", {}).get("status") == "blocked")
        if task is None:
            return

        def change(data: bytes) -> bytes | None:
            doc = tomllib.loads(data.decode())
            meta = doc["meta"]
            if meta.get("status") != "blocked":
                return None
            meta["status"] = "active"
            meta.pop("gate", None)
            meta.pop("blocked_at", None)
            doc["blocked_on"] = ""
            return tomli_w.dumps(doc).encode()

        new = self.checker.hand_edit(task, change)
        if new is not None:
            revision = int(tomllib.loads(new.decode())["meta"]["revision"])
            self.checker.drops.setdefault(task, []).append(revision)
            self.checker.drops_found.setdefault(task, []).append(revision)
            self.counts["hand_edits"] += 1
            self.counts["blocks_dropped_by_hand"] += 1

    def benign_edit(self) -> None:
        task = self.pick_task(lambda d: True)
        if task is None:
            return
        self._edit_seq += 1
        key, value = f"soak_note_{self._edit_seq}", f"kept across rewrites {self._edit_seq}"

        def change(data: bytes) -> bytes | None:
            doc = tomllib.loads(data.decode())
            doc[key] = value
            return tomli_w.dumps(doc).encode()

        if self.checker.hand_edit(task, change) is not None:
            self.checker.expected_keys.setdefault(task, {})[key] = value
            self.counts["hand_edits"] += 1
            self.counts["unknown_keys_added"] += 1

    def write_garbage(self) -> None:
        task = self.pick_task(lambda d: True)
        if task is None:
            return
        kind = self.rng.choice(["binary", "torn", "wrong-type"])

        def change(data: bytes) -> bytes | None:
            if kind == "torn":
                return data[: max(1, len(data) // 2)] + b"\n[meta\n"
            if kind == "wrong-type":
                lines = data.split(b"\n")
                out = [b"step = 3" if line.startswith(b"step = ") else line for line in lines]
                if out != lines:
                    return b"\n".join(out)
            return b"\x00\xff garbage \xfe" + bytes(self.rng.randrange(256) for _ in range(64))

        if self.checker.hand_edit(task, change, garbage=True) is not None:
            self.counts["hand_edits"] += 1
            self.counts["garbage_batons"] += 1
            self.garbage_restore[task] = time.monotonic() + self.rng.uniform(1.5, 4.0)

    def restore_garbage(self, task: str, *, force: bool = False) -> bool:
        record = self.checker.garbage.get(task)
        if record is None:
            self.garbage_restore.pop(task, None)
            return True
        if not force:
            waited = time.time() - record.written_at
            if waited < 10 and not (self.daemon_alive() and self.ledger_has(task, "invalid", record.written_at - 2.0)):
                return False  # let the daemon see it first
        self.checker.hand_edit(task, lambda _data: record.original, restore=True)
        self.garbage_restore.pop(task, None)
        self.counts["garbage_repaired"] += 1
        return True

    def ledger_has(self, task: str, kind: str, since: float) -> bool:
        import sqlite3

        conn = sqlite3.connect(str(self.state / "ledger.sqlite3"), timeout=30)
        try:
            row = conn.execute("SELECT 1 FROM events WHERE task = ? AND kind = ? AND ts >= ? LIMIT 1",
                               (task, kind, since)).fetchone()
        finally:
            conn.close()
        return row is not None

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "heartbeat", "--state-dir", str(self.state), *argv],
                              capture_output=True, text=True, env=self.env, timeout=60, cwd=str(self.root))

    def stale_write(self) -> None:
        task = self.pick_task(lambda d: d.get("meta", {}).get("epoch", 0) >= 2)
        if task is None:
            return
        epoch = int(self.checker.latest[task]["meta"]["epoch"]) - 1
        marker = f"stale write {len(self.stale_markers) + 1}"
        if task in self.checker.garbage:
            return
        if self.stale_rng.random() < 0.5:
            r = self.cli("set", task, f"step={marker}", "--epoch", str(epoch))
        else:  # as a superseded agent types it: relayed to the daemon when it runs (heartbeat.hotpath.relay)
            env = {**self.env, "HEARTBEAT_STATE_DIR": str(self.state), "HEARTBEAT_TASK": task,
                   "HEARTBEAT_EPOCH": str(epoch), "SOAK_OUTSIDER": "1"}  # (not an agent the checker counts)
            r = subprocess.run([sys.executable, "-m", "heartbeat", "set", task, f"step={marker}"],
                               capture_output=True, text=True, env=env, timeout=60, cwd=str(self.root))
            self.counts["stale_writes_by_agent_env"] += 1
        self.counts["stale_writes"] += 1
        self.stale_markers.append((task, marker, r.returncode))
        if r.returncode != 5:
            self.checker.violate("fencing", task, f"a write with superseded epoch {epoch} exited {r.returncode}, "
                                                  f"not 5: {r.stderr.strip()[:300]}")
        else:
            self.counts["stale_writes_refused"] += 1


    # -- planted files, races, restores, corrupt rows, a second daemon, held locks ----------------

    def outside_file(self, name: str, data: bytes) -> Path:
        path = self.root / "outside" / name
        path.write_bytes(data)
        self.outside[str(path)] = data
        return path

    def check_outside(self) -> None:
        """Nothing was written through a planted link: the outside dir holds exactly what the soak put there."""
        found = {}
        for dirpath, _dirs, files in os.walk(self.root / "outside"):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    found[path] = Path(path).read_bytes()
                except OSError:
                    found[path] = b"<unreadable>"
        for path, data in found.items():
            if path not in self.outside:
                self.checker.violate("outside-write", "", f"{path} appeared outside the state dir (through a planted "
                                                          f"link): {data[:120]!r}", key=f"outside:{path}")
            elif self.outside[path] != data:
                self.checker.violate("outside-write", "", f"{path} outside the state dir was changed through a "
                                                          f"planted link: {data[:120]!r}", key=f"outside:{path}:changed")
        for path in set(self.outside) - set(found):
            self.checker.violate("outside-write", "", f"{path} outside the state dir vanished", key=f"outside:{path}:gone")

    def plant_in_logs(self, *, symlink: bool) -> bool:
        """A FIFO or a link where the next dispatch (or the current agent's end) will open a file;
        or, for a link, the whole ``logs/<id>`` swapped for a link to a directory outside."""
        idle = {t for t, d in self.checker.latest.items() if not self.checker.live.get(t)}
        task = self.pick_task(lambda d: d.get("meta", {}).get("status") in ("active", "snoozed", "blocked"))
        if task is None:
            return False
        epoch = int(self.checker.latest[task]["meta"].get("epoch", 0))
        logs = self.state / "logs" / task
        self._plant_seq += 1
        if symlink and task in idle and self.rng.random() < 0.35:
            if any(p.task == task and p.kind in ("fifo", "link", "logs-dir-link") for p in self.plants):
                # A file planted inside would be moved aside with the directory, out of its own
                # cleanup's reach, and come back with it: a FIFO left behind for good.
                return False
            target = self.root / "outside" / f"logs-of-{task}-{self._plant_seq}"
            target.mkdir()
            moved = None
            if logs.is_dir() and not logs.is_symlink():
                moved = logs.with_name(f".{task}.soak-moved-{self._plant_seq}")
                os.rename(logs, moved)
            else:
                logs.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.symlink(target, logs)
            self.add_plant(Plant(str(logs), "logs-dir-link", task, moved=str(moved) if moved else None))
            self.counts["planted_logs_dir_links"] += 1
            return False
        live = self.checker.live.get(task)
        if not symlink and live and self.rng.random() < 0.25:
            name = f"{epoch}.exit"  # the running agent's own exit file: an agent could make it a FIFO
        else:
            name = f"{epoch + 1}.{self.rng.choice(['exit', 'log', 'pid', 'brief.md'])}"
        if logs.is_symlink():
            return False
        logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = logs / name
        try:
            if symlink:
                victim = self.outside_file(f"victim-{task}-{self._plant_seq}.txt", b"must stay as it is\n")
                os.symlink(victim, path)
            else:
                os.mkfifo(path, 0o600)
        except FileExistsError:
            return False
        self.add_plant(Plant(str(path), "link" if symlink else "fifo", task))
        self.counts["planted_logs_links" if symlink else "planted_logs_fifos"] += 1
        return True

    def plant_in_workdir(self) -> bool:
        """A FIFO at ``.git/HEAD``, the branch ref or the key file of a git workdir; then a human's
        ``heartbeat verify`` or ``set`` on the task, which must answer (not hang)."""
        candidates = [t for t in self.git_tasks if t in self.checker.latest and t not in self.checker.garbage
                      and t not in self.held and not any(p.task == t and p.kind == "workdir-fifo" for p in self.plants)]
        if not candidates:
            return False
        task = self.rng.choice(candidates)
        work = self.root / "work" / task
        rel = self.rng.choice([".git/HEAD", ".git/HEAD", ".git/refs/heads/main", "notes.md"])
        path = work / rel
        try:
            original = path.read_bytes()
            path.unlink()
            os.mkfifo(path, 0o600)
        except OSError:
            return False
        self.add_plant(Plant(str(path), "workdir-fifo", task, original=original))
        self.counts["planted_workdir_fifos"] += 1
        verb = self.rng.choice(["verify", "set"])
        argv = ["verify", task] if verb == "verify" else ["set", task, f"handoff=the soak's human, {self._plant_seq}"]
        self.start_cli(f"{verb} over a FIFO at {rel}", task, argv, expect=None)
        return True

    def note(self, text: str) -> None:
        """One line in ``<root>/faults.log`` (wall time, what): to line violations up with what caused them."""
        with open(self.root / "faults.log", "a") as handle:
            handle.write(f"{time.time():.3f} {text}\n")

    def add_plant(self, plant: Plant) -> None:
        self.note(f"  planted {plant.kind} {plant.path}")
        plant.planted_at = time.time()
        plant.until = time.monotonic() + self.rng.uniform(1.0, 4.0)
        self.plants.append(plant)

    def clean_plants(self, *, force: bool = False) -> None:
        now = time.monotonic()
        for plant in list(self.plants):
            if not force and now < plant.until:
                continue
            self.remove_plant(plant)
            self.plants.remove(plant)
            self.plant_windows.append((plant.task, plant.planted_at, time.time()))
            self.counts["plants_cleaned"] += 1

    def remove_plant(self, plant: Plant) -> None:
        """Undo a plant as a human would: whoever is stuck opening the FIFO gets it opened (then EOF)."""
        path = plant.path
        self.plant_removed_at[plant.task] = time.monotonic()
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if plant.kind in ("fifo", "workdir-fifo") and st is not None and stat.S_ISFIFO(st.st_mode):
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
            try:
                os.unlink(path)
            finally:
                os.close(fd)
        elif plant.kind in ("link", "logs-dir-link") and st is not None and stat.S_ISLNK(st.st_mode):
            os.unlink(path)
        if plant.kind == "workdir-fifo" and plant.original is not None:
            tmp = f"{path}.soak-tmp"
            Path(tmp).write_bytes(plant.original)
            os.replace(tmp, path)
        if plant.kind == "logs-dir-link" and plant.moved:
            if not os.path.lexists(path):
                os.rename(plant.moved, path)
            else:
                self.counts["logs_dirs_recreated_meanwhile"] += 1

    def start_cli(self, what: str, task: str, argv: list[str], *, expect: set[int] | None,
                  timeout: float = 20.0, env: dict[str, str] | None = None) -> None:
        """Run a CLI command in the background; :meth:`poll_pending` judges how it ended."""
        out = tempfile.TemporaryFile()  # noqa: SIM115  (closed by poll_pending)
        proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--state-dir", str(self.state), *argv],
                                stdout=out, stderr=subprocess.STDOUT, env=env or self.env, cwd=str(self.root))
        self.pending.append(Pending(what, task, proc, out, time.monotonic(), time.monotonic() + timeout, expect))

    def poll_pending(self, *, final: bool = False) -> None:
        now = time.monotonic()
        for job in list(self.pending):
            code = job.proc.poll()
            if code is None and not final and now < job.deadline:
                continue
            self.pending.remove(job)
            if code is None:
                job.proc.send_signal(signal.SIGTERM)  # a second daemon that ran: let it stop like one
                try:
                    job.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.proc.kill()
                    job.proc.wait()
            job.out.seek(0)
            text = job.out.read().decode(errors="replace")
            job.out.close()
            took = (job.ended_at if job.ended_at is not None else now) - job.started
            self.judge(job, code, text, took, now)

    def _released_by_removal(self, job: Pending, ended: float) -> bool:
        """A command stuck opening a planted FIFO returns only when the soak opens it to remove it:
        it ends right after that removal. A slow one (a loaded machine) ends on its own time."""
        removed = self.plant_removed_at.get(job.task)
        ended = job.ended_at if job.ended_at is not None else ended
        return removed is not None and job.started <= removed <= ended <= removed + RELEASE_SLACK

    def judge(self, job: Pending, code: int | None, text: str, took: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        c = self.checker
        if job.what.startswith("migrate"):
            self.judge_migration(job, code, text)
            return
        if job.what.startswith("second daemon"):
            self.counts[f"second daemon exit {code}"] += 1
            # A second daemon writes nothing before it holds the lock, so its first log line dates
            # a moment it held it: before the first daemon was gone, two daemons held one state dir.
            first_line = _first_timestamp(text)
            if str(job.holder) in text and "another daemon" in text:
                self.counts["second_daemons_refused"] += 1  # (code None: it said so, and was still exiting)
            elif code == 2 and self.config_broken_at >= job.started and "heartbeat.toml" in text:
                self.counts["second_daemons_saw_a_broken_config"] += 1  # a broken SIGHUP config landed as it started
            elif code is None and first_line is None:
                self.counts["second_daemons_slow_to_start"] += 1  # still starting (a loaded machine): not past the lock
            elif job.main_gone_at is not None and first_line is not None and first_line >= job.main_gone_at:
                self.counts["second_daemons_outlived_the_first"] += 1  # the first was stopped before it checked
            elif code is None:
                c.violate("daemon", "", f"{job.what} was not refused: still running after {took:.1f}s beside "
                                        f"daemon pid {job.holder} (output {text[-300:]!r})")
            else:
                c.violate("daemon", "", f"{job.what} exited {code} (expected 1 naming the running daemon's pid "
                                        f"{job.holder}): {text[-300:]!r}")
            return
        if "Traceback" in text:
            c.violate("daemon", job.task, f"`{job.what}` printed a traceback: {text[-600:]!r}")
        elif code is None:
            c.violate("daemon", job.task, f"`{job.what}` did not answer within {took:.0f}s")
        elif job.expect is not None and code not in job.expect:
            c.violate("daemon", job.task, f"`{job.what}` exited {code}: {text[-300:]!r}")
        elif job.what.startswith(("verify", "set")) and took > 5.0 and self._released_by_removal(job, now):
            c.violate("daemon", job.task, f"`{job.what}` took {took:.1f}s: it waited on the FIFO until the soak "
                                          f"removed it (exit {code})")
        else:
            self.counts[f"cli {job.what.split()[0]} answered"] += 1

    def race(self) -> bool:
        """Make a task dispatchable (create, unblock, re-arm), then write block/done/snooze 0-200 ms later."""
        from heartbeat.model.errors import HeartbeatError
        from heartbeat.store.files import FileStore
        from heartbeat.tasks import verbs as tasks

        how = self.rng.choice(["new", "unblock", "retry"])
        store = FileStore(str(self.state))
        try:
            if how == "new":
                task = self.create_task(store)
                self.counts["tasks_added_midway"] += 1
            else:
                want = "blocked" if how == "unblock" else "escalated"
                picked = self.pick_task(lambda d: d.get("meta", {}).get("status") == want and (
                    want != "blocked" or (d["meta"].get("gate") or {}).get("kind", "human") == "human"))
                if picked is not None:
                    task = picked
                else:
                    if self.rng.random() < 0.5:
                        return False
                    task = self.create_task(store)
                    self.counts["tasks_added_midway"] += 1
                    how = "new"
                try:
                    if how == "new":
                        pass
                    elif how == "unblock":
                        tasks.unblock(store, task, by="soak-race", note="made dispatchable to race it")
                    else:
                        tasks.retry(store, task, by="soak-race")
                except HeartbeatError:
                    return False
        finally:
            store.close()
        verb = self.rng.choice(["block", "done", "snooze"])
        delay = self.rng.uniform(0.0, 0.2)
        self.counts["races"] += 1
        self.note(f"  race: {how} {task}, then {verb} after {delay * 1000:.0f} ms")
        thread = threading.Timer(delay, self.race_write, args=(task, verb))
        thread.daemon = True
        thread.start()
        self.race_threads.append(thread)
        return True

    def race_write(self, task: str, verb: str) -> None:
        from heartbeat.model.baton import Gate
        from heartbeat.model.errors import HeartbeatError
        from heartbeat.model.timeparse import utcnow
        from heartbeat.store.files import FileStore
        from heartbeat.tasks import verbs as tasks

        try:
            store = FileStore(str(self.state))
        except HeartbeatError:
            return
        try:
            if verb == "block":
                tasks.block(store, task, "the soak's human, racing the dispatch", Gate.parse("human"), actor="soak")
            elif verb == "done":
                tasks.finish(store, task, note="the soak's human, racing the dispatch", actor="soak")
            else:
                tasks.snooze(store, task, utcnow() + timedelta(seconds=self.rng.uniform(1.0, 3.0)), actor="soak")
            outcome = "landed"
        except HeartbeatError:
            outcome = "refused"
        finally:
            store.close()
        with self.count_lock:
            self.counts[f"race_{verb}s_{outcome}"] += 1

    def restore_baton(self) -> bool:
        """Keep copies of batons; copy an older one back over a live baton, as a human restoring a backup.

        Only over a task with no live agent, from a copy of the same epoch with a lower revision,
        and never to revive or bury a finished task, nor to turn snoozed into active (or back) by
        hand: those are other acts, with no event a checker could hold them to (see docs/development.md)."""
        for task in self.rng.sample(sorted(self.checker.latest), min(3, len(self.checker.latest))):
            if task in self.checker.garbage:
                continue
            try:
                data = (self.state / "batons" / f"{task}.toml").read_bytes()
            except OSError:
                continue
            doc = _loads(data)
            if doc is not None and isinstance(doc.get("meta"), dict):
                kept = self.copies.setdefault(task, [])
                kept.append((data, doc))
                del kept[:-4]
                (self.root / "copies" / f"{task}.{doc['meta'].get('revision')}.toml").write_bytes(data)
                self.counts["baton_copies_kept"] += 1
        pairs = []
        for task, kept in self.copies.items():
            live = self.checker.latest.get(task)
            if live is None or task in self.checker.garbage or task in self.held or self.checker.live.get(task):
                continue
            for copy, parsed in kept:
                if _restorable(live["meta"], parsed["meta"]):
                    pairs.append((task, copy, parsed))
        if not pairs:
            return False
        task, copy, old = self.rng.choice(pairs)
        dropped: list[int] = []

        def change(data: bytes) -> bytes | None:
            live = _loads(data)
            if live is None or "meta" not in live or not _restorable(live["meta"], old["meta"]):
                return None
            if live["meta"].get("status") == "blocked" and old["meta"].get("status") != "blocked":
                dropped.append(int(live["meta"]["revision"]))  # a restore that drops a block: a bypass is due
            return copy

        if self.checker.hand_edit(task, change) is None:
            return False
        self.note(f"  restored {task} to revision {old['meta'].get('revision')}")
        self.restored_tasks.add(task)
        if dropped:
            self.checker.drops.setdefault(task, []).extend(dropped)
            self.checker.drops_found.setdefault(task, []).append(int(old["meta"]["revision"]))
            self.counts["restores_dropping_a_block"] += 1
        expected = self.checker.expected_keys.get(task, {})
        for key in [k for k, v in expected.items() if old.get(k) != v]:
            del expected[key]  # the human restored a copy from before this key was added
        self.counts["batons_restored"] += 1
        self.counts["hand_edits"] += 1
        return True

    def corrupt_ledger(self) -> bool:
        """Corrupt one row, run ``heartbeat report``, and repair the row a few seconds later.

        Any row but a touch (rewritten in place when touches coalesce) and a task's latest
        block-related row (the one the daemon holds a dropped block by: a daemon that skips it,
        as it must, could not know the block a hand edit then drops)."""
        import sqlite3

        conn = sqlite3.connect(str(self.state / "ledger.sqlite3"), timeout=30)
        try:
            # Half the time a row the daemon reads while it serves (a dispatch's stalled/dispatched
            # lookup, the budget, the escalation's notifiers, the block seed at a restart).
            hot = "AND kind IN ('dispatched', 'stalled', 'escalated', 'notified', 'created', 'blocked', " \
                  "'unblocked', 'bypass')" if self.rng.random() < 0.5 else ""
            rows = conn.execute("SELECT id, ts, data FROM events WHERE kind != 'touched' AND id NOT IN "
                                "(SELECT MAX(id) FROM events WHERE kind IN ('created', 'blocked', 'unblocked', "
                                f"'bypass') GROUP BY task) {hot} ORDER BY RANDOM() LIMIT 1").fetchall()
            if not rows:
                return False
            row_id, ts, data = rows[0]
            column, value = self.rng.choice([("data", "{oops"), ("ts", 1e300), ("ts", -1.0e18),
                                             ("ts", "yesterday"), ("data", "[1, 2]")])
            self.checker.planted_rows[row_id] = {"ts": ts, "data": data}
            with conn:
                conn.execute(f"UPDATE events SET {column} = ? WHERE id = ?", (value, row_id))
        finally:
            conn.close()
        self.counts["ledger_rows_corrupted"] += 1
        self.corrupt_repairs.append((time.monotonic() + self.rng.uniform(3.0, 8.0), row_id, column,
                                     ts if column == "ts" else data, value))
        self.start_cli("report over a corrupt ledger row", "", ["report"], expect={0})
        return True

    def repair_rows(self, *, force: bool = False) -> None:
        import sqlite3

        now = time.monotonic()
        due = [r for r in self.corrupt_repairs if force or now >= r[0]]
        if not due:
            return
        conn = sqlite3.connect(str(self.state / "ledger.sqlite3"), timeout=30)
        try:
            with conn:
                for item in due:
                    _at, row_id, column, original, value = item
                    conn.execute(f"UPDATE events SET {column} = ? WHERE id = ? AND {column} IS ?",
                                 (original, row_id, value))
                    self.corrupt_repairs.remove(item)
                    self.counts["ledger_rows_repaired"] += 1
        finally:
            conn.close()

    def second_daemon(self) -> bool:
        """Start another daemon on the same state dir: it must exit 1 at once naming the running one."""
        if not self.daemon_alive() or self.config_broken or any(j.what.startswith("second daemon")
                                                                for j in self.pending):
            return False  # (a broken config is refused before the lock is looked at: exit 2, rightly)
        extra = self.rng.choice([[], ["--once"], ["--dry-run"]])
        out = tempfile.TemporaryFile()  # noqa: SIM115  (closed by poll_pending)
        proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(self.config_path), "run", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=str(self.root))
        what = "second daemon (run" + (" " + extra[0] if extra else "") + ")"
        holder = self.daemon.pid if self.daemon is not None else 0
        self.pending.append(Pending(what, "", proc, out, time.monotonic(), time.monotonic() + 3.0, {1}, holder))
        self.counts["second_daemons_started"] += 1
        return True

    def live_migrate(self) -> bool:
        """``heartbeat migrate`` of the live store into a fresh dir, beside the running daemon: it must
        exit 1 naming the daemon's pid and how to stop it, and leave the target without a baton."""
        if not self.daemon_alive() or any(j.what.startswith("migrate") for j in self.pending):
            return False
        self.counts["live_migrations"] += 1
        target = self.root / "migrated" / str(self.counts["live_migrations"])
        target.parent.mkdir(mode=0o700, exist_ok=True)
        out = tempfile.TemporaryFile()  # noqa: SIM115  (closed by poll_pending)
        proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "migrate", "--from", str(self.state),
                                 "--to", str(target)], stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                cwd=str(self.root))
        holder = self.daemon.pid if self.daemon is not None else 0
        for name in ("daemon_kill", "daemon_term"):  # it must meet the daemon it is to be refused by
            self.next_fault[name] = max(self.next_fault[name], time.monotonic() + MIGRATE_WITHIN)
        self.pending.append(Pending("migrate (live)", "", proc, out, time.monotonic(), time.monotonic() + 20.0,
                                    {1}, holder, target=str(target)))
        return True

    def step_clock(self, *, to: float | None = None) -> bool:
        """Step the daemon's wall clock (forward, back to where it was, back, forward again: both
        directions by ``step_size``), while the daemon ticks; hold off its kills for ``STEP_WATCH``."""
        if to is None:
            span = self.daemon_spans[-1][0] if self.daemon_spans else float("inf")
            beats = [name for t, name in self.tick_watch.beats if t > span]
            if not self.daemon_alive() or "READY" not in beats:
                return False  # the daemon looks for steps every second once it serves (READY)
            if "WATCHDOG" not in beats and self.step_waits < 8:
                self.step_waits += 1  # rather after its first pass, so the tick after the step is judged too
                return False
            self.step_waits = 0
            cycle = (self.step_size, 0.0, -self.step_size, 0.0)
            to = cycle[len(self.clock_steps) % len(cycle)]
        if to == self.clock_shift:
            return True
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{to}\n")
        os.replace(tmp, self.clock_file)
        step = ClockStep(time.time(), time.monotonic(), self.clock_shift, to)
        self.clock_steps.append(step)
        self.clock_shift = to
        self.counts["clock_steps_forward" if step.size > 0 else "clock_steps_back"] += 1
        for name in ("daemon_kill", "daemon_term"):  # the daemon must be there to see it
            self.next_fault[name] = max(self.next_fault[name], time.monotonic() + STEP_WATCH)
        return True

    def judge_migration(self, job: Pending, code: int | None, text: str) -> None:
        c = self.checker
        batons = sorted(p.name for p in (Path(job.target) / "batons").glob("*.toml"))
        if code == 1 and f"pid {job.holder}" in text and "stop it first" in text:
            self.counts["live_migrations_refused"] += 1
            if batons:
                c.violate("migrate", "", f"a refused migration wrote {len(batons)} baton(s) to {job.target}")
        elif code in (0, None) and job.main_gone_at is not None:
            self.counts["live_migrations_after_the_daemon_stopped"] += 1  # the soak stopped it meanwhile
        elif code is None and not text.strip():
            self.counts["live_migrations_slow_to_start"] += 1  # still importing (a loaded machine): not past the lock
        elif code is None:
            c.violate("migrate", "", f"a migration beside daemon pid {job.holder} did not answer: {text[-300:]!r}")
        else:
            c.violate("migrate", "", f"a migration beside daemon pid {job.holder} exited {code} (expected 1 "
                                     f"naming it): {text[-300:]!r}")

    def finish_pending(self, *, second_daemons_only: bool = False) -> None:
        """Judge the background commands now; one still running is judged as such, then stopped."""
        keep = [j for j in self.pending if second_daemons_only and not j.what.startswith(LOCK_HOLDERS)]
        self.pending = [j for j in self.pending if j not in keep]
        running = [j for j in self.pending if j.proc.poll() is None]
        self.poll_pending(final=True)  # judges the running ones as "did not answer / not refused"
        for job in running:
            job.proc.wait()
        self.pending = keep

    def hold_lock(self) -> bool:
        """Hold one baton's lock from another process for 1-3 s (longer than a tick), as a slow API user;
        mostly a task the daemon is about to write (active, no agent: due for a dispatch)."""
        task = self.pick_task(lambda d: d.get("meta", {}).get("status") == "active" and not d["meta"].get("owner"))
        if task is None or self.rng.random() < 0.3:
            task = self.pick_task(lambda d: d.get("meta", {}).get("status") in ("active", "snoozed", "blocked"))
        if task is None:
            return False
        lock = self.state / "locks" / f"{task}.lock"
        seconds = self.rng.uniform(1.0, 3.0)
        code = ("import fcntl, os, sys, time\n"
                "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                "time.sleep(float(sys.argv[2]))\n")
        proc = subprocess.Popen([sys.executable, "-c", code, str(lock), f"{seconds:.2f}"], env=self.env)
        self.note(f"  holding {lock} for {seconds:.2f}s")
        self.held[task] = (proc, time.monotonic() + seconds + 30.0)
        self.counts["baton_locks_held"] += 1
        return True

    def release_locks(self, *, force: bool = False) -> None:
        now = time.monotonic()
        for task, (proc, deadline) in list(self.held.items()):
            if proc.poll() is None and not force and now < deadline:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            del self.held[task]

    def check_tick_gaps(self, *, final: bool = False) -> None:
        """No ``WATCHDOG`` for more than 5 x tick while the daemon was up is a violation, unless the
        daemon logged work all along (a tick settling and launching twenty agents on a loaded machine
        takes seconds; one stuck on a FIFO or a lock logs nothing): the longest stretch inside the gap
        without a log line of the daemon's must also exceed the limit."""
        limit = 5 * max(parse_seconds(t) for t in self.ticks_used)
        now = time.time()
        beats = list(self.tick_watch.beats)
        self.read_log()  # after the beats were taken: every line written before a beat is read now
        if final:
            up, view = [(a, b) for a, b in self.daemon_spans], list(beats)
        else:  # while it runs, only the last two spans: a long soak has thousands of beats
            up = [(a, b) for a, b in self.daemon_spans[-2:]]
            start = up[0][0] if up else now
            k = len(beats)
            while k > 0 and beats[k - 1][0] >= start:
                k -= 1
            view = beats[k:]
        for lo, hi in tick_gaps(view, up, limit, now=now, startup=STARTUP_GRACE, first_pass=FIRST_PASS):
            if hi >= now - 1e-6 and not final:
                continue  # still open: judged once it ends (or at the end), with its full length
            i, j = bisect.bisect_right(self.activity, lo), bisect.bisect_left(self.activity, hi)
            points = [lo, *self.activity[i:j], hi]
            silent = max(b - a for a, b in itertools.pairwise(points))
            if silent <= limit:
                if f"gap:{lo:.3f}" not in self.gaps_seen:
                    self.gaps_seen.add(f"gap:{lo:.3f}")
                    self.counts["tick_gaps_busy_not_stuck"] += 1
                continue
            self.checker.violate("tick-gap", "", f"no tick for {hi - lo:.2f}s (limit 5 x tick = {limit:.2f}s) from "
                                                 f"{lo:.3f} while the daemon was up, {silent:.2f}s of it without a "
                                                 f"log line", key=f"gap:{lo:.3f}")
        if final:
            self.counts["ticks_seen"] = sum(1 for _t, name in self.tick_watch.beats if name == "WATCHDOG")
            gaps = tick_gaps(list(self.tick_watch.beats), [(a, b) for a, b in self.daemon_spans], 0.0,
                             startup=STARTUP_GRACE)
            self.counts["max_tick_gap_ms"] = round(1000 * max((hi - lo for lo, hi in gaps), default=0.0))

    # -- the humans: gates, unblocks, retries ------------------------------------------------

    def play_humans(self, now: float) -> None:
        for task, doc in list(self.checker.latest.items()):
            if task in self.checker.garbage or task in self.held:
                continue  # (a human waits for the lock someone holds; the soak's loop must not)
            meta = doc.get("meta", {})
            status = meta.get("status")
            gate = meta.get("gate") or {}
            if status == "blocked" and gate.get("kind") == "file":
                target = str(gate.get("target", ""))
                if target not in self.gate_plans:
                    self.gate_plans[target] = now + self.rng.uniform(0.3, 3.0) if (
                        self.calm or self.rng.random() < 0.85) else None
                if self.calm and self.gate_plans[target] is None:
                    self.gate_plans[target] = now
            elif status == "blocked" and gate.get("kind", "human") == "human" and not self.calm:
                key = (task, str(meta.get("blocked_at", "")))
                if key not in self.unblock_plans:
                    self.unblock_plans[key] = now + self.rng.uniform(0.5, 3.0) if self.rng.random() < 0.7 else None
                due = self.unblock_plans[key]
                if due is not None and now >= due:
                    self.unblock_plans[key] = None
                    r = self.cli("unblock", task, "--by", "soak", "--note", "the soak's human said go")
                    self.counts["human_unblocks" if r.returncode == 0 else "human_unblocks_raced"] += 1
                    if r.returncode not in (0, 4):
                        self.checker.violate("daemon", task, f"unblock exited {r.returncode}: {r.stderr.strip()[:300]}")
            elif status == "escalated" and not self.calm:
                key2 = (task, int(meta.get("revision", 0)))
                if key2 not in self.retry_plans:
                    self.retry_plans[key2] = now + self.rng.uniform(0.5, 2.0) if self.rng.random() < 0.35 else None
                due = self.retry_plans[key2]
                if due is not None and now >= due:
                    self.retry_plans[key2] = None
                    r = self.cli("retry", task, "--by", "soak")
                    self.counts["retries" if r.returncode == 0 else "retries_raced"] += 1
        for target, due in list(self.gate_plans.items()):
            if due is not None and now >= due:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                Path(target).write_text("open\n")
                self.gate_plans[target] = None
                self.counts["file_gates_opened"] += 1

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        from heartbeat.store.files import FileStore

        started = time.monotonic()
        self.write_config()
        store = FileStore(str(self.state))
        try:
            for _ in range(self.args.tasks):
                self.create_task(store)
        finally:
            store.close()
        threads = [threading.Thread(target=self._sampler, args=("processes", 0.05), daemon=True),
                   threading.Thread(target=self._sampler, args=("batons", 0.2), daemon=True),
                   threading.Thread(target=self._sampler, args=("ledger", 0.5), daemon=True)]
        for t in threads:
            t.start()
        self.start_daemon()
        print(f"soak: {len(self.tasks)} tasks, {self.args.duration:g}s of chaos, seed {self.args.seed}, "
              f"state {self.state}", flush=True)
        try:
            self.chaos(started + self.args.duration)
            self.drain()
            self.final_sample()
            self.end_states()
        finally:
            self.finish_pending()
            self.release_locks(force=True)
            self.clean_plants(force=True)
            self.repair_rows(force=True)
            self.checker.sample_ledger()
            self.stop_daemon(signal.SIGTERM)
            self.cleanup_processes()
            self.stop_sampling.set()
            for t in threads:
                t.join(timeout=5)
            for t in self.race_threads:
                t.join(timeout=10)
            self.tick_watch.close()
        self.final_checks()
        self.counts["elapsed_s"] = round(time.monotonic() - started)
        return self.summary()

    def chaos(self, until: float) -> None:
        last_report = time.monotonic()
        while time.monotonic() < until:
            now = time.monotonic()
            self.read_log()
            self.check_hups()
            if self.daemon is not None and self.daemon.poll() is not None and self.restart_at is None:
                self.daemon_intervals[-1][1] = self.daemon_spans[-1][1] = time.time()
                self.checker.violate("daemon", "", f"the daemon exited {self.daemon.returncode} on its own; "
                                                   f"log tail: {self.tail()}")
                self.restart_at = now
            if not self.daemon_alive() and self.restart_at is not None and now >= self.restart_at:
                self.start_daemon()
            for name, due in list(self.next_fault.items()):
                if now >= due:
                    if name != "hup_repair":
                        self.next_fault[name] = now + self.rng.uniform(*FAULTS[name])
                    if name in self.args.skip:
                        continue
                    began = time.monotonic()
                    self.note(name)
                    if self.fault(name) is False and name in RETRY_SOON:
                        self.next_fault[name] = now + self.rng.uniform(0.3, 1.0)
                        self.counts[f"retried soon: {name}"] += 1
                    if time.monotonic() - began > 2.0:
                        print(f"soak: the fault {name} took {time.monotonic() - began:.1f}s", flush=True)
            for task, due in list(self.garbage_restore.items()):
                if now >= due:
                    self.restore_garbage(task)
            self.clean_plants()
            self.release_locks()
            self.repair_rows()
            self.poll_pending()
            self.check_tick_gaps()
            self.race_threads = [t for t in self.race_threads if t.is_alive()]
            self.play_humans(now)
            if now - last_report > 15:
                last_report = now
                print(f"soak: {until - now:.0f}s of chaos left; {dict(self.counts)}; "
                      f"violations so far {len(self.checker.violations)}", flush=True)
            time.sleep(0.05)

    def drain(self) -> None:
        """Stop the chaos: repair everything, turn agents calm, open every file gate, let it settle."""
        self.calm = True
        (self.root / "calm").write_text("calm\n")
        if self.clock_shift and "clock_step" not in self.args.skip:
            self.step_clock(to=0.0)  # the drain's snoozes and time gates run on the machine's time
        self.clean_plants(force=True)
        self.release_locks(force=True)
        self.repair_rows(force=True)
        for task in list(self.checker.garbage):
            self.restore_garbage(task, force=True)
        if self.config_broken:
            # A broken SIGHUP still unanswered (a daemon in its first pass answers it seconds
            # later) would read the good config written here and answer "reloaded": wait for it.
            deadline = time.monotonic() + 10.0
            while self.hup_expect and self.daemon_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
                self.read_log()
                self.check_hups()
            self.write_config()
            if self.daemon_alive():
                self.hup(broken=False)
        if not self.daemon_alive():
            self.start_daemon()
        deadline = time.monotonic() + self.args.drain
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            self.read_log()
            self.check_hups()
            self.poll_pending()
            self.check_tick_gaps()
            if not self.daemon_alive() and (self.restart_at or 0.0) <= now:
                self.start_daemon()
            self.play_humans(now)
            settled = self.settled()
            if settled and not self.checker.live:
                quiet_since = quiet_since or now
                if now - quiet_since > 1.5:
                    break
            else:
                quiet_since = None
            time.sleep(0.1)
        self.counts["drain_s"] = round(self.args.drain - max(0.0, deadline - time.monotonic()), 1)

    def settled(self) -> bool:
        for task in self.tasks:
            doc = self.checker.latest.get(task)
            if doc is None:
                return False
            meta = doc.get("meta", {})
            status = meta.get("status")
            gate = meta.get("gate") or {}
            if status in ("done", "failed", "escalated"):
                continue
            if status == "blocked" and gate.get("kind", "human") == "human":
                continue
            return False
        return True

    def final_sample(self) -> None:
        time.sleep(0.6)  # a few more ticks with nothing injected: the fault injector has stopped
        self.checker.sample_batons()
        self.checker.sample_processes()

    def end_states(self) -> None:
        """Every task ends somewhere allowed; count where."""
        now = time.time()
        tick = parse_seconds(self.tick)
        for task in self.tasks:
            doc = self.checker.final_baton(task)
            if doc is None:
                self.checker.violate("not-dropped", task, "no readable baton at the end")
                continue
            meta = doc.get("meta", {})
            status = meta.get("status")
            owner = meta.get("owner") or {}
            gate = meta.get("gate") or {}
            live = {g.pgid for g in self.checker.live.get(task, [])}
            state = str(status)
            if status in ("done", "failed", "escalated"):
                pass
            elif status == "blocked":
                kind = gate.get("kind", "human")
                target = str(gate.get("target", ""))
                if kind == "file" and os.path.exists(target) and os.path.getmtime(target) < now - (2 * tick + 1.0):
                    self.checker.violate("not-dropped", task, f"blocked on {gate} whose file exists, still blocked "
                                                              f"at the end (revision {meta.get('revision')})")
                state = f"blocked ({kind} gate closed)"
            elif status == "snoozed":
                until = _ts(meta.get("snooze_until"))
                if until is None or until < now - (2 * tick + 2.0):
                    self.checker.violate("not-dropped", task, f"snoozed until {meta.get('snooze_until')}, never woken")
            elif status == "active":
                pid = owner.get("pid")
                if pid is not None and pid in live:
                    state = "active (agent alive)"
                elif owner and pid is None and (_ts(meta.get("dispatched_at")) or 0) > now - 12:
                    state = "active (launching)"
                elif not owner:
                    last = max(t for t in (_ts(meta.get("ended_at")), _ts(meta.get("dispatched_at")),
                                           _ts(meta.get("updated_at")), 0.0) if t is not None)
                    running = sum(len(groups) for groups in self.checker.live.values())
                    if now - last < 2.0 + 2 * tick + 2.0:  # backoff_max + two ticks + slack
                        state = "active (due, backing off)"
                    elif running >= self.args.max_concurrent or task in self.waiting_for_slot:
                        state = "active (due, every agent slot taken)"  # by the samples, or by the daemon's word
                    else:
                        meta_text = json.dumps(meta, default=str)[:400]
                        self.checker.violate("not-dropped", task, f"active with no agent and not due: idle for "
                                                                  f"{now - last:.1f}s (meta {meta_text})")
                else:
                    groups = [g for g in self.checker.groups_of(task) if g.pgid == pid]
                    if not groups:  # launched after the last sample? look again
                        self.checker.sample_processes()
                        groups = [g for g in self.checker.groups_of(task) if g.pgid == pid]
                    dead_for = now - (groups[-1].last_seen + self.checker.wall_offset) if groups else None
                    launched = (_ts(meta.get("dispatched_at")) or 0) > now - 5.0
                    if (dead_for is None and not launched) or (dead_for is not None and dead_for > 3.0):
                        self.checker.violate("not-dropped", task, f"owner pid {pid} is not alive (dead for "
                                                                  f"{dead_for}s) and was never settled")
                    state = "active (settling)"
            else:
                self.checker.violate("not-dropped", task, f"ends with status {status!r}")
            self.counts[f"end: {state}"] += 1
            for key, value in self.checker.expected_keys.get(task, {}).items():
                if doc.get(key) != value:
                    self.checker.violate("nothing-lost", task, f"the unknown key {key} = {value!r} a hand edit added "
                                                               f"is gone or changed: {doc.get(key)!r}")

    def cleanup_processes(self) -> None:
        """Stop every agent and zombie left (the soak's own processes only: found by state dir)."""
        for _ in range(3):
            self.checker.sample_processes()
            pgids = {g.pgid for groups in self.checker.live.values() for g in groups}
            for pgid in pgids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            for pid in list(self.checker.zombie_pids):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            for pid in list(self.checker.grandchildren_alive):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def final_checks(self) -> None:
        problems: list[str] = []
        events = read_ledger(str(self.state / "ledger.sqlite3"), self.checker.planted_rows, problems)
        for text in problems:
            self.checker.violate("ledger-kept", "", text)
        shifts = [s.after for s in self.clock_steps]
        events, moved = map_ledger_times(events, shifts, self.started_wall - 60.0, time.time() + 60.0)
        self.counts["ledger_times_mapped_from_a_stepped_clock"] = moved
        self.check_clock_steps()
        self.check_tick_gaps(final=True)
        self.check_outside()
        tick = max(parse_seconds(t) for t in self.ticks_used)
        outlive = 5.0 + 0.3 + 2 * tick + 1.0  # the launcher's max_runtime + stop_grace + two ticks + 1 s
        outlived: list[float] = []
        by_task: dict[str, list[Any]] = {}
        for e in events:
            by_task.setdefault(e.task, []).append(e)
        kinds = Counter(e.kind for e in events)
        for name in ("dispatched", "exited", "stalled", "stopped", "bypass", "invalid", "escalated", "notified",
                     "blocked", "unblocked", "woke", "snoozed", "done", "failed", "retried", "spinning", "adopted"):
            self.counts[f"ledger: {name}"] = kinds.get(name, 0)
        stops = Counter(e.data.get("why") for e in events if e.kind == "stopped")
        for why, n in stops.items():
            self.counts[f"ledger: stopped {why}"] = n
        notify_lines = self.notify_path.read_text(errors="replace").splitlines()
        c = self.checker
        for task in self.tasks:
            evs = by_task.get(task, [])
            writes = self.agent_writes(task)
            c.extend(check_notify(evs, notify_lines, NOTIFIER))
            if task in c.rewritten:
                # Committed rows vanished (ledger-kept, already reported): what is left of the task's
                # history cannot be judged (an erased unblock reads as a dispatch while blocked, a
                # reused revision as a superseded write); one line instead of a cascade.
                self.counts["tasks_with_rewritten_ledger_history"] += 1
                continue
            c.extend(check_blocks(evs))
            c.extend(check_dispatch_status(evs))
            c.extend(check_inactive_agents(c.groups_of(task), evs, outlive_grace=outlive,
                                           up_between=self.daemon_up_between, outlived=outlived))
            # A restored copy rewinds meta.dispatches (and, until the next write, the revision): the
            # final baton is then not held to the ledger's counts; the ordering checks stay.
            final = None if task in self.restored_tasks else c.final_baton(task)
            c.extend(check_dispatch_epochs(evs, final, c.seen_epochs.get(task, ())))
            c.extend(check_fencing(evs, writes))
            c.extend(check_group_starts(c.groups_of(task), evs))
            c.extend(check_stepped_decisions(evs, c.groups_of(task), span=time.time() - self.started_wall,
                                             max_runtime=5.0))
            c.extend(check_bypasses(evs, c.drops.get(task, ()), c.drops_found.get(task, ())))
        self.counts["agents_alive_when_their_task_left_active"] = len(outlived)
        self.counts["longest_such_agent_ms"] = round(1000 * max(outlived, default=0.0))
        c.check_sampled_blocks()
        self.check_invalid_events(by_task)
        for task, marker, _code in self.stale_markers:
            if any(e.data.get("step") == marker for e in by_task.get(task, [])):
                c.violate("fencing", task, f"the stale write {marker!r} reached the ledger")
        unknown = sorted(set(by_task) - set(self.tasks))
        if unknown:
            c.violate("ledger-agrees", "", f"ledger events for tasks the soak never created: {unknown[:5]}")
        self.read_log()
        self.check_hups(final=True)
        for text in self.sampler_errors:
            c.violate("checker", "", f"a sampler failed: {text[-400:]}")

    def check_clock_steps(self) -> None:
        """Each clock step the daemon was up to see (ticking at the step, up ``STEP_WATCH`` after it) is
        logged and ticked through (:func:`check_clock_steps`)."""
        beats = list(self.tick_watch.beats)
        for step in self.clock_steps:
            span = next(((lo, hi) for lo, hi in self.daemon_spans if lo <= step.wall and step.wall + STEP_WATCH <= hi),
                        None)
            if span is not None:
                step.watched = any(name == "READY" and span[0] < t < step.wall for t, name in beats)
                step.ticking = any(name == "WATCHDOG" and span[0] < t < step.wall for t, name in beats)
            self.counts["clock_steps_watched" if step.watched else "clock_steps_unwatched"] += 1
            self.counts["clock_steps_in_a_first_pass"] += step.watched and not step.ticking
            after = [m for m, name in self.tick_watch.mono_beats if name == "WATCHDOG" and m > step.mono]
            if step.ticking and after:
                self.counts["max_first_tick_after_step_ms"] = max(self.counts["max_first_tick_after_step_ms"],
                                                                  round(1000 * (after[0] - step.mono)))
        self.counts["clock_stepped_lines"] = len(self.step_lines)
        self.checker.extend(check_clock_steps(self.clock_steps, self.step_lines, list(self.tick_watch.mono_beats),
                                              watch=STEP_WATCH))

    def agent_writes(self, task: str) -> list[dict[str, Any]]:
        path = self.root / "writes" / f"{task}.jsonl"
        out = []
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            out.append(record)
            if record.get("refused"):
                self.counts["agent_writes_refused" if not record.get("z") else "zombie_writes_refused"] += 1
            else:
                self.counts["agent_writes_landed" if not record.get("z") else "zombie_writes_landed"] += 1
        return out

    def daemon_up_between(self, lo: float, hi: float) -> float:
        return sum(max(0.0, min(hi, end) - max(lo, start)) for start, end in self.daemon_intervals)

    def check_invalid_events(self, by_task: dict[str, list[Any]]) -> None:
        c = self.checker
        windows: dict[str, list[tuple[float, float]]] = {}
        for task, record in c.garbage_history:
            end = record.restored_at or time.time()
            windows.setdefault(task, []).append((record.written_at, end))
            reported = [e for e in by_task.get(task, []) if e.kind == "invalid"
                        and record.written_at - 2.0 <= e.ts <= end + 2.0]
            if not reported and self.daemon_up_between(record.written_at, end) >= 2.0:
                c.violate("invalid-baton", task, f"garbage stood {end - record.written_at:.1f}s (daemon up "
                                                 f"{self.daemon_up_between(record.written_at, end):.1f}s of it) "
                                                 "and no invalid event was recorded")
        for task, evs in by_task.items():
            for e in evs:
                if e.kind != "invalid":
                    continue
                # An event is stamped with its tick's start, which may precede the read that saw the garbage.
                if not any(lo - 2.0 <= e.ts <= hi + 2.0 for lo, hi in windows.get(task, [])):
                    c.violate("invalid-baton", task, f"the daemon recorded invalid at {e.ts:.3f} for a baton the "
                                                     f"soak had not broken: {e.data.get('error')}")

    def tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-5:])[-1200:]
        except OSError:
            return ""

    def summary(self) -> int:
        c = self.checker
        agent_kills = self.counts["agent_kills"] + self.counts["shim_kills"] + self.counts["agent_only_kills"]
        figures = {
            "tasks": len(self.tasks),
            "seed": self.args.seed,
            "chaos_s": self.args.duration,
            "elapsed_s": self.counts["elapsed_s"],
            "dispatches": self.counts["ledger: dispatched"],
            "agent_kills": agent_kills,
            "daemon_restarts": self.counts["daemon_starts"] - 1,
            "daemon_sigkills": self.counts["daemon_sigkills"],
            "sighups": self.counts["sighup_good"] + self.counts["sighup_broken"],
            "sighups_broken": self.counts["sighup_broken"],
            "hand_edits": self.counts["hand_edits"],
            "garbage_batons": self.counts["garbage_batons"],
            "invalid_events": self.counts["ledger: invalid"],
            "bypasses": self.counts["ledger: bypass"],
            "stale_writes_refused": self.counts["stale_writes_refused"],
            "zombie_writes_refused": self.counts["zombie_writes_refused"],
            "fifos_planted": self.counts["planted_logs_fifos"] + self.counts["planted_workdir_fifos"],
            "links_planted": self.counts["planted_logs_links"] + self.counts["planted_logs_dir_links"],
            "races": self.counts["races"],
            "batons_restored": self.counts["batons_restored"],
            "ledger_rows_corrupted": self.counts["ledger_rows_corrupted"],
            "second_daemons": self.counts["second_daemons_started"],
            "second_daemons_refused": self.counts["second_daemons_refused"],
            "live_migrations": self.counts["live_migrations"],
            "live_migrations_refused": self.counts["live_migrations_refused"],
            "clock_steps": len(self.clock_steps),
            "clock_steps_forward": self.counts["clock_steps_forward"],
            "clock_steps_back": self.counts["clock_steps_back"],
            "clock_steps_watched": self.counts["clock_steps_watched"],
            "baton_locks_held": self.counts["baton_locks_held"],
            "setsid_grandchildren": len(c.grandchildren),
            "max_tick_gap_ms": self.counts["max_tick_gap_ms"],
            "max_sigterm_stop_ms": self.counts["max_sigterm_stop_ms"],
            "ledger_samples": c.ledger_samples,
            "process_samples": c.proc_samples,
            "baton_samples": c.baton_samples,
            "violations": len(c.violations),
            "counts": dict(sorted(self.counts.items())),
            "violation_list": [v.__dict__ for v in c.violations],
            "state": str(self.root),
        }
        print("\n== soak summary ==")
        for key in ("tasks", "dispatches", "agent_kills", "daemon_restarts", "daemon_sigkills", "sighups",
                    "sighups_broken", "hand_edits", "garbage_batons", "invalid_events", "bypasses",
                    "stale_writes_refused", "zombie_writes_refused", "fifos_planted", "links_planted", "races",
                    "batons_restored", "ledger_rows_corrupted", "second_daemons", "second_daemons_refused",
                    "live_migrations", "live_migrations_refused", "clock_steps", "clock_steps_forward",
                    "clock_steps_back", "clock_steps_watched", "baton_locks_held", "setsid_grandchildren",
                    "max_tick_gap_ms", "max_sigterm_stop_ms", "process_samples",
                    "baton_samples", "ledger_samples", "elapsed_s"):
            print(f"{key:>24}: {figures[key]}")
        print("  details:")
        for key, value in sorted(self.counts.items()):
            print(f"    {key}: {value}")
        print(f"{'violations':>24}: {len(c.violations)}")
        for v in c.violations:
            print("  " + v.line())
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(figures, indent=2, default=str))
        if c.violations or self.args.keep or self.args.state:
            print(f"state kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        return 1 if c.violations else 0


def _ts(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak.py", description=__doc__.split("\n\n")[0])
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--short", action="store_true", help="the CI preset: 60 tasks, 45 s of chaos")
    preset.add_argument("--long", action="store_true", help="300 tasks, 30 min of chaos")
    parser.add_argument("--tasks", type=int, help="tasks created at the start")
    parser.add_argument("--duration", type=float, help="seconds of chaos")
    parser.add_argument("--drain", type=float, help="seconds the daemon gets to settle afterwards (at most)")
    parser.add_argument("--max-concurrent", type=int, help="the daemon's max_concurrent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tick", default="200ms", help="the daemon's tick")
    parser.add_argument("--state", help="root directory for the run (kept); default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir even when all is well")
    parser.add_argument("--json", help="write the figures and violations to this file")
    parser.add_argument("--skip", default="", help=f"faults not to inject, comma-separated (of: {', '.join(FAULTS)}, "
                        "setsid_child: agents never leave a setsid grandchild)")
    args = parser.parse_args(argv)
    args.skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = args.skip - set(FAULTS) - {"setsid_child"}
    if unknown:
        parser.error(f"--skip: unknown faults {sorted(unknown)}")

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # SIGINT is ignored in background jobs of a shell: take both, so the clean-up always runs.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    base = PRESETS["long" if args.long else "short"]
    for key in ("tasks", "duration", "drain", "max_concurrent"):
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    try:
        return Soak(args).run()
    except KeyboardInterrupt as exc:
        print(f"soak: interrupted ({exc}); agents and daemon stopped", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
