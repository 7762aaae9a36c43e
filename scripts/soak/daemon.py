"""The daemon under test: its config, its process, its log, its SIGHUPs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

from soak.common import (
    DAEMON_ERRORS,
    FAULTS,
    LOCK_HOLDERS,
    NON_RETRYABLE,
    NOTIFIER,
    PLANT_EXCUSES,
    ROOT,
    STOP_WITHIN,
)


class DaemonControl:
    """The daemon under test (a part of :class:`soak.run.Soak`, which holds the state)."""

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

