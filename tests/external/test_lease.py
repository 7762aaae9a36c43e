"""The lease primitives on a real PostgreSQL store: claim with SKIP LOCKED within capacity and
labels, one-statement renewal, takeover with its ledger event and fence, the hosts view, the
schema migration, gates by host, the config keys and the CLI's views."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from heartbeat.config.load import parse_config
from heartbeat.daemon.gates import GateEvaluator
from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Owner
from heartbeat.model.errors import BadInput, ConfigError, Conflict, StoreError
from heartbeat.ops.lease import Lease, LeaseRow, host_labels, lease_rows, list_hosts, resolve_host
from heartbeat.store.postgres.schema import MIGRATIONS, upgrade
from heartbeat.store.postgres.store import PostgresStore
from tests.conftest import Result, clean_env


class _Log:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _add(self, level: str, event: str, **kw: Any) -> None:
        self.lines.append((level, event, kw))

    def info(self, event: str, **kw: Any) -> None:
        self._add("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._add("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._add("error", event, **kw)

    def debug(self, event: str, **kw: Any) -> None:
        self._add("debug", event, **kw)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [kw for _, event, kw in self.lines if event == name]


class _Host:
    """One host's lease over its own store, with the fenced agents it was asked to stop."""

    def __init__(self, url: str, host: str, *, ttl: float = 2.0, labels: tuple[str, ...] = ()) -> None:
        self.store = PostgresStore(url)
        self.log = _Log()
        self.stopped: list[tuple[str, int, int | None]] = []
        self.lease = Lease(self.store, host=host, labels=labels, ttl=ttl, capacity=10, interval=0.2, log=self.log,
                           stop_agent=lambda task, epoch, owner: self.stopped.append((task, epoch, owner.pid)))

    def close(self) -> None:
        self.lease.close()
        self.store.close()


@pytest.fixture
def hosts(pg_url: str) -> Iterator[dict[str, _Host]]:
    made = {name: _Host(pg_url, name) for name in ("host-a", "host-b")}
    yield made
    for h in made.values():
        h.close()


def _baton(task_id: str, **extra: Any) -> Baton:
    b = Baton(task=f"task {task_id}", step="start", meta=Meta(id=task_id))
    b.extra.update(extra)
    return b


def _dispatch(store: PostgresStore, task_id: str, host: str, pid: int = 4242) -> int:
    """What a daemon's dispatch writes: a new epoch and an owner on ``host``."""
    with store.edit(task_id, actor="daemon") as ed:
        ed.baton.meta.epoch += 1
        ed.baton.meta.owner = Owner(pid=pid, create_time=1.0, host=host, launcher="toy", how="dispatch")
        ed.event("dispatched")
    return ed.baton.meta.epoch


