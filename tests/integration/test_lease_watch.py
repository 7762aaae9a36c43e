"""The lease watch (heartbeat.ops.lease, ``Lease._watch_loop``) in this process, on a fake shared store:
the thread that stops a host's agents when its leases run out unrenewed, whatever holds the renewals up."""

from __future__ import annotations

import threading
import time
from typing import Any

from conftest import wait_for

from heartbeat.model.baton import Owner, OwnerKind
from heartbeat.ops.lease import Lease
from heartbeat.store.base import Renewal


class Log:
    """The daemon's log as the lease sees it: each call kept as (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [fields for _, event, fields in self.lines if event == name]


class SharedStub:
    """What the watch and one renewal ask of a shared store: every renewal renews every lease."""

    label = "stub"

    def keep_daemon_lock(self) -> str:
        return ""

    def renew_leases(self, renewal: Renewal) -> tuple[bool, list[str]]:
        return True, list(renewal.ids)

    def host_stopped(self, host: str, pid: int, started: Any) -> None:
        return None


def test_leases_run_out_while_nothing_renews_them_stop_the_agents() -> None:
    """One renewal, then none (the renewal job stuck in a takeover on a database that stopped answering
    right after it, the loop's pass stuck on it too): past the fence deadline the watch stops the agent
    and says ``leases_expired``. Before, with no renewal in flight it waited for "the next renewal, about
    to run", which never came: a partitioned host under load left its agents to their shims, unsaid
    (tests/external/test_tcp_partition.py, one fresh clone in four)."""
    stopped: list[tuple[str, int]] = []
    log = Log()
    lease = Lease(SharedStub(), host="h", labels=[], ttl=0.9, capacity=4, interval=0.1, log=log,  # type: ignore[arg-type]
                  stop_agent=lambda task, epoch, owner: stopped.append((task, epoch)))
    lease.supervise("t", 1, Owner(pid=999999, how=OwnerKind.DISPATCH))
    try:
        assert lease.renew(1)
        renewed = time.monotonic()
        lease.start_watch()
        wait_for(lambda: stopped, timeout=10, interval=0.02, message="the agent stopped by the watch")
        assert stopped == [("t", 1)]
        assert time.monotonic() - renewed >= 0.8  # not before the fence deadline (ttl - interval)
        [said] = log.events("leases_expired")
        assert said["tasks"] == ["t"]
    finally:
        lease.close()


def test_a_renewal_in_flight_answers_first() -> None:
    """A renewal that hangs is given its renewal interval from its start before the watch fences (then
    the watch does not wait on it for ever)."""
    stopped: list[tuple[str, int]] = []
    log = Log()
    release = threading.Event()

    class Hanging(SharedStub):
        calls = 0

        def renew_leases(self, renewal: Renewal) -> tuple[bool, list[str]]:
            self.calls += 1
            if self.calls > 1:
                release.wait(10)
            return True, list(renewal.ids)

    lease = Lease(Hanging(), host="h", labels=[], ttl=0.9, capacity=4, interval=0.1, log=log,  # type: ignore[arg-type]
                  stop_agent=lambda task, epoch, owner: stopped.append((task, epoch)))
    lease.supervise("t", 1, Owner(pid=999999, how=OwnerKind.DISPATCH))
    try:
        assert lease.renew(1)
        lease.start_watch()
        hung = threading.Thread(target=lease.renew, daemon=True)
        hung.start()
        wait_for(lambda: stopped, timeout=10, interval=0.02, message="the agent stopped while the renewal hangs")
        assert log.events("leases_expired")
    finally:
        release.set()
        lease.close()
