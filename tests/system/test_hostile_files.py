"""Hostile files, as tests: what an agent, a workdir or another local user can plant where heartbeat looks.

A FIFO at ``<workdir>/.git/HEAD``, at ``logs/<id>/<epoch>.exit`` or at the next epoch's
log once froze the whole daemon (an ``open()`` waiting for ever for a writer, under the
daemon's lock); a symlinked ``logs/<id>`` made it write a brief outside the state dir; a
held baton lock stalled every task for 30 s; a worker thread stuck in a notifier kept
SIGTERM from stopping the daemon; an agent's ``setsid`` grandchild outlived its shift.
Each is tried for real here: real FIFOs, symlinks, flocks, processes and a real daemon.
docs/threat-model.md names the test that pins each claim.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import wait_for
from daemon_harness import DaemonHarness, toml_list

from heartbeat.launchers import shim
from heartbeat.model.errors import UnsafePath
from heartbeat.system.safefile import open_dir, open_regular, read_regular, write_atomic
from heartbeat.tasks import verbs as tasks

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path, stall_after="1h", agent=SLEEPER)
    try:
        yield h
    finally:
        h.close()


def git_checkout(path: Path) -> Path:
    """A minimal git checkout (what ``git_head`` reads): HEAD -> refs/heads/main -> a commit."""
    (path / ".git" / "refs" / "heads").mkdir(parents=True)
    (path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (path / ".git" / "refs" / "heads" / "main").write_text("0123456789abcdef0123456789abcdef01234567\n")
    return path


def fifo_head(workdir: Path) -> Path:
    """The issue's repro: ``rm W/.git/HEAD; mkfifo W/.git/HEAD``."""
    head = workdir / ".git" / "HEAD"
    head.unlink()
    os.mkfifo(head, 0o600)
    return head


def new_task(h: DaemonHarness, task_id: str, workdir: Path, *extra: str) -> None:
    r = h.cli("new", task_id, "--task", f"task {task_id}", "--step", "start", "--intent", "test",
              "--workdir", str(workdir), *extra)
    assert r.returncode == 0, r.stderr


def logged(h: DaemonHarness, event: str, task: str | None = None) -> list[dict[str, object]]:
    return [e for e in h.log() if e.get("event") == event and (task is None or e.get("task") == task)]


