"""The PostgreSQL store beyond the shared contract: crashes, concurrent writers, NOTIFY,
schema migrations, moving state between stores, a database that goes away, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from heartbeat.config.load import parse_config
from heartbeat.model.baton import Baton, Meta, Status
from heartbeat.model.errors import ConfigError, StoreError
from heartbeat.store import open_store
from heartbeat.store.files import FileStore
from heartbeat.store.postgres.schema import SCHEMA_VERSION, upgrade
from heartbeat.store.postgres.store import PostgresStore
from tests.conftest import ROOT, Result, clean_env, wait_for
from tests.support.pg import Cluster


def _baton(task_id: str = "t", **fields: object) -> Baton:
    values: dict[str, object] = {"task": "Fix the fallback", "step": "Read the logs"}
    values.update(fields)
    return Baton(meta=Meta(id=task_id), **values)  # type: ignore[arg-type]


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


def _run_cli(*args: str, env: dict[str, str], cwd: Path, input: str | None = None) -> Result:
    proc = subprocess.run([sys.executable, "-m", "heartbeat", *args], env=clean_env(**env), cwd=str(cwd),
                          capture_output=True, text=True, timeout=60, input=input)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _child(code: str) -> subprocess.Popen[str]:
    env = clean_env(PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class TestCrashConsistency:
    def test_writer_killed_mid_transaction_leaves_old_baton_and_no_events(
        self, pg: PostgresStore, pg_url: str, tmp_path: Path
    ) -> None:
        """A writer SIGKILLed after its UPDATE and event INSERTs, before COMMIT: the old baton, no events, no lock left."""
        pg.create(_baton())
        before = pg.load("t")
        events_before = pg.ledger.events("t")
        flag = tmp_path / "in-transaction"
        child = _child(f"""
            import time
            from heartbeat.store.postgres import store as postgres
            original = postgres.append_events
            def append_then_hang(conn, events):
                original(conn, events)
                open({str(flag)!r}, "w").close()
                time.sleep(60)
            postgres.append_events = append_then_hang
            store = postgres.PostgresStore({pg_url!r})
            with store.edit("t") as ed:
                ed.baton.step = "never committed"
                ed.event("blocked", on="x", gate="human")
        """)
        try:
            wait_for(flag.exists, timeout=30, message="the child inside its write transaction")
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
        assert pg.load("t") == before
        assert pg.ledger.events("t") == events_before
        with pg.edit("t") as ed:  # the killed writer's row lock went with its connection
            ed.baton.step = "after the crash"
        assert pg.load("t").meta.revision == before.meta.revision + 1


class TestConcurrentWriters:
    def test_processes_incrementing_lose_no_update(self, pg: PostgresStore, pg_url: str) -> None:
        """Four processes each increment a counter 25 times: it ends at 100, revision 101, 100 events."""
        baton = _baton()
        baton.extra = {"counter": 0}
        pg.create(baton)
        code = f"""
            from heartbeat.store.postgres.store import PostgresStore
            store = PostgresStore({pg_url!r})
            for _ in range(25):
                with store.edit("t") as ed:
                    ed.baton.extra["counter"] = int(ed.baton.extra["counter"]) + 1
            store.close()
        """
        children = [_child(code) for _ in range(4)]
        for child in children:
            _, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
        final = pg.load("t")
        assert final.extra["counter"] == 100
        assert final.meta.revision == 101
        assert len(pg.ledger.events("t", kinds=["updated"])) == 100


class TestNotify:
    def test_watch_hears_a_write_from_another_process(self, pg: PostgresStore, pg_url: str, tmp_path: Path) -> None:
        """watch() calls back with the task id after a commit, here of a CLI write in another process."""
        heard: list[str | None] = []
        stop = pg.watch(heard.append)
        try:
            pg.create(_baton("a"))
            wait_for(lambda: "a" in heard, timeout=10, message="the NOTIFY of create")
            r = _run_cli("set", "a", "next_step=from the CLI", env={"HEARTBEAT_STORE_URL": pg_url}, cwd=tmp_path)
            assert r.code == 0, r.err
            wait_for(lambda: heard.count("a") >= 2, timeout=10, message="the NOTIFY of the CLI's set")
        finally:
            stop()

    def test_a_cancelled_edit_notifies_nothing(self, pg: PostgresStore) -> None:
        """Only committed writes notify: a cancelled edit is silent."""
        pg.create(_baton("a"))
        heard: list[str | None] = []
        stop = pg.watch(heard.append)
        try:
            with pg.edit("a") as ed:
                ed.cancel()
            pg.create(_baton("b"))  # a marker that comes after
            wait_for(lambda: "b" in heard, timeout=10, message="the marker's NOTIFY")
            assert "a" not in heard
        finally:
            stop()


class TestMigrations:
    def test_fresh_database_needs_upgrade_in_one_line(self, pg_empty_url: str, tmp_path: Path) -> None:
        """A store on a database never upgraded says so in one line, and the CLI exits 1."""
        with pytest.raises(StoreError, match=r"needs `heartbeat db upgrade` \(its schema is version 0"):
            PostgresStore(pg_empty_url)
        r = _run_cli("status", env={"HEARTBEAT_STORE_URL": pg_empty_url}, cwd=tmp_path)
        assert r.code == 1
        assert r.err.count("\n") == 1 and "needs `heartbeat db upgrade`" in r.err

    def test_upgrade_is_idempotent(self, pg_empty_url: str, tmp_path: Path) -> None:
        """db upgrade brings a fresh database to the current version; a second run has nothing to do."""
        env = {"HEARTBEAT_STORE_URL": pg_empty_url}
        first = _run_cli("db", "upgrade", env=env, cwd=tmp_path)
        assert first.code == 0, first.err
        assert first.out.strip() == f"schema at version {SCHEMA_VERSION} (was 0)"
        second = _run_cli("db", "upgrade", env=env, cwd=tmp_path)
        assert second.out.strip() == f"schema at version {SCHEMA_VERSION} (nothing to do)"
        assert _run_cli("db", "status", env=env, cwd=tmp_path).code == 0
        PostgresStore(pg_empty_url).close()

    def test_concurrent_upgrades_are_safe(self, pg_empty_url: str) -> None:
        """Four upgrades at once: the advisory lock runs them one after another; exactly one migrates."""
        results: list[tuple[int, int] | BaseException] = []

        def one() -> None:
            try:
                results.append(upgrade(pg_empty_url))
            except BaseException as exc:
                results.append(exc)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(results) == [(0, SCHEMA_VERSION)] + [(SCHEMA_VERSION, SCHEMA_VERSION)] * 3  # type: ignore[type-var]

    def test_newer_schema_is_refused(self, pg_url: str, tmp_path: Path) -> None:
        """A database upgraded by a newer heartbeat is refused, by the store and by db upgrade, in one line."""
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO heartbeat_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
        with pytest.raises(StoreError, match=f"schema is version {SCHEMA_VERSION + 1}, newer than"):
            PostgresStore(pg_url)
        r = _run_cli("db", "upgrade", env={"HEARTBEAT_STORE_URL": pg_url}, cwd=tmp_path)
        assert r.code == 1 and r.err.count("\n") == 1 and "newer than this heartbeat knows" in r.err


_HANDWRITTEN = """\
# written by hand: this comment and the layout must survive
task = "Port the parser"
step = "Write the tests"
custom = { nested = [1, 2] }

