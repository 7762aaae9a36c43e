"""Structured logs: one JSON object per line for journald, or structlog's console rendering on a TTY.

The daemon logs every decision as an event with keys, e.g.
``log.info("dispatched", task=task_id, epoch=3, attempt=2, reason="owner_dead")``,
which in JSON mode is the single line::

    {"timestamp": "2026-11-29T07:00:00.123456Z", "level": "info", "event": "dispatched",
     "logger": "heartbeat", "task": "fix-fallback", "epoch": 3, "attempt": 2, "reason": "owner_dead"}

(shown wrapped here; it is one line on stdout). ``journalctl -u heartbeat -o cat | jq`` reads it back.

Design notes:

- Loggers are cached on first use (``cache_logger_on_first_use``), so a ``log.info`` costs
  one pass through a short processor chain. The chain's last two steps look up the
  current renderer and stream at call time, so calling :func:`configure` again (a test,
  a SIGHUP that changed ``log_format``) still reaches loggers that were cached earlier;
  only the level of an already-cached logger stays what it was when it was first used.
- In JSON mode an exception is one field, ``exception``, holding the formatted traceback
  as a string: the output never spans lines, whatever is logged.
- A failed write (stdout closed, journald gone) drops the line instead of raising: a
  logging failure must not take the daemon down.
- Records from the standard library's ``logging`` (APScheduler, watchdog) at WARNING and
  above go through the same pipeline, so stdout stays one JSON object per line, and
  structured: APScheduler's known warnings become named events with fields (a missed run
  is ``scheduler_job_missed`` with ``job`` and ``missed_by_s``); any other record is
  ``library_log`` with its text in ``message``.
- :func:`capture` collects events as dicts for tests, also from loggers cached before it.
"""

from __future__ import annotations

import json
import logging as stdlib_logging
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO, cast

if "structlog" not in sys.modules and "rich" not in sys.modules:
    # structlog imports rich, when it is installed, for pretty console tracebacks: some 5 MB and
    # 0.3 s that a daemon logging JSON (or anyone's CLI call) never uses; a console traceback is
    # plain text instead. rich stays importable by whoever wants it after this.
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog
    finally:
        del sys.modules["rich"]
import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

from heartbeat.model.errors import BadInput

__all__ = ["FORMATS", "LEVELS", "configure", "get_logger", "capture"]

FORMATS = ("auto", "json", "console")
"""Accepted values of ``fmt`` (and of the config's ``daemon.log_format``)."""

LEVELS: dict[str, int] = {
    "debug": stdlib_logging.DEBUG,
    "info": stdlib_logging.INFO,
    "warning": stdlib_logging.WARNING,
    "error": stdlib_logging.ERROR,
    "critical": stdlib_logging.CRITICAL,
}
"""Accepted values of ``level`` (and of the config's ``daemon.log_level``)."""

_FIRST_KEYS = ("timestamp", "level", "event", "logger")


