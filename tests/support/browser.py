"""Headless Chromium driven over the DevTools protocol on a pipe, for the page's forms.

``chromium --dump-dom`` (tests/support/web_scenario.py) only loads a page; answering a question
needs a browser that types into a form and submits it, sending what a real one sends (``Origin``,
``Sec-Fetch-Site``, the form's encoding). ``--remote-debugging-pipe`` speaks the protocol as
NUL-terminated JSON on fds 3 (to the browser) and 4 (from it): no websocket client needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any

from tests.support.web_scenario import CHROMIUM_FLAGS, chromium_path

__all__ = ["Browser"]


class Browser:
    """One headless Chromium with one page: ``open``, ``type_into``, ``click``, ``evaluate``."""

    def __init__(self, timeout: float = 60) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="hb-cdp-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's fd 3 and 4 are the protocol's pipes; every other descriptor of ours closes.
        def wire() -> None:
            import fcntl

            up = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            down = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(up, 3)
            os.dup2(down, 4)
            os.closerange(5, 1 << 16)

        self.proc = subprocess.Popen(
            [chromium_path(), *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=wire,
            close_fds=False, env={**os.environ, "HOME": self._profile.name})
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")

    # -- the protocol --------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise AssertionError("chromium did not answer over its debugging pipe in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise AssertionError(f"chromium closed its debugging pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        ask = {"id": self._next_id, "method": method, "params": params}
        if session:
            ask["sessionId"] = session
        self._send(ask)
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._read(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page's session."""
        return self._call(method, self._session, **params)

    # -- what a person does ----------------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'", "the page")

    def wait_for(self, expression: str, what: str) -> Any:
        """Poll ``expression`` in the page until it is truthy (a navigation in between is expected)."""
        deadline = time.monotonic() + self.timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
            except AssertionError:
                last = None  # the page was navigating
            if last:
                return last
            time.sleep(0.05)
        raise AssertionError(f"{what}: {expression!r} did not hold within {self.timeout}s (last {last!r})")

    def type_into(self, selector: str, text: str) -> None:
        """Focus ``selector`` and type ``text`` as keyboard input."""
        assert self.evaluate(f"(function(e){{ if (!e) return false; e.focus(); return true; }})"
                             f"(document.querySelector({json.dumps(selector)}))"), selector
        self.call("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        """A real mouse click at the middle of ``selector``."""
        box = self.evaluate(f"(function(e){{ if (!e) return null; e.scrollIntoView(); var r = e.getBoundingClientRect();"
                            f" return [r.x + r.width / 2, r.y + r.height / 2]; }})"
                            f"(document.querySelector({json.dumps(selector)}))")
        assert box, selector
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))

    def close(self) -> None:
        try:
            self._send({"id": 0, "method": "Browser.close", "params": {}})
        except OSError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
