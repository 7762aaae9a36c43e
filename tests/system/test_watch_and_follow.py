"""``status --watch`` and ``logs -f`` run until Ctrl-C (issue 26, item 12): real processes, a real SIGINT.

Both poll: a task made while ``status --watch`` runs appears in a later redraw, and a line
appended to the agent's log while ``logs -f`` runs is printed; SIGINT ends either with exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from conftest import Result, clean_env, wait_for

Hb = Callable[..., Result]


class _Output:
    """A running ``heartbeat ...`` whose standard output is collected as it comes."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        # SIGINT at its default in the child, whatever this test runner inherited: a runner started in the
        # background of a non-interactive shell ignores SIGINT, and Python then leaves it ignored.
        self.proc = subprocess.Popen([sys.executable, "-m", "heartbeat", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)),
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.text = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(4096):
            self.text += chunk.decode()

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(30)
        self._reader.join(10)
        return code


def test_status_watch_redraws_until_interrupted(hb: Hb, state_dir: Path) -> None:
    assert hb("new", "first", "--task", "x", "--step", "s").code == 0
    watching = _Output(state_dir, "status", "--watch", "0.2")
    try:
        wait_for(lambda: "first" in watching.text, timeout=30, message="the first drawing")
        assert hb("new", "second", "--task", "x", "--step", "s").code == 0
        wait_for(lambda: "second" in watching.text, timeout=30, message="a redraw with the new task")
    finally:
        code = watching.interrupt()
    assert code == 0, watching.proc.stderr.read() if watching.proc.stderr else ""
    assert watching.text.count("every 0.2s") >= 2


def test_logs_follow_prints_what_is_appended_until_interrupted(hb: Hb, state_dir: Path) -> None:
    assert hb("new", "t", "--task", "x", "--step", "s", "--claim", "--pid", str(os.getpid())).code == 0
    epoch = json.loads(hb("show", "t", "--json").out)["meta"]["epoch"]
    log = state_dir / "logs" / "t" / f"{epoch}.log"
    log.parent.mkdir(parents=True)
    log.write_text("before\n")
    following = _Output(state_dir, "logs", "t", "-f")
    try:
        wait_for(lambda: "before" in following.text, timeout=30, message="what the log held")
        with log.open("a") as handle:
            handle.write("after\n")
        wait_for(lambda: "after" in following.text, timeout=30, message="the appended line")
    finally:
        code = following.interrupt()
    assert code == 0 and following.text == "before\nafter\n", (code, following.text)


def test_logs_follow_starts_over_when_the_daemon_cuts_the_log(hb: Hb, state_dir: Path) -> None:
    """The daemon keeps a long log's tail in <epoch>.log.1 and truncates the live file in place
    (max_log_bytes): -f goes on from its start instead of waiting past its old end for ever."""
    assert hb("new", "t", "--task", "x", "--step", "s", "--claim", "--pid", str(os.getpid())).code == 0
    epoch = json.loads(hb("show", "t", "--json").out)["meta"]["epoch"]
    log = state_dir / "logs" / "t" / f"{epoch}.log"
    log.parent.mkdir(parents=True)
    log.write_text("a long line before the cut\n")
    following = _Output(state_dir, "logs", "t", "-f")
    try:
        wait_for(lambda: "before the cut" in following.text, timeout=30, message="what the log held")
        with log.open("r+") as handle:  # as cap_log does: truncated in place, then written on (shorter)
            handle.truncate(0)
            handle.write("new\n")
        wait_for(lambda: "new" in following.text, timeout=30, message="the line written after the cut")
    finally:
        code = following.interrupt()
    assert code == 0 and following.text == "a long line before the cut\nnew\n", (code, following.text)
