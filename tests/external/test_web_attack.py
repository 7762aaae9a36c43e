"""Attacks on the status page from outside the daemon's user: another local user, a DNS-rebinding
page in the operator's browser, a flood of idle connections (issue 17, items 1-3).

Another user is real: as root (CI), ``curl`` runs as ``nobody`` (uid 65534); elsewhere those tests
skip, saying why. The flood is real too: 400 idle loopback connections against a daemon whose
descriptor limit was lowered with ``prlimit``, bounded in number and time.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat.model import defaults
from heartbeat.web.metrics import Vitals
from tests.conftest import clean_env
from tests.support.daemon_harness import DaemonHarness
from tests.support.web_scenario import chromium

pytestmark = pytest.mark.slow

TOKEN = "attack-token"
SECRET = "SECRET_API_KEY=hunter2-do-not-leak"
"""In the task's constraints: on its page, in its baton and in its brief."""

NOBODY = 65534

HTTP = f"""
[http]
listen = "127.0.0.1:0"
token = "{TOKEN}"
allowed_hosts = ["status.example.org"]
"""


def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user (nobody); CI runs the suite as root")


def curl_path() -> str:
    path = shutil.which("curl")
    if path is None:
        raise AssertionError("curl is not installed: scripts/test installs it (apt-get install -y curl)")
    return path


def curl(*args: str, user: int | None = None) -> tuple[int, int, str]:
    """``curl ARGS`` (as ``user`` when given): its exit status, the HTTP status (0 if none) and the body."""
    proc = subprocess.run([curl_path(), "-sS", "--max-time", "20", "-w", "\n%{http_code}", *args],
                          capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"},
                          **({"user": user, "group": user, "extra_groups": []} if user is not None else {}))
    body, _, code = proc.stdout.rpartition("\n")
    return proc.returncode, int(code or 0), body + proc.stderr


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonHarness, str]]:
    """A daemon serving [http] on loopback with a token, and a task whose page holds :data:`SECRET`."""
    h = DaemonHarness(tmp_path_factory.mktemp("attack"), extra=HTTP)
    try:
        h.new("secret", "--blocked-on", "a human", "--gate", "human", "--constraint", SECRET)
        h.start()
        served = h.wait_log(lambda e: e.get("event") == "http_serving", "the daemon's [http] server")
        yield h, str(served["url"])
    finally:
        h.close()


