"""Leased daemons on many hosts, for real: daemons with different host ids sharing one throwaway
PostgreSQL database, real agents, real signals, tiny intervals.

Each "host" is a daemon with its own state dir and ``daemon.host``; its agents are told apart in
the process table by their ``HEARTBEAT_STATE_DIR``. Twins are looked for twice over: in the
process table (never two live agents for one task, across hosts) and in the ledger (every
dispatch after the first follows the end or the takeover of the one before).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_harness import TOY, DaemonHarness

from heartbeat.model.baton import Gate
from heartbeat.model.ledger import Event
from heartbeat.store.postgres.store import PostgresStore
from heartbeat.tasks import verbs as tasks
from tests.support.pg import Cluster

pytestmark = pytest.mark.slow

TICK = 0.2
TTL = 2.0


class Host(DaemonHarness):
    """A daemon with its own host id and state dir, on a shared PostgreSQL store."""

    def __init__(self, root: Path, url: str, host: str, *, max_concurrent: int = 10, agent: list[str] | None = None,
                 stall_after: str = "1h", ttl: float = TTL) -> None:
        self.url = url
        self.host = host
        self.ttl = ttl
        root.mkdir(mode=0o700, exist_ok=True)
        super().__init__(root, tick=f"{int(TICK * 1000)}ms", stall_after=stall_after, max_concurrent=max_concurrent,
                         dispatches_per_minute=6000, agent=agent, extra=f"[store]\nurl = {json.dumps(url)}\n")
        self.store.close()
        self.store = PostgresStore(url)  # type: ignore[assignment]

    def config_text(self) -> str:
        return super().config_text().replace(
            'log_level = "debug"\n', f'log_level = "debug"\nhost = "{self.host}"\nlease_ttl = "{self.ttl}s"\n', 1)

    def lines(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.log() if e.get("event") == event]


class Twins:
    """Samples the process table of every host until stopped: the most live agents any one task had."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts
        self.worst: dict[str, list[tuple[str, int]]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            seen: dict[str, list[tuple[str, int]]] = {}
            for h in self.hosts:
                for task, groups in h.live_agents().items():
                    seen.setdefault(task, []).extend((h.host, g) for g in groups)
            for task, groups in seen.items():
                if len(groups) > len(self.worst.get(task, [])):
                    self.worst[task] = groups
            self.samples += 1
            self._stop.wait(0.05)

    def stop(self) -> dict[str, list[tuple[str, int]]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return {task: groups for task, groups in self.worst.items() if len(groups) > 1}


def ledger_twins(events: list[Event]) -> list[str]:
    """Dispatches that came while the previous agent of the task had neither ended nor been taken over."""
    bad: list[str] = []
    live = False
    for e in events:
        if e.kind == "dispatched":
            if live:
                bad.append(f"epoch {e.epoch} dispatched at {e.ts.isoformat()} with the previous agent unsettled")
            live = True
        elif e.kind in ("exited", "taken_over"):
            live = False
    return bad


def new_tasks(store: PostgresStore, ids: list[str], workdir: Path, plan: int = 1) -> None:
    for task_id in ids:
        tasks.new_task(store, task_id, task=f"task {task_id}", step="start", workdir=str(workdir),
                       plan=[f"step {i + 1}" for i in range(plan)])


def hosts_of(store: PostgresStore, task_id: str) -> list[str]:
    return [e.data.get("host", "") for e in store.ledger.events(task_id, kinds=["dispatched"])]


@pytest.fixture
def pair(pg_url: str, tmp_path: Path) -> Iterator[tuple[Host, Host]]:
    tmp_path.chmod(0o700)
    hang = [*TOY, "--mode", "hang"]
    a = Host(tmp_path / "a", pg_url, "host-a", agent=hang, max_concurrent=4)
    b = Host(tmp_path / "b", pg_url, "host-b", agent=hang, max_concurrent=4)
    yield a, b
    for h in (a, b):
        if h.proc is not None and h.proc.poll() is None:
            h.proc.send_signal(signal.SIGCONT)  # a paused daemon must be able to hear SIGTERM
        h.close()


class TestSharing:
    def test_two_hosts_share_fifty_tasks_without_twins(self, pg_url: str, tmp_path: Path) -> None:
        """Two daemons with different host ids on one database run 50 tasks to done: both take a share, and no
        task ever has two live agents (process table, sampled throughout) nor a dispatch over a live one (ledger)."""
        tmp_path.chmod(0o700)
        agent = [*TOY, "--step-time", "0.2"]
        a = Host(tmp_path / "a", pg_url, "host-a", agent=agent, max_concurrent=8, stall_after="30s")
        b = Host(tmp_path / "b", pg_url, "host-b", agent=agent, max_concurrent=8, stall_after="30s")
        ids = [f"job-{i:02d}" for i in range(50)]
        new_tasks(a.store, ids, tmp_path, plan=2)  # type: ignore[arg-type]
        twins = Twins([a, b])
        try:
            a.start()
            b.start()

            def all_done() -> bool:
                return all(a.store.load(t).meta.status.value == "done" for t in ids)

            a.wait(all_done, "all 50 tasks done", timeout=300, interval=0.5)
        finally:
            found = twins.stop()
            for h in (a, b):
                h.stop()
                h.kill_agents()
        assert twins.samples > 10
        assert found == {}, f"tasks with two live agents: {found}"
        store = a.store
        for task_id in ids:
            events = store.ledger.events(task_id)  # type: ignore[attr-defined]
            assert ledger_twins(events) == [], task_id
            epochs = [e.epoch for e in events if e.kind == "dispatched"]
            assert epochs == sorted(set(epochs)), task_id
        by_host = [h for t in ids for h in hosts_of(store, t)]  # type: ignore[arg-type]
        assert set(by_host) == {"host-a", "host-b"}, by_host
        assert not store.ledger.events(kinds=["taken_over"])
        for h in (a, b):
            assert not h.lines("tick_failed") and not h.lines("task_failed")
            h.close()


class TestDeadHost:
    def test_a_dead_hosts_tasks_are_taken_over_within_lease_ttl_and_two_ticks(self, pair: tuple[Host, Host],
                                                                              tmp_path: Path) -> None:
        """SIGKILL one daemon and its agents (a host dies): the other daemon takes each task over (epoch+1,
        ``taken_over`` from that host) within lease_ttl + 2 ticks, and dispatches it on its own host."""
        a, b = pair
        ids = ["t1", "t2", "t3"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        a.start()
        a.wait(lambda: len(a.live_agents()) == 3, "host-a running all three")
        b.start()
        before = {t: a.store.load(t).meta.epoch for t in ids}
        time.sleep(TTL)  # host-b leaves host-a's renewed tasks alone meanwhile
        assert b.live_agents() == {} and not a.store.ledger.events(kinds=["taken_over"])
        a.kill(signal.SIGKILL)
        a.kill_agents()
        killed = datetime.now(UTC)

        def taken() -> list[Event]:
            found = a.store.ledger.events(kinds=["taken_over"])
            return found if len(found) == 3 else []

        events = a.wait(taken, "three takeovers", timeout=30)
        for e in events:
            assert e.data["from_host"] == "host-a" and e.data["to_host"] == "host-b"
            assert e.epoch == before[e.task] + 1
            late = (e.ts - killed).total_seconds()
            assert late <= TTL + 2 * TICK, f"{e.task} taken over {late:.2f}s after the host died"
        b.wait(lambda: len(b.live_agents()) == 3, "host-b running all three")
        for t in ids:
            baton = b.store.load(t)
            assert baton.meta.owner is not None and baton.meta.owner.host == "host-b"
            assert baton.meta.epoch == before[t] + 2
            assert hosts_of(b.store, t) == ["host-a", "host-b"]  # type: ignore[arg-type]


class TestPausedHost:
    def test_a_paused_hosts_agents_stop_before_the_takeover_and_resumed_it_writes_nothing(
            self, pair: tuple[Host, Host], tmp_path: Path) -> None:
        """A SIGSTOPped daemon's agents are stopped by their shims when its lease runs out, before the new
        host's agents start (issue 19 item 4; tests/external/test_no_two_agents.py has the agents' own records);
        resumed after its tasks were taken over, the daemon writes nothing for them; the new host's agents
        run on; a write at the old epoch is refused (exit 5)."""
        a, b = pair
        ids = ["p1", "p2"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        a.start()
        a.wait(lambda: len(a.live_agents()) == 2, "host-a running both")
        old = {t: a.store.load(t) for t in ids}
        old_groups = {g for groups in a.live_agents().values() for g in groups}
        b.start()
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)

        def launched_on_b() -> bool:
            owners = [b.store.load(t).meta.owner for t in ids]
            return all(o is not None and o.host == "host-b" and o.pid for o in owners) and len(b.live_agents()) == 2

        b.wait(launched_on_b, "host-b running both after the takeover", timeout=30)
        assert old_groups and a.live_agents() == {}  # stopped by their shims: no twin beside host-b's
        r = a.cli("touch", "p1", env={"HEARTBEAT_EPOCH": str(old["p1"].meta.epoch), "HEARTBEAT_STORE_URL": a.url})
        assert r.returncode == 5 and "superseded" in r.stderr
        revisions = {t: a.store.load(t).meta.revision for t in ids}
        last_event = max(e.id or 0 for e in a.store.ledger.events())
        resumed = len(a.log())
        a.proc.send_signal(signal.SIGCONT)
        a.wait(lambda: len(a.log()) > resumed, "host-a awake again")
        time.sleep(3 * TICK)  # a resumed daemon that wanted to write would have by now
        after = [e for e in a.store.ledger.events() if (e.id or 0) > last_event]
        assert after == [], [(e.task, e.kind, e.data) for e in after]
        assert {t: a.store.load(t).meta.revision for t in ids} == revisions
        assert a.live_agents() == {}
        assert not [e for e in a.log()[resumed:] if e.get("event") in ("dispatched", "exited", "tick_failed")]
        assert len(b.live_agents()) == 2
        for t in ids:
            owner = b.store.load(t).meta.owner
            assert owner is not None and owner.host == "host-b"
        assert a.proc is not None and a.proc.poll() is None


class TestPartition:
    def test_no_dispatch_while_the_database_is_gone_and_every_daemon_recovers(self, own_cluster: Cluster,
                                                                               tmp_path: Path) -> None:
        """The database stopped for longer than the lease: no daemon launches an agent while it cannot renew
        (their agents stop as the leases run out), each says so in one line and, the database back, one line
        again, neither crashes nor hangs, and every task runs again, still without twins."""
        from heartbeat.store.postgres.schema import upgrade

        url = own_cluster.create_db("partition")
        upgrade(url)
        tmp_path.chmod(0o700)
        hang = [*TOY, "--mode", "hang"]
        a = Host(tmp_path / "a", url, "host-a", agent=hang, max_concurrent=2)
        b = Host(tmp_path / "b", url, "host-b", agent=hang, max_concurrent=2)
        ids = ["n1", "n2", "n3", "n4"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        twins = Twins([a, b])
        try:
            a.start()
            b.start()
            a.wait(lambda: len(a.live_agents()) + len(b.live_agents()) == 4, "four agents over two hosts")
            assert len(a.live_agents()) == 2 and len(b.live_agents()) == 2
            before = {g for h in (a, b) for groups in h.live_agents().values() for g in groups}
            own_cluster.stop("fast")
            down_until = time.monotonic() + TTL + 3.0
            new_groups: set[int] = set()
            while time.monotonic() < down_until:
                now = {g for h in (a, b) for groups in h.live_agents().values() for g in groups}
                new_groups |= now - before
                time.sleep(0.1)
            assert new_groups == set(), "an agent was launched while the database was gone"
            assert a.live_agents() == {} and b.live_agents() == {}, "agents outlived their unrenewable leases"
            own_cluster.start()
            for h in (a, b):
                h.wait(lambda h=h: h.lines("store_reachable"), f"{h.host} back", timeout=60)
            a.wait(lambda: len(a.live_agents()) + len(b.live_agents()) == 4, "four agents again", timeout=60)
        finally:
            found = twins.stop()
            for h in (a, b):
                h.close()
            if not (Path(own_cluster.data) / "postmaster.pid").exists():
                own_cluster.start()
        assert found == {}, f"tasks with two live agents: {found}"
        for h in (a, b):
            assert len(h.lines("store_unreachable")) == 1, h.host
            assert len(h.lines("store_reachable")) == 1, h.host
            assert not h.lines("tick_failed") and not h.lines("non-json"), h.host
            assert h.proc is not None and h.proc.returncode == 0  # stopped by close(), not crashed


class TestGatesByHost:
    def test_a_file_gate_naming_a_host_is_opened_by_that_hosts_daemon_only(self, pair: tuple[Host, Host],
                                                                            tmp_path: Path) -> None:
        """Two daemons see the same file (one machine here); a `file:host-b:PATH` gate is evaluated and opened
        by host-b's daemon only, and a `file:PATH` gate by the task's owner host only."""
        a, b = pair
        flag = tmp_path / "flag"
        flag.touch()
        tasks.new_task(a.store, "named", task="t", step="s", workdir=str(tmp_path), blocked_on="the flag",
                       gate=Gate.parse(f"file:host-b:{flag}"))
        tasks.new_task(a.store, "owned", task="t", step="s", workdir=str(tmp_path), blocked_on="the flag",
                       gate=Gate.parse(f"file:{flag}"))
        with psycopg.connect(a.url, autocommit=True) as conn:  # host-a last held "owned"
            conn.execute("UPDATE heartbeat_batons SET owner_host = 'host-a' WHERE id = 'owned'")
        a.start()
        b.start()

        def unblocked(task_id: str) -> bool:
            return bool(a.store.ledger.events(task_id, kinds=["unblocked"]))

        a.wait(lambda: unblocked("named") and unblocked("owned"), "both gates opened", timeout=30)

        def opened(h: Host, task_id: str) -> bool:
            return any(e.get("task") == task_id and e.get("action") == "unblock" for e in h.lines("decision"))

        assert opened(b, "named") and not opened(a, "named")
        assert opened(a, "owned") and not opened(b, "owned")


def kill_host_lock(url: str) -> list[int]:
    """``pg_terminate_backend`` every connection holding a daemon's host-id lock (as a database restart,
    a failover or an idle timeout would end it); the backends' pids."""
    from heartbeat.store.postgres.store import _DAEMON_LOCK

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid, pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                            "AND classid::bigint = %s AND objsubid = 2", (_DAEMON_LOCK,)).fetchall()
    return [r[0] for r in rows]


def launch(h: Host) -> None:
    """Start ``h``'s daemon without waiting for it to start (it may be refused)."""
    import subprocess
    import sys

    log = open(h.log_path, "ab")  # noqa: SIM115
    h.proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(h.config), "run"],
                              stdout=log, stderr=subprocess.STDOUT, env=h.env(), cwd=str(h.root))
    log.close()


def agents_and_epochs(h: Host, ids: list[str]) -> tuple[dict[str, set[int]], dict[str, int]]:
    return h.live_agents(), {t: h.store.load(t).meta.epoch for t in ids}


class TestOneHostId:
    """Issue 17 item 5: the host-id lock is a session advisory lock, which dies with its connection. A
    second daemon with the same host id must never act beside the first: each would take the other's
    agents for its own (on two machines: settle them as gone, re-dispatch, and kill the other's)."""

    def test_a_second_daemon_is_refused_while_the_first_lives_though_its_lock_connection_died(
            self, pg_url: str, tmp_path: Path) -> None:
        """The first daemon's lock connection is terminated and a second daemon with its host id starts at
        once: the second is refused with one line and exits 1; the first keeps acting (takes its lock back),
        and no agent is stopped, re-dispatched or settled."""
        tmp_path.chmod(0o700)
        hang = [*TOY, "--mode", "hang"]
        a = Host(tmp_path / "a", pg_url, "host-x", agent=hang, max_concurrent=4)
        b = Host(tmp_path / "b", pg_url, "host-x", agent=hang, max_concurrent=4)
        ids = ["s1", "s2"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        try:
            a.start()
            a.wait(lambda: len(a.live_agents()) == 2, "host-x running both")
            a.wait(lambda: all(a.store.ledger.events(t, kinds=["launched"]) for t in ids), "both launched")
            agents, epochs = agents_and_epochs(a, ids)
            last_event = max(e.id or 0 for e in a.store.ledger.events())
            assert kill_host_lock(pg_url), "no daemon lock to terminate"
            launch(b)
            assert b.proc is not None
            b.wait(lambda: b.proc is not None and b.proc.poll() is not None, "the second daemon refused", timeout=30)
            assert b.proc.returncode == 1
            refusal = [e["line"] for e in b.log() if e.get("event") == "non-json"]
            assert len(refusal) == 1 and "another heartbeat daemon with host id 'host-x'" in refusal[0], refusal
            assert not b.lines("started") and not b.lines("dispatched")
            a.wait(lambda: a.lines("host_lock_retaken"), "the first daemon taking its lock back")
            time.sleep(TTL)  # the first daemon goes on; a twin would have settled or re-dispatched by now
            assert agents_and_epochs(a, ids) == (agents, epochs)
            assert a.proc is not None and a.proc.poll() is None
            assert not a.lines("host_taken") and not a.lines("fenced_agent_stopped")
            after = [e for e in a.store.ledger.events() if (e.id or 0) > last_event]
            assert after == [], [(e.task, e.kind, e.data) for e in after]
            # ...and with the lock back, the next one is refused by the lock itself.
            r = b.cli("run", "--once")
            assert r.returncode == 1 and "another heartbeat daemon with host id 'host-x'" in r.stderr
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        finally:
            for h in (a, b):
                h.close()

    def test_a_newcomer_holding_the_free_lock_waits_on_the_hosts_row_and_is_refused_when_it_renews(
            self, pg_url: str, tmp_path: Path) -> None:
        """The first daemon is paused and its lock connection terminated, so the second daemon takes the free
        lock; it finds the host's row renewed recently by another daemon and waits (host_busy, one line).
        Resumed, the first daemon renews its row: the second is refused in one line (exit 1) without ever
        acting, and the first takes its lock back and goes on, its agents untouched."""
        tmp_path.chmod(0o700)
        hang = [*TOY, "--mode", "hang"]
        a = Host(tmp_path / "a", pg_url, "host-x", agent=hang, max_concurrent=4, ttl=30.0)
        b = Host(tmp_path / "b", pg_url, "host-x", agent=hang, max_concurrent=4, ttl=30.0)
        ids = ["w1", "w2"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        try:
            a.start()
            a.wait(lambda: all(a.store.ledger.events(t, kinds=["launched"]) for t in ids), "both launched")
            agents, epochs = agents_and_epochs(a, ids)
            last_event = max(e.id or 0 for e in a.store.ledger.events())
            assert a.proc is not None
            a.proc.send_signal(signal.SIGSTOP)
            assert kill_host_lock(pg_url), "no daemon lock to terminate"
            launch(b)
            busy = b.wait(lambda: b.lines("host_busy"), "the second daemon waiting on the host's row", timeout=60)
            assert busy[0]["pid"] == a.proc.pid
            a.proc.send_signal(signal.SIGCONT)
            b.wait(lambda: b.proc is not None and b.proc.poll() is not None, "the second daemon refused", timeout=30)
            assert b.proc is not None and b.proc.returncode == 1
            refusal = [e["line"] for e in b.log() if e.get("event") == "non-json"]
            assert len(refusal) == 1 and f"(pid {a.proc.pid})" in refusal[0] and "renewed" in refusal[0], refusal
            assert not b.lines("started")
            a.wait(lambda: a.lines("host_lock_retaken"), "the first daemon taking its lock back")
            time.sleep(1.0)
            assert agents_and_epochs(a, ids) == (agents, epochs)
            assert a.proc.poll() is None and not a.lines("host_taken")
            after = [e for e in a.store.ledger.events() if (e.id or 0) > last_event]
            assert after == [], [(e.task, e.kind, e.data) for e in after]
        finally:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.send_signal(signal.SIGCONT)
            for h in (a, b):
                h.close()

    def test_a_paused_daemon_displaced_by_a_successor_stands_down_and_writes_nothing(
            self, pg_url: str, tmp_path: Path) -> None:
        """The first daemon is paused (SIGSTOP) and its lock connection terminated; a second daemon with its
        host id waits until the host's row is lease_ttl old, then becomes the host (by then the first's
        agents were stopped by their shims: their lease ran out, as it would for any host). The first,
        resumed, finds its row taken: it stands down with one line and exits 1, writing nothing and
        stopping no agent itself; the successor's agents run on."""
        tmp_path.chmod(0o700)
        hang = [*TOY, "--mode", "hang"]
        a = Host(tmp_path / "a", pg_url, "host-x", agent=hang, max_concurrent=4)
        b = Host(tmp_path / "b", pg_url, "host-x", agent=hang, max_concurrent=4)
        ids = ["p1", "p2"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        try:
            a.start()
            a.wait(lambda: len(a.live_agents()) == 2, "host-x running both")
            a.wait(lambda: all(a.store.ledger.events(t, kinds=["launched"]) for t in ids), "both launched")
            # and both dispatches logged, or the pause may fall between a ledger row and its log line
            a.wait(lambda: {e.get("task") for e in a.lines("dispatched")} >= set(ids), "both dispatches logged")
            agents = a.live_agents()
            assert a.proc is not None
            a.proc.send_signal(signal.SIGSTOP)
            assert kill_host_lock(pg_url), "no daemon lock to terminate"
            b.start()  # waits for "started": after the host's row went lease_ttl unrenewed
            b.wait(lambda: any(e.get("action") == "nothing" for e in b.lines("decision")), "host-x (b) looking")
            resumed = len(a.log())
            a.proc.send_signal(signal.SIGCONT)
            a.wait(lambda: a.proc is not None and a.proc.poll() is not None, "the displaced daemon exiting",
                   timeout=30)
            assert a.proc.returncode == 1
            taken = a.lines("host_taken")
            assert len(taken) == 1 and sorted(taken[0]["tasks"]) == ids
            assert any("took this host over" in e["line"] for e in a.log() if e.get("event") == "non-json")
            time.sleep(TTL)
            assert sorted(agents) == ids and a.live_agents() == {}  # their shims stopped them
            assert not a.lines("fenced_agent_stopped") and not b.lines("fenced_agent_stopped")
            acted = [e for e in a.log()[resumed:] if e.get("event") in ("dispatched", "launched", "exited", "raced")
                     or (e.get("event") == "decision" and e.get("action") != "nothing")]
            assert acted == [], json.dumps(acted)[:2000]
            assert sorted(b.live_agents()) == ids  # the successor's agents run on
            assert b.proc is not None and b.proc.poll() is None
            with psycopg.connect(pg_url) as conn:
                row = conn.execute("SELECT pid, stopped_at FROM heartbeat_hosts WHERE host = 'host-x'").fetchone()
            assert row == (b.proc.pid, None)  # the displaced daemon's stop did not mark its successor stopped
        finally:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.send_signal(signal.SIGCONT)
            for h in (a, b):
                h.close()

    def test_a_displaced_daemon_stops_only_its_agents_whose_task_moved_on(self, pg_url: str,
                                                                          tmp_path: Path) -> None:
        """As above, but the agents outlive the pause (their lease files say so, as for agents whose shims
        do not watch a lease: started by an older heartbeat) and while the first daemon is paused one task
        moves on to a new epoch (as a successor on another machine, which cannot see the agent, would
        re-dispatch it). Resumed and standing down, the first daemon stops that task's old agent (fenced:
        nobody supervises it) and leaves the other, which its successor adopted, alone; it writes nothing."""
        tmp_path.chmod(0o700)
        hang = [*TOY, "--mode", "hang"]
        a = Host(tmp_path / "a", pg_url, "host-x", agent=hang, max_concurrent=4)
        b = Host(tmp_path / "b", pg_url, "host-x", agent=hang, max_concurrent=4)
        ids = ["m1", "m2"]
        new_tasks(a.store, ids, tmp_path)  # type: ignore[arg-type]
        try:
            a.start()
            a.wait(lambda: all(a.store.ledger.events(t, kinds=["launched"]) for t in ids), "both launched")
            # and both dispatches logged: under load the SIGSTOP came between m2's ledger row and its log
            # line, which the resumed daemon then wrote, read below as an act after the pause
            a.wait(lambda: {e.get("task") for e in a.lines("dispatched")} >= set(ids), "both dispatches logged")
            old = a.live_agents()
            assert a.proc is not None
            a.proc.send_signal(signal.SIGSTOP)
            far = time.clock_gettime(time.CLOCK_BOOTTIME) + 3600
            for lease_file in (a.state / "logs").glob("*/*.lease"):
                lease_file.write_text(json.dumps({"term_at": far, "kill_at": far}))
            assert kill_host_lock(pg_url), "no daemon lock to terminate"
            b.start()
            with a.store.edit("m1", actor="test") as ed:  # m1 moves on: its running agent is fenced
                ed.baton.meta.epoch += 1
                ed.baton.meta.owner = None
            resumed = len(a.log())
            a.proc.send_signal(signal.SIGCONT)
            a.wait(lambda: a.proc is not None and a.proc.poll() is not None, "the displaced daemon exiting",
                   timeout=30)
            assert a.proc.returncode == 1
            # m1's agent is stopped: by this daemon's fence (fenced_agent_stopped), or already by its own
            # shim, whose lease watch stops an agent whose host's lease lapsed before the daemon wakes
            stopped = a.lines("fenced_agent_stopped")
            assert [e["task"] for e in stopped] in (["m1"], []) and all(e["gone"] is True for e in stopped), \
                json.dumps([e for e in a.log()[resumed:] if e.get("event") not in ("tick",)])[:3000]
            # m2's agent is the displacing daemon's to keep, unless its lease file (this daemon's, whose
            # renewals stopped) lapsed first: then its shim stopped it too, as on any host frozen past
            # its ttl. Never is an agent of a moved-on task left running.
            now = a.live_agents()
            assert "m1" not in now and now.get("m2") in (old["m2"], None)
            acted = [e for e in a.log()[resumed:] if e.get("event") in ("dispatched", "launched", "exited", "raced")
                     or (e.get("event") == "decision" and e.get("action") != "nothing")]
            assert acted == [], json.dumps(acted)[:2000]
        finally:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.send_signal(signal.SIGCONT)
            for h in (a, b):
                h.close()


class TestFrozenWriter:
    """Issue 19 item 3: takeover skips locked rows, and nothing bounded a paused session's locks: a daemon
    SIGSTOPped (or cut off) inside a transaction pinned its task for as long as the session lived."""

    def test_a_task_locked_by_a_frozen_writer_is_taken_over_once_its_session_times_out(
            self, pair: tuple[Host, Host], tmp_path: Path) -> None:
        """A writer holds a task's row lock inside a heartbeat edit and is SIGSTOPped there; the task's host
        dies. The server ends the frozen session after idle_in_transaction_session_timeout (shortened to 2 s
        in the frozen process, as any heartbeat session sets it), and the other host takes the task over; the
        frozen writer, resumed, writes nothing."""
        import subprocess
        import sys
        import textwrap

        a, b = pair
        new_tasks(a.store, ["f1"], tmp_path)  # type: ignore[arg-type]
        a.start()
        a.wait(lambda: len(a.live_agents()) == 1, "host-a running f1")
        b.start()
        code = textwrap.dedent(f"""
            import os, signal, sys
            from heartbeat.model import defaults
            defaults.PG_IDLE_IN_TRANSACTION_TIMEOUT = 2.0
            from heartbeat.store.postgres.store import PostgresStore
            store = PostgresStore({a.url!r})
            with store.edit("f1", actor="frozen") as ed:
                ed.baton.step = "written by a frozen writer"
                print("locked", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        """)
        frozen = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=a.env())
        try:
            assert frozen.stdout is not None and frozen.stdout.readline().strip() == "locked", frozen.communicate()
            a.wait(lambda: psutil_status(frozen.pid) == "stopped", "the writer frozen inside its transaction")
            a.kill(signal.SIGKILL)
            a.kill_agents()
            b.wait(lambda: a.store.ledger.events("f1", kinds=["taken_over"]), "f1 taken over", timeout=30)
            b.wait(lambda: len(b.live_agents()) == 1, "host-b running f1")
            frozen.send_signal(signal.SIGCONT)
            _, err = frozen.communicate(timeout=30)
            assert frozen.returncode != 0, err  # its commit failed: the server had ended its session
            assert a.store.load("f1").step != "written by a frozen writer"
        finally:
            if frozen.poll() is None:
                frozen.send_signal(signal.SIGCONT)
                frozen.kill()
                frozen.wait()


def psutil_status(pid: int) -> str:
    import psutil

    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return ""
