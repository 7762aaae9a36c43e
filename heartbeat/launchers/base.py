"""The launcher contract, and the argv and environment every launcher builds the same way.

A launcher starts an agent for one dispatch and answers for it afterwards: is it alive,
how did it end, stop it. The daemon holds one launcher object per ``[launchers.NAME]``
and calls it only through :class:`Launcher`.

Safety rules every launcher keeps (they are enforced here, not left to each type):

- The program is ``argv[0]`` of the operator's config. Baton values reach the agent
  only as the text of single arguments (placeholders are substituted per argument) or
  in the environment; never through a shell.
- The agent's environment never holds the daemon's systemd plumbing
  (``NOTIFY_SOCKET``, ``WATCHDOG_*``, ``LISTEN_*``): an agent must not speak to systemd
  for the daemon.
- Logs are private: ``logs/<id>/`` is 0700 and each log file 0600, and bounded: the
  daemon cuts a running agent's log past ``max_log_bytes`` (:func:`cap_log`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from heartbeat.config.shape import LauncherConfig, expand_argv
from heartbeat.model.baton import Baton, Owner
from heartbeat.model.errors import HeartbeatError, UnsafePath
from heartbeat.system.layout import LOGS_DIR, log_name
from heartbeat.system.safefile import open_dir, open_regular, read_regular, write_atomic, write_file_atomic
from heartbeat.system.systemd import PLUMBING_ENV

__all__ = [
    "LaunchRequest",
    "ExitStatus",
    "Launcher",
    "LaunchError",
    "kill_now",
    "PROTOCOL_METHODS",
    "MAX_ARG_BYTES",
    "placeholder_values",
    "build_argv",
    "build_env",
    "resolve_cwd",
    "prepare_log",
    "open_log_dir",
    "read_exit_file",
    "write_private_file",
    "cap_log",
    "cap_running_logs",
]

PROTOCOL_METHODS = ("launch", "alive", "exit_status", "stop", "reap")
"""What a launcher class must provide; the registry checks for these."""

MAX_ARG_BYTES = 128 * 1024 - 1
"""Linux refuses a single argument of 128 KiB or more (``MAX_ARG_STRLEN``) with E2BIG."""


@dataclass
class LaunchRequest:
    """Everything a launcher needs for one dispatch; the daemon builds it from the baton."""

    task_id: str
    epoch: int
    attempt: int
    workdir: str
    brief_text: str
    """The brief's markdown."""
    brief_file: str
    """Where the daemon wrote the brief: ``<state_dir>/logs/<id>/<epoch>.brief.md``."""
    log_file: str
    """``<state_dir>/logs/<id>/<epoch>.log``: the launcher opens it for append, 0600."""
    exit_file: str
    """``<state_dir>/logs/<id>/<epoch>.exit``: the shim writes the exit status here."""
    state_dir: str
    config_path: str
    session: str = ""
    """The agent session of this dispatch (the ``{session}`` placeholder): a new id, or the one resumed."""
    resume: bool = False
    """The dispatch resumes ``session``: a preset launcher runs its resume argv."""
    lease_file: str = ""
    """``<state_dir>/logs/<id>/<epoch>.lease`` on a store shared by many hosts: the shim stops the
    agent when its host's lease in it runs out (``--lease``); "" (the file store): no such watch."""
    lease_ttl: float = 0.0
    """The lease's ttl (``--ttl``): the shim accepts no deadline further off than that."""
    allow: tuple[str, ...] = ()
    """Permission rules added to a preset's own (claude's ``--allowedTools``) for this run only: an
    upstream's resumed session answering a question may run ``heartbeat answer ASKER QID``."""


@dataclass
class ExitStatus:
    """How an agent ended: an exit ``code``, or the ``signal`` that killed it."""

    code: int | None
    signal: int | None
    ended_at: datetime | None
    lease_lapsed: bool = False
    """Its shim stopped it because its host's lease lapsed (``"stopped": "lease"``): not its own end."""
    launch_error: str = ""
    """The agent never ran: why its program could not be started (the shim's reason)."""


