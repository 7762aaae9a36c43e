#!/usr/bin/env python3
"""Measure the daemon against floors taken in the same run.

    .venv/bin/python scripts/bench_daemon.py [--quick]

1. Tick wall time over 1,000 and 10,000 batons — quiet (nothing changed), 1% changed,
   and cold (first tick, everything parsed) — against a bare ``os.stat`` loop and a bare
   read + ``tomllib.loads`` loop over the same files.
2. Reaction latency: a baton write (an unblock through the API) to the daemon's dispatch,
   p50 and p99, with a 1 s tick (so anything well under a second is the watcher's doing).
3. Idle CPU of a real daemon over a minute (1,000 batons, 1 s tick), % of one core.
4. Peak RSS of a real daemon at 10,000 batons.

Targets (issue #3): quiet tick <= 3x stat floor; cold tick <= 1.5x parse floor; reaction
p99 <= 250 ms; idle CPU <= 1%; RSS <= 100 MB. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from datetime import timedelta
from pathlib import Path

from heartbeat.baton import Baton, Gate, GateKind, Meta, Status, dump_baton
from heartbeat.config import parse_config
from heartbeat.daemon import Daemon
from heartbeat.logging import configure
from heartbeat.timeparse import utcnow


def make_batons(state: Path, count: int) -> list[str]:
    """A realistic quiet population: half done, 30% snoozed far ahead, 20% blocked on a human."""
    batons_dir = state / "batons"
    batons_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = utcnow()
    ids = []
    for i in range(count):
        task_id = f"task-{i:05d}"
        ids.append(task_id)
        meta = Meta(id=task_id, revision=3, epoch=1, dispatches=1, created_at=now, updated_at=now, touched_at=now)
        roll = i % 10
        if roll < 5:
            meta.status = Status.DONE
        elif roll < 8:
            meta.status = Status.SNOOZED
            meta.snooze_until = now + timedelta(days=30)
        else:
            meta.status = Status.BLOCKED
            meta.gate = Gate(GateKind.HUMAN)
        b = Baton(task=f"Task number {i}", step="Investigate the failing job", intent="Keep the nightly green.",
                  next_step="Patch the flaky test", blocked_on="review" if meta.status is Status.BLOCKED else "",
                  constraints=["Do not touch prod"], done=["Read the logs", "Reproduce"],
                  plan=["Read the logs", "Reproduce", "Investigate the failing job", "Patch the flaky test"],
                  workdir="/srv/agents/x", meta=meta)
        (batons_dir / f"{task_id}.toml").write_text(dump_baton(b))
    return ids


def config_for(state: Path, tick: str = "1s") -> str:
    return f"""
