"""No two agents of a task at once across hosts (issue 19 item 4), for real: two daemons with
different host ids on one throwaway PostgreSQL database, real agents under the real shim.

Host A runs the task's agent; then A's daemon is SIGKILLed, SIGSTOPped, or cut off from the
database (its role may no longer log in and ``pg_terminate_backend`` ends its sessions, so every
reconnection fails). Host B takes the task over once A's lease expired and starts a replacement.
The agents themselves append ``start``/``stop`` lines (the system-wide monotonic clock) to one
shared file: the proof comes from the agents' own records, not from heartbeat's. The old agent
must have stopped (its shim, watching its host's lease file, stopped it) before the replacement
started. At c31a8a9 nothing stopped an agent whose daemon was killed or paused: it ran on beside
its replacement.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_harness import DaemonHarness

from heartbeat.store.postgres.store import PostgresStore
from heartbeat.tasks import verbs as tasks

pytestmark = pytest.mark.slow

TICK = 0.2
TTL = 6.0

AGENT = textwrap.dedent("""\
    import os, signal, sys, time

    def note(what):
        line = "%s %s %s %s %d\\n" % (what, os.environ["HEARTBEAT_TASK"], os.environ["HEARTBEAT_EPOCH"],
                                      os.environ["HEARTBEAT_STATE_DIR"], time.monotonic_ns())
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, line.encode())
        os.close(fd)

    def stop(signum, frame):
        note("stop")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    note("start")
    while True:
        time.sleep(3600)
""")
"""An agent that records when it starts and when it is stopped (SIGTERM), and otherwise works on."""


class Host(DaemonHarness):
    """A daemon with its own host id, state dir and database role on the shared store."""

    def __init__(self, root: Path, daemon_url: str, url: str, host: str, agent: list[str], ttl: float = TTL) -> None:
        self.host = host
        self.ttl = ttl
        root.mkdir(mode=0o700, exist_ok=True)
        super().__init__(root, tick=f"{int(TICK * 1000)}ms", stall_after="1h", max_concurrent=4,
                         dispatches_per_minute=6000, agent=agent, extra=f"[store]\nurl = {json.dumps(daemon_url)}\n")
        self.store.close()
        self.store = PostgresStore(url)  # type: ignore[assignment]  # the test's own view, as the superuser

    def config_text(self) -> str:
        return super().config_text().replace(
            'log_level = "debug"\n', f'log_level = "debug"\nhost = "{self.host}"\nlease_ttl = "{self.ttl}s"\n', 1)


def role_url(url: str, role: str) -> str:
    """``url`` with another user (the cluster trusts local connections)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


