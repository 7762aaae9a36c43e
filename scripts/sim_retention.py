"""A simulated long run of heartbeat, sped up by setting times: how much disk it takes with
and without ``[retention]``.

Each day of the run, new tasks start; each task lives a few days through many epochs: the
daemon dispatches an agent (a ``dispatched`` write, then the epoch's log, brief, pid and exit
files under ``logs/<id>/``), the agent touches its baton every couple of minutes and moves
along its plan (sometimes redoing or skipping a step, blocking, stalling, spinning), and
exits; most tasks end done, some failed, a few stay active. Every baton write and ledger event
carries an explicit timestamp (the store's ``now=``), and the log files get their mtimes
set. At the end of each simulated day, gc runs exactly as the daemon's daily job does, with
that day as ``now``. The state dir's disk use (allocated blocks, as ``du``) is sampled daily.

    .venv/bin/python scripts/sim_retention.py                    # with retention (the defaults)
    .venv/bin/python scripts/sim_retention.py --no-gc            # the same run, nothing removed
    .venv/bin/python scripts/sim_retention.py --days 90 --tasks-per-day 25 --log-kb 8 --bound-mb 128

It exits 1 when the final disk use is above ``--bound-mb`` (with gc). ``os.fsync`` is made a
no-op for the run: durability is not what is measured, and it would take hours otherwise.
The script also checks that ``heartbeat report``'s totals are the same before and after
every gc (``--check-report``, slower).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from heartbeat.config.shape import RetentionConfig
from heartbeat.model.baton import Baton, Owner, Status
from heartbeat.model.ledger import Event
from heartbeat.store.files import FileStore

START = datetime(2026, 1, 1, tzinfo=UTC)


def disk_bytes(root: str) -> int:
    """Allocated bytes under ``root`` (what ``du -s --block-size=1`` says)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_blocks * 512
    return total


