"""A rolling upgrade: heartbeat N and N+1 side by side on one store, for real.

PostgreSQL: a throwaway cluster; "N+1" is ``tests/support/newer_heartbeat.py``, the installed heartbeat plus one
additive migration (a column and a table) that it applies with ``db upgrade`` and requires to run. The
installed heartbeat (N) keeps running daemons and agents on the upgraded database, until a migration
raises ``min_reader`` above N: then N refuses in one line. The file store: ``format.toml`` in the state
dir; a dir of a newer format that N may not use is refused in one line and nothing in it changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from daemon_harness import TOY

from heartbeat.model import defaults
from heartbeat.model.errors import StoreError
from heartbeat.store.files import FileStore, format_text
from heartbeat.store.postgres.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    min_reader_of,
    schema_refusal,
    schema_state,
    upgrade,
)
from heartbeat.store.postgres.store import PostgresStore
from heartbeat.tasks import verbs as tasks
from tests.external.test_leased_daemons import Host, hosts_of, new_tasks
from tests.support.newer_heartbeat import NEXT, NEXT_MIGRATION

NEWER = str(Path(__file__).parents[1] / "support" / "newer_heartbeat.py")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    env.pop("NOTIFY_SOCKET", None)
    return {**env, **extra}


def _heartbeat(*args: str, url: str, cwd: Path, newer: str = "") -> subprocess.CompletedProcess[str]:
    """The installed heartbeat (N), or with ``newer`` (``"next"``/``"raise"``) tests/support/newer_heartbeat.py (N+1)."""
    if newer:
        argv = [sys.executable, NEWER, *(["--raise-min-reader"] if newer == "raise" else []), *args]
    else:
        argv = [sys.executable, "-m", "heartbeat", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=_env(HEARTBEAT_STORE_URL=url), cwd=str(cwd),
                          timeout=120)


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


class NewerHost(Host):
    """A daemon of heartbeat N+1 (tests/support/newer_heartbeat.py); its agents run the installed heartbeat, N."""

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, NEWER, "--config", str(self.config), "run"],
                                     stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=str(self.root))
        log.close()
        self.wait_log(lambda e: e.get("event") == "started" and e.get("pid") == self.proc.pid, "daemon start", timeout=60)


class TestTheRule:
    """Which code may use which schema: a pure function of (version, min_reader, this code's version)."""

    @pytest.mark.parametrize(("version", "floor", "ours", "refused"), [
        (2, 2, 2, None),  # the same version
        (3, 2, 2, None),  # newer, additive: older code beside it
        (5, 2, 2, None),  # several additive versions ahead
        (3, 3, 2, "needs a heartbeat of schema 3 or newer"),  # newer, and older code may not use it
        (1, 1, 2, "needs `heartbeat db upgrade`"),  # older: this code needs its migrations
        (0, 0, 2, "needs `heartbeat db upgrade`"),  # never upgraded
    ])
    def test_who_may_use_which_schema(self, version: int, floor: int, ours: int, refused: str | None) -> None:
        """S == V opens; S > V opens while min_reader <= V; a too-new or too-old schema is one line naming both."""
        found = schema_refusal(version, floor, "db@host", ours)
        if refused is None:
            assert found is None
        else:
            assert found is not None and refused in str(found) and "\n" not in str(found)
            assert f"version {version}" in str(found) and str(ours) in str(found)

    def test_min_reader_is_kept_unless_a_migration_raises_it(self) -> None:
        """A version left out of MIN_READER keeps the one before (migrations are additive by default); a
        raise takes effect from its version and never lowers again nor passes the version itself."""
        assert [min_reader_of(v) for v in range(1, SCHEMA_VERSION + 1)] == list(range(1, SCHEMA_VERSION + 1))
        table = {1: 1, 2: 2, 5: 4, 6: 1, 7: 9}
        assert [min_reader_of(v, table) for v in range(1, 8)] == [1, 2, 2, 2, 4, 4, 7]


def _newer_schema(url: str, *, raise_min_reader: bool = False) -> None:
    """What N+1's ``db upgrade`` does to the database."""
    before, after = upgrade(url, migrations={**MIGRATIONS, NEXT: NEXT_MIGRATION},
                            min_readers={NEXT: NEXT} if raise_min_reader else None)
    assert (before, after) == (SCHEMA_VERSION, NEXT)


class TestPostgresSideBySide:
    def test_an_older_heartbeat_keeps_writing_beside_an_additive_migration(self, pg_url: str, tmp_path: Path) -> None:
        """After N+1's additive migration, N opens the store, creates and edits tasks, and its CLI answers;
        `db status` says the schema is usable and `db upgrade` has nothing to do (it never refuses or
        downgrades). Fails on c31a8a9: N refuses any newer schema ("newer than this heartbeat knows")."""
        _newer_schema(pg_url)
        with psycopg.connect(pg_url) as conn:
            assert schema_state(conn) == (NEXT, SCHEMA_VERSION)
        store = PostgresStore(pg_url)
        try:
            tasks.new_task(store, "after", task="written by N", step="one", workdir=str(tmp_path))
            with store.edit("after") as ed:
                ed.baton.step = "two"
            assert store.load("after").step == "two"
            assert store.schema == (NEXT, SCHEMA_VERSION)
        finally:
            store.close()
        r = _heartbeat("set", "after", "step=three", url=pg_url, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        status = _heartbeat("db", "status", url=pg_url, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert status.stdout.strip() == (
            f"schema version {NEXT} (min_reader {SCHEMA_VERSION}); this heartbeat uses {SCHEMA_VERSION}")
        again = _heartbeat("db", "upgrade", url=pg_url, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "newer than this heartbeat" in again.stdout and "nothing to do" in again.stdout
        with psycopg.connect(pg_url) as conn:
            assert schema_state(conn) == (NEXT, SCHEMA_VERSION)
            assert conn.execute("SELECT count(*) FROM heartbeat_next_release").fetchone() == (0,)

    @pytest.mark.slow
    def test_an_n_plus_1_daemon_beside_an_n_daemon_and_n_agents(self, pg_url: str, tmp_path: Path) -> None:
        """The rolling upgrade on two hosts, live: host-b runs N with two agents mid-task when host-a, now N+1,
        runs `db upgrade` (the next migration) and starts its daemon (its agents are N). Both daemons dispatch,
        and every task finishes every step, written by N agents started before and after the upgrade.
        Fails on c31a8a9: every N process opened after the upgrade refuses the schema (no task finishes)."""
        tmp_path.chmod(0o700)
        agent = [*TOY, "--step-time", "1"]
        a = NewerHost(tmp_path / "a", pg_url, "host-a", agent=agent, max_concurrent=2, stall_after="30s")
        b = Host(tmp_path / "b", pg_url, "host-b", agent=agent, max_concurrent=2, stall_after="30s")
        ids = [f"roll-{i}" for i in range(8)]
        try:
            new_tasks(b.store, ids, tmp_path, plan=2)  # type: ignore[arg-type]
            b.start()  # the fleet on N, at capacity: host-a will surely find work left
            b.wait(lambda: len(b.live_agents()) == 2, "host-b running two agents", timeout=60)
            up = _heartbeat("db", "upgrade", url=pg_url, cwd=tmp_path, newer="next")
            assert up.returncode == 0, up.stderr
            assert up.stdout.strip() == f"schema at version {NEXT} (was {SCHEMA_VERSION})"
            a.start()

            def all_done() -> bool:
                return all(b.store.load(t).status.value == "done" for t in ids)

            b.wait(all_done, "every task done on the mixed fleet", timeout=120, interval=0.2)
            for t in ids:
                baton = b.store.load(t)
                assert baton.done == baton.plan == ["step 1", "step 2"], (t, baton.done)
            hosts = {h for t in ids for h in hosts_of(b.store, t)}  # type: ignore[arg-type]
            assert hosts == {"host-a", "host-b"}, hosts
            assert a.proc is not None and a.proc.poll() is None and b.proc is not None and b.proc.poll() is None
        finally:
            for h in (a, b):
                h.close()
        with psycopg.connect(pg_url) as conn:
            assert schema_state(conn) == (NEXT, SCHEMA_VERSION)

    def test_a_migration_raising_min_reader_stops_n_in_one_line(self, pg_url: str, tmp_path: Path) -> None:
        """Once a migration raises min_reader above N, N's store, CLI, agent writes, `db upgrade` and daemon
        each refuse in one line (exit 1), naming both versions and what to do; no traceback, nothing written."""
        store = PostgresStore(pg_url)
        tasks.new_task(store, "kept", task="before", step="one", workdir=str(tmp_path))
        store.close()
        up = _heartbeat("db", "upgrade", url=pg_url, cwd=tmp_path, newer="raise")
        assert up.returncode == 0, up.stderr
        with psycopg.connect(pg_url) as conn:
            assert schema_state(conn) == (NEXT, NEXT)
        want = f"schema is version {NEXT}, newer than this heartbeat knows ({SCHEMA_VERSION}), and needs a heartbeat"
        with pytest.raises(StoreError, match=re.escape(want)):
            PostgresStore(pg_url)
        for args in (["status"], ["set", "kept", "step=two"], ["db", "upgrade"]):
            r = _heartbeat(*args, url=pg_url, cwd=tmp_path)
            assert r.returncode == 1 and want in _one_line(r) and "upgrade heartbeat on this host" in r.stderr, args
        status = _heartbeat("db", "status", url=pg_url, cwd=tmp_path)
        assert status.returncode == 1 and f"(min_reader {NEXT})" in status.stdout
        tmp_path.chmod(0o700)
        root = tmp_path / "old"
        root.mkdir(mode=0o700)
        (root / "state").mkdir(mode=0o700)
        config = root / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = {json.dumps(str(root / "state"))}\n\n'
                          f'[store]\nurl = {json.dumps(pg_url)}\n')
        config.chmod(0o600)
        run = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(config), "run"], capture_output=True,
                             text=True, env=_env(), cwd=str(root), timeout=120)
        assert run.returncode == 1 and want in run.stderr and "Traceback" not in run.stderr, run.stderr
        with psycopg.connect(pg_url) as conn:
            body = conn.execute("SELECT body FROM heartbeat_batons WHERE id = 'kept'").fetchone()
        assert body is not None and 'step = "one"' in body[0]
        newer = _heartbeat("set", "kept", "step=two", url=pg_url, cwd=tmp_path, newer="raise")
        assert newer.returncode == 0, newer.stderr  # N+1 itself uses what it made

    def test_a_database_of_a_heartbeat_before_min_reader(self, pg_url: str, tmp_path: Path) -> None:
        """A database whose heartbeat_schema has no min_reader (written before it existed) opens at the same
        version; `db upgrade` records min_reader = version for every row, so nothing older gains access."""
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE heartbeat_schema DROP COLUMN min_reader")
        PostgresStore(pg_url).close()
        r = _heartbeat("db", "upgrade", url=pg_url, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == f"schema at version {SCHEMA_VERSION} (nothing to do)"
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT version, min_reader FROM heartbeat_schema ORDER BY version").fetchall()
        assert rows == [(v, v) for v in range(1, SCHEMA_VERSION + 1)]


# -- the file store ----------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a digest of its bytes (and every directory), to show nothing changed."""
    seen: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            seen[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                seen[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return seen


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "heartbeat", "--state-dir", str(state), *args], capture_output=True,
                          text=True, env=_env(), cwd=str(state.parent), timeout=120)


@pytest.fixture
def used_state(state_dir: Path) -> Iterator[Path]:
    """A state dir with a task and some ledger history."""
    store = FileStore(str(state_dir))
    tasks.new_task(store, "kept", task="kept", step="one", workdir=str(state_dir.parent))
    with store.edit("kept") as ed:
        ed.baton.step = "two"
    store.close()
    yield state_dir


class TestFileStoreFormat:
    def test_a_state_dir_records_its_format(self, state_dir: Path) -> None:
        """A new state dir gets format.toml (version, min_reader); a dir from before it gets one at its next
        open, and the batons and ledger are left as they were."""
        FileStore(str(state_dir)).close()
        marker = state_dir / "format.toml"
        assert marker.read_text() == format_text(defaults.STATE_FORMAT, defaults.STATE_FORMAT_MIN_READER)
        assert marker.stat().st_mode & 0o777 == 0o600
        marker.unlink()
        before = _tree(state_dir)
        store = FileStore(str(state_dir))
        assert store.format == (defaults.STATE_FORMAT, defaults.STATE_FORMAT_MIN_READER)
        store.close()
        after = _tree(state_dir)
        assert set(after) - set(before) == {"format.toml"}
        assert {k: v for k, v in after.items() if k != "format.toml"} == before

    @pytest.mark.parametrize("args", [
        ["status"], ["show", "kept"], ["set", "kept", "step=three"], ["run"],
        ["new", "more", "--task", "t", "--step", "s", "--intent", "i", "--workdir", "/tmp"],
    ])
    def test_a_too_new_state_dir_is_refused_and_untouched(self, used_state: Path, args: list[str]) -> None:
        """A state dir whose format is newer than this heartbeat and whose min_reader is above it (a newer
        ledger or baton layout) is refused by every command, the daemon too, in one line, exit 1, and not
        one byte in it changes. Fails on c31a8a9: the marker is ignored and the dir read and written."""
        newer = defaults.STATE_FORMAT + 1
        (used_state / "format.toml").write_text(f"version = {newer}\nmin_reader = {newer}\n")
        if args == ["run"]:  # the daemon wants a config; it sits beside the state dir, outside the tree compared
            config = used_state.parent / "heartbeat.toml"
            config.write_text(f"[daemon]\nstate_dir = {json.dumps(str(used_state))}\n")
            config.chmod(0o600)
            args = ["--config", str(config), "run"]
        before = _tree(used_state)
        r = _cli(used_state, *args)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"format is version {newer}, newer than this heartbeat knows ({defaults.STATE_FORMAT})" in _one_line(r)
        assert "upgrade heartbeat on this host" in r.stderr
        after = _tree(used_state)
        if args[-1] == "run":  # the daemon takes its lock (an empty flock file) before it opens the store
            after.pop("daemon.lock", None)
        assert after == before

    def test_a_newer_state_dir_an_older_heartbeat_may_use(self, used_state: Path) -> None:
        """A newer format whose min_reader this heartbeat meets is used as usual, and its marker kept as is."""
        text = f"version = {defaults.STATE_FORMAT + 1}\nmin_reader = {defaults.STATE_FORMAT}\nnote = 'newer'\n"
        (used_state / "format.toml").write_text(text)
        r = _cli(used_state, "set", "kept", "step=three")
        assert r.returncode == 0, r.stderr
        assert _cli(used_state, "status").returncode == 0
        assert (used_state / "format.toml").read_text() == text

    @pytest.mark.parametrize(("content", "says"), [
        (b"version = 'two'\n", "no whole version"),
        (b"version = 2\nmin_reader = true\n", "no whole min_reader"),
        (b"min_reader = 1\n", "no whole version"),
        (b"version = [\n", "not TOML"),
        (b"\xff\xfe" * 3000, "not TOML"),
    ])
    def test_a_damaged_marker_is_one_line(self, used_state: Path, content: bytes, says: str) -> None:
        """A marker that does not say a version is refused in one line naming it and what it should say; the
        dir is left as it is (heartbeat does not guess a format)."""
        (used_state / "format.toml").write_bytes(content)
        before = _tree(used_state)
        r = _cli(used_state, "status")
        assert r.returncode == 1 and says in _one_line(r) and "format.toml" in r.stderr, r.stderr
        assert _tree(used_state) == before

    @pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
    def test_a_marker_that_is_not_a_file_is_refused_without_opening_it(self, used_state: Path, kind: str) -> None:
        """A symlink, a FIFO or a directory at format.toml: refused in one line (exit 2), never followed,
        never blocked on."""
        marker = used_state / "format.toml"
        marker.unlink()
        if kind == "symlink":
            target = used_state.parent / "elsewhere.toml"
            target.write_text("version = 1\n")
            marker.symlink_to(target)
        elif kind == "fifo":
            os.mkfifo(marker)
        else:
            marker.mkdir()
        r = _cli(used_state, "status")
        assert r.returncode == 2 and "format.toml" in _one_line(r), r.stderr

    def test_a_process_reads_the_marker_again_once_it_changes(self, used_state: Path) -> None:
        """Within one process a store opened again trusts what it read while format.toml is the same file,
        and reads it again once it is not: a too-new marker put there later is refused at the next open."""
        FileStore(str(used_state)).close()
        FileStore(str(used_state)).close()
        marker = used_state / "format.toml"
        newer = defaults.STATE_FORMAT + 1
        tmp = used_state / "format.toml.new"
        tmp.write_text(f"version = {newer}\nmin_reader = {newer}\n")
        os.replace(tmp, marker)
        with pytest.raises(StoreError, match=f"format is version {newer}"):
            FileStore(str(used_state))
        marker.write_text(format_text())  # the same inode, rewritten in place: its size and mtime moved
        FileStore(str(used_state)).close()

    def test_many_first_opens_write_one_whole_marker(self, state_dir: Path) -> None:
        """Eight processes opening a fresh state dir at once: one marker, whole, and no temp file left."""
        procs = [subprocess.Popen([sys.executable, "-m", "heartbeat", "--state-dir", str(state_dir), "status"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()) for _ in range(8)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        assert (state_dir / "format.toml").read_text() == format_text()
        assert [n for n in os.listdir(state_dir) if n.endswith(".tmp")] == []


def test_newer_heartbeat_helper_is_what_it_claims(pg_url: str, tmp_path: Path) -> None:
    """tests/support/newer_heartbeat.py is one version ahead: it refuses the current schema until its own upgrade."""
    r = _heartbeat("status", url=pg_url, cwd=tmp_path, newer="next")
    assert r.returncode == 1 and f"this heartbeat uses {NEXT}" in r.stderr, r.stderr


class TestADamagedSchemaRow:
    @pytest.mark.parametrize("floor", [-7, 0, 99])
    def test_a_min_reader_out_of_range_is_refused_in_one_line(self, pg_url: str, floor: int) -> None:
        """Issue 24 item 17: ``min_reader = -7`` (or 99 on version 3) was accepted where the file store
        refuses such a format file. Now the store refuses in one line naming both numbers."""
        PostgresStore(pg_url).close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE heartbeat_schema SET min_reader = %s WHERE version = (SELECT max(version) "
                         "FROM heartbeat_schema)", (floor,))
        with pytest.raises(StoreError, match=re.escape(f"min_reader {floor}; min_reader must be")):
            PostgresStore(pg_url)
