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
  (:func:`heartbeat.model.ledger.tally`), which are added back; and within one process no
  counter is ever exported lower than it was (a counter that went down would read as a
  reset, and ``increase()`` would count it all again: the escalation alert would fire).
- **The daemon's vitals** (:class:`heartbeat.daemon.vitals.Vitals`, kept by the daemon process
  in its own layer; this module only reads them): its last successful tick, its tick count,
  the tick-duration and write→decision-latency histograms, the writes it relayed, and on a
  shared store the tasks it took over and its lease renewals. The daemon writes them to
  ``<state_dir>/daemon.json`` (when anything beyond the tick's own counters changed, and at
  least every ``VITALS_SAVE_EVERY`` seconds), so a standalone exporter shows them too (as of
  the daemon's last write); inside ``heartbeat run`` they come straight from memory. They
  reset when the daemon restarts, which Prometheus' ``rate()`` handles as a counter reset.

**Per host or store-wide** (a fleet of daemons on one PostgreSQL store, each exporting):
every series carries ``scope``. ``scope="store"`` series (tasks by status, the ledger's
counters, the oldest block, the ledger's size, the hosts by lease state) read the shared
store, so every host exports the same value: aggregate them with ``max`` over instances,
never ``sum``. ``scope="host"`` series also carry ``host`` (the daemon's host id: agents
running here, the daemon's vitals, its takeovers, whether it reaches the database, the scrape's
duration) and add up across hosts. When the store cannot be read, a scrape still answers with
the per-host series (``heartbeat_database_unreachable`` 1) and no store-wide ones.

This module imports ``prometheus_client`` only inside the functions that expose
metrics, and the CLI's hot paths never import it at all.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from heartbeat.daemon.vitals import LATENCY_BUCKETS, TICK_BUCKETS, VITALS_FILE, Histogram, Vitals
from heartbeat.model.baton import STORED_STATUSES, Status
from heartbeat.model.ledger import COUNTED, EventKind, count_label, retired_counts

__all__ = ["TICK_BUCKETS", "LATENCY_BUCKETS", "VITALS_FILE", "METRIC_NAMES", "FLEET_METRIC_NAMES", "Histogram", "Vitals",
           "HeartbeatCollector", "OpenState", "open_state", "run_from_cli", "make_registry", "exposition", "write_textfile"]

METRIC_NAMES = (
    "heartbeat_tasks",
    "heartbeat_tasks_held",
    "heartbeat_agents_running",
    "heartbeat_dispatches_total",
    "heartbeat_exits_total",
    "heartbeat_stalls_total",
    "heartbeat_escalations_total",
    "heartbeat_bypasses_total",
    "heartbeat_spinning_total",
    "heartbeat_compactions_total",
    "heartbeat_guarantee_failures_total",
    "heartbeat_questions_asked_total",
    "heartbeat_questions_answered_total",
    "heartbeat_questions_escalated_total",
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
"""Every metric family heartbeat exports on any store."""

FLEET_METRIC_NAMES = (
    "heartbeat_takeovers_total",
    "heartbeat_hosts",
    "heartbeat_database_unreachable",
    "heartbeat_lease_renewal_age_seconds",
)
"""The families exported on a store shared by many hosts (PostgreSQL) only. The alert rules may use
only these and :data:`METRIC_NAMES`."""

_COUNTED_KINDS = tuple(str(k) for k in COUNTED)



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
                 vitals: Vitals | None = None, shared: bool | None = None, policy: Any = None) -> None:
        from heartbeat.model.policy import Policy

        self.store = store
        self.policy: Policy = policy if policy is not None else Policy()
        """The retry knobs the held tasks' states are read with (``heartbeat.reports.why``)."""
        self.shared = shared
        """Whether the store is shared by many hosts (None: ask the store)."""
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
        from prometheus_client.core import GaugeMetricFamily

        from heartbeat.launchers.liveness import this_host
        from heartbeat.model.errors import StoreError
        from heartbeat.ops.lease import for_store

        started = time.monotonic()
        vitals = self.vitals if self.vitals is not None else Vitals.load(self.state_dir)
        host = (vitals.host if vitals is not None else "") or this_host()
        shared = for_store(self.store) if self.shared is None else self.shared
        reached = True
        try:
            # Materialised first: a store that stops answering halfway exports none of it, never a part.
            families = list(self._store_families(host, shared))
        except StoreError:
            families, reached = [], False  # the per-host series still say what this host knows
        yield from families
        yield from self._host_families(host, vitals, shared, reached)
        yield _one(GaugeMetricFamily("heartbeat_scrape_duration_seconds", "How long collecting these metrics took.",
                                     labels=HOST_LABELS), ["host", host], time.monotonic() - started)

    def _store_families(self, host: str, shared: bool) -> Iterator[Any]:
        """The store-wide series (``scope="store"``): the same on every host of a fleet."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from heartbeat.launchers.liveness import is_alive

        tasks = GaugeMetricFamily("heartbeat_tasks", "Tasks by status and launcher (invalid: an unreadable baton).",
                                  labels=["scope", "status", "launcher"])
        by_status: dict[tuple[str, str], int] = {(s.value, self.default_launcher): 0 for s in STORED_STATUSES}
        alive = 0
        oldest_block: float | None = None
        entries = self.store.scan()
        held = _held_counts(entries, self.policy)
        for entry in entries:
            baton = entry.baton
            if baton is None:
                key = (Status.INVALID.value, "")
            else:
                key = (baton.meta.status.value, baton.launcher or self.default_launcher)
                owner = baton.meta.owner
                # This host's agents only: another host's agent cannot be checked from here (is_alive
                # counts it alive), and its own host counts it.
                if (owner is not None and baton.meta.status is Status.ACTIVE and owner.host in ("", host)
                        and is_alive(owner, host=host)):
                    alive += 1
                if baton.meta.status is Status.BLOCKED and baton.meta.blocked_at is not None:
                    at = baton.meta.blocked_at.timestamp()
                    oldest_block = at if oldest_block is None else min(oldest_block, at)
            by_status[key] = by_status.get(key, 0) + 1
        for (status, launcher), n in sorted(by_status.items()):
            tasks.add_metric(["store", status, launcher], n)
        yield tasks
        held_family = GaugeMetricFamily("heartbeat_tasks_held", "Active tasks without an agent, by why "
                                        "(heartbeat.reports.why: launch-failing, backing-off, escalating, "
                                        "rate-limited, waiting-upstream, due).",
                                        labels=["scope", "state"])
        for state, n in held.items():
            held_family.add_metric(["store", state], n)
        yield held_family
        yield _one(GaugeMetricFamily("heartbeat_agents_running",
                                     "Agents of this host alive, per their batons' owner pid and start time.",
                                     labels=HOST_LABELS), ["host", host], alive)
        if oldest_block is not None:
            yield _one(GaugeMetricFamily("heartbeat_blocked_oldest_timestamp_seconds",
                                         "When the task blocked the longest got blocked (absent when none is).",
                                         labels=STORE_LABELS), ["store"], oldest_block)

        dispatches = CounterMetricFamily("heartbeat_dispatches", "Agents the daemons started (ledger: dispatched).",
                                         labels=["scope", "launcher"])
        exits = CounterMetricFamily("heartbeat_exits", "Agents that ended, by how (ledger: exited, its kind).",
                                    labels=["scope", "kind"])
        stalls = CounterMetricFamily("heartbeat_stalls", "Tasks found stalled, by why (ledger: stalled).",
                                     labels=["scope", "why"])
        counted = self._monotonic(_count_events(self.store.ledger))
        for family, kind in ((dispatches, EventKind.DISPATCHED), (exits, EventKind.EXITED),
                             (stalls, EventKind.STALLED)):
            for label, n in sorted(counted[kind].items()):
                family.add_metric(["store", label], n)
            yield family
        for name, kind, doc in (
            ("heartbeat_escalations", EventKind.ESCALATED, "Tasks escalated to a human (ledger: escalated)."),
            ("heartbeat_bypasses", EventKind.BYPASS, "Blocks dropped by a hand edit of the baton (ledger: bypass)."),
            ("heartbeat_spinning", EventKind.SPINNING, "Agents found alive but not moving the step (ledger: spinning)."),
            ("heartbeat_compactions", EventKind.COMPACTING,
             "Context compactions inside live agent sessions (ledger: compacting, from the agents' hooks)."),
            ("heartbeat_guarantee_failures", EventKind.GUARANTEE_FAILED,
             "`done` refused because a checked guarantee of the task failed (ledger: guarantee_failed)."),
            ("heartbeat_questions_asked", EventKind.ASKED,
             "Questions asked across the seam, of an upstream or a person (ledger: asked)."),
            ("heartbeat_questions_answered", EventKind.ANSWERED, "Questions answered (ledger: answered)."),
            ("heartbeat_questions_escalated", EventKind.QUESTION_ESCALATED,
             "Questions unanswered past question_wait, escalated to a person (ledger: question_escalated)."),
        ):
            yield _one(CounterMetricFamily(name, doc, labels=STORE_LABELS), ["store"], sum(counted[kind].values()))
        size = _ledger_bytes(self.store.ledger)
        if size is not None:
            yield _one(GaugeMetricFamily("heartbeat_ledger_bytes", "The ledger's size on disk (database, WAL and index).",
                                         labels=STORE_LABELS), ["store"], size)
        if shared:
            from heartbeat.ops.lease import list_hosts

            states = {"live": 0, "lost": 0, "stopped": 0}
            for row in list_hosts(self.store):
                states[row.state] += 1
            hosts = GaugeMetricFamily("heartbeat_hosts", "Daemons on the shared database by the state of their host's "
                                      "lease (lost: not stopped, not renewed for longer than its lease_ttl).",
                                      labels=["scope", "state"])
            for state, n in states.items():
                hosts.add_metric(["store", state], n)
            yield hosts

    def _host_families(self, host: str, vitals: Vitals | None, shared: bool, reached: bool) -> Iterator[Any]:
        """The per-host series (``scope="host"``, ``host``): this daemon's own vitals."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        at = ["host", host]
        if shared:
            # The daemon's own view counts only inside the daemon: a standalone exporter reads a file
            # that a dead daemon stopped rewriting (its renewal age grows; the database may be fine).
            unreachable = not reached or (self.vitals is not None and self.vitals.database_unreachable())
            yield _one(GaugeMetricFamily("heartbeat_database_unreachable",
                                         "1 when this host cannot reach the shared database (this scrape could not "
                                         "read it; in the daemon also: its last lease renewal failed, or none "
                                         "succeeded for a lease_ttl).",
                                         labels=HOST_LABELS), at, int(unreachable))
        if vitals is None:
            return
        if vitals.last_tick_at is not None:
            yield _one(GaugeMetricFamily("heartbeat_last_tick_timestamp_seconds",
                                         "When the daemon last finished a pass without error.", labels=HOST_LABELS),
                       at, vitals.last_tick_at)
        yield _one(GaugeMetricFamily("heartbeat_daemon_start_timestamp_seconds", "When the daemon process started.",
                                     labels=HOST_LABELS), at, vitals.started_at)
        yield _one(CounterMetricFamily("heartbeat_ticks", "Passes the daemon finished since it started.",
                                       labels=HOST_LABELS), at, vitals.ticks)
        relayed = CounterMetricFamily("heartbeat_relayed_writes", "Agents' set/add the daemon wrote for them "
                                      "(the relay), by result.", labels=[*HOST_LABELS, "result"])
        relayed.add_metric([*at, "written"], vitals.relayed - vitals.relayed_refused)
        relayed.add_metric([*at, "refused"], vitals.relayed_refused)
        yield relayed
        for name, doc, hist in (
            ("heartbeat_tick_duration_seconds", "How long one pass over every baton took.", vitals.tick_seconds),
            ("heartbeat_write_decision_latency_seconds",
             "From a baton's write to the daemon's decision on it (the watcher's path).", vitals.latency_seconds),
        ):
            family = HistogramMetricFamily(name, doc, labels=HOST_LABELS)
            family.add_metric(at, hist.cumulative(), sum_value=hist.sum)
            yield family
        if vitals.lease_ttl is not None:
            taken = CounterMetricFamily("heartbeat_takeovers", "Tasks this host (host) took over from a host whose "
                                        "lease lapsed (from_host), counted as they happen.",
                                        labels=[*HOST_LABELS, "from_host"])
            for from_host, n in sorted(dict(vitals.takeovers).items()):
                taken.add_metric([*at, from_host], n)
            yield taken
            yield _one(GaugeMetricFamily("heartbeat_lease_renewal_age_seconds",
                                         "Seconds since this daemon last renewed its leases on the shared database "
                                         "(since it started, before the first renewal).", labels=HOST_LABELS),
                       at, vitals.renewal_age())


HOST_LABELS = ["scope", "host"]
"""The labels of a per-host series, ``scope="host"`` and this daemon's host id: sum them over a fleet."""

STORE_LABELS = ["scope"]
"""The label of a store-wide series, ``scope="store"``: every host exports the same value; take max()."""


def _one(family: Any, labels: list[str], value: float) -> Any:
    """``family`` with one sample."""
    family.add_metric(labels, value)
    return family


def _held_counts(entries: Any, policy: Any) -> dict[str, int]:
    """Active tasks without an agent, counted by their state in :mod:`heartbeat.reports.why` (every
    state always exported, 0 included, so an alert on one never sees it absent)."""
    from heartbeat.model.timeparse import utcnow
    from heartbeat.reports.why import HELD_STATES, why

    now = utcnow()
    statuses = {e.id: e.baton.meta.status for e in entries if e.baton is not None}
    counts = {state.value: 0 for state in HELD_STATES}
    for entry in entries:
        baton = entry.baton
        if baton is None or baton.meta.status is not Status.ACTIVE or baton.meta.owner is not None:
            continue
        state = why(baton, now, policy, statuses.get).state.value
        if state in counts:
            counts[state] += 1
    return counts


@dataclass
class OpenState:
    """A state dir opened for reading by ``heartbeat web`` / ``heartbeat metrics``, with the config's say."""

    store: Any
    state_dir: str
    max_attempts: int
    default_launcher: str
    allowed_hosts: tuple[str, ...] = ()
    """``[http] allowed_hosts``: the names the status page answers besides its listen address."""
    policy: Any = None
    """The config's retry knobs (:func:`heartbeat.reports.why.policy_for`): how held tasks are read."""


def require_extra(*modules: str) -> None:
    """One line naming the extra to install, instead of a traceback, when a library of the ``web`` extra is missing."""
    import importlib.util

    from heartbeat.model.errors import HeartbeatError
    from heartbeat.system.extras import Extra, install_hint

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise HeartbeatError(f"{', '.join(missing)} not installed (the web extra): {install_hint(Extra.WEB)}")


def open_state(args: Any) -> OpenState:
    """The store for ``--state-dir``/``--config`` (as every other command finds it), and the config's
    ``max_attempts`` and ``default_launcher`` when there is a config."""
    from heartbeat.config.load import find_config, load_config
    from heartbeat.model import defaults
    from heartbeat.store import open_configured

    max_attempts, default_launcher = defaults.MAX_ATTEMPTS, defaults.DEFAULT_LAUNCHER
    allowed_hosts: tuple[str, ...] = ()
    from heartbeat.reports.why import policy_for

    policy = policy_for(None)
    path = find_config(args.config)
    if path is not None and (args.config or not args.state_dir):
        config = load_config(path)
        max_attempts, default_launcher = config.daemon.max_attempts, config.daemon.default_launcher
        allowed_hosts = config.http.allowed_hosts
        policy = policy_for(config)
    store, state_dir = open_configured(args.state_dir, args.config)
    return OpenState(store, state_dir, max_attempts, default_launcher, allowed_hosts, policy)


def run_from_cli(args: Any) -> int:
    """``heartbeat metrics [--textfile PATH]``: print the exposition, or write it for node_exporter.

    A shared database out of reach is one line and exit 1, as for every command; with
    ``--textfile`` the file is rewritten first with what this host knows without it (its daemon's
    vitals, ``heartbeat_database_unreachable 1``): left as it was, it would go on saying 0."""
    import sys

    from heartbeat.model.errors import StoreError

    require_extra("prometheus_client")
    try:
        state = open_state(args)
    except StoreError:
        if args.textfile:
            _write_unreachable(args)
        raise
    try:
        registry = make_registry(HeartbeatCollector(state.store, state_dir=state.state_dir,
                                                    default_launcher=state.default_launcher, policy=state.policy))
        if args.textfile:
            write_textfile(args.textfile, registry)
        else:
            body, _ = exposition(registry)
            sys.stdout.write(body.decode())
    finally:
        state.store.close()
    return 0


class _Unopened:
    """The store of a textfile run that could not open it: every read says so."""

    def scan(self) -> Any:
        from heartbeat.model.errors import StoreError

        raise StoreError("the database could not be reached")


def _write_unreachable(args: Any) -> None:
    """The textfile with the per-host series only, the database unreachable (a shared store's URL)."""
    from heartbeat.config.load import resolve_store
    from heartbeat.model.errors import HeartbeatError

    try:
        state_dir, url = resolve_store(args.state_dir, args.config)
        if url:
            write_textfile(args.textfile, make_registry(HeartbeatCollector(_Unopened(), state_dir=state_dir,
                                                                           shared=True)))
    except (OSError, HeartbeatError):
        return  # the database's one line is said either way


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
    writer (:func:`heartbeat.system.safefile.write_file_atomic`: an exclusive, no-follow temp file in the
    target's directory, then a rename). ``prometheus_client.write_to_textfile`` opens its temp file
    ``PATH.<pid>.<thread>`` with a plain ``open`` that follows a link planted at that name, and
    the textfile directory is often writable by others."""
    from prometheus_client import generate_latest

    from heartbeat.system.safefile import write_file_atomic

    # 0644: node_exporter, another user, reads it (as write_to_textfile's files are).
    write_file_atomic(path, generate_latest(registry), 0o644)
