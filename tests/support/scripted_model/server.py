"""The HTTP side of the scripted model: a threading stdlib server on 127.0.0.1, wire-neutral.

Why not a package: the mock-LLM servers on PyPI (mockllm, fakellm, llm-mock, aimock's
fixtures, ...) and llmposter (Rust) answer from tables of canned responses matched on the
last user message. This model must decide each turn from the tool results the CLI sends back
(a program, not a table), keep its own record, and be steered while a CLI runs; the framing
those packages would save is a few dozen lines of SSE. Why the standard library and not the
``web`` extra's Starlette: a hung answer is a handler thread that waits, a killed client is a
broken pipe in that thread, and nothing else in the server has to know; an event loop would
need both spelled out. This server is test code on loopback; the product has none of its own.

A wire module exposes ``ROUTES``: ``{(method, path): handler}``, each handler
``(exchange, model) -> None`` writing its answer through the :class:`Exchange`. Paths match
without their query string. Every request is logged (``requests.jsonl`` beside the record:
method, path, session header, status) and each ``/v1/messages``-like body is kept in memory
(:attr:`ScriptedModel.bodies`) for tests that look at what the CLI sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .brain import Brain, Record, Workload

__all__ = ["Exchange", "ScriptedModel", "Handler", "scripted_model"]

HOLD_LIMIT = 600.0
"""The longest a hung answer is held (the server's own stop ends it sooner)."""


class Exchange:
    """One request and the means to answer it."""

    def __init__(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        self._h = handler
        self.method = handler.command
        self.path = handler.path.split("?", 1)[0]
        self.headers = {k.lower(): v for k, v in handler.headers.items()}
        self.body = body
        self.status = 0
        self.usage: dict[str, int] = {}
        """The token counts the wire reported in its answer (logged with the request)."""

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except ValueError:
            return None

    def send_json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(doc).encode()
        self.status = status
        self._h.send_response(status)
        self._h.send_header("content-type", "application/json")
        self._h.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self._h.send_header(k, v)
        self._h.end_headers()
        self._h.wfile.write(data)

    def start_events(self) -> None:
        self.status = 200
        self._h.send_response(200)
        self._h.send_header("content-type", "text/event-stream")
        self._h.send_header("cache-control", "no-cache")
        self._h.send_header("connection", "close")
        self._h.end_headers()
        self._h.close_connection = True

    def event(self, name: str | None, data: Any) -> None:
        head = f"event: {name}\n" if name else ""
        self._h.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
        self._h.wfile.flush()


Handler = Callable[[Exchange, "ScriptedModel"], None]


class ScriptedModel:
    """A brain behind one or more wires, served on 127.0.0.1 (port 0 = any free port)."""

    def __init__(self, brain: Brain, routes: dict[tuple[str, str], Handler], log_dir: Path) -> None:
        self.brain = brain
        self.routes = routes
        self.log_dir = log_dir
        self.bodies: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._log_lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def log(self, **entry: Any) -> None:
        with self._log_lock, open(self.log_dir / "requests.jsonl", "a") as f:
            f.write(json.dumps({"t": round(time.time(), 3), **entry}) + "\n")

    def requests(self) -> list[dict[str, Any]]:
        try:
            with self._log_lock:  # (never a line the server is writing, half written)
                lines = (self.log_dir / "requests.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def hold(self, still: Callable[[], bool]) -> None:
        """Answer nothing while ``still()`` (a hung model), polling; the server's stop ends it."""
        deadline = time.monotonic() + HOLD_LIMIT
        while still() and not self.stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)

    def start(self, port: int = 0) -> ScriptedModel:
        model = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                ex = Exchange(self, body)
                handler = model.routes.get((ex.method, ex.path))
                try:
                    if handler is None:
                        ex.send_json(404, {"type": "error", "error": {"type": "not_found_error",
                                                                      "message": f"no route {ex.path}"}})
                    else:
                        handler(ex, model)
                except (BrokenPipeError, ConnectionResetError):
                    ex.status = ex.status or 499  # the client went away (killed) mid-answer
                finally:
                    model.log(method=ex.method, path=self.path, status=ex.status,
                              session=ex.headers.get("x-claude-code-session-id", ""), **ex.usage)

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@contextmanager
def scripted_model(log_dir: Path, workload: Workload, *, sees_files: bool = True,
                   wires: tuple[str, ...] = ("anthropic",)) -> Iterator[ScriptedModel]:
    """A running scripted model: its record in ``log_dir/model.jsonl``, its controls in
    ``log_dir/controls.json`` (absent = none), its request log in ``log_dir/requests.jsonl``."""
    import importlib

    log_dir.mkdir(parents=True, exist_ok=True)
    routes: dict[tuple[str, str], Handler] = {}
    for wire in wires:
        routes.update(importlib.import_module(f".{wire}", __package__).ROUTES)
    brain = Brain(workload, Record(log_dir / "model.jsonl"), controls=log_dir / "controls.json",
                  sees_files=sees_files)
    model = ScriptedModel(brain, routes, log_dir).start()
    try:
        yield model
    finally:
        model.stop()
