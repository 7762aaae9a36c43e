"""How long the status page and /metrics take on a big state dir.

    .venv/bin/python scripts/bench_web.py [TASKS] [EVENTS]     # default 2000 tasks, 200000 ledger events

Creates TASKS batons (a fifth blocked) and EVENTS ledger events (dispatched / exited /
stalled cycles, plus touches), serves them with the real server on a loopback port, and
prints the median of 5 requests for /metrics, /, one task page and /report.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta

from heartbeat.config.shape import Listen
from heartbeat.model.baton import Baton, Gate, GateKind, Meta
from heartbeat.model.ledger import Event
from heartbeat.model.timeparse import utcnow
from heartbeat.store import open_store
from heartbeat.tasks import verbs as tasks
from heartbeat.web.app import build_app
from heartbeat.web.guard import HostCheck
from heartbeat.web.server import start_in_thread


def main() -> int:
    n_tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    n_events = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    with tempfile.TemporaryDirectory(prefix="hb-bench-web-") as state:
        store = open_store(state)
        now = utcnow()
        for i in range(n_tasks):
            store.create(Baton(task=f"task {i}", step="work", meta=Meta(id=f"t{i}")), actor="bench")
            if i % 5 == 0:
                tasks.block(store, f"t{i}", on="a human", gate=Gate(GateKind.HUMAN))
        kinds = ("dispatched", "touched", "exited", "stalled")
        batch = [Event(task=f"t{i % n_tasks}", kind=kinds[i % 4], ts=now - timedelta(seconds=n_events - i),
                       actor="bench", data={"launcher": "agent", "kind": "failed", "why": "exited"})
                 for i in range(n_events)]
        for start in range(0, len(batch), 10_000):
            store.ledger.append(batch[start:start + 10_000])
        listen = Listen("127.0.0.1", 0)
        app = build_app(open_store(state), state_dir=state, token="bench", hosts=HostCheck(listen))
        server, thread, url = start_in_thread(app, listen, on_error=lambda message, _: print(message, file=sys.stderr))
        time.sleep(0.5)
        print(f"{n_tasks} tasks, {n_events} ledger events")
        for path in ("metrics", "", "tasks/t1", "report"):
            times = []
            for _ in range(5):
                started = time.perf_counter()
                request = urllib.request.Request(url + path, headers={"Authorization": "Bearer bench"})
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
                times.append(time.perf_counter() - started)
            print(f"GET /{path:<10} median {statistics.median(times) * 1000:8.1f} ms")
        server.should_exit = True
        thread.join(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