[meta]
id = "hand"
status = "active"
revision = 4
epoch = 2
vendor = "x"
"""


def _file_state(state_dir: Path) -> FileStore:
    store = FileStore(str(state_dir))
    store.create(_baton("made", intent="why"))
    with store.edit("made") as ed:
        ed.baton.step = "two"
    (state_dir / "batons" / "hand.toml").write_text(_HANDWRITTEN)
    os.chmod(state_dir / "batons" / "hand.toml", 0o600)
    return store


class TestMoving:
    def test_migrate_copies_verbatim_and_twice_copies_nothing(
        self, state_dir: Path, pg_url: str, tmp_path: Path
    ) -> None:
        """migrate copies each baton's text byte for byte and the ledger; a second run copies nothing."""
        _file_state(state_dir).close()
        first = _run_cli("migrate", "--from", str(state_dir), "--to", pg_url, env={}, cwd=tmp_path)
        assert first.code == 0, first.err
        assert first.out.strip() == "copied 2 baton(s) and 2 event(s)"
        second = _run_cli("migrate", "--from", str(state_dir), "--to", pg_url, env={}, cwd=tmp_path)
        assert second.out.strip() == "copied 0 baton(s) and 0 event(s); kept 2 baton(s) the target already had"
        store = PostgresStore(pg_url)
        try:
            assert store.baton_text("hand") == _HANDWRITTEN
            assert store.baton_text("made") == (state_dir / "batons" / "made.toml").read_text()
            assert [e.kind for e in store.ledger.events("made")] == ["created", "updated"]
            hand = store.load("hand")
            assert hand.extra == {"custom": {"nested": [1, 2]}} and hand.meta.extra == {"vendor": "x"}
            with store.edit("hand") as ed:  # and it goes on from the migrated revision
                ed.baton.step = "next"
            assert store.load("hand").meta.revision == 5
        finally:
            store.close()

    def test_export_import_round_trip_between_stores(self, state_dir: Path, pg_url: str, tmp_path: Path) -> None:
        """file store -> export -> PostgreSQL -> export -> a new state dir: the same bytes and the same ledger."""
        _file_state(state_dir).close()
        dump = tmp_path / "state.jsonl"
        r = _run_cli("export", "--to", str(dump), env={"HEARTBEAT_STATE_DIR": str(state_dir)}, cwd=tmp_path)
        assert r.code == 0, r.err
        assert "exported 2 baton(s) and 2 event(s)" in r.err
        assert dump.stat().st_mode & 0o777 == 0o600  # an export holds every baton
        pg_env = {"HEARTBEAT_STORE_URL": pg_url}
        r = _run_cli("import", str(dump), env=pg_env, cwd=tmp_path)
        assert r.out.strip() == "imported 2 baton(s) and 2 event(s)", r.err
        again = _run_cli("import", str(dump), env=pg_env, cwd=tmp_path)
        assert again.out.strip() == "imported 0 baton(s) and 0 event(s); kept 2 baton(s) the target already had"
        back = _run_cli("export", env=pg_env, cwd=tmp_path)
        assert back.code == 0, back.err
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        r = _run_cli("import", "-", env={"HEARTBEAT_STATE_DIR": str(other)}, cwd=tmp_path, input=back.out)
        assert r.out.strip() == "imported 2 baton(s) and 2 event(s)", r.err
        assert (other / "batons" / "hand.toml").read_text() == _HANDWRITTEN
        assert (other / "batons" / "made.toml").read_bytes() == (state_dir / "batons" / "made.toml").read_bytes()
        original, copied = FileStore(str(state_dir)), FileStore(str(other))
        try:
            strip = [(e.task, e.kind, e.ts, e.epoch, e.revision, e.actor, e.data) for e in original.ledger.events()]
            assert [(e.task, e.kind, e.ts, e.epoch, e.revision, e.actor, e.data)
                    for e in copied.ledger.events()] == strip
        finally:
            original.close()
            copied.close()

    def test_a_malformed_export_is_refused_whole(self, pg: PostgresStore, pg_url: str, tmp_path: Path) -> None:
        """An export with an invalid baton is refused in one line and imports nothing."""
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"heartbeat_export": 1}\n{"baton": "ok", "text": "task = \\"x\\"\\nstep = \\"y\\"\\n"}\n'
                       '{"baton": "broken", "text": "task = 3"}\n')
        r = _run_cli("import", str(bad), env={"HEARTBEAT_STORE_URL": pg_url}, cwd=tmp_path)
        assert r.code == 2 and r.err.count("\n") == 1, r.err
        assert pg.scan() == []


