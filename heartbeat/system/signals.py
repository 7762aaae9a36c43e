"""The daemon's signals from its first instant: caught before anything slow, answered once it serves.

``heartbeat run`` spends a second or more (imports, the config, the store, the parts) before
:meth:`heartbeat.daemon.Daemon.serve` installs its handlers; a SIGHUP in that window (a
``systemctl reload`` right after a start, a log rotation at boot) killed the daemon with
nothing logged. :func:`catch_early`, the entry's first act for ``run``, installs handlers that
only record SIGHUP, SIGTERM and SIGINT; the daemon takes what was recorded (:func:`take`) when
it installs its own, and answers it: a stop before anything starts, a reload after it does.
What remains is the interpreter's own start, before any of heartbeat runs (tens of ms).

The module is stdlib-only and small: the entry imports it before anything else.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from types import FrameType

__all__ = ["CAUGHT", "catch_early", "is_run", "release", "stop_requested", "take"]

CAUGHT = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
"""The signals the daemon answers (SIGHUP reloads, SIGTERM/SIGINT stop)."""

_GLOBAL_FLAGS = ("--config", "--state-dir")
"""The command line's global options that take a value (:data:`heartbeat.cli.parser.GLOBAL_OPTIONS`)."""

_recorded: list[int] = []
_installed = False


def is_run(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (without the program) is ``heartbeat [global options] run ...``."""
    args = iter(argv)
    for arg in args:
        if arg in _GLOBAL_FLAGS:
            next(args, None)
        elif arg.startswith(tuple(f"{flag}=" for flag in _GLOBAL_FLAGS)):
            continue
        else:
            return arg == "run"
    return False


def _record(signum: int, _frame: FrameType | None) -> None:
    _recorded.append(signum)


def catch_early() -> None:
    """Record SIGHUP, SIGTERM and SIGINT from now on, until the daemon installs its own handlers."""
    global _installed
    for sig in CAUGHT:
        signal.signal(sig, _record)
    _installed = True


def stop_requested() -> int | None:
    """The first SIGTERM/SIGINT recorded so far (still recorded), or None."""
    return next((sig for sig in _recorded if sig != signal.SIGHUP), None)


def take() -> list[int]:
    """The signals recorded so far, in order and each kind once; the record is emptied."""
    taken = list(dict.fromkeys(_recorded))
    _recorded.clear()
    return taken


def release() -> list[int]:
    """Put the default handlers back where :func:`catch_early` installed its own (``run --once``
    answers no SIGHUP); the signals recorded, as :func:`take` gives them."""
    global _installed
    if _installed:
        for sig in CAUGHT:
            if signal.getsignal(sig) is _record:
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        _installed = False
    return take()
