"""The Python API agents use: open_task(), read(), update(), touch(), block(), done()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

import heartbeat
from heartbeat.api import Task, epoch_from_env, open_task
from heartbeat.model.baton import GateKind, Owner, Status
from heartbeat.model.errors import BadInput, Conflict, NotFound
from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore
from heartbeat.tasks import verbs as tasks


@pytest.fixture
def task(state_dir: Path) -> Task:
    """A task created through the file store, opened through the API without an epoch."""
    store = FileStore(str(state_dir))
    tasks.new_task(store, "api", task="Fix the fallback", step="Read the logs", plan=["Read the logs", "Patch"])
    store.close()
    return open_task("api", state_dir=str(state_dir), epoch=None)


def _bytes(state_dir: Path, task_id: str = "api") -> bytes:
    return (state_dir / "batons" / f"{task_id}.toml").read_bytes()


class TestOpen:
    def test_package_exposes_open_task_lazily(self) -> None:
        """`heartbeat.open_task` and `heartbeat.Baton` are importable from the package root."""
        assert heartbeat.open_task is open_task
        from heartbeat.model.baton import Baton

        assert heartbeat.Baton is Baton

    def test_state_dir_from_the_environment(self, task: Task, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """With no argument, the state dir is $HEARTBEAT_STATE_DIR (what a launched agent has)."""
        monkeypatch.setenv("HEARTBEAT_STATE_DIR", str(state_dir))
        monkeypatch.delenv("HEARTBEAT_EPOCH", raising=False)
        assert open_task("api").read().step == "Read the logs"

    def test_state_dir_from_a_config(self, task: Task, state_dir: Path, tmp_path: Path) -> None:
        """`config=` reads the state dir from that config file."""
        config = tmp_path / "hb.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n')
        config.chmod(0o644)
        assert open_task("api", config=str(config), epoch=None).read().task == "Fix the fallback"

    def test_bad_id_and_missing_task(self, state_dir: Path) -> None:
        """A bad id fails at open; a missing task fails at the first read."""
        with pytest.raises(BadInput, match="bad task id"):
            open_task("../etc", state_dir=str(state_dir))
        with pytest.raises(NotFound):
            open_task("ghost", state_dir=str(state_dir), epoch=None).read()

    def test_any_store(self) -> None:
        """A Task works over any store, e.g. the in-memory one for tests."""
        store = MemoryStore()
        tasks.new_task(store, "m", task="t", step="s")
        task = open_task("m", store=store, epoch=None)
        with task.update() as baton:
            baton.step = "next"
        assert store.load("m").step == "next" and store.load("m").meta.revision == 2


class TestUpdate:
    def test_update_writes_atomically_and_bumps_revision(self, task: Task, state_dir: Path) -> None:
        """Changes made inside update() are written on exit, with revision + 1 and an `updated` event."""
        with task.update() as baton:
            baton.step = "Patch"
            baton.done.append("Read the logs")
            baton.decisions.append("patch, not revert: the revert loses data")
            baton.extra["my_tool"] = {"runs": 3}
        read = task.read()
        assert read.step == "Patch" and read.done == ["Read the logs"] and read.extra == {"my_tool": {"runs": 3}}
        assert read.meta.revision == 2
        assert task.store.ledger.events("api")[-1].data["changed"] == ["step", "done", "decisions", "my_tool"]

    def test_exception_inside_writes_nothing(self, task: Task, state_dir: Path) -> None:
        """An exception inside update() propagates and the file is byte-for-byte unchanged."""
        before = _bytes(state_dir)
        with pytest.raises(ZeroDivisionError):
            with task.update() as baton:
                baton.step = "half-way"
                _ = 1 / 0
        assert _bytes(state_dir) == before

    @pytest.mark.parametrize("change", ["blocked_on", "status", "epoch"])
    def test_update_refuses_managed_fields(self, task: Task, state_dir: Path, change: str) -> None:
        """blocked_on and meta are not the agent's to change in update(): refused, nothing written."""
        before = _bytes(state_dir)
        with pytest.raises(BadInput, match=r"blocked_on|meta is managed"):
            with task.update() as baton:
                baton.step = "sneaky"
                if change == "blocked_on":
                    baton.blocked_on = "nothing, really"
                elif change == "status":
                    baton.meta.status = Status.DONE
                else:
                    baton.meta.epoch = 99
        assert _bytes(state_dir) == before

    def test_expect_revision(self, task: Task) -> None:
        """update(expect_revision=N) refuses with Conflict once another write moved the baton on."""
        seen = task.read().meta.revision
        with task.update(expect_revision=seen) as baton:
            baton.next_step = "mine"
        with pytest.raises(Conflict, match=f"expected revision {seen}"):
            with task.update(expect_revision=seen) as baton:
                baton.next_step = "stale"
        assert task.read().next_step == "mine"

    def test_read_returns_a_copy(self, task: Task) -> None:
        """Mutating what read() returned writes nothing."""
        baton = task.read()
        baton.step = "not written"
        assert task.read().step == "Read the logs"