class TestCli:
    def test_real_commands_on_the_postgres_store(self, pg_url: str, tmp_path: Path) -> None:
        """new, set, add, touch, show, status, log and report work with HEARTBEAT_STORE_URL, and write no files."""
        env = {"HEARTBEAT_STORE_URL": pg_url}
        work = tmp_path / "work"
        work.mkdir()
        r = _run_cli("new", "fix", "--task", "Fix it", "--step", "Read", "--workdir", str(work), env=env, cwd=tmp_path)
        assert r.code == 0, r.err
        for args in (("set", "fix", "step=Patch"), ("add", "fix", "done", "Read"), ("touch", "fix")):
            r = _run_cli(*args, env=env, cwd=tmp_path)
            assert r.code == 0, r.err
        show = _run_cli("show", "fix", "--json", env=env, cwd=tmp_path)
        assert json.loads(show.out)["step"] == "Patch"
        status = _run_cli("status", "--json", env=env, cwd=tmp_path)
        assert status.code == 0, status.err
        assert "fix" in status.out
        log = _run_cli("log", "fix", env=env, cwd=tmp_path)
        assert "created" in log.out and "updated" in log.out
        report = _run_cli("report", env=env, cwd=tmp_path)
        assert report.code == 0, report.err
        conflict = _run_cli("set", "fix", "step=x", "--expect-revision", "1", env=env, cwd=tmp_path)
        assert conflict.code == 5 and "expected revision 1" in conflict.err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]

    def test_world_is_fingerprinted_as_on_the_file_store(self, pg_url: str, tmp_path: Path) -> None:
        """A key file changed after the note was written makes verify exit 3 (stale), as on the file store."""
        env = {"HEARTBEAT_STORE_URL": pg_url}
        work = tmp_path / "work"
        work.mkdir()
        (work / "src.py").write_text("v1\n")
        r = _run_cli("new", "w", "--task", "T", "--step", "S", "--workdir", str(work), "--key-file", "src.py",
                     env=env, cwd=tmp_path)
        assert r.code == 0, r.err
        assert _run_cli("verify", "w", env=env, cwd=tmp_path).code == 0
        (work / "src.py").write_text("v2, changed behind the note\n")
        stale = _run_cli("verify", "w", env=env, cwd=tmp_path)
        assert stale.code == 3, stale.out + stale.err

    def test_file_store_hot_path_never_imports_psycopg(self, state_dir: Path) -> None:
        """An agent's touch on the file store does not load psycopg."""
        FileStore(str(state_dir)).create(_baton())
        code = ("import sys; from heartbeat.cli.main import main; rc = main(['touch', 't']); "
                "print(rc, any(m.startswith('psycopg') for m in sys.modules))")
        proc = subprocess.run([sys.executable, "-c", code], env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)),
                              capture_output=True, text=True, timeout=60)
        assert proc.stdout.split() == ["0", "False"], proc.stderr


