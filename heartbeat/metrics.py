"""Prometheus metrics: ``/metrics`` on the status page and ``heartbeat metrics --textfile PATH``.

Two sources, one exposition:

- **The store and the ledger** (read at every scrape by :class:`HeartbeatCollector`, a
  custom ``prometheus_client`` collector): tasks by status and launcher, agents alive
  per their batons, the counters (dispatches, exits by kind, stalls by why,
  escalations, bypasses, spinning, compactions) counted from ledger events, the
  ledger's size and the oldest block. Counting from the ledger, not in memory, keeps
  the counters right across daemon restarts and makes the standalone ``heartbeat web``
  and ``heartbeat metrics`` report exactly what the daemon would. gc never makes them go
  down: the ``archived`` event that replaces a retired task's rows keeps their counts
  (:func:`heartbeat.ledger.tally`), which are added back; and within one process no
  counter is ever exported lower than it was (a counter that went down would read as a
  reset, and ``increase()`` would count it all again: the escalation alert would fire).
- **The daemon's vitals** (:class:`Vitals`, kept by the daemon process): its last
  successful tick, its tick count, and the tick-duration and write→decision-latency
  histograms. The daemon writes them to ``<state_dir>/daemon.json`` after every tick,
  so a standalone exporter shows them too (as of the daemon's last tick); inside
  ``heartbeat run`` they come straight from memory. They reset when the daemon restarts,
  which Prometheus' ``rate()`` handles as a counter reset.

This module imports ``prometheus_client`` only inside the functions that expose
metrics: the daemon imports :class:`Vitals` without it, and the CLI's hot paths
never import this module at all.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from heartbeat.baton import STORED_STATUSES, Status
from heartbeat.layout import VITALS_NAME, StateLayout
from heartbeat.ledger import COUNTED, EventKind, count_label, retired_counts

__all__ = ["TICK_BUCKETS", "LATENCY_BUCKETS", "VITALS_FILE", "METRIC_NAMES", "Histogram", "Vitals",
           "HeartbeatCollector", "OpenState", "open_state", "run_from_cli", "make_registry", "exposition", "write_textfile"]

TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the tick-duration histogram: a pass over a few batons takes a
millisecond, one over ten thousand a second or more."""

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the write→decision latency histogram: the watcher reacts within
tens of milliseconds; a missed event waits for the next tick (30 s by default)."""

VITALS_FILE = VITALS_NAME
"""The daemon's vitals in its state dir, rewritten atomically after every tick."""

_MAX_VITALS_BYTES = 64 * 1024

METRIC_NAMES = (
    "heartbeat_tasks",
    "heartbeat_agents_running",
    "heartbeat_dispatches_total",
    "heartbeat_exits_total",
    "heartbeat_stalls_total",
    "heartbeat_escalations_total",
    "heartbeat_bypasses_total",
    "heartbeat_spinning_total",
    "heartbeat_compactions_total",
    "heartbeat_guarantee_failures_total",
    "heartbeat_ledger_bytes",
    "heartbeat_blocked_oldest_timestamp_seconds",
    "heartbeat_last_tick_timestamp_seconds",
    "heartbeat_daemon_start_timestamp_seconds",
    "heartbeat_ticks_total",
    "heartbeat_relayed_writes_total",
    "heartbeat_tick_duration_seconds",
    "heartbeat_write_decision_latency_seconds",
    "heartbeat_scrape_duration_seconds",
)
"""Every metric family heartbeat exports (the alert rules may use only these)."""

_COUNTED_KINDS = tuple(str(k) for k in COUNTED)


