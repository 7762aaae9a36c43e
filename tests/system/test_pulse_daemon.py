"""A real daemon (tests/support/daemon_harness.py) counts an agent's pulses as touches."""

from __future__ import annotations

import sys
from pathlib import Path

from daemon_harness import DaemonHarness, toml_list

_PULSING_AGENT = (
    "import os, subprocess, sys, time\n"
    "for _ in range(40):\n"
    "    subprocess.run([sys.executable, '-m', 'heartbeat', 'touch', os.environ['HEARTBEAT_TASK']], check=True)\n"
    "    time.sleep(0.1)\n"
    "open('stopped-touching', 'w').write(repr(time.time()))\n"
    "time.sleep(3600)\n"
)


PULSER = f"""
[launchers.pulser]
type = "exec"
command = {toml_list([sys.executable, "-c", _PULSING_AGENT])}
stop_grace = "500ms"
"""


class TestDaemonSeesPulses:
    """The daemon's stall detection counts a pulse as a touch."""

    def test_a_pulsing_agent_is_alive_until_it_stops(self, tmp_path: Path) -> None:
        """An agent that only touches (pulses, after its first) is not stalled; once it stops it is, as silent."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, stall_after="3s", extra=PULSER)
        try:
            h.start()
            h.new("pulsing", "--launcher", "pulser")
            marker = tmp_path / "stopped-touching"
            h.wait(lambda: marker.exists() and marker.read_text(), "the agent to finish touching", timeout=90)
            stopped_at = float(marker.read_text())
            # 40 touches written to the baton would have taken it past revision 40.
            assert h.baton("pulsing").meta.revision < 10
            h.wait(lambda: h.events("pulsing", "stalled"), "the stall", timeout=30)
            stalled = h.events("pulsing", "stalled")[0]
            assert stalled.epoch == 1 and stalled.data["why"] == "silent", stalled
            assert stalled.ts.timestamp() >= stopped_at + 1.0  # not while it was pulsing
        finally:
            h.close()
