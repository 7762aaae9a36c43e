"""heartbeat.system.systemd against real AF_UNIX datagram sockets, the way systemd listens."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat.system.systemd import PLUMBING_ENV, notify, status_line, watchdog_interval, without_plumbing


class Listener:
    """A datagram socket standing in for systemd's notification socket."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address

    def receive(self) -> list[str]:
        return self.sock.recv(65536).decode().split("\n")

    def pending(self) -> bool:
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)


@pytest.fixture
def fs_listener(tmp_path: Path) -> Iterator[Listener]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield Listener(sock, str(path))


@pytest.fixture
def abstract_listener() -> Iterator[Listener]:
    name = f"heartbeat-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        yield Listener(sock, "@" + name)


class TestNotify:
    def test_filesystem_socket_receives_ready(self, fs_listener: Listener) -> None:
        """READY=1 arrives as one datagram at a filesystem socket path."""
        assert notify("READY=1", env={"NOTIFY_SOCKET": fs_listener.address}) is True
        assert fs_listener.receive() == ["READY=1"]

    def test_abstract_socket_receives_watchdog(self, abstract_listener: Listener) -> None:
        """An address starting with @ is reached in the abstract namespace."""
        assert notify("WATCHDOG=1", env={"NOTIFY_SOCKET": abstract_listener.address}) is True
        assert abstract_listener.receive() == ["WATCHDOG=1"]

    def test_several_states_share_one_datagram(self, fs_listener: Listener) -> None:
        """Several states go in one datagram, one per line, in order."""
        env = {"NOTIFY_SOCKET": fs_listener.address}
        assert notify("READY=1", "STATUS=3 tasks: 3 active", env=env)
        assert fs_listener.receive() == ["READY=1", "STATUS=3 tasks: 3 active"]
        assert not fs_listener.pending()

    def test_newline_inside_a_state_cannot_forge_another(self, fs_listener: Listener) -> None:
        """A newline inside a STATUS text is flattened, so it cannot smuggle in READY=1 or MAINPID=."""
        assert notify("STATUS=evil\nMAINPID=1", env={"NOTIFY_SOCKET": fs_listener.address})
        assert fs_listener.receive() == ["STATUS=evil MAINPID=1"]

    def test_reloading_and_stopping(self, fs_listener: Listener) -> None:
        """RELOADING=1 and STOPPING=1 are passed through verbatim."""
        env = {"NOTIFY_SOCKET": fs_listener.address}
        assert notify("RELOADING=1", env=env)
        assert fs_listener.receive() == ["RELOADING=1"]
        assert notify("STOPPING=1", env=env)
        assert fs_listener.receive() == ["STOPPING=1"]

    def test_unset_socket_is_a_no_op(self) -> None:
        """Without $NOTIFY_SOCKET (not under systemd) notify does nothing and says so."""
        assert notify("READY=1", env={}) is False
        assert notify("READY=1", env={"NOTIFY_SOCKET": ""}) is False

    def test_no_listener_returns_false(self, tmp_path: Path) -> None:
        """A socket path nobody listens on makes notify return False instead of raising."""
        assert notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False
        assert notify("READY=1", env={"NOTIFY_SOCKET": "@heartbeat-nobody-" + uuid.uuid4().hex}) is False

    def test_unsupported_address_returns_false(self) -> None:
        """A relative path or another transport (vsock:) is refused without raising."""
        assert notify("READY=1", env={"NOTIFY_SOCKET": "relative.sock"}) is False
        assert notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"}) is False

    def test_oversized_datagram_returns_false(self, fs_listener: Listener) -> None:
        """A datagram too large for the socket fails quietly rather than raising."""
        huge = "STATUS=" + "x" * (8 * 1024 * 1024)
        assert notify(huge, env={"NOTIFY_SOCKET": fs_listener.address}) is False

    def test_nothing_to_send(self, fs_listener: Listener) -> None:
        """Calling notify with no states sends nothing."""
        assert notify(env={"NOTIFY_SOCKET": fs_listener.address}) is False
        assert not fs_listener.pending()

    def test_reads_process_environment_by_default(self, fs_listener: Listener) -> None:
        """A child process with NOTIFY_SOCKET in its real environment reaches the socket."""
        env = {k: v for k, v in os.environ.items() if k not in PLUMBING_ENV}
        env["NOTIFY_SOCKET"] = fs_listener.address
        code = "import sys; from heartbeat.system.systemd import notify; sys.exit(0 if notify('READY=1') else 1)"
        proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
        assert proc.returncode == 0
        assert fs_listener.receive() == ["READY=1"]


