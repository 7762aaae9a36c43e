"""Bounded database connections on PostgreSQL, for real (issue 19 item 7).

A throwaway cluster with ``max_connections = 20``; two daemons (two host ids) on one database;
30 agents that are shell scripts calling ``heartbeat`` the way an agent's brief teaches it
(``show``, ``add``, ``touch``, ``set``, ``done``), all at once. Their calls go through their
host's daemon (:mod:`heartbeat.hotpath.relay`, greeting version 2), so the database sees only the
daemons' connections: at most ``PG_POOL_SIZE + 2 + PG_RELAY_POOL`` per daemon, sampled from
``pg_stat_activity`` throughout. A command that does open a connection (no daemon) and finds the
server full waits, with one notice, instead of failing; a fenced agent is still refused after
the wait.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_harness import DaemonHarness

from heartbeat.launchers.liveness import identify, this_host
from heartbeat.model import defaults
from heartbeat.model.baton import Owner
from heartbeat.model.timeparse import utcnow
from heartbeat.store.postgres.schema import upgrade
from heartbeat.store.postgres.store import PostgresStore
from heartbeat.tasks import verbs as tasks
from tests.support.pg import Cluster, start_cluster

pytestmark = pytest.mark.slow

MAX_CONNECTIONS = 20
PER_DAEMON = defaults.PG_POOL_SIZE + 1 + 1 + defaults.PG_RELAY_POOL
"""What docs/operating.md promises: the loop's pool, the change feed's LISTEN, the host lock, the relay's pool."""

TEST_APP = "hb-test"
"""The application_name of this module's own connections (the harness's stores, the sampler): not counted."""


@pytest.fixture(scope="module")
def small_cluster() -> Iterator[Cluster]:
    """A cluster of this module's own, restarted with max_connections = 20."""
    try:
        cluster = start_cluster()
    except RuntimeError as exc:
        pytest.fail(f"cannot start a throwaway PostgreSQL cluster: {exc}")
    try:
        cluster.stop()
        log = os.path.join(cluster.root, "server.log")
        opts = (f"-c listen_addresses='' -k {cluster.socket_dir} -c fsync=off "
                f"-c max_connections={MAX_CONNECTIONS} -c superuser_reserved_connections=0")
        started = cluster._run(os.path.join(cluster.bin_dir, "pg_ctl"), "-D", cluster.data, "-l", log, "-o", opts,
                               "-w", "-t", "60", "start", check=False)
        assert started.returncode == 0, started.stderr
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def db_url(small_cluster: Cluster, request: pytest.FixtureRequest) -> str:
    url = small_cluster.create_db(f"hb_conns_{os.getpid()}_{request.node.name[-20:].lower()}".replace("[", "_")
                                  .replace("]", "_").replace("-", "_"))
    upgrade(url)
    return url


def tagged(url: str) -> str:
    return f"{url}&application_name={TEST_APP}"


class Host(DaemonHarness):
    """A daemon with its own host id and state dir on the shared database; its own store holds one connection."""

    def __init__(self, root: Path, url: str, host: str, agent: list[str], max_concurrent: int, extra: str = "") -> None:
        self.url = url
        self.host = host
        root.mkdir(mode=0o700, exist_ok=True)
        super().__init__(root, tick="200ms", stall_after="60s", max_concurrent=max_concurrent,
                         dispatches_per_minute=6000, agent=agent,
                         extra=f"[store]\nurl = {json.dumps(url)}\n{extra}")
        self.store.close()
        self.store = PostgresStore(tagged(url), pool_size=1)  # type: ignore[assignment]

    def config_text(self) -> str:
        return super().config_text().replace(
            'log_level = "debug"\n', f'log_level = "debug"\nhost = "{self.host}"\nlease_ttl = "5s"\n', 1)

    def lines(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.log() if e.get("event") == event]