def _epoch_files(store: FileStore, task: str, epoch: int, at: datetime, log_bytes: int, rng: random.Random) -> None:
    directory = Path(store.logs_dir) / task
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{at.isoformat()} agent output for {task} epoch {epoch}: working on it\n".encode()
    body = line * max(1, log_bytes // len(line))
    files = {
        f"{epoch}.log": body,
        f"{epoch}.brief.md": f"# {task}\n\nstep s{epoch}\n".encode() * 20,
        f"{epoch}.pid": json.dumps({"pid": 10000 + epoch, "create_time": at.timestamp()}).encode(),
        f"{epoch}.exit": json.dumps({"code": rng.choice([0, 0, 0, 1]), "signal": None}).encode(),
    }
    stamp = at.timestamp()
    for name, data in files.items():
        path = directory / name
        path.write_bytes(data)
        os.chmod(path, 0o600)
        os.utime(path, (stamp, stamp))


def write_history(store: FileStore, task: str, start: datetime, rng: random.Random, *, epochs: int,
                  touches: int, log_bytes: int = 0, finish: str = "done") -> datetime:
    """A task's whole life with explicit times, through the real store: returns when it ended.

    Every report metric gets exercised: resumes (clean and not), redone and skipped steps,
    blocks lifted by a human and bypassed, stalls, spinning, escalations, stale and fresh
    verifies, idle resumes, touches, and a finish (``done``, ``failed`` or ``active``).
    """
    plan = [f"s{i}" for i in range(8)]
    t = start
    baton = Baton(task=f"simulated task {task}", step=plan[0], plan=list(plan))
    baton.meta.id = task
    store.create(baton, actor="cli", now=t)
    pos = 0
    for epoch_n in range(epochs):
        t += timedelta(minutes=rng.randint(2, 90))
        blocked = store.load(task).meta.status is Status.BLOCKED
        with store.edit(task, actor="daemon", now=t) as ed:
            meta = ed.baton.meta
            meta.epoch += 1
            meta.status = Status.ACTIVE  # a dispatch while blocked: the report counts a bypass
            meta.owner = Owner(pid=10000 + meta.epoch, how="dispatch", launcher="agent", started_at=t)
            ed.event("dispatched", reason="bypass" if blocked else "due", launcher="agent")
        epoch = store.load(task).meta.epoch
        if log_bytes:
            _epoch_files(store, task, epoch, t, log_bytes, rng)
        if epoch_n and rng.random() < 0.5:
            t += timedelta(seconds=30)
            result = rng.choice(["fresh", "fresh", "stale"])
            store.record([Event(task=task, kind="verified", ts=t, epoch=epoch, actor="agent",
                                data={"result": result, "changed": ["src/x.py"] if result == "stale" else []})])
        for _ in range(touches):
            t += timedelta(minutes=2, seconds=rng.randint(0, 59))
            with store.edit(task, epoch=epoch, actor="agent", touch=True, now=t):
                pass
        roll = rng.random()
        t += timedelta(minutes=rng.randint(1, 20))
        if roll < 0.55 and pos < len(plan) - 1:
            with store.edit(task, epoch=epoch, actor="agent", now=t) as ed:
                ed.baton.done.append(plan[pos])
                pos += 1
                ed.baton.step = plan[pos]
        elif roll < 0.62 and pos > 0:
            with store.edit(task, epoch=epoch, actor="agent", now=t) as ed:
                ed.baton.step = plan[pos - 1]  # redone
        elif roll < 0.68 and pos < len(plan) - 2:
            with store.edit(task, epoch=epoch, actor="agent", now=t) as ed:
                pos += 2
                ed.baton.step = plan[pos]  # skipped one
        elif roll < 0.74:
            with store.edit(task, epoch=epoch, actor="agent", now=t) as ed:
                ed.baton.extra["notes"] = f"epoch {epoch}"
        for _ in range(touches // 2):
            t += timedelta(minutes=2, seconds=rng.randint(0, 59))
            with store.edit(task, epoch=epoch, actor="agent", touch=True, now=t):
                pass
        roll = rng.random()
        t += timedelta(minutes=rng.randint(1, 30))
        if roll < 0.1:
            store.record([Event(task=task, kind="spinning", ts=t, epoch=epoch, actor="daemon",
                                data={"step": plan[pos], "since": start.isoformat()})])
        elif roll < 0.15:
            store.record([Event(task=task, kind="escalated", ts=t, epoch=epoch, actor="daemon",
                                data={"reason": "max_attempts"})])
        elif roll < 0.3:
            store.record([Event(task=task, kind="stalled", ts=t, epoch=epoch, actor="daemon",
                                data={"reason": "no write for 10m"})])
        with store.edit(task, actor="daemon", now=t) as ed:
            ed.baton.meta.owner = None
            ed.event("exited", code=rng.choice([0, 0, 1]), signal=None, pid=10000 + epoch)
        if rng.random() < 0.15 and epoch_n < epochs - 1:
            t += timedelta(minutes=5)
            with store.edit(task, actor="agent", now=t) as ed:
                ed.baton.meta.status = Status.BLOCKED
                ed.baton.blocked_on = "a human decision"
                ed.event("blocked", on="a human decision", gate="human")
            if rng.random() < 0.6:
                t += timedelta(hours=rng.randint(1, 12))
                with store.edit(task, actor="alice", now=t) as ed:
                    ed.baton.meta.status = Status.ACTIVE
                    ed.baton.blocked_on = ""
                    ed.event("unblocked", by="alice", note="", was_on="a human decision", gate="human",
                             gate_opened="")
    t += timedelta(minutes=10)
    if finish in ("done", "failed"):
        if store.load(task).meta.status is Status.BLOCKED:
            with store.edit(task, actor="alice", now=t) as ed:
                ed.baton.meta.status = Status.ACTIVE
                ed.baton.blocked_on = ""
                ed.event("unblocked", by="alice", note="", was_on="x", gate="human", gate_opened="")
        with store.edit(task, actor="cli", now=t) as ed:
            if finish == "done":
                ed.baton.meta.status = Status.DONE
                ed.event("done", note="finished")
            else:
                ed.baton.meta.status = Status.FAILED
                ed.baton.meta.last_failure = "gave up"
                ed.event("failed", reason="gave up")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--tasks-per-day", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=10, help="mean epochs per task (uniform in [e/2, 3e/2])")
    parser.add_argument("--touches", type=int, default=6, help="touch rows per epoch (times 1.5)")
    parser.add_argument("--log-kb", type=int, default=16, help="KiB of log per epoch")
    parser.add_argument("--no-gc", action="store_true", help="never run gc: the disk use without retention")
    parser.add_argument("--bound-mb", type=float, default=128.0, help="exit 1 when the final disk use is above")
    parser.add_argument("--check-report", action="store_true", help="compare report totals around every gc")
    parser.add_argument("--state-dir", help="keep the state here (default: a temp dir, removed)")
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args(argv)

    os.fsync = lambda fd: None  # durability is not what this measures
    rng = random.Random(args.seed)
    # tmpfs when there is one: renames on a disk cost milliseconds each, and there are ~100 per task.
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = args.state_dir or tempfile.mkdtemp(prefix="heartbeat-sim-", dir=scratch)
    store = FileStore(root)
    store.ledger._connect().execute("PRAGMA synchronous=OFF")  # type: ignore[attr-defined]  # as os.fsync
    retention = RetentionConfig()
    from heartbeat.ops.retention import run_gc
    from heartbeat.reports.report import build_report

    began = time.monotonic()
    tasks = 0
    peak = 0
    archived = folded = removed = 0
    for day in range(args.days):
        day_start = START + timedelta(days=day)
        for n in range(args.tasks_per_day):
            task = f"d{day:03d}-{n:03d}"
            epochs = rng.randint(max(1, args.epochs // 2), args.epochs * 3 // 2)
            finish = rng.choices(["done", "failed", "active"], weights=[85, 10, 5])[0]
            write_history(store, task, day_start + timedelta(minutes=rng.randint(0, 600)), rng, epochs=epochs,
                          touches=args.touches, log_bytes=args.log_kb * 1024, finish=finish)
            tasks += 1
        now = day_start + timedelta(days=1)
        if not args.no_gc:
            before = build_report(store, now=now).to_json() if args.check_report else None
            result = run_gc(store, retention, now=now)
            archived += len(result.archived)
            folded += sum(result.folded.values())
            removed += len(result.removed_files)
            if before is not None:
                after = build_report(store, now=now).to_json()
                if after != before:
                    print(f"day {day}: the report changed across gc", file=sys.stderr)
                    return 2
        used = disk_bytes(root)
        peak = max(peak, used)
        if day % 10 == 9 or day == args.days - 1:
            print(f"day {day + 1:3d}: {tasks} tasks, disk {used / 2**20:7.1f} MiB (peak {peak / 2**20:.1f}), "
                  f"ledger rows {store.ledger.count()}, {time.monotonic() - began:.0f}s", flush=True)
    final = disk_bytes(root)
    summary: dict[str, Any] = {
        "days": args.days, "tasks": tasks, "gc": not args.no_gc, "final_mib": round(final / 2**20, 1),
        "peak_mib": round(peak / 2**20, 1), "ledger_rows": store.ledger.count(), "archived": archived,
        "folded_rows": folded, "removed_files": removed, "bound_mib": args.bound_mb,
    }
    print(json.dumps(summary))
    store.close()
    if not args.state_dir:
        import shutil

        shutil.rmtree(root)
    if not args.no_gc and peak > args.bound_mb * 2**20:
        print(f"over the bound: peak {peak / 2**20:.1f} MiB > {args.bound_mb} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