class TestConfig:
    def test_store_url_is_parsed(self) -> None:
        """[store] url is read; empty means the file store."""
        assert parse_config('[store]\nurl = "postgresql://hb@/hb?host=/run/postgresql"\n').store.url.startswith(
            "postgresql://hb@/")
        assert parse_config("").store.url == ""

    def test_a_url_that_is_not_postgres_is_refused(self) -> None:
        """Any other scheme is a config error naming the key."""
        with pytest.raises(ConfigError, match=r"store\.url"):
            parse_config('[store]\nurl = "mysql://x"\n')

    def test_the_example_documents_store_url(self) -> None:
        """The example config has [store] url, at its default."""
        doc = tomllib.loads((ROOT / "config" / "heartbeat.example.toml").read_text())
        assert doc["store"] == {"url": ""}

    def test_env_url_wins(self, pg_url: str, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """$HEARTBEAT_STORE_URL opens the PostgreSQL store even where a state dir is given."""
        monkeypatch.setenv("HEARTBEAT_STORE_URL", pg_url)
        store = open_store(str(state_dir))
        try:
            assert isinstance(store, PostgresStore)
        finally:
            store.close()


class TestDaemonLock:
    def test_a_second_daemon_with_the_same_host_id_is_refused(self, pg_url: str) -> None:
        """claim_daemon holds a lock per host id for the store's life: a second claim with the same id is refused
        in one line (another id is welcome: leased daemons share the database), and works once released."""
        first, second, other = PostgresStore(pg_url), PostgresStore(pg_url), PostgresStore(pg_url)
        try:
            first.claim_daemon("host-a")
            with pytest.raises(StoreError, match="another heartbeat daemon with host id 'host-a' is running"):
                second.claim_daemon("host-a")
            other.claim_daemon("host-b")
            first.close()
            second.claim_daemon("host-a")
        finally:
            first.close()
            second.close()
            other.close()

    def test_heartbeat_run_refuses_a_second_daemon_with_its_host_id(self, pg_url: str, tmp_path: Path) -> None:
        """`heartbeat run` on a database where a daemon of the same host id runs exits 1 with one line."""
        holder = PostgresStore(pg_url)
        try:
            holder.claim_daemon("host-a")
            config = tmp_path / "heartbeat.toml"
            config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nhost = "host-a"\n\n'
                              f'[store]\nurl = "{pg_url}"\n')
            config.chmod(0o644)
            r = _run_cli("--config", str(config), "run", "--once", env={}, cwd=tmp_path)
            assert r.code == 1, r.err
            assert r.err.count("\n") == 1 and "another heartbeat daemon with host id 'host-a'" in r.err
        finally:
            holder.close()


    def test_run_once_twice_in_a_row_takes_the_host_at_once(self, pg_url: str, tmp_path: Path) -> None:
        """`run --once` marks its host's row stopped when it ends: the next `run --once` with the same host id
        takes the host at once instead of waiting for the row to be lease_ttl old (host_busy)."""
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nhost = "host-a"\nlog_format = "json"\n\n'
                          f'[store]\nurl = "{pg_url}"\n')
        config.chmod(0o644)
        for _ in range(2):
            r = _run_cli("--config", str(config), "run", "--once", env={}, cwd=tmp_path)
            assert r.code == 0, r.err
            assert "host_busy" not in r.out + r.err
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT stopped_at IS NOT NULL FROM heartbeat_hosts WHERE host = 'host-a'").fetchone()
        assert row == (True,)