def make_role(url: str, role: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')  # type: ignore[arg-type]  # the test's own name
        conn.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')  # type: ignore[arg-type]
        conn.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')  # type: ignore[arg-type]


def cut_role(url: str, role: str) -> int:
    """The role may not log in any more, and its sessions end: every reconnection fails."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER ROLE "{role}" NOLOGIN')  # type: ignore[arg-type]
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                            (role,)).fetchall()
    return len(rows)


def records(path: Path) -> list[tuple[str, str, int, str, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        what, task, epoch, state, ns = line.split(" ")
        out.append((what, task, int(epoch), state, int(ns)))
    return out


def intervals(path: Path) -> list[tuple[str, int, str, int, float]]:
    """(task, epoch, state dir, start ns, stop ns or +inf while still running) of every agent."""
    starts: dict[tuple[str, int, str], int] = {}
    stops: dict[tuple[str, int, str], int] = {}
    for what, task, epoch, state, ns in records(path):
        (starts if what == "start" else stops)[(task, epoch, state)] = ns
    return [(k[0], k[1], k[2], ns, stops.get(k, float("inf"))) for k, ns in sorted(starts.items(), key=lambda i: i[1])]


def overlaps(path: Path) -> list[str]:
    found = []
    spans = intervals(path)
    for i, (task, epoch, state, start, stop) in enumerate(spans):
        for task2, epoch2, state2, start2, stop2 in spans[i + 1:]:
            if task2 == task and start2 < stop and start < stop2:
                ran = "still running" if stop == float("inf") else f"stopped {(stop - start2) / 1e9:.2f}s after"
                found.append(f"{task}: epoch {epoch} ({Path(state).parent.name}) {ran} epoch {epoch2} "
                             f"({Path(state2).parent.name}) started")
    return found


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[tuple[Host, Host, Path, str]]:
    tmp_path.chmod(0o700)
    record = tmp_path / "agents.txt"
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    agent = [sys.executable, str(script), str(record)]
    role = f"host_a_{os.getpid()}_{time.monotonic_ns()}"
    make_role(pg_url, role)
    a = Host(tmp_path / "a", role_url(pg_url, role), pg_url, "host-a", agent)
    b = Host(tmp_path / "b", pg_url, pg_url, "host-b", agent)
    yield a, b, record, role
    for h in (a, b):
        if h.proc is not None and h.proc.poll() is None:
            h.proc.send_signal(signal.SIGCONT)  # a paused daemon must be able to hear SIGTERM
        h.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the role is the cluster's: leave none behind
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        conn.execute(f'DROP OWNED BY "{role}"')  # type: ignore[arg-type]
        conn.execute(f'DROP ROLE "{role}"')  # type: ignore[arg-type]


@pytest.mark.parametrize("seam", ["sigkill", "sigstop", "cut"])
def test_the_old_agent_stops_before_its_replacement_starts(fleet: tuple[Host, Host, Path, str], pg_url: str,
                                                           tmp_path: Path, seam: str) -> None:
    """Host A's agent runs; A's daemon is SIGKILLed, SIGSTOPped or cut off from the database (kept failing);
    host B takes the task over and starts a replacement; by the agents' own records the old agent had
    stopped before the replacement started (its shim stopped it when A's lease ran out unrenewed)."""
    a, b, record, role = fleet
    tasks.new_task(a.store, "job", task="work", step="start", workdir=str(tmp_path))
    a.start()
    a.wait(lambda: [r for r in records(record) if r[0] == "start"], "host-a's agent started")
    b.start()
    time.sleep(TTL)  # a live host keeps its task: no stop, no takeover (A's lease is renewed, by file too)
    assert [r[0] for r in records(record)] == ["start"], records(record)
    assert not a.store.ledger.events(kinds=["taken_over"])
    assert a.proc is not None
    if seam == "sigkill":
        a.kill(signal.SIGKILL)
    elif seam == "sigstop":
        a.proc.send_signal(signal.SIGSTOP)
    else:
        assert cut_role(pg_url, role) > 0, "no session of host-a to terminate"

    def replaced() -> list[Any]:
        return [r for r in records(record) if r[0] == "start" and r[3] == str(b.state)]

    b.wait(replaced, "host-b's replacement agent started", timeout=8 * TTL)
    assert [e.data["to_host"] for e in a.store.ledger.events("job", kinds=["taken_over"])] == ["host-b"]
    time.sleep(2 * TICK)
    assert overlaps(record) == []
    old = [s for s in intervals(record) if s[2] == str(a.state)]
    assert len(old) == 1 and old[0][4] != float("inf"), old
    assert len(b.live_agents().get("job", set())) == 1 and a.live_agents() == {}
    if seam == "sigstop":  # resumed, A writes nothing for the task and leaves B's agent alone
        a.proc.send_signal(signal.SIGCONT)
        time.sleep(TTL)
        assert len(b.live_agents().get("job", set())) == 1
        assert overlaps(record) == []
    if seam != "cut":  # (cut off, A's daemon itself also stops its agents when its leases run out)
        logs = sorted((tmp_path / "a" / "state" / "logs" / "job").glob("*.log"))
        assert any("its host's lease on the task ran out" in p.read_text() for p in logs), \
            [p.read_text()[-500:] for p in logs]


def test_a_daemon_restarted_at_once_keeps_its_agent(pg_url: str, tmp_path: Path) -> None:
    """A clean stop leaves the agent running; a daemon started again before the agent's SIGTERM takes
    the host's row at once, re-adopts the agent and renews its lease file: the agent is never stopped,
    though it outlives the lease it had when its first daemon stopped."""
    tmp_path.chmod(0o700)
    record = tmp_path / "agents.txt"
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    ttl = 30.0  # SIGTERM 28 s after the last renewal: a restart took 6.4 s here at load 20
    a = Host(tmp_path / "a", pg_url, pg_url, "host-a", [sys.executable, str(script), str(record)], ttl=ttl)
    try:
        tasks.new_task(a.store, "job", task="work", step="start", workdir=str(tmp_path))
        a.start()
        a.wait(lambda: [r for r in records(record) if r[0] == "start"], "the agent started")
        assert a.stop() == 0
        stopped = time.monotonic()
        a.start()
        time.sleep(max(0.0, stopped + ttl + 2 - time.monotonic()))  # past the lease the agent had at the stop
        assert [r[0] for r in records(record)] == ["start"], records(record)
        assert len(a.live_agents().get("job", set())) == 1
        assert not a.store.ledger.events("job", kinds=["taken_over", "exited", "stalled"])
    finally:
        a.close()


def test_a_frozen_host_s_agent_never_acts_after_the_thaw(fleet: tuple[Host, Host, Path, str], tmp_path: Path) -> None:
    """Issue 24 item 13: host A's daemon, shim and agent all SIGSTOPped (a paused container) until host B's
    replacement runs, then resumed: by the agents' own records the old agent does nothing after the
    replacement started. The shim wakes last, after A's daemon met the moved lease: the daemon, too, must
    SIGKILL an agent past its lease's kill deadline, never SIGTERM it (the shim's own thaw, woken first, is
    tests/system/test_shim_lease.py's). At 4c852cf the shim sent SIGTERM; at c0406c2 the daemon did, when
    it woke before the shim (one loaded run in about eight): the old agent's handler recorded its stop
    after the replacement's start."""
    import psutil

    a, b, record, _ = fleet
    tasks.new_task(a.store, "job", task="work", step="start", workdir=str(tmp_path))
    a.start()
    a.wait(lambda: [r for r in records(record) if r[0] == "start"], "host-a's agent started")
    b.start()
    assert a.proc is not None
    group = next(iter(a.wait(lambda: a.live_agents("job").get("job"), "host-a's agent group")))
    shim = group  # the shim leads the agent's process group
    frozen = [a.proc.pid, *(p.pid for p in psutil.process_iter() if _pgid(p.pid) == group)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        b.wait(lambda: [r for r in records(record) if r[0] == "start" and r[3] == str(b.state)],
               "host-b's replacement agent started", timeout=8 * TTL)
        for pid in reversed(frozen):  # the agent first, then the daemon; its shim stays frozen
            if pid != shim:
                os.kill(pid, signal.SIGCONT)
        a.wait_log(lambda e: e.get("event") == "fenced_agent_stopped", "host-a's daemon stopped its fenced agent")
    finally:
        for pid in reversed(frozen):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    a.wait(lambda: a.live_agents("job") == {}, "host-a's agent gone after the thaw")
    time.sleep(4 * TICK)  # (room for a late record of the old agent, were one coming)
    replacement = min(r[4] for r in records(record) if r[0] == "start" and r[3] == str(b.state))
    late = [r for r in records(record) if r[3] == str(a.state) and r[4] > replacement]
    assert late == [], late
    assert len(b.live_agents().get("job", set())) == 1


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