class _State:
    """What the cached loggers look up on every call: where to write, how to render."""

    def __init__(self) -> None:
        self.stream: TextIO = sys.stdout
        self.renderer: Processor = _json_renderer()
        self.captured: list[MutableMapping[str, Any]] | None = None
        self.lock = threading.Lock()


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _json_renderer() -> Processor:
    format_exc_info = structlog.processors.ExceptionRenderer()

    def render(logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
        event_dict = format_exc_info(logger, method, event_dict)
        ordered = {key: event_dict.pop(key) for key in _FIRST_KEYS if key in event_dict}
        ordered.update(event_dict)
        # ensure_ascii: a lone surrogate from a file name must not make the write fail.
        return json.dumps(ordered, default=_json_default, ensure_ascii=True)

    return render


def _console_renderer(stream: TextIO) -> Processor:
    colors = _isatty(stream) and "NO_COLOR" not in os.environ
    return structlog.dev.ConsoleRenderer(colors=colors)


_state = _State()


def _tap(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    """While :func:`capture` runs, divert each event into its list instead of the output."""
    sink = _state.captured
    if sink is not None:
        sink.append(dict(event_dict))
        raise structlog.DropEvent
    return event_dict


def _render(logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
    return cast(str, _state.renderer(logger, method, event_dict))


class _StreamLogger:
    """Writes each rendered line to the current stream, whole, flushed, and never raises."""

    def __init__(self, name: str) -> None:
        self.name = name

    def msg(self, message: str) -> None:
        with _state.lock:
            try:
                _state.stream.write(message + "\n")
                _state.stream.flush()
            except (OSError, ValueError):
                pass

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


def _logger_factory(*args: Any) -> _StreamLogger:
    return _StreamLogger(str(args[0]) if args else "heartbeat")


def _add_logger_name(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


_LIBRARY_EVENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    'Run time of job "%s" was missed by %s': ("scheduler_job_missed", ("job", "missed_by_s")),
    'Execution of job "%s" skipped: maximum number of running instances reached (%d)':
        ("scheduler_job_skipped", ("job", "max_instances")),
    'Job "%s" raised an exception': ("scheduler_job_failed", ("job",)),
    "Error running job %s": ("scheduler_job_failed", ("job",)),
    'Error submitting job "%s" to executor "%s"': ("scheduler_submit_failed", ("job", "executor")),
    "Error getting due jobs from job store %r: %s": ("scheduler_jobstore_failed", ("jobstore", "error")),
    "Error notifying listener": ("scheduler_listener_failed", ()),
}
"""APScheduler's warnings and errors (by their format string) as named events with fields;
any other library record is the event ``library_log`` with its text in ``message``."""


def _field(value: Any) -> Any:
    """A library's argument as a log field: a job by its id, a duration in seconds."""
    if hasattr(value, "total_seconds"):
        return round(value.total_seconds(), 3)
    job_id = getattr(value, "id", None)
    if isinstance(job_id, str):
        return job_id
    return value if isinstance(value, (int, float, str)) else str(value)


_REPEATING = frozenset({"scheduler_job_skipped"})
"""Events a stuck job repeats at every beat (a renewal hanging on a database that went away):
said once per :data:`~heartbeat.model.defaults.LIBRARY_REPEAT_QUIET` per job, with the count held back."""


class _StdlibBridge(stdlib_logging.Handler):
    """Forwards standard-library log records (APScheduler, watchdog) into structlog, structured."""

    def __init__(self) -> None:
        super().__init__()
        self._said: dict[tuple[str, Any], tuple[float, int]] = {}
        """(event, job) -> (when it was last logged, on the monotonic clock; repeats held back since)."""

    def _held_back(self, event: str, fields: dict[str, Any]) -> bool:
        """Whether this repeat of ``event`` is held back; else ``fields`` gets the count held back."""
        if event not in _REPEATING:
            return False
        import time

        from heartbeat.model.defaults import LIBRARY_REPEAT_QUIET

        key, now = (event, fields.get("job")), time.monotonic()
        with _state.lock:
            said = self._said.get(key)
            if said is not None and now - said[0] < LIBRARY_REPEAT_QUIET:
                self._said[key] = (said[0], said[1] + 1)
                return True
            self._said[key] = (now, 0)
        if said is not None and said[1]:
            fields["repeats_held_back"] = said[1]
        return False

    def emit(self, record: stdlib_logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string must not break logging
            message = str(record.msg)
        event, names = _LIBRARY_EVENTS.get(record.msg, ("library_log", ())) \
            if isinstance(record.msg, str) else ("library_log", ())
        args = record.args if isinstance(record.args, tuple) else ()
        fields: dict[str, Any] = {"message": message}
        if len(args) == len(names):
            fields.update((name, _field(arg)) for name, arg in zip(names, args, strict=True))
        if self._held_back(event, fields):
            return
        # structlog knows the five standard levels only: a custom one maps to the next below it.
        levelno = max((n for n in LEVELS.values() if n <= record.levelno), default=stdlib_logging.DEBUG)
        log = get_logger(record.name)
        if record.exc_info and record.exc_info[0] is not None:
            log.log(levelno, event, exc_info=record.exc_info, **fields)
        else:
            log.log(levelno, event, **fields)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _parse_level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    try:
        return LEVELS[level.strip().lower()]
    except KeyError:
        raise BadInput(f"log level {level!r}: must be one of {', '.join(LEVELS)}")


def configure(fmt: str = "auto", level: str | int = "info", stream: TextIO | None = None, *,
              stdlib: bool = True) -> str:
    """Set up structlog for the process and return the format chosen (``json`` or ``console``).

    ``fmt="auto"`` picks ``console`` when ``stream`` is a TTY and ``json`` otherwise (under
    systemd stdout is a socket to journald). ``level`` is a name of :data:`LEVELS`.
    ``stream`` defaults to the current ``sys.stdout``. With ``stdlib`` the standard
    library's WARNING-and-above records are routed into the same output.
    Raises :class:`BadInput` for an unknown format or level.
    """
    if fmt not in FORMATS:
        raise BadInput(f"log format {fmt!r}: must be one of {', '.join(FORMATS)}")
    threshold = _parse_level(level)
    out = sys.stdout if stream is None else stream
    chosen = ("console" if _isatty(out) else "json") if fmt == "auto" else fmt
    with _state.lock:
        _state.stream = out
        _state.renderer = _console_renderer(out) if chosen == "console" else _json_renderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _add_logger_name,
            _tap,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            structlog.processors.StackInfoRenderer(),
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_logger_factory,
        context_class=dict,
        cache_logger_on_first_use=True,
    )
    if stdlib:
        _install_stdlib_bridge(max(threshold, stdlib_logging.WARNING))
    return chosen


def _install_stdlib_bridge(threshold: int) -> None:
    root = stdlib_logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StdlibBridge):
            root.removeHandler(handler)
    root.addHandler(_StdlibBridge())
    root.setLevel(threshold)


def get_logger(name: str = "heartbeat") -> FilteringBoundLogger:
    """A logger whose events carry ``logger=name``; cheap to call, cheaper to use."""
    return cast(FilteringBoundLogger, structlog.get_logger(name))


@contextmanager
def capture() -> Iterator[list[MutableMapping[str, Any]]]:
    """Collect log events as dicts (``event``, ``level``, ``logger`` and the bound keys) instead of writing them.

    Works for loggers already cached by an earlier :func:`configure` (their level still
    applies) and for new ones (which see every level while capturing). Nothing is
    written to the stream meanwhile. Usage::

        with capture() as events:
            daemon.tick(now)
        assert {"event": "dispatched", "task": "t", ...}.items() <= events[0].items()
    """
    events: list[MutableMapping[str, Any]] = []
    previous_sink = _state.captured
    previous_config = structlog.get_config()
    _state.captured = events
    # Loggers first used while capturing must not cache the capturing chain for good.
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, _add_logger_name, _tap],
        wrapper_class=structlog.make_filtering_bound_logger(stdlib_logging.DEBUG),
        logger_factory=_logger_factory,
        cache_logger_on_first_use=False,
    )
    try:
        yield events
    finally:
        _state.captured = previous_sink
        structlog.configure(**previous_config)
