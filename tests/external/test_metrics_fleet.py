"""Metrics of a fleet, for real (issue 19, item 6): two daemons with different host ids on one
throwaway PostgreSQL cluster, each serving /metrics ([http] listen), scraped and parsed with
prometheus_client's parser.

Per-host series (``scope="host"``, ``host``) are each daemon's own and add up across the fleet;
store-wide series (``scope="store"``) are the same from every host. A takeover is counted once,
by the host that took the task; a lost host shows in ``heartbeat_hosts``; a stopped database in
``heartbeat_database_unreachable``, with the scrape still answering.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from heartbeat.web.metrics import FLEET_METRIC_NAMES, METRIC_NAMES
from tests.external.test_alert_rules import promtool
from tests.external.test_leased_daemons import Host, new_tasks
from tests.support.daemon_harness import TOY
from tests.support.pg import Cluster
from tests.system.test_metrics import SCRAPE_TOKEN, Samples, cli_metrics, parse, scrape, value

pytestmark = pytest.mark.slow


class Exporter(Host):
    """A leased daemon on a shared store that also serves the status page and /metrics."""

    def __init__(self, root: Path, url: str, host: str) -> None:
        super().__init__(root, url, host, agent=[*TOY, "--mode", "hang"], max_concurrent=4)
        self.url_http = ""

    def config_text(self) -> str:
        return super().config_text() + f'\n[http]\nlisten = "127.0.0.1:0"\ntoken = "{SCRAPE_TOKEN}"\n'

    def start(self) -> None:
        super().start()
        pid = self.proc.pid if self.proc else 0
        served = self.wait_log(lambda e: e.get("event") == "http_serving" and e.get("pid") == pid,
                               f"{self.host}'s [http] server")
        self.url_http = str(served["url"])

    def metrics(self) -> Samples:
        return parse(scrape(self.url_http))[1]


def of_scope(samples: Samples, scope: str) -> Samples:
    return {k: v for k, v in samples.items() if dict(k[1]).get("scope") == scope}


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def test_per_host_and_store_series_a_takeover_counted_once_and_the_database_gone(own_cluster: Cluster,
                                                                                  tmp_path: Path) -> None:
    """Two hosts: each counts only its own agents (c31a8a9 counted both hosts' on each: sums doubled),
    the store-wide series are equal on both; host-a SIGKILLed, host-b takes its two tasks over and
    says so once (from_host="host-a"; the exposition clean under `promtool check metrics`), the
    standalone exporter of host-a adds none, and host-a shows as lost; the cluster stopped, host-b's
    /metrics still answers and says the database is unreachable, the renewal age growing, without
    store-wide series it cannot read, and `heartbeat metrics --textfile` exits 1 with one line after
    rewriting its file to say so (left as it was, the file went on saying 0)."""
    from heartbeat.store.postgres.schema import upgrade

    url = own_cluster.create_db("fleet_metrics")
    upgrade(url)
    tmp_path.chmod(0o700)
    a = Exporter(tmp_path / "a", url, "host-a")
    b = Exporter(tmp_path / "b", url, "host-b")
    ids = ["m1", "m2"]
    new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
    try:
        a.start()
        a.wait(lambda: len(a.live_agents()) == 2, "host-a running both")
        b.start()
        b.wait(lambda: value(b.metrics(), "heartbeat_hosts", state="live") == 2, "both hosts live")

        on_a, on_b = a.metrics(), b.metrics()
        parsed = parse(scrape(b.url_http))[0]
        absent = {"heartbeat_blocked_oldest_timestamp_seconds",  # no task is blocked
                  "heartbeat_ledger_bytes"}  # a file's size: the PostgreSQL ledger has none
        assert set(parsed) == (set(METRIC_NAMES) | set(FLEET_METRIC_NAMES)) - absent
        assert value(on_a, "heartbeat_agents_running", host="host-a") == 2
        assert value(on_b, "heartbeat_agents_running", host="host-b") == 0
        assert total(on_a, "heartbeat_agents_running") + total(on_b, "heartbeat_agents_running") == 2
        for name in ("heartbeat_tasks", "heartbeat_hosts", "heartbeat_dispatches_total"):
            mine = {k: v for k, v in of_scope(on_a, "store").items() if k[0] == name}
            assert mine and mine == {k: v for k, v in of_scope(on_b, "store").items() if k[0] == name}, name
        assert value(on_a, "heartbeat_tasks", status="active", launcher="toy") == 2
        for h, samples in ((a, on_a), (b, on_b)):  # per-host series name their host, and only it
            hosts = {dict(k[1])["host"] for k in of_scope(samples, "host")}
            assert hosts == {h.host}
            assert value(samples, "heartbeat_database_unreachable", host=h.host) == 0
            assert value(samples, "heartbeat_lease_renewal_age_seconds", host=h.host) < 30
        assert total(on_b, "heartbeat_takeovers_total") == 0

        a.kill(signal.SIGKILL)
        a.kill_agents()
        b.wait(lambda: len(a.store.ledger.events(kinds=["taken_over"])) == 2, "both tasks taken over", timeout=30)
        b.wait(lambda: len(b.live_agents()) == 2, "host-b running both")
        # (the count is the daemon's at its last pass: under load that pass may predate the second start)
        b.wait(lambda: value(b.metrics(), "heartbeat_agents_running", host="host-b") == 2, "host-b counting both")
        text = scrape(b.url_http)
        on_b = parse(text)[1]
        assert value(on_b, "heartbeat_takeovers_total", host="host-b", from_host="host-a") == 2
        lint = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=120)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr  # Prometheus' naming lint
        standalone_a = cli_metrics(a)  # host-a's exporter, its daemon dead: its own vitals, no takeover
        assert standalone_a.returncode == 0, standalone_a.stderr
        on_a = parse(standalone_a.stdout)[1]
        assert {dict(k[1])["host"] for k in of_scope(on_a, "host")} == {"host-a"}
        assert value(on_a, "heartbeat_database_unreachable", host="host-a") == 0  # a dead daemon, a live database
        assert total(on_a, "heartbeat_takeovers_total") + total(on_b, "heartbeat_takeovers_total") == 2
        assert value(on_b, "heartbeat_agents_running", host="host-b") == 2
        b.wait(lambda: value(b.metrics(), "heartbeat_hosts", state="lost") == 1, "host-a lost")

        textfile = tmp_path / "b.prom"
        assert cli_metrics(b, "--textfile", str(textfile)).returncode == 0
        assert value(parse(textfile.read_text())[1], "heartbeat_database_unreachable", host="host-b") == 0
        own_cluster.stop("fast")
        b.wait(lambda: value(b.metrics(), "heartbeat_database_unreachable", host="host-b") == 1,
               "host-b's database unreachable", timeout=30)
        first = b.metrics()
        assert of_scope(first, "store") == {}  # nothing it cannot read is made up
        assert value(first, "heartbeat_agents_running") == 0 and ("heartbeat_tasks", ()) not in first
        age = value(first, "heartbeat_lease_renewal_age_seconds", host="host-b")
        time.sleep(1.0)
        later = b.metrics()
        assert value(later, "heartbeat_lease_renewal_age_seconds", host="host-b") >= age + 0.5
        assert value(later, "heartbeat_database_unreachable", host="host-b") == 1
        written = cli_metrics(b, "--textfile", str(textfile))  # node_exporter's route: exit 1, one line,
        assert written.returncode == 1 and written.stderr.count("\n") == 1, written.stderr  # and the file says so
        assert "cannot reach the database" in written.stderr
        in_file = parse(textfile.read_text())[1]
        assert value(in_file, "heartbeat_database_unreachable", host="host-b") == 1
        assert of_scope(in_file, "store") == {} and value(in_file, "heartbeat_ticks_total", host="host-b") > 0
    finally:
        try:
            for h in (a, b):
                h.close()
        finally:
            if not (Path(own_cluster.data) / "postmaster.pid").exists():
                own_cluster.start()