class TestSafeFile:
    """The one helper every open of a plantable path goes through refuses special files at once."""

    def test_refuses_fifo_symlink_directory_quickly(self, tmp_path: Path) -> None:
        """A FIFO (no writer), a symlink and a directory are refused with a line naming the file; a file is read."""
        os.mkfifo(tmp_path / "fifo")
        (tmp_path / "link").symlink_to(tmp_path / "file")
        (tmp_path / "file").write_bytes(b"data")
        (tmp_path / "dir").mkdir()
        for name, kind in (("fifo", "a FIFO"), ("link", "a symbolic link"), ("dir", "a directory")):
            with pytest.raises(UnsafePath) as info:
                open_regular(str(tmp_path / name))
            assert str(tmp_path / name) in str(info.value) and kind in str(info.value)
        with pytest.raises(UnsafePath):  # for writing too: a FIFO opened O_WRONLY would wait for a reader
            open_regular(str(tmp_path / "fifo"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        assert read_regular(str(tmp_path / "file"), 2) == b"da"

    def test_open_dir_refuses_links_and_writes_inside(self, tmp_path: Path) -> None:
        """open_dir creates missing parts 0700, refuses a symlinked part; write_atomic leaves no temp file."""
        outside = tmp_path / "outside"
        outside.mkdir()
        root = tmp_path / "root"
        root.mkdir()
        fd = open_dir(str(root), "logs", "a")
        try:
            write_atomic(fd, "1.brief.md", b"brief")
        finally:
            os.close(fd)
        assert (root / "logs" / "a" / "1.brief.md").read_bytes() == b"brief"
        assert stat.S_IMODE(os.stat(root / "logs" / "a").st_mode) == 0o700
        assert os.listdir(root / "logs" / "a") == ["1.brief.md"]
        (root / "logs" / "b").symlink_to(outside)
        with pytest.raises(UnsafePath, match="symbolic link"):
            open_dir(str(root), "logs", "b")
        assert not os.listdir(outside)


class TestFifoInWorkdir:
    """A FIFO at ``<workdir>/.git/HEAD`` (anyone who can write the workdir can plant it) blocks nothing."""

    @pytest.mark.slow
    def test_daemon_keeps_dispatching(self, harness: DaemonHarness, tmp_path: Path) -> None:
        """The issue's repro: a task's git workdir gets a FIFO HEAD, the daemon starts, another task is dispatched."""
        h = harness
        work = git_checkout(tmp_path / "w")
        new_task(h, "gitty", work)
        fifo_head(work)
        h.start()
        new_task(h, "other", tmp_path)
        h.wait(lambda: h.live_agents("other"), "the other task's agent", timeout=15)
        # The FIFO's own task is served too: its brief says HEAD is now refused (never read).
        h.wait(lambda: h.live_agents("gitty"), "the git task's agent", timeout=15)
        brief = (h.state / "logs" / "gitty" / "1.brief.md").read_text()
        assert "FIFO" in brief
        ticks = len(logged(h, "tick"))
        h.wait(lambda: len(logged(h, "tick")) >= ticks + 3, "more ticks")

    def test_verify_and_set_return_promptly(self, harness: DaemonHarness, tmp_path: Path) -> None:
        """verify answers stale (3) naming the FIFO; set is refused (2) naming it; both in well under the timeout."""
        h = harness
        work = git_checkout(tmp_path / "w")
        new_task(h, "gitty", work)
        head = fifo_head(work)
        started = time.monotonic()
        r = h.cli("verify", "gitty")
        assert r.returncode == 3, (r.stdout, r.stderr)
        assert "FIFO" in r.stdout and ".git/HEAD" in r.stdout
        r = h.cli("set", "gitty", "step=next")
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and str(head) in r.stderr and "FIFO" in r.stderr
        assert h.baton("gitty").step == "start"  # refused, the old baton kept
        assert time.monotonic() - started < 30  # (each call is also bounded by the harness's timeout)
        assert stat.S_ISFIFO(os.lstat(head).st_mode)  # left as it is


# An agent that, on its first shift only, plants a FIFO where heartbeat will look and kills its shim,
# so the shim cannot rename a record over it.
FIFO_EXIT_AGENT = """
import os, signal, sys, time
env = os.environ
if env["HEARTBEAT_EPOCH"] == "1":
    os.mkfifo(os.path.join(env["HEARTBEAT_STATE_DIR"], "logs", env["HEARTBEAT_TASK"], "1.exit"))
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(0)
time.sleep(3600)
"""


class TestFifoInLogs:
    """FIFOs planted in ``logs/<id>/`` are refused with one line naming them; the clock keeps ticking."""

    @pytest.mark.slow
    def test_fifo_exit_file(self, tmp_path: Path) -> None:
        """An agent leaves a FIFO as its exit file: it is refused, the task settles and is dispatched again."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, stall_after="1h", agent=[sys.executable, "-c", FIFO_EXIT_AGENT])
        try:
            h.start()
            h.new("a")
            h.wait(lambda: logged(h, "file_refused"), "the FIFO exit file refused", timeout=15)
            refused = logged(h, "file_refused")[0]
            assert str(refused["path"]).endswith("logs/a/1.exit") and "FIFO" in str(refused["error"])
            h.wait(lambda: h.events("a", "exited"), "the first shift settled")
            h.wait(lambda: h.baton("a").meta.epoch == 2 and h.live_agents("a"), "the second shift", timeout=15)
            h.new("b")
            h.wait(lambda: h.live_agents("b"), "another task's agent", timeout=15)
            assert stat.S_ISFIFO(os.lstat(h.state / "logs" / "a" / "1.exit").st_mode)
        finally:
            h.close()

    @pytest.mark.slow
    def test_fifo_at_next_log(self, harness: DaemonHarness, tmp_path: Path) -> None:
        """A FIFO at ``logs/a/1.log``: a's launch is refused naming it; b is dispatched; a runs at epoch 2."""
        h = harness
        h.new("a")
        (h.state / "logs" / "a").mkdir(parents=True, mode=0o700)
        os.mkfifo(h.state / "logs" / "a" / "1.log", 0o600)
        h.start()
        h.new("b")
        h.wait(lambda: h.live_agents("b"), "b's agent", timeout=15)
        failed = h.wait(lambda: logged(h, "launch_failed", "a"), "a's launch refused", timeout=15)[0]
        assert "1.log" in str(failed["reason"]) and "FIFO" in str(failed["reason"])
        # The FIFO spoiled epoch 1 only: the retry's log is a fresh file, and a runs.
        h.wait(lambda: h.live_agents("a") and h.baton("a").meta.epoch == 2, "a's agent at epoch 2", timeout=15)
        assert stat.S_ISFIFO(os.lstat(h.state / "logs" / "a" / "1.log").st_mode)

    @pytest.mark.slow
    def test_fifo_pid_file(self, harness: DaemonHarness) -> None:
        """A FIFO at the pending dispatch's ``<epoch>.pid`` (read to adopt an agent after a crash) is refused."""
        h = harness
        h.new("a")
        with h.store.edit("a") as ed:  # a dispatch recorded by a daemon that died before the agent's pid
            from heartbeat.launchers.liveness import this_host
            from heartbeat.model.baton import Owner

            ed.baton.meta.epoch = 1
            ed.baton.meta.owner = Owner(how="dispatch", launcher="toy", host=this_host())
        (h.state / "logs" / "a").mkdir(parents=True, mode=0o700)
        os.mkfifo(h.state / "logs" / "a" / "1.pid", 0o600)
        h.start()
        h.new("b")
        h.wait(lambda: h.live_agents("b"), "b's agent", timeout=15)
        refused = h.wait(lambda: logged(h, "file_refused", "a"), "the FIFO pid file refused", timeout=15)[0]
        assert str(refused["path"]).endswith("logs/a/1.pid")


class TestSymlinkedLogDir:
    """A ``logs/<id>`` replaced by a symlink: nothing is written through it, the launch is refused."""

    @pytest.mark.slow
    def test_nothing_written_outside(self, harness: DaemonHarness, tmp_path: Path) -> None:
        """The brief, log and exit files never land in the link's target; a's launch fails naming it; b runs."""
        h = harness
        outside = tmp_path / "outside"
        outside.mkdir()
        h.new("a")
        (h.state / "logs").mkdir(mode=0o700)
        (h.state / "logs" / "a").symlink_to(outside)
        h.start()
        h.new("b")
        h.wait(lambda: h.live_agents("b"), "b's agent", timeout=15)
        h.wait(lambda: len(logged(h, "launch_failed", "a")) >= 2, "a refused, retried, refused again", timeout=15)
        assert not os.listdir(outside)
        failed = logged(h, "launch_failed", "a")[0]
        assert "logs/a" in str(failed["reason"]) and "symbolic link" in str(failed["reason"])
        assert "\n" not in str(failed["reason"])
        assert not h.live_agents("a")


# Holds a baton's lock with flock(2) until stdin closes: another process, like a stuck writer.
LOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


class TestHeldBatonLock:
    """A baton lock held by another process skips that task only; it is served once the lock is free."""

    @pytest.mark.slow
    def test_other_tasks_unaffected(self, harness: DaemonHarness) -> None:
        """a.lock held: b is dispatched within 5 s (not after the 30 s lock timeout); a after the release."""
        h = harness
        h.new("a")
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(h.state / "locks" / "a.lock")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            h.start()
            h.new("b")
            h.wait(lambda: h.live_agents("b"), "b's agent while a.lock is held", timeout=5)
            h.wait(lambda: logged(h, "baton_locked", "a"), "the held lock reported")
            assert not h.live_agents("a") and h.baton("a").meta.epoch == 0
            ticks = len(logged(h, "tick"))
            h.wait(lambda: len(logged(h, "tick")) >= ticks + 5, "more ticks")
            assert len(logged(h, "baton_locked", "a")) == 1  # said once, not every look
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=10)
        h.wait(lambda: h.live_agents("a"), "a's agent once the lock is released", timeout=10)


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_marked(marker: str) -> None:
    for proc in marked_processes(marker):
        try:
            proc.kill()
        except psutil.Error:
            pass


class TestStuckWorkerShutdown:
    """SIGTERM stops the daemon within the stop grace even while a worker thread is stuck."""

    @pytest.mark.slow
    def test_sigterm_with_a_stuck_notifier(self, tmp_path: Path) -> None:
        """A notifier that runs for minutes holds a worker thread; SIGTERM still ends the daemon in seconds."""
        tmp_path.chmod(0o700)
        marker = f"hb-stuck-{uuid.uuid4().hex}"
        notify = f"""
[notify.slow]
command = {toml_list([sys.executable, "-c", "import time; time.sleep(300)", marker])}
timeout = "1h"
"""
        h = DaemonHarness(tmp_path, stall_after="1h", agent=SLEEPER, extra=notify)
        try:
            h.start()
            # Not a configured launcher (`new` refuses it, so the API writes it): escalated, the notifier runs.
            tasks.new_task(h.store, "lost", task="t", step="s", workdir=str(tmp_path), launcher="nope")
            h.wait(lambda: marked_processes(marker), "the slow notifier running")
            assert h.proc is not None
            started = time.monotonic()
            h.proc.send_signal(signal.SIGTERM)
            try:
                h.proc.wait(timeout=15)  # stop_grace is 0.5 s; the unfixed daemon waited for the notifier
            except subprocess.TimeoutExpired:
                pytest.fail("the daemon did not stop on SIGTERM while a worker thread was stuck")
            assert time.monotonic() - started < 15
            assert h.proc.returncode == 0
            assert logged(h, "exit_abandoning_threads")
            wait_for(lambda: not marked_processes(marker), timeout=5, message="the notifier killed, not left behind")
        finally:
            h.close()
            kill_marked(marker)


class TestSetsidDescendants:
    """The shim is a child subreaper: a grandchild that left the group with setsid is stopped with the agent."""

    def test_setsid_grandchild_is_stopped(self, tmp_path: Path) -> None:
        """The agent starts a setsid'd sleeper and exits; the sleeper is gone soon after (process table)."""
        marker = f"hb-setsid-{uuid.uuid4().hex}"
        agent = [sys.executable, "-c",
                 "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)',"
                 f" {marker!r}], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
                 " stderr=subprocess.DEVNULL); print('spawned', flush=True)"]
        exit_file = tmp_path / "1.exit"
        command = [sys.executable, "-I", "-S", os.path.abspath(shim.__file__), "--grace", "0.5", str(exit_file), "--",
                   *agent]
        try:
            proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, text=True)
            out, _ = proc.communicate(timeout=30)
            assert "spawned" in out and proc.returncode == 0
            wait_for(lambda: not marked_processes(marker), timeout=10, message="the setsid grandchild gone")
            assert exit_file.exists()
        finally:
            kill_marked(marker)

    def test_orphans_are_reaped_while_the_agent_runs(self, tmp_path: Path) -> None:
        """A setsid'd child that ends while the agent still runs leaves no zombie behind (the shim reaps it)."""
        marker = f"hb-orphan-{uuid.uuid4().hex}"
        # The middle process exits at once, so its setsid'd child (ending 0.3 s later) is orphaned to the shim.
        middle = tmp_path / "middle.py"
        middle.write_text("import os, subprocess, sys\n"
                          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.3)',"
                          " os.environ['HB_MARKER']], start_new_session=True)\n")
        agent = [sys.executable, "-c", "import subprocess, sys, time; "
                 "subprocess.run([sys.executable, sys.argv[1]]); time.sleep(3)", str(middle)]
        command = [sys.executable, "-I", "-S", os.path.abspath(shim.__file__), "--grace", "0.5", str(tmp_path / "1.exit"),
                   "--", *agent]
        proc = subprocess.Popen(command, start_new_session=True, env={**os.environ, "HB_MARKER": marker})
        try:
            shim_proc = psutil.Process(proc.pid)

            def marked(child: psutil.Process) -> bool:
                try:
                    return marker in child.cmdline()
                except psutil.Error:
                    return False

            wait_for(lambda: any(marked(c) for c in shim_proc.children()), timeout=10,
                     message="the orphan re-parented to the shim")
            # Ended 0.3 s later: reaped, not left a zombie child of the shim beside the agent.
            wait_for(lambda: len(shim_proc.children()) == 1, timeout=2.5, message="the ended orphan reaped")
            assert proc.poll() is None  # the agent still runs: the orphan was reaped during the shift
        finally:
            proc.wait(timeout=30)
            kill_marked(marker)


class TestLogDirSwappedWhileTheAgentRuns:
    """Found by the 30-minute soak: ``logs/<id>`` swapped for a link while the agent ran, and the shim
    wrote the agent's exit record through it, outside the state dir."""

    def test_the_exit_record_stays_in_the_directory_the_shim_started_in(self, tmp_path: Path) -> None:
        """The shim holds its log directory from the start: the record lands there, never in the link's target."""
        import subprocess
        import sys

        from heartbeat.launchers import shim

        logs = tmp_path / "state" / "logs" / "t1"
        logs.mkdir(parents=True, mode=0o700)
        outside = tmp_path / "outside"
        outside.mkdir()
        go = tmp_path / "go"
        agent = [sys.executable, "-c",
                 f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"]
        proc = subprocess.Popen([sys.executable, "-I", "-S", shim.__file__, "--grace", "0.2", str(logs / "1.exit"), "--",
                                 *agent])
        try:
            wait_for(lambda: (logs / "1.pid").exists(), timeout=20, message="the shim's pid file")
            moved = tmp_path / "state" / "logs" / "t1.moved"
            logs.rename(moved)
            logs.symlink_to(outside)
            go.touch()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not os.listdir(outside)
        assert (moved / "1.exit").is_file()
