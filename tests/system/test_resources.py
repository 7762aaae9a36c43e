"""Resource bounds: endless agent output, a check that never returns, 10,000 batons at once, a full disk.

Each runs against a real daemon (``heartbeat run`` in a subprocess) with real processes;
the disk-full tests mount a real 256 KiB tmpfs (root only: skipped with a reason otherwise,
and failing, not skipping, when root cannot mount).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_harness import DaemonHarness, toml_list

from heartbeat.launchers.base import cap_log
from heartbeat.model.baton import Gate
from heartbeat.store.files import FileStore

pytestmark = pytest.mark.slow


def events_named(h: DaemonHarness, name: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in h.log() if e.get("event") == name and all(e.get(k) == v for k, v in match.items())]


def tick_times(h: DaemonHarness) -> list[float]:
    return [datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
            for e in events_named(h, "tick")]


# -- endless output ----------------------------------------------------------------------------

CHATTY = r"""
import os, sys, time
n = 0
while True:
    for _ in range(16):
        n += 1
        sys.stdout.write(f"{n:012d} " + "x" * 86 + "\n")   # 100 bytes a line: the number says how much was written
    sys.stdout.flush()
    time.sleep(0.002)
"""


class TestCapLog:
    """cap_log keeps the tail of a log past its cap and lets the writer go on at the new end."""

    def test_cut_keeps_the_last_quarter_and_the_writer_appends(self, tmp_path: Path) -> None:
        """A 100 KiB log with a 64 KiB cap: .1 holds its last 16 KiB, the live file restarts with a note, appends go on."""
        log = tmp_path / "1.log"
        data = b"".join(f"{i:09d}\n".encode() for i in range(10_240))  # 102,400 bytes
        log.write_bytes(data)
        writer = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            assert cap_log(str(log), 64 * 1024) == len(data)
            os.write(writer, b"after the cut\n")
        finally:
            os.close(writer)
        kept = (tmp_path / "1.log.1").read_bytes()
        assert kept == data[-16 * 1024:]
        live = log.read_bytes()
        assert live.startswith(b"[heartbeat: this log passed max_log_bytes (65536) at 102400 bytes")
        assert live.endswith(b"\nafter the cut\n") and len(live) < 300
        assert (os.stat(tmp_path / "1.log.1").st_mode & 0o777) == 0o600

    def test_under_the_cap_nothing_happens(self, tmp_path: Path) -> None:
        """A log at or under its cap, a missing log, a cap of 0 and a symlink are left alone."""
        log = tmp_path / "1.log"
        log.write_bytes(b"x" * 4096)
        assert cap_log(str(log), 4096) is None
        assert cap_log(str(log), 0) is None
        assert cap_log(str(tmp_path / "missing.log"), 10) is None
        (tmp_path / "link.log").symlink_to(log)
        assert cap_log(str(tmp_path / "link.log"), 10) is None
        assert log.read_bytes() == b"x" * 4096 and not (tmp_path / "1.log.1").exists()


class TestEndlessOutput:
    """An agent printing without end under a real daemon: its log stays bounded, the daemon keeps ticking."""

    def test_log_is_capped_again_and_again(self, tmp_path: Path) -> None:
        """With max_log_bytes = 64 KiB, an agent writing ~0.8 MB/s is cut at least twice and its logs stay small."""
        tmp_path.chmod(0o700)
        cap = 64 * 1024
        script = tmp_path / "chatty.py"
        script.write_text(CHATTY)
        h = DaemonHarness(tmp_path, stall_after="1h", agent=[sys.executable, str(script)],
                          launcher_extra=f"max_log_bytes = {cap}")
        try:
            h.start()
            h.new("chatty")
            h.wait(lambda: len(events_named(h, "log_capped", task="chatty")) >= 2, "two cuts", timeout=60)
            log_dir = h.state / "logs" / "chatty"
            epoch = h.baton("chatty").meta.epoch
            live, kept = log_dir / f"{epoch}.log", log_dir / f"{epoch}.log.1"

            def written() -> int:  # the agent's own count, from the last complete line it wrote
                lines = live.read_bytes().splitlines()
                numbers = [int(line[:12]) for line in lines[-3:-1] if line[:12].isdigit()]
                return numbers[-1] * 100 if numbers else 0

            h.wait(lambda: written() > 40 * cap, "the agent to write 40 times the cap", timeout=60)
            assert h.live_agents("chatty"), "the agent keeps running: the cut does not disturb it"
            on_disk = sum(p.stat().st_size for p in log_dir.iterdir() if ".log" in p.name)
            assert on_disk < written() / 4, (on_disk, written())
            assert kept.stat().st_size == cap // 4
            cuts = events_named(h, "log_capped", task="chatty")
            assert all(c["size"] > cap for c in cuts) and all(c["epoch"] == epoch for c in cuts)
            ticks = len(tick_times(h))
            h.wait(lambda: len(tick_times(h)) >= ticks + 5, "the daemon to keep ticking")
        finally:
            h.close()


# -- a check that never returns ----------------------------------------------------------------

def our_processes(workdir: Path, name: str) -> list[psutil.Process]:
    """Processes named ``name`` running in ``workdir`` (the check's cwd), so other tests' sleeps are not ours."""
    found = []
    for proc in psutil.process_iter(["name", "cwd", "status"]):
        try:
            if proc.info["name"] == name and proc.info["cwd"] == str(workdir) \
                    and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


class TestCheckThatNeverReturns:
    """A gate check that hangs is killed, with its whole process group, at its timeout; the clock keeps its cadence."""

    def test_hung_check_is_killed_and_ticks_keep_their_cadence(self, tmp_path: Path) -> None:
        """`sleep 1000` (and a shell leaving a background sleep) as 2 s checks: ticks keep coming every ~200 ms."""
        tmp_path.chmod(0o700)
        work = tmp_path / "work"
        work.mkdir()
        checks = f"""
[checks.slow]
command = ["sleep", "1000"]
timeout = "2s"

[checks.forks]
command = {toml_list(["sh", "-c", "sleep 1000 & sleep 1000"])}
timeout = "2s"
"""
        h = DaemonHarness(tmp_path, tick="200ms", extra=checks)
        try:
            h.start()
            for task, gate in (("slow", "check:slow"), ("forks", "check:forks")):
                r = h.cli("new", task, "--task", "t", "--step", "s", "--workdir", str(work),
                          "--blocked-on", "a check that never passes", "--gate", gate)
                assert r.returncode == 0, r.stderr
            h.wait(lambda: our_processes(work, "sleep"), "a check to start")
            first = tick_times(h)[-1]
            h.wait(lambda: tick_times(h)[-1] > first + 6.5, "6.5 seconds of ticks", timeout=30)
            times = [t for t in tick_times(h) if t >= first]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert len(times) >= 10 and max(gaps) < 2.0, gaps  # a 200 ms tick, never held by a 2 s check (held: >= 2 s)
            # Every sleep we see is younger than the timeout (+ slack): each one was killed on time,
            # the background one with its group.
            for _ in range(20):
                for proc in our_processes(work, "sleep"):
                    with contextlib.suppress(psutil.Error):
                        assert time.time() - proc.create_time() < 4.0, proc
                time.sleep(0.1)
            for task in ("slow", "forks"):
                assert h.baton(task).meta.status.value == "blocked"
                assert not h.events(task, "unblocked")
        finally:
            h.close()
        h.wait(lambda: not our_processes(work, "sleep"), "no sleep left behind", timeout=5)


# -- 10,000 batons at once ---------------------------------------------------------------------

NULL_LAUNCHER = """
[launchers.null]
type = "null"
runtime = "1s"
exit_code = 0
"""


def concurrent_peak(dispatched: list[Any], exited: list[Any]) -> int:
    """The most agents running at once, from the ledger's dispatched/exited events."""
    points = sorted([(e.ts, 1) for e in dispatched] + [(e.ts, -1) for e in exited], key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    return peak


class TestTenThousandBatons:
    """10,000 baton files appearing at once while the daemon runs: it keeps ticking, budget and capacity hold."""

    def test_flood_of_batons(self, tmp_path: Path) -> None:
        """100 active of 10,000: at most 5 agents at once, at most 12 dispatches a minute, ticks go on, RSS stays modest."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, tick="500ms", max_concurrent=5, dispatches_per_minute=12,
                          backoff_initial="100ms", extra=NULL_LAUNCHER)
        # A full sweep every 2 s (not the default minute), so sweeps of the 10,000 are watched too.
        h.write_config(h.config_text().replace('log_level = "debug"', 'log_level = "debug"\nsweep_every = "2s"'))
        batons = h.state / "batons"
        try:
            h.start()
            assert h.proc is not None
            daemon = psutil.Process(h.proc.pid)
            rss_before = daemon.memory_info().rss
            started = time.monotonic()
            for i in range(10_000):
                active = i % 100 == 0
                status = "active" if active else ("done" if i % 2 else "blocked")
                extra = 'blocked_on = "a human"\n' if status == "blocked" else ""
                # Plain writes, no temp file and no rename: the daemon may see half-written files.
                (batons / f"b{i:05d}.toml").write_text(
                    f'task = "task {i}"\nstep = "s"\nlauncher = "null"\nworkdir = "{tmp_path}"\n{extra}'
                    f'[meta]\nid = "b{i:05d}"\nstatus = "{status}"\n')
            wrote = time.monotonic() - started
            h.wait(lambda: any(e.get("tasks") == 10_000 for e in events_named(h, "tick")), "a tick over all 10,000",
                   timeout=120)
            # The flood is absorbed once eight passes in a row read almost nothing: only what the
            # daemon itself wrote (dispatches, exits), never the 10,000 again, not even in a full
            # sweep. A store that re-read unchanged batons, or a change feed that never caught up,
            # never gets here.
            def absorbed() -> bool:
                recent = events_named(h, "tick")[-8:]
                return len(recent) == 8 and max(e["read"] for e in recent) < 100 \
                    and any(e["sweep"] and e["tasks"] == 10_000 for e in recent)
            h.wait(absorbed, "eight passes in a row, a full sweep among them, that read fewer than 100 batons",
                   timeout=120)
            after_flood = len(tick_times(h))
            h.wait(lambda: len(tick_times(h)) >= after_flood + 10, "ten more ticks: the clock goes on", timeout=60)
            rss = daemon.memory_info().rss
            dispatched = h.store.ledger.events(kinds=["dispatched"])
            exited = h.store.ledger.events(kinds=["exited"])
            times = tick_times(h)
            print(f"\n10,000 batons written in {wrote:.1f}s; daemon RSS {rss_before / 2**20:.0f} MiB before, "
                  f"{rss / 2**20:.0f} MiB after; {len(dispatched)} dispatches; peak concurrency "
                  f"{concurrent_peak(dispatched, exited)}; longest gap between ticks "
                  f"{max(b - a for a, b in itertools.pairwise(times)):.1f}s")
            assert dispatched, "the active tasks are dispatched"
            for first in dispatched:  # the budget, over every minute-long window (a slow CI may run past one)
                window = [e for e in dispatched if 0 <= (e.ts - first.ts).total_seconds() < 60]
                assert len(window) <= 12, [e.ts.isoformat() for e in window]
            assert concurrent_peak(dispatched, exited) <= 5
            assert rss < 600 * 2**20, f"daemon RSS {rss / 2**20:.0f} MiB"
            assert h.proc.poll() is None
            # (How long a pass takes under a flood is measured by scripts/bench_daemon.py, not asserted here.)
        finally:
            h.close()


# -- the disk fills up ---------------------------------------------------------------------------

@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "256k") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path`` (mode 0700), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    path.mkdir(mode=0o700, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    # As root this must work: a CI that cannot mount fails here instead of silently skipping.
    assert r.returncode == 0, f"cannot mount a tmpfs as root: {r.stderr.strip()}"
    try:
        yield path
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)  # a process may still hold a file open for a moment
        else:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> Path:
    """Write a filler file until the filesystem says ENOSPC, down to the last byte; return it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def baton_dir_listing(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "batons").iterdir())


class TestDiskFull:
    """Writes on a full disk fail with one clear line and keep the previous baton; the daemon logs it and ticks on."""

    def test_cli_write_fails_cleanly_and_recovers(self, tmp_path: Path) -> None:
        """ENOSPC: exit 1, 'No space left on device', 'the previous baton is kept', the old file byte-identical, no temp."""
        state = tmp_path / "state"
        with small_tmpfs(state):
            env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
            env["HEARTBEAT_STATE_DIR"] = str(state)

            def hb(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([sys.executable, "-m", "heartbeat", *args], env=env, capture_output=True,
                                      text=True, timeout=60, cwd=str(tmp_path))

            r = hb("new", "t1", "--task", "t", "--step", "before", "--workdir", str(tmp_path))
            assert r.returncode == 0, r.stderr
            path = state / "batons" / "t1.toml"
            before = path.read_bytes()
            listing = baton_dir_listing(state)
            filler = fill(state)
            for args in (("set", "t1", "step=after " + "x" * 2000), ("add", "t1", "constraints", "y" * 5000),
                         ("touch", "t1"), ("new", "t2", "--task", "t", "--step", "s", "--intent", "z" * 5000)):
                r = hb(*args)
                assert r.returncode == 1, (args, r.returncode, r.stderr)
                lines = r.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("heartbeat: "), r.stderr
                assert "No space left on device" in lines[0], r.stderr
                if args[0] != "new":
                    assert "the previous baton is kept" in lines[0], r.stderr
                assert path.read_bytes() == before
                assert baton_dir_listing(state) == listing, "no temp file left behind"
            filler.unlink()
            r = hb("set", "t1", "step=after")
            assert r.returncode == 0, r.stderr
            assert hb("show", "t1", "--json").returncode == 0
            assert json.loads(hb("show", "t1", "--json").stdout)["step"] == "after"

    def test_api_write_fails_cleanly(self, tmp_path: Path) -> None:
        """Through the Python API: a StoreError naming ENOSPC, the old baton intact; after freeing space, writes work."""
        from heartbeat.api import open_task
        from heartbeat.model.errors import StoreError
        from heartbeat.tasks import verbs as tasks

        state = tmp_path / "state"
        with small_tmpfs(state):
            store = FileStore(str(state))
            try:
                tasks.new_task(store, "t1", task="t", step="before")
                task = open_task("t1", store=store)
                before = (state / "batons" / "t1.toml").read_bytes()
                filler = fill(state)
                with pytest.raises(StoreError, match=r"No space left on device.*the previous baton is kept"):
                    with task.update() as baton:
                        baton.step = "after " + "x" * 3000
                assert (state / "batons" / "t1.toml").read_bytes() == before
                assert task.read().step == "before"
                filler.unlink()
                with task.update() as baton:
                    baton.step = "after"
                assert task.read().step == "after"
            finally:
                store.close()

    def test_daemon_logs_the_error_and_keeps_ticking(self, tmp_path: Path) -> None:
        """A daemon that must write to a full state dir logs 'No space left on device' and ticks on; then recovers."""
        from heartbeat.model.baton import Status
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        state = tmp_path / "state"
        with small_tmpfs(state, size="1m"):  # room for the ledger's WAL to grow until its checkpoint
            h = DaemonHarness(tmp_path, tick="200ms", extra=NULL_LAUNCHER.replace('runtime = "1s"', ""))
            try:
                # "later" is blocked until a time gate opens in 3 s: then the daemon must write an unblock.
                tasks.new_task(h.store, "later", task="t", step="s", workdir=str(tmp_path), launcher="null",
                               blocked_on="the clock", gate=Gate.parse("time:+3s"))
                # "paused" will be made active by an in-place edit that needs no new disk space:
                # then the daemon must write a dispatch.
                tasks.new_task(h.store, "paused", task="t", step="s", workdir=str(tmp_path), launcher="null")
                with h.store.edit("paused") as ed:
                    ed.baton.meta.status = Status.PAUSED
                h.start()
                filler = fill(state)
                path = state / "batons" / "paused.toml"
                data = path.read_bytes()
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, data.replace(b'status = "paused"', b'status = "active"'), 0)
                finally:
                    os.close(fd)
                before = {name: (state / "batons" / name).read_bytes() for name in ("later.toml", "paused.toml")}

                def full_disk_errors(event: str) -> list[dict[str, Any]]:
                    return [e for e in events_named(h, event) if "No space left on device" in json.dumps(e)]

                h.wait(lambda: full_disk_errors("dispatch_failed"), "the failed dispatch, logged")
                h.wait(lambda: full_disk_errors("task_failed"), "the failed unblock, logged", timeout=30)
                ticks = len(tick_times(h))
                h.wait(lambda: len(tick_times(h)) >= ticks + 10, "ten more ticks on the full disk")
                assert not events_named(h, "tick_failed"), "a full disk must not abort the tick"
                assert h.proc is not None and h.proc.poll() is None
                for name, data in before.items():
                    assert (state / "batons" / name).read_bytes() == data
                assert baton_dir_listing(state) == ["later.toml", "paused.toml"], "no temp file left behind"
                filler.unlink()
                for task in ("later", "paused"):
                    h.wait(lambda task=task: h.baton(task).meta.owner is not None, f"{task} dispatched")
                    assert h.baton(task).meta.status is Status.ACTIVE
            finally:
                h.close()