class Histogram:
    """A Prometheus-style histogram in plain Python (thread-safe): per-bucket counts, sum, count."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        if value != value or value < 0:  # NaN or a clock step backwards: not a measurement
            return
        index = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
        with self._lock:
            self.counts[index] += 1
            self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count of observations <= le)`` pairs, ending with ``+Inf``."""
        with self._lock:
            counts = list(self.counts)
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.sum}

    @classmethod
    def from_json(cls, doc: Any, default: tuple[float, ...]) -> Histogram:
        """The histogram in ``doc``; an empty one on anything malformed (the file is only a report)."""
        hist = cls(default)
        if not isinstance(doc, dict):
            return hist
        buckets, counts, total = doc.get("buckets"), doc.get("counts"), doc.get("sum")
        if (isinstance(buckets, list) and isinstance(counts, list) and len(counts) == len(buckets) + 1
                and all(isinstance(b, int | float) and not isinstance(b, bool) for b in buckets)
                and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
                and isinstance(total, int | float) and not isinstance(total, bool)
                and list(buckets) == sorted(buckets)):
            hist.buckets = tuple(float(b) for b in buckets)
            hist.counts = list(counts)
            hist.sum = float(total)
        return hist


@dataclass
class Vitals:
    """What only the daemon process knows: when it last ticked, how long ticks take, how fast it reacts."""

    pid: int = 0
    started_at: float = 0.0
    last_tick_at: float | None = None
    ticks: int = 0
    tick_seconds: Histogram = field(default_factory=lambda: Histogram(TICK_BUCKETS))
    latency_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    relayed: int = 0
    """Agents' set/add the daemon wrote for them (:mod:`heartbeat.relay`), refusals included."""
    relayed_refused: int = 0
    """Of those, the ones refused (a non-zero exit code: superseded, bad input, ...)."""

    @classmethod
    def start(cls) -> Vitals:
        return cls(pid=os.getpid(), started_at=time.time())

    def tick_done(self, seconds: float, at: float | None = None) -> None:
        """A pass finished without raising, taking ``seconds``."""
        self.tick_seconds.observe(seconds)
        self.ticks += 1
        self.last_tick_at = time.time() if at is None else at

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started_at": self.started_at, "last_tick_at": self.last_tick_at,
                "ticks": self.ticks, "tick_seconds": self.tick_seconds.to_json(),
                "latency_seconds": self.latency_seconds.to_json(), "relayed": self.relayed,
                "relayed_refused": self.relayed_refused}

    def save(self, state_dir: str) -> None:
        """Write ``<state_dir>/daemon.json`` atomically (0600, temp file + rename)."""
        from heartbeat.safefile import write_file_atomic

        data = json.dumps(self.to_json(), sort_keys=True).encode()
        # Not fsynced: a report rewritten every tick, whose loss in a crash costs nothing.
        write_file_atomic(StateLayout(state_dir).vitals_file, data, fsync=False)

    @classmethod
    def load(cls, state_dir: str) -> Vitals | None:
        """The vitals the daemon last wrote, or None (no daemon ever ran here, or the file is not a
        regular file or not ours to trust: a symlink or FIFO placed there is never followed or read)."""
        path = StateLayout(state_dir).vitals_file
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            raw = os.read(fd, _MAX_VITALS_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            doc = json.loads(raw) if len(raw) <= _MAX_VITALS_BYTES else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return None

        def number(key: str) -> float | None:
            value = doc.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(
            pid=int(number("pid") or 0),
            started_at=number("started_at") or 0.0,
            last_tick_at=number("last_tick_at"),
            ticks=int(number("ticks") or 0),
            relayed=int(number("relayed") or 0),
            relayed_refused=int(number("relayed_refused") or 0),
            tick_seconds=Histogram.from_json(doc.get("tick_seconds"), TICK_BUCKETS),
            latency_seconds=Histogram.from_json(doc.get("latency_seconds"), LATENCY_BUCKETS),
        )


_LABEL_KEYS = {str(k): v for k, v in COUNTED.items() if v}
"""The event data key each counter is labelled by (the others have no label)."""

_ARCHIVED_SQL = f"SELECT data FROM events WHERE kind = '{EventKind.ARCHIVED.value}'"

_COUNT_SQL = f"""
SELECT kind, CASE kind {' '.join(f"WHEN '{k}' THEN json_extract(data, '$.{v}')" for k, v in _LABEL_KEYS.items())}
       ELSE NULL END AS label, COUNT(*)
FROM events WHERE kind IN ({', '.join(f"'{k}'" for k in _COUNTED_KINDS)}) GROUP BY 1, 2
"""


def _count_events(ledger: Any) -> dict[str, dict[str, int]]:
    """Counted events per kind and label. The SQLite ledger is counted in SQL, read-only, by
    a connection of its own (a scrape must not decode every event in Python: see the
    figures in docs/operating.md); any other ledger, or an SQLite without JSON functions, through
    ``events()``."""
    counted: dict[str, dict[str, int]] = {kind: {} for kind in _COUNTED_KINDS}

    def add(kind: str, raw: object, n: int = 1) -> None:
        label = count_label(kind, raw)
        counted[kind][label] = counted[kind].get(label, 0) + n

    def add_retired(data: object) -> None:
        for kind, by_label in retired_counts(data).items():
            for label, n in by_label.items():
                counted[kind][label] = counted[kind].get(label, 0) + n

    path = getattr(ledger, "path", None)
    if isinstance(path, str):
        import sqlite3
        from urllib.parse import quote

        if not os.path.exists(path):
            return counted
        rows: list[tuple[str, object, int]] | None
        try:
            conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=5)
            try:
                conn.execute("BEGIN")  # one snapshot: gc's fold swaps rows for an archived event atomically
                rows = conn.execute(_COUNT_SQL).fetchall()
                archived = [r[0] for r in conn.execute(_ARCHIVED_SQL)]
            finally:
                conn.close()
        except sqlite3.Error:
            rows = None
        if rows is not None:
            for kind, raw, n in rows:
                add(kind, raw, int(n))
            for text in archived:
                try:
                    add_retired(json.loads(text))
                except (TypeError, ValueError):
                    continue  # an unreadable row counts nothing
            return counted
    for event in ledger.events(kinds=(*_COUNTED_KINDS, EventKind.ARCHIVED.value)):
        if event.kind == EventKind.ARCHIVED:
            add_retired(event.data)
        else:
            add(event.kind, event.data.get(_LABEL_KEYS[event.kind]) if event.kind in _LABEL_KEYS else None)
    return counted


