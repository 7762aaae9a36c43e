"""The daemon's end of :mod:`heartbeat.hotpath.relay`: agents' ``set``/``add`` written in this process.

:class:`RelayServer` listens on ``<state_dir>/daemon.sock`` (mode 0600, in the 0700 state
dir) in a thread of its own. Each connection gets a thread (at most
:data:`heartbeat.model.defaults.RELAY_MAX_CLIENTS`; one more is closed unanswered, and its
client writes by itself), a peer-uid check, the greeting, a bounded read of the request,
and :func:`heartbeat.tasks.write.relayed` on a store opened for that request alone (as the
agent's own process would have opened one: no state shared with the loop's store). A
request that did not arrive whole is dropped unwritten. On a database store (``shared``) every
request runs on that one store, whose pool (``defaults.PG_RELAY_POOL`` connections) is all the
agents of this host hold on the database, and the greeting is version 2 (naming the database:
:func:`heartbeat.hotpath.relay.greeting`), which also carries ``touch``, ``done`` and ``show``.
A planted file at the socket's path
(anything but a socket) is left alone and the relay stays off, in one logged line: agents
then write by themselves, as without a daemon.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from heartbeat.hotpath.relay import (
    DECLINED_REPLY,
    MAX_PATH,
    MAX_REQUEST,
    RAIL_REQUEST,
    decode_request,
    greeting,
    socket_path,
)
from heartbeat.model import defaults
from heartbeat.model.errors import HeartbeatError
from heartbeat.store.base import Store
from heartbeat.tasks.write import DECLINED, answer, parse_hot

__all__ = ["RelayServer"]

_REQUEST_TIMEOUT = defaults.RELAY_REQUEST_TIMEOUT
_STOP_WAIT = defaults.RELAY_STOP_WAIT
_STOP_LISTEN = defaults.RELAY_STOP_LISTEN
_ACCEPT_RETRY = defaults.RELAY_ACCEPT_RETRY


class RelayServer:
    """Writes agents' ``set``/``add`` for them. See the module docstring."""

    def __init__(self, state_dir: str, open_store: Callable[[], Store], log: Any,
                 on_write: Callable[[int], None] = lambda code: None, *, shared: Store | None = None,
                 store_url: str = "", max_attempts: int | None = None,
                 irreversible: Callable[[str], Sequence[str]] | None = None) -> None:
        self.path = socket_path(state_dir)
        self._state_dir = state_dir
        self.max_attempts = max_attempts
        """The config's bound, shown in a relayed brief as "attempt N of M" (as the CLI reads it)."""
        self._irreversible = irreversible
        """A launcher's irreversible globs, for the rail (None: the defaults)."""
        self._shared = shared
        """The database store every request runs on (None: a store opened per request, the file store's)."""
        self._greeting = greeting(store_url if shared is not None else "")
        self._on_write = on_write
        """Told each answered request's exit code (the daemon's vitals count them)."""
        self._open_store = open_store
        self.log = log
        self._sock: socket.socket | None = None
        self._bound: tuple[int, int] | None = None
        self._slots = threading.BoundedSemaphore(defaults.RELAY_MAX_CLIENTS)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._waiting: set[socket.socket] = set()
        """Greeted connections whose request has not arrived whole: a stop closes them (nothing is written)."""
        self._waiting_lock = threading.Lock()

    def start(self) -> bool:
        """Bind and listen; False (logged) when the relay stays off."""
        if len(os.fsencode(self.path)) > MAX_PATH:
            self.log.info("relay_off", path=self.path, reason="the socket path is longer than Linux allows (107 bytes)")
            return False
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.log.error("relay_off", path=self.path, reason=exc.strerror)
            return False
        else:
            if not stat.S_ISSOCK(st.st_mode):
                self.log.error("relay_off", path=self.path,
                               reason="something that is not a socket is there; agents write by themselves")
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # a dead daemon's (we hold the state dir's daemon lock)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.path)
            sock.listen(64)
            st = os.lstat(self.path)
        except OSError as exc:
            sock.close()
            self.log.error("relay_off", path=self.path, reason=exc.strerror)
            return False
        finally:
            os.umask(old_umask)
        self._sock, self._bound = sock, (st.st_dev, st.st_ino)
        self._thread = threading.Thread(target=self._accept_loop, name="heartbeat-relay", daemon=True)
        self._thread.start()
        self.log.debug("relay_serving", path=self.path)
        return True

    def stop(self, wait: float = _STOP_WAIT) -> None:
        """Stop accepting and remove the socket (if it is still the one bound here). Greeted
        clients get :data:`_STOP_LISTEN` more for their request (a client sends it at once;
        at most half of ``wait``, the rest is for their writes);
        then the silent ones are closed on, nothing of theirs written. The writes under way get
        at most ``wait`` seconds in all (the daemon's stop grace bounds it)."""
        deadline = time.monotonic() + min(wait, _STOP_WAIT)
        with self._waiting_lock:
            self._stopping.set()  # no more greetings: a client connecting now writes by itself
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        sock.close()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        listen_until = time.monotonic() + min(_STOP_LISTEN, (deadline - time.monotonic()) / 2)
        while self._waiting and time.monotonic() < listen_until:
            time.sleep(0.005)
        with self._waiting_lock:
            for conn in self._waiting:
                with contextlib.suppress(OSError):
                    # Wakes its recv() at EOF: the request is not whole, nothing is written. (Only
                    # the reading side: a request that did arrive whole is written and answered.)
                    conn.shutdown(socket.SHUT_RD)
        # Writes under way finish (bounded: a stop must not wait on a baton lock for long).
        taken = 0
        while taken < defaults.RELAY_MAX_CLIENTS and self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            taken += 1
        if taken < defaults.RELAY_MAX_CLIENTS:
            self.log.warning("relay_stopped_busy", writes=defaults.RELAY_MAX_CLIENTS - taken)
        for _ in range(taken):
            self._slots.release()
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._bound:
                os.unlink(self.path)

    def _accept_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        failing = False
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except OSError as exc:
                if self._stopping.is_set():
                    return
                # Out of descriptors (EMFILE) or memory: the pending client stays queued and
                # accept() fails again at once, so pause rather than spin (its client, not
                # greeted, writes by itself). One line per run of failures.
                if not failing:
                    self.log.warning("relay_accept_failed", error=exc.strerror or repr(exc))
                failing = True
                self._stopping.wait(_ACCEPT_RETRY)
                continue
            failing = False
            if not self._slots.acquire(blocking=False):
                conn.close()  # no greeting: the client writes by itself
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="heartbeat-relay-client", daemon=True).start()
            except RuntimeError as exc:  # "can't start new thread" (out of memory or threads): this client
                self._slots.release()   # writes by itself, and the relay goes on accepting after a pause
                conn.close()
                self.log.warning("relay_accept_failed", error=str(exc))
                self._stopping.wait(_ACCEPT_RETRY)

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._answer(conn)
        except Exception as exc:  # one client's trouble never reaches the loop
            self.log.warning("relay_failed", error=repr(exc))
        finally:
            self._slots.release()

    def _read(self, conn: socket.socket, argv: list[str], env: dict[str, str]) -> bool:
        """Answer a relayed ``show``/``brief`` (:mod:`heartbeat.reports.reads`) in the reply of version 2,
        whatever the store: True when ``argv`` was one. Nothing is written, so a client that gets no
        whole answer runs the read itself."""
        from heartbeat.reports.reads import answer_read, read_request

        if read_request(argv) is None:
            return False
        state_dir = os.path.dirname(self.path)
        if self._shared is not None:
            answered = answer_read(self._shared, state_dir, argv, env, max_attempts=self.max_attempts)
        else:
            try:
                store = self._open_store()
            except HeartbeatError as exc:
                _reply(conn, exc.exit_code, f"heartbeat: {exc}", "")
                return True
            try:
                answered = answer_read(store, state_dir, argv, env, max_attempts=self.max_attempts)
            finally:
                with contextlib.suppress(Exception):
                    store.close()
        assert answered is not None
        code, message, output = answered
        self.log.debug("relayed", command=argv[0], task=argv[1], code=code)
        _reply(conn, code, message, output, lines=True)
        return True

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_REQUEST_TIMEOUT)
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.geteuid():
            self.log.warning("relay_refused", uid=uid, reason="another user")
            return
        with self._waiting_lock:
            if self._stopping.is_set():
                return  # no greeting: the client writes by itself
            self._waiting.add(conn)
        try:
            conn.sendall(self._greeting)
            body = _read_request(conn)
        except OSError:  # (a timeout too)
            body = None
        with self._waiting_lock:
            self._waiting.discard(conn)
        if body is None:
            self.log.debug("relay_dropped", reason="the request did not arrive whole")
            return  # nothing is written
        try:
            argv, env = decode_request(body)
        except ValueError:
            _reply(conn, 2, "heartbeat: the relayed request is malformed")
            return
        if self._read(conn, argv, env):
            return
        version2 = self._shared is not None
        if argv[0] == RAIL_REQUEST:
            self._rail(conn, argv, env, version2)
            return
        request = parse_hot(argv, agent_commands=version2)
        if self._shared is not None:
            code, message, output = answer(self._shared, request, env)
        else:
            try:
                store = self._open_store()
            except HeartbeatError as exc:  # (a FIFO planted as the ledger's journal): the agent's own error, unwritten
                self.log.debug("relayed", command=argv[0], task=argv[1], code=exc.exit_code)
                self._on_write(exc.exit_code)
                _reply(conn, exc.exit_code, f"heartbeat: {exc}")
                return
            try:
                code, message, output = answer(store, request, env)
            finally:
                with contextlib.suppress(Exception):
                    store.close()
        if code == DECLINED:
            self.log.debug("relay_declined", command=argv[0], task=argv[1], reason="checked guarantees")
        else:
            self.log.debug("relayed", command=argv[0], task=argv[1], code=code)
            self._on_write(code)
        _reply(conn, code, message, output if version2 else None)


    def _rail(self, conn: socket.socket, argv: list[str], env: dict[str, str], version2: bool) -> None:
        """A bound agent's PreToolUse, decided here (:func:`heartbeat.tasks.rail.relayed`): the hook's answer
        as the message (version 1) or the output (version 2); not counted as a write."""
        from heartbeat.tasks.rail import relayed

        later: list[Callable[[], None]] = []
        store: Store | None = None
        if self._shared is not None:
            out = relayed(self._shared, argv[1:], env, self._irreversible, later)
        else:
            try:
                store = self._open_store()
            except HeartbeatError:
                out = None
            else:
                out = relayed(store, argv[1:], env, self._irreversible, later)
        try:
            if out is None:  # not decided here: the agent's own hook decides (never an allow by default)
                self.log.debug("rail_declined", task=argv[1])
                _reply(conn, DECLINED, "", "" if version2 else None)
                return
            self.log.debug("rail_relayed", task=argv[1], refused=bool(out))
            if not out:  # allowed: the call starts, and its trail says so (the hook process leaves it to us)
                _trail_start(self._state_dir, argv, env)
            _reply(conn, 0, "" if version2 else out, out if version2 else None)
            for record in later:  # after the answer: a slow ledger never delays a refusal
                with contextlib.suppress(Exception):
                    record()
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()


