"""Prometheus metrics: parsed with prometheus_client's own parser, counters moved by killing a real agent."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from heartbeat.daemon.vitals import LATENCY_BUCKETS, SAVE_EVERY, VITALS_FILE, Histogram, Vitals
from heartbeat.web.metrics import FLEET_METRIC_NAMES, METRIC_NAMES, write_textfile
from tests.conftest import ROOT, clean_env
from tests.support.daemon_harness import TOY, DaemonHarness

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """(exported name -> type, sample (name, labels) -> value); a counter's exported name ends in _total."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name + ("_total" if family.type == "counter" else "")] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels`` (``scope`` and ``host`` need not be
    named), or 0 when there is none."""
    found = [v for (n, have), v in samples.items() if n == name and set(labels.items()) <= set(have)]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else 0.0


SCRAPE_TOKEN = "metrics-token"
"""The daemon's [http] token: a Prometheus scrape carries it as a bearer token (``authorization`` in its config)."""


def scrape(url: str) -> str:
    request = urllib.request.Request(url + "metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def cli_metrics(h: DaemonHarness, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(h.config), "metrics", *args],
                          capture_output=True, text=True, env=h.env(), timeout=60)


class Running:
    def __init__(self, h: DaemonHarness) -> None:
        self.h = h
        self.url = ""

    def start(self) -> None:
        self.h.start()
        pid = self.h.proc.pid if self.h.proc else 0
        served = self.h.wait_log(lambda e: e.get("event") == "http_serving" and e.get("pid") == pid,
                                 "the daemon's [http] server")
        self.url = str(served["url"])


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    h = DaemonHarness(tmp_path_factory.mktemp("metrics"), agent=[*TOY, "--step-time", "1.0"], stall_after="30s",
                      backoff_initial="100ms", backoff_max="200ms",
                      extra=f'[http]\nlisten = "127.0.0.1:0"\ntoken = "{SCRAPE_TOKEN}"\n')
    r = Running(h)
    try:
        h.new("work", plan=60)
        h.new("waits", "--blocked-on", "a human", "--gate", "human")
        r.start()
        h.wait(lambda: owner(h, "work"), "the first agent")
        h.wait(lambda: len(h.events("work")) > 3, "the agent at work")
        yield r
    finally:
        h.close()


def owner(h: DaemonHarness, task_id: str) -> int | None:
    b = h.try_baton(task_id)
    return b.meta.owner.pid if b is not None and b.meta.owner is not None else None


def kill_the_agent(h: DaemonHarness) -> None:
    """SIGKILL the agent of "work"; return once its exit is in the ledger and a successor runs."""
    victim = owner(h, "work")
    assert victim is not None
    exits_before = len(h.events("work", "exited"))
    os.killpg(os.getpgid(victim), signal.SIGKILL)
    h.wait(lambda: len(h.events("work", "exited")) > exits_before, "the exit recorded")
    h.wait(lambda: (p := owner(h, "work")) and p != victim, "the successor dispatched")


