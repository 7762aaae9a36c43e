"""A daemon started before its PostgreSQL waits for it, logging why, instead of exiting (issue 19, item 8)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonHarness
from pg import Cluster

from heartbeat.store.postgres.schema import upgrade
from heartbeat.store.postgres.store import PostgresStore


class EarlyDaemon(DaemonHarness):
    """A daemon on a PostgreSQL store, started without waiting for its ``started`` line, whose
    sd_notify datagrams land on a socket the test reads."""

    def __init__(self, root: Path, url: str) -> None:
        root.mkdir(mode=0o700, exist_ok=True)
        super().__init__(root, tick="200ms", stall_after="1h", extra=f"[store]\nurl = {json.dumps(url)}\n")
        self.url = url
        self._sock_dir = tempfile.mkdtemp(prefix="hb-notify-")
        self.notify_path = os.path.join(self._sock_dir, "notify")
        self.notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify_sock.bind(self.notify_path)
        self.notify_sock.setblocking(False)
        self.notes: list[str] = []

    def env(self) -> dict[str, str]:
        return {**super().env(), "NOTIFY_SOCKET": self.notify_path}

    def launch(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(self.config), "run"],
                                     stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=str(self.root))
        log.close()

    def notifications(self) -> list[str]:
        while True:
            try:
                self.notes.extend(self.notify_sock.recv(65536).decode().split("\n"))
            except BlockingIOError:
                return self.notes

    def lines(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.log() if e.get("event") == event]

    def close(self) -> None:
        super().close()
        self.notify_sock.close()
        shutil.rmtree(self._sock_dir, ignore_errors=True)


_made = 0


@pytest.fixture
def stopped(own_cluster: Cluster) -> Iterator[tuple[Cluster, str]]:
    """An upgraded database whose server is stopped (started again afterwards for the next test)."""
    global _made
    _made += 1
    url = own_cluster.create_db(f"wait_{os.getpid()}_{_made}")
    upgrade(url)
    own_cluster.stop()
    yield own_cluster, url
    status = own_cluster._run(os.path.join(own_cluster.bin_dir, "pg_ctl"), "-D", own_cluster.data, "status",
                              check=False)
    if status.returncode != 0:  # (the test may have started it)
        own_cluster.start()


class TestDatabaseDownAtStart:
    def test_waits_with_backoff_then_works_once_postgres_is_up(self, tmp_path: Path,
                                                                stopped: tuple[Cluster, str]) -> None:
        """Started while PostgreSQL is down, the daemon stays up: one structured ``store_waiting``
        line per try with the reason and a growing wait, STATUS says it is waiting; once the
        server starts it reaches the store and dispatches a task (it used to exit in ~5.5 s)."""
        cluster, url = stopped
        d = EarlyDaemon(tmp_path / "d", url)
        try:
            d.launch()
            d.wait(lambda: len(d.lines("store_waiting")) >= 3, "three tries logged", timeout=90)
            assert d.proc is not None and d.proc.poll() is None, "the daemon exited instead of waiting"
            tries = d.lines("store_waiting")
            assert [t["attempt"] for t in tries] == list(range(1, len(tries) + 1))
            assert [t["retry_in_s"] for t in tries[:3]] == [1.0, 2.0, 4.0]
            assert all("cannot reach the database" in t["error"] and t["level"] == "warning" for t in tries)
            d.wait(lambda: any(n.startswith("STATUS=waiting for the store") for n in d.notifications()),
                   "STATUS=waiting for the store")
            assert not any(n == "READY=1" for n in d.notifications())
            cluster.start()
            d.wait_log(lambda e: e.get("event") == "store_reached", "the store reached", timeout=90)
            d.wait_log(lambda e: e.get("event") == "started", "the daemon started", timeout=30)
            d.wait(lambda: "READY=1" in d.notifications(), "READY=1")
            store = PostgresStore(url)
            try:
                from heartbeat.tasks import verbs as tasks

                tasks.new_task(store, "after-boot", task="t", step="s")
                d.wait(lambda: store.ledger.events("after-boot", kinds=["dispatched"]), "a dispatch", timeout=60)
            finally:
                store.close()
        finally:
            d.close()

    def test_sigterm_while_waiting_stops_at_once(self, tmp_path: Path, stopped: tuple[Cluster, str]) -> None:
        """SIGTERM during the wait (even during a try blocked in a connect) ends the daemon with
        exit 0 and a ``store_wait_stopped`` line, long before its next try."""
        _, url = stopped
        d = EarlyDaemon(tmp_path / "d", url)
        try:
            d.launch()
            d.wait(lambda: d.lines("store_waiting"), "a first try logged", timeout=60)
            assert d.proc is not None
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(timeout=20) == 0
            assert d.lines("store_wait_stopped")
            assert not d.lines("started")
        finally:
            d.close()

    def test_a_store_that_is_not_unreachable_still_fails_in_one_line(self, tmp_path: Path,
                                                                    own_cluster: Cluster) -> None:
        """Only an unreachable database is waited for: a database heartbeat never upgraded ends
        the start at once with its one-line message and exit 1, as before."""
        url = own_cluster.create_db(f"never_upgraded_{os.getpid()}")
        d = EarlyDaemon(tmp_path / "d", url)
        try:
            d.launch()
            assert d.proc is not None
            assert d.proc.wait(timeout=60) == 1
            assert "heartbeat db upgrade" in d.log_path.read_text()
            assert not d.lines("store_waiting")
        finally:
            d.close()
