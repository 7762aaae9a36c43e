"""The pulse (heartbeat.hotpath.pulse): an agent's touch as a file's mtime, fenced by the baton's bytes."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import Result

from heartbeat.hotpath import pulse
from heartbeat.model import defaults
from heartbeat.model.baton import ID_PATTERN
from heartbeat.store.files import FileStore

Hb = Callable[..., Result]


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


def _claim(hb: Hb, task: str = "t") -> dict[str, str]:
    """A task claimed by this test process; the environment its agent's calls carry."""
    made = hb("new", task, "--task", "x", "--step", "s", "--claim")
    assert made.code == 0, made.err
    return {"HEARTBEAT_EPOCH": made.out.strip(), "HEARTBEAT_TASK": task}


def _pulse(state_dir: Path, task: str = "t", epoch: int = 1) -> Path:
    return state_dir / "logs" / task / f"{epoch}.pulse"


def _baton(state_dir: Path, task: str = "t") -> bytes:
    return (state_dir / "batons" / f"{task}.toml").read_bytes()


def _touch_rows(state_dir: Path, task: str = "t") -> list[tuple[int, float]]:
    with sqlite3.connect(state_dir / "ledger.sqlite3") as conn:
        return conn.execute("SELECT id, ts FROM events WHERE task = ? AND kind = 'touched' ORDER BY id",
                            (task,)).fetchall()


def _touched_at(hb: Hb, task: str = "t") -> datetime:
    shown = hb("show", task, "--json")
    assert shown.code == 0, shown.err
    return datetime.fromisoformat(json.loads(shown.out)["meta"]["touched_at"])


def _set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


class TestFastTouch:
    """After an agent's own write, its touches move only the pulse's mtime."""

    def test_touches_after_the_first_write_nothing_but_the_pulse(self, hb: Hb, state_dir: Path) -> None:
        """The first touch writes baton and ledger and arms the pulse; the next ones change only its mtime."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        armed, rows = _baton(state_dir), _touch_rows(state_dir)
        assert len(rows) == 1 and _pulse(state_dir).is_file()
        _set_mtime(_pulse(state_dir), time.time() - 30)
        before = time.time()
        for _ in range(3):
            assert hb("touch", "t", env=env).code == 0
        assert _baton(state_dir) == armed  # no baton write: no revision bump
        assert _touch_rows(state_dir) == rows  # no ledger row
        assert _pulse(state_dir).stat().st_mtime >= before - 1

    def test_readers_see_a_pulse_as_a_touch(self, hb: Hb, state_dir: Path) -> None:
        """show (load) and status (scan) report the pulse's time as the task's last touch."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        _set_mtime(_pulse(state_dir), time.time() - 30)
        written = _touched_at(hb)  # the baton's own: the pulse is older
        time.sleep(0.05)
        assert hb("touch", "t", env=env).code == 0
        pulsed = datetime.fromtimestamp(_pulse(state_dir).stat().st_mtime, UTC)
        assert pulsed > written
        assert _touched_at(hb) == pulsed
        status = json.loads(hb("status", "--json").out)["tasks"][0]
        assert status["age_s"] < (datetime.now(UTC) - written).total_seconds()

    def test_a_touch_after_the_window_folds_into_baton_and_ledger(self, hb: Hb, state_dir: Path) -> None:
        """Once the pulse's fold time has passed, the next touch writes the baton and its touched row again."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        path = _pulse(state_dir)
        header, _, body = path.read_bytes().partition(b"\n")
        magic, epoch, fold_by = header.rsplit(b" ", 2)
        assert float(fold_by) == pytest.approx(time.time() + defaults.TOUCH_COALESCE, abs=30)
        path.write_bytes(b" ".join((magic, epoch, b"%f" % (time.time() - 1))) + b"\n" + body)
        revision = json.loads(hb("show", "t", "--json").out)["meta"]["revision"]
        assert hb("touch", "t", env=env).code == 0
        assert json.loads(hb("show", "t", "--json").out)["meta"]["revision"] == revision + 1
        assert _touch_rows(state_dir)[-1][1] > time.time() - 30
        assert path.read_bytes().partition(b"\n")[2] == _baton(state_dir)  # re-armed for the new bytes

    def test_a_set_arms_the_pulse(self, hb: Hb, state_dir: Path) -> None:
        """An agent's set or add leaves the pulse armed for exactly the baton it wrote."""
        env = _claim(hb)
        assert hb("set", "t", "step=two", env=env).code == 0
        assert _pulse(state_dir).read_bytes().partition(b"\n")[2] == _baton(state_dir)
        assert hb("add", "t", "done", "one", env=env).code == 0
        assert _pulse(state_dir).read_bytes().partition(b"\n")[2] == _baton(state_dir)

    def test_no_pulse_without_an_epoch_or_an_owner(self, hb: Hb, state_dir: Path) -> None:
        """A touch by hand (no epoch) or on a task nobody owns writes the baton every time, as before."""
        assert hb("new", "t", "--task", "x", "--step", "s").code == 0
        assert hb("touch", "t").code == 0
        assert hb("touch", "t", env={"HEARTBEAT_EPOCH": "0", "HEARTBEAT_TASK": "t"}).code == 0
        assert not (state_dir / "logs" / "t").exists()
        assert json.loads(hb("show", "t", "--json").out)["meta"]["revision"] == 3


