"""``type = "systemd-run"``: each agent runs in its own transient service unit.

The unit is ``heartbeat-<id>-<epoch>.service``, started with::

    systemd-run --unit=heartbeat-<id>-<epoch> --collect --quiet [--user] [--slice=S]
        --description=... [-p KEY=VALUE for each of properties]
        -p TimeoutStopSec=<stop_grace> -p WorkingDirectory=<cwd>
        -p StandardOutput=append:<log> -p StandardError=append:<log>
        [-p StandardInput=file:<brief_file>]  (brief = "stdin")
        --setenv=NAME ...  -- <python> -I -S <shim> --grace G <exit_file> -- <argv...>

The agent is then systemd's child: it survives the daemon, systemd accounts its
resources (``properties`` such as ``MemoryMax``), and ``systemctl stop`` kills the whole
cgroup, SIGKILL after ``TimeoutStopSec``. The shim still records the exit status.

Values never travel on the command line: each variable is passed as ``--setenv=NAME``
alone, which makes ``systemd-run`` take the value from its own environment (set to the
agent's environment for that call), so secrets do not show in ``ps``. Because systemd
expands ``$VAR`` and ``${VAR}`` in a service's command line, every ``$`` of the agent's
argv is doubled (``$$`` is systemd's literal dollar): a baton value is never expanded.

Options: ``user = true`` (the user's service manager: ``--user`` on every call),
``slice = "agents.slice"``, ``properties = { MemoryMax = "2G", CPUQuota = "50%" }``.
``--setenv=NAME`` without a value needs systemd 245 or newer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from heartbeat.config.shape import LauncherConfig
from heartbeat.launchers.base import (
    ExitStatus,
    LaunchError,
    LaunchRequest,
    build_argv,
    build_env,
    prepare_log,
    read_exit_file,
    resolve_cwd,
    write_private_file,
)
from heartbeat.launchers.exec import shim_command
from heartbeat.launchers.liveness import identify, is_alive, this_host
from heartbeat.model import defaults
from heartbeat.model.baton import Owner
from heartbeat.model.errors import ConfigError
from heartbeat.model.timeparse import utcnow
from heartbeat.system.systemd import without_plumbing

__all__ = ["SystemdRunLauncher", "unit_name", "ALIVE_STATES"]

ALIVE_STATES = frozenset({"active", "activating", "deactivating", "reloading", "refreshing"})
"""Unit states in which the agent's processes may still exist (``deactivating``: being stopped)."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROPERTY_KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*")


def unit_name(task_id: str, epoch: int) -> str:
    """``heartbeat-<id>-<epoch>``: task ids use only characters unit names allow."""
    return f"heartbeat-{task_id}-{epoch}"


def _escape_dollars(arg: str) -> str:
    return arg.replace("$", "$$")


def _systemd_time(seconds: float) -> str:
    return f"{max(0, round(seconds * 1000))}ms"


