"""Where everything lives under the state dir: one :class:`StateLayout`, so no module spells a path.

::

    batons/<id>.toml                   one baton per task (the file store)
    locks/<id>.lock                    flock(2) target per baton; locks/.gc.lock for gc
    logs/<id>/<epoch>.log              the agent's output (appended by the launcher)
    logs/<id>/<epoch>.brief.md         the brief the daemon wrote for that dispatch
    logs/<id>/<epoch>.pid              the agent's pid and create time (the launcher's shim)
    logs/<id>/<epoch>.exit             the agent's exit status (the shim)
    logs/<id>/<epoch>.pulse            the agent's fast touches (its mtime; :mod:`heartbeat.hotpath.pulse`)
    logs/<id>/<epoch>.trail            the agent's tool calls since its note (its hooks; :mod:`heartbeat.hotpath.trail`)
    logs/<id>/<epoch>.lease            when the agent's shim stops it unless renewed (a shared store)
    logs/<id>/answer.<asker>.<qid>.*   a run of the task's resumed session answering a question (log, exit, pid, prompt)
    ledger.sqlite3                     the ledger (the file store)
    format.toml                        the state dir's format: version and min_reader (the file store)
    daemon.lock                        one daemon per state dir (an flock)
    daemon.json                        the daemon's vitals for ``/metrics``
    archive/                           what ``heartbeat gc`` archived

A PostgreSQL store keeps batons and the ledger in the database; logs, the daemon lock
and the vitals stay in the state dir.
"""

from __future__ import annotations

import os

__all__ = ["LOGS_DIR", "StateLayout", "log_name", "pid_file_for"]

LOGS_DIR = "logs"
VITALS_NAME = "daemon.json"
"""The name of the daemon's vitals file in the state dir."""
"""The name of the logs directory in the state dir (for code that walks it relative to a directory fd)."""


class StateLayout:
    """Every path under one state dir (``root``, made absolute by the caller when it matters).

    Plain and import-light (only :mod:`os`): the agent's shim and the CLI's hot paths use it.
    """

    __slots__ = ("root",)

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"StateLayout({self.root!r})"

    # -- directories -------------------------------------------------------------------

    @property
    def batons_dir(self) -> str:
        return os.path.join(self.root, "batons")

    @property
    def locks_dir(self) -> str:
        return os.path.join(self.root, "locks")

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.root, LOGS_DIR)

    @property
    def archive_dir(self) -> str:
        return os.path.join(self.root, "archive")

    # -- files of the state dir --------------------------------------------------------

    @property
    def ledger_file(self) -> str:
        return os.path.join(self.root, "ledger.sqlite3")

    @property
    def format_file(self) -> str:
        return os.path.join(self.root, "format.toml")

    @property
    def daemon_lock(self) -> str:
        return os.path.join(self.root, "daemon.lock")

    @property
    def vitals_file(self) -> str:
        return os.path.join(self.root, VITALS_NAME)

    @property
    def gc_lock(self) -> str:
        return os.path.join(self.locks_dir, ".gc.lock")

    @property
    def links_lock(self) -> str:
        """``locks/.links.lock``: writes that change which task comes after which, one at a time."""
        return os.path.join(self.locks_dir, ".links.lock")

    # -- per task ----------------------------------------------------------------------

    def baton(self, task_id: str) -> str:
        """``batons/<id>.toml``."""
        return os.path.join(self.batons_dir, f"{task_id}.toml")

    def lock(self, task_id: str) -> str:
        """``locks/<id>.lock``."""
        return os.path.join(self.locks_dir, f"{task_id}.lock")

    def task_logs(self, task_id: str) -> str:
        """``logs/<id>``: one task's logs, briefs, pid and exit files."""
        return os.path.join(self.logs_dir, task_id)

    def log(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.log``."""
        return os.path.join(self.task_logs(task_id), log_name(epoch))

    def brief(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.brief.md``."""
        return os.path.join(self.task_logs(task_id), f"{epoch}.brief.md")

    def pid(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.pid``."""
        return os.path.join(self.task_logs(task_id), f"{epoch}.pid")

    def exit(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.exit``."""
        return os.path.join(self.task_logs(task_id), f"{epoch}.exit")

    def lease(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.lease``: the agent's lease deadlines, written by a daemon on a shared store."""
        return os.path.join(self.task_logs(task_id), f"{epoch}.lease")

    def answer(self, task_id: str, asker: str, qid: str, suffix: str) -> str:
        """``logs/<id>/answer.<asker>.<qid>.<suffix>`` (``log``, ``exit``, ``prompt.md``; the shim adds
        ``pid``): the run of ``task_id``'s resumed session that answers ``asker``'s question ``qid``."""
        return os.path.join(self.task_logs(task_id), f"answer.{asker}.{qid}.{suffix}")

    def trail(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.trail``. The hooks, on the agent's hot path, spell it themselves
        (:func:`heartbeat.hotpath.trail.trail_path`; a test pins the two equal)."""
        return os.path.join(self.task_logs(task_id), f"{epoch}.trail")

    def pulse(self, task_id: str, epoch: int) -> str:
        """``logs/<id>/<epoch>.pulse``. :mod:`heartbeat.hotpath.pulse`, on the agent's hottest path, opens it
        relative to the task's log directory itself (``pulse_name``; a test pins the two equal)."""
        return os.path.join(self.task_logs(task_id), f"{epoch}.pulse")


def log_name(epoch: int) -> str:
    """The file name of an epoch's log inside ``logs/<id>/``."""
    return f"{epoch}.log"


def pid_file_for(exit_file: str) -> str:
    """The pid file beside an exit file (``<epoch>.exit`` -> ``<epoch>.pid``). The shim, which
    imports nothing from heartbeat, keeps its own copy (:func:`heartbeat.launchers.shim.pid_file_for`)."""
    base = exit_file[: -len(".exit")] if exit_file.endswith(".exit") else exit_file
    return f"{base}.pid"
