"""heartbeat.system.logging: JSON lines for journald, console on a real TTY, capture for tests."""

from __future__ import annotations

import io
import json
import logging as stdlib_logging
import os
import pty
import select
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from conftest import clean_env, wait_for

from heartbeat.model.errors import BadInput
from heartbeat.system import logging as hlog


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Each test configures the process-wide structlog; put everything back afterwards."""
    config = structlog.get_config()
    state = (hlog._state.stream, hlog._state.renderer, hlog._state.captured)
    root = stdlib_logging.getLogger()
    root_level, root_handlers = root.level, list(root.handlers)
    yield
    structlog.configure(**config)
    hlog._state.stream, hlog._state.renderer, hlog._state.captured = state
    root.handlers[:] = root_handlers
    root.setLevel(root_level)


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def read_pty(master: int, until: bytes, timeout: float = 20.0) -> bytes:
    """Read from a pty master until ``until`` shows up (or the slave side closes)."""
    chunks: list[bytes] = []

    def got() -> bool:
        if not select.select([master], [], [], 0.05)[0]:
            return False
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the slave side
            return True
        chunks.append(data)
        return until in b"".join(chunks) or not data

    wait_for(got, timeout=timeout, message=f"{until!r} on the pty")
    return b"".join(chunks)


class TestJson:
    def test_one_object_per_line_with_keys(self) -> None:
        """Each event is one JSON object on its own line with timestamp, level, event, logger and bound keys."""
        buf = io.StringIO()
        assert hlog.configure("json", stream=buf) == "json"
        log = hlog.get_logger()
        log.info("dispatched", task="fix-fallback", epoch=3, attempt=2, reason="owner_dead")
        log.warning("spinning", task="t2", step="s")
        first, second = lines(buf)
        assert first["event"] == "dispatched"
        assert first["level"] == "info"
        assert first["logger"] == "heartbeat"
        assert {"task": "fix-fallback", "epoch": 3, "attempt": 2, "reason": "owner_dead"}.items() <= first.items()
        assert list(first)[:4] == ["timestamp", "level", "event", "logger"]
        assert second["level"] == "warning" and second["step"] == "s"

    def test_timestamp_is_iso_utc(self) -> None:
        """The timestamp is ISO 8601 in UTC and close to now."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        hlog.get_logger().info("tick")
        stamp = lines(buf)[0]["timestamp"]
        assert stamp.endswith("Z")
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        assert when.utcoffset() is not None and when.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        assert abs((datetime.now(UTC) - when).total_seconds()) < 60

    def test_logger_name(self) -> None:
        """get_logger(name) puts the name in every event."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        hlog.get_logger("heartbeat.launchers").info("started", pid=42)
        assert lines(buf)[0]["logger"] == "heartbeat.launchers"

    def test_bound_keys_and_contextvars(self) -> None:
        """Keys bound on a logger and in structlog's contextvars both appear."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        structlog.contextvars.bind_contextvars(tick=7)
        try:
            hlog.get_logger().bind(task="t").info("decided", action="nothing")
        finally:
            structlog.contextvars.clear_contextvars()
        assert {"tick": 7, "task": "t", "action": "nothing"}.items() <= lines(buf)[0].items()

    def test_exception_is_one_field_on_one_line(self) -> None:
        """log.exception renders the traceback as one string field; the output stays one line."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        try:
            raise RuntimeError("launcher exploded\nsecond line")
        except RuntimeError:
            hlog.get_logger().exception("dispatch_failed", task="t")
        assert len(buf.getvalue().splitlines()) == 1
        event = lines(buf)[0]
        assert event["level"] == "error"
        assert event["exception"].startswith("Traceback (most recent call last):")
        assert "RuntimeError: launcher exploded\nsecond line" in event["exception"]
        assert "exc_info" not in event

    def test_exc_info_with_an_exception_object(self) -> None:
        """exc_info may be an exception instance, logged at any level."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        err = ValueError("bad baton")
        hlog.get_logger().warning("invalid", exc_info=err)
        assert "ValueError: bad baton" in lines(buf)[0]["exception"]

    def test_newlines_and_odd_values_stay_on_one_line(self) -> None:
        """Newlines, datetimes, paths, sets and undecodable text render without breaking the line."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        when = datetime(2026, 11, 29, 7, 0, tzinfo=UTC)
        hlog.get_logger().info("odd\nevent", note="a\nb", when=when, path=Path("/x"), tags={"a"},
                               raw=b"\xff", name="bad\udcffname")
        assert len(buf.getvalue().splitlines()) == 1
        event = lines(buf)[0]
        assert event["event"] == "odd\nevent" and event["note"] == "a\nb"
        assert event["when"] == "2026-11-29T07:00:00+00:00"
        assert event["path"] == "/x" and event["tags"] == ["a"]
        assert event["name"] == "bad\udcffname"

    def test_level_filters(self) -> None:
        """Events below the configured level are not written."""
        buf = io.StringIO()
        hlog.configure("json", level="warning", stream=buf)
        log = hlog.get_logger()
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        assert [e["event"] for e in lines(buf)] == ["w", "e"]

    def test_debug_level(self) -> None:
        """level=debug lets debug events through."""
        buf = io.StringIO()
        hlog.configure("json", level="DEBUG", stream=buf)
        hlog.get_logger().debug("d")
        assert lines(buf)[0]["level"] == "debug"

    def test_auto_is_json_when_not_a_tty(self) -> None:
        """auto picks JSON for a stream that is not a terminal."""
        assert hlog.configure("auto", stream=io.StringIO()) == "json"

    @pytest.mark.parametrize(("fmt", "level"), [("xml", "info"), ("json", "loud"), ("auto", "")])
    def test_bad_format_or_level(self, fmt: str, level: str) -> None:
        """An unknown format or level is refused with BadInput naming it."""
        with pytest.raises(BadInput, match=r"log (format|level)"):
            hlog.configure(fmt, level=level, stream=io.StringIO())

    def test_closed_stream_does_not_raise(self) -> None:
        """Writing to a closed stream drops the line instead of raising into the daemon."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        buf.close()
        hlog.get_logger().info("lost")


