#!/usr/bin/env python3
"""What a person's ``heartbeat done`` pays for the needs check on a big file store.

``done`` finds the upstream's downstreams by a scan of every baton (heartbeat/tasks/needs.py): on
a file store, in a fresh process, that parses them all. This builds a throw-away file store of
``--batons`` unrelated tasks plus ``up`` and its downstream ``down`` (no needs), and times
``python -m heartbeat done up`` as a subprocess, ``--runs`` times, each on a fresh store.
Run it once with this tree and once with an older one to compare::

    python scripts/bench_needs_done.py --batons 2000
    PYTHONPATH=/tmp/old python scripts/bench_needs_done.py --batons 2000 --label old

(``PYTHONPATH`` is passed to the timed subprocess only; the store is built with this tree.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batons", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="this tree")
    args = parser.parse_args()
    timed_path = os.environ.pop("PYTHONPATH", "")
    from heartbeat.store.files import FileStore
    from heartbeat.tasks import verbs

    times = []
    for _ in range(args.runs):
        root = tempfile.mkdtemp(prefix="hb-needs-bench-")
        try:
            state = os.path.join(root, "state")
            store = FileStore(state)
            for i in range(args.batons):
                verbs.new_task(store, f"t{i}", task="x", step="s")
            verbs.new_task(store, "up", task="x", step="s", intent="why")
            verbs.new_task(store, "down", task="x", step="s", after=["up"])
            store.close()
            env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
            env["HEARTBEAT_STATE_DIR"] = state
            if timed_path:
                env["PYTHONPATH"] = timed_path
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "heartbeat", "done", "up"], env=env, cwd=root,
                                  capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
        finally:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"{args.label}: {args.batons} batons, `heartbeat done` median {statistics.median(times) * 1000:.0f} ms "
          f"over {args.runs} runs (load average {load:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