class Sampler:
    """The most sessions heartbeat held on the server at once (``pg_stat_activity``), sampled every 20 ms."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(tagged(url), autocommit=True)
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            row = self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                    "AND application_name <> %s", (TEST_APP,)).fetchone()
            self.most = max(self.most, int(row[0]) if row else 0)
            self.samples += 1
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        self.conn.close()
        return self.most


AGENT = """\
#!/bin/sh
# A toy agent speaking heartbeat's CLI, as an agent's brief teaches it; any refused call fails the attempt.
set -eu
hb() {{ {python} -m heartbeat "$@"; }}
hb show "$HEARTBEAT_TASK" | grep -q '^step = '
for n in 1 2 3 4 5 6; do
    hb add "$HEARTBEAT_TASK" decisions "note $n of epoch $HEARTBEAT_EPOCH"
    hb touch "$HEARTBEAT_TASK"
done
hb set "$HEARTBEAT_TASK" step=finishing
hb done "$HEARTBEAT_TASK" --note "six notes written"
"""


class TestFleet:
    def test_thirty_agents_on_two_hosts_finish_within_the_documented_connections(self, db_url: str,
                                                                                    tmp_path: Path) -> None:
        """30 agents writing notes at once on two hosts, max_connections = 20: every task done on its first
        attempt with all its notes, and the server never held more than two daemons' worth of heartbeat
        sessions (agents hold none: their calls are relayed)."""
        tmp_path.chmod(0o700)
        script = tmp_path / "agent.sh"
        script.write_text(AGENT.format(python=sys.executable))
        script.chmod(0o700)
        a = Host(tmp_path / "a", db_url, "host-a", ["/bin/sh", str(script)], max_concurrent=15)
        b = Host(tmp_path / "b", db_url, "host-b", ["/bin/sh", str(script)], max_concurrent=15)
        ids = [f"job-{i:02d}" for i in range(30)]
        sampler = Sampler(db_url)
        try:
            a.start()
            b.start()
            for task_id in ids:  # (both daemons up first: each takes about half)
                tasks.new_task(a.store, task_id, task=f"task {task_id}", step="start", workdir=str(tmp_path))
            a.wait(lambda: all(a.store.load(t).meta.status.value == "done" for t in ids), "all 30 tasks done",
                   timeout=600, interval=0.5)
        finally:
            most = sampler.stop()
            for h in (a, b):
                h.stop()
                h.kill_agents()
        store = a.store
        for task_id in ids:
            baton = store.load(task_id)
            assert len(baton.decisions) == 6, (task_id, baton.decisions)
            events = store.ledger.events(task_id)
            assert [e.epoch for e in events if e.kind == "dispatched"] == [1], task_id
            assert [e.data.get("code") for e in events if e.kind == "exited"] in ([], [0]), task_id
            assert not [e for e in events if e.kind == "failed"], task_id
        assert sampler.samples > 20
        print(f"at most {most} heartbeat sessions at once over {sampler.samples} samples")
        assert most <= 2 * PER_DAEMON, f"{most} heartbeat sessions at once; documented: {2 * PER_DAEMON}"
        relayed = {h.host: [e for e in h.lines("relayed")] for h in (a, b)}
        assert all(relayed.values()), "both hosts relayed their agents' calls"
        assert {e["command"] for h in relayed.values() for e in h} >= {"show", "add", "touch", "set", "done"}
        assert all(e["code"] == 0 for h in relayed.values() for e in h)
        for h in (a, b):
            assert not h.lines("tick_failed") and not h.lines("relay_off")
            h.close()


def _hb(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True, env=env,
                          timeout=120)


class TestRelayedOnPostgres:
    def test_an_agents_calls_are_the_daemons_and_answer_as_its_own(self, db_url: str, short_root: Path) -> None:
        """show, set, add, touch and done go through the daemon (greeting 2) and answer exactly as the agent's
        own process would: the same stdout, exit codes and one-line errors, the fence included (exit 5); an
        agent whose HEARTBEAT_STORE_URL names another database is not relayed (it writes by itself)."""
        h = Host(short_root / "h", db_url, "host-r", ["/bin/true"], max_concurrent=1)
        try:
            h.start()
            h.wait_log(lambda e: e.get("event") == "relay_serving", "the relay")
            tasks.new_task(h.store, "r1", task="t", step="start", workdir=str(short_root))
            epoch = tasks.claim(h.store, "r1", _owner()).meta.epoch  # this test process is the agent
            env = _agent_env("r1", epoch, db_url, h.state)
            local = {**env, "HEARTBEAT_RELAY": "off"}

            def relayed() -> list[str]:
                return [e["command"] for e in h.lines("relayed")]

            through, own = _hb(env, "show", "r1"), _hb(local, "show", "r1")
            assert (through.returncode, through.stdout, through.stderr) == (0, own.stdout, "")
            assert relayed() == ["show"]
            for args in (["set", "r1", "step=two"], ["add", "r1", "decisions", "d1"], ["touch", "r1"]):
                r = _hb(env, *args)
                assert (r.returncode, r.stderr) == (0, ""), args
            assert relayed() == ["show", "set", "add", "touch"]
            for case in (["show", "nope"], ["set", "r1", "nofield"], ["add", "r1", "colour", "x"]):
                through, own = _hb(env, *case), _hb(local, *case)
                assert (through.returncode, through.stderr) == (own.returncode, own.stderr), case
                assert through.returncode != 0 and through.stderr.count("\n") == 1, case
            stale = _hb({**env, "HEARTBEAT_EPOCH": str(epoch - 1)}, "set", "r1", "step=stale")
            assert stale.returncode == 5, stale.stderr
            others = _hb({**env, "HEARTBEAT_STORE_URL": db_url + "&application_name=elsewhere"}, "touch", "r1")
            assert others.returncode == 0 and relayed().count("touch") == 1  # written by itself, not relayed
            # The relayed call loads no database driver, no parser: the agent's fast path (tests/system/test_relay.py).
            timed = subprocess.run([sys.executable, "-X", "importtime", "-m", "heartbeat", "touch", "r1"],
                                   capture_output=True, text=True, env=env, timeout=120)
            assert timed.returncode == 0, timed.stderr
            modules = {line.rsplit("|", 1)[1].strip() for line in timed.stderr.splitlines()
                       if line.startswith("import time:")}
            assert {m for m in modules if m.startswith("heartbeat")} == {
                "heartbeat", "heartbeat.hotpath", "heartbeat.hotpath.argv", "heartbeat.hotpath.pulse",
                "heartbeat.hotpath.relay",
                "heartbeat.model", "heartbeat.model.defaults"}
            assert not {m.split(".")[0] for m in modules} & {"psycopg", "psycopg_pool", "tomllib", "typing"}
            done = _hb(env, "done", "r1", "--note", "finished by the relay")
            assert (done.returncode, done.stderr) == (0, "")
            assert relayed()[-1] == "done"
            baton = h.store.load("r1")
            assert (baton.meta.status.value, baton.step, baton.decisions) == ("done", "two", ["d1"])
        finally:
            h.stop()
            h.close()


    def test_a_done_with_checked_guarantees_runs_them_in_the_agents_own_process(self, db_url: str,
                                                                                short_root: Path) -> None:
        """The daemon declines (writes nothing) a `done` whose guarantees have checks: the agent's own process
        runs them with its own config and environment, as without a daemon (here: the check fails, exit 4)."""
        h = Host(short_root / "h", db_url, "host-g", ["/bin/true"], max_concurrent=1,
                 extra='[checks.never]\ncommand = ["/bin/false"]\n')
        try:
            h.start()
            h.wait_log(lambda e: e.get("event") == "relay_serving", "the relay")
            tasks.new_task(h.store, "g1", task="t", step="start", workdir=str(short_root))
            epoch = tasks.claim(h.store, "g1", _owner()).meta.epoch
            tasks.add_guarantee(h.store, "g1", "it builds", check="never", epoch=epoch)
            env = {**_agent_env("g1", epoch, db_url, h.state), "HEARTBEAT_CONFIG": str(h.config)}
            r = _hb(env, "done", "g1")
            assert r.returncode == 4 and "guarantee 'it builds' failed (check never" in r.stderr, r.stderr
            assert [e["command"] for e in h.lines("relay_declined")] == ["done"]
            assert not h.lines("relayed")
            assert h.store.load("g1").meta.status.value == "active"
        finally:
            h.stop()
            h.close()


class FakeDaemon:
    """A relay socket at ``<state>/daemon.sock`` that greets with ``greeting``, reads what comes and answers
    ``reply`` once: the client's side of version 2 without a daemon."""

    def __init__(self, state: Path, greeting: bytes, reply: bytes) -> None:
        import socket

        state.mkdir(mode=0o700, exist_ok=True)
        self.received = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(state / "daemon.sock"))
        self.sock.listen(1)
        self.sock.settimeout(30)

        def serve() -> None:
            conn, _ = self.sock.accept()
            with conn:
                conn.sendall(greeting)
                conn.settimeout(2)
                try:
                    while chunk := conn.recv(65536):
                        self.received += chunk
                        head, _, body = self.received.partition(b"\n")
                        if head.isdigit() and len(body) >= int(head):
                            break
                    conn.sendall(reply)
                except OSError:  # (a client that sent nothing has gone)
                    pass

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.thread.join(timeout=30)
        self.sock.close()


