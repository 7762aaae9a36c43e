"""`heartbeat verify`: exit codes, their order, what it records, and key paths that escape the workdir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeAlias

import pytest
from conftest import Result

from heartbeat.api import open_task
from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore
from heartbeat.system.world import GIT_HEAD_KEY
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.verify import verify


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "src").mkdir()
    (work / "src" / "fallback.py").write_text("def fallback():\n    return ''\n")
    (work / "deploy.sh").write_text("#!/bin/sh\n")
    return work


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start real agent processes (sleeping children); all are killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def new_task(hb: Callable[..., Result], work: Path, *extra: str) -> None:
    r = hb("new", "t1", "--task", "Fix the fallback", "--step", "Write the fix", "--intent", "No blank answers",
           "--constraint", "Do not touch prod", "--workdir", str(work), "--key-file", "src/fallback.py",
           "--key-file", "deploy.sh", *extra)
    assert r.code == 0, r.err


Sleeper: TypeAlias = Callable[[], "subprocess.Popen[bytes]"]


def as_agent(task: str, epoch: int) -> dict[str, str]:
    return {"HEARTBEAT_TASK": task, "HEARTBEAT_EPOCH": str(epoch)}


class TestExitCodes:
    def test_fresh_is_0(self, hb: Callable[..., Result], work: Path) -> None:
        """An active task whose key files are as recorded verifies fresh, exit 0."""
        new_task(hb, work)
        r = hb("verify", "t1")
        assert r.code == 0, r.out + r.err
        assert r.out.startswith("fresh:")

    def test_stale_is_3_with_the_list_of_changes(self, hb: Callable[..., Result], work: Path) -> None:
        """A modified and a deleted key file make verify exit 3, naming each file and how it changed."""
        new_task(hb, work)
        (work / "src" / "fallback.py").write_text("def fallback():\n    return 'sorry'\n")
        (work / "deploy.sh").unlink()
        r = hb("verify", "t1")
        assert r.code == 3
        assert r.out.startswith("stale:")
        assert "src/fallback.py: modified (sha256:" in r.out
        assert "deploy.sh: deleted (sha256:" in r.out and "-> missing)" in r.out

    def test_created_file_is_a_change(self, hb: Callable[..., Result], work: Path) -> None:
        """A key file that was missing when the baton was written and exists now is a change too."""
        new_task(hb, work, "--key-file", "NOTES.md")
        (work / "NOTES.md").write_text("hello\n")
        r = hb("verify", "t1", "--json")
        assert r.code == 3
        assert json.loads(r.out)["changed"] == [
            {"key": "NOTES.md", "was": "missing", "now": json.loads(r.out)["changed"][0]["now"],
             "change": "created (file)"}]

    def test_git_head_moving_is_stale(self, hb: Callable[..., Result], work: Path) -> None:
        """A new commit in the workdir (git HEAD moved) makes the baton stale."""
        git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "one"], check=True)
        new_task(hb, work)
        assert hb("verify", "t1").code == 0
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "two"], check=True)
        r = hb("verify", "t1", "--json")
        assert r.code == 3
        assert [(c["key"], c["change"]) for c in json.loads(r.out)["changed"]] == [(GIT_HEAD_KEY, "HEAD moved")]

    @pytest.mark.parametrize("verb", [("block", "t1", "--on", "legal review"), ("done", "t1"),
                                      ("snooze", "t1", "--for", "1h")])
    def test_not_active_is_4(self, hb: Callable[..., Result], work: Path, verb: tuple[str, ...]) -> None:
        """A blocked, done or snoozed task verifies 4: not active, whatever the world (``blocked`` only when
        it is blocked)."""
        new_task(hb, work)
        assert hb(*verb).code == 0
        r = hb("verify", "t1")
        assert r.code == 4
        assert r.out.startswith("blocked:" if verb[0] == "block" else "not_active:")

    def test_superseded_epoch_is_5(self, hb: Callable[..., Result], work: Path, sleeper: Sleeper) -> None:
        """After a second claim, the first agent's epoch (from HEARTBEAT_EPOCH) verifies 5: superseded."""
        new_task(hb, work)
        first = sleeper()
        e1 = int(hb("claim", "t1", "--pid", str(first.pid)).out)
        assert hb("verify", "t1", env=as_agent("t1", e1)).code == 0
        second = sleeper()
        e2 = int(hb("claim", "t1", "--pid", str(second.pid), "--force").out)
        assert e2 == e1 + 1
        r = hb("verify", "t1", env=as_agent("t1", e1))
        assert r.code == 5
        assert f"your epoch {e1} has been superseded by the task's epoch {e2}" in r.out
        assert hb("verify", "t1", env=as_agent("t1", e2)).code == 0
        assert hb("verify", "t1", "--epoch", str(e1)).code == 5

    def test_env_epoch_for_another_task_is_ignored(self, hb: Callable[..., Result], work: Path) -> None:
        """HEARTBEAT_EPOCH belongs to HEARTBEAT_TASK: verifying another task does not use it."""
        new_task(hb, work)
        assert hb("verify", "t1", env=as_agent("other", 99)).code == 0
        assert hb("verify", "t1", env={"HEARTBEAT_EPOCH": "99"}).code == 5

    def test_unknown_task_is_1(self, hb: Callable[..., Result]) -> None:
        """Verifying a task that does not exist is an error, exit 1, naming the task."""
        r = hb("verify", "nope")
        assert r.code == 1 and "nope" in r.err


