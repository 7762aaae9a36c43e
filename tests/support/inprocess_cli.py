"""The ``heartbeat`` command run inside the test's own process (the ``cli`` fixture, tests/conftest.py).

:func:`run` calls the entry's ``main`` (``heartbeat/__main__.py``, the same one ``python -m heartbeat``
runs: the pulse, the relay, then the CLI) with argv, environment, working directory and stdin set,
and returns the exit code with everything written to stdout and stderr, through ``sys.stdout`` or
straight to file descriptors 1 and 2 (the relay does). :func:`process_state_kept` puts back every
process-wide thing a command may change: ``os.environ``, the working directory, ``sys.argv``,
``sys.path``, the umask, signal handlers and mask, logging and structlog's configuration, warning
filters and the ``inspect`` stand-in the entry may leave in ``sys.modules``.

About 100 times cheaper than a subprocess (no interpreter start, no imports), so it is the default
for CLI behaviour; a subprocess stays where the process is the point: the real entry's exit codes
under signals, the hot path's imports, inheritance of descriptors and environment.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Restore, on the way out, every process-wide setting a ``heartbeat`` command may change."""
    import structlog

    env = dict(os.environ)
    cwd = os.getcwd()
    argv, path = sys.argv[:], sys.path[:]
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals() if s not in _UNCATCHABLE}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    manager = logging.Logger.manager
    loggers = {name: (lg.level, lg.handlers[:], lg.propagate, lg.disabled)
               for name, lg in [("", logging.root), *manager.loggerDict.items()] if isinstance(lg, logging.Logger)}
    disable = manager.disable
    structlog_config, structlog_configured = structlog.get_config(), structlog.is_configured()
    inspect_module = sys.modules.get("inspect")
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv[:], sys.path[:] = argv, path
        os.umask(umask)
        for signum, handler in handlers.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for name, (level, kept, propagate, disabled) in loggers.items():
            lg = logging.root if name == "" else logging.getLogger(name)
            lg.setLevel(level)
            lg.handlers[:] = kept
            lg.propagate, lg.disabled = propagate, disabled
        manager.disable = disable
        structlog.reset_defaults()
        if structlog_configured:
            structlog.configure(**structlog_config)
        if inspect_module is not None:
            sys.modules["inspect"] = inspect_module


@contextmanager
def _fd_captured(fd: int) -> Iterator[Any]:
    """File descriptor ``fd`` pointed at a temp file while inside; yields the file."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(fd)
        os.dup2(sink.fileno(), fd)
        try:
            yield sink
        finally:
            os.dup2(saved, fd)
            os.close(saved)


def _text_stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape", write_through=True)


def _read(stream: io.TextIOWrapper, sink: Any) -> str:
    stream.flush()
    sink.seek(0)
    raw = stream.buffer.getvalue() + sink.read()  # type: ignore[attr-defined]
    return raw.decode("utf-8", errors="replace")


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: str, input: str | None = None) -> tuple[int, str, str]:
    """``heartbeat ARGV...`` in this process with exactly ``env`` as its environment, in ``cwd``,
    ``input`` on stdin (empty when None): its exit code, stdout and stderr."""
    from heartbeat.__main__ import main

    stdout, stderr = _text_stream(), _text_stream()
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    with process_state_kept(), ExitStack() as stack:
        out_fd, err_fd = stack.enter_context(_fd_captured(1)), stack.enter_context(_fd_captured(2))
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv[:] = ["heartbeat", *argv]
        saved = sys.stdin, sys.stdout, sys.stderr
        sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        try:
            code = main()
        except SystemExit as exc:  # argparse's --help and --version, as the real entry exits
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except Exception:  # as the interpreter would: the traceback on stderr, exit 1
            traceback.print_exc(file=sys.stderr)
            code = 1
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved
        return int(code), _read(stdout, out_fd), _read(stderr, err_fd)
