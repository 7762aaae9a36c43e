"""Races and reloads inside one daemon's tick: the daemon in this process (Daemon(config, store=...)), ticked by hand."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import NULL_AGENT, in_process_config, toml_list


class _RacingStore:
    """A file store in which someone else writes the baton just before the daemon's next guarded edit.

    ``race`` is "garbage" (a human writes junk over the baton) or "touch" (an agent touches
    it, moving the revision on); it fires once, on the next daemon edit that names an
    expected revision (settle, wake, escalate, dispatch phase 1).
    """

    def __new__(cls, state_dir: str) -> Any:
        from heartbeat.store.files import FileStore

        class Racing(FileStore):
            race = ""
            garbage = b"\x00\xff not a baton ["

            def edit(self, task_id: str, **kwargs: Any) -> Any:
                if self.race and kwargs.get("actor") == "daemon" and kwargs.get("expect_revision") is not None:
                    race, self.race = self.race, ""
                    if race == "garbage":
                        Path(self.path_of(task_id)).write_bytes(self.garbage)
                    else:
                        with FileStore.edit(self, task_id, actor="agent", touch=True):
                            pass
                return FileStore.edit(self, task_id, **kwargs)

        return Racing(state_dir)


def in_process_daemon(tmp_path: Path, launcher: str, **daemon: str) -> Any:
    from heartbeat.daemon import Daemon

    settings = "\n".join(f'{k} = "{v}"' for k, v in daemon.items())
    state, config = in_process_config(tmp_path, daemon=settings, launchers=f"{NULL_AGENT}{launcher}\n")
    return Daemon(config, store=_RacingStore(str(state)))


class TestRacesBetweenLookAndAct:
    """Found by the soak: a baton written or broken between the daemon's look and its act."""

    def test_baton_turned_to_garbage_before_settle_is_a_race_not_a_task_failure(self, tmp_path: Path) -> None:
        """Garbage written after the scan and before the settle: logged as a race, left byte-identical, reported."""
        from heartbeat.system.logging import capture
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        d = in_process_daemon(tmp_path, 'runtime = "0s"')
        try:
            tasks.new_task(d.store, "g", task="t", step="s")
            d.tick()
            assert d.store.load("g").meta.owner is not None
            original = Path(d.store.path_of("g")).read_bytes()
            d.store.race = "garbage"
            with capture() as logged:
                d.tick()
            assert [e["event"] for e in logged if e["event"] in ("task_failed", "raced")] == ["raced"]
            assert Path(d.store.path_of("g")).read_bytes() == d.store.garbage
            d.tick()
            assert [e.kind for e in d.store.ledger.events("g", kinds=["invalid"])] == ["invalid"]
            assert Path(d.store.path_of("g")).read_bytes() == d.store.garbage
            Path(d.store.path_of("g")).write_bytes(original)
            d.tick()
            assert d.store.ledger.events("g", kinds=["exited"])
        finally:
            d.shutdown()

    def test_spinning_agent_still_escalates_when_a_write_races_its_settle(self, tmp_path: Path) -> None:
        """A spinning agent is stopped to be escalated; a write racing the settle must not turn that into a retry."""
        from datetime import timedelta

        from conftest import wait_for

        from heartbeat.model.timeparse import utcnow
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        d = in_process_daemon(tmp_path, "", stall_after="1h", progress_after="1s")
        try:
            tasks.new_task(d.store, "spin", task="t", step="s")
            now = utcnow()
            d.tick(now)
            assert d.store.load("spin").meta.epoch == 1
            later = now + timedelta(seconds=30)
            d.tick(later)  # spinning: the stop starts in the background
            wait_for(lambda: d.shared.launchers["agent"].stops and not d.actor.is_stopping("spin"), message="the stop")
            d.store.race = "touch"
            d.tick(later)  # the settle is refused: someone wrote the baton meanwhile
            d.tick(later)
            b = d.store.load("spin")
            assert b.meta.status.value == "escalated", b.meta
            assert [e.epoch for e in d.store.ledger.events("spin", kinds=["dispatched"])] == [1]
        finally:
            d.shutdown()