class TestExposition:
    def test_parses_and_follows_conventions(self, running: Running) -> None:
        """/metrics parses with prometheus_client's parser; every family is heartbeat_*, counters end in _total,
        units are seconds and bytes, and the exported set on the file store is exactly METRIC_NAMES. Every
        series says its scope: store-wide, or this host's (then naming the host)."""
        text = scrape(running.url)
        types, samples = parse(text)
        assert set(types) == set(METRIC_NAMES)
        for (name, labels), _ in samples.items():
            scope = dict(labels).get("scope")
            assert scope in ("store", "host"), name
            assert ("host" in dict(labels)) == (scope == "host"), name
        for name, kind in types.items():
            assert name.startswith("heartbeat_")
            assert (kind == "counter") == name.endswith("_total"), name
            if "duration" in name or "latency" in name or "timestamp" in name:
                assert name.endswith(("_seconds", "_seconds_total")), name
        assert types["heartbeat_tick_duration_seconds"] == "histogram"
        assert types["heartbeat_write_decision_latency_seconds"] == "histogram"
        assert value(samples, "heartbeat_tasks", status="active", launcher="toy") == 1
        assert value(samples, "heartbeat_tasks", status="blocked", launcher="toy") == 1
        assert value(samples, "heartbeat_agents_running") == 1
        assert value(samples, "heartbeat_ledger_bytes") > 0
        blocked_at = running.h.baton("waits").meta.blocked_at
        assert blocked_at is not None
        assert value(samples, "heartbeat_blocked_oldest_timestamp_seconds") == pytest.approx(blocked_at.timestamp())

    def test_daemon_vitals(self, running: Running) -> None:
        """The daemon's last tick is recent, its tick histogram counts its ticks, and agent writes were
        measured as write→decision latencies."""
        _, samples = parse(scrape(running.url))
        assert time.time() - value(samples, "heartbeat_last_tick_timestamp_seconds") < 30
        ticks = value(samples, "heartbeat_tick_duration_seconds_count")
        assert ticks > 0 and value(samples, "heartbeat_ticks_total") >= ticks
        assert value(samples, "heartbeat_tick_duration_seconds_bucket", le="+Inf") == ticks
        assert value(samples, "heartbeat_write_decision_latency_seconds_count") > 0
        assert value(samples, "heartbeat_write_decision_latency_seconds_bucket", le="+Inf") == \
            value(samples, "heartbeat_write_decision_latency_seconds_count")

    def test_counters_move_when_an_agent_is_killed(self, running: Running) -> None:
        """SIGKILL to the agent: exits{kind=failed}, stalls and dispatches each go up by one, in the daemon's
        /metrics and in the standalone `heartbeat metrics` alike (both count the ledger)."""
        h = running.h
        _, before = parse(scrape(running.url))
        kill_the_agent(h)
        _, after = parse(scrape(running.url))
        assert value(after, "heartbeat_exits_total", kind="failed") == value(before, "heartbeat_exits_total",
                                                                                kind="failed") + 1
        assert value(after, "heartbeat_stalls_total", why="exited") == value(before, "heartbeat_stalls_total",
                                                                               why="exited") + 1
        assert value(after, "heartbeat_dispatches_total", launcher="toy") == value(
            before, "heartbeat_dispatches_total", launcher="toy") + 1
        r = cli_metrics(h)
        assert r.returncode == 0, r.stderr
        _, standalone = parse(r.stdout)
        for key in ("heartbeat_exits_total", "heartbeat_stalls_total", "heartbeat_dispatches_total"):
            mine = {k: v for k, v in standalone.items() if k[0] == key}
            theirs = {k: v for k, v in after.items() if k[0] == key}
            assert mine == theirs

    def test_counters_survive_a_daemon_restart(self, running: Running) -> None:
        """The counters come from the ledger: a restarted daemon reports them from where they were, not 0;
        while it is down, the standalone exporter still shows them and the last tick stops moving."""
        h = running.h
        kill_the_agent(h)  # an exit to count, whichever tests ran before this one (or none)
        _, before = parse(scrape(running.url))
        h.stop()
        r = cli_metrics(h)
        assert r.returncode == 0, r.stderr
        types, down = parse(r.stdout)
        assert "heartbeat_tick_duration_seconds" in types  # from daemon.json
        last_tick = value(down, "heartbeat_last_tick_timestamp_seconds")
        assert 0 < last_tick <= time.time()
        running.start()
        _, again = parse(scrape(running.url))
        for key in ("heartbeat_dispatches_total", "heartbeat_exits_total"):
            total_before = sum(v for k, v in before.items() if k[0] == key)
            assert total_before > 0
            assert sum(v for k, v in again.items() if k[0] == key) >= total_before
        h.wait(lambda: value(parse(scrape(running.url))[1], "heartbeat_last_tick_timestamp_seconds") > last_tick,
               "the restarted daemon's tick")

    def test_openmetrics_on_request(self, running: Running) -> None:
        """A scraper asking for OpenMetrics gets it (prometheus_client negotiates)."""
        request = urllib.request.Request(running.url + "metrics",
                                         headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                                  "Authorization": f"Bearer {SCRAPE_TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert response.read().decode().rstrip().endswith("# EOF")


class TestTextfile:
    def test_textfile_is_written_atomically(self, running: Running, tmp_path: Path) -> None:
        """`heartbeat metrics --textfile` writes a file node_exporter can read; a reader racing repeated
        writes always sees a whole file, and no temporary file is left behind."""
        path = tmp_path / "heartbeat.prom"
        seen: set[str] = set()
        reads = 0
        stop = threading.Event()

        def reader() -> None:
            nonlocal reads
            while not stop.is_set():
                try:
                    seen.add(path.read_text())
                    reads += 1
                except FileNotFoundError:
                    pass
                time.sleep(0.001)

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            for _ in range(5):
                r = cli_metrics(running.h, "--textfile", str(path))
                assert r.returncode == 0 and r.stdout == "", r.stderr
        finally:
            stop.set()
            thread.join(timeout=10)
        assert seen and reads > 5
        for text in seen:
            types, _ = parse(text)
            assert "heartbeat_tasks" in types and text.endswith("\n")
        assert sorted(os.listdir(tmp_path)) == ["heartbeat.prom"]

    def test_planted_symlink_at_the_temp_name_is_not_followed(self, tmp_path: Path) -> None:
        """A link planted at prometheus_client's temp name (``PATH.<pid>.<thread>``, in a textfile
        directory others may write) is neither followed nor replaced: the victim keeps its bytes and
        PATH is a regular file of metrics. ``write_to_textfile`` opened that name with a plain
        ``open``, wrote the metrics into the victim, and renamed the link over PATH (issue 17, item 13)."""
        from prometheus_client import CollectorRegistry, Gauge

        registry = CollectorRegistry()
        Gauge("heartbeat_probe", "A probe.", registry=registry).set(1)
        victim = tmp_path / "victim"
        victim.write_text("precious\n")
        textdir = tmp_path / "textfile"
        textdir.mkdir()
        path = textdir / "heartbeat.prom"
        planted = textdir / f"heartbeat.prom.{os.getpid()}.{threading.current_thread().ident}"
        planted.symlink_to(victim)
        write_textfile(str(path), registry)
        assert victim.read_text() == "precious\n"
        assert not path.is_symlink() and "heartbeat_probe 1.0" in path.read_text()
        assert oct(path.stat().st_mode & 0o777) == "0o644"  # node_exporter, another user, reads it
        assert sorted(os.listdir(textdir)) == sorted(["heartbeat.prom", planted.name])  # no temp file left

    def test_unwritable_place_is_one_line(self, running: Running, tmp_path: Path) -> None:
        """A textfile in a directory that does not exist: exit 1, one line naming it."""
        r = cli_metrics(running.h, "--textfile", str(tmp_path / "nowhere" / "h.prom"))
        assert r.returncode == 1
        assert r.stderr.count("\n") == 1 and "nowhere" in r.stderr


class TestVitals:
    def test_round_trip(self, tmp_path: Path) -> None:
        """Saved vitals load back equal, histograms included."""
        v = Vitals.start()
        v.tick_done(0.004, at=1000.0)
        v.latency_seconds.observe(0.07)
        v.latency_seconds.observe(400)
        v.save(str(tmp_path))
        back = Vitals.load(str(tmp_path))
        assert back is not None and back.to_json() == v.to_json()
        assert back.latency_seconds.cumulative()[-1] == ("+Inf", 2)
        assert (tmp_path / VITALS_FILE).stat().st_mode & 0o777 == 0o600

    def test_a_quiet_pass_rewrites_the_file_only_every_few_seconds(self, tmp_path: Path) -> None:
        """A pass that changed only the tick's own counters leaves daemon.json alone for
        SAVE_EVERY seconds (its rewrite was most of an idle daemon's CPU); anything else changed
        (an agent's write relayed, a latency, a renewal) is written at once, and so is a clock
        that went back."""
        v = Vitals.start()
        path = tmp_path / VITALS_FILE

        def written(now: float) -> bool:
            v.tick_done(0.001, at=now)
            return v.save_due(str(tmp_path), now)

        assert written(100.0)  # the first pass writes
        inode = path.stat().st_ino
        assert not written(101.0) and not written(100.0 + SAVE_EVERY - 0.01)
        assert path.stat().st_ino == inode and Vitals.load(str(tmp_path)).ticks == 1  # type: ignore[union-attr]
        assert written(100.0 + SAVE_EVERY)
        assert Vitals.load(str(tmp_path)).ticks == 4  # type: ignore[union-attr]
        at = 100.0 + SAVE_EVERY
        for change in (lambda: setattr(v, "relayed", v.relayed + 1), lambda: v.latency_seconds.observe(0.2),
                       lambda: v.renewal(True, at=5.0), lambda: v.took_over("host-a")):
            change()
            at += 0.1
            assert written(at)
        assert written(at - 1.0)  # a time before the last write (a clock set back): written, not trusted
        assert not written(at - 0.5)

    @pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"ticks": "many", "tick_seconds": {"buckets": [2, 1]}}',
                                         b"x" * 100_000])
    def test_garbage_is_ignored(self, tmp_path: Path, content: bytes) -> None:
        """A malformed daemon.json yields no vitals or empty histograms, never an error."""
        (tmp_path / VITALS_FILE).write_bytes(content)
        v = Vitals.load(str(tmp_path))
        assert v is None or (v.ticks == 0 and v.tick_seconds.count == 0)

    def test_fleet_vitals_round_trip_and_hostile_values_count_nothing(self, tmp_path: Path) -> None:
        """The host, takeovers and lease health load back equal; a daemon.json whose takeovers are not
        host -> count (negative, bool, a list, a 300-character name) counts none of them, of a 1,000-host
        dict only 256 are read, and a host id longer than a label should be is cut."""
        v = Vitals.start("host-b")
        v.lease_ttl = 30.0
        v.took_over("host-a")
        v.took_over("host-a")
        v.renewal(True, at=1000.0)
        v.save(str(tmp_path))
        back = Vitals.load(str(tmp_path))
        assert back is not None and back.to_json() == v.to_json() and back.takeovers == {"host-a": 2}
        assert back.renewal_age(now=1010.0) == 10.0
        assert not back.database_unreachable(now=1010.0) and back.database_unreachable(now=1031.0)
        back.renewal(False)
        assert back.database_unreachable(now=1010.0)
        (tmp_path / VITALS_FILE).write_text(json.dumps({
            "host": "h" * 10_000, "lease_ttl": True, "store_unreachable": "yes",
            "takeovers": {"a": -1, "b": True, "c": [1], "d": 1.5, "e" * 300: 1, "ok": 3}}))
        hostile = Vitals.load(str(tmp_path))
        assert hostile is not None and hostile.takeovers == {"ok": 3} and len(hostile.host) == 256
        assert hostile.lease_ttl is None and not hostile.store_unreachable
        (tmp_path / VITALS_FILE).write_text(json.dumps({"takeovers": {f"h{i}": 1 for i in range(1000)}}))
        loaded = Vitals.load(str(tmp_path))
        assert loaded is not None and len(loaded.takeovers) == 256

    def test_symlink_and_fifo_are_not_read(self, tmp_path: Path) -> None:
        """daemon.json as a symlink is not followed, as a FIFO not waited on."""
        secret = tmp_path / "secret.json"
        Vitals.start().save(str(tmp_path))
        os.replace(tmp_path / VITALS_FILE, secret)
        (tmp_path / VITALS_FILE).symlink_to(secret)
        assert Vitals.load(str(tmp_path)) is None
        (tmp_path / VITALS_FILE).unlink()
        os.mkfifo(tmp_path / VITALS_FILE)
        result: list[object] = []
        t = threading.Thread(target=lambda: result.append(Vitals.load(str(tmp_path))), daemon=True)
        t.start()
        t.join(timeout=10)
        assert result == [None]

    def test_histogram_buckets(self) -> None:
        """Observations land in the first bucket at or above them; NaN and negatives are dropped."""
        hist = Histogram(LATENCY_BUCKETS)
        for v in (0.01, 0.011, 300, 301, float("nan"), -1):
            hist.observe(v)
        cumulative = dict(hist.cumulative())
        assert cumulative["0.01"] == 1 and cumulative["0.025"] == 2 and cumulative["300.0"] == 3
        assert cumulative["+Inf"] == 4 and hist.sum == pytest.approx(601.021)


