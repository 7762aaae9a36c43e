#!/usr/bin/env python3
"""Measure the daemon against floors taken in the same run.

    .venv/bin/python scripts/bench_daemon.py [--quick]

1. Tick wall time over 1,000 and 10,000 batons — quiet (nothing changed), 1% changed,
   and cold (first tick, everything parsed) — against a bare ``os.stat`` loop and a bare
   read + ``tomllib.loads`` loop over the same files.
2. Reaction latency: a baton write (an unblock through the API) to the daemon's dispatch,
   p50 and p99, with a 1 s tick (so anything well under a second is the watcher's doing).
3. Idle CPU of a real daemon over a minute (1,000 and 10,000 batons, 1 s tick), % of one
   core, against the floor of a bare ``os.stat`` loop over the same files once a second.
4. Peak RSS of a real daemon at 10,000 batons, against the same daemon over no baton.
5. Agent exit -> successor start, p50 and p90: a real daemon (1 s tick, and the default 30 s
   tick) with an ``exec`` launcher; the agent records its start, moves its step, waits a
   random moment (so exits fall anywhere in the tick) and records its exit just before it
   ends; the successor's start minus that exit. Floors in the same run: the shim starting
   the agent (two interpreter starts), and supervisord restarting the same agent when
   ``supervisor`` is installed (``pip install supervisor``; skipped otherwise).

``--ci`` is the short run scripts/test makes after the tests (under a minute): the idle
costs in CPU time (not wall: CI's machine is shared) at 10,000 batons, each beside its floor.

Targets (issue #3): quiet tick <= 3x stat floor; cold tick <= 1.5x parse floor; reaction
p99 <= 250 ms; RSS <= 100 MB. Issue #13: idle CPU at 10,000 batons <= 1%; RSS at 10,000
batons <= 60 MB; exit -> successor p50 <= 150 ms whatever the tick. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import itertools
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

import psutil

from heartbeat.config.load import parse_config
from heartbeat.daemon import Daemon
from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Status, dump_baton
from heartbeat.model.timeparse import utcnow
from heartbeat.system.logging import configure


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


def config_for(state: Path, tick: str = "1s", launcher: str = 'type = "null"') -> str:
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
{launcher}
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


def start_daemon(root: Path, state: Path, tick: str, launcher: str = 'type = "null"',
                 dry_run: bool = True) -> subprocess.Popen[bytes]:
    cfg = root / "heartbeat.toml"
    cfg.write_text(config_for(state, tick, launcher))
    os.chmod(cfg, 0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    env.pop("NOTIFY_SOCKET", None)
    log = open(root / "daemon.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(cfg), "run",
                             *(["--dry-run"] if dry_run else [])],
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
    from heartbeat.store.files import FileStore
    from heartbeat.tasks import verbs as tasks

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


def cpu_percent(pid: int, seconds: float) -> float:
    """CPU time of ``pid`` (user + system) over ``seconds`` of wall time, as % of one core."""
    import psutil

    p = psutil.Process(pid)
    before = p.cpu_times()
    start = time.monotonic()
    time.sleep(seconds)
    after = p.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (time.monotonic() - start)


def wait_ticks(state: Path, ticks: int, timeout: float = 300.0) -> None:
    """Until the daemon's vitals (``daemon.json``) count ``ticks`` finished passes."""
    def done() -> bool:
        try:
            return int(json.loads((state / "daemon.json").read_text())["ticks"]) >= ticks
        except (OSError, ValueError, KeyError):
            return False

    wait_for(done, timeout=timeout)


