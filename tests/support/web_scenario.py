"""A running daemon with tasks in every interesting state, for the status page's tests and screenshots.

:func:`start_scenario` starts a real ``heartbeat run`` (tests/support/daemon_harness.py) that also
serves ``[http]`` on an ephemeral loopback port, creates tasks (one working through a
long plan, one crashing until it escalates, one blocked on a human, one whose step and
block are hostile HTML, one finished, one invalid baton), kills the working agent once
so its timeline shows an exit, a stall and a re-dispatch, and waits until all of that
is in the ledger. :func:`start_web` runs a standalone ``heartbeat web`` beside it.
:func:`chromium` loads a URL in headless Chromium and returns the rendered DOM.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.daemon_harness import TOY, DaemonHarness, toml_list

HOSTILE_STEP = ('<script>document.title="pwned";document.documentElement.setAttribute("data-pwned","1")</script>'
                '<img src=x onerror="document.title=\'pwned\'">')
"""A step that would retitle the page (and mark the DOM) if it ever ran as markup."""

HOSTILE_BLOCK = '<b onmouseover="alert(1)">a human</b> & <i>friends</i>'

TOKEN = "scenario-token"
"""The token of both servers: every TCP listener needs one (any local user can reach a loopback port)."""

EXTRA = f"""
[launchers.crash]
type = "exec"
command = {toml_list([*TOY, "--mode", "exit:3"])}
stop_grace = "500ms"

[http]
listen = "127.0.0.1:0"
token = "{TOKEN}"
"""

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


def chromium_path() -> str:
    """Debian's chromium (scripts/test installs it); a clear failure, never a skip, when it is missing."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError("chromium is not installed: scripts/test installs it "
                             "(apt-get install -y --no-install-recommends chromium)")
    return path


def chromium(url: str, *, screenshot: str | None = None, size: str = "1280,900", timeout: float = 120,
             flags: tuple[str, ...] = ()) -> str:
    """The DOM of ``url`` after load, as headless Chromium rendered it (or a PNG at ``screenshot``)."""
    with tempfile.TemporaryDirectory(prefix="hb-chromium-") as profile:
        argv = [chromium_path(), *CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile}"]
        if screenshot:
            argv += [f"--screenshot={screenshot}", f"--window-size={size}", url]
        else:
            argv += ["--dump-dom", url]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": profile})
        assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
        return proc.stdout


def with_token(url: str, token: str = TOKEN) -> str:
    """``url`` carrying ``?token=`` (the way a browser opens the page; its links keep it)."""
    return f"{url}{'&' if '?' in url else '?'}token={token}"


@dataclass
class Scenario:
    h: DaemonHarness
    url: str
    """The daemon's own [http] server."""

    def at(self, path: str = "") -> str:
        return with_token(self.url + path)


def start_scenario(root: Path) -> Scenario:
    h = DaemonHarness(root, agent=[*TOY, "--step-time", "1.5"], max_attempts=2, stall_after="20s",
                      backoff_initial="100ms", backoff_max="200ms", extra=EXTRA)
    try:
        h.new("hostile", "--blocked-on", HOSTILE_BLOCK, "--gate", "human", step=HOSTILE_STEP)
        h.new("review", "--blocked-on", "a design review by ops", "--gate", "human", step="write the RFC")
        h.new("crashy", "--launcher", "crash", plan=3)
        h.new("quick", plan=1)
        h.new("alpha", "--constraint", "never push to main", "--key-file", "README.md", plan=40)
        (h.state / "batons" / "broken.toml").write_text("task = 'half a baton\n")
        h.start()
        first = h.wait(lambda: _owner(h, "alpha"), "alpha's first agent")
        h.wait(lambda: h.events("alpha", "touched") or len(h.events("alpha")) > 3, "alpha's agent at work")
        os.killpg(os.getpgid(first), signal.SIGKILL)
        h.wait(lambda: any(e.data.get("signal") == 9 for e in h.events("alpha", "exited")), "alpha's exit recorded")
        h.wait(lambda: (p := _owner(h, "alpha")) and p != first, "alpha re-dispatched")
        h.wait(lambda: h.baton("crashy").meta.status.value == "escalated", "crashy escalated", timeout=40)
        h.wait(lambda: h.baton("quick").meta.status.value == "done", "quick done", timeout=40)
        served = h.wait_log(lambda e: e.get("event") == "http_serving", "the daemon's [http] server")
        return Scenario(h, str(served["url"]))
    except BaseException:
        h.close()
        raise


def _owner(h: DaemonHarness, task_id: str) -> int | None:
    b = h.try_baton(task_id)
    return b.meta.owner.pid if b is not None and b.meta.owner is not None else None


@dataclass
class WebServer:
    proc: subprocess.Popen[str]
    url: str
    token: str = TOKEN

    def at(self, path: str = "") -> str:
        """The URL of ``path`` with this server's token."""
        return with_token(self.url + path, self.token)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_web(h: DaemonHarness, *args: str, env: dict[str, str] | None = None) -> WebServer:
    """``heartbeat web --listen 127.0.0.1:0`` for the harness's state dir (token: ``$HEARTBEAT_WEB_TOKEN``
    of ``env``, else :data:`TOKEN`); its URL read from its ready line."""
    env = {"HEARTBEAT_WEB_TOKEN": TOKEN, **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(h.config), "web",
                             "--listen", "127.0.0.1:0", *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env={**h.env(), **env})
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    line = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = re.search(r"at (http://\S+/) ", line)
        if match:
            return WebServer(proc, match.group(1), env["HEARTBEAT_WEB_TOKEN"])
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"heartbeat web did not start: {line!r} (exit {proc.poll()})")