@runtime_checkable
class Launcher(Protocol):
    """Starts agents for one ``[launchers.NAME]`` and answers for them afterwards.

    A launcher is built as ``Type(config)``. Every method may be called for an owner
    this object did not launch (the daemon restarted and re-adopted the agent from its
    baton), so answers come from the system, not from memory, wherever they can.
    """

    name: str
    config: LauncherConfig

    def launch(self, req: LaunchRequest) -> Owner:
        """Start the agent; return its owner (pid, create_time, host, launcher, unit, how, started_at).

        Raises :class:`LaunchError` (one line naming the task and what is wrong) when the
        agent cannot be started: a missing working directory, an unusable argument. A
        program that does not exist is *not* a launch error: it is recorded as exit 127.
        """
        ...

    def alive(self, owner: Owner) -> bool:
        """True while the owner's agent runs. Never blocks for more than about two seconds."""
        ...

    def exit_status(self, owner: Owner, exit_file: str) -> ExitStatus | None:
        """How the agent ended, or None while it runs or when that cannot be known."""
        ...

    def stop(self, owner: Owner, *, grace: float) -> bool:
        """Stop the agent and everything in its process group: SIGTERM, ``grace`` seconds, SIGKILL.

        Never signals a process that is not the owner (a reused pid). True when it is gone.
        """
        ...

    def reap(self) -> None:
        """Collect exited children this object started, so none is left a zombie."""
        ...


def kill_now(launcher: Launcher, owner: Owner) -> bool:
    """SIGKILL the agent and everything in its group at once, with no SIGTERM whose handler could still
    act (an agent past its lease's kill deadline: another host may run its task already). A launcher
    may offer this as ``kill(owner) -> bool`` (exec and systemd-run do); one that does not is stopped
    with no grace."""
    kill = getattr(launcher, "kill", None)
    return bool(kill(owner)) if callable(kill) else launcher.stop(owner, grace=0.0)


class LaunchError(HeartbeatError):
    """An agent could not be started; the message names the task and the reason."""


def placeholder_values(req: LaunchRequest) -> dict[str, object]:
    """The values of ``{id}`` ``{brief_file}`` ``{workdir}`` ``{epoch}`` ``{attempt}`` ``{state_dir}`` ``{session}``."""
    return {
        "id": req.task_id,
        "brief_file": req.brief_file,
        "workdir": req.workdir,
        "epoch": req.epoch,
        "attempt": req.attempt,
        "state_dir": req.state_dir,
        "session": req.session,
        **_preset_values(req),
    }


def _preset_values(req: LaunchRequest) -> dict[str, object]:
    """What only a preset's own argv holds: the rail's hooks (claude's ``{rail_settings}``, codex's
    ``{codex_rail_*}``)."""
    from heartbeat.presets.common import RAIL_SETTINGS, claude_rail_settings, codex_rail_overrides

    return {RAIL_SETTINGS: claude_rail_settings(), **codex_rail_overrides()}


def build_argv(config: LauncherConfig, req: LaunchRequest) -> list[str]:
    """The agent's argv: the config's command with placeholders substituted per argument.

    With ``brief = "arg"`` the brief's text is appended as the last argument. Each value
    stays inside the one argument it was substituted into, whatever it contains
    (spaces, quotes, ``;``, ``$(...)``, newlines); ``argv[0]`` is fixed by the config.
    """
    if not config.command:
        raise LaunchError(f"launchers.{config.name}.command is empty: nothing to run", task=req.task_id)
    command = config.command
    if req.resume and config.preset:
        from heartbeat.presets.common import PresetName
        from heartbeat.presets.registry import PRESETS, preset_argv

        command = preset_argv(PRESETS[PresetName(config.preset)], config.command[0], config.args, resume=True)
    argv = expand_argv(command, placeholder_values(req))
    if req.allow and config.preset:
        argv = _with_allowed(argv, req.allow)
    if config.brief == "arg":
        argv.append(req.brief_text)
    for arg in argv:
        if "\0" in arg:
            raise LaunchError("an argument holds a NUL byte, which no program can receive", task=req.task_id)
        size = len(arg.encode("utf-8", "surrogateescape"))
        if size > MAX_ARG_BYTES:
            raise LaunchError(
                f"an argument is {size} bytes, over the system's limit of 128 KiB for one argument "
                f"(launchers.{config.name}.brief = \"{config.brief}\"; use \"file\" or \"stdin\" for long briefs)",
                task=req.task_id,
            )
    return argv