class TestReconfigure:
    def test_cached_logger_follows_new_stream_and_format(self) -> None:
        """A logger cached under one configuration writes where, and how, the latest configure says."""
        first, second = io.StringIO(), io.StringIO()
        hlog.configure("json", stream=first)
        log = hlog.get_logger("heartbeat.daemon")
        log.info("one")
        hlog.configure("console", stream=second)
        log.info("two", task="t")
        assert [e["event"] for e in lines(first)] == ["one"]
        text = second.getvalue()
        assert "two" in text and "task" in text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text.splitlines()[0])


class TestConsole:
    def test_console_on_a_real_pty_in_process(self) -> None:
        """auto picks the console renderer on a real terminal, and its output is not JSON."""
        master, slave = pty.openpty()
        with os.fdopen(slave, "w", buffering=1) as stream, os.fdopen(master, "rb", buffering=0) as reader:
            assert hlog.configure("auto", stream=stream) == "console"
            hlog.get_logger().info("dispatched", task="t1", epoch=2)
            line = read_pty(reader.fileno(), b"\n").decode(errors="replace").splitlines()[0]
        assert "dispatched" in line and "t1" in line
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)

    def test_console_in_a_child_whose_stdout_is_a_pty(self) -> None:
        """A process whose stdout is a terminal logs for humans by default."""
        master, slave = pty.openpty()
        code = ("from heartbeat.system.logging import configure, get_logger\n"
                "print(configure(), flush=True)\n"
                "get_logger().info('hello', task='t1')\n")
        try:
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=slave, stderr=subprocess.PIPE,
                                    env=clean_env(NO_COLOR="1"), cwd=str(Path(__file__).parents[2]))
            os.close(slave)
            output = read_pty(master, b"t1").decode(errors="replace")
            assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            os.close(master)
        first, second = output.splitlines()[:2]
        assert first.strip() == "console"
        assert "hello" in second and "task" in second and "t1" in second
        with pytest.raises(json.JSONDecodeError):
            json.loads(second)

    def test_json_in_a_child_whose_stdout_is_a_pipe(self) -> None:
        """A process whose stdout is a pipe (journald) writes JSON lines by default."""
        code = ("from heartbeat.system.logging import configure, get_logger\n"
                "configure()\n"
                "get_logger().info('hello', task='t1')\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(),
                              timeout=60, cwd=str(Path(__file__).parents[2]))
        assert proc.returncode == 0, proc.stderr
        event = json.loads(proc.stdout)
        assert event["event"] == "hello" and event["task"] == "t1"


