"""The clock: ``heartbeat run``, split into its parts.

- :mod:`.service`: the daemon, a composition of the parts below, and what a service adds: the
  scheduler, signals, sd_notify, reload, ``[http]``, gc and :func:`run_from_cli`;
- :mod:`.core`: the loop, look → decide → act, over every task (a tick) or one (evaluate);
- :mod:`.observe`: liveness, exit status, gates, adoption, bypass detection;
- :mod:`.act`: settle, wake, unblock, escalate and notify, restore a block, stop, the two-phase launch;
- :mod:`.watch`: changes from the store and gate files, answered between ticks;
- :mod:`.pokes`: the tasks to look at soon, and the worker that looks at them;
- :mod:`.leased`: leases on a store shared by daemons on many hosts;
- :mod:`.relay`: agents' writes relayed through the daemon;
- :mod:`.overdue`: questions across the seam unanswered past ``question_wait``, escalated to a person;
- :mod:`.shared`: the config, store, launchers, pokes and look lock every part reads.

Each part is given what it needs in its constructor, by the service; no part is a subclass
of another, and nothing is wired in after construction.

Each part owns its per-task records (:class:`~.core.LookMemory`,
:class:`~.observe.BlockMemory`, :class:`~.act.StopMemory`), all under the look lock.
"""

from __future__ import annotations

from heartbeat.daemon.service import Daemon, hold_daemon_lock, run_from_cli

__all__ = ["Daemon", "hold_daemon_lock", "run_from_cli"]