class TestGateWatchRace:
    """Found by the long soak: the tick's gate-watch update iterated gate paths the watcher was adding to."""

    def test_gate_watch_update_survives_the_watcher_adding_gates(self, tmp_path: Path) -> None:
        """While the watcher's look adds blocked tasks' gate paths, updating the watches never raises."""
        import threading

        from heartbeat.model.baton import Gate
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        gates = tmp_path / "gates"
        gates.mkdir()
        d = in_process_daemon(tmp_path, "")
        ids = [f"g{i:03d}" for i in range(150)]
        for task_id in ids:
            tasks.new_task(d.store, task_id, task="t", step="s", blocked_on="a file",
                           gate=Gate.parse(f"file:{gates / task_id}"))
        d.watcher.start()
        errors: list[BaseException] = []
        stop = threading.Event()

        def update() -> None:
            while not stop.is_set():
                try:
                    d.watcher.update_gate_watches()
                except BaseException as exc:
                    errors.append(exc)
                    return

        updater = threading.Thread(target=update)
        updater.start()
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not errors:
                d.watcher.set_gate_paths({})  # what a tick does: a fresh map, filled again by the watcher's looks
                for task_id in ids:
                    d.evaluate(task_id)
        finally:
            stop.set()
            updater.join()
            d.shutdown()
        assert errors == []


class TestBlockSeed:
    """Found by the long soak: the first pass's block seed went stale once the daemon itself unblocked a task."""

    def test_gate_opened_before_start_unblocks_without_a_bypass(self, tmp_path: Path) -> None:
        """A task whose file gate opened while no daemon ran is unblocked on the first pass, with no bypass."""
        from heartbeat.model.baton import Gate
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        gate = tmp_path / "gate.done"
        d = in_process_daemon(tmp_path, "")
        try:
            tasks.new_task(d.store, "held", task="t", step="s")
            tasks.block(d.store, "held", "the export", Gate.parse(f"file:{gate}"))
            gate.write_text("ok")
            d.tick()
            kinds = [e.kind for e in d.store.ledger.events("held", kinds=["unblocked", "bypass", "dispatched"])]
            assert kinds == ["unblocked", "dispatched"]
        finally:
            d.shutdown()


    @pytest.mark.parametrize("seeded", [True, False])
    def test_a_block_whose_write_never_landed_is_no_block_to_bypass(self, tmp_path: Path, seeded: bool) -> None:
        """A block written to the ledger by a writer killed before its baton's rename (a daemon's settle
        SIGKILLed by the soak) is not a block a human dropped: no ``bypass``, the task not blocked on its
        word. Found by the short soak beside two busy loops (a ``bypass`` with no block before it); on
        9412757 the first pass's seed (``seeded``) and a later look alike restored the phantom block."""
        import os

        from heartbeat.model.baton import Gate
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        d = in_process_daemon(tmp_path, "")
        try:
            tasks.new_task(d.store, "k", task="t", step="s")
            if not seeded:
                d.tick()  # the seed is spent on the first pass: the next look asks the ledger itself
            real_replace = os.replace

            def killed(*args: Any, **kwargs: Any) -> None:
                raise KeyboardInterrupt  # the writer dies between its ledger append and its rename

            os.replace = killed  # type: ignore[assignment]
            try:
                with pytest.raises(KeyboardInterrupt):
                    tasks.block(d.store, "k", "a phantom", Gate.parse("human"))
            finally:
                os.replace = real_replace
            assert [e.kind for e in d.store.ledger.events("k", kinds=["blocked"])] == ["blocked"]  # the word is there
            d.tick()
            d.tick()
            assert d.store.ledger.events("k", kinds=["bypass"]) == []
            assert d.store.load("k").meta.status.value != "blocked"
        finally:
            d.shutdown()


