"""What competes with the daemon for its store and its clock: corrupt ledger rows, a second daemon,
a live migrate, held locks, clock steps."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from soak_checker import (  # (tests/support is put on sys.path by soak/__init__.py)
    ClockStep,
)

from soak.common import (
    LOCK_HOLDERS,
    MIGRATE_WITHIN,
    SECOND_DAEMON_WITHIN,
    STEP_WATCH,
    Pending,
)


class Rivals:
    """What competes with the daemon for its store and clock (a part of :class:`soak.run.Soak`, which holds the state)."""

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
        self.pending.append(Pending(what, "", proc, out, time.monotonic(), time.monotonic() + SECOND_DAEMON_WITHIN,
                                    {1}, holder))
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

