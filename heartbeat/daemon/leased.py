"""The daemon's lease part: what the loop calls on a store shared by daemons on many hosts.

The primitives (claim with ``FOR UPDATE SKIP LOCKED``, one-statement renewal, takeover,
fencing) are :mod:`heartbeat.ops.lease`'s; this part wires them to the loop:

- :meth:`LeasePart.start`: become this host id's daemon (:meth:`heartbeat.ops.lease.Lease.take_host`:
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
- :meth:`LeasePart.lease_file`: before a launch, the agent's lease file (``logs/<id>/<epoch>.lease``):
  its shim stops the agent when the deadlines in it pass unrenewed, whatever became of this daemon;
  every renewal that renews the agent's epoch rewrites it (:meth:`LeasePart._renewed`);
- :meth:`LeasePart.launched`: a dispatch of this host is renewed from now on;
- :meth:`LeasePart.renew` (the service's job) and :meth:`LeasePart.unreachable` (a pass that
  could not reach the database: said once, with no traceback).

On the file store (one host, no leases) :func:`lease_part` returns None and the loop runs
exactly as before.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from heartbeat.daemon.shared import Shared
from heartbeat.daemon.vitals import Vitals
from heartbeat.launchers.base import LaunchError, kill_now, open_log_dir
from heartbeat.launchers.shim import lease_clock, read_lease
from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Gate, Owner
from heartbeat.ops.lease import Lease, for_store, resolve_host
from heartbeat.system.safefile import write_atomic

__all__ = ["LeasePart", "lease_part", "renew_interval"]


def renew_interval(shared: Shared) -> float:
    """How often leases renew: every tick, and at least three times per ``lease_ttl``."""
    d = shared.config.daemon
    return min(d.tick, d.lease_ttl / 3)


def lease_part(shared: Shared, *, vitals: Vitals, on_stood_down: Callable[[], None]) -> LeasePart | None:
    """The lease part of a daemon on a shared store; None on the file store."""
    return LeasePart(shared, vitals=vitals, on_stood_down=on_stood_down) if for_store(shared.store) else None


class LeasePart:
    """See the module docstring."""

    def __init__(self, shared: Shared, *, vitals: Vitals, on_stood_down: Callable[[], None]) -> None:
        self.shared = shared
        d = shared.config.daemon
        self.lease = Lease(shared.store, host=shared.host, labels=d.labels, ttl=d.lease_ttl,  # type: ignore[arg-type]
                           capacity=d.max_concurrent, interval=renew_interval(shared), log=shared.log,
                           stop_agent=self._stop_fenced, on_stood_down=self._stood_down, on_renewed=self._renewed)
        self.on_stood_down = on_stood_down
        """The service's: stop the daemon (another daemon with this host id is the host now)."""
        self.vitals = vitals
        """Where takeovers and renewals are counted (the daemon's, which /metrics reads)."""
        self.vitals.lease_ttl = self.lease.ttl  # the fleet's series from the first scrape, before a renewal
        self._fencing: set[tuple[str, int]] = set()
        self._fenced: dict[tuple[str, int], None] = {}
        """(task, epoch) of the agents stopped here for their lease (the last few hundred): their
        exit is not their own (:meth:`stopped_for_lease`)."""
        self._fence_lock = threading.Lock()  # never the look lock: a pass may hang on an unreachable database

    # -- the loop's calls (under the look lock) --------------------------------------------

    def acting(self) -> bool:
        return self.lease.acting()

    @property
    def stood_down(self) -> bool:
        return self.lease.stood_down

    def before_pass(self) -> None:
        self.take_over()

    def take_over(self) -> None:
        """Take over the tasks of hosts whose lease expired (within the free capacity) and have each
        looked at at once: before a pass, and after each renewal, so a lost host's tasks move on
        within ``lease_ttl`` and a renewal interval whatever the tick (any thread)."""
        for taken in self.lease.take_over(self.shared.config.daemon.max_concurrent - len(self.shared.running)):
            self.vitals.took_over(taken.from_host)
            self.shared.pokes.poke_now(taken.task)

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

    # -- the agents' lease files ------------------------------------------------------------

    def lease_file(self, task_id: str, epoch: int) -> str:
        """Write the lease file of the agent about to be launched for ``task_id`` at ``epoch`` (its
        deadlines from the claim) and return its path; :class:`LaunchError` when this daemon holds no
        lease on the task any more or the file cannot be written (no agent without its watch)."""
        deadlines = self.lease.launch_deadlines(task_id)
        if deadlines is None:
            raise LaunchError("this host's lease on the task lapsed before the launch", task=task_id)
        path = self.shared.layout.lease(task_id, epoch)
        self._write(task_id, epoch, path, deadlines)
        return path

    def _renewed(self, agents: dict[str, int], started: float) -> None:
        """After a renewal: move each renewed agent's deadlines on (its shim reads them)."""
        deadlines = self.lease.agent_deadlines(started)
        for task_id, epoch in agents.items():
            try:
                self._write(task_id, epoch, self.shared.layout.lease(task_id, epoch), deadlines)
            except (LaunchError, OSError) as exc:  # its shim stops the agent at the last deadline written
                self.shared.log.error("lease_file_failed", task=task_id, epoch=epoch, error=str(exc),
                                      hint="the agent is stopped when its last lease file runs out")

    def _write(self, task_id: str, epoch: int, path: str, deadlines: tuple[float, float]) -> None:
        term_at, kill_at = deadlines
        body = json.dumps({"term_at": round(term_at, 3), "kill_at": round(kill_at, 3),
                           "host": self.shared.host, "task": task_id, "epoch": epoch}) + "\n"
        dir_fd = open_log_dir(self.shared.config.state_dir, os.path.dirname(path), task_id)
        try:  # no fsync: it means nothing after a crash of the machine, which ends the agent too
            write_atomic(dir_fd, os.path.basename(path), body.encode(), fsync=False)
        finally:
            os.close(dir_fd)

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
        :class:`~heartbeat.model.errors.StoreError` when another daemon with this host id is live."""
        self.lease.take_host()

    def start_watch(self) -> None:
        self.lease.start_watch()

    def renew(self) -> None:
        self.vitals.lease_ttl = self.lease.ttl
        try:
            ok = self.lease.renew(len(self.shared.running))
        except Exception as exc:  # the renewal job must keep running whatever one renewal hit
            self.shared.log.exception("renew_failed", error=repr(exc))
            ok = False
        if not self.lease.stood_down:
            self.vitals.renewal(ok)
        if ok and not self.lease.stood_down:
            try:
                self.take_over()
            except Exception as exc:  # as the renewal: the job must keep running
                self.shared.log.exception("take_over_failed", error=repr(exc))

    def unreachable(self, exc: BaseException) -> None:
        self.vitals.renewal(False)
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

    def stopped_for_lease(self, task_id: str, epoch: int) -> bool:
        """Whether this daemon stopped ``task_id``'s agent of ``epoch`` because its lease lapsed or moved on."""
        with self._fence_lock:
            return (task_id, epoch) in self._fenced

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
            self._fenced[key] = None
            while len(self._fenced) > defaults.FENCED_REMEMBERED:
                del self._fenced[next(iter(self._fenced))]
        lc = sh.config.launchers.get(owner.launcher)
        grace = lc.stop_grace if lc else defaults.STOP_GRACE
        lease_file = sh.layout.lease(task_id, epoch)

        def stop() -> None:
            # Past the kill deadline of the agent's lease file, another host may run the task already:
            # SIGKILL at once, as its shim does, with no SIGTERM whose handler could still act (a thawed
            # host's daemon met the moved lease before the shim woke, and its SIGTERM let the old agent
            # record its stop after the replacement's start).
            deadlines = read_lease(lease_file)
            late = deadlines is not None and lease_clock() >= deadlines[1]
            try:
                gone = bool(kill_now(launcher, owner) if late else launcher.stop(owner, grace=grace))
            except Exception as exc:  # a stop must never kill the worker thread
                sh.log.error("stop_failed", task=task_id, error=repr(exc))
                gone = False
            sh.log.warning("fenced_agent_stopped", task=task_id, epoch=epoch, pid=owner.pid, gone=gone,
                           killed=late, reason="the task moved on to another host or epoch; nothing is written for it")
            with self._fence_lock:
                self._fencing.discard(key)

        sh.pool.submit(stop)
