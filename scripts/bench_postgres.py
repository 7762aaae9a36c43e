#!/usr/bin/env python3
"""Measure the PostgreSQL store against bare SQL taken in the same run.

    .venv/bin/python scripts/bench_postgres.py [--tasks 10000] [--url postgresql://...]

Without ``--url`` it starts a throwaway cluster (tests/support/pg.py: initdb in a temp dir, a Unix
socket only) and removes it at the end. With 10,000 batons (half done, 30% snoozed, 20%
blocked, as scripts/bench_daemon.py):

1. A scan as the daemon's tick does it (``store.scan()``): cold (every row parsed) and
   quiet (nothing changed), against a bare ``SELECT id, body`` of the same rows and a bare
   ``SELECT id, revision`` (what a quiet scan must read at least).
2. A daemon tick (``Daemon.tick``, dry run) over the same store, cold and quiet (with leases:
   the takeover query and the supervised set are part of every tick on this store).
3. One write's latency (``store.edit``: lock, parse, bookkeeping, CAS ``UPDATE``, event,
   NOTIFY, commit), p50 and p99, against a bare autocommit ``UPDATE`` of the same row.
4. Leases (the tick above already runs with them: a takeover query and the supervised set):
   the dispatch latency of a due task (``Daemon.evaluate``: load, decide, the claim with
   ``FOR UPDATE SKIP LOCKED``, the two-phase dispatch write, the brief; the null launcher),
   p50 and p99, against a bare ``SELECT id, body`` of the same row; the claim alone against
   the same ``SELECT ... FOR UPDATE SKIP LOCKED`` and ``UPDATE`` run bare; one renewal of
   the leases of ``--dispatches`` supervised tasks (one statement) against a bare ``UPDATE``
   of the same rows.

The throwaway cluster runs with ``fsync=off`` (as the tests' does): the figures are the
store's CPU and round trips, not a disk's flush. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Status, dump_baton  # noqa: E402
from heartbeat.model.timeparse import utcnow  # noqa: E402
from heartbeat.store.postgres.schema import upgrade  # noqa: E402
from heartbeat.store.postgres.store import PostgresStore  # noqa: E402


def fill(url: str, count: int) -> None:
    now = utcnow()
    rows = []
    for i in range(count):
        task_id = f"task-{i:05d}"
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
                  blocked_on="approval" if meta.status is Status.BLOCKED else "", done=["Read the logs"],
                  constraints=["Never force-push"], workdir="/tmp", meta=meta)
        rows.append((task_id, dump_baton(b), meta.status.value, 3, 1))
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO heartbeat_batons (id, body, status, revision, epoch) VALUES (%s, %s, %s, %s, %s)",
                        rows)


def bench_leases(url: str, bare: psycopg.Connection[Any], count: int) -> list[tuple[str, str, str]]:
    """Dispatch latency, claim and renewal on the filled database (section 4 of the docstring)."""
    from heartbeat.config.load import parse_config
    from heartbeat.daemon import Daemon

    store = PostgresStore(url)
    due = [f"due-{i:05d}" for i in range(count)]
    spare = [f"spare-{i:05d}" for i in range(count)]
    out: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as state:
        config = parse_config(f'[daemon]\nstate_dir = "{state}"\nhost = "bench"\nmax_concurrent = 1000000\n'
                              'dispatches_per_minute = 1000000\n\n[launchers.agent]\ntype = "null"\n')
        daemon = Daemon(config, store=PostgresStore(url), dry_run=True)
        daemon.initialize()
        daemon.tick()
        assert daemon.lease is not None
        for task_id in due + spare:  # due now: each is dispatched by its own evaluate below, not by a tick
            store.create(Baton(task=f"due {task_id}", step="start", intent="bench", workdir="/tmp",
                               meta=Meta(id=task_id)))
        dispatch = [timed(lambda t=t: daemon.evaluate(t), 1)[0] for t in due]  # type: ignore[misc]
        assert all(store.load(t).meta.epoch == 1 for t in due), "every due task was dispatched"

        def select_row(task_id: str) -> None:
            bare.execute("SELECT id, body FROM heartbeat_batons WHERE id = %s", (task_id,)).fetchall()

        selects = [timed(lambda t=t: select_row(t), 1)[0] for t in due]  # type: ignore[misc]
        out.append((f"dispatch of a due task (evaluate: claim + 2-phase write + brief), p50 / p99, n={count}",
                    f"{p(dispatch, 0.5):.2f} / {p(dispatch, 0.99):.2f} ms",
                    f"SELECT id, body of the same row: {p(selects, 0.5):.2f} / {p(selects, 0.99):.2f} ms"))
        lease = daemon.lease.lease  # the primitives under the daemon's lease part
        claims = [timed(lambda t=t: lease.claim([t]), 1)[0] for t in spare]  # type: ignore[misc]

        def bare_claim(task_id: str) -> None:
            with bare.transaction():
                bare.execute("SELECT id FROM heartbeat_batons WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED LIMIT 1",
                             ([task_id],)).fetchall()
                bare.execute("UPDATE heartbeat_batons SET lease_expires = now() + interval '30 seconds' "
                             "WHERE id = %s", (task_id,))

        bare_claims = [timed(lambda t=t: bare_claim(t), 1)[0] for t in spare]  # type: ignore[misc]
        out.append(("claim one task (FOR UPDATE SKIP LOCKED + lease), p50 / p99",
                    f"{p(claims, 0.5):.2f} / {p(claims, 0.99):.2f} ms",
                    f"the same SELECT and UPDATE bare: {p(bare_claims, 0.5):.2f} / {p(bare_claims, 0.99):.2f} ms"))
        lease.observe(daemon.store.scan())  # the supervised set: every task dispatched above
        assert lease.running() == count, lease.running()
        renews = timed(lease.renew, 50)
        ids = list(due)

        def bare_renew() -> None:
            bare.execute("UPDATE heartbeat_batons SET lease_expires = now() + interval '30 seconds' "
                         "WHERE id = ANY(%s)", (ids,))

        bare_renews = timed(bare_renew, 50)
        out.append((f"renew {count} leases + the host row (one statement), p50 / p99",
                    f"{p(renews, 0.5):.2f} / {p(renews, 0.99):.2f} ms",
                    f"bare UPDATE of the same rows: {p(bare_renews, 0.5):.2f} / {p(bare_renews, 0.99):.2f} ms"))
        daemon.shared.pool.shutdown(wait=True)
        daemon.store.close()
    store.close()
    return out


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--url", help="an empty database to use (default: a throwaway cluster)")
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--dispatches", type=int, default=200, help="due tasks dispatched for the dispatch latency")
    args = ap.parse_args()
    cluster = None
    url = args.url
    if url is None:
        from tests.support.pg import start_cluster

        cluster = start_cluster()
        url = cluster.create_db("bench")
    try:
        upgrade(url)
        fill(url, args.tasks)
        store = PostgresStore(url)
        bare = psycopg.connect(url, autocommit=True)
        bare.execute("VACUUM ANALYZE heartbeat_batons")
        rows: list[tuple[str, str, str]] = []

        def select_bodies() -> None:
            bare.execute("SELECT id, body FROM heartbeat_batons").fetchall()

        def select_keys() -> None:
            bare.execute("SELECT id, revision FROM heartbeat_batons").fetchall()

        def select_and_parse() -> None:
            for _, body in bare.execute("SELECT id, body FROM heartbeat_batons").fetchall():
                tomllib.loads(body)

        cold = timed(store.scan, 1)[0]
        quiet = timed(store.scan, 10)
        assert store.scan_unchanged
        bodies = timed(select_bodies, 10)
        keys = timed(select_keys, 10)
        parse = timed(select_and_parse, 1)[0]
        rows.append(("scan, cold (every row parsed)", f"{cold:.0f} ms",
                     f"SELECT id, body: {statistics.median(bodies):.1f} ms; + tomllib.loads each: {parse:.0f} ms"))
        rows.append(("scan, quiet (median of 10)", f"{statistics.median(quiet):.1f} ms",
                     f"SELECT id, revision: {statistics.median(keys):.1f} ms"))

        from heartbeat.config.load import parse_config
        from heartbeat.daemon import Daemon
        from heartbeat.system.logging import configure

        configure(fmt="json", level="error")
        with tempfile.TemporaryDirectory() as state:
            config = parse_config(f'[daemon]\nstate_dir = "{state}"\n')
            tick_store = PostgresStore(url)
            daemon = Daemon(config, store=tick_store, dry_run=True)
            daemon.initialize()
            first = timed(daemon.tick, 1)[0]
            ticks = timed(daemon.tick, 10)
            daemon.shared.pool.shutdown(wait=True)
            tick_store.close()
        rows.append(("daemon tick, first (dry run)", f"{first:.0f} ms", ""))
        rows.append(("daemon tick, quiet (median of 10)", f"{statistics.median(ticks):.1f} ms",
                     f"SELECT id, revision: {statistics.median(keys):.1f} ms"))

        counter = iter(range(1_000_000))

        def write() -> None:
            with store.edit("task-00005") as ed:
                ed.baton.next_step = f"n{next(counter)}"

        def bare_update() -> None:
            bare.execute("UPDATE heartbeat_batons SET written_at = now() WHERE id = %s", ("task-00006",))

        def bare_transaction() -> None:
            with bare.transaction():
                bare.execute("SELECT body FROM heartbeat_batons WHERE id = %s FOR UPDATE", ("task-00007",)).fetchone()
                bare.execute("UPDATE heartbeat_batons SET written_at = now() WHERE id = %s", ("task-00007",))
                bare.execute("INSERT INTO heartbeat_events (ts, task, kind) VALUES (now(), %s, 'updated')",
                             ("task-00007",))
                bare.execute("SELECT pg_notify('heartbeat_batons', %s)", ("task-00007",))

        timed(write, 10)
        writes = timed(write, args.writes)
        updates = timed(bare_update, args.writes)
        transactions = timed(bare_transaction, args.writes)
        rows.append(("one write (store.edit), p50 / p99", f"{p(writes, 0.5):.2f} / {p(writes, 0.99):.2f} ms",
                     f"bare UPDATE: {p(updates, 0.5):.2f} / {p(updates, 0.99):.2f} ms; the same statements bare "
                     f"(SELECT FOR UPDATE, UPDATE, INSERT, NOTIFY in one transaction): "
                     f"{p(transactions, 0.5):.2f} / {p(transactions, 0.99):.2f} ms"))
        rows.extend(bench_leases(url, bare, args.dispatches))
        bare.close()
        store.close()
    finally:
        if cluster is not None:
            cluster.remove()
    print(f"PostgreSQL store, {args.tasks} tasks\n")
    print("| measure | heartbeat | floor, same run |")
    print("|---|---|---|")
    for name, ours, floor in rows:
        print(f"| {name} | {ours} | {floor} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