class TestDatabaseDown:
    def test_stopped_server_gives_one_line_and_the_store_recovers(self, own_cluster: Cluster, tmp_path: Path) -> None:
        """With the server stopped a store call fails fast with `cannot reach the database`; started again, it works."""
        url = own_cluster.create_db("down")
        upgrade(url)
        store = PostgresStore(url)
        try:
            store.create(_baton())
            own_cluster.stop("immediate")
            started = time.monotonic()
            with pytest.raises(StoreError, match="cannot reach the database") as info:
                store.load("t")
            assert time.monotonic() - started < 30
            assert "\n" not in str(info.value)
            r = _run_cli("show", "t", env={"HEARTBEAT_STORE_URL": url}, cwd=tmp_path)
            assert r.code == 1 and r.err.count("\n") == 1 and "cannot reach the database" in r.err
            own_cluster.start()

            def loads() -> Any:
                try:
                    return store.load("t")
                except StoreError:
                    return None

            assert wait_for(loads, timeout=30, interval=0.2, message="the store back after the restart")
            with store.edit("t") as ed:
                ed.baton.step = "after the outage"
            assert store.load("t").step == "after the outage"
        finally:
            store.close()
            if not _running(own_cluster):
                own_cluster.start()


def _running(cluster: Cluster) -> bool:
    return os.path.exists(os.path.join(cluster.data, "postmaster.pid"))



class TestDaemonOnPostgres:
    def test_a_real_daemon_dispatches_and_its_agent_writes_to_the_database(self, pg_url: str, tmp_path: Path) -> None:
        """`heartbeat run` with [store] url dispatches a task; the agent's own CLI writes land in the database."""
        agent = tmp_path / "agent.py"
        agent.write_text(textwrap.dedent("""
            import os, subprocess, sys
            task = os.environ["HEARTBEAT_TASK"]
            hb = [sys.executable, "-m", "heartbeat"]
            subprocess.run([*hb, "set", task, "step=the agent was here"], check=True)
            subprocess.run([*hb, "done", task], check=True)
        """))
        work = tmp_path / "work"
        work.mkdir()
        config = tmp_path / "heartbeat.toml"
        config.write_text(textwrap.dedent(f"""
            [daemon]
            state_dir = {json.dumps(str(tmp_path / "state"))}
            tick = "200ms"
            log_format = "json"

            [store]
            url = {json.dumps(pg_url)}

            [launchers.agent]
            command = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}]
            inherit_env = ["PATH", "PYTHONPATH"]
        """))
        config.chmod(0o644)
        store = PostgresStore(pg_url)
        try:
            store.create(_baton("job", workdir=str(work)))
            log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115
            daemon = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(config), "run"],
                                      stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=str(tmp_path))
            try:
                def finished() -> bool:
                    return store.load("job").meta.status.value == "done"

                wait_for(finished, timeout=60, interval=0.2, message="the agent's done in the database")
            finally:
                daemon.terminate()
                daemon.wait(timeout=30)
                log.close()
            final = store.load("job")
            assert final.step == "the agent was here" and final.meta.epoch == 1
            kinds = [e.kind for e in store.ledger.events("job")]
            # done is followed by the handoff package it froze (issue 10: every done hands off);
            # the daemon's ``exited`` for the agent may land after them
            assert "dispatched" in kinds and "done" in kinds
            assert kinds[kinds.index("done") + 1] == "handed_off"
            batons = tmp_path / "state" / "batons"
            assert not batons.exists() or not list(batons.iterdir())  # nothing went to the file store
        finally:
            store.close()


