"""One error hierarchy: every failure the CLI reports is a :class:`HeartbeatError`.

Each class carries the exit code DESIGN.md assigns to it and renders as one line
naming the task, the file and the field where they are known.
"""

from __future__ import annotations

__all__ = [
    "EXIT_OK",
    "EXIT_ERROR",
    "EXIT_BAD_INPUT",
    "EXIT_STALE",
    "EXIT_NOT_ACTIVE",
    "EXIT_CONFLICT",
    "HeartbeatError",
    "BadInput",
    "ConfigError",
    "InvalidBaton",
    "UnreadableBaton",
    "UnsafePath",
    "NotYourTask",
    "NotFound",
    "AlreadyExists",
    "NotActive",
    "Conflict",
    "StoreError",
    "StoreUnreachable",
    "GcBusy",
    "DaemonRunning",
    "GuaranteeFailed",
    "NeedsUnmet",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_STALE = 3
EXIT_NOT_ACTIVE = 4
EXIT_CONFLICT = 5


class HeartbeatError(Exception):
    """Base of every error heartbeat reports; ``str()`` is the one-line message."""

    exit_code: int = EXIT_ERROR

    def __init__(
        self,
        message: str,
        *,
        task: str | None = None,
        path: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.task = task
        self.path = path
        self.field = field

    def __str__(self) -> str:
        where = []
        if self.path:
            where.append(str(self.path))
        elif self.task:
            where.append(self.task)
        if self.field:
            where.append(self.field)
        prefix = ": ".join(where)
        text = f"{prefix}: {self.message}" if prefix else self.message
        # One line, always: a message built from file contents must not smuggle line breaks
        # (splitlines knows them all: \r, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029).
        return " ".join(text.splitlines())


class BadInput(HeartbeatError):
    """The command's input is malformed: a usage error, a bad id, a bad value."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(BadInput):
    """The config file is missing, malformed or names something that does not exist.

    ``line`` is set when the offending key could be located, so the message reads
    ``heartbeat.toml:12: daemon.tick: ...``.
    """

    def __init__(
        self, message: str, *, path: str | None = None, field: str | None = None, line: int | None = None
    ) -> None:
        super().__init__(message, path=path, field=field)
        self.line = line

    def __str__(self) -> str:
        loc = self.path or "config"
        if self.line:
            loc = f"{loc}:{self.line}"
        text = f"{loc}: {self.field}: {self.message}" if self.field else f"{loc}: {self.message}"
        return " ".join(text.splitlines())


class InvalidBaton(BadInput):
    """A baton file exists but cannot be used: unparsable, a wrong type, unsafe.

    The file is left exactly as it is for a human to fix.
    """


class UnreadableBaton(InvalidBaton):
    """A baton file that could not be read just now (out of descriptors, permission denied, an I/O
    error): reported like an invalid baton, but never remembered as one, since the same file may
    read fine at the next scan."""


class UnsafePath(BadInput):
    """A path is refused: a symlink, not a regular file, outside its root, or writable by others."""


class NotYourTask(BadInput):
    """A write to another task from an agent the daemon launched (``$HEARTBEAT_TASK`` and
    ``$HEARTBEAT_EPOCH`` name its own task): an agent keeps only its own baton."""


class NotFound(HeartbeatError):
    """No baton with that id."""


class AlreadyExists(HeartbeatError):
    """``new`` for an id that already has a baton."""

    exit_code = EXIT_CONFLICT


class NotActive(HeartbeatError):
    """The task is blocked or otherwise not in a state that allows the operation."""

    exit_code = EXIT_NOT_ACTIVE


class Conflict(HeartbeatError):
    """The revision or epoch the caller expected has moved on: the write is refused."""

    exit_code = EXIT_CONFLICT


class StoreError(HeartbeatError):
    """The store could not complete an operation (disk full, permission, I/O)."""


class StoreUnreachable(StoreError):
    """The database could not be reached (down, refusing, timed out): worth waiting for, unlike a bad schema."""

    unapplied = False
    """Set by a write that lost its connection before its commit: nothing of it was applied, so it
    may be run again (a write lost during its commit may have landed: never retried)."""


class Busy(StoreError):
    """Another writer holds a baton's lock longer than the caller would wait (the daemon waits briefly)."""


class GcBusy(StoreError):
    """Another ``heartbeat gc`` holds the store's gc lock (on a shared store: another host's daemon)."""


class DaemonRunning(HeartbeatError):
    """Another daemon holds the state dir's daemon lock: one clock per state dir."""

    holder: str = ""
    """The pid the lock file names ("unknown" when it names none)."""


class GuaranteeFailed(HeartbeatError):
    """``done`` refused: a guarantee the task promises its consumers does not hold (its check failed)."""

    exit_code = EXIT_NOT_ACTIVE


class NeedsUnmet(HeartbeatError):
    """``done`` refused: a downstream needs a part of this task's package that is empty (a declared,
    learned or pinned need of the edge); a person may ``done --force``."""

    exit_code = EXIT_NOT_ACTIVE