def _unit_path(value: str, what: str, task: str) -> str:
    """A path that goes into a unit property: one line of printable text."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise LaunchError(f"{what} {value!r} holds a control character, which a unit property cannot carry",
                          task=task)
    return value


class SystemdRunLauncher:
    """Starts each agent as a transient systemd service (see the module doc)."""

    def __init__(self, config: LauncherConfig) -> None:
        self.name = config.name
        self.config = config
        where = f"launchers.{config.name}"
        options = dict(config.options)
        unknown = set(options) - {"user", "slice", "properties"}
        if unknown:
            raise ConfigError(f"unknown option {sorted(unknown)[0]!r} (known: properties, slice, user)", field=where)
        user = options.get("user", False)
        if not isinstance(user, bool):
            raise ConfigError(f"expected true or false, got {user!r}", field=f"{where}.user")
        self.user: bool = user
        slice_ = options.get("slice", "")
        if not isinstance(slice_, str) or (slice_ and not re.fullmatch(r"[A-Za-z0-9:_.\\-]+\.slice", slice_)):
            raise ConfigError(f"expected a slice unit name such as \"agents.slice\", got {slice_!r}",
                              field=f"{where}.slice")
        self.slice: str = slice_
        self.properties: list[str] = self._properties(options.get("properties", {}), f"{where}.properties")

    @staticmethod
    def _properties(value: Any, where: str) -> list[str]:
        """``properties`` as ``KEY=VALUE`` strings: from a table, or a list of such strings."""
        items: list[tuple[str, str]] = []
        if isinstance(value, Mapping):
            for key, val in value.items():
                if isinstance(val, bool):
                    text = "yes" if val else "no"
                elif isinstance(val, (int, float, str)):
                    text = str(val)
                else:
                    raise ConfigError(f"expected a string, number or boolean, got {val!r}", field=f"{where}.{key}")
                items.append((str(key), text))
        elif isinstance(value, list):
            for entry in value:
                if not isinstance(entry, str) or "=" not in entry:
                    raise ConfigError(f"expected \"KEY=VALUE\" strings, got {entry!r}", field=where)
                key, _, text = entry.partition("=")
                items.append((key, text))
        else:
            raise ConfigError("expected a table such as { MemoryMax = \"2G\" }", field=where)
        for key, text in items:
            if not _PROPERTY_KEY.fullmatch(key):
                raise ConfigError(f"bad property name {key!r}", field=where)
            if any(ord(ch) < 32 for ch in text):
                raise ConfigError(f"the value of {key} holds a control character", field=where)
        return [f"{key}={text}" for key, text in items]

    def _base(self, program: str) -> list[str]:
        return [program, "--user"] if self.user else [program]

    def command(self, req: LaunchRequest, *, program: str = "systemd-run") -> tuple[list[str], dict[str, str]]:
        """The ``systemd-run`` argv and the environment to run it with (checks cwd; writes nothing)."""
        argv = build_argv(self.config, req)
        agent_env = build_env(self.config, req)
        cwd = _unit_path(resolve_cwd(self.config, req), "working directory", req.task_id)
        log = _unit_path(req.log_file, "log file", req.task_id)
        unit = unit_name(req.task_id, req.epoch)
        cmd = [
            *self._base(program),
            f"--unit={unit}", "--collect", "--quiet",
            f"--description=heartbeat {req.task_id} epoch {req.epoch}",
        ]
        if self.slice:
            cmd.append(f"--slice={self.slice}")
        for prop in self.properties:
            cmd += ["-p", prop]
        cmd += [
            "-p", f"TimeoutStopSec={_systemd_time(self.config.stop_grace)}",
            "-p", f"WorkingDirectory={cwd}",
            "-p", f"StandardOutput=append:{log}",
            "-p", f"StandardError=append:{log}",
        ]
        if self.config.brief == "stdin":
            cmd += ["-p", f"StandardInput=file:{_unit_path(req.brief_file, 'brief file', req.task_id)}"]
        # systemd-run copies each named variable from its own environment: values stay off argv.
        names = sorted(name for name in agent_env if _ENV_NAME.fullmatch(name))
        cmd += [f"--setenv={name}" for name in names]
        cmd += ["--", *(_escape_dollars(arg) for arg in shim_command(self.config, req.exit_file, argv,
                                                                                lease_file=req.lease_file,
                                                                                lease_ttl=req.lease_ttl))]
        client_env = without_plumbing(os.environ)
        client_env.update({name: agent_env[name] for name in names})
        return cmd, client_env

    def launch(self, req: LaunchRequest) -> Owner:
        program = shutil.which("systemd-run")
        if program is None:
            raise LaunchError("systemd-run not found on PATH (launcher type \"systemd-run\")", task=req.task_id)
        cmd, client_env = self.command(req, program=program)
        os.close(prepare_log(req))  # create logs/<id>/ (0700) and the log (0600) before systemd appends to it
        if self.config.brief == "stdin":
            try:
                write_private_file(req.brief_file, req.brief_text, state_dir=req.state_dir, task=req.task_id)
            except OSError as exc:
                raise LaunchError(f"cannot write the brief {req.brief_file}: {exc.strerror}", task=req.task_id)
        try:
            done = subprocess.run(cmd, env=client_env, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=defaults.SYSTEMD_START_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"systemd-run did not answer within {defaults.SYSTEMD_START_TIMEOUT:g}s",
                              task=req.task_id) from None
        except OSError as exc:
            raise LaunchError(f"cannot run systemd-run: {exc.strerror}", task=req.task_id) from None
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise LaunchError(f"systemd-run failed (exit {done.returncode}): {why[-1] if why else 'no message'}",
                              task=req.task_id)
        unit = unit_name(req.task_id, req.epoch)
        pid = self._main_pid(unit)
        found = identify(pid) if pid else None
        return Owner(
            pid=pid,
            create_time=found[1] if found else None,
            host=this_host(),
            launcher=self.name,
            unit=unit,
            session=req.session,
            how="dispatch",
            started_at=utcnow(),
        )

    def _systemctl(self, *args: str,
                   timeout: float = defaults.SYSTEMD_QUERY_TIMEOUT) -> subprocess.CompletedProcess[str] | None:
        """Run systemctl; None when it cannot be run or does not answer in time."""
        try:
            return subprocess.run(self._base("systemctl") + list(args), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout, check=False,
                                  env=without_plumbing(os.environ))
        except (OSError, subprocess.TimeoutExpired):
            return None

    def _main_pid(self, unit: str) -> int | None:
        done = self._systemctl("show", "--property=MainPID", "--value", unit)
        if done is None or done.returncode != 0:
            return None
        text = done.stdout.strip()
        return int(text) if text.isdigit() and int(text) > 0 else None

    def alive(self, owner: Owner) -> bool:
        if owner.host and owner.host != this_host():
            return True  # another machine's unit: its daemon (or lease) decides
        if not owner.unit:
            return is_alive(owner)
        done = self._systemctl("is-active", owner.unit)
        if done is None:
            # systemctl did not answer: fall back on the pid, and when there is none, do not
            # declare dead what may be running (that would launch a second agent).
            return is_alive(owner) if owner.pid else True
        return done.stdout.strip() in ALIVE_STATES

    def exit_status(self, owner: Owner, exit_file: str) -> ExitStatus | None:
        return read_exit_file(exit_file)

    def stop(self, owner: Owner, *, grace: float) -> bool:
        """``systemctl stop``: systemd sends SIGTERM to the cgroup and SIGKILL after the unit's
        ``TimeoutStopSec`` (set from ``stop_grace`` at launch; ``grace`` bounds how long we wait)."""
        if not owner.unit:
            from heartbeat.launchers.liveness import stop_process_group

            return owner.pid is None or stop_process_group(owner.pid, owner.create_time, grace)
        if owner.host and owner.host != this_host():
            return False
        self._systemctl("stop", owner.unit, timeout=max(grace, self.config.stop_grace) + defaults.SYSTEMD_STOP_MARGIN)
        return not self.alive(owner)

    def kill(self, owner: Owner) -> bool:
        """``systemctl kill --signal=SIGKILL``: every process of the unit at once, no SIGTERM."""
        if not owner.unit:
            from heartbeat.launchers.liveness import stop_process_group

            return owner.pid is None or stop_process_group(owner.pid, owner.create_time, 0.0, term=False)
        if owner.host and owner.host != this_host():
            return False
        self._systemctl("kill", "--signal=SIGKILL", owner.unit, timeout=defaults.SYSTEMD_STOP_MARGIN)
        return not self.alive(owner)

    def reap(self) -> None:
        return None  # systemd is the agents' parent; systemd-run and systemctl are waited for
