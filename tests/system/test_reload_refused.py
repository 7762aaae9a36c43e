"""A refused reload is visible: the unit's ExecReload runs check-config first, and the daemon's
STATUS= says the reload was refused (issue 26, item 4). A real daemon, SIGHUP, a real datagram socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import DaemonHarness

pytestmark = pytest.mark.slow


class NotifiedHost(DaemonHarness):
    def __init__(self, root: Path, notify: str) -> None:
        super().__init__(root)
        self.notify = notify

    def env(self) -> dict[str, str]:
        return {**super().env(), "NOTIFY_SOCKET": self.notify}


def test_a_broken_config_on_sighup_says_reload_refused_in_status(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(1)
        h = NotifiedHost(tmp_path, str(path))
        try:
            h.start()
            h.config.write_text(h.config.read_text() + "\n[daemon\n")  # a broken file
            assert subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(h.config), "check-config"],
                                  capture_output=True, env=h.env(), timeout=60).returncode == 2  # ExecReload's first line
            assert h.proc is not None
            os.kill(h.proc.pid, signal.SIGHUP)
            seen: list[str] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(s.startswith("STATUS=reload refused") for s in seen):
                try:
                    seen += sock.recv(65536).decode().split("\n")
                except TimeoutError:
                    continue
            refused = [s for s in seen if s.startswith("STATUS=reload refused")]
            assert refused, seen
            assert refused[0].startswith("STATUS=reload refused, running on the config loaded before: ")
            assert "READY=1" in seen
            assert h.wait_log(lambda e: e.get("event") == "reload_failed", "the refusal logged")
        finally:
            h.close()