class TestReloadDuringAPass:
    """Found by the 30-minute soak: a SIGHUP during a long first pass went unanswered for 10 s."""

    def test_reload_is_answered_while_a_pass_holds_the_lock_and_applies_at_the_next(self, tmp_path: Path) -> None:
        """reload() returns at once (staged) while another thread holds the daemon's lock; the next pass
        starts with the new config."""
        import threading

        d = in_process_daemon(tmp_path, "", tick="1s")
        path = tmp_path / "heartbeat.toml"
        path.write_text(f"""
[daemon]
state_dir = {json.dumps(str(tmp_path / "state"))}
default_launcher = "agent"
tick = "2s"
[launchers.agent]
type = "null"
""")
        path.chmod(0o600)
        d.shared.config = type(d.shared.config)(**{**d.shared.config.__dict__, "path": str(path)})
        held, release = threading.Event(), threading.Event()

        def a_long_pass() -> None:
            with d.shared.lock:
                held.set()
                release.wait(30)

        worker = threading.Thread(target=a_long_pass)
        worker.start()
        try:
            assert held.wait(10)
            started = time.monotonic()
            assert d.reload() is True
            assert time.monotonic() - started < 5  # answered, not queued behind the pass
            assert d.shared.config.daemon.tick == 1.0  # the pass in progress keeps its config
        finally:
            release.set()
            worker.join()
        d.tick()
        assert d.shared.config.daemon.tick == 2.0
        d.shutdown()


class TestPhaseTwoLockHeld:
    """Found by the 30-minute soak: a baton lock held at the dispatch's phase 2 logged an error."""

    def test_the_agent_is_adopted_from_its_pid_file(self, tmp_path: Path) -> None:
        """Phase 2 (recording the pid) meets a held lock: no error, one agent, adopted at the next look."""
        from heartbeat.daemon import Daemon
        from heartbeat.model.errors import Busy
        from heartbeat.store.files import FileStore

        class HeldAtPhaseTwo(FileStore):
            held = True

            def edit(self, task_id: str, **kwargs: Any) -> Any:
                phase_two = kwargs.get("actor") == "daemon" and kwargs.get("epoch") is not None
                if self.held and phase_two:
                    self.held = False
                    raise Busy("another writer has held this baton's lock", task=task_id)
                return FileStore.edit(self, task_id, **kwargs)

        state, config = in_process_config(tmp_path, launchers=f"""[launchers.agent]
type = "exec"
command = {toml_list([sys.executable, "-c", "import time; time.sleep(60)"])}
stop_grace = "200ms"
""")
        store = HeldAtPhaseTwo(str(state))
        from heartbeat.model.baton import Baton, Meta

        store.create(Baton(meta=Meta(id="t1"), task="T", step="S", workdir=str(tmp_path)))
        log = _ListLog()
        d = Daemon(config, store=store, log=log)
        try:
            d.tick()
            assert store.load("t1").meta.owner is not None and store.load("t1").meta.owner.pid is None
            assert "dispatch_unrecorded" not in log.events and "dispatch_recorded_later" in log.events
            deadline = time.monotonic() + 20
            while store.load("t1").meta.owner.pid is None and time.monotonic() < deadline:
                d.tick()
                time.sleep(0.05)
            baton = store.load("t1")
            assert baton.meta.owner is not None and baton.meta.owner.pid is not None
            assert baton.meta.epoch == 1 and baton.meta.dispatches == 1  # adopted, never dispatched twice
            assert [e.kind for e in store.ledger.events("t1", kinds=["adopted"])] == ["adopted"]
        finally:
            owner = store.load("t1").meta.owner
            if owner is not None and owner.pid:
                os.killpg(owner.pid, signal.SIGKILL)
            d.shutdown()


class _ListLog:
    """A logger that keeps the event names (the daemon logs through structlog-style calls)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def _log(self, event: str, **_kw: Any) -> None:
        self.events.append(event)

    info = warning = error = debug = exception = _log