class TestOrderOfChecks:
    def test_superseded_before_not_active_before_stale(
        self, hb: Callable[..., Result], work: Path, sleeper: Sleeper
    ) -> None:
        """With all three wrong at once verify says 5; without the old epoch 4; unblocked, 3."""
        new_task(hb, work)
        agent = sleeper()
        epoch = int(hb("claim", "t1", "--pid", str(agent.pid)).out)
        (work / "deploy.sh").write_text("changed\n")
        assert hb("block", "t1", "--on", "review", env=as_agent("t1", epoch)).code == 0
        assert hb("verify", "t1", "--epoch", str(epoch - 1)).code == 5
        assert hb("verify", "t1", "--epoch", str(epoch)).code == 4
        assert hb("unblock", "t1", "--by", "alice").code == 0
        assert hb("verify", "t1", "--epoch", str(epoch)).code == 3


class TestHandoffKeepsTheRecordedWorld:
    def test_claim_does_not_refresh_the_fingerprints(
        self, hb: Callable[..., Result], work: Path, sleeper: Sleeper
    ) -> None:
        """A world that changed across a handoff stays stale for the successor: a claim is not a note write."""
        new_task(hb, work)
        (work / "src" / "fallback.py").write_text("changed while nobody held the task\n")
        agent = sleeper()
        epoch = int(hb("claim", "t1", "--pid", str(agent.pid)).out)
        assert hb("touch", "t1", env=as_agent("t1", epoch)).code == 0
        assert hb("verify", "t1", env=as_agent("t1", epoch)).code == 3
        # Recording what it found is a note write: the world is re-recorded and verify is fresh again.
        assert hb("add", "t1", "decisions", "re-read fallback.py after it changed", env=as_agent("t1", epoch)).code == 0
        assert hb("verify", "t1", env=as_agent("t1", epoch)).code == 0