def _age_lease(url: str, task_id: str, seconds: float) -> None:
    """Move a task's lease into the past, as if its host stopped renewing ``seconds`` ago."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE heartbeat_batons SET lease_expires = now() - %s * interval '1 second', "
                     "lease_renewed = now() - %s * interval '1 second' WHERE id = %s",
                     (seconds, seconds + 2.0, task_id))


class TestClaim:
    def test_two_hosts_claiming_the_same_tasks_at_once_split_them(self, hosts: dict[str, _Host]) -> None:
        """Two hosts claim the same 40 tasks at the same instant, over and over: every task is claimed by
        exactly one of them (SKIP LOCKED: neither waits for nor takes the other's rows)."""
        a, b = hosts["host-a"], hosts["host-b"]
        ids = [f"t{i:02d}" for i in range(40)]
        for task_id in ids:
            a.store.create(_baton(task_id))
        a.lease.renew()
        b.lease.renew()
        got: dict[str, list[str]] = {}
        barrier = threading.Barrier(2)

        def claim(h: _Host, name: str) -> None:
            barrier.wait()
            got[name] = h.lease.claim(ids)

        threads = [threading.Thread(target=claim, args=(h, n)) for n, h in hosts.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not set(got["host-a"]) & set(got["host-b"])
        assert sorted(got["host-a"] + got["host-b"]) == ids
        held = lease_rows(a.store)
        assert all(held[i].host == ("host-a" if i in got["host-a"] else "host-b") for i in ids)
        assert all(held[i].left is not None and 0 < held[i].left <= 2.0 for i in ids)

    def test_a_row_locked_by_another_writer_is_skipped_not_waited_for(self, hosts: dict[str, _Host],
                                                                       pg_url: str) -> None:
        """A task whose row another transaction holds is skipped at once; the others are claimed."""
        a = hosts["host-a"]
        for task_id in ("x", "y"):
            a.store.create(_baton(task_id))
        a.lease.renew()
        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT 1 FROM heartbeat_batons WHERE id = 'x' FOR UPDATE")
            started = time.monotonic()
            assert a.lease.claim(["x", "y"]) == ["y"]
            assert time.monotonic() - started < 5
        assert a.lease.claim(["x"]) == ["x"]

    def test_claim_stays_within_the_limit_and_the_labels(self, pg_url: str) -> None:
        """A claim takes at most ``limit`` tasks, in the order asked, and only those whose host_labels the host has."""
        gpu = _Host(pg_url, "gpu-box", labels=("gpu", "linux"))
        plain = _Host(pg_url, "plain-box")
        try:
            gpu.store.create(_baton("needs-gpu", host_labels=["gpu"]))
            for task_id in ("p1", "p2", "p3"):
                gpu.store.create(_baton(task_id))
            gpu.lease.renew()
            plain.lease.renew()
            assert plain.lease.claim(["needs-gpu", "p1", "p2", "p3"], limit=2) == ["p1", "p2"]
            assert plain.lease.claim(["needs-gpu"]) == []
            assert gpu.lease.claim(["needs-gpu", "p3"]) == ["needs-gpu", "p3"]
        finally:
            gpu.close()
            plain.close()

    def test_a_held_lease_keeps_other_hosts_out_until_it_expires(self, hosts: dict[str, _Host], pg_url: str) -> None:
        """A task claimed by one host (its lease live) cannot be claimed by another; once expired it can."""
        a, b = hosts["host-a"], hosts["host-b"]
        a.store.create(_baton("t"))
        a.lease.renew()
        b.lease.renew()
        assert a.lease.claim(["t"]) == ["t"]
        assert b.lease.claim(["t"]) == []
        assert a.lease.claim(["t"]) == ["t"]  # its own host may claim again (the same dispatch retried)
        _age_lease(pg_url, "t", 1.0)
        assert b.lease.claim(["t"]) == ["t"]

    def test_an_owned_task_is_never_claimed(self, hosts: dict[str, _Host]) -> None:
        """A task with an agent (owner recorded) is not claimable even with no lease: only a takeover moves it."""
        a, b = hosts["host-a"], hosts["host-b"]
        a.store.create(_baton("t"))
        _dispatch(a.store, "t", "host-a")
        b.lease.renew()
        assert b.lease.claim(["t"]) == []

    def test_no_claim_nor_takeover_while_the_database_is_unreachable(self, hosts: dict[str, _Host]) -> None:
        """A host whose renewal fails claims and takes over nothing, says so once, and once when it is back;
        a stale renewal is redone before a claim (a long pass, or `run --once`, acts on leases known to hold)."""
        a = hosts["host-a"]
        a.store.create(_baton("t"))
        real = a.lease.store
        a.lease.store = _Down()  # type: ignore[assignment]
        assert not a.lease.renew()
        assert a.lease.claim(["t"]) == [] and a.lease.take_over(5) == []
        assert len(a.log.events("store_unreachable")) == 1
        a.lease.store = real
        time.sleep(0.3)  # past the renewal interval: the claim renews first
        assert a.lease.claim(["t"]) == ["t"]
        assert len(a.log.events("store_unreachable")) == 1 and len(a.log.events("store_reachable")) == 1


class _Down:
    """A store whose database does not answer."""

    label = "down"

    def keep_daemon_lock(self) -> str:
        return ""  # (these leases run without a daemon's host-id lock)

    def _down(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("cannot reach the database down: connection refused")

    renew_leases = claim_leases = take_over_leases = lease_host = task_epochs = host_stopped = _down


class TestRenew:
    def test_one_statement_renews_every_supervised_lease_and_the_host_row(self, hosts: dict[str, _Host],
                                                                         pg_url: str) -> None:
        """renew() runs one statement: the leases of the supervised tasks move forward, the others' do not."""
        a = hosts["host-a"]
        for task_id in ("mine-1", "mine-2", "idle"):
            a.store.create(_baton(task_id))
        a.lease.renew()
        assert a.lease.claim(["mine-1", "mine-2", "idle"]) == ["mine-1", "mine-2", "idle"]
        for task_id in ("mine-1", "mine-2"):
            _dispatch(a.store, task_id, "host-a")
        a.lease.observe(a.store.scan())
        for task_id in ("mine-1", "mine-2", "idle"):
            _age_lease(pg_url, task_id, 0.5)
        assert a.lease.renew()
        held = lease_rows(a.store)
        assert held["mine-1"].left is not None and held["mine-1"].left > 1.5
        assert held["mine-2"].left is not None and held["mine-2"].left > 1.5
        assert held["idle"].left is None  # not renewed: lapsed, and with no agent it is no lease at all
        (row,) = list_hosts(a.store)
        assert (row.host, row.state, row.running) == ("host-a", "live", 2)

    def test_a_pass_that_finds_a_renewal_in_flight_waits_for_it_instead_of_renewing_beside_it(
            self, hosts: dict[str, _Host]) -> None:
        """The loop's acting() while the renewal job's statement is slow (a busy CPU): it waits for that
        renewal and renews no second time beside it (the unfixed loop started its own renewal each pass
        on a loaded host, two at once, each rewriting every agent's lease file: the delay doubled)."""
        a = hosts["host-a"]
        a.lease.renew()
        real = a.store.renew_leases
        inside = threading.Event()
        release = threading.Event()
        calls: list[str] = []
        at_once = [0, 0]  # (in flight now, most ever)

        def slow(renewal: Any) -> Any:
            at_once[0] += 1
            at_once[1] = max(at_once)
            calls.append(threading.current_thread().name)
            try:
                inside.set()
                release.wait(10)
                return real(renewal)
            finally:
                at_once[0] -= 1

        a.store.renew_leases = slow  # type: ignore[method-assign]
        time.sleep(a.lease.interval * 2)  # the last renewal is older than the interval: a pass renews first
        job = threading.Thread(target=a.lease.renew, name="job")
        job.start()
        assert inside.wait(10)
        acted: list[bool] = []
        loop = threading.Thread(target=lambda: acted.append(a.lease.acting()), name="loop")
        loop.start()
        loop.join(timeout=0.5)  # long enough for an unfixed second renewal to be under way
        release.set()
        job.join(timeout=10)
        loop.join(timeout=10)
        assert acted == [True]
        assert (calls, at_once[1]) == (["job"], 1)

    def test_a_lease_taken_over_does_not_renew_and_its_agent_is_stopped(self, hosts: dict[str, _Host],
                                                                       pg_url: str) -> None:
        """After another host took the task over, the old host's renewal misses it, stops its agent and
        writes nothing for it."""
        a, b = hosts["host-a"], hosts["host-b"]
        a.store.create(_baton("t"))
        a.lease.renew()
        b.lease.renew()
        assert a.lease.claim(["t"]) == ["t"]
        epoch = _dispatch(a.store, "t", "host-a", pid=777)
        a.lease.observe(a.store.scan())
        _age_lease(pg_url, "t", 3.0)
        (taken,) = b.lease.take_over(5)
        assert taken.task == "t" and taken.from_host == "host-a" and taken.epoch == epoch + 1
        revision = a.store.load("t").meta.revision
        assert a.lease.renew()
        assert a.stopped == [("t", epoch, 777)]
        assert a.store.load("t").meta.revision == revision


class TestTakeOver:
    def test_takeover_moves_the_epoch_records_it_and_fences_the_old_agent(self, hosts: dict[str, _Host],
                                                                          pg_url: str) -> None:
        """An expired lease is taken over in one transaction: epoch+1, owner cleared, the row's lease now the
        taker's, ``taken_over`` in the ledger (from which host, the lease's age); the old agent's write is refused."""
        a, b = hosts["host-a"], hosts["host-b"]
        a.store.create(_baton("t"))
        a.lease.renew()
        b.lease.renew()
        a.lease.claim(["t"])
        epoch = _dispatch(a.store, "t", "host-a", pid=999)
        assert b.lease.take_over(5) == []  # the lease is live
        _age_lease(pg_url, "t", 4.0)
        (taken,) = b.lease.take_over(5)
        assert taken.lease_age >= 6.0
        baton = b.store.load("t")
        assert baton.meta.epoch == epoch + 1 and baton.meta.owner is None
        assert "host-a stopped renewing its lease" in baton.meta.last_failure
        (event,) = b.store.ledger.events("t", kinds=["taken_over"])
        assert event.data["from_host"] == "host-a" and event.data["to_host"] == "host-b"
        assert event.data["lease_age_s"] >= 6.0 and event.data["from_epoch"] == epoch and event.data["pid"] == 999
        assert event.epoch == epoch + 1
        assert [e.kind for e in b.store.ledger.events("t")][-2:] == ["taken_over", "stalled"]
        held = lease_rows(b.store)["t"]
        assert held.host == "host-b" and held.left is not None and held.left > 0
        with pytest.raises(Conflict, match="superseded"), a.store.edit("t", epoch=epoch) as ed:
            ed.baton.step = "the fenced agent writes"
        assert b.lease.claim(["t"]) == ["t"]  # the taker dispatches it next
        assert a.lease.claim(["t"]) == []

    def test_takeover_respects_the_limit_the_labels_and_its_own_host(self, pg_url: str) -> None:
        """At most ``limit`` tasks are taken, never one whose labels the taker lacks, never from itself."""
        a = _Host(pg_url, "host-a")
        b = _Host(pg_url, "host-b")
        try:
            for task_id in ("t1", "t2", "t3", "gpu"):
                a.store.create(_baton(task_id, host_labels=["gpu"]) if task_id == "gpu" else _baton(task_id))
            before = _Host(pg_url, "host-a")  # host-a's daemon before it died: it claimed and dispatched them
            before.lease.renew()
            for task_id in ("t1", "t2", "t3"):
                before.lease.claim([task_id])
                _dispatch(before.store, task_id, "host-a")
            before.close()
            for task_id in ("t1", "t2", "t3"):
                _age_lease(pg_url, task_id, 1.0)
            with a.store.edit("gpu", actor="daemon") as ed:  # owned by host-a, no lease of host-b's labels
                ed.baton.meta.owner = Owner(pid=1, host="host-a", how="dispatch")
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("UPDATE heartbeat_batons SET lease_expires = now() - interval '1 second' "
                             "WHERE id = 'gpu'")
            assert a.lease.take_over(10) == []
            b.lease.renew()
            assert [t.task for t in b.lease.take_over(2)] == ["t1", "t2"]
            assert [t.task for t in b.lease.take_over(10)] == ["t3"]
        finally:
            a.close()
            b.close()

    def test_a_claimed_task_without_a_lease_is_never_taken_over(self, hosts: dict[str, _Host]) -> None:
        """An owner on a host whose daemon never renewed it (a person's `claim` on a laptop) has no lease to expire."""
        a, b = hosts["host-a"], hosts["host-b"]
        a.store.create(_baton("t"))
        with a.store.edit("t") as ed:
            ed.baton.meta.epoch += 1
            ed.baton.meta.owner = Owner(pid=5, host="laptop", how="claim")
        b.lease.renew()
        assert b.lease.take_over(5) == []


class TestWritesKeepLeasesCoherent:
    def test_an_owner_on_another_host_drops_the_old_lease_and_owner_host_is_sticky(
        self, hosts: dict[str, _Host]
    ) -> None:
        """A write giving the task an owner on another host drops the old host's lease; clearing the owner keeps
        the host (it evaluates the task's local gates)."""
        a = hosts["host-a"]
        a.store.create(_baton("t"))
        a.lease.renew()
        a.lease.claim(["t"])
        _dispatch(a.store, "t", "host-a")
        assert lease_rows(a.store)["t"].left is not None
        _dispatch(a.store, "t", "host-c")
        assert lease_rows(a.store)["t"] == LeaseRow(host="host-c", left=None)
        with a.store.edit("t") as ed:
            ed.baton.meta.owner = None
        assert lease_rows(a.store)["t"].host == "host-c"
        a.store.scan()
        assert a.store.owner_hosts["t"] == "host-c"

    def test_bad_host_labels_are_refused_in_one_line(self, hosts: dict[str, _Host]) -> None:
        """A baton whose host_labels is not a list of labels is refused at its write, naming the field."""
        with pytest.raises(BadInput, match="host_labels must be a list of labels"):
            hosts["host-a"].store.create(_baton("t", host_labels=[1, 2]))
        assert host_labels(_baton("u", host_labels="gpu")) == ["gpu"]


class TestHosts:
    def test_hosts_lists_each_daemon_its_state_and_last_renewal(self, hosts: dict[str, _Host], pg_url: str) -> None:
        """list_hosts: one row per daemon, live while renewed within its ttl, stopped once closed."""
        a, b = hosts["host-a"], hosts["host-b"]
        a.lease.renew()
        b.lease.renew()
        assert {h.host: h.state for h in list_hosts(a.store)} == {"host-a": "live", "host-b": "live"}
        b.lease.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE heartbeat_hosts SET renewed_at = now() - interval '10 seconds' WHERE host = 'host-a'")
        states = {h.host: (h.state, round(h.age)) for h in list_hosts(a.store)}
        assert states["host-a"][0] == "lost" and states["host-a"][1] >= 10
        assert states["host-b"][0] == "stopped"

    def test_a_lost_host_runs_nothing(self, hosts: dict[str, _Host], pg_url: str) -> None:
        """Issue 24 item 17: a host past its ttl unrenewed kept its last RUNNING count in ``hosts``,
        ``--json`` and ``/hosts``; its agents were stopped by their shims, so it shows 0. At 4c852cf: 3."""
        a = hosts["host-a"]
        a.lease.renew(3)
        assert [h.running for h in list_hosts(a.store) if h.host == "host-a"] == [3]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE heartbeat_hosts SET renewed_at = now() - interval '10 seconds' WHERE host = 'host-a'")
        (row,) = [h for h in list_hosts(a.store) if h.host == "host-a"]
        assert (row.state, row.running) == ("lost", 0)


class TestMigration:
    def test_a_version_1_database_upgrades_and_keeps_its_owners(self, pg_empty_url: str) -> None:
        """A database at schema 1 with an owned row upgrades to 2: the row is marked owned, the hosts table exists."""
        with psycopg.connect(pg_empty_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE heartbeat_schema (version integer PRIMARY KEY, "
                         "applied_at timestamptz NOT NULL DEFAULT now())")
            for statement in MIGRATIONS[1]:
                conn.execute(statement)  # type: ignore[arg-type]  # the module's own constant SQL
            conn.execute("INSERT INTO heartbeat_schema (version) VALUES (1)")
            conn.execute("INSERT INTO heartbeat_batons (id, body, status, revision, epoch, owner_host) "
                         "VALUES ('old', 'x', 'active', 1, 1, 'host-a'), ('free', 'x', 'active', 1, 0, '')")
        assert upgrade(pg_empty_url) == (1, max(MIGRATIONS))
        with psycopg.connect(pg_empty_url) as conn:
            rows = dict(conn.execute("SELECT id, owned FROM heartbeat_batons").fetchall())
            assert rows == {"old": True, "free": False}
            assert conn.execute("SELECT count(*) FROM heartbeat_hosts").fetchone() == (0,)


class TestGatesByHost:
    def test_file_and_check_gates_may_name_their_host(self) -> None:
        """file:HOST:PATH and check:HOST:NAME parse; the host and the local target are told apart."""
        gate = Gate.parse("file:build-01:/srv/out/done")
        assert (gate.kind, gate.host, gate.local) == (GateKind.FILE, "build-01", "/srv/out/done")
        assert (Gate.parse("file:/tmp/x").host, Gate.parse("file:/tmp/x").local) == ("", "/tmp/x")
        check = Gate.parse("check:gpu-7:tests-pass")
        assert (check.host, check.local) == ("gpu-7", "tests-pass")
        assert Gate.parse("task:other").host == ""
        for bad in ("file:relative/path", "file:bad host:/x", "file:h:relative", "check:h:"):
            with pytest.raises(BadInput):
                Gate.parse(bad)

    def test_only_the_named_host_or_the_owner_host_evaluates_a_local_gate(self, tmp_path: Path) -> None:
        """A file gate is evaluated by the host it names, else the owner host; time/task/human gates everywhere."""
        flag = tmp_path / "flag"
        flag.touch()
        gates = GateEvaluator({})
        try:
            named = Gate.parse(f"file:host-a:{flag}")
            assert gates.evaluates(named, here="host-a") and not gates.evaluates(named, here="host-b")
            assert gates.is_open("t", named, _now())  # the path without its host
            plain = Gate.parse(f"file:{flag}")
            assert gates.evaluates(plain, here="host-b", owner_host="host-b")
            assert not gates.evaluates(plain, here="host-a", owner_host="host-b")
            assert gates.evaluates(plain, here="host-a")  # no host known: any daemon
            assert gates.evaluates(Gate.parse("time:2020-01-01T00:00:00Z"), here="x", owner_host="y")
            assert gates.evaluates(Gate(GateKind.HUMAN), here="x", owner_host="y")
        finally:
            gates.close()


def _now() -> Any:
    from heartbeat.model.timeparse import utcnow

    return utcnow()


class TestConfig:
    def test_host_labels_and_lease_ttl_parse_with_their_defaults(self) -> None:
        """daemon.host, daemon.labels and daemon.lease_ttl: defaults (hostname, none, 30 s) and set values."""
        d = parse_config("").daemon
        assert (d.host, d.labels, d.lease_ttl) == ("", (), 30.0)
        d = parse_config('[daemon]\nhost = "box-1"\nlabels = ["gpu", "linux"]\nlease_ttl = "10s"\n').daemon
        assert (d.host, d.labels, d.lease_ttl) == ("box-1", ("gpu", "linux"), 10.0)
        for bad in ('host = "a b"', 'labels = "gpu"', 'labels = ["ok", "not ok"]', 'lease_ttl = "0s"'):
            with pytest.raises(ConfigError):
                parse_config(f"[daemon]\n{bad}\n")

    def test_the_environment_wins_over_the_config(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """$HEARTBEAT_HOST overrides daemon.host, which overrides the hostname."""
        import socket

        monkeypatch.delenv("HEARTBEAT_HOST", raising=False)
        assert resolve_host("") == socket.gethostname()
        assert resolve_host("box-1") == "box-1"
        monkeypatch.setenv("HEARTBEAT_HOST", "from-env")
        assert resolve_host("box-1") == "from-env"


def _cli(*args: str, url: str, cwd: Path, **env: str) -> Result:
    proc = subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True, timeout=60,
                          env=clean_env(HEARTBEAT_STORE_URL=url, **env), cwd=str(cwd))
    return Result(proc.returncode, proc.stdout, proc.stderr)


class TestCli:
    def test_status_shows_host_and_lease_and_hosts_lists_the_daemons(self, pg_url: str, tmp_path: Path) -> None:
        """On a shared store `status` has HOST and LEASE columns; `hosts` lists each daemon and its last renewal."""
        a = _Host(pg_url, "host-a", ttl=120.0)
        try:
            self._status_and_hosts(a, pg_url, tmp_path)
        finally:
            a.close()

    def _status_and_hosts(self, a: _Host, pg_url: str, tmp_path: Path) -> None:
        a.store.create(_baton("held"))
        a.store.create(_baton("free"))
        a.lease.renew()
        a.lease.claim(["held"])
        _dispatch(a.store, "held", "host-a")
        r = _cli("status", url=pg_url, cwd=tmp_path)
        assert r.code == 0, r.err
        header, *lines = r.out.splitlines()
        assert header.split()[:8] == ["ID", "STATUS", "ATTEMPT", "EPOCH", "AGE", "HOST", "LEASE", "STEP"]
        held = next(line for line in lines if line.startswith("held"))
        assert "host-a" in held.split()
        free = next(line for line in lines if line.startswith("free"))
        assert free.split()[5:7] == ["-", "-"]
        r = _cli("status", "--json", url=pg_url, cwd=tmp_path)
        rows = {t["id"]: t for t in __import__("json").loads(r.out)["tasks"]}
        assert rows["held"]["host"] == "host-a" and 0 < rows["held"]["lease_s"] <= 120.0
        r = _cli("hosts", url=pg_url, cwd=tmp_path)
        assert r.code == 0, r.err
        assert r.out.splitlines()[0].split() == ["HOST", "STATE", "PID", "RUNNING", "RENEWED", "LEASE_TTL", "LABELS"]
        assert r.out.splitlines()[1].split()[:2] == ["host-a", "live"]

    def test_hosts_on_the_file_store_says_why_in_one_line(self, state_dir: Path) -> None:
        """`heartbeat hosts` on the file store exits 2 with one line: it has one host and no leases."""
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "hosts"], capture_output=True, text=True,
                              env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)), timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "shared store" in proc.stderr

    def test_new_with_host_labels(self, pg_url: str, tmp_path: Path) -> None:
        """`new --host-label` writes the baton's host_labels; a bad label is refused in one line."""
        r = _cli("new", "t", "--task", "x", "--step", "y", "--host-label", "gpu", url=pg_url, cwd=tmp_path)
        assert r.code == 0, r.err
        store = PostgresStore(pg_url)
        try:
            assert store.load("t").extra["host_labels"] == ["gpu"]
        finally:
            store.close()
        r = _cli("new", "u", "--task", "x", "--step", "y", "--host-label", "not ok", url=pg_url, cwd=tmp_path)
        assert r.code == 2 and r.err.count("\n") == 1 and "host_labels" in r.err


class TestFileStore:
    def test_the_file_store_daemon_has_no_lease_and_judges_every_task(self, state_dir: Path) -> None:
        """On the file store (one host) the daemon builds no lease part: no claim, no renewal, no host filter."""
        from heartbeat.daemon import Daemon

        config = parse_config(f'[daemon]\nstate_dir = "{state_dir}"\n\n[launchers.agent]\ntype = "null"\n')
        daemon = Daemon(config, dry_run=True)
        try:
            assert daemon.lease is None and daemon.observer.lease is None and daemon.actor.lease is None
        finally:
            daemon.shared.pool.shutdown(wait=True)
            daemon.store.close()

    def test_a_reload_applies_labels_capacity_and_ttl_to_the_leases(self, pg_url: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        """On a shared store a reloaded config's labels, max_concurrent and lease_ttl reach the lease part."""
        from heartbeat.daemon import Daemon

        monkeypatch.setenv("HEARTBEAT_HOST", "host-r")
        base = f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n%s\n[store]\nurl = "{pg_url}"\n\n' \
               '[launchers.agent]\ntype = "null"\n'
        daemon = Daemon(parse_config(base % 'labels = ["cpu"]\n'), dry_run=True)
        try:
            assert daemon.lease is not None and daemon.lease.lease.labels == ["cpu"]
            daemon.loop.apply_config(parse_config(base % 'labels = ["gpu"]\nmax_concurrent = 9\nlease_ttl = "12s"\n'))
            lease = daemon.lease.lease
            assert (lease.labels, lease.capacity, lease.ttl) == (["gpu"], 9, 12.0)
        finally:
            daemon.shared.pool.shutdown(wait=True)
            daemon.store.close()
