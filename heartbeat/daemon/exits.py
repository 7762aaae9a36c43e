"""Exit notices: the daemon learns at once that an agent's process ended, whatever the tick.

For every running agent with a pid on this host the daemon holds a pidfd (``pidfd_open(2)``,
Linux 5.3 and later), which turns readable when that process ends. That works the same for
the daemon's own children (the ``exec`` launcher's shim) and for processes it is not the
parent of: a ``systemd-run`` unit's main process, or an agent adopted after a restart. One
thread waits on all of them and calls back with the task's id; the daemon then looks at
that task at once (settle, then dispatch the successor), not at its next tick.

A pidfd is opened only for the process the owner names: after opening it, the process's
create time is compared with the owner's (a pid reused in between is not watched). Where
pidfds are not available (another kernel, another system) :meth:`ExitWatch.watch` returns
False and the exit is found as before: by the exit file the shim writes, through the
watcher, or by the tick.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
import time
from collections.abc import Callable

from heartbeat.launchers.liveness import identify, same_start, this_host
from heartbeat.model.baton import Owner

__all__ = ["ExitWatch", "pidfds_available"]


def pidfds_available() -> bool:
    """Whether this system gives pidfds (the interpreter has ``os.pidfd_open`` and the kernel answers it)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class ExitWatch:
    """A thread that calls ``on_exit(task_id)`` when a watched agent's process ends."""

    def __init__(self, on_exit: Callable[[str], None]) -> None:
        self.on_exit = on_exit
        self._lock = threading.Lock()
        self._watched: dict[str, tuple[int, int]] = {}  # task id -> (pid, pidfd)
        self._selector: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start the thread (once); False where pidfds are not available (then nothing is watched)."""
        if self._thread is not None:
            return True
        if not pidfds_available():
            return False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="heartbeat-exits", daemon=True)
        self._thread.start()
        return True

    @property
    def started(self) -> bool:
        return self._thread is not None

    def watch(self, task_id: str, owner: Owner) -> bool:
        """Watch ``owner``'s process for ``task_id`` (idempotent); False when it cannot be watched
        (no pidfds, not started, no pid, another host's process, or not the process the owner names)."""
        pid = owner.pid
        if self._thread is None or pid is None or pid <= 0 or (owner.host and owner.host != this_host()):
            return False
        with self._lock:
            held = self._watched.get(task_id)
            if held is not None and held[0] == pid:
                return True
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already (the next look settles it), or a fake pid
            return False
        found = identify(pid)
        if found is None or (owner.create_time is not None and abs(found[1] - owner.create_time) > 1.0
                             and not same_start(found[1], owner.create_time)):
            os.close(fd)  # the pid names another process now, or none
            return False
        with self._lock:
            old = self._watched.pop(task_id, None)
            if old is not None:
                self._unregister(old[1])
            if self._selector is None or self._stop:
                os.close(fd)
                return False
            self._watched[task_id] = (pid, fd)
            self._selector.register(fd, selectors.EVENT_READ, task_id)
        self._wake()
        return True

    def forget(self, task_id: str) -> None:
        """Stop watching ``task_id``'s agent (it was settled, or the task is gone)."""
        with self._lock:
            held = self._watched.pop(task_id, None)
            if held is not None:
                self._unregister(held[1])

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._watched)

    def close(self) -> None:
        """Stop the thread and close every descriptor (nothing to do when it never started)."""
        if self._thread is None or self._selector is None:
            return
        self._stop = True
        self._wake()
        self._thread.join(timeout=5.0)
        with self._lock:
            for _, fd in self._watched.values():
                self._unregister(fd)
            self._watched.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._selector.close()

    def _unregister(self, fd: int) -> None:
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the thread
            os.write(self._wake_w, b"!")

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        while not self._stop:
            try:
                ready = selector.select(timeout=30.0)
            except (OSError, ValueError):  # a descriptor closed under us: look again (never spin)
                time.sleep(0.05)
                continue
            ended: list[str] = []
            for key, _ in ready:
                if key.data is None:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                    continue
                task_id = key.data
                with self._lock:
                    held = self._watched.get(task_id)
                    if held is None or held[1] != key.fd:
                        continue
                    del self._watched[task_id]
                    self._unregister(key.fd)
                ended.append(task_id)
            for task_id in ended:
                if self._stop:
                    return
                try:
                    self.on_exit(task_id)
                except Exception:  # a notice is a hint: the tick finds the exit anyway
                    pass