def _with_allowed(argv: list[str], rules: tuple[str, ...]) -> list[str]:
    """``argv`` with ``rules`` joined to the value of its ``--allowedTools`` (claude's), if it has one."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--allowedTools":
            out[i + 1] = ",".join((out[i + 1], *rules))
            break
    return out


def build_env(
    config: LauncherConfig, req: LaunchRequest, base_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The agent's environment.

    The daemon's own (``inherit_env = true``), only the listed names of it
    (``inherit_env = ["PATH", ...]``) or nothing (``false``); then the config's ``env``;
    then ``HEARTBEAT_TASK``, ``HEARTBEAT_EPOCH``, ``HEARTBEAT_BRIEF``,
    ``HEARTBEAT_CONFIG``, ``HEARTBEAT_STATE_DIR`` (and ``HEARTBEAT_STORE_URL`` when the
    daemon's store is a database, ``HEARTBEAT_HOST`` when the daemon has a host id). ``HEARTBEAT_*`` variables of the
    daemon's environment are never inherited (they describe the daemon, not this
    dispatch), and systemd's plumbing variables are always removed.
    """
    base = os.environ if base_env is None else base_env
    if config.inherit_env is True:
        names: list[str] = list(base)
    elif config.inherit_env is False:
        names = []
    else:
        names = [name for name in config.inherit_env if name in base]
    env = {name: base[name] for name in names if not name.startswith("HEARTBEAT_")}
    env.update(config.env)
    env.update(
        HEARTBEAT_TASK=req.task_id,
        HEARTBEAT_EPOCH=str(req.epoch),
        HEARTBEAT_BRIEF=req.brief_file,
        HEARTBEAT_STATE_DIR=req.state_dir,
    )
    if base.get("HEARTBEAT_STORE_URL"):
        env["HEARTBEAT_STORE_URL"] = base["HEARTBEAT_STORE_URL"]  # the daemon's database store
    if base.get("HEARTBEAT_HOST"):
        env["HEARTBEAT_HOST"] = base["HEARTBEAT_HOST"]  # the daemon's host id: a claim names the same host
    if req.config_path:
        env["HEARTBEAT_CONFIG"] = req.config_path
    else:
        env.pop("HEARTBEAT_CONFIG", None)
    for name in PLUMBING_ENV:
        env.pop(name, None)
    return env


def resolve_cwd(config: LauncherConfig, req: LaunchRequest) -> str:
    """The agent's working directory: the config's ``cwd`` (default ``{workdir}``), expanded.

    It must be an absolute path to an existing directory; anything else is a
    :class:`LaunchError` saying which setting to fix.
    """
    cwd = expand_argv([config.cwd], placeholder_values(req))[0]
    where = f"launchers.{config.name}.cwd = {config.cwd!r}"
    if not cwd:
        raise LaunchError(
            f"no working directory: the baton sets no workdir and {where}; set one with "
            f"`heartbeat set {req.task_id} workdir=/path` or give the launcher a fixed cwd",
            task=req.task_id, field="workdir",
        )
    if "\0" in cwd or not os.path.isabs(cwd):
        raise LaunchError(f"working directory {cwd!r} is not an absolute path ({where})",
                          task=req.task_id, field="workdir")
    try:
        st = os.stat(cwd)
    except FileNotFoundError:
        raise LaunchError(f"working directory {cwd} does not exist ({where})", task=req.task_id, field="workdir")
    except OSError as exc:
        raise LaunchError(f"working directory {cwd}: {exc.strerror} ({where})", task=req.task_id, field="workdir")
    if not stat.S_ISDIR(st.st_mode):
        raise LaunchError(f"working directory {cwd} is not a directory ({where})", task=req.task_id, field="workdir")
    return cwd


