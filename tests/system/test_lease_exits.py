"""Issue 24 items 15 and 8: how an agent's end is recorded when it was not the agent's own doing.

15: an agent its shim stopped because its host's lease lapsed (a database outage, a pause) was
recorded as its own exit (``kind idle``, code 0: 18 such events in the probe), so repeated outages
could escalate a healthy task. The shim now writes ``"stopped": "lease"`` in the exit record and the
daemon records ``kind lease-lapsed``, giving the attempt back.
8: an agent SIGKILLed while the disk is full was recorded ``exit 120`` (the shim's own crash), not
signal 9.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import wait_for
from daemon_harness import NULL_AGENT, in_process_config

from heartbeat.daemon import Daemon
from heartbeat.launchers.base import read_exit_file
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks
from tests.system.test_resources import fill, small_tmpfs
from tests.system.test_shim_lease import SHIM

SLEEPY = f"""[launchers.sleepy]
type = "exec"
command = {json.dumps([sys.executable, "-c", "import time; time.sleep(600)"])}
stop_grace = "200ms"
"""


class TestALeaseLapseIsNotTheAgentsEnd:
    def test_an_exit_record_saying_lease_is_recorded_as_a_lease_lapse_and_spends_no_attempt(
            self, tmp_path: Path) -> None:
        """The agent ended with code 0 after its shim stopped it for the lease: ``exited`` says
        ``kind lease-lapsed`` with the reason, the attempt is given back, no idle resume is counted.
        At 4c852cf: ``kind idle`` and ``idle_resumes`` 1."""
        tmp_path.chmod(0o700)
        state, config = in_process_config(tmp_path, launchers=NULL_AGENT + SLEEPY)
        d = Daemon(config, store=FileStore(str(state)))
        try:
            tasks.new_task(d.store, "t", task="work", step="start", launcher="sleepy", workdir=str(tmp_path))
            d.tick()
            baton = d.store.load("t")
            owner = baton.meta.owner
            assert owner is not None and owner.pid
            attempt = baton.meta.attempt
            # What the shim leaves when its lease watch stopped the agent (which then exited 0) ...
            Path(d.shared.layout.exit("t", baton.meta.epoch)).write_text(json.dumps(
                {"code": 0, "signal": None, "ended_at": "2026-12-02T00:00:00Z", "stopped": "lease"}))
            os.killpg(owner.pid, signal.SIGKILL)  # ... and no shim nor agent left
            exited = wait_for(lambda: (d.tick(), [e for e in d.store.ledger.events("t") if e.kind == "exited"])[1],
                              timeout=30)
            meta = d.store.load("t").meta
        finally:
            d.shutdown(timeout=10)
            successor = d.store.load("t").meta.owner  # a daemon's stop leaves its agents: the successor's too
            if successor is not None and successor.pid and successor.pid != owner.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(successor.pid, signal.SIGKILL)
        assert exited[0].data["kind"] == "lease-lapsed", exited
        assert meta.idle_resumes == 0
        assert meta.attempt <= attempt  # given back (a successor's dispatch may have taken it again)

    def test_the_shim_writes_stopped_lease_when_its_watch_stopped_the_agent(self, tmp_path: Path) -> None:
        """No lease file at all: the watch stops the agent at once, and the record says why."""
        script = tmp_path / "agent.py"
        script.write_text("import time\nwhile True: time.sleep(1)\n")
        shim = subprocess.run([sys.executable, "-I", "-S", SHIM, "--grace", "1", "--lease", str(tmp_path / "none"),
                               str(tmp_path / "1.exit"), "--", sys.executable, str(script)],
                              capture_output=True, timeout=60)
        assert shim.returncode == 128 + 15
        status = read_exit_file(str(tmp_path / "1.exit"))
        assert status is not None and status.lease_lapsed and status.signal == 15


class TestAFullDisk:
    def test_an_agent_sigkilled_on_a_full_disk_ends_its_shim_by_signal_9(self, tmp_path: Path) -> None:
        """The exit record cannot be written (nor the shim's line saying so): the shim ends by the
        agent's signal, which is what the launcher then reads (a negative status: signal 9).
        At 4c852cf the shim crashed on its own stderr line and exited 120."""
        with small_tmpfs(tmp_path / "disk") as disk:
            script = tmp_path / "agent.py"
            script.write_text("import time\nwhile True: time.sleep(1)\n")
            with open(disk / "1.log", "ab") as log:
                shim = subprocess.Popen([sys.executable, "-I", "-S", SHIM, "--grace", "1", str(disk / "1.exit"),
                                         "--", sys.executable, str(script)],
                                        stdout=log, stderr=log, start_new_session=True)
            try:
                wait_for(lambda: (disk / "1.pid").exists(), timeout=30)
                agent = wait_for(lambda: _child(shim.pid), timeout=30)
                filler = fill(disk)
                os.kill(agent, signal.SIGKILL)
                code = shim.wait(timeout=30)
            finally:
                if shim.poll() is None:
                    shim.kill()
                    shim.wait()
            assert code == -signal.SIGKILL, (code, (disk / "1.log").read_bytes(), sorted(p.name for p in disk.iterdir()))
            assert not (disk / "1.exit").exists()
            filler.unlink()


def _child(pid: int) -> int | None:
    import psutil

    children = psutil.Process(pid).children()
    return children[0].pid if children else None
