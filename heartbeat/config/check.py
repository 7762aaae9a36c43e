"""What ``check-config`` refuses beyond the config's own syntax: the commonest mistakes that a
config which parses still makes (issue 26, item 9).

Each is a :class:`Problem` naming the key, what is wrong and the fix: a launcher's program that
is not on PATH, a configured feature whose extra is not installed (``[http]``, a PostgreSQL
``[store] url``), ``[http] listen`` on TCP without a token. What only the user who runs the
daemon can check (its state dir, its hooks, the daemon itself) is ``heartbeat doctor``'s.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from heartbeat.config.shape import Config, LauncherConfig, parse_listen
from heartbeat.model.errors import HeartbeatError
from heartbeat.system.extras import Extra, install_hint

__all__ = ["Problem", "problems", "program_problem", "WEB_MODULES", "POSTGRES_MODULES"]

WEB_MODULES = ("starlette", "uvicorn", "jinja2", "prometheus_client")
"""What the web extra installs (the status page and /metrics)."""

POSTGRES_MODULES = ("psycopg", "psycopg_pool")
"""What the postgres extra installs (the PostgreSQL store)."""

_TOKEN_ENV = "HEARTBEAT_WEB_TOKEN"


@dataclass(frozen=True)
class Problem:
    """One mistake: the config key, what is wrong, and how to fix it."""

    key: str
    what: str
    fix: str

    def line(self, path: str) -> str:
        return f"{path}: {self.key}: {self.what}: {self.fix}"


def problems(config: Config, env: Mapping[str, str] | None = None) -> list[Problem]:
    """Every mistake of ``config`` this module knows (none: ``[]``)."""
    env = os.environ if env is None else env
    found = [p for lc in config.launchers.values() if (p := program_problem(lc, env)) is not None]
    found.extend(_http(config, env))
    found.extend(_store(config, env))
    return found


def program_problem(lc: LauncherConfig, env: Mapping[str, str]) -> Problem | None:
    """A launcher whose program the daemon could not start: not on PATH (or, with a path, no such
    file). A program found per task (relative, run in ``{workdir}``) or a placeholder is not checked."""
    if lc.type == "null":
        return None
    argv = lc.command
    program = argv[0] if argv else ""
    key = f"launchers.{lc.name}.{'program' if lc.preset else 'command'}"
    if not program or "{" in program:
        return None
    if "/" in program:
        if not os.path.isabs(program):
            if "{" in lc.cwd:
                return None  # relative to each task's workdir: check-config warns about that apart
            program = os.path.join(lc.cwd, program)
        if os.path.isfile(program) and os.access(program, os.X_OK):
            return None
        what = "no such file" if not os.path.exists(program) else "not an executable file"
        return Problem(key, f"{argv[0]!r}: {what}", "install it there, or fix the path (every dispatch of this "
                       "launcher would fail to launch)")
    path = lc.env.get("PATH") or env.get("PATH", os.defpath)
    if shutil.which(program, path=path):
        return None
    return Problem(key, f"{program!r} is not on PATH",
                   "install it, give its absolute path, or set PATH in the launcher's env (the daemon's PATH "
                   "is the unit's: every dispatch of this launcher would fail to launch)")


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if not _importable(m)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules (None)
        return False


def _http(config: Config, env: Mapping[str, str]) -> Iterator[Problem]:
    if not config.http.listen:
        return
    missing = _missing(WEB_MODULES)
    if missing:
        yield Problem("http.listen", f"the status page needs the web extra ({', '.join(missing)} not installed)",
                      install_hint(Extra.WEB))
    try:
        listen = parse_listen(config.http.listen, what="[http] listen")
    except HeartbeatError:
        return  # the config's own check says what is wrong with it
    if not listen.path and not (config.http.token or env.get(_TOKEN_ENV)):
        yield Problem("http.listen", f"{config.http.listen!r} is TCP and no token is set (any local user can "
                      "connect to a port, loopback too: the daemon would serve nothing)",
                      f"set [http] token in this 0600 config, or ${_TOKEN_ENV} in the daemon's environment (and "
                      "here), or listen on unix:web.sock")


def _store(config: Config, env: Mapping[str, str]) -> Iterator[Problem]:
    url = env.get("HEARTBEAT_STORE_URL", "").strip() or config.store.url
    if not url:
        return
    missing = _missing(POSTGRES_MODULES)
    if missing:
        yield Problem("store.url", f"a PostgreSQL store needs the postgres extra ({', '.join(missing)} not installed)",
                      install_hint(Extra.POSTGRES))