class TestCounting:
    def test_sql_and_python_counts_agree(self, tmp_path: Path) -> None:
        """The SQLite ledger counted in SQL gives exactly what replaying its events gives (labels from the
        data, missing or empty ones as 'unknown', uncounted kinds ignored)."""
        from datetime import UTC, datetime

        from heartbeat.model.ledger import Event
        from heartbeat.store.ledger import MemoryLedger, SqliteLedger
        from heartbeat.web.metrics import _count_events

        datas = [{"launcher": "a"}, {"launcher": ""}, {}, {"kind": "failed"}, {"kind": "idle"}, {"why": "exited"},
                 {"why": "spinning", "kind": "x"}, {"why": None}]
        kinds = ["dispatched", "exited", "stalled", "escalated", "bypass", "spinning", "compacting", "touched",
                 "updated"]
        events = [Event(task=f"t{i % 7}", kind=kinds[i % len(kinds)], ts=datetime.fromtimestamp(1e9 + i, UTC),
                      data=datas[i % len(datas)]) for i in range(500)]
        sqlite = SqliteLedger(str(tmp_path / "ledger.sqlite3"))
        memory = MemoryLedger()
        sqlite.append(events)
        memory.append([Event(task=e.task, kind=e.kind, ts=e.ts, data=e.data) for e in events])
        try:
            in_sql = _count_events(sqlite)
            in_python = _count_events(memory)
            assert in_sql == in_python
            assert in_sql["exited"]["unknown"] > 0 and in_sql["dispatched"][""] > 0
            assert sum(in_sql["escalated"].values()) == sum(1 for e in events if e.kind == "escalated")
        finally:
            sqlite.close()


