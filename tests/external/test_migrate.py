"""``heartbeat migrate`` never exits 0 with a target that contradicts its source (issue 20).

With a daemon running on the source, a migration copied a moment of a live store; a person
then blocked a task, and a second ``migrate`` said "copied 0, kept 3" and exited 0, leaving
the task active in the target. Now a migration refuses to run beside a daemon on either
store, and a re-run refuses a target that contradicts the source, writing nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Result
from daemon_harness import TOY, DaemonHarness

from heartbeat.store.files import FileStore


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli



def _one_line(r: Result, code: int, *fragments: str) -> None:
    assert r.code == code, (r.code, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _tasks(hb: Callable[..., Result], *ids: str) -> None:
    for task_id in ids:
        r = hb("new", task_id, "--task", f"task {task_id}", "--step", "one", "--blocked-on", "setup")
        assert r.code == 0, r.err


def _ledger(state: Path) -> list[tuple[str, str, int]]:
    store = FileStore(str(state))
    try:
        return [(e.task, e.kind, e.revision) for e in store.ledger.events()]
    finally:
        store.close()


@pytest.mark.slow
class TestBesideARunningDaemon:
    """A store a daemon runs on is not migrated: one line saying how to stop it first."""

    def test_a_daemon_on_the_source_is_named_and_nothing_is_copied(self, tmp_path: Path,
                                                                   hb: Callable[..., Result]) -> None:
        """With ``heartbeat run`` on the source, migrate exits 1 naming its pid and how to stop it;
        the target gets nothing (on c684e38: exit 0, "copied 2 baton(s)", a copy of a moving store)."""
        tmp_path.chmod(0o700)
        (tmp_path / "src").mkdir(mode=0o700)
        h = DaemonHarness(tmp_path / "src", agent=[*TOY, "--mode", "spin"])
        try:
            h.new("m1")
            h.start()
            h.wait(lambda: h.events("m1", "dispatched"), "the first dispatch")
            target = tmp_path / "dst"
            r = hb("migrate", "--from", str(h.state), "--to", str(target))
            assert h.proc is not None
            _one_line(r, 1, "--from", f"pid {h.proc.pid}", "stop it first", "then migrate")
            assert not (target / "batons").exists() or not list((target / "batons").iterdir())
        finally:
            h.close()

    def test_a_daemon_on_the_target_is_named_and_nothing_is_written(self, tmp_path: Path, state_dir: Path,
                                                                    hb: Callable[..., Result]) -> None:
        """A daemon already running on the target state dir: refused the same way, the target untouched."""
        tmp_path.chmod(0o700)
        _tasks(hb, "m1", "m2")
        (tmp_path / "dst").mkdir(mode=0o700)
        h = DaemonHarness(tmp_path / "dst")
        try:
            h.start()
            r = hb("migrate", "--from", str(state_dir), "--to", str(h.state))
            assert h.proc is not None
            _one_line(r, 1, "--to", f"pid {h.proc.pid}", "stop it first")
            assert not list((h.state / "batons").glob("*.toml"))
        finally:
            h.close()


class TestReRuns:
    """A second migrate carries what it can and refuses what contradicts; never a silent stale copy."""

    def test_a_baton_changed_since_the_first_copy_is_refused_and_nothing_written(
            self, tmp_path: Path, state_dir: Path, hb: Callable[..., Result]) -> None:
        """The first copy, then a person unblocks m1 on the source: the re-run exits 5 naming m1,
        writes nothing, and says what to do (on c684e38: exit 0, "kept 2", m1 blocked in the target
        and active in the source)."""
        _tasks(hb, "m1", "m2")
        target = tmp_path / "dst"
        first = hb("migrate", "--from", str(state_dir), "--to", str(target))
        assert first.code == 0, first.err
        assert hb("unblock", "m1", "--by", "alice").code == 0
        before = ((target / "batons" / "m1.toml").read_bytes(), _ledger(target))
        again = hb("migrate", "--from", str(state_dir), "--to", str(target))
        _one_line(again, 5, "m1", "contradicts", "nothing was written")
        assert ((target / "batons" / "m1.toml").read_bytes(), _ledger(target)) == before

    def test_a_target_written_since_the_first_copy_is_refused(self, tmp_path: Path, state_dir: Path,
                                                              hb: Callable[..., Result]) -> None:
        """The target moved on (a write there after the copy): the re-run refuses rather than keep it silently."""
        _tasks(hb, "m1")
        target = tmp_path / "dst"
        assert hb("migrate", "--from", str(state_dir), "--to", str(target)).code == 0
        assert hb("--state-dir", str(target), "set", "m1", "step=two").code == 0
        again = hb("migrate", "--from", str(state_dir), "--to", str(target))
        _one_line(again, 5, "m1", "contradicts")

    def test_events_added_since_with_the_same_batons_are_carried(self, tmp_path: Path, state_dir: Path,
                                                                 hb: Callable[..., Result]) -> None:
        """A `verify` records an event and leaves the baton as it was: the re-run copies that event,
        exit 0, and the two ledgers agree; a third run copies nothing."""
        _tasks(hb, "m1", "m2")
        target = tmp_path / "dst"
        assert hb("migrate", "--from", str(state_dir), "--to", str(target)).code == 0
        r = hb("verify", "m1")
        assert r.code == 4, r.err  # blocked: not active; a verified event all the same
        again = hb("migrate", "--from", str(state_dir), "--to", str(target))
        assert again.code == 0, again.err
        assert again.out.strip() == "copied 0 baton(s) and 1 event(s); kept 2 baton(s) the target already had"
        assert _ledger(target) == _ledger(state_dir)
        third = hb("migrate", "--from", str(state_dir), "--to", str(target))
        assert third.out.strip() == "copied 0 baton(s) and 0 event(s); kept 2 baton(s) the target already had"

    def test_the_same_store_twice_is_refused(self, state_dir: Path, hb: Callable[..., Result]) -> None:
        """--from and --to naming one state dir: a one-line error, not a lock taken twice."""
        _tasks(hb, "m1")
        r = hb("migrate", "--from", str(state_dir), "--to", str(state_dir) + "/")
        _one_line(r, 2, "same store")


@pytest.mark.slow
class TestBesideADaemonOnADatabase:
    """A daemon on a PostgreSQL store holds its host's advisory lock there, not a state dir's lock
    file: migrate checks the database for one."""

    @pytest.mark.parametrize("side", ["--from", "--to"])
    def test_a_daemon_on_the_database_is_refused_and_nothing_written(
            self, side: str, pg_url: str, tmp_path: Path, state_dir: Path, hb: Callable[..., Result]) -> None:
        """The lock a daemon takes (``claim_daemon``, held here as ``heartbeat run`` holds it): exit 1,
        one line, nothing copied (on main 5107149: exit 0 and "copied 1 baton(s)", a copy of a moving
        store, as issue 20 item 3 found for a state dir)."""
        from heartbeat.store.postgres.store import PostgresStore

        (tmp_path / "dst").mkdir(mode=0o700)
        daemon = PostgresStore(pg_url)
        try:
            if side == "--from":
                _tasks(hb, "seed")
                assert hb("migrate", "--from", str(state_dir), "--to", pg_url).code == 0
                daemon.claim_daemon("host-a")
                target = tmp_path / "dst"
                r = hb("migrate", "--from", pg_url, "--to", str(target))
                _one_line(r, 1, "--from", "a daemon", "stop it first")
                assert not (target / "batons").exists() or not list((target / "batons").glob("*.toml"))
            else:
                _tasks(hb, "m1")
                daemon.claim_daemon("host-a")
                r = hb("migrate", "--from", str(state_dir), "--to", pg_url)
                _one_line(r, 1, "--to", "a daemon", "stop it first")
                assert daemon.scan() == []
        finally:
            daemon.close()