def bench_idle_cpu(count: int, seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        make_batons(state, count)
        proc = start_daemon(root, state, "1s")
        try:
            wait_ticks(state, 3)  # start-up and the cold first tick are not idle
            time.sleep(1)
            return cpu_percent(proc.pid, seconds)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


_STAT_LOOP = """
import os, sys, time
while True:
    for entry in os.scandir(sys.argv[1]):
        entry.stat(follow_symlinks=False)
    time.sleep(1)
"""


def bench_stat_loop_cpu(count: int, seconds: float) -> float:
    """The idle floor of a daemon that polls: a bare os.stat loop over the batons once a second."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        make_batons(state, count)
        proc = subprocess.Popen([sys.executable, "-c", _STAT_LOOP, str(state / "batons")])
        try:
            time.sleep(2)
            return cpu_percent(proc.pid, seconds)
        finally:
            proc.kill()
            proc.wait()


def bench_rss(count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        make_batons(state, count)
        proc = start_daemon(root, state, "1s")
        try:
            wait_ticks(state, 5)  # several ticks over every baton
            with open(f"/proc/{proc.pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
            return float("nan")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


_AGENT = """
import os, random, sys, time
started = time.time()
out, task = sys.argv[1], os.environ.get("HEARTBEAT_TASK", "")
with open(out, "a") as handle:
    handle.write(f"start {task or '-'} {started}\\n")
if task:  # move the step, so the exit is a shift end and the successor is due at once
    from heartbeat.tasks import verbs as tasks
    from heartbeat.store import open_store
    store = open_store(os.environ["HEARTBEAT_STATE_DIR"])
    tasks.set_fields(store, task, {"step": f"step {os.environ['HEARTBEAT_EPOCH']}"},
                     epoch=int(os.environ["HEARTBEAT_EPOCH"]))
    store.close()
time.sleep(random.uniform(0.3, 1.3))  # an exit anywhere in the tick
with open(out, "a") as handle:
    handle.write(f"exit {task or '-'} {time.time()}\\n")
"""


_GAP_TIMEOUT = 20.0
"""Seconds without a new agent record after which the exit -> successor measurement gives up."""


def _gaps(out: Path, samples: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> list[float]:
    """Successor start minus predecessor exit, from the agent's records, until ``samples`` gaps
    (or ``timeout`` seconds without a new one: the gap is then counted as that long)."""
    gaps: list[float] = []
    last_change = time.monotonic()
    seen = 0
    while len(gaps) < samples:
        lines = out.read_text().split("\n") if out.exists() else []
        records = [line.split() for line in lines if len(line.split()) == 3]
        if len(records) != seen:
            seen, last_change = len(records), time.monotonic()
        elif time.monotonic() - last_change > timeout:
            gaps.append(timeout)
            break
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}")
        gaps = [float(b[2]) - float(a[2]) for a, b in itertools.pairwise(records)
                if a[0] == "exit" and b[0] == "start"]
        time.sleep(0.05)
    return gaps[:samples]


def _percentiles(gaps: list[float]) -> dict[str, float]:
    ordered = sorted(gaps)
    return {"p50": ordered[len(ordered) // 2], "p90": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))],
            "n": float(len(ordered))}


def bench_exit_to_successor(samples: int, tick: str) -> dict[str, float]:
    from heartbeat.store.files import FileStore
    from heartbeat.tasks import verbs as tasks

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        (root / "agent.py").write_text(_AGENT)
        out = root / "agent.out"
        store = FileStore(str(state))
        tasks.new_task(store, "relay", task="relay", step="step 0", workdir=str(root))
        store.close()
        launcher = (f'type = "exec"\ncommand = {json.dumps([sys.executable, str(root / "agent.py"), str(out)])}\n'
                    'stop_grace = "1s"')
        proc = start_daemon(root, state, tick, launcher, dry_run=False)
        try:
            return _percentiles(_gaps(out, samples, timeout=_GAP_TIMEOUT, proc=proc))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            _stop_last_agent(state)


def _stop_last_agent(state: Path) -> None:
    """The daemon leaves its agent running when it stops: end the last one's group (its shim's pid)."""
    from heartbeat.store.files import FileStore

    store = FileStore(str(state))
    try:
        owner = store.load("relay").meta.owner
    finally:
        store.close()
    if owner is not None and owner.pid:
        try:
            os.killpg(owner.pid, signal.SIGKILL)
        except OSError:
            pass


def bench_shim_floor(samples: int) -> dict[str, float]:
    """Two interpreter starts: the shim starting the agent, from the shim's exec to the agent's first line."""
    from heartbeat.launchers import shim

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "agent.py").write_text("import sys, time\nopen(sys.argv[1], 'a').write(f'{time.time()}\\n')\n")
        gaps = []
        for i in range(samples):
            out = root / f"{i}.out"
            started = time.time()
            subprocess.run([sys.executable, "-I", "-S", shim.__file__, str(root / f"{i}.exit"), "--",
                            sys.executable, str(root / "agent.py"), str(out)], check=True)
            gaps.append(float(out.read_text()) - started)
        return _percentiles(gaps)


def bench_supervisord(samples: int) -> dict[str, float] | None:
    """supervisord restarting the same agent (autorestart, startsecs=0); None when not installed."""
    import importlib.util

    if importlib.util.find_spec("supervisor") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "agent.py").write_text(_AGENT)
        out = root / "agent.out"
        conf = root / "supervisord.conf"
        conf.write_text(f"""[supervisord]
