"""The relay attacked from outside: what a hostile or unlucky client, a planted file or a stop can do to it.

Real daemons (``heartbeat run`` in a subprocess), real Unix sockets and real CLI processes,
as in ``tests/system/test_relay.py``; each test here failed on the relay as first built.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import DaemonHarness

from heartbeat.hotpath import relay
from tests.system.test_relay import agent, agent_env, started
from tests.system.test_relay import claimed as claim_new

pytestmark = pytest.mark.slow

STOP_GRACE = 0.5
"""The harness's launcher ``stop_grace``: a SIGTERM'd daemon must be gone within it + 1 s."""


def claimed(h: DaemonHarness, task_id: str) -> dict[str, str]:
    """A new task claimed for this test process; the environment of its agent."""
    return agent_env(h, task_id, claim_new(h, task_id))


def events(h: DaemonHarness, name: str) -> int:
    return sum(1 for e in h.log() if e.get("event") == name)


def sigterm(h: DaemonHarness) -> float:
    """SIGTERM the daemon and wait for it: the seconds it took."""
    assert h.proc is not None
    began = time.monotonic()
    h.proc.send_signal(signal.SIGTERM)
    h.proc.wait(timeout=30)
    return time.monotonic() - began


class TestStopWithClients:
    """SIGTERM ends the daemon within its stop grace + 1 s whatever the relay's clients do."""

    def test_greeted_clients_that_send_nothing_do_not_hold_the_stop(self, short_root: Path) -> None:
        """Clients greeted and silent (every slot taken) are closed on: a prompt, clean stop, socket removed."""
        from heartbeat.model import defaults

        h = started(short_root)
        held: list[socket.socket] = []
        try:
            for _ in range(defaults.RELAY_MAX_CLIENTS):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(10)
                sock.connect(str(h.state / relay.SOCKET_NAME))
                assert sock.recv(64) == relay.GREETING
                held.append(sock)
            took = sigterm(h)
            # (the unfixed daemon waited 2 s for their slots, then the grace for their threads: >= 2.5 s)
            assert events(h, "relay_stopped_busy") == 0 and events(h, "exit_abandoning_threads") == 0
            assert took < STOP_GRACE + 1.5, took
            assert h.proc is not None and h.proc.returncode == 0
            assert not (h.state / relay.SOCKET_NAME).exists()
            for sock in held:
                assert sock.recv(64) == b""  # closed on, unanswered: nothing of theirs was written
        finally:
            for sock in held:
                sock.close()
            h.stop()

    def test_a_write_stuck_on_a_baton_lock_does_not_hold_the_stop_past_the_grace(self, short_root: Path) -> None:
        """A relayed write waiting on a lock another writer holds: the daemon still stops within the grace
        (+1 s), and the agent is told its write may not have been made; nothing is written later."""
        h = started(short_root)
        try:
            env = claimed(h, "k1")
            lock = os.open(h.state / "locks" / "k1.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                writer = subprocess.Popen([sys.executable, "-m", "heartbeat", "set", "k1", "step=stuck"],
                                          stderr=subprocess.PIPE, text=True, env=env)
                assert h.proc is not None
                pid = h.proc.pid
                lock_path = str(h.state / "locks" / "k1.lock")

                def daemon_waits_on_the_lock() -> bool:
                    try:
                        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == lock_path
                                   for fd in os.listdir(f"/proc/{pid}/fd"))
                    except OSError:
                        return False

                h.wait(daemon_waits_on_the_lock, "the relayed write waiting on the baton's lock")
                took = sigterm(h)
                _, err = writer.communicate(timeout=60)
            finally:
                os.close(lock)
            # (the unfixed daemon waited 2 s for the write, then the whole grace again: >= 2.5 s)
            assert took < STOP_GRACE + 1.5, took
            assert writer.returncode == 1 and "answer was lost" in err, err
            assert h.baton("k1").step == "start"
        finally:
            h.stop()


    def test_a_client_greeted_just_before_the_stop_is_still_written_and_answered(self, short_root: Path) -> None:
        """A request that arrives whole after SIGTERM, while the daemon stops (within half a second
        of the greeting), is written and answered 0: a restart does not turn an agent's write into
        'its answer was lost'."""
        h = started(short_root)
        try:
            env = claimed(h, "g1")
            request = relay.encode_request(["set", "g1", "step=during the stop"], env)
            assert request is not None
            path = str(h.state / relay.SOCKET_NAME)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                assert sock.recv(64) == relay.GREETING
                assert h.proc is not None
                h.proc.send_signal(signal.SIGTERM)

                def refused() -> bool:  # the daemon has closed its listening socket: it is stopping
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                        try:
                            probe.connect(path)
                        except OSError:
                            return True
                    return False

                h.wait(refused, "the relay to stop listening", interval=0.001)
                sock.sendall(request)
                answer = sock.recv(64)
            h.proc.wait(timeout=30)
            assert answer == b"0\n"
            assert h.baton("g1").step == "during the stop"
        finally:
            h.stop()