class TestClientVersion2:
    URL = "postgresql://u@/db?host=/nowhere"

    def env(self, state: Path) -> dict[str, str]:
        return {"HEARTBEAT_STATE_DIR": str(state), "HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "3",
                "HEARTBEAT_STORE_URL": self.URL}

    def test_a_daemon_on_another_database_is_sent_nothing(self, short_root: Path) -> None:
        """The greeting names another database: the client sends nothing and writes by itself (None)."""
        from heartbeat.hotpath import relay

        fake = FakeDaemon(short_root / "s", relay.greeting(self.URL + "&x=1"), b"0 0\n")
        try:
            assert relay.forward(["touch", "t1"], self.env(short_root / "s")) is None
        finally:
            fake.close()
        assert fake.received == b""

    def test_a_file_store_daemon_is_sent_no_touch(self, short_root: Path) -> None:
        """A version-1 daemon (the file store's, or one not yet restarted after an upgrade) is sent nothing."""
        from heartbeat.hotpath import relay

        fake = FakeDaemon(short_root / "s", relay.GREETING, b"0\n")
        try:
            assert relay.forward(["show", "t1"], self.env(short_root / "s")) is None
        finally:
            fake.close()
        assert fake.received == b""

    def test_a_declined_call_is_run_by_the_caller(self, short_root: Path) -> None:
        from heartbeat.hotpath import relay

        fake = FakeDaemon(short_root / "s", relay.greeting(self.URL), relay.DECLINED_REPLY)
        try:
            assert relay.forward(["done", "t1"], self.env(short_root / "s")) is None
        finally:
            fake.close()
        assert fake.received.endswith(b"\0done\0t1")

    def test_an_answer_cut_short_is_an_error_never_a_partial_baton(self, short_root: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
        """An answer announcing more standard output than arrived prints nothing of it: a read (``show``)
        is then run in the agent's own process (None: nothing was written, so nothing can land twice),
        a write's is exit 1 saying so."""
        from heartbeat.hotpath import relay

        fake = FakeDaemon(short_root / "s", relay.greeting(self.URL), b"0 100\nstep = ")
        try:
            assert relay.forward(["show", "t1"], self.env(short_root / "s")) is None
        finally:
            fake.close()
        out, err = capfd.readouterr()
        assert out == "" and err == ""
        (short_root / "s" / "daemon.sock").unlink()
        fake = FakeDaemon(short_root / "s", relay.greeting(self.URL), b"0 100\nstep = ")
        try:
            assert relay.forward(["set", "t1", "step=x"], self.env(short_root / "s")) == 1
        finally:
            fake.close()
        out, err = capfd.readouterr()
        assert out == "" and "answer was lost" in err


def _owner() -> Owner:
    found = identify(os.getpid())
    assert found is not None
    return Owner(pid=os.getpid(), create_time=found[1], host=this_host(), how="claim", started_at=utcnow())


def _agent_env(task_id: str, epoch: int, url: str, state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    return {**env, "HEARTBEAT_STATE_DIR": str(state_dir), "HEARTBEAT_TASK": task_id,
            "HEARTBEAT_EPOCH": str(epoch), "HEARTBEAT_STORE_URL": url}


class Hogs:
    """Every connection the server will give, held until released (the server is full)."""

    def __init__(self, url: str) -> None:
        self.conns: list[psycopg.Connection[Any]] = []
        while True:
            try:
                self.conns.append(psycopg.connect(tagged(url), autocommit=True))
            except psycopg.OperationalError as exc:
                assert "too many clients" in str(exc), exc
                break
            assert len(self.conns) <= MAX_CONNECTIONS

    def release(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns.clear()


class TestRefused:
    def test_a_write_on_a_full_server_waits_with_one_notice_then_lands(self, db_url: str, tmp_path: Path) -> None:
        """No daemon to relay it: an agent's own `set` finds the server full ("too many clients"), says so in
        one line and waits; once connections free up it writes and exits 0 (before: exit 1 in about 5 s,
        a failed attempt)."""
        store = PostgresStore(tagged(db_url), pool_size=1)
        try:
            tasks.new_task(store, "w1", task="t", step="start", workdir=str(tmp_path))
            epoch = tasks.claim(store, "w1", _owner()).meta.epoch
        finally:
            store.close()
        tmp_path.chmod(0o700)
        hogs = Hogs(db_url)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "set", "w1", "step=after the wait"],
                                    env=_agent_env("w1", epoch, db_url, tmp_path), stderr=subprocess.PIPE, text=True)
            assert proc.stderr is not None
            notice = proc.stderr.readline()  # blocks until the command says it waits
            assert "refuses connections (too many clients): waiting up to" in notice, notice
            assert proc.poll() is None, "still waiting, not failed"
        finally:
            hogs.release()
        _, rest = proc.communicate(timeout=120)
        assert proc.returncode == 0, notice + rest
        assert rest == ""
        store = PostgresStore(tagged(db_url), pool_size=1)
        try:
            assert store.load("w1").step == "after the wait"
        finally:
            store.close()

    def test_a_fenced_agent_that_waited_is_still_refused_with_exit_5(self, db_url: str, tmp_path: Path) -> None:
        """The wait does not weaken the fence: an agent whose epoch moved on waits out the full server,
        then is refused with exit 5 and writes nothing."""
        store = PostgresStore(tagged(db_url), pool_size=1)
        try:
            tasks.new_task(store, "f1", task="t", step="start", workdir=str(tmp_path))
            old = tasks.claim(store, "f1", _owner()).meta.epoch
            tasks.claim(store, "f1", _owner(), force=True)  # superseded: the epoch moves on
        finally:
            store.close()
        tmp_path.chmod(0o700)
        hogs = Hogs(db_url)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "add", "f1", "decisions", "late"],
                                    env=_agent_env("f1", old, db_url, tmp_path), stderr=subprocess.PIPE, text=True)
            assert proc.stderr is not None
            notice = proc.stderr.readline()
            assert "refuses connections (too many clients)" in notice, notice
        finally:
            hogs.release()
        _, rest = proc.communicate(timeout=120)
        assert proc.returncode == 5, notice + rest
        store = PostgresStore(tagged(db_url), pool_size=1)
        try:
            assert store.load("f1").decisions == []
        finally:
            store.close()

    def test_a_server_that_stays_full_is_given_up_on_after_the_bound(self, db_url: str) -> None:
        """The wait is bounded: a store whose refused_wait has run out says so in one line (exit 1's error)."""
        from heartbeat.model.errors import StoreUnreachable

        hogs = Hogs(db_url)
        try:
            with pytest.raises(StoreUnreachable, match="too many clients"):
                PostgresStore(db_url, wait=0.5, refused_wait=1.0)
        finally:
            hogs.release()
