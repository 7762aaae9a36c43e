"""Gates: what lifts a block, evaluated by the daemon at the edge.

- ``human``: only ``heartbeat unblock --by NAME``;
- ``file:PATH``: the file exists (``file:HOST:PATH``: on that host, evaluated only by its daemon);
- ``time:ISO8601``: the time has come;
- ``task:ID``: that task is done;
- ``after:A,B``: every upstream task is done (a downstream waiting for its packages);
- ``question:q1,q2``: every question named is answered (:mod:`heartbeat.tasks.questions` lifts it
  in the answer's own write; this sees an answer written any other way, e.g. by hand);
- ``check:NAME``: the ``[checks.NAME]`` command exits 0 (run in the background with its
  timeout; the tick reads the last finished result, so a slow check never stalls it);
  ``check:HOST:NAME`` runs it only on that host.

On a shared store (leased daemons on many hosts) ``time:``, ``task:``, ``after:``, ``question:`` and
``human`` open the same everywhere; a ``file:`` or ``check:`` gate is local to one machine,
so only one daemon evaluates it: the host it names, else the task's owner host (the host
whose daemon last held the task), else (no host known) any daemon. :meth:`GateEvaluator.evaluates`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime

from heartbeat.config.shape import CommandConfig, expand_argv
from heartbeat.model import defaults
from heartbeat.model.baton import Gate, GateKind, Question, Status
from heartbeat.model.errors import BadInput
from heartbeat.model.timeparse import parse_instant
from heartbeat.system.commands import CommandResult, run_command

__all__ = ["GateEvaluator"]


class GateEvaluator:
    """Answers "is this gate open now?" without ever blocking on a check command."""

    def __init__(self, checks: Mapping[str, CommandConfig], pool: ThreadPoolExecutor | None = None) -> None:
        self.checks = dict(checks)
        self._pool = pool or ThreadPoolExecutor(max_workers=defaults.CHECK_THREADS, thread_name_prefix="heartbeat-check")
        self._own_pool = pool is None
        self._lock = threading.Lock()
        self._results: dict[tuple[str, str], CommandResult] = {}
        self._running: dict[tuple[str, str], Future[CommandResult]] = {}

    def is_open(
        self,
        task_id: str,
        gate: Gate,
        now: datetime,
        *,
        workdir: str = "",
        task_status: Callable[[str], Status | None] = lambda _id: None,
        questions: Sequence[Question] = (),
    ) -> bool:
        kind = gate.kind
        if kind is GateKind.HUMAN:
            return False
        if kind is GateKind.FILE:
            return bool(gate.local) and os.path.lexists(gate.local)
        if kind is GateKind.TIME:
            try:
                return now >= parse_instant(gate.target)
            except BadInput:
                return False
        if kind is GateKind.TASK:
            return task_status(gate.target) is Status.DONE
        if kind is GateKind.CHECK:
            return self._check(task_id, gate.local, workdir)
        if kind is GateKind.AFTER:
            return bool(gate.target) and all(task_status(t) is Status.DONE for t in gate.target.split(","))
        if kind is GateKind.QUESTION:  # a question the baton no longer holds holds nothing
            held = set(gate.target.split(","))
            return bool(gate.target) and not any(q.open for q in questions if q.id in held)
        return False

    def evaluates(self, gate: Gate, *, here: str, owner_host: str = "") -> bool:
        """Whether the daemon on host ``here`` evaluates ``gate``: a file or check gate only on
        the host it names, else on ``owner_host`` (when known); every other gate everywhere."""
        if gate.kind not in (GateKind.FILE, GateKind.CHECK):
            return True
        host = gate.host or owner_host
        return not host or host == here

    def _check(self, task_id: str, name: str, workdir: str) -> bool:
        config = self.checks.get(name)
        if config is None:
            return False
        key = (name, task_id)
        with self._lock:
            result = self._results.get(key)
            running = self._running.get(key)
            if running is None or running.done():
                argv = expand_argv(config.command, {"id": task_id, "workdir": workdir})
                cwd = workdir if workdir and os.path.isdir(workdir) else None
                self._running[key] = self._pool.submit(self._run, key, argv, config.timeout, cwd)
        return result is not None and result.ok

    def _run(self, key: tuple[str, str], argv: list[str], timeout: float, cwd: str | None) -> CommandResult:
        result = run_command(argv, timeout=timeout, cwd=cwd)
        with self._lock:
            self._results[key] = result
        return result

    def forget(self, task_id: str) -> None:
        """Drop cached check results of a task (it was unblocked or removed)."""
        with self._lock:
            for key in [k for k in self._results if k[1] == task_id]:
                del self._results[key]

    def close(self) -> None:
        if self._own_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)