def _ledger_bytes(ledger: Any) -> int | None:
    path = getattr(ledger, "path", None)
    if not isinstance(path, str):
        return None
    total = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            total += os.lstat(path + suffix).st_size
        except OSError:
            continue
    return total


class HeartbeatCollector:
    """A ``prometheus_client`` collector that reads the store, the ledger and the vitals at each scrape.

    ``vitals`` is the daemon's own object when the server runs inside ``heartbeat run``;
    otherwise the collector reads ``<state_dir>/daemon.json``.
    """

    def __init__(self, store: Any, *, state_dir: str, default_launcher: str = "",
                 vitals: Vitals | None = None) -> None:
        self.store = store
        self.state_dir = state_dir
        self.default_launcher = default_launcher
        self.vitals = vitals
        self._lock = threading.Lock()  # scrapes may come concurrently; one reads at a time
        self._high: dict[str, dict[str, int]] = {}
        """The counters as last exported (under the lock): none is ever exported lower."""

    def _monotonic(self, counted: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """``counted``, no series below what this process exported before (a write whose rename
        never happened loses its events, which a scrape may have counted meanwhile)."""
        for kind, by_label in self._high.items():
            for label, n in by_label.items():
                found = counted.setdefault(kind, {})
                found[label] = max(found.get(label, 0), n)
        self._high = {kind: dict(by_label) for kind, by_label in counted.items()}
        return counted

    def describe(self) -> list[Any]:
        return []  # families are built at collect time (registry made with auto_describe=False)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from heartbeat.liveness import is_alive

        started = time.monotonic()
        tasks = GaugeMetricFamily("heartbeat_tasks", "Tasks by status and launcher (invalid: an unreadable baton).",
                                  labels=["status", "launcher"])
        by_status: dict[tuple[str, str], int] = {(s.value, self.default_launcher): 0 for s in STORED_STATUSES}
        alive = 0
        oldest_block: float | None = None
        for entry in self.store.scan():
            baton = entry.baton
            if baton is None:
                key = (Status.INVALID.value, "")
            else:
                key = (baton.meta.status.value, baton.launcher or self.default_launcher)
                if baton.meta.owner is not None and baton.meta.status is Status.ACTIVE and is_alive(baton.meta.owner):
                    alive += 1
                if baton.meta.status is Status.BLOCKED and baton.meta.blocked_at is not None:
                    at = baton.meta.blocked_at.timestamp()
                    oldest_block = at if oldest_block is None else min(oldest_block, at)
            by_status[key] = by_status.get(key, 0) + 1
        for (status, launcher), n in sorted(by_status.items()):
            tasks.add_metric([status, launcher], n)
        yield tasks
        yield GaugeMetricFamily("heartbeat_agents_running",
                                "Agents alive, per their batons' owner pid and start time (checked on this host).",
                                value=alive)
        if oldest_block is not None:
            yield GaugeMetricFamily("heartbeat_blocked_oldest_timestamp_seconds",
                                    "When the task blocked the longest got blocked (absent when none is).",
                                    value=oldest_block)

        dispatches = CounterMetricFamily("heartbeat_dispatches", "Agents the daemon started (ledger: dispatched).",
                                         labels=["launcher"])
        exits = CounterMetricFamily("heartbeat_exits", "Agents that ended, by how (ledger: exited, its kind).",
                                    labels=["kind"])
        stalls = CounterMetricFamily("heartbeat_stalls", "Tasks found stalled, by why (ledger: stalled).",
                                     labels=["why"])
        counted = self._monotonic(_count_events(self.store.ledger))
        for family, kind in ((dispatches, EventKind.DISPATCHED), (exits, EventKind.EXITED),
                             (stalls, EventKind.STALLED)):
            for label, n in sorted(counted[kind].items()):
                family.add_metric([label], n)
            yield family
        for name, kind, doc in (
            ("heartbeat_escalations", EventKind.ESCALATED, "Tasks escalated to a human (ledger: escalated)."),
            ("heartbeat_bypasses", EventKind.BYPASS, "Blocks dropped by a hand edit of the baton (ledger: bypass)."),
            ("heartbeat_spinning", EventKind.SPINNING, "Agents found alive but not moving the step (ledger: spinning)."),
            ("heartbeat_compactions", EventKind.COMPACTING,
             "Context compactions inside live agent sessions (ledger: compacting, from the agents' hooks)."),
            ("heartbeat_guarantee_failures", EventKind.GUARANTEE_FAILED,
             "`done` refused because a checked guarantee of the task failed (ledger: guarantee_failed)."),
        ):
            yield CounterMetricFamily(name, doc, value=sum(counted[kind].values()))
        size = _ledger_bytes(self.store.ledger)
        if size is not None:
            yield GaugeMetricFamily("heartbeat_ledger_bytes", "The ledger's size on disk (database, WAL and index).",
                                    value=size)

        vitals = self.vitals if self.vitals is not None else Vitals.load(self.state_dir)
        if vitals is not None:
            if vitals.last_tick_at is not None:
                yield GaugeMetricFamily("heartbeat_last_tick_timestamp_seconds",
                                        "When the daemon last finished a pass without error.",
                                        value=vitals.last_tick_at)
            yield GaugeMetricFamily("heartbeat_daemon_start_timestamp_seconds", "When the daemon process started.",
                                    value=vitals.started_at)
            yield CounterMetricFamily("heartbeat_ticks", "Passes the daemon finished since it started.",
                                      value=vitals.ticks)
            relayed = CounterMetricFamily("heartbeat_relayed_writes", "Agents' set/add the daemon wrote for them "
                                          "(the relay), by result.", labels=["result"])
            relayed.add_metric(["written"], vitals.relayed - vitals.relayed_refused)
            relayed.add_metric(["refused"], vitals.relayed_refused)
            yield relayed
            for name, doc, hist in (
                ("heartbeat_tick_duration_seconds", "How long one pass over every baton took.", vitals.tick_seconds),
                ("heartbeat_write_decision_latency_seconds",
                 "From a baton's write to the daemon's decision on it (the watcher's path).", vitals.latency_seconds),
            ):
                yield HistogramMetricFamily(name, doc, buckets=hist.cumulative(), sum_value=hist.sum)
        yield GaugeMetricFamily("heartbeat_scrape_duration_seconds", "How long collecting these metrics took.",
                                value=time.monotonic() - started)


@dataclass
class OpenState:
    """A state dir opened for reading by ``heartbeat web`` / ``heartbeat metrics``, with the config's say."""

    store: Any
    state_dir: str
    max_attempts: int
    default_launcher: str
    allowed_hosts: tuple[str, ...] = ()
    """``[http] allowed_hosts``: the names the status page answers besides its listen address."""


def require_extra(*modules: str) -> None:
    """One line naming the extra to install, instead of a traceback, when a library of ``heartbeat[web]`` is missing."""
    import importlib.util

    from heartbeat.errors import HeartbeatError

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise HeartbeatError(f"{', '.join(missing)} not installed: pip install 'heartbeat[web]'")


def open_state(args: Any) -> OpenState:
    """The store for ``--state-dir``/``--config`` (as every other command finds it), and the config's
    ``max_attempts`` and ``default_launcher`` when there is a config."""
    from heartbeat import defaults
    from heartbeat.config import find_config, load_config
    from heartbeat.store import open_configured

    max_attempts, default_launcher = defaults.MAX_ATTEMPTS, defaults.DEFAULT_LAUNCHER
    allowed_hosts: tuple[str, ...] = ()
    path = find_config(args.config)
    if path is not None and (args.config or not args.state_dir):
        config = load_config(path)
        max_attempts, default_launcher = config.daemon.max_attempts, config.daemon.default_launcher
        allowed_hosts = config.http.allowed_hosts
    store, state_dir = open_configured(args.state_dir, args.config)
    return OpenState(store, state_dir, max_attempts, default_launcher, allowed_hosts)


def run_from_cli(args: Any) -> int:
    """``heartbeat metrics [--textfile PATH]``: print the exposition, or write it for node_exporter."""
    import sys

    require_extra("prometheus_client")
    state = open_state(args)
    try:
        registry = make_registry(HeartbeatCollector(state.store, state_dir=state.state_dir,
                                                    default_launcher=state.default_launcher))
        if args.textfile:
            write_textfile(args.textfile, registry)
        else:
            body, _ = exposition(registry)
            sys.stdout.write(body.decode())
    finally:
        state.store.close()
    return 0


def make_registry(collector: HeartbeatCollector) -> Any:
    """A fresh registry holding only heartbeat's collector (no process or platform metrics)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: Any, accept: str = "") -> tuple[bytes, str]:
    """The scrape body and its content type, negotiated from an ``Accept`` header."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def write_textfile(path: str, registry: Any) -> None:
    """Write the metrics for node_exporter's textfile collector atomically, through heartbeat's own
    writer (:func:`heartbeat.safefile.write_file_atomic`: an exclusive, no-follow temp file in the
    target's directory, then a rename). ``prometheus_client.write_to_textfile`` opens its temp file
    ``PATH.<pid>.<thread>`` with a plain ``open`` that follows a link planted at that name, and
    the textfile directory is often writable by others."""
    from prometheus_client import generate_latest

    from heartbeat.safefile import write_file_atomic

    # 0644: node_exporter, another user, reads it (as write_to_textfile's files are).
    write_file_atomic(path, generate_latest(registry), 0o644)