class TestFencing:
    """A pulse never lets a write through that the baton would refuse."""

    def test_a_superseded_agent_is_refused_with_exit_5(self, hb: Hb, state_dir: Path) -> None:
        """Armed at epoch 1, then the task is claimed away: the old agent's touch exits 5 and pulses nothing."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        _set_mtime(_pulse(state_dir), time.time() - 30)
        assert hb("claim", "t", "--force", "--pid", str(os.getpid())).code == 0
        refused = hb("touch", "t", env=env)
        assert refused.code == 5 and "superseded by epoch 2" in refused.err, refused
        assert len(refused.err.strip().splitlines()) == 1
        assert _pulse(state_dir).stat().st_mtime < time.time() - 20

    @pytest.mark.parametrize("verb", [("done",), ("block", "--on", "a human"), ("snooze", "--for", "1h"),
                                      ("release",)])
    def test_after_a_state_change_a_touch_answers_as_before(self, hb: Hb, state_dir: Path,
                                                             verb: tuple[str, ...]) -> None:
        """An armed task that went done, blocked, snoozed or released answers a touch exactly as an unarmed one."""
        answers = []
        for task, arm in (("armed", True), ("plain", False)):
            env = _claim(hb, task)
            if arm:
                assert hb("touch", task, env=env).code == 0
                assert _pulse(state_dir, task).is_file()
            assert hb(verb[0], task, *verb[1:], env=env).code == 0
            before = json.loads(hb("show", task, "--json").out)["meta"]["revision"]
            got = hb("touch", task, env=env)
            answers.append((got.code, got.err.replace(task, "ID"), got.out))
            after = json.loads(hb("show", task, "--json").out)["meta"]
            answers.append((after["status"], after["revision"] - before))
        assert answers[0:2] == answers[2:4]

    def test_a_missing_baton_is_no_such_task(self, hb: Hb, state_dir: Path) -> None:
        """Baton gone after arming: exit 1 and the one-line 'no such task', not a pulse."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        (state_dir / "batons" / "t.toml").rename(state_dir / "t.toml.away")
        got = hb("touch", "t", env=env)
        assert got.code == 1 and "no such task" in got.err and len(got.err.strip().splitlines()) == 1

    def test_a_hand_edited_baton_is_read_again(self, hb: Hb, state_dir: Path) -> None:
        """Any byte of the baton changed since arming (a hand edit, another writer): the touch goes through the store."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        path = state_dir / "batons" / "t.toml"
        path.write_text(path.read_text().replace('status = "active"', 'status = "done"'))
        revision = json.loads(hb("show", "t", "--json").out)["meta"]["revision"]
        assert hb("touch", "t", env=env).code == 0  # a touch on a done task is accepted, as it always was
        assert json.loads(hb("show", "t", "--json").out)["meta"]["revision"] == revision + 1


class TestHostilePulse:
    """What an agent can plant at its pulse path neither hangs nor misleads anyone."""

    def test_a_fifo_is_neither_waited_on_nor_trusted(self, hb: Hb, state_dir: Path) -> None:
        """A FIFO at the pulse path: the touch falls back to the store at once and replaces it with a real pulse."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        _pulse(state_dir).unlink()
        os.mkfifo(_pulse(state_dir), 0o600)
        assert hb("show", "t", "--json", timeout=20).code == 0
        assert hb("touch", "t", env=env, timeout=20).code == 0
        assert _pulse(state_dir).is_file()

    def test_a_symlink_is_neither_followed_nor_trusted(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """A link at the pulse path to a fresh file outside: readers ignore it, the touch does not follow it."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        written = _touched_at(hb)
        outside = tmp_path / "outside"
        outside.write_bytes(_pulse(state_dir).read_bytes())
        planted = time.time() + 2  # newer than any touch, within the allowed skew
        _set_mtime(outside, planted)
        _pulse(state_dir).unlink()
        _pulse(state_dir).symlink_to(outside)
        assert _touched_at(hb) == written  # the link's target's time is not taken
        assert hb("touch", "t", env=env).code == 0
        assert outside.stat().st_mtime == pytest.approx(planted)
        assert not _pulse(state_dir).is_symlink()

    def test_a_huge_file_is_not_read(self, hb: Hb, state_dir: Path) -> None:
        """A pulse larger than any baton: the touch does not read it and re-arms through the store."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        with open(_pulse(state_dir), "r+b") as f:
            f.truncate(8 * defaults.MAX_BATON_BYTES)
        assert hb("touch", "t", env=env).code == 0
        assert _pulse(state_dir).stat().st_size < defaults.MAX_BATON_BYTES

    def test_a_pulse_from_the_future_is_ignored(self, hb: Hb, state_dir: Path) -> None:
        """An mtime set far ahead cannot keep a silent agent looking alive."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        written = _touched_at(hb)
        _set_mtime(_pulse(state_dir), time.time() + 86400)
        assert _touched_at(hb) <= written

    def test_another_epochs_pulse_is_ignored(self, hb: Hb, state_dir: Path) -> None:
        """A fresh pulse of an older epoch says nothing about the agent holding the task now."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        assert hb("claim", "t", "--force", "--pid", str(os.getpid())).code == 0
        written = _touched_at(hb)
        _set_mtime(_pulse(state_dir, epoch=1), time.time())
        assert _touched_at(hb) == written

    def test_a_linked_task_dir_is_not_followed(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """logs/<id> swapped for a link to a directory holding a fresh pulse: not trusted, not touched."""
        env = _claim(hb)
        assert hb("touch", "t", env=env).code == 0
        written = _touched_at(hb)
        elsewhere = tmp_path / "elsewhere"
        (state_dir / "logs" / "t").rename(elsewhere)
        (state_dir / "logs" / "t").symlink_to(elsewhere)
        planted = time.time() + 2
        _set_mtime(elsewhere / "1.pulse", planted)
        assert _touched_at(hb) == written
        assert hb("touch", "t", env=env).code == 0
        assert (elsewhere / "1.pulse").stat().st_mtime == pytest.approx(planted)


class TestPulseModule:
    """The pulse's copies of the baton's rules agree with the originals."""

    @pytest.mark.parametrize("task_id", ["a", "0", "a" * 64, "a" * 65, "A", "-a", ".a", "a.b-c_d", "a/b", "..",
                                         "", "é", "a b", "a\n", "x" * 63 + "-"])
    def test_ids_as_the_baton_says(self, task_id: str) -> None:
        """The fast path's id check accepts exactly the ids ID_PATTERN accepts."""
        assert pulse._valid_id(task_id) == bool(ID_PATTERN.fullmatch(task_id))

    def test_baton_limit(self) -> None:
        """The fast path bounds its reads by the store's baton limit."""
        assert pulse.MAX_BATON_BYTES == defaults.MAX_BATON_BYTES

    @pytest.mark.parametrize("env", [{}, {"HEARTBEAT_EPOCH": "1"}, {"HEARTBEAT_STATE_DIR": "/x"},
                                     {"HEARTBEAT_STATE_DIR": "/x", "HEARTBEAT_EPOCH": "-1"},
                                     {"HEARTBEAT_STATE_DIR": "/x", "HEARTBEAT_EPOCH": "1", "HEARTBEAT_TASK": "other"},
                                     {"HEARTBEAT_STATE_DIR": "/x", "HEARTBEAT_EPOCH": "1",
                                      "HEARTBEAT_STORE_URL": "postgresql://x"}])
    def test_the_fast_path_steps_aside(self, env: dict[str, str]) -> None:
        """No state dir, no epoch, a bad epoch, another task's agent or a store URL: the CLI answers."""
        assert pulse.hot_touch(["touch", "t"], env) is False






def test_store_reads_only_the_owned(state_dir: Path) -> None:
    """A task with no owner is never given a pulse's time, whatever lies in its logs dir."""
    from heartbeat.tasks import verbs as tasks

    store = FileStore(str(state_dir))
    try:
        tasks.new_task(store, "t", task="x", step="s", workdir=str(state_dir))
        written = store.load("t").meta.touched_at
        (state_dir / "logs" / "t").mkdir(parents=True)
        (state_dir / "logs" / "t" / "0.pulse").write_text("x")
        _set_mtime(state_dir / "logs" / "t" / "0.pulse", time.time() + 1)
        assert store.load("t").meta.touched_at == written
        assert store.scan()[0].baton is not None and store.scan()[0].baton.meta.touched_at == written
    finally:
        store.close()


class TestLayout:
    """The pulse's path is the one StateLayout names for every other reader."""

    def test_pulse_name_matches_the_layout(self, tmp_path: Path) -> None:
        """``pulse_name`` inside ``logs/<id>/`` is ``StateLayout.pulse``."""
        from heartbeat.hotpath.pulse import pulse_name
        from heartbeat.system.layout import StateLayout

        layout = StateLayout(str(tmp_path))
        assert layout.pulse("t1", 7) == os.path.join(layout.task_logs("t1"), pulse_name(7))


class TestApiTouch:
    """``open_task(...).touch()``, an agent's touch through the Python API, is a pulse too once armed, as the
    CLI's is: before, every API touch wrote the baton and its ledger row and woke the daemon's watcher
    (the suite's toy agents touch four times a step)."""

    def test_touches_after_the_agents_write_move_only_the_pulse(self, hb: Hb, state_dir: Path) -> None:
        """The first touch writes and arms; the next ones leave baton and ledger alone, and the baton each
        returns carries the pulse's time, as ``show`` does."""
        from heartbeat.api import open_task

        env = _claim(hb)
        task = open_task("t", state_dir=str(state_dir), epoch=int(env["HEARTBEAT_EPOCH"]))
        try:
            task.touch()
            armed, rows = _baton(state_dir), _touch_rows(state_dir)
            _set_mtime(_pulse(state_dir), time.time() - 30)
            for _ in range(3):
                touched = task.touch().meta.touched_at
            assert _baton(state_dir) == armed and _touch_rows(state_dir) == rows
            assert touched == datetime.fromtimestamp(_pulse(state_dir).stat().st_mtime, UTC) == _touched_at(hb)
        finally:
            task.store.close()

    def test_a_superseded_agents_touch_is_refused_even_with_its_pulse_armed(self, hb: Hb, state_dir: Path) -> None:
        """Another claim moves the epoch on: the old agent's armed pulse no longer matches the baton, and its
        touch is refused (exit 5's Conflict), never a silent pulse."""
        from heartbeat.api import open_task
        from heartbeat.model.errors import Conflict

        env = _claim(hb)
        task = open_task("t", state_dir=str(state_dir), epoch=int(env["HEARTBEAT_EPOCH"]))
        try:
            task.touch()
            assert hb("claim", "t", "--force").code == 0
            with pytest.raises(Conflict):
                task.touch()
        finally:
            task.store.close()
