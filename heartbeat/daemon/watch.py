"""Reacting between ticks: changes from the store, agents' exits, and the files ``file:`` gates wait for.

The store says which task was written (:meth:`heartbeat.store.base.Store.watch`: inotify
for the file store, LISTEN/NOTIFY for PostgreSQL); a gate file appearing in a watched
directory names the blocked tasks waiting on it. Either way the task is *poked*
(:mod:`.pokes`: queued, debounced, looked at by the loop's ``evaluate`` in the watch worker),
so a write is answered within a fraction of a second instead of at the next tick. An
agent's process ending (:mod:`heartbeat.daemon.exits`, a pidfd per live agent) pokes its task
with no debounce: its successor starts at once, whatever the tick.

The store's reports also feed :class:`heartbeat.daemon.changes.ChangeFeed`: between full sweeps a
tick stats only the batons reported; a feed that says it missed writes (an inotify queue
overflow, a lost LISTEN connection) makes the next tick a full sweep; a feed whose thread died
(:meth:`Watcher.check`, each pass) is trusted no more: every tick sweeps.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

from heartbeat.daemon.changes import ChangeFeed
from heartbeat.daemon.shared import Shared
from heartbeat.store.base import Unwatch

__all__ = ["Watcher"]


class Watcher:
    """The store's change feed and the gate-file watches; what they report is poked (:mod:`.pokes`)."""

    def __init__(self, shared: Shared, changes: ChangeFeed, *, on_missed: Callable[[], None]) -> None:
        self.shared = shared
        self.changes = changes
        self.on_missed = on_missed
        """Called when the store's feed may have missed writes (a lost LISTEN connection): the service ticks soon."""
        self._gates_lock = threading.Lock()
        self._gate_paths: dict[str, set[str]] = {}
        """Gate file path -> the blocked tasks waiting on it (under ``_gates_lock``): replaced by
        each pass, added to by single looks, read by the inotify thread."""
        self._watch_lock = threading.Lock()
        """The tick's thread and the watch worker both update the gate watches: one at a time."""
        self._fs: Any = None
        self._handler: Any = None
        self._watched_dirs: dict[str, Any] = {}
        self._unwatch_store: Unwatch | None = None

    # -- watches -----------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to the store's changes and start the gate-file observer."""
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class GateHandler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type not in ("created", "modified", "moved", "closed", "deleted"):
                    return
                for raw in (event.src_path, getattr(event, "dest_path", "")):
                    path = os.fsdecode(raw) if raw else ""
                    if path:
                        watcher.gate_path_changed(path)

        self._unwatch_store = self.shared.store.watch(self._store_changed)
        self.changes.watching()  # what was written before the watch began raised no event: sweep once
        self.shared.exits.start()
        self._handler = GateHandler()
        self._fs = Observer()
        self._fs.start()

    def check(self) -> None:
        """Each pass: a store feed whose thread died (an exception in watchdog's, the LISTEN thread's)
        reports nothing more, so the daemon stops trusting it: said once, and every tick sweeps."""
        unwatch = self._unwatch_store
        if unwatch is None or unwatch.alive():
            return
        self._unwatch_store = None
        self.changes.stopped()
        self.shared.log.error("watch_lost", reason="the store's change feed stopped (its thread ended)",
                              hint="every tick now reads every baton's stat; restart the daemon to watch again")
        with contextlib.suppress(Exception):  # what is left of it (the feed is dead: nothing to wait for)
            unwatch(timeout=0.0)

    def _store_changed(self, task_id: str | None) -> None:
        if task_id is None:
            self.changes.lost("the store's change feed may have missed writes")
            self.on_missed()
        else:
            self.changes.changed(task_id)
            self.shared.pokes.poke(task_id)

    def stop(self, timeout: float) -> None:
        """Stop both feeds, waiting at most ``timeout`` seconds for each."""
        if self._unwatch_store is not None:
            self._unwatch_store(timeout=max(0.0, timeout))
            self._unwatch_store = None
            self.changes.stopped()
        self.shared.exits.close()
        if self._fs is not None:
            self._fs.stop()
            self._fs.join(timeout=max(0.0, timeout))

    def gate_path_changed(self, path: str) -> None:
        with self._gates_lock:
            task_ids = list(self._gate_paths.get(path, ()))
        for task_id in task_ids:
            self.shared.pokes.poke(task_id)

    def set_gate_paths(self, gate_paths: dict[str, set[str]]) -> None:
        """A full pass's map of gate file -> waiting tasks."""
        with self._gates_lock:
            self._gate_paths = gate_paths

    def add_gate_path(self, path: str, task_id: str) -> bool:
        """A single look found a task waiting on ``path``; True when that is new."""
        with self._gates_lock:
            ids = self._gate_paths.setdefault(path, set())
            if task_id in ids:
                return False
            ids.add(task_id)
            return True

    def update_gate_watches(self) -> None:
        """Watch the directories of the gate files waiting tasks name, and no others."""
        if self._fs is None:
            return
        with self._watch_lock:
            self._update_gate_watches_locked()

    def _update_gate_watches_locked(self) -> None:
        with self._gates_lock:  # the watcher's look adds gate paths while the tick's thread gets here
            gate_paths = {path: set(ids) for path, ids in self._gate_paths.items()}
        wanted = {os.path.dirname(p) for p in gate_paths}
        wanted = {d for d in wanted if os.path.isdir(d)}
        for directory in set(self._watched_dirs) - wanted:
            try:
                self._fs.unschedule(self._watched_dirs.pop(directory))
            except (KeyError, ValueError):
                pass
        for directory in wanted - set(self._watched_dirs):
            try:
                self._watched_dirs[directory] = self._fs.schedule(self._handler, directory, recursive=False)
            except OSError as exc:
                self.shared.log.warning("gate_watch_failed", directory=directory, error=str(exc))
                continue
            self.shared.log.debug("watching", directory=directory)
            # A gate file created before the watch existed raised no event: look once more now.
            for path, task_ids in gate_paths.items():
                if os.path.dirname(path) == directory:
                    for task_id in task_ids:
                        self.shared.pokes.poke(task_id)
