"""The shim's lease watch (issue 19 item 4), on the real shim script with real agents and signals:
the agent runs while its lease file is renewed and is stopped (SIGTERM, then SIGKILL) once the
deadlines in it pass; a hostile or missing file never extends a deadline nor hangs the shim.
The two-host run with real daemons is tests/external/test_no_two_agents.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import wait_for

from heartbeat.config.shape import LauncherConfig
from heartbeat.launchers.exec import shim_command
from heartbeat.launchers.shim import lease_clock, read_lease

SHIM = str(Path(__file__).resolve().parents[2] / "heartbeat" / "launchers" / "shim.py")

SLEEPER = "import time\nwhile True: time.sleep(1)\n"
STUBBORN = ("import pathlib, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "pathlib.Path(sys.argv[0]).with_name('ready').touch()\nwhile True: time.sleep(1)\n")


def write_lease(path: Path, term_in: float, kill_in: float) -> None:
    now = lease_clock()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"term_at": now + term_in, "kill_at": now + kill_in}))
    os.replace(tmp, path)


def start(tmp_path: Path, agent: str, lease: Path) -> subprocess.Popen[bytes]:
    script = tmp_path / "agent.py"
    script.write_text(agent)
    log = open(tmp_path / "shim.log", "ab")  # noqa: SIM115
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", SHIM, "--grace", "5", "--lease", str(lease),
                                 str(tmp_path / "1.exit"), "--", sys.executable, str(script)],
                                stdout=log, stderr=log, start_new_session=True)
    finally:
        log.close()


def exit_record(tmp_path: Path) -> dict[str, object]:
    return dict(json.loads((tmp_path / "1.exit").read_text()))


class TestWatch:
    def test_the_agent_runs_while_renewed_and_is_stopped_when_its_lease_runs_out(self, tmp_path: Path) -> None:
        lease = tmp_path / "1.lease"
        write_lease(lease, 1.0, 1.5)
        shim = start(tmp_path, SLEEPER, lease)
        try:
            renew_until = lease_clock() + 2.5  # past the first deadline: only the renewals keep it alive
            while lease_clock() < renew_until:
                write_lease(lease, 1.0, 1.5)
                assert shim.poll() is None, (tmp_path / "shim.log").read_text()
                time.sleep(0.1)
            shim.wait(timeout=30)
        finally:
            if shim.poll() is None:
                shim.kill()
        assert exit_record(tmp_path)["signal"] == 15  # SIGTERM, at term_at
        assert "its host's lease on the task ran out unrenewed" in (tmp_path / "shim.log").read_text()

    def test_an_agent_that_ignores_sigterm_is_killed_at_kill_at_and_the_exit_is_recorded(self,
                                                                                         tmp_path: Path) -> None:
        lease = tmp_path / "1.lease"
        write_lease(lease, 60, 60)
        shim = start(tmp_path, STUBBORN, lease)
        try:
            wait_for(lambda: (tmp_path / "ready").exists(), message="the agent ignoring SIGTERM")
            write_lease(lease, 0.2, 0.8)
            shim.wait(timeout=30)
        finally:
            if shim.poll() is None:
                shim.kill()
        assert exit_record(tmp_path)["signal"] == 9
        assert shim.returncode == 128 + 9

    def test_no_lease_file_stops_the_agent_at_once(self, tmp_path: Path) -> None:
        """The daemon writes the file before the launch: none at all is never taken as "no deadline"."""
        shim = start(tmp_path, SLEEPER, tmp_path / "missing.lease")
        try:
            shim.wait(timeout=30)
        finally:
            if shim.poll() is None:
                shim.kill()
        assert exit_record(tmp_path)["signal"] == 15
        assert "no lease file at" in (tmp_path / "shim.log").read_text()

    def test_a_file_turned_hostile_keeps_the_last_deadline(self, tmp_path: Path) -> None:
        """Replaced by a FIFO mid-run (a reader would block on it for ever): no new deadline, no hang;
        the agent is stopped at the last deadline read."""
        lease = tmp_path / "1.lease"
        write_lease(lease, 1.0, 1.5)
        shim = start(tmp_path, SLEEPER, lease)
        try:
            wait_for(lambda: (tmp_path / "1.pid").exists(), message="the shim's pid file")
            time.sleep(0.3)  # (the watch has read the file)
            lease.unlink()
            os.mkfifo(lease)
            shim.wait(timeout=30)
        finally:
            if shim.poll() is None:
                shim.kill()
        assert exit_record(tmp_path)["signal"] == 15

    def test_without_lease_the_shim_watches_nothing(self, tmp_path: Path) -> None:
        """The file store: no --lease, the command is what it was."""
        config = LauncherConfig(name="toy", type="exec", command=("true",))
        assert "--lease" not in shim_command(config, "/x/1.exit", ["true"])
        with_lease = shim_command(config, "/x/1.exit", ["true"], lease_file="/x/1.lease")
        assert with_lease[with_lease.index("--lease") + 1] == "/x/1.lease"
        assert with_lease[with_lease.index("--") - 1] == "/x/1.exit"


class TestReadLease:
    def test_only_what_the_daemon_writes_is_a_lease(self, tmp_path: Path) -> None:
        path = tmp_path / "l"
        path.write_text(json.dumps({"term_at": 5.0, "kill_at": 7.0, "host": "h"}))
        assert read_lease(str(path)) == (5.0, 7.0)
        path.write_text(json.dumps({"term_at": 9.0, "kill_at": 7.0}))
        assert read_lease(str(path)) == (7.0, 7.0)  # never a SIGTERM after the SIGKILL
        for bad in ("", "{", "[]", '{"term_at": 1}', '{"term_at": "x", "kill_at": 2}', '{"term_at": NaN, "kill_at": 2}',
                    '{"term_at": 1, "kill_at": Infinity}', "[" * 100000, json.dumps({"term_at": 1, "kill_at": 2,
                                                                                         "pad": "x" * 5000})):
            path.write_text(bad)
            assert read_lease(str(path)) is None, bad[:40]

    def test_a_fifo_a_link_a_directory_or_nothing_is_no_lease_and_never_blocks(self, tmp_path: Path) -> None:
        real = tmp_path / "real"
        real.write_text(json.dumps({"term_at": 5.0, "kill_at": 7.0}))
        link = tmp_path / "link"
        link.symlink_to(real)
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        for path in (link, fifo, tmp_path, tmp_path / "missing"):
            assert read_lease(str(path)) is None, path


ACTOR = ("import os, pathlib, signal, sys, time\n"
         "here = pathlib.Path(sys.argv[0]).parent\n"
         "def acted(signum, frame):\n"
         "    (here / 'acted').write_text('after SIGTERM')\n"
         "    os._exit(0)\n"
         "signal.signal(signal.SIGTERM, acted)\n"
         "(here / 'ready').touch()\n"
         "while True: time.sleep(3600)\n")
"""An agent whose SIGTERM handler acts (writes a file): what a thawed agent must never get to do."""


def pids_of(shim: subprocess.Popen[bytes], tmp_path: Path) -> tuple[int, int]:
    import psutil

    wait_for(lambda: (tmp_path / "ready").exists(), message="the agent")
    children = psutil.Process(shim.pid).children()
    assert len(children) == 1
    return shim.pid, children[0].pid


class TestAThaw:
    """Issue 24 item 13: the shim, its agent (and their daemon) SIGSTOPped past the lease, then SIGCONT."""

    def test_a_shim_woken_past_kill_at_kills_the_agent_before_it_can_act(self, tmp_path: Path) -> None:
        """Woken past ``kill_at`` (another host may run the task already), the shim SIGKILLs the agent
        at once: no SIGTERM whose handler would act. At 4c852cf it sent SIGTERM first and the agent's
        handler wrote its file before the SIGKILL came. The agent is resumed first, as in the probe."""
        lease = tmp_path / "1.lease"
        write_lease(lease, 1.0, 1.5)
        shim = start(tmp_path, ACTOR, lease)
        try:
            shim_pid, agent_pid = pids_of(shim, tmp_path)
            os.kill(shim_pid, signal.SIGSTOP)
            os.kill(agent_pid, signal.SIGSTOP)
            time.sleep(2.5)  # the pause itself (a frozen container), past kill_at: not a wait for something
            os.kill(agent_pid, signal.SIGCONT)
            os.kill(shim_pid, signal.SIGCONT)
            shim.wait(timeout=30)
        finally:
            if shim.poll() is None:
                shim.kill()
        assert not (tmp_path / "acted").exists()
        assert exit_record(tmp_path)["signal"] == 9
        log = (tmp_path / "shim.log").read_text()
        assert "paused for" in log and "killing the agent at once" in log, log


class TestTheTtlBounds:
    """Issue 24 item 11: a lease file is bounded by the ttl the shim was started with."""

    def test_a_deadline_of_1e308_lasts_no_longer_than_the_ttl(self, tmp_path: Path) -> None:
        """``term_at`` 1e308 (finite, so read_lease takes it) with ``--ttl 1``: the agent is stopped about a
        second after the file was first seen, not never. At 4c852cf ``--ttl`` did not exist (usage, exit 2)
        and the file held the agent for ever."""
        lease = tmp_path / "1.lease"
        lease.write_text(json.dumps({"term_at": 1e308, "kill_at": 1e308}))
        script = tmp_path / "agent.py"
        script.write_text(SLEEPER)
        with open(tmp_path / "shim.log", "ab") as log:
            shim = subprocess.Popen([sys.executable, "-I", "-S", SHIM, "--grace", "5", "--lease", str(lease),
                                     "--ttl", "1", str(tmp_path / "1.exit"), "--", sys.executable, str(script)],
                                    stdout=log, stderr=log, start_new_session=True)
        try:
            shim.wait(timeout=30)
        finally:
            if shim.poll() is None:
                shim.kill()
        assert exit_record(tmp_path)["signal"] in (9, 15), (tmp_path / "shim.log").read_text()

    def test_the_launcher_passes_the_ttl(self) -> None:
        config = LauncherConfig(name="toy", type="exec", command=("true",))
        argv = shim_command(config, "/x/1.exit", ["true"], lease_file="/x/1.lease", lease_ttl=6.0)
        assert argv[argv.index("--ttl") + 1] == "6"
        assert "--ttl" not in shim_command(config, "/x/1.exit", ["true"])
