"""What every group of commands shares: the store it opens, the epoch and actor of a write, JSON output."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from heartbeat.model.errors import BadInput, HeartbeatError

if TYPE_CHECKING:
    import argparse  # imported where used: argparse (with gettext) costs an agent's write more than it uses

# -- helpers ---------------------------------------------------------------------------


def _where(args: argparse.Namespace) -> tuple[str, str]:
    """The state dir and the store URL the command uses."""
    if not args.state_dir and not args.config and os.environ.get("HEARTBEAT_STATE_DIR"):
        # resolve_state_dir's answer, without importing the config module: agents the
        # daemon launched have the variable set, and their writes are the hot path.
        state_dir, url = os.path.abspath(os.environ["HEARTBEAT_STATE_DIR"]), ""
    else:
        from heartbeat.config.load import resolve_store

        state_dir, url = resolve_store(args.state_dir, args.config)
    return state_dir, url


def _store(args: argparse.Namespace, *, read: bool = False) -> Any:
    """The store; a read command (``read=True``) never creates a missing state dir, it says so."""
    from heartbeat.store import open_store

    state_dir, url = _where(args)
    if read and not (url or os.environ.get("HEARTBEAT_STORE_URL")) and _missing(state_dir):
        from heartbeat.model.errors import StoreError

        raise StoreError("no such state dir (a read never creates one: check --state-dir, "
                         "$HEARTBEAT_STATE_DIR or the config's state_dir)", path=state_dir)
    return open_store(state_dir, url)


def _missing(path: str) -> bool:
    """Whether ``path`` is surely no directory; one this user cannot look up is not (the store says why)."""
    import stat

    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except PermissionError:
        return False
    except OSError:
        return True


def _epoch(args: argparse.Namespace) -> int | None:
    if getattr(args, "epoch", None) is not None:
        if args.epoch < 0:
            raise BadInput("--epoch must not be negative")
        return int(args.epoch)
    from heartbeat.tasks.write import epoch_from_env

    return epoch_from_env(args.id)


def _actor(args: argparse.Namespace) -> str:
    from heartbeat.tasks.write import actor_from_env

    return actor_from_env(os.environ)


def _print_json(value: Any) -> None:
    from heartbeat.model.baton import json_safe

    json.dump(json_safe(value), sys.stdout, ensure_ascii=False, indent=2, default=_json_default, allow_nan=False)
    sys.stdout.write("\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _age(seconds: float) -> str:
    from heartbeat.model.timeparse import format_duration

    return format_duration(max(0.0, seconds))


def _checks(args: argparse.Namespace) -> Any:
    """The config's ``[checks.NAME]`` (for guarantees), or none when no config is found."""
    from heartbeat.tasks.handoff import configured_checks

    return configured_checks(args.config)


def _max_attempts(args: argparse.Namespace) -> int:
    """The config's max_attempts for "attempt N of M"; the default when there is no readable config."""
    from heartbeat.config.load import find_config, load_config
    from heartbeat.model import defaults

    path = find_config(args.config)
    if path is None:
        return defaults.MAX_ATTEMPTS
    try:
        return load_config(path).daemon.max_attempts
    except HeartbeatError:
        return defaults.MAX_ATTEMPTS  # a broken config must not keep an agent from its brief


def _missing_upstreams(baton: Any, ids: set[str]) -> list[str]:
    """The upstreams (``after``, or an ``after:``/``task:`` gate) an unfinished task waits on that do
    not exist: nothing will ever open its way."""
    from heartbeat.model.baton import FINISHED_STATUSES, GateKind

    if baton.meta.status in FINISHED_STATUSES:
        return []
    held = list(baton.after)
    gate = baton.meta.gate
    if gate is not None and gate.kind in (GateKind.AFTER, GateKind.TASK):
        held += [t for t in gate.target.split(",") if t and t not in held]
    return [t for t in held if t not in ids]


def _refuse_foreign(args: argparse.Namespace) -> None:
    """An agent the daemon launched changes only its own task (see :func:`heartbeat.tasks.write.refuse_foreign`)."""
    from heartbeat.tasks.write import FENCED_COMMANDS, refuse_agent_fields, refuse_foreign

    if getattr(args, "command", None) in FENCED_COMMANDS and isinstance(getattr(args, "id", None), str):
        refuse_foreign(args.id)
        if args.command == "set":
            refuse_agent_fields(args.id, (str(p).partition("=")[0] for p in getattr(args, "pairs", None) or ()))


def _cycle(baton: Any, batons: dict[str, Any]) -> list[str]:
    """The cycle of ``after`` that holds an unfinished task for ever (``[]``: none)."""
    from heartbeat.model.baton import FINISHED_STATUSES
    from heartbeat.model.errors import NotFound
    from heartbeat.tasks.handoff import held_in_cycle

    if not baton.after or baton.meta.status in FINISHED_STATUSES:
        return []

    def load(task_id: str) -> Any:
        if task_id not in batons:
            raise NotFound("no such task", task=task_id)
        return batons[task_id]

    return held_in_cycle(baton.meta.id, load)


def _progress(baton: Any) -> str:
    """"done k of n" against the plan (k: the plan's steps in ``done``), or ``""`` without a plan."""
    if not baton.plan:
        return ""
    done = set(baton.done)
    return f"done {sum(1 for step in baton.plan if step in done)} of {len(baton.plan)}"