class TestAlertRules:
    RULES = ROOT / "config" / "alerts.yml"

    def test_shape(self) -> None:
        """config/alerts.yml is a Prometheus rule file: groups of rules, each with alert, expr, a severity,
        a summary and a description, durations in Prometheus' syntax; the required alerts are there."""
        doc = yaml.safe_load(self.RULES.read_text())
        assert set(doc) == {"groups"} and isinstance(doc["groups"], list) and doc["groups"]
        names = []
        for group in doc["groups"]:
            assert set(group) <= {"name", "rules", "interval", "limit"} and isinstance(group["name"], str)
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, rule
                assert re.fullmatch(r"Heartbeat[A-Z][A-Za-z]+", rule["alert"])
                assert isinstance(rule["expr"], str) and rule["expr"].strip()
                assert rule["expr"].count("(") == rule["expr"].count(")")
                if "for" in rule:
                    assert re.fullmatch(r"(\d+[smhdwy])+", rule["for"]), rule["for"]
                assert rule["labels"]["severity"] in ("warning", "critical")
                assert set(rule["annotations"]) == {"summary", "description"}
                names.append(rule["alert"])
        assert len(names) == len(set(names))
        for required in ("HeartbeatDaemonNotTicking", "HeartbeatEscalation", "HeartbeatBlockBypassed",
                         "HeartbeatTaskBlockedTooLong", "HeartbeatTakeover", "HeartbeatHostLost",
                         "HeartbeatDatabaseUnreachable", "HeartbeatScrapeTargetDown"):
            assert required in names

    def test_every_expression_names_exported_metrics(self, running: Running) -> None:
        """Each heartbeat_* name in an expression is one a running daemon's /metrics really exports
        (histogram series by their _bucket/_sum/_count names)."""
        types, _ = parse(scrape(running.url))
        series = set()
        for name, kind in types.items():
            series.add(name)
            if kind == "histogram":
                series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        doc = yaml.safe_load(self.RULES.read_text())
        used = {m for g in doc["groups"] for r in g["rules"] for m in re.findall(r"\bheartbeat_[a-z_]+", r["expr"])}
        series |= set(FLEET_METRIC_NAMES)  # a PostgreSQL fleet's (tests/external/test_metrics_fleet.py scrapes them)
        assert used and used <= series, sorted(used - series)


