"""The relay: an agent's ``set`` and ``add`` written by the running daemon, for about one interpreter start.

A ``heartbeat set`` in the agent's own process has to import the TOML parser, SQLite and
the baton model before it writes a line: four interpreter starts. The daemon has them loaded
already. So, for an agent the daemon launched (``HEARTBEAT_STATE_DIR`` and
``HEARTBEAT_EPOCH`` set, no store URL), ``heartbeat set ID F=V...`` and ``heartbeat add ID
FIELD V...`` written without options are handed to the daemon over the Unix socket
``<state_dir>/daemon.sock``, and the daemon runs the very code the CLI would
(:func:`heartbeat.tasks.write.relayed`, on a store of its own, with the caller's
``HEARTBEAT_TASK``, ``HEARTBEAT_EPOCH`` and ``HEARTBEAT_ACTOR``): the same fence, checks,
ledger rows, exit codes and one-line errors.

The exchange (version 1), every step bounded in time:

1. The client connects, only to a socket owned by its own uid; the daemon checks the peer's
   uid (``SO_PEERCRED``) and answers ``heartbeat-relay 1\\n`` (:data:`GREETING`).
2. The client sends ``<length>\\n`` and that many bytes: UTF-8 fields joined by NUL, the
   three variables then the arguments (an argument cannot hold a NUL).
3. The daemon writes, answers ``<exit code>\\n<one line or nothing>`` and closes.

On a database store (the agent has ``HEARTBEAT_STORE_URL``) the daemon greets with version 2,
``heartbeat-relay 2 pg:<16 hex digits>\n`` (:func:`store_id`: its database, no password shown);
the client goes on only when that is its own database. Version 2 also carries ``touch ID``,
``show ID``, ``done ID`` and ``done ID --note NOTE``, and answers ``<exit code> <n>\n``, then
``n`` bytes of standard output (``show``'s baton), then the one line or nothing, or
``declined\n`` (nothing written: a ``done`` whose guarantees have checks runs them in the
agent's own process, as without a daemon). An agent's frequent calls thus go through the
daemon's few connections (``defaults.PG_RELAY_POOL``) and it holds no database connection of
its own; its rare ones (``verify``, ``snooze``, ``block``, any call with an option) connect briefly.

**Nothing is written twice.** Until the greeting has arrived nothing has been sent, so
any failure before it (no socket, no daemon, a stopped or saturated one: no greeting
within ``defaults.RELAY_GREETING_TIMEOUT``) runs the command in the caller's process as before. After
the greeting the daemon may have written: a lost answer is then an error (exit 1) that says
so, never a second write. The daemon acts only on a request whose every byte arrived.

This module imports only ``os``, :mod:`heartbeat.model.defaults` (constants) and the ``_socket`` C module
at load (``socket`` loads ``enum``): it is what the ``heartbeat`` command runs before the CLI.
"""

from __future__ import annotations

import os

from heartbeat.hotpath.argv import AGENT_COMMANDS, READS, agent_call
from heartbeat.model import defaults

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket
    from collections.abc import Mapping

__all__ = ["DECLINED_REPLY", "GREETING", "MAX_REQUEST", "RAIL_REQUEST", "SOCKET_NAME", "encode_request", "is_read",
           "decode_request", "forward", "forward_rail", "greeting", "relayable", "store_id"]

SOCKET_NAME = "daemon.sock"
"""The daemon's relay socket, in the state dir."""

GREETING = b"heartbeat-relay 1\n"
"""What the daemon says first: the client sends nothing before it."""

GREETING_2 = b"heartbeat-relay 2 "
"""How a daemon on a database store starts its greeting: then :func:`store_id` and a newline."""

DECLINED_REPLY = b"declined\n"
"""A version-2 answer that says the daemon wrote nothing and the client must run the command itself
(a ``done`` whose guarantees have checks: they run in the agent's process, as without a daemon)."""

MAX_REQUEST = (1024 + 64) * 1024
"""The longest request the daemon reads, in bytes: a baton may be at most 1 MiB
(``defaults.MAX_BATON_BYTES``), so a longer request could not make a valid one; the client
keeps it and its own CLI says what is wrong. (16 clients at once: about 17 MiB at most.)"""

MAX_PATH = 107
"""The longest socket path Linux binds or connects to (``sun_path`` is 108 bytes, NUL included)."""

_VARIABLES = ("HEARTBEAT_TASK", "HEARTBEAT_EPOCH", "HEARTBEAT_ACTOR")