nodaemon=true
logfile={root}/supervisord.log
pidfile={root}/supervisord.pid
[unix_http_server]
file={root}/supervisor.sock
[program:agent]
command={sys.executable} {root}/agent.py {out}
autorestart=true
startsecs=0
startretries=1000
""")
        proc = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            return _percentiles(_gaps(out, samples, timeout=_GAP_TIMEOUT, proc=proc))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _sched_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` in nanoseconds' precision (``/proc/PID/task/*/schedstat``),
    where ``cpu_times`` counts in clock ticks (10 ms: ±0.07% of a core over 15 s); NaN off Linux."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return total / 1e9


def bench_ci(count: int, seconds: float) -> list[tuple[str, str, str]]:
    """CI's short run (``--ci``): the idle cost in CPU time, which a loaded machine does not
    inflate the way it does wall time, each beside a floor measured in the same run.

    In process: a quiet tick between sweeps (the watcher trusted, nothing changed) against one
    ``os.stat`` pass over the batons. A real daemon (1 s tick) over ``seconds``: its CPU against
    a bare ``os.stat`` loop once a second run beside it, and its peak RSS."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        state.mkdir(mode=0o700)
        make_batons(state, count)
        batons_dir = state / "batons"
        config = parse_config(config_for(state), path=str(root / "in-process.toml"))
        configure(fmt="json", level="warning", stream=open(os.devnull, "w"))  # noqa: SIM115
        daemon = Daemon(config, dry_run=True)
        daemon.loop.changes.watching()  # between sweeps, as a daemon whose watcher runs
        for _ in range(3):
            daemon.tick()
        ticks = 50
        start = time.process_time()
        for _ in range(ticks):
            daemon.tick()
        quiet = (time.process_time() - start) / ticks
        daemon.store.close()
        start = time.process_time()
        for _ in range(5):
            stat_floor(batons_dir)
        stat = (time.process_time() - start) / 5
        rows.append((f"quiet tick between sweeps, {count:,} batons (CPU, in process)", f"{quiet * 1000:.3f} ms",
                     f"{stat * 1000:.1f} ms: one os.stat pass"))
        proc = start_daemon(root, state, "1s")
        floor = subprocess.Popen([sys.executable, "-c", _STAT_LOOP, str(batons_dir)])
        try:
            # Start-up and the cold first pass are not idle: the first pass's vitals, then three more
            # ticks. (Waiting for daemon.json to count four took ~10 s more: a quiet daemon rewrites
            # it only every VITALS_SAVE_EVERY seconds.)
            wait_ticks(state, 1)
            time.sleep(3.5)
            daemon_p, floor_p = psutil.Process(proc.pid), psutil.Process(floor.pid)
            before, floor_before, started = _cpu_seconds(daemon_p), _cpu_seconds(floor_p), time.monotonic()
            sched_before = _sched_seconds(proc.pid)
            time.sleep(seconds)
            wall = time.monotonic() - started
            used, floor_used = _cpu_seconds(daemon_p) - before, _cpu_seconds(floor_p) - floor_before
            sched_used = _sched_seconds(proc.pid) - sched_before
            with open(f"/proc/{proc.pid}/status") as handle:
                hwm = next(int(line.split()[1]) / 1024 for line in handle if line.startswith("VmHWM:"))
        finally:
            floor.kill()
            floor.wait()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        rows.append((f"idle daemon, {count:,} batons, 1 s tick ({seconds:.0f} s)",
                     f"{100 * used / wall:.2f}% of a core ({1000 * used / wall:.1f} ms/s)",
                     f"{100 * floor_used / wall:.2f}%: os.stat loop once a second"))
        rows.append((f"idle daemon, the same {seconds:.0f} s, by its threads' schedstat (ns)",
                     f"{100 * sched_used / wall:.3f}% of a core ({1000 * sched_used / wall:.2f} ms/s)", ""))
        rows.append((f"peak RSS, {count:,} batons", f"{hwm:.1f} MB", ""))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 10 s of idle CPU")
    parser.add_argument("--ci", action="store_true",
                        help="CI's short run (under a minute): idle CPU time and RSS at 10,000 batons, with floors")
    parser.add_argument("--only", default="ticks,reaction,exit,cpu,rss",
                        help="comma-separated parts to run: ticks, reaction, exit, cpu, rss")
    args = parser.parse_args()
    if args.ci:
        print("| daemon bench (scripts/bench_daemon.py --ci) | heartbeat | floor, same run |")
        print("|---|---|---|")
        for row in bench_ci(10000, 10.0):  # (schedstat counts nanoseconds: 10 s is plenty)
            print(f"| {' | '.join(row)} |")
        return 0
    only = set(args.only.split(","))
    repeat = 5 if args.quick else 15
    print("| measurement | heartbeat | floor | floor is | ratio | target |")
    print("|---|---|---|---|---|---|")
    if "ticks" in only:
        rows = []
        for count in (1000, 10000):
            r = bench_ticks(count, repeat)
            rows.append((f"quiet tick, {count:,} batons", r["quiet"], r["stat_floor"], "stat loop", 3.0))
            rows.append((f"1% changed tick, {count:,} batons", r["changed_1pct"], r["stat_floor"], "stat loop", None))
            rows.append((f"cold tick, {count:,} batons", r["cold"], r["parse_floor"], "read+tomllib loop", 1.5))
        for name, value, floor, what, target in rows:
            ratio = value / floor
            verdict = "" if target is None else (f"<= {target}x " + ("met" if ratio <= target else "MISSED"))
            print(f"| {name} | {value * 1000:.1f} ms | {floor * 1000:.1f} ms | {what} | {ratio:.2f}x | {verdict} |")
    if "reaction" in only:
        react = bench_reaction(40 if args.quick else 100)
        print(f"| write -> dispatch latency (1 s tick), p50 | {react['p50'] * 1000:.0f} ms | 1000 ms | tick | "
              f"{react['p50']:.2f}x | |")
        print(f"| write -> dispatch latency (1 s tick), p99 | {react['p99'] * 1000:.0f} ms | 1000 ms | tick | "
              f"{react['p99']:.2f}x | <= 250 ms {'met' if react['p99'] <= 0.25 else 'MISSED'} |")
    if "exit" in only:
        samples = 10 if args.quick else 30
        floor = bench_shim_floor(samples)
        sup = bench_supervisord(samples)
        sup_text = f"supervisord p50 {sup['p50'] * 1000:.0f} ms" if sup else "supervisord: not installed"
        print(f"| shim -> agent first line (two interpreter starts), p50 | {floor['p50'] * 1000:.0f} ms | | "
              f"floor | | |")
        for tick in ("1s", "30s"):
            r = bench_exit_to_successor(samples, tick)
            for q in ("p50", "p90"):
                target = f"<= 150 ms {'met' if r['p50'] <= 0.15 else 'MISSED'}" if q == "p50" else ""
                shown = f"{r[q] * 1000:.0f} ms" if r[q] < _GAP_TIMEOUT else f"> {_GAP_TIMEOUT:.0f} s (timed out)"
                print(f"| agent exit -> successor start ({tick} tick, n={r['n']:.0f}), {q} | {shown} | "
                      f"{floor[q] * 1000:.0f} ms | two interpreter starts; {sup_text} | "
                      f"{r[q] / floor[q]:.2f}x | {target} |")
    if "cpu" in only:
        seconds = 10 if args.quick else 60
        for count in (1000, 10000):
            cpu = bench_idle_cpu(count, seconds)
            floor_cpu = bench_stat_loop_cpu(count, seconds)
            target = f"<= 1% {'met' if cpu <= 1 else 'MISSED'}" if count == 10000 else ""
            print(f"| idle CPU, {count:,} batons, 1 s tick | {cpu:.2f}% of a core | {floor_cpu:.2f}% | "
                  f"os.stat loop once a second | {cpu / floor_cpu:.2f}x | {target} |")
    if "rss" in only:
        rss = bench_rss(10000)
        empty = bench_rss(0)
        print(f"| peak RSS, 10,000 batons | {rss:.0f} MB | {empty:.0f} MB | the daemon over no baton | "
              f"{rss / empty:.2f}x | <= 60 MB {'met' if rss <= 60 else 'MISSED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
