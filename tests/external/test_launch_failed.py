"""A launch that never ran the agent is a failed launch, not a failed attempt, and it shows (issue 26, items 1-2).

An in-process daemon with the real exec launcher and the real shim: a program that does not
exist (ENOENT), one that is not executable (EACCES), a missing workdir. Each is recorded as
``launch-failed`` with the shim's reason in the ledger and the baton, gives back the attempt its
dispatch counted, backs off on its own count and escalates after ``max_attempts`` of them; an
agent that itself exits 127 is still the agent's failure. ``status`` and ``status --json`` say
why the task is not running.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import wait_for
from daemon_harness import in_process_config

from heartbeat.daemon import Daemon
from heartbeat.model.baton import Owner, OwnerKind, Status
from heartbeat.model.timeparse import utcnow
from heartbeat.reports.why import State, policy_for, why
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks


def exec_launcher(command: list[str]) -> str:
    return f"""[launchers.agent]
type = "exec"
command = {json.dumps(command)}
stop_grace = "200ms"
"""


def run_until_settled(d: Daemon, store: FileStore, task_id: str, now: object, exits: int) -> None:
    """Tick at ``now`` until the ledger holds ``exits`` exits of ``task_id`` (the shim's record lands)."""
    def settled() -> bool:
        d.tick(now=now)  # type: ignore[arg-type]
        return len(store.ledger.events(task_id, kinds=["exited"])) >= exits
    wait_for(settled, timeout=20, interval=0.05, message=f"exit {exits} of {task_id} settled")


def daemon_for(tmp_path: Path, command: list[str], *, max_attempts: int = 3) -> tuple[Daemon, FileStore]:
    tmp_path.chmod(0o700)
    state, config = in_process_config(tmp_path, launchers=exec_launcher(command),
                                      daemon=f'max_attempts = {max_attempts}\nbackoff_initial = "10s"\n'
                                             'backoff_max = "1m"')
    store = FileStore(str(state))
    return Daemon(config, store=store), store


class TestALaunchThatNeverRanTheAgent:
    """ENOENT, EACCES and a missing workdir are launch failures: recorded, visible, no attempt spent."""

    def test_a_missing_program_is_a_launch_failure_with_the_shims_reason(self, tmp_path: Path) -> None:
        """exit 127 from the shim's execvp: kind launch-failed, the reason in the ledger and the
        baton, attempt 0, one launch failure, no `stalled`, and the retry waits its backoff."""
        d, store = daemon_for(tmp_path, [str(tmp_path / "no-such-agent")])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            now = utcnow()
            run_until_settled(d, store, "t", now, 1)
            exited = store.ledger.events("t", kinds=["exited"])[-1]
            assert exited.data["kind"] == "launch-failed", exited.data
            assert exited.data["error"] == f"cannot start {str(tmp_path / 'no-such-agent')!r}: No such file or directory"
            assert exited.data["code"] == 127
            b = store.load("t")
            assert b.meta.attempt == 0 and b.meta.launch_failures == 1
            assert b.meta.last_failure == f"launch failed: {exited.data['error']}"
            assert store.ledger.events("t", kinds=["stalled"]) == []
            w = why(b, now, policy_for(d.shared.config))
            assert w.state is State.LAUNCH_FAILING
            assert w.text.startswith(f"launch failing: cannot start {str(tmp_path / 'no-such-agent')!r}: "
                                     "No such file or directory (retry 2/3 in ")
            d.tick(now=now + timedelta(seconds=1))  # inside the backoff: no second dispatch
            assert len(store.ledger.events("t", kinds=["dispatched"])) == 1
        finally:
            d.shutdown()

    def test_a_retry_being_launched_after_launch_failures_is_still_launch_failing(self, tmp_path: Path) -> None:
        """While the retry of a task whose launches failed is being started (dispatched, no pid yet), its
        state stays launch-failing, not a healthy "launching": the status of a task that cannot start
        read "launching" for a moment at every retry (tests/system/test_reinstall.py met it)."""
        d, store = daemon_for(tmp_path, [str(tmp_path / "no-such-agent")])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            now = utcnow()
            run_until_settled(d, store, "t", now, 1)
            b = store.load("t")
            b.meta.owner = Owner(pid=None, host="here", how=OwnerKind.DISPATCH)  # the retry, its pid not known yet
            w = why(b, now, policy_for(d.shared.config))
            assert w.state is State.LAUNCH_FAILING, w
            assert w.text.startswith("launch failing: cannot start ") and w.text.endswith("(retry 2/3 launching)"), w
            b.meta.launch_failures = 0  # a first launch: a plain launch in progress
            assert why(b, now, policy_for(d.shared.config)).state is State.LAUNCHING
        finally:
            d.shutdown()

    def test_launch_failures_escalate_after_max_attempts_of_them(self, tmp_path: Path) -> None:
        """Three failed launches in a row (max_attempts = 3): escalated, the reason naming the program."""
        d, store = daemon_for(tmp_path, [str(tmp_path / "no-such-agent")])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            now = utcnow()
            for n in (1, 2, 3):
                run_until_settled(d, store, "t", now, n)
                now += timedelta(minutes=2)
            d.tick(now=now)
            b = store.load("t")
            assert b.meta.status is Status.ESCALATED
            assert b.meta.attempt == 0 and b.meta.launch_failures == 3
            reason = store.ledger.events("t", kinds=["escalated"])[-1].data["reason"]
            assert reason.startswith("3 launches in a row never started the agent: cannot start"), reason
            tasks.retry(store, "t", by="ops")
            assert store.load("t").meta.launch_failures == 0
        finally:
            d.shutdown()

    def test_a_program_that_is_not_executable_is_a_launch_failure(self, tmp_path: Path) -> None:
        """EACCES (exit 126): the same, with "Permission denied"."""
        program = tmp_path / "agent.sh"
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o600)
        d, store = daemon_for(tmp_path, [str(program)])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            run_until_settled(d, store, "t", utcnow(), 1)
            exited = store.ledger.events("t", kinds=["exited"])[-1]
            assert exited.data["kind"] == "launch-failed" and exited.data["code"] == 126
            assert exited.data["error"].endswith(": Permission denied")
            assert store.load("t").meta.attempt == 0
        finally:
            d.shutdown()

    def test_a_missing_workdir_is_a_launch_failure(self, tmp_path: Path) -> None:
        """No shim is started at all: the launcher's own refusal is recorded the same way."""
        d, store = daemon_for(tmp_path, ["/bin/true"])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path / "gone"))
            d.tick(now=utcnow())
            b = store.load("t")
            exited = store.ledger.events("t", kinds=["exited"])[-1]
            assert exited.data["kind"] == "launch-failed", exited.data
            assert "does not exist" in exited.data["error"]
            assert b.meta.attempt == 0 and b.meta.launch_failures == 1
        finally:
            d.shutdown()

    def test_an_agent_that_exits_127_itself_is_the_agents_failure(self, tmp_path: Path) -> None:
        """The agent ran and chose 127: a failed attempt as before, no launch failure counted."""
        d, store = daemon_for(tmp_path, ["/bin/sh", "-c", "exit 127"])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            now = utcnow()
            run_until_settled(d, store, "t", now, 1)
            exited = store.ledger.events("t", kinds=["exited"])[-1]
            assert exited.data["kind"] == "failed" and "error" not in exited.data
            b = store.load("t")
            assert b.meta.attempt == 1 and b.meta.launch_failures == 0
            w = why(b, now, policy_for(d.shared.config))
            assert w.state is State.BACKING_OFF and "exit 127" in w.text, w
        finally:
            d.shutdown()

    def test_a_successful_run_clears_the_count(self, tmp_path: Path) -> None:
        """A launch that starts the agent after failed ones: the count is back to 0."""
        program = tmp_path / "agent.sh"
        d, store = daemon_for(tmp_path, [str(program)])
        try:
            tasks.new_task(store, "t", task="t", step="s", workdir=str(tmp_path))
            now = utcnow()
            run_until_settled(d, store, "t", now, 1)
            program.write_text("#!/bin/sh\nexit 3\n")
            program.chmod(0o755)
            run_until_settled(d, store, "t", now + timedelta(minutes=2), 2)
            b = store.load("t")
            assert b.meta.launch_failures == 0 and b.meta.attempt == 1
        finally:
            d.shutdown()