def start_web(h: DaemonHarness, listen: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``heartbeat web --listen LISTEN``; the process and its first line on stderr (the ready line or the refusal)."""
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(h.config), "web", "--listen", listen],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**clean_env(), **(env or {})})
    assert proc.stderr is not None
    return proc, proc.stderr.readline()


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


class TestAnotherLocalUser:
    def test_loopback_without_a_token_serves_nobody(self, daemon: tuple[DaemonHarness, str]) -> None:
        """The README's `heartbeat web --listen 127.0.0.1:PORT` without a token is refused with one line,
        so `nobody` has nothing to connect to. On c684e38 it served, and `runuser -u nobody -- curl`
        read the task's baton and brief, secret included (issue 17, item 1)."""
        _root_only()
        h, _ = daemon
        proc, line = start_web(h, "127.0.0.1:0")
        try:
            served = re.search(r"at (http://\S+/) ", line)
            if served:  # c684e38: show what nobody reads, then fail on it
                _, code, body = curl(served.group(1) + "tasks/secret", user=NOBODY)
                assert code != 200 and SECRET not in body, f"nobody read the page: HTTP {code}"
            assert proc.wait(timeout=30) == 2
            assert "without a token" in line and "unix:PATH" in line
        finally:
            stop(proc)

    def test_nobody_needs_the_token(self, daemon: tuple[DaemonHarness, str]) -> None:
        """Against the daemon's page (token set), `nobody` gets 401 without the token or with a wrong
        one, and nothing of the task; with the token the same client is served (so the 401 is the
        token's doing, not a connection nobody cannot make)."""
        _root_only()
        _, url = daemon
        for extra in ([], ["-H", "Authorization: Bearer wrong"]):
            _, code, body = curl(*extra, url + "tasks/secret", user=NOBODY)
            assert code == 401 and SECRET not in body, extra
        _, code, body = curl(url + f"tasks/secret?token={TOKEN}", user=NOBODY)
        assert code == 200 and SECRET in body

    def test_a_unix_socket_serves_its_owner_only(self, daemon: tuple[DaemonHarness, str]) -> None:
        """`--listen unix:PATH` needs no token: the socket is created 0600 (whatever the umask), so its
        owner is served and `nobody` cannot even connect, though the directory lets it reach the
        path; the socket file is removed when the server stops."""
        _root_only()
        h, _ = daemon
        with tempfile.TemporaryDirectory(prefix="hb-sock-") as where:
            os.chmod(where, 0o755)  # reachable by anyone: only the socket's own mode keeps nobody out
            path = os.path.join(where, "web.sock")
            old_umask = os.umask(0)
            try:
                proc, line = start_web(h, f"unix:{path}")
            finally:
                os.umask(old_umask)
            try:
                assert f"at unix:{path} " in line, line
                assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
                _, code, body = curl("--unix-socket", path, "http://localhost/tasks/secret")
                assert code == 200 and SECRET in body
                status, code, body = curl("--unix-socket", path, "http://localhost/tasks/secret", user=NOBODY)
                assert status == 7 and code == 0 and SECRET not in body  # 7: could not connect
                assert "Permission denied" in body or "Couldn't connect" in body or "Could not connect" in body
            finally:
                stop(proc)
            assert not os.path.exists(path)

    def test_the_daemon_serves_a_socket_in_the_state_dir(self, tmp_path: Path) -> None:
        """`[http] listen = "unix:web.sock"` without a token: the daemon serves <state_dir>/web.sock (0600)."""
        h = DaemonHarness(tmp_path, extra='[http]\nlisten = "unix:web.sock"\n')
        try:
            h.new("t", "--blocked-on", "a human", "--gate", "human", "--constraint", SECRET)
            h.start()
            served = h.wait_log(lambda e: e.get("event") == "http_serving", "the daemon's [http] server")
            path = str(h.state / "web.sock")
            assert served["url"] == f"unix:{path}" and served["token"] is False
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
            _, code, body = curl("--unix-socket", path, "http://localhost/tasks/t")
            assert code == 200 and SECRET in body
        finally:
            h.close()


class TestDnsRebinding:
    def test_a_foreign_host_is_refused(self, daemon: tuple[DaemonHarness, str]) -> None:
        """With the right token, a request naming another host (a DNS-rebinding page's own name) is
        421 and shows nothing; the listen address, localhost and a configured name are served. On
        c684e38 `Host: attacker.example` was answered 200 (issue 17, item 2)."""
        _, url = daemon
        port = url.rsplit(":", 1)[1].strip("/")
        page = url + f"tasks/secret?token={TOKEN}"
        for host in ("attacker.example", f"attacker.example:{port}", f"127.0.0.1.nip.io:{port}"):
            code, body = get(page, {"Host": host})
            assert code == 421 and SECRET not in body, host
            assert "allowed_hosts" in body
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "status.example.org"):
            code, body = get(page, {"Host": host})
            assert code == 200 and SECRET in body, host

    def test_a_rebound_name_in_chromium_reads_nothing(self, daemon: tuple[DaemonHarness, str]) -> None:
        """Chromium resolving attacker.example to 127.0.0.1 (what a rebinding DNS server does) and
        loading the page under that name gets the refusal, not the task, even carrying the token."""
        _, url = daemon
        port = url.rsplit(":", 1)[1].strip("/")
        dom = chromium(f"http://attacker.example:{port}/tasks/secret?token={TOKEN}",
                       flags=("--host-resolver-rules=MAP attacker.example 127.0.0.1",))
        assert "is not served here" in dom and SECRET not in dom
        dom = chromium(f"http://localhost:{port}/tasks/secret?token={TOKEN}")
        assert SECRET in dom


FLOOD = 400
"""Idle connections opened at once: far more than the daemon's lowered descriptor limit."""