class TestFencing:
    def test_epoch_comes_from_the_environment_for_this_task(self) -> None:
        """HEARTBEAT_EPOCH applies when HEARTBEAT_TASK is unset or names this task; not for another task."""
        assert epoch_from_env("a", {"HEARTBEAT_EPOCH": "3"}) == 3
        assert epoch_from_env("a", {"HEARTBEAT_EPOCH": "3", "HEARTBEAT_TASK": "a"}) == 3
        assert epoch_from_env("a", {"HEARTBEAT_EPOCH": "3", "HEARTBEAT_TASK": "b"}) is None
        assert epoch_from_env("a", {}) is None
        for bad in ("x", "-1"):
            with pytest.raises(BadInput, match="HEARTBEAT_EPOCH"):
                epoch_from_env("a", {"HEARTBEAT_EPOCH": bad})

    def test_superseded_agent_cannot_write(self, task: Task, state_dir: Path) -> None:
        """An agent at epoch 1, after a claim moved the task to epoch 2, gets Conflict and writes nothing."""
        tasks.claim(task.store, "api", Owner(pid=1), alive=False)
        zombie = open_task("api", state_dir=str(state_dir), epoch=1)
        tasks.claim(task.store, "api", Owner(pid=2), alive=False)
        before = _bytes(state_dir)
        with pytest.raises(Conflict, match="epoch 1 has been superseded by epoch 2"):
            with zombie.update() as baton:
                baton.step = "zombie"
        for call in (zombie.touch, lambda: zombie.done("zombie"), lambda: zombie.block("zombie")):
            with pytest.raises(Conflict):
                call()
        assert _bytes(state_dir) == before

    def test_launched_agent_is_fenced_by_its_environment(self, task: Task, state_dir: Path) -> None:
        """A real subprocess with HEARTBEAT_TASK/HEARTBEAT_EPOCH of an old dispatch is refused."""
        tasks.claim(task.store, "api", Owner(pid=1), alive=False)
        tasks.claim(task.store, "api", Owner(pid=2), alive=False)
        code = ("import heartbeat\n"
                "t = heartbeat.open_task('api')\n"
                "with t.update() as b:\n"
                "    b.step = 'zombie'\n")
        env = clean_env(HEARTBEAT_STATE_DIR=str(state_dir), HEARTBEAT_TASK="api", HEARTBEAT_EPOCH="1")
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(ROOT), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode != 0 and "superseded by epoch 2" in proc.stderr
        assert task.read().step == "Read the logs"
        env["HEARTBEAT_EPOCH"] = "2"
        proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(ROOT), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert task.read().step == "zombie"


class TestVerbs:
    def test_touch_block_done(self, task: Task) -> None:
        """touch() is a heartbeat, block() blocks with a gate, done() finishes after an unblock."""
        revision = task.read().meta.revision
        assert task.touch().meta.revision == revision + 1
        baton = task.block("waiting for review", "file:/srv/flags/reviewed")
        assert baton.status is Status.BLOCKED and baton.blocked_on == "waiting for review"
        assert baton.meta.gate is not None and baton.meta.gate.kind is GateKind.FILE
        tasks.unblock(task.store, "api", by="alice")
        assert task.done("all patched").status is Status.DONE
        assert [e.kind for e in task.store.ledger.events("api")][-5:] == ["touched", "blocked", "unblocked", "done",
                                                                          "handed_off"]  # done freezes the package