class TestExtra:
    def test_missing_library_is_one_line_naming_the_extra(self) -> None:
        """Without the web extra, `web` and `metrics` say which extra to install instead of a traceback."""
        from heartbeat.model.errors import HeartbeatError
        from heartbeat.web.metrics import require_extra

        require_extra("prometheus_client", "starlette")
        with pytest.raises(HeartbeatError, match=r"^no_such_lib_xyz not installed \(the web extra\): .+ -m pip "
                                                 r"install -e '.+\[web\]'$"):
            require_extra("json", "no_such_lib_xyz")


class TestHotPath:
    LIBRARIES = ("prometheus_client", "starlette", "uvicorn", "jinja2", "anyio")

    @pytest.mark.parametrize("args", [["touch", "hot"], ["set", "hot", "step=next"], ["add", "hot", "done", "x"]])
    def test_agent_writes_import_no_web_stack(self, tmp_path: Path, args: list[str]) -> None:
        """touch/set/add import neither the web and metrics modules nor their libraries."""
        state = tmp_path / "state"
        env = clean_env(HEARTBEAT_STATE_DIR=str(state))
        new = subprocess.run([sys.executable, "-m", "heartbeat", "new", "hot", "--task", "t", "--step", "s"],
                             env=env, capture_output=True, text=True, cwd=str(ROOT), timeout=60)
        assert new.returncode == 0, new.stderr
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "heartbeat", *args], env=env,
                              capture_output=True, text=True, cwd=str(ROOT), timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                   if line.startswith("import time:")}
        assert "heartbeat.tasks.verbs" in modules  # the measurement works
        assert not {m.split(".")[0] for m in modules} & set(self.LIBRARIES)
        assert not modules & {"heartbeat.web.app", "heartbeat.web.metrics"}