class TestRestoredRows:
    """Issue 8's restore rule holds on PostgreSQL too: history is never reused or erased."""

    def test_a_row_restored_from_a_backup_continues_above_its_history(self, pg: PostgresStore, pg_url: str) -> None:
        """A row put back at an older revision (a restored backup) is written above the ledger's highest
        revision, says ``restored``, and every committed event is kept."""
        pg.create(_baton("t"))
        backup = pg.baton_text("t")
        with pg.edit("t") as ed:
            ed.baton.step = "Second"
        with pg.edit("t") as ed:
            ed.baton.step = "Third"
        before = [(e.kind, e.revision) for e in pg.ledger.events("t")]
        with psycopg.connect(pg_url) as conn:  # what restoring a backup of the row does
            conn.execute("UPDATE heartbeat_batons SET body = %s, revision = 1 WHERE id = 't'", (backup,))
        with pg.edit("t") as ed:
            ed.baton.step = "Fourth"
        assert pg.load("t").meta.revision == 4
        after = [(e.kind, e.revision) for e in pg.ledger.events("t")]
        assert after[:len(before)] == before
        assert ("restored", 4) in after

    def test_a_re_created_id_continues_above_its_history(self, pg: PostgresStore, pg_url: str) -> None:
        """An id created again after its row was removed starts above the revisions its ledger holds."""
        pg.create(_baton("t"))
        with pg.edit("t") as ed:
            ed.baton.step = "Second"
        with psycopg.connect(pg_url) as conn:
            conn.execute("DELETE FROM heartbeat_batons WHERE id = 't'")
        assert pg.create(_baton("t")).meta.revision == 3


def _rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM heartbeat_events").fetchone()
    return int(row[0]) if row else 0


