"""The daemon's vitals: what only the daemon process knows, kept as plain numbers in its own layer.

Its last successful tick, its tick count, the tick-duration and write→decision-latency
histograms, the agents' writes it relayed and, on a store shared by many hosts, the tasks it
took over (by the host they came from) and the health of its leases (the last successful
renewal, whether the database answered). The daemon counts them as things happen (counters
are monotonic within its process) and writes them to ``<state_dir>/daemon.json``: after a tick
that changed anything but the tick's own counters, and at least every :data:`SAVE_EVERY`
seconds (:meth:`Vitals.save_due`); :mod:`heartbeat.web.metrics` (a face, above the daemon)
reads this object, or that file in a standalone exporter. Nothing here imports ``prometheus_client``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from heartbeat.model import defaults
from heartbeat.model.errors import UnsafePath
from heartbeat.system.layout import VITALS_NAME, StateLayout
from heartbeat.system.safefile import read_regular

__all__ = ["LATENCY_BUCKETS", "SAVE_EVERY", "TICK_BUCKETS", "VITALS_FILE", "Histogram", "Vitals"]

TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the tick-duration histogram: a pass over a few batons takes a
millisecond, one over ten thousand a second or more."""

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the write→decision latency histogram: the watcher reacts within
tens of milliseconds; a missed event waits for the next tick (30 s by default)."""

VITALS_FILE = VITALS_NAME
"""The daemon's vitals in its state dir, rewritten atomically (see :data:`SAVE_EVERY`)."""

SAVE_EVERY = defaults.VITALS_SAVE_EVERY
"""Seconds a pass that changed only its own counters may go without rewriting ``daemon.json``."""