def socket_path(state_dir: str) -> str:
    """``<state_dir>/daemon.sock``."""
    return os.path.join(state_dir, SOCKET_NAME)


def is_read(argv: list[str]) -> bool:
    """``show ID`` or ``brief ID``, optionally ``--json`` after it: a read any daemon's relay answers
    (:mod:`heartbeat.reports.reads`); nothing is written, so any failure lets the caller read itself."""
    call = agent_call(argv)
    return call is not None and call[0] in READS


def relayable(argv: list[str], *, agent_commands: bool = False) -> bool:
    """Whether ``argv`` is an agent's hot write, as :func:`heartbeat.cli.parser._hot_args` reads it:
    ``set ID F=V...`` or ``add ID FIELD V...``, no argument starting with ``-``; with
    ``agent_commands`` (a database store) also ``touch ID``, ``show ID``, ``done ID`` and
    ``done ID --note NOTE`` (as :func:`heartbeat.tasks.write.parse_hot` reads them)."""
    call = agent_call(argv)
    return call is not None and (call[0] in ("set", "add") or (
        agent_commands and call[0] in AGENT_COMMANDS and not call[2]))


def store_id(url: str) -> bytes:
    """``pg:`` and 16 hex digits of the SHA-256 of the store URL: the database a daemon's relay
    writes to, named in its greeting without its password; the client compares it with its own."""
    try:
        from _sha2 import sha256  # (Python 3.12 on: no OpenSSL to load)
    except ImportError:
        try:
            from _sha256 import sha256  # (Python 3.11)
        except ImportError:
            from hashlib import sha256
    return b"pg:" + sha256(url.strip().encode("utf-8", "surrogateescape")).hexdigest()[:16].encode()


def greeting(url: str) -> bytes:
    """The daemon's greeting: :data:`GREETING` on the file store (version 1: ``set``/``add``), else
    version 2 naming the database (:func:`store_id`): ``set``, ``add``, ``touch``, ``done``, ``show``,
    and an answer that carries the command's standard output too."""
    return GREETING_2 + store_id(url) + b"\n" if url.strip() else GREETING


def encode_request(argv: list[str], env: Mapping[str, str]) -> bytes | None:
    """The request's bytes, or None when an argument is not UTF-8 or the request is longer than
    the daemon reads (:data:`MAX_REQUEST`): the CLI, in the caller's process, says what is wrong."""
    try:
        body = b"\0".join(s.encode("utf-8") for s in [*(env.get(name, "") for name in _VARIABLES), *argv])
    except UnicodeEncodeError:
        return None
    if len(body) > MAX_REQUEST:
        return None
    return b"%d\n%s" % (len(body), body)


def decode_request(body: bytes) -> tuple[list[str], dict[str, str]]:
    """``(argv, variables)`` from a request's body; ValueError when it is not one."""
    fields = body.decode("utf-8").split("\0")
    if len(fields) < len(_VARIABLES) + 2:  # (``show ID``: two arguments)
        raise ValueError("too few fields")
    env = {name: value for name, value in zip(_VARIABLES, fields, strict=False) if value}
    return fields[len(_VARIABLES):], env


def forward(argv: list[str], environ: Mapping[str, str] | None = None) -> int | None:
    """Hand an agent's ``set``/``add`` to the daemon: its exit code, or None when the caller must
    run the command itself (not an agent's hot write, no daemon to greet it)."""
    env = os.environ if environ is None else environ
    state_dir = env.get("HEARTBEAT_STATE_DIR")
    url = env.get("HEARTBEAT_STORE_URL", "")
    read = is_read(argv)
    if not state_dir or not env.get("HEARTBEAT_EPOCH") or env.get("HEARTBEAT_RELAY") == "off" \
            or not (read or relayable(argv, agent_commands=bool(url.strip()))):
        return None
    path = socket_path(os.path.abspath(state_dir))
    if len(os.fsencode(path)) > MAX_PATH:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if st.st_mode & 0o170000 != 0o140000 or st.st_uid != os.geteuid():
        return None  # not a socket, or not ours: nothing to talk to
    request = encode_request(argv, env)
    if request is None:
        return None
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        return _exchange(sock, path, argv, request, greeting(url), read=read)
    except KeyboardInterrupt:
        return 130  # as the CLI answers Ctrl-C: quietly (once greeted, the daemon may still write)
    finally:
        sock.close()


RAIL_REQUEST = "rail"
"""The request that carries a ``PreToolUse`` event to the daemon's rail (``rail TASK EVENT``)."""