class TestEveryCommandOnTheConfiguredStore:
    """Issue 19 item 1: `web`, `metrics` and `gc` ignored `[store] url` (only $HEARTBEAT_STORE_URL
    worked): the page showed "Tasks (0)" and every metric zero while `status` listed the tasks.
    Every command opens the store one way (heartbeat.store.open_configured)."""

    @pytest.fixture
    def configured(self, pg_url: str, tmp_path: Path) -> Path:
        """A config whose [store] url is the database; three tasks in it; no HEARTBEAT_* in the env."""
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state}"\n\n[store]\nurl = "{pg_url}"\n')
        config.chmod(0o644)
        for task_id in ("c1", "c2", "c3"):
            r = _run_cli("--config", str(config), "new", task_id, "--task", "t", "--step", "s",
                         "--workdir", str(tmp_path), env={}, cwd=tmp_path)
            assert r.code == 0, r.err
        assert _rows(pg_url) == 3  # the tasks are in the database, not in files
        assert not (state / "batons").exists() or not list((state / "batons").glob("*.toml"))
        return config

    def test_status_lists_the_databases_tasks(self, configured: Path, tmp_path: Path) -> None:
        """The baseline: `status` with the config route lists the database's tasks."""
        r = _run_cli("--config", str(configured), "status", "--json", env={}, cwd=tmp_path)
        assert r.code == 0 and sorted(t["id"] for t in json.loads(r.out)["tasks"]) == ["c1", "c2", "c3"]

    def test_metrics_count_the_databases_tasks(self, configured: Path, tmp_path: Path) -> None:
        """`heartbeat metrics` with the config route counts the database's tasks (it counted 0)."""
        from prometheus_client.parser import text_string_to_metric_families

        r = _run_cli("--config", str(configured), "metrics", env={}, cwd=tmp_path)
        assert r.code == 0, r.err
        tasks = {s.labels["status"]: s.value for f in text_string_to_metric_families(r.out)
                 if f.name == "heartbeat_tasks" for s in f.samples}
        assert tasks.get("active") == 3, tasks

    def test_the_page_shows_the_databases_tasks(self, configured: Path, tmp_path: Path) -> None:
        """`heartbeat web` with the config route shows the database's tasks (it showed "Tasks (0)")."""
        import socket
        import urllib.request

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        token = "config-route-token"
        proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(configured), "web",
                                 "--listen", f"127.0.0.1:{port}", "--token", token], env=clean_env(),
                                cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            def page(path: str) -> str:
                req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                             headers={"Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as resp:
                        return str(resp.read().decode())
                except OSError:
                    return ""

            from prometheus_client.parser import text_string_to_metric_families

            body = str(wait_for(lambda: page("/"), timeout=60, message="the page"))
            assert '<span class="muted">(3)</span>' in body and "c2" in body
            tasks = {s.labels["status"]: s.value for f in text_string_to_metric_families(page("/metrics"))
                     if f.name == "heartbeat_tasks" for s in f.samples}
            assert tasks.get("active") == 3, tasks
        finally:
            proc.terminate()
            proc.wait(timeout=20)

    def test_gc_works_on_the_database_by_either_route(self, configured: Path, pg_url: str, tmp_path: Path) -> None:
        """`heartbeat gc` with the config route opens the database as $HEARTBEAT_STORE_URL does (it silently
        gc'd an empty file store; the env route died with an AttributeError traceback; c31a8a9 refused
        both in one line): the env route's dry run plans what the config route's gc then archives."""
        store = PostgresStore(pg_url)
        try:
            with store.edit("c1", actor="test") as ed:
                ed.baton.meta.status = Status.DONE
        finally:
            store.close()
        later = "2100-01-01T00:00:00+00:00"
        by_env = _run_cli("--state-dir", str(tmp_path / "state"), "gc", "--dry-run", "--json", "--now", later,
                          env={"HEARTBEAT_STORE_URL": pg_url}, cwd=tmp_path)
        by_config = _run_cli("--config", str(configured), "gc", "--json", "--now", later, env={}, cwd=tmp_path)
        for r in (by_env, by_config):
            assert r.code == 0 and "Traceback" not in r.err, r.err
            assert json.loads(r.out)["archived"] == ["c1"]
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT id FROM heartbeat_batons ORDER BY id").fetchall() == [("c2",), ("c3",)]

    def test_mcp_serves_the_databases_tasks(self, configured: Path, tmp_path: Path) -> None:
        """`heartbeat mcp` with the config route lists the database's tasks (official SDK client)."""
        import anyio
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "heartbeat", "--config", str(configured), "mcp"], env=clean_env())

        async def main() -> Any:
            with anyio.fail_after(60):
                async with Client(params) as client:
                    return await client.call_tool("status", {})

        status = anyio.run(main)
        assert sorted(row["id"] for row in status.structured_content["tasks"]) == ["c1", "c2", "c3"]

    def test_the_claude_hook_finds_its_task_in_the_database(self, configured: Path, tmp_path: Path) -> None:
        """`heartbeat hook claude` with the config route hands the agent its brief from the database."""
        ev = {"session_id": "s", "transcript_path": "/nonexistent", "cwd": str(tmp_path),
              "hook_event_name": "SessionStart", "source": "startup"}
        r = _run_cli("hook", "claude", "--task", "c1", "--config", str(configured), env={}, cwd=tmp_path,
                     input=json.dumps(ev))
        assert r.code == 0 and r.err == "", r.err
        assert "additionalContext" in r.out


class TestSessionBounds:
    def test_every_heartbeat_session_bounds_idle_transactions_locks_and_dead_peers(self, pg_url: str) -> None:
        """Issue 19 item 3: pooled and direct connections alike set idle_in_transaction_session_timeout,
        lock_timeout, statement_timeout and the server's TCP keepalives, and ask libpq for keepalives
        (a paused or cut-off session must not hold its row locks for ever)."""
        from heartbeat.model import defaults
        from heartbeat.store.postgres.connection import connect

        store = PostgresStore(pg_url)
        direct = connect(pg_url, autocommit=True)
        try:
            with store._conn() as pooled:
                for conn in (pooled, direct):
                    show = {name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                            for name in ("idle_in_transaction_session_timeout", "lock_timeout",
                                         "statement_timeout")}
                    assert show == {"idle_in_transaction_session_timeout":
                                    f"{int(defaults.PG_IDLE_IN_TRANSACTION_TIMEOUT)}s",
                                    "lock_timeout": f"{int(defaults.LOCK_TIMEOUT)}s",
                                    "statement_timeout": f"{int(defaults.PG_STATEMENT_TIMEOUT)}s"}
                    params = conn.info.get_parameters()
                    assert params.get("keepalives") == "1"
                    assert params.get("keepalives_idle") == str(int(defaults.PG_KEEPALIVE_IDLE))
                pooled.commit()
        finally:
            direct.close()
            store.close()
