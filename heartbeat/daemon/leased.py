"""The daemon's lease part: what the loop calls on a store shared by daemons on many hosts.

The primitives (claim with ``FOR UPDATE SKIP LOCKED``, one-statement renewal, takeover,
fencing) are :mod:`heartbeat.lease`'s; this part wires them to the loop:

- :meth:`LeasePart.start`: become this host id's daemon (:meth:`heartbeat.lease.Lease.take_host`:
  refused while another daemon with the same host id renews the host's row);
- :meth:`LeasePart.acting`: whether this daemon still is its host's (checked before every look):
  one that another daemon with its host id displaced stands down, acts no more and exits;
- :meth:`LeasePart.before_pass`: take over the tasks of hosts whose lease expired (within
  the free capacity), before the pass's scan sees them;
- :meth:`LeasePart.after_scan`: the tasks whose agents run here are the ones renewed; a task
  that left this host with its agent still alive has been taken over: the agent is stopped;
- :meth:`LeasePart.held_elsewhere`: a task whose agent runs on another host is not judged
  here (liveness is local);
- :meth:`LeasePart.gate_here`: a ``file:``/``check:`` gate is evaluated by one host only;
- :meth:`LeasePart.claimed`: of the admitted dispatches, the ones this host holds now;
- :meth:`LeasePart.launched`: a dispatch of this host is renewed from now on;
- :meth:`LeasePart.renew` (the service's job) and :meth:`LeasePart.unreachable` (a pass that
  could not reach the database: said once, with no traceback).

On the file store (one host, no leases) :func:`lease_part` returns None and the loop runs
exactly as before.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from heartbeat import defaults
from heartbeat.baton import Baton, Gate, Owner
from heartbeat.daemon.shared import Shared
from heartbeat.lease import Lease, for_store, resolve_host

__all__ = ["LeasePart", "lease_part", "renew_interval"]


def renew_interval(shared: Shared) -> float:
    """How often leases renew: every tick, and at least three times per ``lease_ttl``."""
    d = shared.config.daemon
    return min(d.tick, d.lease_ttl / 3)


def lease_part(shared: Shared) -> LeasePart | None:
    """The lease part of a daemon on a shared store; None on the file store."""
    return LeasePart(shared) if for_store(shared.store) else None


class LeasePart:
    """See the module docstring."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        d = shared.config.daemon
        self.lease = Lease(shared.store, host=shared.host, labels=d.labels, ttl=d.lease_ttl,  # type: ignore[arg-type]
                           capacity=d.max_concurrent, interval=renew_interval(shared), log=shared.log,
                           stop_agent=self._stop_fenced, on_stood_down=self._stood_down)
        self.on_stood_down: Any = lambda: None
        """Set by the service: stop the daemon (another daemon with this host id is the host now)."""
        self._fencing: set[tuple[str, int]] = set()
        self._fence_lock = threading.Lock()  # never the look lock: a pass may hang on an unreachable database

    # -- the loop's calls (under the look lock) --------------------------------------------

    def acting(self) -> bool:
        return self.lease.acting()

    @property
    def stood_down(self) -> bool:
        return self.lease.stood_down

    def before_pass(self) -> None:
        self.lease.take_over(self.shared.config.daemon.max_concurrent - len(self.shared.running))

    def after_scan(self, entries: Any) -> None:
        self.lease.observe(entries)

    def held_elsewhere(self, baton: Baton) -> str:
        held = self.lease.held_elsewhere(baton)
        if held:
            self.shared.running.pop(baton.id, None)
        return held

    def gate_here(self, task_id: str, gate: Gate) -> bool:
        return self.shared.gates.evaluates(gate, here=self.shared.host, owner_host=self.lease.owner_host(task_id))

    def claimed(self, task_ids: list[str]) -> set[str]:
        return set(self.lease.claim(task_ids))

    def launched(self, task_id: str, epoch: int, owner: Owner) -> None:
        self.lease.supervise(task_id, epoch, owner)

    # -- the service's calls ----------------------------------------------------------------

    def reconfigure(self) -> None:
        """A reload: labels, capacity and lease_ttl apply from the next renewal; the host id stays
        (it names this daemon's leases: changing it needs a restart)."""
        d = self.shared.config.daemon
        lease = self.lease
        lease.labels, lease.capacity, lease.ttl = sorted(set(d.labels)), d.max_concurrent, d.lease_ttl
        lease.interval = renew_interval(self.shared)
        if resolve_host(d.host) != self.shared.host:
            self.shared.log.error("reload_partial", key="daemon.host", keeping=self.shared.host,
                                  reason="the host id names this daemon's leases: restart the daemon to change it")

    def start(self) -> None:
        """Become this host id's daemon and register (the first renewal: claims wait for one);
        :class:`~heartbeat.errors.StoreError` when another daemon with this host id is live."""
        self.lease.take_host()

    def start_watch(self) -> None:
        self.lease.start_watch()

    def renew(self) -> None:
        try:
            self.lease.renew(len(self.shared.running))
        except Exception as exc:  # the renewal job must keep running whatever one renewal hit
            self.shared.log.exception("renew_failed", error=repr(exc))

    def unreachable(self, exc: BaseException) -> None:
        self.lease.unreachable(exc)

    def close(self) -> None:
        self.lease.close()

    def _stood_down(self) -> None:
        """The fenced agents' stops under way finish before the daemon stops (its pool drops queued work)."""
        deadline = time.monotonic() + max((lc.stop_grace for lc in self.shared.config.launchers.values()),
                                          default=defaults.STOP_GRACE) + defaults.FENCE_STOP_WAIT
        while time.monotonic() < deadline:
            with self._fence_lock:
                if not self._fencing:
                    break
            time.sleep(0.05)
        self.on_stood_down()

    # -- fenced agents ----------------------------------------------------------------------

    def _stop_fenced(self, task_id: str, epoch: int, owner: Owner) -> None:
        """Stop an agent of this host whose task moved on (taken over, or this host's leases ran
        out): its writes are refused already, and nothing is written for it (another host holds it)."""
        sh = self.shared
        launcher = sh.launcher_named(owner.launcher)
        if launcher is None or not launcher.alive(owner):
            return
        key = (task_id, epoch)
        with self._fence_lock:
            if key in self._fencing:
                return
            self._fencing.add(key)
        lc = sh.config.launchers.get(owner.launcher)
        grace = lc.stop_grace if lc else defaults.STOP_GRACE

        def stop() -> None:
            try:
                gone = bool(launcher.stop(owner, grace=grace))
            except Exception as exc:  # a stop must never kill the worker thread
                sh.log.error("stop_failed", task=task_id, error=repr(exc))
                gone = False
            sh.log.warning("fenced_agent_stopped", task=task_id, epoch=epoch, pid=owner.pid, gone=gone,
                           reason="the task moved on to another host or epoch; nothing is written for it")
            with self._fence_lock:
                self._fencing.discard(key)

        sh.pool.submit(stop)