class TestSameErrors:
    """What goes wrong in the daemon's write is told as the agent's own write would tell it."""

    def test_a_store_the_daemon_cannot_open_gives_the_agents_own_error(self, short_root: Path) -> None:
        """A FIFO planted as the ledger's journal: the relayed write fails with the CLI's own line and
        code, not a claim that the daemon took the write and lost the answer."""
        h = started(short_root)
        try:
            env = claimed(h, "j1")
            os.mkfifo(h.state / "ledger.sqlite3-journal", 0o600)
            through = agent(env, "set", "j1", "step=x")
            local = agent({**env, "HEARTBEAT_RELAY": "off"}, "set", "j1", "step=x")
            assert "answer was lost" not in through.stderr, through.stderr
            assert through.returncode != 0
            assert (through.returncode, through.stderr) == (local.returncode, local.stderr)
            assert events(h, "relayed") == 1, "the write went through the daemon"
            assert h.baton("j1").step == "start"
        finally:
            h.stop()


    def test_a_request_longer_than_the_daemon_reads_is_written_by_the_agent(self, short_root: Path) -> None:
        """An agent whose stack limit lets it pass more than MAX_REQUEST bytes of arguments writes by
        itself and gets the CLI's own error (the unfixed client sent it, the daemon dropped it unread
        and the agent was told the daemon took the write and lost the answer)."""
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_STACK)
        big = 64 * 1024 * 1024  # ARG_MAX is a quarter of the stack limit (at most 6 MiB)
        if hard != resource.RLIM_INFINITY and hard < big:
            pytest.skip("the stack's hard limit keeps an agent's arguments under MAX_REQUEST")

        def roomy_stack() -> None:
            resource.setrlimit(resource.RLIMIT_STACK, (big, hard))

        h = started(short_root)
        try:
            env = claimed(h, "b1")
            args = ["add", "b1", "done", *(f"{i:03d}" + "b" * 120_000 for i in range(40))]  # 4.8 MB
            assert sum(len(a) for a in args) > relay.MAX_REQUEST
            runs = [subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True,
                                   env=e, timeout=60, preexec_fn=roomy_stack)
                    for e in (env, {**env, "HEARTBEAT_RELAY": "off"})]
            through, local = runs
            assert "answer was lost" not in through.stderr, through.stderr
            assert (through.returncode, through.stderr) == (local.returncode, local.stderr) and local.returncode == 2
            assert "a baton may be at most" in local.stderr
            assert events(h, "relayed") == 0 and h.baton("b1").done == []
            assert relay.encode_request(args, env) is None
        finally:
            h.stop()


    def test_an_error_line_longer_than_64_kib_arrives_whole(self, short_root: Path) -> None:
        """An error that echoes a 100 kB field name is the CLI's whole line (the unfixed client read
        at most 64 KiB of the answer and printed the line cut)."""
        h = started(short_root)
        try:
            env = claimed(h, "w1")
            args = ["set", "w1", "f" * 100_000 + "=v"]
            through = agent(env, *args)
            local = agent({**env, "HEARTBEAT_RELAY": "off"}, *args)
            assert events(h, "relayed") == 1, "the write went through the daemon"
            assert (through.returncode, through.stderr) == (local.returncode, local.stderr)
            assert through.returncode == 2 and len(through.stderr) > 100_000
        finally:
            h.stop()


    def test_ctrl_c_while_waiting_for_the_answer_is_the_clis_quiet_130(self, short_root: Path) -> None:
        """SIGINT while the agent waits for the daemon's answer: exit 130 and no traceback, as the CLI
        answers Ctrl-C (the unfixed client died of KeyboardInterrupt with a traceback)."""
        import threading

        state = short_root / "state"
        state.mkdir(mode=0o700)
        got: list[bytes] = []
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(state / relay.SOCKET_NAME))
        server.listen(1)
        held: list[socket.socket] = []

        def greet_and_hold() -> None:  # greets, reads the request, never answers
            conn, _ = server.accept()
            held.append(conn)
            conn.sendall(relay.GREETING)
            got.append(conn.recv(65536))

        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        env.update(HEARTBEAT_STATE_DIR=str(state), HEARTBEAT_TASK="i1", HEARTBEAT_EPOCH="1")
        # SIGINT as a terminal gives it: a suite started as a background job (`sh -c 'pytest &'`)
        # passes SIGINT on ignored, and a Python started so never sees the Ctrl-C.
        proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "set", "i1", "step=x"], env=env,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        thread = threading.Thread(target=greet_and_hold, daemon=True)  # (after the fork: no thread in it)
        thread.start()
        try:
            thread.join(timeout=30)
            assert got and b"step=x" in got[0]
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            for conn in held:
                conn.close()
            server.close()
        assert (proc.returncode, err) == (130, "")


