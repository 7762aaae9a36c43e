"""A lost host's tasks move on at once: taken over on the lease's cadence, dispatched without
backoff, no attempt charged, shown as their own state (issue 26, item 3).

Two real daemons on the throwaway cluster with a 30 s tick (the takeover must not wait for it)
and a backoff of an hour (a takeover that counted as a failed attempt would wait it out).
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from daemon_harness import TOY

from heartbeat.model.baton import Baton, Meta, Owner, OwnerKind, Status
from heartbeat.model.policy import TAKEN_OVER, Action, Observation, Policy, decide
from heartbeat.model.timeparse import utcnow
from heartbeat.reports.why import State, why
from tests.external.test_leased_daemons import Host, new_tasks

pytestmark = pytest.mark.slow

TTL = 4.0
"""The hosts' lease_ttl. At 2 s a host starved of CPU for 2 s (four pytest workers on 2 cores) lost its
own lease at start: its shims stopped host-a's first agents and it dispatched them again, and the
dispatch history this test pins read host-a, host-a, host-b."""
SLOW_TICK = "30s"


class SlowHost(Host):
    """A :class:`Host` with a long tick and an hour's backoff."""

    def config_text(self) -> str:
        text = super().config_text()
        text = text.replace('tick = "200ms"', f'tick = "{SLOW_TICK}"', 1)
        return text.replace('backoff_initial = "200ms"', 'backoff_initial = "1h"', 1).replace(
            'backoff_max = "1s"', 'backoff_max = "2h"', 1)


class TestLostHost:
    def test_a_lost_hosts_tasks_are_dispatched_within_lease_ttl_whatever_the_tick(self, pg_url: str,
                                                                               tmp_path: Path) -> None:
        """SIGKILL host-a (and its agents): host-b, ticking every 30 s, takes each task over and has its
        agent running within lease_ttl + 3 s; the dispatch is attempt 1 again (nothing charged) and
        did not wait the hour of backoff."""
        tmp_path.chmod(0o700)
        hang = [*TOY, "--mode", "hang"]
        a = SlowHost(tmp_path / "a", pg_url, "host-a", agent=hang, max_concurrent=4, ttl=TTL)
        b = SlowHost(tmp_path / "b", pg_url, "host-b", agent=hang, max_concurrent=4, ttl=TTL)
        try:
            ids = ["t1", "t2"]
            new_tasks(a.store, ids, tmp_path)
            a.start()
            a.wait(lambda: len(a.live_agents()) == 2, "host-a running both")
            b.start()
            time.sleep(TTL)  # b's first tick is behind it: the takeover cannot ride on it
            a.kill(signal.SIGKILL)
            a.kill_agents()
            killed = time.monotonic()
            killed_at = datetime.now(UTC)
            b.wait(lambda: len(b.live_agents()) == 2, "host-b running both", timeout=TTL + 30)
            late = time.monotonic() - killed
            assert late <= TTL + 3, f"host-b's agents ran {late:.1f}s after host-a died"
            for t in ids:
                dispatched = b.store.ledger.events(t, kinds=["dispatched"])
                assert [e.data["host"] for e in dispatched] == ["host-a", "host-b"]
                assert [e.data["attempt"] for e in dispatched] == [1, 1], "the lost host charged an attempt"
                [taken] = b.store.ledger.events(t, kinds=["taken_over"])
                assert taken.ts >= killed_at
                assert b.store.load(t).meta.attempt == 1
        finally:
            for h in (a, b):
                h.close()


class TestTakenOverState:
    """Between the takeover and its dispatch the task says so (not a running agent on the lost host)."""

    def taken_over(self, attempt: int = 2) -> Baton:
        b = Baton(task="t", step="s", meta=Meta(id="t"))
        b.meta.dispatches, b.meta.attempt, b.meta.epoch = 3, attempt, 4
        b.meta.last_failure = f"{TAKEN_OVER}host host-a stopped renewing its lease (12s ago)"
        b.meta.ended_at = utcnow()
        return b

    def test_a_taken_over_task_is_dispatched_at_once(self) -> None:
        """Attempt 2 after an earlier crash, ended a moment ago, an hour's backoff: dispatched now."""
        b = self.taken_over()
        d = decide(b, Observation(), utcnow(), Policy(backoff_initial=3600, backoff_max=7200))
        assert d.action is Action.DISPATCH and d.reason.startswith(TAKEN_OVER)

    def test_status_names_the_takeover(self) -> None:
        b = self.taken_over()
        w = why(b, utcnow(), Policy())
        assert w.state is State.TAKEN_OVER
        assert w.text == "taken over: host host-a stopped renewing its lease (12s ago); dispatching"

    def test_once_dispatched_it_is_running(self) -> None:
        b = self.taken_over()
        b.meta.owner = Owner(pid=123, how=OwnerKind.DISPATCH, host="host-b")
        assert why(b, utcnow(), Policy()).state is State.RUNNING
        assert b.meta.status is Status.ACTIVE
