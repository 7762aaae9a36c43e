"""``heartbeat doctor``: what only the user who runs heartbeat can check, one line each.

``check-config`` judges the file; the doctor runs as the daemon's user (``sudo -u heartbeat
heartbeat doctor``) and looks at what that user meets: the config's mistakes
(:mod:`heartbeat.config.check`), a state dir it can create or write, the daemon (its vitals:
running, or stopped since when), and whether the agents' hooks are wired in this project. Exit
1 when any check fails, 0 otherwise; a check that does not apply says so and passes.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from heartbeat.config.check import problems
from heartbeat.daemon.vitals import Vitals
from heartbeat.model.errors import UnsafePath
from heartbeat.model.timeparse import format_duration
from heartbeat.system.safefile import read_regular

__all__ = ["Finding", "findings", "run_from_cli"]


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.what}"


def findings(config_path: str | None) -> Iterator[Finding]:
    """Each check's outcome, in the order a person fixes them."""
    from heartbeat.config.load import find_config, load_config, resolve_state_dir
    from heartbeat.model.errors import HeartbeatError

    path = find_config(config_path)
    if path is None:
        yield Finding(True, "no config (the defaults apply; `heartbeat init DIR` writes one)")
        config = None
    else:
        try:
            config = load_config(path)
        except HeartbeatError as exc:
            yield Finding(False, f"config: {exc}")
            return
        found = problems(config)
        for problem in found:
            yield Finding(False, f"config {problem.line(path)}")
        if not found:
            yield Finding(True, f"config {path}: no mistake check-config knows")
    try:
        state_dir = config.state_dir if config is not None else resolve_state_dir(None, config_path)
    except HeartbeatError as exc:
        yield Finding(False, f"state dir: {exc}")
        return
    yield _state_dir(state_dir)
    yield _daemon(state_dir, config.daemon.tick if config is not None else None)
    yield _hooks()


def _state_dir(state_dir: str) -> Finding:
    who = f"user {os.geteuid()}"
    if os.path.isdir(state_dir):
        if not os.access(state_dir, os.R_OK | os.W_OK | os.X_OK):
            return Finding(False, f"state dir {state_dir}: {who} cannot read and write it: run heartbeat as its owner "
                           f"(uid {os.stat(state_dir).st_uid}) or `chown -R {os.geteuid()} {state_dir}`")
        if os.stat(state_dir).st_uid != os.geteuid():
            return Finding(False, f"state dir {state_dir}: owned by uid {os.stat(state_dir).st_uid}, not {who}: heartbeat "
                           "refuses it; run as its owner")
        return Finding(True, f"state dir {state_dir}: {who} can read and write it")
    parent = os.path.dirname(os.path.abspath(state_dir)) or "/"
    if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
        return Finding(True, f"state dir {state_dir}: not made yet; {who} can create it (the first write does)")
    return Finding(False, f"state dir {state_dir}: missing, and {who} cannot create it in {parent}: "
                   f"`install -d -m 0700 -o {os.geteuid()} {state_dir}` as root")


def _daemon(state_dir: str, tick: float | None) -> Finding:
    vitals = Vitals.load(state_dir)
    if vitals is None:
        return Finding(True, "daemon: none has run on this state dir yet (`heartbeat run`, or the systemd unit)")
    alive = vitals.pid > 0 and _pid_alive(vitals.pid)
    last = vitals.last_tick_at or vitals.started_at
    age = max(0.0, time.time() - last)
    if alive:
        late = tick is not None and age > max(3 * tick, 60.0)
        return Finding(not late, f"daemon: pid {vitals.pid} running, last pass {format_duration(age)} ago"
                       + (": it has stopped ticking (see its log)" if late else ""))
    return Finding(False, f"daemon: not running (pid {vitals.pid} stopped {format_duration(age)} ago): "
                   "`systemctl start heartbeat` or `heartbeat run`")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _hooks() -> Finding:
    """Whether this project's (or this user's) Claude Code settings run heartbeat's hooks."""
    for where in (os.path.join(os.getcwd(), ".claude", "settings.json"),
                  os.path.expanduser("~/.claude/settings.json")):
        try:  # the workdir's file: a FIFO there must not hang the doctor
            text = read_regular(where, 1 << 20, follow=True).decode("utf-8", errors="replace")
        except (OSError, UnsafePath):
            continue
        if "heartbeat" in text and "hook" in text:
            return Finding(True, f"hooks: wired in {where}")
    return Finding(True, "hooks: not wired here (optional: `heartbeat hooks install claude` in a project whose "
                   "sessions a person runs on heartbeat's tasks)")


def run_from_cli(args: object) -> int:
    """``heartbeat doctor``: print each finding; exit 1 when one failed."""
    failed = False
    for finding in findings(getattr(args, "config", None)):
        print(finding.line())
        failed = failed or not finding.ok
    sys.stdout.flush()
    return 1 if failed else 0
