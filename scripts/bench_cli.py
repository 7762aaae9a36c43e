#!/usr/bin/env python3
"""Measure what an agent pays to write its baton, against the floors it cannot go below.

In one run, on this machine, in a throw-away state dir:

* the CLI: an agent's ``heartbeat touch``, ``set`` and ``add`` (``HEARTBEAT_EPOCH`` and
  ``HEARTBEAT_TASK`` set, the task claimed: its touches are pulses, see
  ``heartbeat.hotpath.pulse``) and a touch by hand (no epoch: it writes the baton), as real
  subprocesses through the installed ``heartbeat`` script and through ``python -m
  heartbeat``, against the interpreter's own start-up (``python -c pass``) measured
  interleaved with them. A daemon (``heartbeat run --dry-run``) runs meanwhile, so an
  agent's set/add is relayed to it (``heartbeat.hotpath.relay``; the daemon's CPU for them is
  reported too); the ``no daemon`` rows are the same writes made in the agent's own
  process (``HEARTBEAT_RELAY=off``, what an agent does when no daemon runs);
* the Python API: ``open_task(...).update()`` in a loop, against a bare atomic write of
  the same bytes (temp file, write, fsync, rename, fsync of the directory).

Targets (issue 13): an agent's touch within 1.5x interpreter start, every other CLI write
within 2.5x, an API update within 2x a bare atomic write. Prints a markdown table;
``--json`` prints the figures instead.

    .venv/bin/python scripts/bench_cli.py [--runs 40] [--api-iterations 300]

It measures the install of the Python that runs it. An editable install (``pip install -e``)
adds its import finder to every interpreter start, floor included; for the figures an
installed system sees, run it from a regular install:

    python3 -m venv /tmp/hb && /tmp/hb/bin/pip install . && /tmp/hb/bin/python scripts/bench_cli.py

Python's bytecode cache is allowed for the subprocesses (``PYTHONDONTWRITEBYTECODE`` is
dropped from their environment), as on any installed system; ``--no-bytecode-cache``
measures the compile-every-time case instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
TASK = "bench"
CLI_TARGET = 2.5
TOUCH_TARGET = 1.5
API_TARGET = 2.0


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _summary(samples: Sequence[float], cpu: Sequence[float] = ()) -> dict[str, float]:
    summary = {"median_ms": statistics.median(samples) * 1000, "p90_ms": _percentile(samples, 0.9) * 1000,
               "n": float(len(samples))}
    if cpu:
        summary["cpu_median_ms"] = statistics.median(cpu) * 1000
    return summary


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _console_script() -> str:
    script = Path(sys.executable).parent / "heartbeat"
    if script.exists():
        return str(script)
    found = shutil.which("heartbeat")
    if not found:
        raise SystemExit("bench_cli: no `heartbeat` console script next to this python or on PATH")
    return found


STDLIB_FLOOR = "import tomllib, sqlite3, json, datetime"


RELAYED_SET = "heartbeat set (agent, relayed)"
RELAYED_SHOW = "heartbeat show (agent, relayed)"
RELAYED_BRIEF = "heartbeat brief (agent, relayed)"
TRAIL_HOOK = "heartbeat hook claude (PreToolUse: the trail's start line)"
_PRE_TOOL_USE = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash", "session_id": "bench",
                            "tool_input": {"command": "make test"}, "tool_use_id": "toolu_bench"}).encode()
TRAIL_END_HOOK = "heartbeat hook claude (PostToolUse: the trail's end line)"
_POST_TOOL_USE = json.dumps({"hook_event_name": "PostToolUse", "tool_name": "Bash", "session_id": "bench",
                             "tool_input": {"command": "make test"}, "tool_use_id": "toolu_bench",
                             "tool_response": {"stdout": "ok", "stderr": "", "interrupted": False}}).encode()
RELAYED_ADD = "heartbeat add (agent, relayed)"
RAIL_RELAYED = "heartbeat hook claude: an allowed PreToolUse (agent, relayed)"
RAIL_ALONE = "heartbeat hook claude: an allowed PreToolUse (agent, no daemon)"
RAIL_TARGET_MS = 30.0
"""Issue 25: what the rail may add to an allowed tool call, relayed (wall time of the hook's process)."""
AGENT_TOUCH = "heartbeat touch (agent)"
AGENT_TOUCH_M = "python -m heartbeat touch (agent)"


def _target(name: str) -> float:
    return TOUCH_TARGET if name in (AGENT_TOUCH, AGENT_TOUCH_M) else CLI_TARGET


def _install_kind() -> str:
    """``editable`` when heartbeat is imported from a ``pip install -e`` (its source tree), else ``regular``."""
    import heartbeat

    return "editable" if Path(heartbeat.__file__).resolve().parent.parent == ROOT else "regular"


def bench_cli(state_dir: str, runs: int, *, bytecode_cache: bool, epoch: int,
              daemon_pid: int) -> dict[str, dict[str, float]]:
    """Interleaved wall times of the floor and of each CLI write, ``runs`` of each, a daemon running
    (``daemon_pid``): an agent's set/add are relayed to it, or written by the agent (``no daemon``:
    ``HEARTBEAT_RELAY=off``, the same as no daemon running)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    env["HEARTBEAT_STATE_DIR"] = state_dir
    agent_env = {**env, "HEARTBEAT_EPOCH": str(epoch), "HEARTBEAT_TASK": TASK}
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    script = _console_script()
    py = sys.executable
    counter = iter(range(10**9))
    commands: dict[str, Callable[[], list[str]]] = {
        "python -c pass": lambda: [py, "-c", "pass"],
        STDLIB_FLOOR: lambda: [py, "-c", "import tomllib, sqlite3, json, datetime"],
        # In this order: the touch by hand rewrites the baton, the agent's set or add after it arms
        # the pulse again (as an agent's own writes do), and its touches come after those.
        "heartbeat touch (by hand: no epoch, writes the baton)": lambda: [script, "touch", TASK],
        "heartbeat set (agent, no daemon)": lambda: [script, "set", TASK, f"step=step {next(counter)}"],
        "heartbeat add (agent, no daemon)": lambda: [script, "add", TASK, "decisions", f"decision {next(counter)}"],
        RELAYED_SET: lambda: [script, "set", TASK, f"step=step {next(counter)}"],
        RELAYED_ADD: lambda: [script, "add", TASK, "decisions", f"decision {next(counter)}"],
        AGENT_TOUCH: lambda: [script, "touch", TASK],
        AGENT_TOUCH_M: lambda: [py, "-m", "heartbeat", "touch", TASK],
        "python -m heartbeat set (agent, relayed)": lambda: [py, "-m", "heartbeat", "set", TASK,
                                                             f"step=step {next(counter)}"],
        # issue 25: an agent's reads, relayed and in its own process, and the hook it fires per tool call
        "heartbeat show (agent, no daemon)": lambda: [script, "show", TASK],
        RELAYED_SHOW: lambda: [script, "show", TASK],
        "heartbeat brief (agent, no daemon)": lambda: [script, "brief", TASK],
        RELAYED_BRIEF: lambda: [script, "brief", TASK],
        TRAIL_HOOK: lambda: [script, "hook", "claude"],
        TRAIL_END_HOOK: lambda: [script, "hook", "claude"],
        RAIL_RELAYED: lambda: [script, "hook", "claude"],
        RAIL_ALONE: lambda: [script, "hook", "claude"],
    }
    event = json.dumps({"session_id": "bench", "cwd": os.path.join(state_dir, "work"), "hook_event_name": "PreToolUse",
                        "tool_name": "Write", "tool_input": {"file_path": os.path.join(state_dir, "work", "out.txt"),
                                                             "content": "x"}}).encode()
    stdin = {RAIL_RELAYED: event, RAIL_ALONE: event, TRAIL_HOOK: _PRE_TOOL_USE, TRAIL_END_HOOK: _POST_TOOL_USE}
    alone_env = {**agent_env, "HEARTBEAT_RELAY": "off"}  # the daemon runs, but this write is the agent's own
    envs = {name: env if "by hand" in name or name in ("python -c pass", STDLIB_FLOOR)
            else alone_env if "no daemon" in name else agent_env for name in commands}
    samples: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    daemon_cpu = {RELAYED_SET: 0.0, RELAYED_ADD: 0.0, RELAYED_SHOW: 0.0, RELAYED_BRIEF: 0.0, RAIL_RELAYED: 0.0}
    warmup = 3
    for i in range(runs + warmup):
        for name, argv in commands.items():
            args = argv()
            cpu_start = _children_cpu()
            served_start = _process_cpu(daemon_pid)
            start = time.perf_counter()
            proc = subprocess.run(args, env=envs[name], input=stdin.get(name, b""), capture_output=True, cwd=state_dir)
            elapsed = time.perf_counter() - start
            if name in (RAIL_RELAYED, RAIL_ALONE) and (proc.stdout or proc.stderr):
                raise SystemExit(f"bench_cli: the rail did not allow the call: {proc.stdout!r} {proc.stderr!r}")
            if proc.returncode != 0:
                raise SystemExit(f"bench_cli: {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()}")
            if i >= warmup:
                samples[name].append(elapsed)
                cpu[name].append(_children_cpu() - cpu_start)
                if name in daemon_cpu:
                    daemon_cpu[name] += _process_cpu(daemon_pid) - served_start
    figures = {name: _summary(values, cpu[name]) for name, values in samples.items()}
    for name, total in daemon_cpu.items():  # (the daemon's ticks are in it too: at a 1 s tick, next to nothing)
        figures[name]["daemon_cpu_ms"] = total / runs * 1000
    return figures


def _process_cpu(pid: int) -> float:
    """User + system seconds of a running process, from ``/proc/<pid>/stat`` (clock ticks)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_daemon(base: str, state_dir: str) -> subprocess.Popen[bytes]:
    """``heartbeat run --dry-run`` on the bench's state dir, once its relay socket is there."""
    config = os.path.join(base, "heartbeat.toml")
    Path(config).write_text(f'[daemon]\nstate_dir = {json.dumps(state_dir)}\ntick = "1s"\nstall_after = "1h"\n'
                            'log_level = "warning"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", config, "run", "--dry-run"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(base, "daemon.log"), "wb"))  # noqa: SIM115
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(state_dir, "daemon.sock")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench_cli: the daemon did not start its relay (see {base}/daemon.log)")
        time.sleep(0.05)
    return proc


def _bare_atomic_write(directory: str, path: str, data: bytes) -> None:
    tmp = os.path.join(directory, f".bare.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def bench_api(state_dir: str, iterations: int) -> dict[str, dict[str, float]]:
    """In-process: ``Task.update()`` changing the step, interleaved with a bare atomic write of its bytes."""
    from heartbeat import open_task

    task = open_task(TASK, state_dir=state_dir, epoch=None)
    bare_dir = os.path.join(state_dir, "bare")
    os.makedirs(bare_dir, mode=0o700, exist_ok=True)
    bare_path = os.path.join(bare_dir, "bare.toml")
    data = Path(state_dir, "batons", f"{TASK}.toml").read_bytes()
    update: list[float] = []
    bare: list[float] = []
    for i in range(iterations + 5):
        start = time.perf_counter()
        with task.update() as baton:
            baton.step = f"api step {i}"
        mid = time.perf_counter()
        _bare_atomic_write(bare_dir, bare_path, data)
        end = time.perf_counter()
        if i >= 5:
            update.append(mid - start)
            bare.append(end - mid)
    task.store.close()
    return {"api update()": _summary(update), "bare atomic write": _summary(bare)}


def _setup(state_dir: str) -> int:
    """The benchmark's task, claimed for this process (so that its agent's touches are pulses); its epoch."""
    from heartbeat.model.baton import Owner
    from heartbeat.store.files import FileStore
    from heartbeat.tasks import verbs as tasks

    workdir = os.path.join(state_dir, "work")
    os.makedirs(workdir, exist_ok=True)
    for name in ("src.py", "notes.md"):
        Path(workdir, name).write_text(f"# {name}\n" * 200)
    store = FileStore(state_dir)
    try:
        tasks.new_task(
            store, TASK, task="Benchmark the baton write path", step="step 0",
            intent="Know what an agent pays per write", workdir=workdir, key_files=["src.py", "notes.md"],
            constraints=["Do not touch production"], plan=["measure", "optimize", "report"],
        )
        os.makedirs(os.path.join(state_dir, "logs", TASK), mode=0o700, exist_ok=True)  # (the trail's home)
        return tasks.claim(store, TASK, Owner(pid=os.getpid(), how="claim")).meta.epoch
    finally:
        store.close()


def _table(cli: dict[str, dict[str, float]], api: dict[str, dict[str, float]]) -> str:
    floor = cli["python -c pass"]["median_ms"]
    bare = api["bare atomic write"]["median_ms"]
    floor_cpu = cli["python -c pass"]["cpu_median_ms"]
    lines = ["| measurement | median | p90 | ratio | target | CPU median | CPU ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, fig in cli.items():
        cpu = f"{fig['cpu_median_ms']:.1f} ms | {fig['cpu_median_ms'] / floor_cpu:.2f}x"
        if name == "python -c pass":
            lines.append(f"| `{name}` (floor) | {fig['median_ms']:.1f} ms | {fig['p90_ms']:.1f} ms | 1.00x | | {cpu} |")
            continue
        if name == STDLIB_FLOOR:
            lines.append(f"| `python -c \"{name}\"` (what reading TOML and writing the ledger must import) "
                         f"| {fig['median_ms']:.1f} ms | {fig['p90_ms']:.1f} ms "
                         f"| {fig['median_ms'] / floor:.2f}x | | {cpu} |")
            continue
        ratio, target = fig["median_ms"] / floor, _target(name)
        lines.append(f"| `{name}` | {fig['median_ms']:.1f} ms | {fig['p90_ms']:.1f} ms | {ratio:.2f}x "
                     f"| {'ok' if ratio <= target else 'MISSED'} <= {target}x | {cpu} |")
    fig = api["bare atomic write"]
    lines.append(f"| bare write+fsync+rename+dir fsync (floor) | {fig['median_ms']:.2f} ms | {fig['p90_ms']:.2f} ms "
                 "| 1.00x | | | |")
    fig = api["api update()"]
    ratio = fig["median_ms"] / bare
    lines.append(f"| `Task.update()` | {fig['median_ms']:.2f} ms | {fig['p90_ms']:.2f} ms | {ratio:.2f}x "
                 f"| {'ok' if ratio <= API_TARGET else 'MISSED'} <= {API_TARGET}x | | |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=40, help="subprocess runs per CLI command (default 40)")
    parser.add_argument("--api-iterations", type=int, default=300, help="API updates (default 300)")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="compile heartbeat on every CLI run")
    parser.add_argument("--dir", help="where to make the throw-away state dir (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    base = tempfile.mkdtemp(prefix="heartbeat-bench-", dir=args.dir)
    try:
        state_dir = os.path.join(base, "state")
        os.mkdir(state_dir, 0o700)
        epoch = _setup(state_dir)
        daemon = start_daemon(base, state_dir)
        try:
            cli = bench_cli(state_dir, args.runs, bytecode_cache=not args.no_bytecode_cache, epoch=epoch,
                            daemon_pid=daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
        api = bench_api(state_dir, args.api_iterations)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result: dict[str, Any] = {"cli": cli, "api": api, "python": sys.version.split()[0],
                              "bytecode_cache": not args.no_bytecode_cache, "install": _install_kind()}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"heartbeat write path, {args.runs} runs per CLI command, {args.api_iterations} API updates "
          f"(Python {result['python']}, {result['install']} install, "
          f"bytecode cache {'on' if result['bytecode_cache'] else 'off'})\n")
    print(_table(cli, api))
    for name in (RELAYED_SET, RELAYED_ADD, RELAYED_SHOW, RELAYED_BRIEF):
        fig = cli[name]
        print(f"\n`{name}`: the daemon spent {fig['daemon_cpu_ms']:.1f} ms of CPU per call "
              f"(the agent's process {fig['cpu_median_ms']:.1f} ms): {fig['daemon_cpu_ms'] + fig['cpu_median_ms']:.1f} ms "
              f"in all, against {cli[name.replace('relayed', 'no daemon')]['cpu_median_ms']:.1f} ms written by the agent.")
    fig = cli[RAIL_RELAYED]
    print(f"\n`{RAIL_RELAYED}`: {fig['median_ms']:.1f} ms median "
          f"({'ok' if fig['median_ms'] <= RAIL_TARGET_MS else 'MISSED'} <= {RAIL_TARGET_MS:.0f} ms), "
          f"{fig['median_ms'] - cli['python -c pass']['median_ms']:.1f} ms over the interpreter's start; the daemon "
          f"spent {fig['daemon_cpu_ms']:.1f} ms of CPU per call; without a daemon {cli[RAIL_ALONE]['median_ms']:.1f} ms.")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs: wall-time ratios "
          "are only meaningful on an idle machine; the CPU ratios hold up better under load.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