class TestStdlibBridge:
    def test_library_warnings_become_json(self) -> None:
        """A standard-library warning comes out as a JSON line with its logger name, a fixed
        event name and its text as a field (APScheduler's own: tests/integration/test_log_volume.py)."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        stdlib_logging.getLogger("apscheduler.scheduler").warning("Run time of job %s was missed", "tick")
        event = lines(buf)[0]
        assert event == {**event, "event": "library_log", "message": "Run time of job tick was missed",
                         "level": "warning", "logger": "apscheduler.scheduler"}

    def test_library_info_is_dropped(self) -> None:
        """Library chatter below WARNING stays out of the journal even at level=info."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        stdlib_logging.getLogger("apscheduler.executors").info("Running job")
        assert buf.getvalue() == ""

    def test_library_exception(self) -> None:
        """A library's logged exception keeps its traceback as one field."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        try:
            raise OSError("inotify limit")
        except OSError:
            stdlib_logging.getLogger("watchdog.observers").exception("observer died")
        event = lines(buf)[0]
        assert event["level"] == "error" and "OSError: inotify limit" in event["exception"]

    def test_bridge_installed_once(self) -> None:
        """Configuring twice does not duplicate library lines."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        hlog.configure("json", stream=buf)
        stdlib_logging.getLogger("x").error("once")
        assert len(lines(buf)) == 1

    def test_bridge_can_be_left_out(self) -> None:
        """stdlib=False leaves the standard library's logging alone."""
        root = stdlib_logging.getLogger()
        before = list(root.handlers)
        hlog.configure("json", stream=io.StringIO(), stdlib=False)
        assert root.handlers == before


class TestCapture:
    def test_collects_events_instead_of_writing(self) -> None:
        """capture() returns the events as dicts and writes nothing meanwhile."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        log = hlog.get_logger()
        log.info("before")
        with hlog.capture() as events:
            log.info("dispatched", task="t", epoch=1)
            hlog.get_logger("heartbeat.new").debug("fresh")
        log.info("after")
        assert [e["event"] for e in lines(buf)] == ["before", "after"]
        assert events[0] == {"event": "dispatched", "level": "info", "logger": "heartbeat", "task": "t", "epoch": 1}
        assert events[1]["event"] == "fresh" and events[1]["level"] == "debug"

    def test_works_without_configure(self) -> None:
        """capture() works in a process that never called configure()."""
        structlog.reset_defaults()
        with hlog.capture() as events:
            hlog.get_logger().warning("w", task="t")
        assert events == [{"event": "w", "level": "warning", "logger": "heartbeat", "task": "t"}]

    def test_loggers_first_used_while_capturing_are_not_stuck(self) -> None:
        """A logger first used inside capture() writes normally once capture() is over."""
        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        log = hlog.get_logger("heartbeat.late")
        with hlog.capture() as events:
            log.info("inside")
        log.info("outside")
        assert [e["event"] for e in events] == ["inside"]
        assert [e["event"] for e in lines(buf)] == ["outside"]
