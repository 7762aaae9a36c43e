"""The relay (heartbeat.hotpath.relay): an agent's set/add written by the running daemon, never twice, never hung.

Real daemons (``heartbeat run`` in a subprocess), real Unix sockets and real CLI processes.
State dirs live under a short /tmp path: a Unix socket's path may be at most 107 bytes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonHarness

from heartbeat.cli import parser
from heartbeat.hotpath import relay
from heartbeat.launchers.liveness import identify, this_host
from heartbeat.model.baton import Owner
from heartbeat.model.timeparse import utcnow
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def greeted(h: DaemonHarness) -> Iterator[socket.socket]:
    """A raw connection to the daemon's relay, its greeting read."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(h.state / relay.SOCKET_NAME))
        assert sock.recv(64) == relay.GREETING
        yield sock


def agent_env(h: DaemonHarness, task_id: str, epoch: str, **extra: str) -> dict[str, str]:
    return {**h.env(), "HEARTBEAT_STATE_DIR": str(h.state), "HEARTBEAT_TASK": task_id, "HEARTBEAT_EPOCH": epoch,
            **extra}


def agent(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The agent's own call: ``heartbeat ARGS...`` with no option, as an agent types it."""
    return subprocess.run([sys.executable, "-m", "heartbeat", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def relayed(h: DaemonHarness) -> int:
    return sum(1 for e in h.log() if e.get("event") == "relayed")


def claimed(h: DaemonHarness, task_id: str) -> str:
    """A new task claimed for this test process (alive: the daemon dispatches nothing); its epoch."""
    r = h.cli("new", task_id, "--task", "t", "--step", "start", "--workdir", str(h.root), "--claim",
              "--pid", str(os.getpid()))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def started(short_root: Path) -> DaemonHarness:
    # (stall_after 1h: the test process claims the tasks, and a stalled claimant is stopped with SIGTERM)
    h = DaemonHarness(short_root, tick="200ms", stall_after="1h")
    h.start()
    h.wait(lambda: (h.state / relay.SOCKET_NAME).exists(), "the relay socket")
    return h


class TestRelayed:
    """With a daemon running, an agent's set and add are written by it, exactly as the CLI writes them."""

    def test_set_and_add_are_written_by_the_daemon(self, short_root: Path) -> None:
        """The baton and the ledger show the writes, by the agent, and the daemon's log shows it relayed them."""
        h = started(short_root)
        try:
            env = agent_env(h, "r1", claimed(h, "r1"))
            assert agent(env, "set", "r1", "step=relayed step", "next_step=then").returncode == 0
            r = agent(env, "add", "r1", "done", "one", "two")
            assert r.returncode == 0 and r.stderr == ""
            baton = h.baton("r1")
            assert (baton.step, baton.next_step, baton.done) == ("relayed step", "then", ["one", "two"])
            kinds = [(e.kind, e.actor) for e in h.events("r1")][-2:]
            assert kinds == [("updated", "agent"), ("updated", "agent")], kinds
            assert relayed(h) == 2
            # The daemon's write armed the agent's pulse, as the agent's own would: a touch writes no baton.
            revision = h.baton("r1").meta.revision
            assert agent(env, "touch", "r1").returncode == 0
            assert h.baton("r1").meta.revision == revision
            assert (h.state / "logs" / "r1" / f"{env['HEARTBEAT_EPOCH']}.pulse").is_file()
        finally:
            h.stop()

    @pytest.mark.parametrize("case", ["unknown field", "superseded", "ahead", "no such task", "blocked_on",
                                      "not a list", "bad epoch"])
    def test_errors_match_the_cli_in_the_agents_own_process(self, short_root: Path, case: str) -> None:
        """Each refusal gives the same exit code and the same one line, relayed or written by the agent itself."""
        h = started(short_root)
        try:
            epoch = claimed(h, "e1")
            env = agent_env(h, "e1", epoch)
            args = ["set", "e1", "step=x"]
            if case == "unknown field":
                args = ["set", "e1", "bogus=1"]
            elif case == "superseded":
                assert h.cli("claim", "e1", "--force", "--pid", str(os.getpid())).returncode == 0
            elif case == "ahead":
                env["HEARTBEAT_EPOCH"] = str(int(epoch) + 5)
            elif case == "no such task":
                args, env["HEARTBEAT_TASK"] = ["set", "nope", "step=x"], "nope"
            elif case == "blocked_on":
                args = ["set", "e1", "blocked_on=someone"]
            elif case == "not a list":
                args = ["add", "e1", "step", "x"]
            elif case == "bad epoch":
                env["HEARTBEAT_EPOCH"] = "x1"
            before = relayed(h)
            through = agent(env, *args)
            assert relayed(h) == before + 1, "the write went through the daemon"
            local = agent({**env, "HEARTBEAT_RELAY": "off"}, *args)
            assert relayed(h) == before + 1
            assert through.returncode != 0
            assert (through.returncode, through.stderr) == (local.returncode, local.stderr)
            assert through.stderr.count("\n") == 1 and through.stderr.startswith("heartbeat: ")
        finally:
            h.stop()

    def test_an_agent_with_options_or_a_store_url_writes_by_itself(self, short_root: Path) -> None:
        """Only the hot shapes are relayed: an option, a store URL or HEARTBEAT_RELAY=off keep the write local."""
        h = started(short_root)
        try:
            epoch = claimed(h, "o1")
            env = agent_env(h, "o1", epoch)
            assert agent(env, "set", "o1", "step=a", "--epoch", epoch).returncode == 0
            assert agent({**env, "HEARTBEAT_RELAY": "off"}, "set", "o1", "step=b").returncode == 0
            assert relayed(h) == 0
            assert h.baton("o1").step == "b"
        finally:
            h.stop()

    def test_the_relayed_writes_are_counted_for_prometheus(self, short_root: Path) -> None:
        """heartbeat_relayed_writes_total{result} counts them, read with prometheus_client's parser."""
        from prometheus_client.parser import text_string_to_metric_families

        h = started(short_root)
        try:
            env = agent_env(h, "m1", claimed(h, "m1"))
            assert agent(env, "set", "m1", "step=a").returncode == 0
            assert agent(env, "add", "m1", "done", "a").returncode == 0
            assert agent(env, "set", "m1", "bogus=1").returncode == 2

            def counted() -> dict[str, float]:
                r = h.cli("metrics")
                assert r.returncode == 0, r.stderr
                return {s.labels["result"]: s.value for f in text_string_to_metric_families(r.stdout)
                        for s in f.samples if s.name == "heartbeat_relayed_writes_total"}

            # (the vitals file is rewritten after each pass)
            h.wait(lambda: counted() == {"written": 2.0, "refused": 1.0}, "the counts in the metrics")
        finally:
            h.stop()

    def test_the_daemon_removes_its_socket_when_it_stops(self, short_root: Path) -> None:
        """A clean stop leaves no socket behind; the next agent's write is its own."""
        h = started(short_root)
        env = agent_env(h, "s1", claimed(h, "s1"))
        assert h.stop() == 0
        assert not (h.state / relay.SOCKET_NAME).exists()
        assert agent(env, "set", "s1", "step=after").returncode == 0
        assert h.baton("s1").step == "after"


def ago(text: str) -> str:
    """``text`` with its ages ("2s ago") made alike: the two calls run a second apart. The brief's
    ``"tokens"`` count follows the age's length ("9s ago", "10s ago"), so it is made alike too."""
    import re

    return re.sub(r'"tokens": [0-9]+', '"tokens": N', re.sub(r"[0-9][0-9a-z. ]* ago", "N ago", text))


class TestRelayedReads:
    """Issue 25 item 6: an agent's `show` and `brief` are answered by the daemon, byte for byte as the CLI."""

    def test_show_and_brief_match_the_cli_and_are_relayed(self, short_root: Path) -> None:
        """`show`, `show --json`, `brief`, `brief --json` print the same bytes relayed and with the relay
        off (warnings too), the daemon's log shows it answered each, and an unknown task's error is the
        CLI's own (fails on 4c852cf: no `relayed` line for any read on the file store)."""
        from heartbeat.hotpath import trail

        h = started(short_root)
        try:
            env = agent_env(h, "r1", claimed(h, "r1"))
            assert agent(env, "add", "r1", "done", "one").returncode == 0
            trail.record_start(str(h.state / "logs" / "r1" / f"{env['HEARTBEAT_EPOCH']}.trail"),
                               {"tool_name": "Bash", "tool_input": {"command": "pay --invoice 7"}, "tool_use_id": "x"})
            before = relayed(h)
            for args in (["show", "r1"], ["show", "r1", "--json"], ["brief", "r1"], ["brief", "r1", "--json"]):
                got = agent(env, *args)
                own = agent({**env, "HEARTBEAT_RELAY": "off"}, *args)
                assert (got.returncode, ago(got.stdout), got.stderr) == (own.returncode, ago(own.stdout), own.stderr)
                assert got.returncode == 0 and "pay --invoice 7" in got.stdout
            assert h.wait(lambda: relayed(h) - before == 4, "four relayed reads")
            missing = agent(env, "show", "nope")
            own = agent({**env, "HEARTBEAT_RELAY": "off"}, "show", "nope")
            assert (missing.returncode, missing.stderr) == (own.returncode, own.stderr) and missing.returncode != 0
        finally:
            h.stop()


class TestNeverTwiceNeverHung:
    """Whatever the socket or the daemon does, a write lands exactly once or says it may have."""

    def test_a_killed_daemons_socket_sends_the_write_to_the_agent(self, short_root: Path) -> None:
        """SIGKILL leaves the socket file: the agent's connect is refused and it writes by itself."""
        h = started(short_root)
        env = agent_env(h, "k1", claimed(h, "k1"))
        h.kill()
        assert (h.state / relay.SOCKET_NAME).exists()
        r = agent(env, "set", "k1", "step=alone")
        assert r.returncode == 0, r.stderr
        assert h.baton("k1").step == "alone"
        h.start()  # and the next daemon replaces the dead one's socket
        try:
            h.wait(lambda: sum(1 for e in h.log() if e.get("event") == "relay_serving") == 2, "the new relay")
            before = relayed(h)
            assert agent(env, "set", "k1", "step=relayed again").returncode == 0
            assert relayed(h) == before + 1
        finally:
            h.stop()

    def test_a_stopped_daemon_is_not_waited_for_and_writes_nothing_later(self, short_root: Path) -> None:
        """SIGSTOP: no greeting comes, so the agent writes by itself; resumed, the daemon writes nothing more."""
        h = started(short_root)
        try:
            env = agent_env(h, "p1", claimed(h, "p1"))
            assert h.proc is not None
            os.kill(h.proc.pid, signal.SIGSTOP)
            try:
                r = agent(env, "add", "p1", "done", "once")
            finally:
                os.kill(h.proc.pid, signal.SIGCONT)
            assert r.returncode == 0, r.stderr
            # The resumed daemon greets the client that gave up, reads nothing and writes nothing.
            h.wait(lambda: any(e.get("event") == "tick" for e in h.log()[-5:]), "ticks after SIGCONT")
            assert agent(env, "set", "p1", "step=later").returncode == 0  # relayed: the daemon serves again
            assert h.baton("p1").done == ["once"]
            assert [e.data.get("fields") for e in h.events("p1", "updated")].count(["done"]) <= 1
            assert len(h.events("p1", "updated")) == 2
        finally:
            h.stop()

    def test_a_lost_answer_is_an_error_never_a_second_write(self, short_root: Path) -> None:
        """A daemon that greets, reads the request and closes without answering: exit 1, one line, no local write."""
        state = short_root / "state"
        store = FileStore(str(state))
        tasks.new_task(store, "l1", task="t", step="before", workdir=str(short_root))
        epoch = tasks.claim(store, "l1", _owner()).meta.epoch
        got: list[bytes] = []
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(state / relay.SOCKET_NAME))
        server.listen(1)

        def greet_and_vanish() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(relay.GREETING)
                got.append(conn.recv(65536))

        thread = threading.Thread(target=greet_and_vanish, daemon=True)
        thread.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        env.update(HEARTBEAT_STATE_DIR=str(state), HEARTBEAT_TASK="l1", HEARTBEAT_EPOCH=str(epoch))
        r = agent(env, "add", "l1", "done", "maybe")
        thread.join(timeout=10)
        server.close()
        assert got and b"maybe" in got[0]
        assert r.returncode == 1
        assert r.stderr.count("\n") == 1 and "answer was lost" in r.stderr and "heartbeat show l1" in r.stderr
        assert store.load("l1").done == []

    def test_a_request_cut_short_is_not_written(self, short_root: Path) -> None:
        """A client that dies mid-request: the daemon writes nothing and goes on serving."""
        h = started(short_root)
        try:
            env = agent_env(h, "c1", claimed(h, "c1"))
            request = relay.encode_request(["set", "c1", "step=half"], env)
            assert request is not None
            with greeted(h) as sock:
                sock.sendall(request[:-3])
            with greeted(h) as sock:  # and a header that is no number
                sock.sendall(b"x" * 100)
            assert agent(env, "set", "c1", "step=whole").returncode == 0
            assert relayed(h) == 1
            assert [e.data.get("step") for e in h.events("c1", "updated")] == ["whole"]
            assert h.baton("c1").step == "whole"
            assert h.proc is not None and h.proc.poll() is None
        finally:
            h.stop()

    def test_a_saturated_relay_sends_the_write_to_the_agent(self, short_root: Path) -> None:
        """Every slot held by a silent client: the next agent is closed on at once and writes by itself."""
        from heartbeat.model import defaults

        h = started(short_root)
        held: list[socket.socket] = []
        stack = contextlib.ExitStack()
        try:
            env = agent_env(h, "n1", claimed(h, "n1"))
            for _ in range(defaults.RELAY_MAX_CLIENTS):
                held.append(stack.enter_context(greeted(h)))
            r = agent(env, "set", "n1", "step=by myself")
            assert r.returncode == 0, r.stderr
            assert h.baton("n1").step == "by myself" and relayed(h) == 0
        finally:
            stack.close()
            h.stop()

    def test_a_dribbling_client_is_dropped_at_the_deadline(self, short_root: Path) -> None:
        """A request sent a byte a second is dropped unwritten when its 5 s are up, and the slot comes back."""
        h = started(short_root)
        try:
            env = agent_env(h, "d1", claimed(h, "d1"))
            request = relay.encode_request(["set", "d1", "step=slow"], env)
            assert request is not None
            with greeted(h) as sock:
                for byte in request[:12]:
                    try:
                        sock.sendall(bytes([byte]))
                    except OSError:
                        break  # dropped
                    if any(e.get("event") == "relay_dropped" for e in h.log()):
                        break
                    threading.Event().wait(0.7)
                h.wait_log(lambda e: e.get("event") == "relay_dropped", "the dribbler dropped", timeout=15)
            assert h.baton("d1").step == "start"
            assert agent(env, "set", "d1", "step=fast").returncode == 0
            assert relayed(h) == 1 and h.baton("d1").step == "fast"
        finally:
            h.stop()

    def test_a_fifo_at_the_sockets_path_turns_the_relay_off_in_one_line(self, short_root: Path) -> None:
        """A planted FIFO is neither opened nor removed; the daemon runs, agents write by themselves."""
        h = DaemonHarness(short_root, tick="200ms", stall_after="1h")
        os.mkfifo(h.state / relay.SOCKET_NAME, 0o600)
        h.start()
        try:
            h.wait_log(lambda e: e.get("event") == "relay_off", "the relay_off line")
            env = agent_env(h, "f1", claimed(h, "f1"))
            r = agent(env, "set", "f1", "step=mine", timeout=30)
            assert r.returncode == 0, r.stderr
            assert h.baton("f1").step == "mine"
            assert (h.state / relay.SOCKET_NAME).is_fifo()
            h.wait(lambda: sum(1 for e in h.log() if e.get("event") == "tick") >= 3, "ticks")
        finally:
            h.stop()

    def test_a_socket_of_another_user_is_not_talked_to(self, short_root: Path) -> None:
        """The client connects only to a socket its own uid owns (root chowns a listening one away)."""
        if os.geteuid() != 0:
            pytest.skip("giving a socket to another user needs root")
        state = short_root / "state"
        store = FileStore(str(state))
        tasks.new_task(store, "u1", task="t", step="before", workdir=str(short_root))
        epoch = tasks.claim(store, "u1", _owner()).meta.epoch
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(state / relay.SOCKET_NAME))
        server.listen(1)
        server.settimeout(0.5)
        os.chown(state / relay.SOCKET_NAME, 65534, 65534)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        env.update(HEARTBEAT_STATE_DIR=str(state), HEARTBEAT_TASK="u1", HEARTBEAT_EPOCH=str(epoch))
        try:
            r = agent(env, "set", "u1", "step=mine")
            assert r.returncode == 0, r.stderr
            with pytest.raises(TimeoutError):
                server.accept()  # nobody connected
        finally:
            server.close()
        assert store.load("u1").step == "mine"

    def test_another_users_connection_is_refused(self, short_root: Path) -> None:
        """A peer of another uid (SO_PEERCRED) gets no greeting, and the daemon logs one line."""
        if os.geteuid() != 0:
            pytest.skip("connecting as another user needs root")
        h = started(short_root)
        try:
            path = h.state / relay.SOCKET_NAME
            for walk in (short_root, h.state):
                walk.chmod(0o711)
            path.chmod(0o666)
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: nobody, connecting (a fork: no interpreter that nobody may execute is needed)
                try:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                        sock.settimeout(10)
                        sock.connect(str(path))
                        os.write(write_end, b"got:" + sock.recv(64))
                except OSError as exc:
                    os.write(write_end, repr(exc).encode())
                finally:
                    os._exit(0)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as pipe:
                heard = pipe.read()
            os.waitpid(pid, 0)
            for walk in (short_root, h.state):
                walk.chmod(0o700)
            assert heard == b"got:", heard  # connected (as nobody), and not greeted
            h.wait_log(lambda e: e.get("event") == "relay_refused" and e.get("uid") == 65534, "relay_refused")
        finally:
            for walk in (short_root, h.state):
                walk.chmod(0o700)
            h.stop()


class TestClient:
    """The client's pieces, without a daemon."""

    @pytest.mark.parametrize("argv", [
        ["set", "t", "step=a"], ["set", "t", "step=a=b", "intent=", "next_step=x y"], ["add", "t", "done", "one"],
        ["add", "t", "constraints", "a", "b", "c"], ["set", "t", ""], ["add", "t", "done", ""], ["touch", "t"],
        ["set", "t"], ["add", "t", "done"], ["show", "t"], ["set", "t", "-x=1"], ["set", "t", "s=1", "--epoch", "1"],
    ])
    def test_relayable_is_exactly_the_clis_hot_set_and_add(self, argv: list[str]) -> None:
        """What the client relays is what the CLI's argparse-free path reads as set or add."""
        hot = parser._hot_args(argv)
        assert relay.relayable(argv) == (hot is not None and hot.command in ("set", "add"))

    def test_a_request_round_trips(self) -> None:
        """Arguments with spaces, '=' and non-ASCII text arrive as sent, with the three variables."""
        argv = ["add", "t1", "decisions", "kept the retry: ünïcode = fine", ""]
        env = {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "7", "HEARTBEAT_STATE_DIR": "/x"}
        data = relay.encode_request(argv, env)
        assert data is not None
        head, _, body = data.partition(b"\n")
        assert int(head) == len(body)
        assert relay.decode_request(body) == (argv, {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "7"})

    def test_the_longest_request_holds_the_largest_baton(self) -> None:
        """MAX_REQUEST is above a baton's limit: no request that could make a valid baton is kept from the daemon."""
        from heartbeat.model import defaults

        assert defaults.MAX_BATON_BYTES < relay.MAX_REQUEST <= 2 * defaults.MAX_BATON_BYTES

    def test_an_argument_that_is_not_utf8_is_left_to_the_cli(self) -> None:
        """A lone surrogate (bytes that were not UTF-8) is not relayed: the CLI's own error says so."""
        assert relay.encode_request(["set", "t", "step=\udcff"], {}) is None

    def test_the_agents_relayed_write_loads_no_parser(self, short_root: Path) -> None:
        """With a daemon running, an agent's set loads heartbeat, its pulse, relay and defaults (constants)
        modules and _socket: no TOML, SQLite, typing, re, dataclasses or json in the agent's process."""
        h = started(short_root)
        try:
            env = agent_env(h, "h1", claimed(h, "h1"))
            proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "heartbeat", "set", "h1", "step=x"],
                                  capture_output=True, text=True, env=env, timeout=60)
            assert proc.returncode == 0, proc.stderr
            modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                       if line.startswith("import time:")}
            base = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True,
                                  env=env, timeout=60)
            modules -= {line.rsplit("|", 1)[1].strip() for line in base.stderr.splitlines()
                        if line.startswith("import time:")}
            assert h.baton("h1").step == "x" and relayed(h) == 1
            assert {m for m in modules if m.startswith("heartbeat")} == {
                "heartbeat", "heartbeat.hotpath", "heartbeat.hotpath.argv", "heartbeat.hotpath.pulse",
                "heartbeat.hotpath.relay",
                "heartbeat.model", "heartbeat.model.defaults"}
            heavy = {"tomllib", "sqlite3", "typing", "re", "dataclasses", "json", "argparse", "socket", "enum"}
            assert not {m.split(".")[0] for m in modules} & heavy, sorted(modules)
        finally:
            h.stop()


def _owner() -> Owner:
    """This test process as a claiming agent."""
    found = identify(os.getpid())
    assert found is not None
    return Owner(pid=os.getpid(), create_time=found[1], host=this_host(), how="claim", started_at=utcnow())