class TestWatchdogInterval:
    def test_absent(self) -> None:
        """No WATCHDOG_USEC means no watchdog."""
        assert watchdog_interval(env={}) is None

    def test_seconds_from_microseconds(self) -> None:
        """WATCHDOG_USEC is converted to seconds."""
        assert watchdog_interval(env={"WATCHDOG_USEC": "300000000"}) == 300.0
        assert watchdog_interval(env={"WATCHDOG_USEC": "1500"}) == 0.0015

    def test_pid_matching_us(self) -> None:
        """WATCHDOG_PID naming this process is honoured."""
        env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
        assert watchdog_interval(env=env) == 2.0

    def test_pid_of_another_process(self) -> None:
        """WATCHDOG_PID naming another process means the variables were inherited: no watchdog."""
        env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}
        assert watchdog_interval(env=env) is None

    @pytest.mark.parametrize("usec", ["0", "-5", "abc", "1.5", " "])
    def test_invalid_usec(self, usec: str) -> None:
        """A WATCHDOG_USEC that is not a positive integer disables the watchdog."""
        assert watchdog_interval(env={"WATCHDOG_USEC": usec}) is None

    def test_invalid_pid(self) -> None:
        """A WATCHDOG_PID that is not a number disables the watchdog."""
        assert watchdog_interval(env={"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "me"}) is None


class TestStatusLine:
    def test_counts_in_order_with_running(self) -> None:
        """States appear in a fixed order, zeros are left out, running is shown with active."""
        counts = {"done": 6, "blocked": 2, "active": 4, "running": 3, "failed": 0}
        assert status_line(counts) == "12 tasks: 4 active (3 running), 2 blocked, 6 done"

    def test_every_state(self) -> None:
        """Each known state has its place; unknown keys come last in name order."""
        counts = {"invalid": 1, "done": 1, "failed": 1, "escalated": 1, "paused": 1, "snoozed": 1,
                  "blocked": 1, "active": 1, "zeta": 1, "alpha": 1}
        assert status_line(counts) == (
            "10 tasks: 1 active, 1 blocked, 1 snoozed, 1 paused, 1 escalated, 1 failed, 1 done, 1 invalid, 1 alpha, 1 zeta"
        )

    def test_empty(self) -> None:
        """No tasks at all still says so."""
        assert status_line({}) == "0 tasks"
        assert status_line({"active": 0, "running": 0}) == "0 tasks"

    def test_singular(self) -> None:
        """One task is singular."""
        assert status_line({"active": 1, "running": 1}) == "1 task: 1 active (1 running)"

    def test_running_without_active(self) -> None:
        """Agents alive on tasks that are no longer active are still shown."""
        assert status_line({"done": 2, "running": 1}) == "2 tasks: 1 running, 2 done"


class TestPlumbing:
    def test_names(self) -> None:
        """The plumbing variables are exactly systemd's notify, watchdog and socket-activation ones."""
        assert set(PLUMBING_ENV) == {
            "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
        }

    def test_without_plumbing(self) -> None:
        """without_plumbing drops those variables and keeps everything else."""
        env = {name: "x" for name in PLUMBING_ENV} | {"PATH": "/usr/bin", "HOME": "/var/lib/heartbeat"}
        assert without_plumbing(env) == {"PATH": "/usr/bin", "HOME": "/var/lib/heartbeat"}