_MAX_VITALS_BYTES = 64 * 1024
_MAX_LABEL = 256
"""A host id longer than this in the file is cut (it only labels a series)."""
_MAX_HOSTS = 256
"""At most this many hosts' takeovers are read back from the file (the rest are a planted list)."""

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
    """Agents' set/add the daemon wrote for them (:mod:`heartbeat.hotpath.relay`), refusals included."""
    relayed_refused: int = 0
    """Of those, the ones refused (a non-zero exit code: superseded, bad input, ...)."""
    host: str = ""
    """This daemon's host id (its per-host series carry it as the ``host`` label)."""
    takeovers: dict[str, int] = field(default_factory=dict)
    """Tasks this daemon took over, by the host whose lease had lapsed (counted as they happen)."""
    lease_ttl: float | None = None
    """The lease_ttl of a daemon on a shared store; None on the file store (no leases, no database)."""
    renewed_at: float | None = None
    """When this daemon last renewed its leases successfully (wall clock); None: not yet."""
    store_unreachable: bool = False
    """The last renewal (or pass) could not reach the database, and none succeeded since."""
    _saved: tuple[float, tuple[Any, ...]] | None = field(default=None, repr=False, compare=False)
    """When (monotonic) the file was last written, and what it said beside the per-pass fields."""

    @classmethod
    def start(cls, host: str = "") -> Vitals:
        return cls(pid=os.getpid(), started_at=time.time(), host=host)

    def took_over(self, from_host: str) -> None:
        """A task taken over from ``from_host`` (its lease lapsed)."""
        self.takeovers[from_host] = self.takeovers.get(from_host, 0) + 1

    def renewal(self, ok: bool, at: float | None = None) -> None:
        """A lease renewal finished: it reached the database (``ok``), or it did not."""
        if ok:
            self.renewed_at = time.time() if at is None else at
        self.store_unreachable = not ok

    def renewal_age(self, now: float | None = None) -> float:
        """Seconds since the last successful renewal (since the daemon started, when none was)."""
        now = time.time() if now is None else now
        return max(0.0, now - (self.renewed_at if self.renewed_at is not None else self.started_at))

    def database_unreachable(self, now: float | None = None) -> bool:
        """Whether the database is out of this daemon's reach: its last renewal failed, or none succeeded
        for longer than a lease lasts (a renewal hanging on a partition, or a file that the daemon, stuck,
        no longer rewrites)."""
        if self.lease_ttl is None:
            return False
        return self.store_unreachable or self.renewal_age(now) > self.lease_ttl

    def tick_done(self, seconds: float, at: float | None = None) -> None:
        """A pass finished without raising, taking ``seconds``."""
        self.tick_seconds.observe(seconds)
        self.ticks += 1
        self.last_tick_at = time.time() if at is None else at

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started_at": self.started_at, "last_tick_at": self.last_tick_at,
                "ticks": self.ticks, "tick_seconds": self.tick_seconds.to_json(),
                "latency_seconds": self.latency_seconds.to_json(), "relayed": self.relayed,
                "relayed_refused": self.relayed_refused, "host": self.host, "takeovers": dict(self.takeovers),
                "lease_ttl": self.lease_ttl, "renewed_at": self.renewed_at,
                "store_unreachable": self.store_unreachable}

    def save(self, state_dir: str, now: float | None = None) -> None:
        """Write ``<state_dir>/daemon.json`` atomically (0600, temp file + rename); ``now``: the
        monotonic clock's time of it (:meth:`save_due` counts from it)."""
        from heartbeat.system.safefile import write_file_atomic

        steady = self._steady()
        data = json.dumps(self.to_json(), sort_keys=True).encode()
        # Not fsynced: a report rewritten every few seconds, whose loss in a crash costs nothing.
        write_file_atomic(StateLayout(state_dir).vitals_file, data, fsync=False)
        self._saved = (time.monotonic() if now is None else now, steady)

    def _steady(self) -> tuple[Any, ...]:
        """Every field but the per-pass ones (the last tick's time, the count, the tick histogram),
        the latency histogram by its count: what a pass's end compares (cheaply: no JSON)."""
        return (self.pid, self.started_at, self.relayed, self.relayed_refused, self.host, tuple(self.takeovers.items()),
                self.lease_ttl, self.renewed_at, self.store_unreachable, self.latency_seconds.count)

    def save_due(self, state_dir: str, now: float | None = None) -> bool:
        """:meth:`save` when a field beside the per-pass ones changed since the last write, or
        :data:`SAVE_EVERY` seconds went by (``now``: the monotonic clock); whether it wrote."""
        now = time.monotonic() if now is None else now
        if self._saved is not None:
            at, steady = self._saved
            if 0 <= now - at < SAVE_EVERY and steady == self._steady():
                return False
        self.save(state_dir, now=now)
        return True

    @classmethod
    def load(cls, state_dir: str) -> Vitals | None:
        """The vitals the daemon last wrote, or None (no daemon ever ran here, or the file is not a
        regular file or not ours to trust: a symlink or FIFO placed there is never followed or read)."""
        path = StateLayout(state_dir).vitals_file
        try:
            raw = read_regular(path, _MAX_VITALS_BYTES + 1)
        except (OSError, UnsafePath):
            return None
        try:
            doc = json.loads(raw) if len(raw) <= _MAX_VITALS_BYTES else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return None

        def number(key: str) -> float | None:
            value = doc.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        host = doc.get("host")
        takeovers = doc.get("takeovers")
        return cls(
            host=host[:_MAX_LABEL] if isinstance(host, str) else "",
            takeovers=_counts(takeovers),
            lease_ttl=number("lease_ttl"),
            renewed_at=number("renewed_at"),
            store_unreachable=doc.get("store_unreachable") is True,
            pid=int(number("pid") or 0),
            started_at=number("started_at") or 0.0,
            last_tick_at=number("last_tick_at"),
            ticks=int(number("ticks") or 0),
            relayed=int(number("relayed") or 0),
            relayed_refused=int(number("relayed_refused") or 0),
            tick_seconds=Histogram.from_json(doc.get("tick_seconds"), TICK_BUCKETS),
            latency_seconds=Histogram.from_json(doc.get("latency_seconds"), LATENCY_BUCKETS),
        )


def _counts(doc: object) -> dict[str, int]:
    """Host -> count from the file; anything malformed counts nothing."""
    if not isinstance(doc, dict):
        return {}
    out: dict[str, int] = {}
    for key, n in doc.items():
        if len(out) >= _MAX_HOSTS:
            break
        if isinstance(key, str) and len(key) <= _MAX_LABEL and isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            out[key] = n
    return out