def open_log_dir(state_dir: str, directory: str, task: str) -> int:
    """A descriptor of ``directory`` (``logs/<id>``), created 0700 if missing, walked from ``state_dir``
    one component at a time without following links (:func:`heartbeat.system.safefile.open_dir`).

    A ``logs`` or ``logs/<id>`` that is a symlink (or a file, or another user's) is refused
    with a :class:`LaunchError` naming it, before anything is written. A directory outside
    the state dir (a launcher tested on its own) is created and only its last part checked.
    """
    target = os.path.abspath(directory)
    root = os.path.abspath(state_dir) if state_dir else ""
    if root and target.startswith(root.rstrip("/") + "/"):
        parts = os.path.relpath(target, root).split("/")
    else:
        root, parts = os.path.dirname(target), [os.path.basename(target)]
    try:
        if not os.path.isdir(root):
            os.makedirs(root, mode=0o700, exist_ok=True)
        return open_dir(root, *parts)
    except UnsafePath as exc:
        raise LaunchError(f"refused to launch: {exc}", task=task) from None
    except OSError as exc:
        raise LaunchError(f"cannot create the log directory {target}: {exc.strerror}", task=task) from None


def prepare_log(req: LaunchRequest) -> int:
    """Create ``logs/`` and ``logs/<id>/`` (0700) and open the log for append (0600); return the fd.

    Also removes a stale exit file at ``req.exit_file``, so an old record can never be
    read as this dispatch's outcome. Every directory is checked (no symlink, see
    :func:`open_log_dir`) before anything is written, and the log is opened relative to it
    without blocking or following a link: a FIFO planted at the log's path is refused, not
    waited on. The caller closes the fd.
    """
    log_dir = os.path.dirname(req.log_file)
    dir_fd = open_log_dir(req.state_dir, log_dir, req.task_id)
    try:
        for directory in {os.path.dirname(req.exit_file), os.path.dirname(req.brief_file)} - {log_dir, ""}:
            os.close(open_log_dir(req.state_dir, directory, req.task_id))
        try:
            if os.path.dirname(req.exit_file) == log_dir:
                os.unlink(os.path.basename(req.exit_file), dir_fd=dir_fd)
            else:
                os.unlink(req.exit_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise LaunchError(f"cannot remove the stale exit file {req.exit_file}: {exc.strerror}",
                              task=req.task_id) from None
        try:
            fd = open_regular(os.path.basename(req.log_file), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600,
                              dir_fd=dir_fd)
        except UnsafePath as exc:
            raise LaunchError(f"refused to launch: {req.log_file}: {exc.message}", task=req.task_id) from None
        except OSError as exc:
            raise LaunchError(f"cannot open the log {req.log_file}: {exc.strerror}", task=req.task_id) from None
    finally:
        os.close(dir_fd)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        pass
    return fd


def write_private_file(path: str, text: str, *, state_dir: str = "", task: str = "") -> None:
    """Write ``text`` to ``path`` (0600) atomically, in its directory opened by :func:`open_log_dir`
    (created 0700; a symlinked ``logs/<id>`` is refused with a :class:`LaunchError` before
    anything is written): a fresh temp file (exclusive, never a planted one), fsync, rename.
    No temp file outlives a failed write."""
    dir_fd = open_log_dir(state_dir, os.path.dirname(path), task)
    try:
        write_atomic(dir_fd, os.path.basename(path), text.encode("utf-8", "surrogateescape"))
    finally:
        os.close(dir_fd)


def _refused(path: str, exc: UnsafePath) -> None:
    from heartbeat.system.logging import get_logger

    get_logger("heartbeat.launchers").warning("file_refused", path=path, error=exc.message)


def read_exit_file(path: str) -> ExitStatus | None:
    """The exit record the shim wrote, or None when there is none (yet) or it is unreadable."""
    try:
        doc = json.loads(read_regular(path, 4096))
    except UnsafePath as exc:  # a FIFO planted there is refused, never waited on
        _refused(path, exc)
        return None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    code, sig, ended = doc.get("code"), doc.get("signal"), doc.get("ended_at")

    def as_int(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    ended_at = None
    if isinstance(ended, str):
        try:
            ended_at = datetime.fromisoformat(ended)
        except ValueError:
            ended_at = None
    launch_error = doc.get("launch_error")
    why = " ".join(launch_error.split())[:512] if isinstance(launch_error, str) else ""
    return ExitStatus(code=as_int(code), signal=as_int(sig), ended_at=ended_at,
                      lease_lapsed=doc.get("stopped") == "lease", launch_error=why)


_COPY_CHUNK = 1 << 20


def cap_log(path: str, max_bytes: int, *, dir_fd: int | None = None) -> int | None:
    """Cut the log at ``path`` once it is larger than ``max_bytes``; return the size it had, or None.

    The last quarter of ``max_bytes`` is copied to ``<path>.1`` (replacing the previous
    one), then the live file is truncated and starts with a line saying so. Agents write
    their logs with ``O_APPEND``, so they go on writing at the new end; whatever they
    write during the copy is lost. So an agent that prints without end uses at most
    about 1.25 times ``max_bytes`` of disk, plus what it writes between two ticks. When the
    copy fails (the disk is full) the live file is truncated all the same: the space is
    the point. Never raises; ``max_bytes`` of 0 means no cap. With ``dir_fd``, ``path`` is
    relative to that directory, and so is the copy of the tail.
    """
    if max_bytes <= 0:
        return None
    try:
        fd = open_regular(path, os.O_RDWR | os.O_APPEND, dir_fd=dir_fd)
    except (OSError, UnsafePath):
        return None
    try:
        st = os.fstat(fd)
        if st.st_size <= max_bytes:
            return None
        keep = max(max_bytes // 4, 1)
        kept_path = f"{path}.1"
        kept = _copy_tail(fd, st.st_size, keep, kept_path, dir_fd)
        os.ftruncate(fd, 0)
        where = (f"its last {keep} bytes are in {os.path.basename(kept_path)}" if kept
                 else f"its tail could not be kept in {os.path.basename(kept_path)}")
        note = f"[heartbeat: this log passed max_log_bytes ({max_bytes}) at {st.st_size} bytes and was cut; {where}]\n"
        try:
            os.write(fd, note.encode())
        except OSError:
            pass
        return st.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


def _copy_tail(fd: int, size: int, keep: int, dest: str, dir_fd: int | None) -> bool:
    def chunks() -> Iterator[bytes]:
        offset = max(size - keep, 0)
        while offset < size:
            chunk = os.pread(fd, min(_COPY_CHUNK, size - offset), offset)
            if not chunk:
                break
            yield chunk
            offset += len(chunk)

    try:
        if dir_fd is None:
            write_file_atomic(dest, chunks())
        else:
            write_atomic(dir_fd, dest, chunks())
    except OSError:
        return False
    return True


def cap_running_logs(
    state_dir: str,
    launchers: Mapping[str, LauncherConfig],
    batons: Iterable[Baton | None],
    running: Mapping[str, str],
) -> list[tuple[str, int, int]]:
    """Apply :func:`cap_log` to the current log of every running agent (``running``: task id ->
    launcher name); returns ``(task id, epoch, size it had)`` for each log that was cut."""
    from heartbeat.model import defaults

    cut = []
    for baton in batons:
        if baton is None or baton.id not in running:
            continue
        config = launchers.get(running[baton.id])
        limit = config.max_log_bytes if config is not None else defaults.MAX_LOG_BYTES
        epoch = baton.meta.epoch
        try:  # never through a symlinked logs/<id>: the tail's copy would land outside the state dir
            dir_fd = open_dir(state_dir, LOGS_DIR, baton.id, create=False)
        except (OSError, UnsafePath):
            continue
        try:
            size = cap_log(log_name(epoch), limit, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        if size is not None:
            cut.append((baton.id, epoch, size))
    return cut