class TestAcceptFailure:
    """A daemon out of descriptors does not spin on its relay socket."""

    def test_accept_failing_for_lack_of_descriptors_pauses_instead_of_spinning(self, short_root: Path) -> None:
        """RLIMIT_NOFILE at the daemon's open descriptors + 3 and clients queued: accept() fails with
        EMFILE; the relay logs it once per run of failures and pauses (the unfixed loop retried at once, ~80% of a core),
        the clock ticks on, and an agent writes by itself."""
        import resource

        import psutil

        h = started(short_root)
        queued: list[socket.socket] = []
        try:
            env = claimed(h, "m1")
            assert h.proc is not None
            pid = h.proc.pid
            limit = len(os.listdir(f"/proc/{pid}/fd")) + 3
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
            for _ in range(6):  # more than the descriptors left: some stay queued, unaccepted
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(5)
                sock.connect(str(h.state / relay.SOCKET_NAME))
                queued.append(sock)
            h.wait_log(lambda e: e.get("event") == "relay_accept_failed", "the relay_accept_failed line")
            daemon = psutil.Process(pid)
            cpu = sum(daemon.cpu_times()[:2])
            ticks = events(h, "tick")
            h.wait(lambda: events(h, "tick") >= ticks + 5, "five more ticks")
            spent = sum(daemon.cpu_times()[:2]) - cpu
            assert spent < 0.5, f"the daemon spent {spent:.2f} s of CPU in about a second of five ticks"
            # One line per run of failures: a run ends only when a queued client is accepted (a descriptor
            # the daemon's tick closed), so there are at most as many lines as clients queued.
            assert 1 <= events(h, "relay_accept_failed") <= len(queued)
            r = agent(env, "set", "m1", "step=by myself")
            assert r.returncode == 0, r.stderr
            assert h.baton("m1").step == "by myself"
        finally:
            for sock in queued:
                sock.close()
            h.stop()

    def test_a_thread_that_cannot_start_leaves_the_relay_serving(self, short_root: Path) -> None:
        """No memory for a client's thread (RLIMIT_AS): that client is closed on and writes by itself,
        one line is logged, and once memory is back the relay serves again (the unfixed accept thread
        died of the RuntimeError: every later agent waited 2 s for a greeting that never came)."""
        import resource

        import psutil

        h = started(short_root)
        try:
            env = claimed(h, "t1")
            assert h.proc is not None
            pid = h.proc.pid
            size = psutil.Process(pid).memory_info().vms
            resource.prlimit(pid, resource.RLIMIT_AS, (size + 2 * 1024 * 1024, resource.RLIM_INFINITY))
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(10)
                    sock.connect(str(h.state / relay.SOCKET_NAME))
                    assert sock.recv(64) == b""  # closed on, ungreeted: its client writes by itself
            finally:
                resource.prlimit(pid, resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            r = agent(env, "set", "t1", "step=relayed again")
            assert r.returncode == 0, r.stderr
            assert events(h, "relayed") == 1, "the relay serves again"
            assert h.baton("t1").step == "relayed again"
            assert events(h, "relay_accept_failed") == 1
        finally:
            h.stop()


class TestHostileClients:
    """Many hostile clients: the clock ticks on, and the daemon keeps no descriptor or thread of theirs."""

    def test_hostile_clients_leave_no_descriptor_or_thread_and_the_clock_ticks(self, short_root: Path) -> None:
        """Silent, vanishing, non-UTF-8, cut-short, no-number, oversized and valid clients, 40 of each:
        ticks go on meanwhile, and the daemon's open descriptors and threads come back to what they were."""
        h = started(short_root)
        try:
            env = claimed(h, "h1")
            assert h.proc is not None
            pid = h.proc.pid
            path = str(h.state / relay.SOCKET_NAME)
            assert agent(env, "set", "h1", "step=warm").returncode == 0  # the relay's modules loaded

            def sockets() -> int:
                """The daemon's open sockets: each relay client holds one until its thread ends."""
                found = 0
                for name in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        found += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
                return found

            def threads() -> int:
                return len(os.listdir(f"/proc/{pid}/task"))

            base_sockets, base_threads = sockets(), threads()
            ticks = events(h, "tick")
            hostile = [b"", b"5\n\xff\xfe\0ab", b"100\nabc", b"x" * 40, b"%d\n" % (relay.MAX_REQUEST + 1)]
            for i in range(40):  # (distinct items: `add ID done X` appends no duplicate)
                valid = relay.encode_request(["add", "h1", "done", f"item {i}"], env)
                assert valid is not None
                for payload in [None, *hostile, valid]:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                        sock.settimeout(10)
                        sock.connect(path)
                        if payload is None:
                            continue  # gone before its greeting
                        assert sock.recv(64) == relay.GREETING
                        try:
                            if payload:
                                sock.sendall(payload)
                            sock.shutdown(socket.SHUT_WR)
                            while sock.recv(4096):
                                pass
                        except ConnectionResetError:
                            pass  # dropped with bytes of ours unread
            assert h.baton("h1").done == [f"item {i}" for i in range(40)]
            # Sockets exactly (a client thread left behind holds its connection); threads with room
            # for the scheduler's pool, which starts workers lazily (up to 10) when ticks overlap
            # on a loaded machine (CI once saw the count stay above a baseline taken too early).
            h.wait(lambda: sockets() <= base_sockets and threads() <= base_threads + 10,
                   f"sockets back to {base_sockets} and threads to at most {base_threads} + 10 "
                   f"(now {sockets()} and {threads()})")
            assert events(h, "tick") > ticks
            assert events(h, "relay_failed") == 0
        finally:
            h.stop()
