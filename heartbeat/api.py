"""The Python API for agents written in Python.

    import heartbeat

    task = heartbeat.open_task("fix-fallback")   # state dir and epoch from the environment
    baton = task.read()
    with task.update() as baton:                  # locked; written atomically and fenced on exit
        baton.step = "Restart the service"
        baton.done.append("Saved state")
    if task.verify().code != 0:                   # before anything irreversible
        ...

The epoch comes from ``HEARTBEAT_EPOCH`` when ``HEARTBEAT_TASK`` names this task (as it
does for an agent the daemon launched), so a superseded agent's update is refused with
:class:`~heartbeat.model.errors.Conflict` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from heartbeat.model.baton import Baton, check_id
from heartbeat.model.errors import BadInput
from heartbeat.store import Store, open_configured
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.write import epoch_from_env

if TYPE_CHECKING:
    from heartbeat.tasks.verify import VerifyResult

__all__ = ["Task", "open_task", "epoch_from_env"]


class Task:
    """One task's baton, read and updated through a store."""

    def __init__(self, task_id: str, store: Store, *, epoch: int | None = None, actor: str = "api") -> None:
        self.id = check_id(task_id)
        self.store = store
        self.epoch = epoch
        self.actor = actor

    def read(self) -> Baton:
        """The baton as it is now (validated)."""
        return self.store.load(self.id)

    @contextmanager
    def update(self, *, expect_revision: int | None = None) -> Iterator[Baton]:
        """Lock the baton and yield it for changes; written atomically, fenced and recorded on exit.

        An exception inside the block writes nothing. ``blocked_on`` and ``meta`` are not
        yours to change here (the write is refused): use :meth:`block` and :meth:`unblock`.
        """
        with self.store.edit(self.id, expect_revision=expect_revision, epoch=self.epoch, actor=self.actor) as ed:
            yield ed.baton
            if ed.baton.blocked_on != ed.old.blocked_on:
                raise BadInput("change blocked_on with block()/unblock(), not update()", task=self.id,
                               field="blocked_on")
            if ed.baton.meta != ed.old.meta:
                raise BadInput("meta is managed by heartbeat", task=self.id, field="meta")

    def touch(self) -> Baton:
        return tasks.touch(self.store, self.id, epoch=self.epoch, actor=self.actor)

    def block(self, on: str, gate: str = "human") -> Baton:
        from heartbeat.model.baton import Gate

        return tasks.block(self.store, self.id, on, Gate.parse(gate), epoch=self.epoch, actor=self.actor)

    def done(self, note: str = "") -> Baton:
        return tasks.finish(self.store, self.id, note=note, epoch=self.epoch, actor=self.actor)

    def verify(self) -> VerifyResult:
        """Does the baton still hold for this caller? The same result as ``heartbeat verify``:
        ``.code`` 0 fresh, 3 stale (``.changed`` says what), 4 not active, 5 superseded."""
        from heartbeat.tasks.verify import verify

        return verify(self.store, self.id, epoch=self.epoch, actor=self.actor)


def open_task(
    task_id: str,
    *,
    state_dir: str | None = None,
    config: str | None = None,
    epoch: int | None = None,
    store: Store | None = None,
) -> Task:
    """Open a task by id. The state dir comes from the arguments, ``$HEARTBEAT_STATE_DIR`` or the config."""
    if store is None:
        store = open_configured(state_dir, config)[0]
    if epoch is None:
        epoch = epoch_from_env(task_id)
    return Task(task_id, store, epoch=epoch)
