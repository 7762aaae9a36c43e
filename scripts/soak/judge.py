"""The judge: what the soak saw, checked against what must hold (beside
tests/support/soak_checker.py, which checks the ledger, the batons and the process samples), and the summary."""

from __future__ import annotations

import bisect
import itertools
import json
import os
import shutil
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from soak_checker import (  # (tests/support is put on sys.path by soak/__init__.py)
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

from soak.common import (
    FIRST_PASS,
    NOTIFIER,
    STARTUP_GRACE,
    STEP_WATCH,
    Pending,
    _first_timestamp,
    _ts,
    parse_seconds,
)


class Judge:
    """The judge (a part of :class:`soak.run.Soak`, which holds the state)."""

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

    def ledger_has(self, task: str, kind: str, since: float) -> bool:
        import sqlite3

        conn = sqlite3.connect(str(self.state / "ledger.sqlite3"), timeout=30)
        try:
            row = conn.execute("SELECT 1 FROM events WHERE task = ? AND kind = ? AND ts >= ? LIMIT 1",
                               (task, kind, since)).fetchone()
        finally:
            conn.close()
        return row is not None

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

    def judge(self, job: Pending, code: int | None, text: str, took: float) -> None:
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
        elif job.stuck_on_fifo:
            c.violate("daemon", job.task, f"`{job.what}` waited opening a planted FIFO (the kernel's "
                                          f"{job.stuck_on_fifo}) until the soak removed it; took {took:.1f}s, exit {code}")
        else:
            self.counts[f"cli {job.what.split()[0]} answered"] += 1

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