class TestOutputAndRecord:
    def test_json_is_the_same_result_as_data(self, hb: Callable[..., Result], work: Path) -> None:
        """`verify --json` carries the code, the result word, the changes and the epochs; exit code matches."""
        new_task(hb, work)
        (work / "deploy.sh").write_text("x\n")
        r = hb("verify", "t1", "--json", "--epoch", "0")
        doc = json.loads(r.out)
        assert r.code == doc["code"] == 3
        assert doc["result"] == "stale" and doc["task_status"] == "active"
        assert (doc["epoch"], doc["caller_epoch"], doc["revision"]) == (0, 0, 1)
        assert [c["key"] for c in doc["changed"]] == ["deploy.sh"]
        assert set(doc["changed"][0]) == {"key", "was", "now", "change"}
        assert doc["checked"] == ["deploy.sh", "src/fallback.py"]

    def test_each_verify_is_a_verified_event(self, hb: Callable[..., Result], work: Path) -> None:
        """Every verify records a `verified` event with its result and the changed keys."""
        new_task(hb, work)
        hb("verify", "t1")
        (work / "deploy.sh").write_text("x\n")
        hb("verify", "t1")
        events = json.loads(hb("log", "t1", "--json").out)["events"]
        verified = [e["data"] for e in events if e["kind"] == "verified"]
        assert verified == [{"result": "fresh", "changed": []}, {"result": "stale", "changed": ["deploy.sh"]}]

    def test_api_verify_returns_the_same_result(self, state_dir: Path, work: Path) -> None:
        """`Task.verify()` returns the VerifyResult the CLI prints, fenced by the task's epoch."""
        store = FileStore(str(state_dir))
        try:
            tasks.new_task(store, "t1", task="T", step="s", workdir=str(work), key_files=["deploy.sh"])
            task = open_task("t1", store=store, epoch=0)
            assert task.verify().code == 0
            (work / "deploy.sh").write_text("x\n")
            result = task.verify()
            assert (result.code, result.status, [c["key"] for c in result.changed]) == (3, "stale", ["deploy.sh"])
            assert result.to_json()["result"] == "stale"
            assert open_task("t1", store=store, epoch=7).verify().code == 5
        finally:
            store.close()

    def test_memory_store_has_no_world_and_verifies_fresh(self) -> None:
        """Without fingerprints (the memory store) there is nothing to be stale against: fresh."""
        store = MemoryStore()
        tasks.new_task(store, "t1", task="T", step="s", workdir="/nonexistent", key_files=["a"])
        result = verify(store, "t1")
        assert (result.code, result.checked) == (0, [])


class TestPathEscapes:
    @pytest.mark.parametrize("key_file", ["../outside.txt", "/etc/passwd", "src/../../outside.txt"])
    def test_new_refuses_key_files_outside_the_workdir(
        self, hb: Callable[..., Result], work: Path, key_file: str
    ) -> None:
        """`new --key-file` with a path escaping the workdir exits 2 naming the task and field; nothing is created."""
        r = hb("new", "t1", "--task", "T", "--step", "s", "--workdir", str(work), "--key-file", key_file)
        assert r.code == 2
        assert r.err.startswith("heartbeat: t1: key_files: ") and "outside the workdir" in r.err
        assert hb("show", "t1").code == 1

    def test_add_refuses_key_files_outside_the_workdir(self, hb: Callable[..., Result], work: Path) -> None:
        """`add ID key_files ../x` exits 2 and the baton keeps its revision and key files."""
        new_task(hb, work)
        r = hb("add", "t1", "key_files", "../../etc/shadow")
        assert r.code == 2 and "outside the workdir" in r.err
        doc = json.loads(hb("show", "t1", "--json").out)
        assert doc["key_files"] == ["src/fallback.py", "deploy.sh"] and doc["meta"]["revision"] == 1

    def test_symlink_out_of_the_workdir_is_refused(self, hb: Callable[..., Result], work: Path, tmp_path: Path) -> None:
        """A key file that is a symlink pointing outside the workdir is refused at write time."""
        (tmp_path / "secret").write_text("s\n")
        os.symlink(tmp_path / "secret", work / "link")
        r = hb("new", "t1", "--task", "T", "--step", "s", "--workdir", str(work), "--key-file", "link")
        assert r.code == 2 and "is a link to" in r.err

    def test_key_file_swapped_for_an_escaping_symlink_later_is_stale(
        self, hb: Callable[..., Result], work: Path, tmp_path: Path
    ) -> None:
        """A key file replaced after the write by a link out of the workdir is reported (stale), not read."""
        new_task(hb, work)
        (tmp_path / "secret").write_text("s\n")
        (work / "deploy.sh").unlink()
        os.symlink(tmp_path / "secret", work / "deploy.sh")
        r = hb("verify", "t1", "--json")
        assert r.code == 3
        change = json.loads(r.out)["changed"][0]
        assert change["key"] == "deploy.sh" and change["change"].startswith("now refused:")
