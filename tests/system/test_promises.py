"""The core promises under attack: no agent on a blocked task, no lost history, one daemon.

Each class pins one defect of issue 8 that a careless operator or an attacker could hit:
parallel first writes, a corrupt ledger row, a baton restored from a backup, a block
racing a dispatch, a second daemon on the same state dir.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import Result, clean_env
from daemon_harness import TOY, DaemonHarness, in_process_config

from heartbeat.model.baton import Gate
from heartbeat.model.ledger import Event
from heartbeat.store.files import FileStore
from heartbeat.store.ledger import SqliteLedger


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli



def _first_write(path: str, barrier: Any, results: Any) -> None:
    """One process's first ledger write, released together with the others."""
    barrier.wait()
    try:
        SqliteLedger(path).append([Event(task=f"t{os.getpid()}", kind="created", ts=datetime.now(UTC))])
        results.put("ok")
    except Exception as exc:  # what the CLI would print: the test wants every one to land
        results.put(repr(exc))


class TestParallelFirstWrites:
    """Creating and migrating the ledger is safe when many processes do it at once."""

    def test_eight_forked_first_writes_land_sixty_times_over(self, tmp_path: Path) -> None:
        """Eight processes released by one barrier onto a fresh ledger, sixty times: every write lands.

        (Before the fix about one round in twenty lost a write to "database is locked".)"""
        ctx = multiprocessing.get_context("fork")
        failures: list[str] = []
        for round_ in range(60):
            path = str(tmp_path / f"ledger{round_}.sqlite3")
            barrier, results = ctx.Barrier(8), ctx.Queue()
            procs = [ctx.Process(target=_first_write, args=(path, barrier, results)) for _ in range(8)]
            for proc in procs:
                proc.start()
            outcomes = [results.get(timeout=60) for _ in procs]
            for proc in procs:
                proc.join(timeout=60)
            failures += [f"round {round_}: {o}" for o in outcomes if o != "ok"]
            assert len(SqliteLedger(path).events(kinds=["created"])) == outcomes.count("ok")
        assert not failures, failures[:3]

    def test_eight_parallel_heartbeat_new_on_a_fresh_state_dir(self, tmp_path: Path) -> None:
        """Eight real ``heartbeat new`` started together on a fresh state dir: all exit 0, all in the ledger."""
        state = tmp_path / "state"
        procs = [
            subprocess.Popen([sys.executable, "-m", "heartbeat", "new", f"t{i}", "--task", "x", "--step", "y",
                              "--workdir", str(tmp_path)],
                             env=clean_env(HEARTBEAT_STATE_DIR=str(state)), stderr=subprocess.PIPE, text=True)
            for i in range(8)
        ]
        errors = [proc.communicate(timeout=60)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * 8, errors
        assert sorted(os.listdir(state / "batons")) == sorted(f"t{i}.toml" for i in range(8))
        store = FileStore(str(state))
        assert sorted(e.task for e in store.ledger.events(kinds=["created"])) == sorted(f"t{i}" for i in range(8))
        store.close()


def _corrupt(state: Path, sql: str, *params: object) -> None:
    """Change ledger rows behind heartbeat's back, as a hand edit or a bit flip would."""
    with sqlite3.connect(state / "ledger.sqlite3") as db:
        db.execute(sql, params)


class TestCorruptLedgerRows:
    """One unreadable ledger row is skipped and reported once; it never stops a reader or the daemon."""

    @pytest.mark.parametrize("sql", [
        "UPDATE events SET data = '{oops' WHERE id = ?",
        "UPDATE events SET ts = 1e300 WHERE id = ?",
        "UPDATE events SET ts = 'soon' WHERE id = ?",
        "UPDATE events SET revision = 'x' WHERE id = ?",
        "UPDATE events SET data = '[1]' WHERE id = ?",
    ])
    def test_log_and_report_skip_the_row(self, hb: Callable[..., Result], state_dir: Path, sql: str) -> None:
        """``log`` and ``report`` exit 0 with one warning naming the row, and ``report`` counts it."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        assert hb("set", "a", "step=two").code == 0
        _corrupt(state_dir, sql, 1)
        r = hb("log", "a")
        assert r.code == 0, r.err
        assert "updated" in r.out and "created" not in r.out
        assert r.err.count("\n") == 1 and "ledger row 1 is unreadable" in r.err, r.err
        r = hb("report", "--json")
        assert r.code == 0, r.err
        assert json.loads(r.out)["unreadable_ledger_rows"] == 1
        r = hb("report")
        assert r.code == 0 and "1 unreadable row(s) skipped" in r.out, (r.out, r.err)

    def test_a_write_after_a_corrupt_touch_row_lands(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """A touch whose predecessor row has a broken time still lands (no coalescing into it)."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        assert hb("touch", "a").code == 0
        _corrupt(state_dir, "UPDATE events SET ts = 'soon' WHERE kind = 'touched'")
        r = hb("touch", "a")
        assert r.code == 0, r.err

    def test_the_daemon_keeps_serving(self, tmp_path: Path) -> None:
        """With a corrupt row in the ledger the daemon dispatches new tasks and logs the row once."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, agent=[*TOY, "--step-time", "0.05", "--steps-per-shift", "1"])
        try:
            h.new("old")
            _corrupt(h.state, "UPDATE events SET data = '{oops', ts = 'x' WHERE task = 'old'")
            h.start()
            h.new("fresh")
            h.wait(lambda: h.events("fresh", "dispatched"), "the fresh task to be dispatched")
            h.wait(lambda: [e for e in h.log() if e.get("event") == "tick"][3:], "a few ticks")
            assert not [e for e in h.log() if e.get("event") in ("tick_failed", "task_failed")]
            reported = [e for e in h.log() if e.get("event") == "ledger_row_unreadable"]
            assert [e["row"] for e in reported] == [1], reported
        finally:
            h.close()


_STOPS = {
    "block": ("block", "--on", "a human", "--gate", "human"),
    "done": ("done", "--note", "finished by hand"),
    "snooze": ("snooze", "--for", "1h"),
}
_STOP_KINDS = {"blocked", "done", "snoozed"}
_RESUME_KINDS = {"unblocked", "retried", "woke", "bypass"}


def _dispatched_while_stopped(events: list[Any]) -> list[str]:
    """Every ``dispatched`` whose last status change before it was a block, done or snooze."""
    bad, stopped = [], ""
    for e in events:
        if e.kind in _STOP_KINDS:
            stopped = f"{e.kind}@rev{e.revision}"
        elif e.kind in _RESUME_KINDS:
            stopped = ""
        elif e.kind == "dispatched" and stopped:
            bad.append(f"{e.task}: {stopped} then dispatched@rev{e.revision}")
    return bad


class _WritesBetweenDecisionAndDispatch(FileStore):
    """A file store whose next ``load`` (the daemon's reload in its launch) first runs a real
    ``heartbeat`` write: the human's block lands after the decision and before the dispatch."""

    cli_args: tuple[str, ...] = ()

    def load(self, task_id: str) -> Any:
        if self.cli_args:
            args, self.cli_args = self.cli_args, ()
            r = subprocess.run([sys.executable, "-m", "heartbeat", args[0], task_id, *args[1:]],
                               env=clean_env(HEARTBEAT_STATE_DIR=self.state_dir), capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stderr
        return FileStore.load(self, task_id)


# A real ``heartbeat`` write that waits, CLI loaded, for a baton to appear, then a delay.
_AFTER_THE_BATON = """\
import os, sys, time
import heartbeat.cli.main, heartbeat.tasks.verbs, heartbeat.store.files, tomli_w
path, delay = sys.argv[1], float(sys.argv[2])
while not os.path.exists(path):
    time.sleep(0.001)
time.sleep(delay)
sys.exit(heartbeat.cli.main.main(sys.argv[3:]))
"""


class TestNoDispatchAfterAStop:
    """A block, done or snooze written after the daemon decided to dispatch wins: no agent is launched."""

    @pytest.mark.parametrize("verb", sorted(_STOPS))
    def test_a_stop_between_decision_and_dispatch_aborts_the_launch(self, tmp_path: Path, verb: str) -> None:
        """The stop lands between the decision and the phase-1 write: no dispatch, no brief, no launch."""
        from heartbeat.daemon import Daemon
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        state, config = in_process_config(tmp_path)
        store = _WritesBetweenDecisionAndDispatch(str(state))
        d = Daemon(config, store=store)
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            store.cli_args = _STOPS[verb]
            d.tick()
            assert not store.cli_args, "the daemon never reloaded the baton to launch it"
            assert d.shared.launchers["agent"].launches == []
            assert store.ledger.events("t", kinds=["dispatched", "launched"]) == []
            assert not (state / "logs" / "t").exists()
            assert store.load("t").meta.owner is None
            d.tick()
            assert d.shared.launchers["agent"].launches == []
        finally:
            d.shutdown()

    def test_a_write_between_decision_and_dispatch_is_looked_at_again(self, tmp_path: Path) -> None:
        """A harmless write (a new step) racing the dispatch: the launch waits for a fresh look, then goes."""
        from heartbeat.daemon import Daemon
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        state, config = in_process_config(tmp_path)
        store = _WritesBetweenDecisionAndDispatch(str(state))
        d = Daemon(config, store=store)
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            store.cli_args = ("set", "step=s2")
            d.tick()
            assert d.shared.launchers["agent"].launches == []
            d.tick()
            (launch,) = d.shared.launchers["agent"].launches
            assert "s2" in launch.brief_text
        finally:
            d.shutdown()

    def test_stops_racing_new_tasks_never_get_an_agent(self, tmp_path: Path) -> None:
        """Thirty tasks each blocked, done or snoozed 0-150 ms after ``new`` against a real daemon:
        no dispatch follows a stop, and no agent runs for a task stopped before its first dispatch."""
        import random
        import threading

        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, tick="100ms", agent=[*TOY, "--step-time", "30"])
        rng = random.Random(8)
        plan = [(f"r{i}", rng.choice(sorted(_STOPS)), rng.uniform(0, 0.15)) for i in range(30)]
        errors: list[str] = []

        def race(task_id: str, verb: str, delay: float) -> None:
            # The stop's process is started first and waits, CLI loaded, for the baton to appear.
            racer = subprocess.Popen(
                [sys.executable, "-c", _AFTER_THE_BATON, str(h.state / "batons" / f"{task_id}.toml"), str(delay),
                 "--state-dir", str(h.state), *_STOPS[verb][:1], task_id, *_STOPS[verb][1:]],
                env=h.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            h.new(task_id)
            err = racer.communicate(timeout=60)[1]
            if racer.returncode not in (0, 4, 5):
                errors.append(f"{task_id} {verb}: {racer.returncode} {err}")

        try:
            h.start()
            for start in range(0, len(plan), 3):
                threads = [threading.Thread(target=race, args=p) for p in plan[start:start + 3]]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=120)
            assert not errors, errors
            ticks = len([e for e in h.log() if e.get("event") == "tick"])
            h.wait(lambda: len([e for e in h.log() if e.get("event") == "tick"]) > ticks + 5, "five more ticks")
            bad: list[str] = []
            stopped_first: set[str] = set()
            for task_id, _, _ in plan:
                events = h.events(task_id)
                bad += _dispatched_while_stopped(events)
                first = next((e.kind for e in events if e.kind == "dispatched" or e.kind in _STOP_KINDS), "")
                if first in _STOP_KINDS:
                    stopped_first.add(task_id)
            assert not bad, bad
            running = set(h.live_agents())
            assert not running & stopped_first, sorted(running & stopped_first)
            print(f"{len(stopped_first)} of {len(plan)} tasks stopped before their first dispatch")
        finally:
            h.close()


class TestOneDaemonPerStateDir:
    """A second daemon on a state dir exits 1 at once, naming the one that holds it."""

    def test_second_run_once_and_dry_run_are_refused(self, tmp_path: Path) -> None:
        """While a daemon runs, ``run``, ``run --once`` and ``run --dry-run`` exit 1 naming its pid; then they run."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path)
        try:
            h.start()
            assert h.proc is not None
            for extra in ((), ("--once",), ("--dry-run",)):
                r = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(h.config), "run", *extra],
                                   capture_output=True, text=True, env=h.env(), timeout=30)
                assert r.returncode == 1, (extra, r.stdout, r.stderr)
                assert r.stderr.count("\n") == 1, r.stderr
                assert f"another daemon (pid {h.proc.pid}) is running" in r.stderr and str(h.state) in r.stderr
            assert h.proc.poll() is None
            assert h.stop() == 0
            r = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(h.config), "run", "--once"],
                               capture_output=True, text=True, env=h.env(), timeout=30)
            assert r.returncode == 0, r.stderr
        finally:
            h.close()

    def test_the_lock_dies_with_a_killed_daemon(self, tmp_path: Path) -> None:
        """A SIGKILLed daemon leaves no lock behind: the next one starts."""
        import signal

        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path)
        try:
            h.start()
            h.kill(signal.SIGKILL)
            h.start()
            assert h.proc is not None and h.proc.poll() is None
        finally:
            h.close()


class TestRestoredBaton:
    """A baton copied back from a backup loses no history, continues above it, and its dropped block is held."""

    def test_a_write_after_a_restore_keeps_every_event(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """Restore revision 1 over revision 3, then write: no event is deleted, the write is revision 4,
        and a ``restored`` event says what was found."""
        import shutil

        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        baton = state_dir / "batons" / "a.toml"
        backup = state_dir.parent / "a.toml.bak"
        shutil.copy(baton, backup)
        assert hb("set", "a", "step=two").code == 0
        assert hb("block", "a", "--on", "legal review").code == 0
        store = FileStore(str(state_dir))
        before = [(e.id, e.kind, e.revision) for e in store.ledger.events("a")]
        assert [k for _, k, _ in before] == ["created", "updated", "blocked"]
        shutil.copy(backup, baton)  # the human act: cp keeps the inode, the file says revision 1
        r = hb("set", "a", "step=three")
        assert r.code == 0, r.err
        after = [(e.id, e.kind, e.revision) for e in store.ledger.events("a")]
        assert after[:3] == before
        assert [(k, rev) for _, k, rev in after[3:]] == [("restored", 4), ("updated", 4)]
        restored = store.ledger.events("a", kinds=["restored"])[0]
        assert restored.data["found_revision"] == 1 and restored.data["highest_revision"] == 3
        assert store.load("a").meta.revision == 4
        store.close()

    def test_the_daemon_holds_the_dropped_block_and_report_counts_it(self, tmp_path: Path) -> None:
        """A blocked task restored from an active backup, then written: the daemon restores the block
        (a bypass), dispatches nothing, and ``report`` counts one bypass."""
        import shutil

        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path)
        try:
            h.new("t")
            baton = h.state / "batons" / "t.toml"
            backup = tmp_path / "t.toml.bak"
            shutil.copy(baton, backup)
            r = h.cli("block", "t", "--on", "the release manager")
            assert r.returncode == 0, r.stderr
            shutil.copy(backup, baton)
            r = h.cli("set", "t", "next_step=restored from last night's backup")
            assert r.returncode == 0, r.stderr
            h.start()
            h.wait(lambda: h.events("t", "bypass"), "the daemon to hold the dropped block")
            ticks = len([e for e in h.log() if e.get("event") == "tick"])
            h.wait(lambda: len([e for e in h.log() if e.get("event") == "tick"]) > ticks + 3, "three more ticks")
            assert h.events("t", "dispatched") == []
            assert not h.live_agents("t")
            assert h.baton("t").meta.status.value == "blocked"
            assert [e.kind for e in h.events("t") if e.kind != "touched"][:2] == ["created", "blocked"]
            revisions = [e.revision for e in h.events("t")]
            assert revisions == sorted(revisions), revisions
            r = h.cli("report", "--json")
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["totals"]["bypassed_blocks"] == 1
        finally:
            h.close()


class TestPendingWrites:
    """Only the events of a write that never reached its rename are ever removed, and exactly those."""

    class Died(Exception):
        pass

    def _die(self, *args: object, **kwargs: object) -> None:
        raise self.Died

    def test_a_write_killed_after_its_rename_keeps_its_events(
        self, file_store: FileStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The baton landed but its 'landed' mark did not: the next write finds that baton and keeps the events."""
        from heartbeat.tasks import verbs as tasks

        tasks.new_task(file_store, "k", task="t", step="s")
        with monkeypatch.context() as patch:
            patch.setattr(file_store.ledger, "landed", self._die)
            with pytest.raises(self.Died):
                tasks.block(file_store, "k", "legal", Gate.parse("human"))
        assert file_store.load("k").meta.status.value == "blocked"
        tasks.unblock(file_store, "k", by="ann")
        assert [(e.kind, e.revision) for e in file_store.ledger.events("k")] == [
            ("created", 1), ("blocked", 2), ("unblocked", 3)]

    def test_a_write_killed_before_its_rename_then_a_restore_keeps_everything(
        self, file_store: FileStore, monkeypatch: pytest.MonkeyPatch, state_dir: Path
    ) -> None:
        """A crashed write followed by a hand-restored baton proves nothing: no event is removed."""
        import shutil

        from heartbeat.tasks import verbs as tasks

        tasks.new_task(file_store, "k", task="t", step="s")
        backup = state_dir.parent / "k.bak"
        shutil.copy(file_store.path_of("k"), backup)
        tasks.set_fields(file_store, "k", {"step": "two"})
        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", self._die)
            with pytest.raises(self.Died):
                tasks.set_fields(file_store, "k", {"step": "three"})
        shutil.copy(backup, file_store.path_of("k"))  # revision 1 again: neither the crashed write's base nor new
        tasks.set_fields(file_store, "k", {"step": "four"})
        kinds = [(e.kind, e.revision, e.data.get("step")) for e in file_store.ledger.events("k")]
        assert kinds == [("created", 1, "s"), ("updated", 2, "two"), ("updated", 3, "three"),
                         ("restored", 4, None), ("updated", 4, "four")]
        assert file_store.load("k").meta.revision == 4

    def test_a_recreated_task_id_continues_above_its_old_history(self, file_store: FileStore) -> None:
        """A baton deleted and created again under the same id keeps the old events and starts above them."""
        from heartbeat.tasks import verbs as tasks

        tasks.new_task(file_store, "k", task="t", step="s")
        tasks.set_fields(file_store, "k", {"step": "two"})
        os.unlink(file_store.path_of("k"))
        created = tasks.new_task(file_store, "k", task="t", step="again")
        assert created.meta.revision == 3
        assert [(e.kind, e.revision) for e in file_store.ledger.events("k")] == [
            ("created", 1), ("updated", 2), ("created", 3)]