[daemon]
state_dir = {json.dumps(str(state))}
tick = "{tick}"
log_format = "json"
log_level = "warning"
max_concurrent = 10000
dispatches_per_minute = 10000
default_launcher = "agent"
[launchers.agent]
type = "null"
"""


def median_time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stat_floor(batons_dir: Path) -> None:
    for entry in os.scandir(batons_dir):
        entry.stat(follow_symlinks=False)


def parse_floor(batons_dir: Path) -> None:
    for entry in os.scandir(batons_dir):
        with open(entry.path, "rb") as handle:
            tomllib.loads(handle.read().decode())


def bench_ticks(count: int, repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        ids = make_batons(state, count)
        batons_dir = state / "batons"
        config = parse_config(config_for(state), path=str(Path(tmp) / "heartbeat.toml"))
        configure(fmt="json", level="warning", stream=open(os.devnull, "w"))  # noqa: SIM115
        parse = median_time(lambda: parse_floor(batons_dir), max(3, repeat // 2))
        stat = median_time(lambda: stat_floor(batons_dir), repeat)
        colds = []
        for _ in range(max(3, repeat // 2)):
            daemon = Daemon(config, dry_run=True)
            start = time.perf_counter()
            daemon.tick()
            colds.append(time.perf_counter() - start)
            daemon.store.close()
        daemon = Daemon(config, dry_run=True)
        daemon.tick()
        quiet = median_time(daemon.tick, repeat)
        rng = random.Random(1)
        changed_times = []
        for _ in range(repeat):
            for task_id in rng.sample(ids, max(1, count // 100)):
                path = batons_dir / f"{task_id}.toml"
                text = path.read_text()
                path.write_text(text.replace("Investigate the failing job", "Investigate the failing job!", 1)
                                if "job!" not in text else text.replace("job!", "job", 1))
            start = time.perf_counter()
            daemon.tick()
            changed_times.append(time.perf_counter() - start)
        daemon.store.close()
        return {"stat_floor": stat, "parse_floor": parse, "quiet": quiet,
                "changed_1pct": statistics.median(changed_times), "cold": statistics.median(colds)}


def start_daemon(root: Path, state: Path, tick: str) -> subprocess.Popen[bytes]:
    cfg = root / "heartbeat.toml"
    cfg.write_text(config_for(state, tick))
    os.chmod(cfg, 0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    env.pop("NOTIFY_SOCKET", None)
    log = open(root / "daemon.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(cfg), "run", "--dry-run"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc


def wait_for(predicate, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    raise TimeoutError


def bench_reaction(samples: int) -> dict[str, float]:
    from heartbeat import tasks
    from heartbeat.store.files import FileStore

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        make_batons(state, 1000)
        store = FileStore(str(state))
        for i in range(samples):
            tasks.new_task(store, f"gate-{i:03d}", task="react", step="wait", blocked_on="go")
        proc = start_daemon(root, state, "1s")
        try:
            time.sleep(3)  # let the first ticks settle the population
            latencies = []
            for i in range(samples):
                task_id = f"gate-{i:03d}"
                written = time.time()
                tasks.unblock(store, task_id, by="bench")
                event = wait_for(lambda tid=task_id: store.ledger.events(tid, kinds=["dispatched"]), timeout=10)
                latencies.append(event[0].ts.timestamp() - written)
                time.sleep(random.uniform(0.05, 0.15))  # spread the writes over the tick phase
            latencies.sort()
            return {"p50": latencies[len(latencies) // 2],
                    "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
                    "max": latencies[-1]}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            store.close()


def bench_idle_cpu(seconds: float) -> float:
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        make_batons(state, 1000)
        proc = start_daemon(root, state, "1s")
        try:
            p = psutil.Process(proc.pid)
            time.sleep(5)  # start-up and the cold first tick are not idle
            before = p.cpu_times()
            start = time.monotonic()
            time.sleep(seconds)
            after = p.cpu_times()
            used = (after.user - before.user) + (after.system - before.system)
            return 100.0 * used / (time.monotonic() - start)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def bench_rss(count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        make_batons(state, count)
        proc = start_daemon(root, state, "1s")
        try:
            time.sleep(8)  # several full ticks over every baton
            with open(f"/proc/{proc.pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
            return float("nan")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 10 s of idle CPU")
    args = parser.parse_args()
    repeat = 5 if args.quick else 15
    rows = []
    for count in (1000, 10000):
        r = bench_ticks(count, repeat)
        rows.append((f"quiet tick, {count:,} batons", r["quiet"], r["stat_floor"], "stat loop", 3.0))
        rows.append((f"1% changed tick, {count:,} batons", r["changed_1pct"], r["stat_floor"], "stat loop", None))
        rows.append((f"cold tick, {count:,} batons", r["cold"], r["parse_floor"], "read+tomllib loop", 1.5))
    print("| measurement | heartbeat | floor | floor is | ratio | target |")
    print("|---|---|---|---|---|---|")
    for name, value, floor, what, target in rows:
        ratio = value / floor
        verdict = "" if target is None else (f"<= {target}x " + ("met" if ratio <= target else "MISSED"))
        print(f"| {name} | {value * 1000:.1f} ms | {floor * 1000:.1f} ms | {what} | {ratio:.2f}x | {verdict} |")
    react = bench_reaction(40 if args.quick else 100)
    print(f"| write -> dispatch latency (1 s tick), p50 | {react['p50'] * 1000:.0f} ms | 1000 ms | tick | "
          f"{react['p50']:.2f}x | |")
    print(f"| write -> dispatch latency (1 s tick), p99 | {react['p99'] * 1000:.0f} ms | 1000 ms | tick | "
          f"{react['p99']:.2f}x | <= 250 ms {'met' if react['p99'] <= 0.25 else 'MISSED'} |")
    cpu = bench_idle_cpu(10 if args.quick else 60)
    print(f"| idle CPU, 1,000 batons, 1 s tick | {cpu:.2f}% of a core | | | | <= 1% "
          f"{'met' if cpu <= 1 else 'MISSED'} |")
    rss = bench_rss(10000)
    print(f"| peak RSS, 10,000 batons | {rss:.0f} MB | | | | <= 100 MB {'met' if rss <= 100 else 'MISSED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
