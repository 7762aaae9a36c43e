"""The file store under real processes: writers SIGKILLed mid-write never leave a torn or older baton;
concurrent writers (processes, threads, the CLI) never lose an update."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

from heartbeat.model import defaults
from heartbeat.model.errors import BadInput, StoreError
from heartbeat.store.files import FileStore
from tests.integration.test_file_store import _new, _snapshot

# A writer that rewrites its batons in a loop until it is killed. Every write bumps an
# unknown counter key along with the revision, so "counter == revision - 1" holds for
# any baton that is whole; the padding makes a torn write visible.
WRITER = r"""
import sys
from heartbeat.store.files import FileStore

store = FileStore(sys.argv[1])
ids = sys.argv[2:]
n = 0
while True:
    task_id = ids[n % len(ids)]
    with store.edit(task_id, actor="writer") as ed:
        counter = ed.old.extra.get("counter", 0) + 1
        ed.baton.extra["counter"] = counter
        ed.baton.step = f"step {counter}"
        ed.baton.extra["pad"] = str(counter % 10) * (4096 + counter % 512)
    n += 1
"""


# A process applying M increments through the Python API, after a start signal.
API_INCREMENTER = r"""
import os, sys, time
from heartbeat import open_task

state_dir, task_id, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
task = open_task(task_id, state_dir=state_dir)
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.005)
for _ in range(count):
    with task.update() as baton:
        baton.extra["counter"] = baton.extra.get("counter", 0) + 1
"""


def _python(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], env=clean_env(), cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class TestCrashConsistency:
    @pytest.mark.slow
    def test_sigkilled_writers_never_leave_a_torn_or_older_baton(self, state_dir: Path) -> None:
        """Writers SIGKILLed at random moments while rewriting the same batons thousands of times:
        every read parses, revisions never go backwards, no temp file is read, every landed
        write has its ledger event, and scan reaps the dead writers' temp files."""
        ids = ["c0", "c1", "c2"]
        setup = FileStore(str(state_dir))
        for task_id in ids:
            _new(setup, task_id, counter=0)
        setup.close()

        target_writes, budget = 2000, 18.0
        failures: list[str] = []
        seen: dict[str, int] = dict.fromkeys(ids, 1)
        reads = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal reads
            reader = FileStore(str(state_dir))
            try:
                while not stop.is_set():
                    for task_id in ids:
                        try:
                            baton = reader.load(task_id)
                        except Exception as exc:  # any failure to read a whole baton is the bug
                            failures.append(f"load {task_id}: {exc!r}")
                            continue
                        rev, counter = baton.meta.revision, baton.extra.get("counter")
                        if rev < seen[task_id]:
                            failures.append(f"{task_id}: revision went back from {seen[task_id]} to {rev}")
                        if counter != rev - 1:
                            failures.append(f"{task_id}: counter {counter} at revision {rev}")
                        seen[task_id] = max(seen[task_id], rev)
                        reads += 1
                    for entry in reader.scan():
                        if entry.id not in ids or entry.error is not None:
                            failures.append(f"scan saw {entry.id!r}: {entry.error}")
            finally:
                reader.close()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        writers = [_python(WRITER, str(state_dir), *random.sample(ids, len(ids))) for _ in range(3)]
        kills = 0
        rng = random.Random(20261129)
        started = time.monotonic()
        try:
            while sum(seen.values()) - len(ids) < target_writes and time.monotonic() - started < budget:
                time.sleep(rng.uniform(0.05, 0.4))  # a random moment, not a wait for a condition
                victim = writers.pop(rng.randrange(len(writers)))
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                assert victim.returncode == -signal.SIGKILL, victim.stderr.read() if victim.stderr else ""
                kills += 1
                writers.append(_python(WRITER, str(state_dir), *rng.sample(ids, len(ids))))
        finally:
            for proc in writers:
                proc.send_signal(signal.SIGKILL)
            for proc in writers:
                proc.wait()
            stop.set()
            sampler.join(10)
        assert not failures, failures[:5]
        total = sum(seen.values()) - len(ids)
        assert total >= 300, f"only {total} writes in {budget}s: the test proves too little on this machine"
        assert kills >= 5 and reads > 50
        print(f"{total} writes, {kills} SIGKILLs, {reads} reads in {time.monotonic() - started:.1f}s")

        store = FileStore(str(state_dir))
        batons_dir = state_dir / "batons"
        # A temp file of a writer still running is left alone; one of a dead writer is reaped.
        live = batons_dir / f".c0.toml.{os.getpid()}.live0001.tmp"
        dead = batons_dir / f".c0.toml.{_dead_pid()}.dead0001.tmp"
        for planted in (live, dead):
            planted.write_text("task = \n garbage [[[")
        entries = store.scan()
        assert [e.id for e in entries] == ids and all(e.error is None for e in entries)
        leftovers = [p.name for p in batons_dir.iterdir() if p.name.endswith(".tmp")]
        assert leftovers == [live.name], leftovers
        live.unlink()

        for task_id in ids:
            baton = store.load(task_id)
            rev = baton.meta.revision
            assert baton.extra["counter"] == rev - 1
            assert rev >= seen[task_id]
            # The event goes in before the rename: every revision on disk has its ledger row.
            logged = {e.revision for e in store.ledger.events(task_id, kinds=["updated"])}
            assert set(range(2, rev + 1)) <= logged
        store.close()
        with sqlite3.connect(state_dir / "ledger.sqlite3") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    def test_scan_ignores_temp_files_and_reaps_only_dead_writers(self, file_store: FileStore, state_dir: Path) -> None:
        """Temp files are never listed; those whose writer pid is gone are removed, a live one's are kept."""
        _new(file_store, "a")
        batons_dir = state_dir / "batons"
        dead = batons_dir / f".a.toml.{_dead_pid()}.0123abcd.tmp"
        live = batons_dir / f".a.toml.{os.getpid()}.0123abcd.tmp"
        odd = batons_dir / ".a.toml.notapid.tmp"
        for path in (dead, live, odd):
            path.write_text('task = "torn')
        assert [e.id for e in file_store.scan()] == ["a"]
        assert not dead.exists() and live.exists() and odd.exists()

    def test_write_failure_keeps_the_old_baton(self, file_store: FileStore, state_dir: Path) -> None:
        """A write that cannot complete leaves the previous baton and no temp file behind."""
        _new(file_store, "a")
        before = _snapshot(state_dir / "batons" / "a.toml")
        with pytest.raises(BadInput, match="at most"):
            with file_store.edit("a") as ed:
                ed.baton.extra["huge"] = "x" * defaults.MAX_BATON_BYTES
        assert _snapshot(state_dir / "batons" / "a.toml") == before
        assert [p.name for p in (state_dir / "batons").iterdir()] == ["a.toml"]