FLOOD_HOLD = 6.0
"""Seconds the flood holds its connections (less than WEB_REQUEST_TIMEOUT: the cap alone must hold)."""


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class TestConnectionFlood:
    def test_idle_connections_cannot_starve_the_clock(self, tmp_path: Path) -> None:
        """400 idle loopback connections against a daemon with a lowered RLIMIT_NOFILE: its descriptors
        stay bounded, it keeps ticking, its log stays small, and a task created during the flood is
        dispatched. On c684e38 the server accepted until EMFILE, asyncio logged "socket.accept() out of
        system resource" thousands of times a second, every tick failed to write its vitals, and the
        new task was latched invalid and never dispatched (issue 17, item 3)."""
        h = DaemonHarness(tmp_path, extra=HTTP)
        held: list[socket.socket] = []
        try:
            h.start()
            served = h.wait_log(lambda e: e.get("event") == "http_serving", "the daemon's [http] server")
            h.wait_log(lambda e: e.get("event") == "tick", "the first tick (the daemon fully started)")
            assert h.proc is not None
            pid = h.proc.pid
            port = int(str(served["url"]).rsplit(":", 1)[1].strip("/"))
            base = _fds(pid)
            bound = defaults.WEB_MAX_CONNECTIONS + 3 * defaults.WEB_BACKLOG  # the cap, and accepts not yet closed
            limit = base + bound + 32
            assert 2 * limit < FLOOD
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
            log_before = h.log_path.stat().st_size
            refused = 0
            started_wall = time.time()
            for _ in range(FLOOD):
                try:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                except OSError:
                    refused += 1  # the kernel's queue is full: the flood is bounded by it, not by the daemon
            h.new("during", plan=1)
            most = base
            deadline = time.monotonic() + FLOOD_HOLD
            while time.monotonic() < deadline:
                most = max(most, _fds(pid))
                time.sleep(0.05)
            vitals = Vitals.load(str(h.state))
            ticked_during = vitals is not None and vitals.last_tick_at is not None \
                and vitals.last_tick_at > started_wall + 1
            for sock in held:
                sock.close()
            held.clear()
            h.wait(lambda: h.events("during", "dispatched"), "the task created during the flood dispatched")
            assert ticked_during, "no tick wrote its vitals during the flood"
            assert most <= base + bound + 16, (most, base)
            assert not h.events("during", "invalid")
            grown = h.log_path.stat().st_size - log_before
            text = h.log_path.read_bytes()[log_before:].decode(errors="replace")
            assert text.count("out of system resource") <= 2 and "Too many open files" not in text
            assert grown < 1_000_000, f"the log grew {grown} bytes during the flood"
            assert refused < FLOOD
        finally:
            for sock in held:
                sock.close()
            h.close()

    def test_a_silent_or_trickling_client_is_closed(self, daemon: tuple[DaemonHarness, str]) -> None:
        """A connection that sends nothing, and one that sends half a request, are closed by the server
        after WEB_REQUEST_TIMEOUT (uvicorn's keep-alive timer starts only after a response: on c684e38
        both stayed open for as long as the client liked)."""
        _, url = daemon
        port = int(url.rsplit(":", 1)[1].strip("/"))
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        trickling = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            trickling.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
            deadline = time.monotonic() + defaults.WEB_REQUEST_TIMEOUT + 15
            for sock in (silent, trickling):
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    assert sock.recv(1024) == b""  # closed by the server, nothing sent
                except ConnectionResetError:
                    pass  # closed with a reset: as good
        finally:
            silent.close()
            trickling.close()

    def test_a_repeated_loop_error_is_logged_once_per_period(self) -> None:
        """The web server's event loop reports each kind of error at most once per WEB_ERROR_LOG_EVERY, then
        says how many it left out: asyncio retries a failing accept() thousands of times a second (on
        c684e38: 225,092 lines, 118 MB in 40 s)."""
        from heartbeat.web.server import _RateLimited

        lines: list[tuple[str, int]] = []
        limited = _RateLimited(lambda message, left_out: lines.append((message, left_out)), every=3600)
        emfile = OSError(24, "Too many open files")
        for _ in range(10_000):
            limited(None, {"message": "socket.accept() out of system resource", "exception": emfile})
        limited(None, {"message": "something else"})
        assert lines == [("socket.accept() out of system resource: [Errno 24] Too many open files", 0),
                         ("something else", 0)]
        limited.every = 0.0
        limited(None, {"message": "socket.accept() out of system resource", "exception": emfile})
        assert lines[-1] == ("socket.accept() out of system resource: [Errno 24] Too many open files", 9_999)
