"""A TCP forwarder on 127.0.0.1 that a test can partition: the network between one host and its
database, made of real sockets.

Each accepted connection is forwarded to ``target`` (a Unix socket path, as the throwaway cluster
serves, or ``(host, port)``). :meth:`blackhole` stops forwarding bytes both ways and keeps every
socket open: no RST and no FIN reach either side, and the kernel still acknowledges what each side
sends (what a partition behind a NAT or a proxy looks like: nothing answers, nothing fails).
New connections are accepted and black-holed too, or, with ``refuse_new``, closed at once.
:meth:`heal` forwards again: with ``keep_old_dead`` the connections of before the partition stay
black-holed for ever (their flow state was lost), only new connections work.
"""

from __future__ import annotations

import os
import select
import socket
import threading

__all__ = ["Proxy"]


class Proxy:
    """See the module docstring. ``url_for(url)`` is a libpq URL of ``url``'s database through this proxy."""

    def __init__(self, target: str | tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._generation = 0
        """Bumped by every partition: a pair of an older generation forwards only while ``_alive`` holds it."""
        self._alive: set[int] = {0}
        self._open = True
        self._refuse = False
        self._closed = False
        self.accepted = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def url_for(self, db: str, user: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    # -- the partition -------------------------------------------------------------------

    def blackhole(self, *, refuse_new: bool = False) -> None:
        with self._lock:
            self._open = False
            self._refuse = refuse_new

    def heal(self, *, keep_old_dead: bool = False) -> None:
        with self._lock:
            if keep_old_dead:
                self._alive = set()
            self._generation += 1
            self._alive.add(self._generation)
            self._open = True
            self._refuse = False

    def _forwarding(self, generation: int) -> bool:
        with self._lock:
            return self._open and generation in self._alive

    # -- the forwarding ------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse, generation = (not self._open and self._refuse), self._generation
            if refuse:
                client.close()
                continue
            try:
                if isinstance(self.target, str):
                    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                else:
                    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                upstream.connect(self.target)
            except OSError:
                client.close()
                continue
            self.accepted += 1
            self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, generation), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, generation: int) -> None:
        other = {a: b, b: a}
        try:
            while not self._closed:
                if not self._forwarding(generation):
                    threading.Event().wait(0.05)  # read nothing: the bytes wait in the kernel, unanswered
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.05)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    other[s].sendall(data)
        except OSError:
            return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass


def socket_path(socket_dir: str, port: int = 5432) -> str:
    """The Unix socket of a cluster served in ``socket_dir``."""
    return os.path.join(socket_dir, f".s.PGSQL.{port}")