class TestNoLostUpdates:
    @pytest.mark.slow
    def test_api_increments_from_many_processes(self, state_dir: Path, tmp_path: Path) -> None:
        """6 processes x 50 read-modify-write increments through open_task().update(): the counter
        ends at 300 and the revision at 301 (one per write after create)."""
        workers, count = 6, 50
        store = FileStore(str(state_dir))
        _new(store, "n", counter=0)
        store.close()
        go = tmp_path / "go"
        procs = [_python(API_INCREMENTER, str(state_dir), "n", str(count), str(go)) for _ in range(workers)]
        go.touch()
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
        store = FileStore(str(state_dir))
        baton = store.load("n")
        assert baton.extra["counter"] == workers * count
        assert baton.meta.revision == 1 + workers * count
        assert len(store.ledger.events("n", kinds=["updated"])) == workers * count
        store.close()

    @pytest.mark.slow
    def test_cli_adds_from_many_processes(self, state_dir: Path) -> None:
        """4 shell loops x 15 `heartbeat add n done x` at once: done holds all 60 items, revision 61."""
        workers, count = 4, 15
        store = FileStore(str(state_dir))
        _new(store, "n")
        store.close()
        script = Path(sys.executable).parent / "heartbeat"
        loop = f'for i in $(seq {count}); do "{script}" add n done "w$W-$i" || exit 1; done'
        procs = [subprocess.Popen(["bash", "-c", loop], env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), W=str(w)),
                                  stderr=subprocess.PIPE) for w in range(workers)]
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err.decode()
        store = FileStore(str(state_dir))
        baton = store.load("n")
        assert len(baton.done) == workers * count
        assert sorted(baton.done) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(1, count + 1))
        assert baton.meta.revision == 1 + workers * count
        store.close()

    def test_racing_creates_have_one_winner(self, state_dir: Path) -> None:
        """Six processes run `heartbeat new` for the same id at once: one creates it, five get exit 5."""
        script = Path(sys.executable).parent / "heartbeat"
        env = clean_env(HEARTBEAT_STATE_DIR=str(state_dir))
        procs = [subprocess.Popen([str(script), "new", "race", "--task", f"by {i}", "--step", "s"], env=env,
                                  stderr=subprocess.PIPE, text=True) for i in range(6)]
        results = [(proc.wait(timeout=120), proc.stderr.read() if proc.stderr else "") for proc in procs]
        assert sorted(code for code, _ in results) == [0, 5, 5, 5, 5, 5], results
        assert all("exists already" in err for code, err in results if code == 5)
        store = FileStore(str(state_dir))
        assert store.load("race").meta.revision == 1
        assert [e.kind for e in store.ledger.events("race")] == ["created"]
        store.close()

    def test_threads_of_one_process_serialize(self, file_store: FileStore) -> None:
        """Threads sharing one FileStore do not lose each other's increments either."""
        _new(file_store, "n", counter=0)

        def bump() -> None:
            for _ in range(25):
                with file_store.edit("n") as ed:
                    ed.baton.extra["counter"] = ed.old.extra["counter"] + 1

        threads = [threading.Thread(target=bump) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert file_store.load("n").extra["counter"] == 100
        assert file_store.load("n").meta.revision == 101

    def test_a_held_lock_times_out_with_an_error(self, file_store: FileStore, state_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        """A writer that cannot get the lock within LOCK_TIMEOUT fails with StoreError; nothing is written."""
        _new(file_store, "n")
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
             "print('held', flush=True); time.sleep(60)", str(state_dir / "locks" / "n.lock")],
            stdout=subprocess.PIPE)
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            # The store reads LOCK_TIMEOUT once, when it is built (the fixture's store already was):
            # patching defaults alone left this test waiting the full 30 s default.
            monkeypatch.setattr(defaults, "LOCK_TIMEOUT", 0.2)
            monkeypatch.setattr(file_store, "lock_wait", 0.2)
            with pytest.raises(StoreError, match="held this baton's lock"):
                with file_store.edit("n") as ed:
                    ed.baton.step = "never"
        finally:
            holder.kill()
            holder.wait()
        assert file_store.load("n").step == "start"