def forward_rail(event: bytes, environ: Mapping[str, str] | None = None) -> int | None:
    """Hand a bound agent's ``PreToolUse`` event to the daemon's rail (:func:`heartbeat.tasks.rail.relayed`),
    which prints the hook's answer: 0, or None when the caller must decide itself (no daemon to greet it,
    not an agent's event, a request the relay cannot carry). Whatever the daemon answers goes to stdout."""
    env = os.environ if environ is None else environ
    task = env.get("HEARTBEAT_TASK", "")
    state_dir = env.get("HEARTBEAT_STATE_DIR")
    if not task or not state_dir or not env.get("HEARTBEAT_EPOCH") or env.get("HEARTBEAT_RELAY") == "off" \
            or b"\0" in event or b'"PreToolUse"' not in event:
        return None
    path = socket_path(os.path.abspath(state_dir))
    try:
        st = os.lstat(path)
        text = event.decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if len(os.fsencode(path)) > MAX_PATH or st.st_mode & 0o170000 != 0o140000 or st.st_uid != os.geteuid():
        return None
    argv = [RAIL_REQUEST, task, text]
    request = encode_request(argv, env)
    if request is None:
        return None
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        code = _exchange(sock, path, argv, request, greeting(env.get("HEARTBEAT_STORE_URL", "")), message_fd=1,
                         lost="heartbeat hook: the daemon's rail did not answer ({reason}); the hook decides",
                         reply_timeout=defaults.RAIL_REPLY_TIMEOUT)
    except KeyboardInterrupt:
        return 0
    finally:
        sock.close()
    # No whole answer (or a decline): the hook decides in its own process, as with no daemon; a lost
    # answer is never an allow.
    return 0 if code == 0 else None


def _exchange(sock: _socket.socket, path: str, argv: list[str], request: bytes, expected: bytes, *,
              read: bool = False, message_fd: int = 2, lost: str = "",
              reply_timeout: float = defaults.RELAY_REPLY_TIMEOUT) -> int | None:
    """Greeting, request and answer over ``sock``; see :func:`forward`. A greeting other than
    ``expected`` (another version, another database) gets nothing sent: the caller writes itself.
    A ``read`` (:func:`is_read`) that gets no whole answer, or an error (an older daemon that
    writes only), is left to the caller too: nothing was written."""
    sock.settimeout(defaults.RELAY_GREETING_TIMEOUT)
    try:
        sock.connect(path)
        said = _read_line(sock, len(expected))
    except OSError:
        return None
    if said != expected:
        return None
    # From here on the daemon may write: never fall back to a write of our own.
    try:
        sock.settimeout(reply_timeout)
        sock.sendall(request)
        reply = _read_all(sock, MAX_REQUEST + 65536)  # a message may echo the arguments, as the CLI prints it
        if reply == DECLINED_REPLY:
            return None  # nothing was written: the caller runs the command itself
        head, _, message = reply.partition(b"\n")
        code_text, _, out_text = head.partition(b" ")  # version 2: "<code> <stdout bytes>"
        code, out_size = int(code_text), int(out_text or 0)
        if len(message) < out_size:
            raise ValueError("the answer was cut short")  # never a partial baton printed as if whole
        output, message = message[:out_size], message[out_size:]
        if read and (code != 0 or not out_text):
            return None  # (an error is said by the caller's own CLI, as it always says it)
    except (OSError, ValueError) as exc:
        if read:
            return None
        reason = "no answer in time" if isinstance(exc, TimeoutError) else "the connection broke"
        text = lost.format(reason=reason) or (f"heartbeat: the daemon took this write but its answer was lost "
                                              f"({reason}): look with `heartbeat show {argv[1]}` before writing it again")
        os.write(2, text.encode(errors="replace") + b"\n")
        return 1
    try:
        view = memoryview(output)
        while view:
            view = view[os.write(1, view):]
    except OSError:  # (a closed pipe: the CLI's exit 1 too)
        code = code or 1
    if message:
        os.write(message_fd, message.rstrip(b"\n") + b"\n")
    return code


def _read_line(sock: object, limit: int) -> bytes:
    """Bytes up to and including the first newline (at most ``limit``), or what came before EOF."""
    data = b""
    while len(data) < limit and not data.endswith(b"\n"):
        chunk = sock.recv(limit - len(data))  # type: ignore[attr-defined]
        if not chunk:
            break
        data += chunk
    return data


def _read_all(sock: object, limit: int) -> bytes:
    """Everything until EOF (at most ``limit`` bytes)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = sock.recv(min(65536, limit - size))  # type: ignore[attr-defined]
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
