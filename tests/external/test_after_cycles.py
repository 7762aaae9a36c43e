"""``after`` never forms a cycle, even when two writes race; one that exists already is named.

Issue 24 item 3: ``add x after y`` racing ``add y after x`` made a cycle in 8 of 40 pairs (each
write checked for a cycle before taking its lock, so each saw the other's edge missing); neither
task was ever dispatched, ``status`` showed nothing and ``verify`` said fresh.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heartbeat.model.errors import BadInput
from heartbeat.store.base import Store
from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.verify import verify
from tests.conftest import Result


@pytest.fixture(params=["file", "memory", "postgres"])
def store(request: pytest.FixtureRequest, state_dir: Path) -> Iterator[Store]:
    s: Store
    if request.param == "postgres":
        from heartbeat.store.postgres.store import PostgresStore

        s = PostgresStore(request.getfixturevalue("pg_url"))
    else:
        s = FileStore(str(state_dir)) if request.param == "file" else MemoryStore()
    yield s
    s.close()


def _new(store: Store, *ids: str) -> None:
    for task_id in ids:
        tasks.new_task(store, task_id, task=f"task {task_id}", step="start")


def _race(store: Store, a: str, b: str) -> list[BaseException]:
    """``add a after b`` and ``add b after a`` at once, from two threads; what each raised."""
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def add(task_id: str, upstream: str) -> None:
        start.wait()
        try:
            tasks.add_items(store, task_id, "after", [upstream])
        except BaseException as exc:  # the test reads what each raised
            errors.append(exc)

    threads = [threading.Thread(target=add, args=pair) for pair in ((a, b), (b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


class TestRacingAddsMakeNoCycle:
    def test_of_two_racing_adds_one_lands_and_the_other_is_refused_naming_the_cycle(self, store: Store) -> None:
        """20 pairs of ``add x after y`` / ``add y after x`` at once: every pair ends with exactly one
        edge, the other write refused with the cycle it would make."""
        pairs = [(f"x{i}", f"y{i}") for i in range(20)]
        for a, b in pairs:
            _new(store, a, b)
        for a, b in pairs:
            errors = _race(store, a, b)
            edges = [(t, u) for t, u in ((a, b), (b, a)) if u in store.load(t).after]
            assert len(edges) == 1, f"{a}/{b}: both edges landed, a cycle: {edges}"
            assert len(errors) == 1 and isinstance(errors[0], BadInput)
            assert "would make a cycle" in str(errors[0])

    def test_a_write_holding_the_links_lock_makes_the_other_wait_and_then_see_it(self, store: Store) -> None:
        """While one write of ``after`` is open (links lock held), the racing ``add y after x`` waits;
        once the first commits, the second sees ``x after y`` and refuses the cycle."""
        _new(store, "x", "y")
        outcome: list[BaseException | None] = []
        second = threading.Thread(target=lambda: outcome.extend(_race_one(store)))
        with store.edit("x", links=True) as ed:
            second.start()
            second.join(0.5)
            assert second.is_alive(), "the second write of `after` did not wait for the links lock"
            ed.baton.after.append("y")
        second.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], BadInput)
        assert "would make a cycle (y -> x -> y)" in str(outcome[0])
        assert store.load("y").after == []

    def test_edit_load_reads_another_baton(self, store: Store) -> None:
        """An open write reads other batons through :meth:`Edit.load` (on a database: in its transaction)."""
        _new(store, "x", "y")
        with store.edit("x", links=True) as ed:
            assert ed.load("y").step == "start"


def _race_one(store: Store) -> list[BaseException | None]:
    try:
        tasks.add_items(store, "y", "after", ["x"])
    except BaseException as exc:  # the test reads what it raised
        return [exc]
    return [None]


def _cycle_written_by_hand(store: Store) -> None:
    """x after y and y after x, as an older version's race, an import or a hand edit left them."""
    _new(store, "x", "y", "z")
    for task_id, upstream in (("x", "y"), ("y", "x"), ("z", "x")):
        with store.edit(task_id) as ed:
            ed.baton.after.append(upstream)


class TestAnExistingCycleIsNamed:
    def test_verify_says_held_naming_the_cycle(self, store: Store) -> None:
        """``verify`` of a task caught in a cycle is ``held`` (exit 4) naming it, not ``fresh``."""
        _cycle_written_by_hand(store)
        result = verify(store, "x", record=False)
        assert (result.status, result.code) == ("held", 4)
        assert "cycle of `after` (x -> y -> x)" in result.message
        downstream = verify(store, "z", record=False)  # held behind the cycle, not in it
        assert downstream.status == "fresh"

    def test_status_names_the_cycle(self, state_dir: Path, hb: Callable[..., Result]) -> None:
        """``status`` shows ``[held: a cycle of after, x -> y -> x]`` and ``--json`` its ``cycle``."""
        store = FileStore(str(state_dir))
        _cycle_written_by_hand(store)
        store.close()
        shown = hb("status")
        assert shown.code == 0, shown.err
        assert "[held: a cycle of after, x -> y -> x]" in shown.out
        assert "[held: a cycle of after, y -> x -> y]" in shown.out
        rows = {r["id"]: r for r in json.loads(hb("status", "--json").out)["tasks"]}
        assert rows["x"]["cycle"] == ["x", "y", "x"] and rows["z"]["cycle"] == []
        refused = hb("verify", "x")
        assert refused.code == 4 and "held for ever by a cycle" in refused.out + refused.err


class TestTheLinksLock:
    def test_a_links_lock_held_elsewhere_is_busy_naming_it_and_writes_nothing(self, state_dir: Path) -> None:
        """Another process holding ``locks/.links.lock`` past the wait: Busy naming the
        links lock; the baton is unchanged. A write that is not about ``after`` does not wait for it."""
        import fcntl
        import os

        from heartbeat.model.errors import Busy

        store = FileStore(str(state_dir))
        _new(store, "x", "y")
        store.lock_wait = 0.2
        fd = os.open(store.layout.links_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with pytest.raises(Busy) as caught:
                tasks.add_items(store, "x", "after", ["y"])
            assert "the links lock" in str(caught.value)
            tasks.add_items(store, "x", "done", ["a step"])
        finally:
            os.close(fd)
        assert store.load("x").after == [] and store.load("x").done == ["a step"]
        store.close()