class TestStatusSaysWhy:
    """`status` and `status --json` name why a task that cannot start is not running."""

    @pytest.fixture
    def failing(self, tmp_path: Path) -> Path:
        d, store = daemon_for(tmp_path, [str(tmp_path / "my-agent")])
        try:
            tasks.new_task(store, "t", task="t", step="first step", workdir=str(tmp_path))
            run_until_settled(d, store, "t", utcnow(), 1)
        finally:
            d.shutdown()
        return tmp_path / "state"

    def status(self, state: Path, *extra: str) -> str:
        r = subprocess.run([sys.executable, "-m", "heartbeat", "status", "--state-dir", str(state), *extra],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def test_status_json_has_the_state_and_the_reason(self, failing: Path) -> None:
        row = json.loads(self.status(failing, "--json"))["tasks"][0]
        assert row["status"] == "active" and row["state"] == "launch-failing"
        assert row["why"].startswith("launch failing: cannot start ") and "No such file or directory" in row["why"]
        assert row["error"] == row["why"]
        assert row["last_failure"].startswith("launch failed: cannot start")

    def test_the_status_table_names_the_state_and_the_reason(self, failing: Path) -> None:
        line = self.status(failing).splitlines()[1]
        assert line.split()[1] == "launch-failing", line
        assert "[launch failing: cannot start " in line

    def test_the_page_shows_a_failing_badge_and_the_reason(self, failing: Path) -> None:
        """In headless Chromium: the row's badge says launch-failing (not a blue "active"), the
        reason is under the step, and the task page names it; /metrics counts it held."""
        import types
        import urllib.request

        from web_scenario import chromium, start_web

        dead = subprocess.Popen(["true"])
        dead.wait()
        (failing / "daemon.json").write_text(json.dumps({"pid": dead.pid, "started_at": 1.0, "last_tick_at": 2.0}))
        config = failing.parent / "web.toml"
        config.write_text(f"[daemon]\nstate_dir = {json.dumps(str(failing))}\n")
        web = start_web(types.SimpleNamespace(config=config, env=lambda: dict(os.environ)))  # type: ignore[arg-type]
        try:
            dom = chromium(web.at())
            row = re.search(r'<tr data-task="t">.*?</tr>', dom, re.S)
            assert row, dom[-2000:]
            assert '<span class="badge launch-failing" data-state="launch-failing">launch-failing</span>' in row.group(0)
            assert '<div class="why launch-failing">launch failing: cannot start' in row.group(0)
            assert re.search(r'<span class="daemon alarm" id="daemon">daemon not running \(stopped \d', dom), \
                re.search(r'<span class="daemon.*?</span>', dom)
            task = chromium(web.at("tasks/t"))
            assert 'id="why" class="why launch-failing">launch failing: cannot start' in task
            with urllib.request.urlopen(web.at("metrics"), timeout=30) as response:
                text = response.read().decode()
            assert 'heartbeat_tasks_held{scope="store",state="launch-failing"} 1.0' in text, text
            assert 'heartbeat_tasks_held{scope="store",state="backing-off"} 0.0' in text
        finally:
            web.stop()
