"""One soak run: its directory and state, the samplers, the chaos loop, the drain; and ``main``."""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from soak_checker import (  # (tests/support is put on sys.path by soak/__init__.py)
    Checker,
    ClockStep,
    TickWatch,
)

import soak
from soak.common import (
    FAULTS,
    PRESETS,
    RETRY_SOON,
    STEP_HOURS,
    TEST_CLOCK_ENV,
    Pending,
    Plant,
    clean_env,
)
from soak.daemon import DaemonControl
from soak.faults import Faults
from soak.judge import Judge
from soak.plants import Plants
from soak.rivals import Rivals
from soak.tasks import Workload

__all__ = ["PRESETS", "Soak", "main"]


class Soak(DaemonControl, Workload, Faults, Plants, Rivals, Judge):
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

    def note(self, text: str) -> None:
        """One line in ``<root>/faults.log`` (wall time, what): to line violations up with what caused them."""
        with open(self.root / "faults.log", "a") as handle:
            handle.write(f"{time.time():.3f} {text}\n")

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



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak.py", description=(soak.__doc__ or "").split("\n\n")[0])
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