def _trail_start(state_dir: str, argv: list[str], env: dict[str, str]) -> None:
    """Record the start of a relayed ``PreToolUse`` the rail let through in the agent's trail
    (:mod:`heartbeat.hotpath.trail`), as the hook would have in its own process."""
    import json

    from heartbeat.hotpath import trail

    try:
        event = json.loads(argv[2])
    except (IndexError, ValueError, RecursionError):
        return
    if isinstance(event, dict):
        with contextlib.suppress(OSError, HeartbeatError):
            trail.hot_hook(event, {**env, "HEARTBEAT_STATE_DIR": state_dir})


def _read_request(conn: socket.socket) -> bytes | None:
    """The request's body, or None when it is malformed, too long, not whole before EOF or
    not whole within :data:`_REQUEST_TIMEOUT` in all (a client dribbling bytes holds no slot for long)."""
    deadline = time.monotonic() + _REQUEST_TIMEOUT

    def recv(size: int) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        return conn.recv(size)

    head = b""
    while not head.endswith(b"\n"):
        chunk = recv(1)
        if not chunk or len(head) > 12:
            return None
        head += chunk
    try:
        size = int(head)
    except ValueError:
        return None
    if not 0 < size <= MAX_REQUEST:
        return None
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = recv(min(left, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _reply(conn: socket.socket, code: int, message: str, output: str | None = None, *, lines: bool = False) -> None:
    """``<code>\n<message>``; version 2 (``output`` given): ``<code> <n>\n``, n bytes of stdout, the message,
    or ``declined\n`` (:data:`heartbeat.tasks.write.DECLINED`: nothing written, the client runs the command itself).
    ``lines``: the message may hold several lines (a read's warnings)."""
    line = (message if lines else message.replace("\n", " ")).encode("utf-8", errors="replace")
    if code == DECLINED and output is not None:
        data = DECLINED_REPLY
    elif output is None:
        data = b"%d\n%s" % (code, line)
    else:
        out = output.encode("utf-8", errors="replace")
        data = b"%d %d\n%s%s" % (code, len(out), out, line)
    with contextlib.suppress(OSError):  # the client may be gone: what was written stays written
        conn.settimeout(_REQUEST_TIMEOUT)  # (the request's reads left whatever remained of theirs)
        conn.sendall(data)
