"""The agent's write: ``set ID F=V...`` and ``add ID FIELD V...``, whoever received it.

The CLI parses it from its own arguments and runs it in the agent's process; the daemon's
relay server (:mod:`heartbeat.daemon.relay`) receives it over the socket from an agent's
``heartbeat`` command (:mod:`heartbeat.hotpath.relay`) and runs it in the daemon. Both hand a parsed
:class:`Write` to :func:`apply`: the same fence, checks, ledger rows, exit codes and one-line
errors, wherever it ran. On a database store the relay also carries an agent's ``touch``,
``done`` and ``show`` (:func:`answer`), so that an agent holds no database connection.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from heartbeat.hotpath.argv import AGENT_COMMANDS, agent_call
from heartbeat.model.errors import BadInput, HeartbeatError, StoreUnreachable

if TYPE_CHECKING:
    from heartbeat.store.base import Store

__all__ = ["Write", "parse_hot", "assignments", "apply", "epoch_from_env", "refuse_foreign", "FENCED_COMMANDS",
           "answerer_from_env",
           "actor_from_env", "relayed", "answer"]


@dataclass(frozen=True)
class Write:
    """One ``set`` (``pairs``, each ``FIELD=VALUE``) or ``add`` (``field`` and ``values``) to one task;
    from an agent on a database store also ``touch``, ``done`` (``note``) and the read ``show``."""

    command: str
    id: str
    pairs: tuple[str, ...] = ()
    field: str = ""
    values: tuple[str, ...] = ()
    check: str = ""
    expect_revision: int | None = None
    note: str = ""
    protect: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()


DECLINED = -1
""":func:`answer`'s code for a call the daemon leaves to the agent's own process, having written
nothing: a ``done`` whose guarantees have checks to run (they run where the agent runs, with the
agent's environment and config, not in the daemon's relay within its reply timeout)."""

def parse_hot(argv: Sequence[str], *, agent_commands: bool = False) -> Write | None:
    """``set ID F=V...`` or ``add ID FIELD V...`` written without any option (an agent's hot
    write, as the relay carries it), else None. ``agent_commands``: also ``touch ID``, ``show ID``,
    ``done ID`` and ``done ID --note NOTE`` (see :func:`heartbeat.hotpath.relay.relayable`)."""
    call = agent_call(tuple(argv))
    if call is None:
        return None
    command, task_id, rest, note = call
    if command == "set":
        return Write("set", task_id, pairs=rest)
    if command == "add":
        return Write("add", task_id, field=rest[0], values=rest[1:])
    if not agent_commands or command not in AGENT_COMMANDS or rest:
        return None
    return Write(command, task_id) if note is None else Write(command, task_id, note=note)


def assignments(pairs: Sequence[str]) -> dict[str, str]:
    """``FIELD=VALUE`` pairs as a dict (a later field wins); :class:`BadInput` for one without ``=``."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise BadInput(f"expected FIELD=VALUE, got {pair[:80]!r}")
        values[name.strip()] = value
    return values


def apply(store: Store, write: Write, *, epoch: int | None, actor: str, config_path: str | None = None) -> None:
    """Run ``write`` on ``store``, fenced by ``epoch``; ``config_path``: the writer's config (its
    ``[handoff]`` knobs, read when a write may teach an edge a need), else the usual search."""
    from heartbeat.tasks import verbs as tasks

    if write.command == "touch":
        tasks.touch(store, write.id, epoch=epoch, actor=actor)
    elif write.command == "done":
        tasks.finish(store, write.id, note=write.note, epoch=epoch, actor=actor, checks=None,
                     config_path=config_path)
    elif write.command == "set":
        tasks.set_fields(store, write.id, assignments(write.pairs), expect_revision=write.expect_revision,
                         epoch=epoch, actor=actor)
    elif write.field == "constraints" and (write.protect or write.forbid):
        for value in write.values:
            tasks.add_constraint(store, write.id, value, protect=write.protect, forbid=write.forbid,
                                 expect_revision=write.expect_revision, epoch=epoch, actor=actor)
    elif write.field == "guarantees":
        for value in write.values:
            tasks.add_guarantee(store, write.id, value, check=write.check, expect_revision=write.expect_revision,
                                epoch=epoch, actor=actor)
    else:
        tasks.add_items(store, write.id, write.field, list(write.values), expect_revision=write.expect_revision,
                        epoch=epoch, actor=actor, config_path=config_path)


def epoch_from_env(task_id: str, env: Mapping[str, str] | None = None) -> int | None:
    """The caller's epoch for ``task_id`` from ``HEARTBEAT_EPOCH``, when it belongs to this task."""
    env = os.environ if env is None else env
    raw = env.get("HEARTBEAT_EPOCH")
    if not raw:
        return None
    owner_task = env.get("HEARTBEAT_TASK")
    if owner_task and owner_task != task_id:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"HEARTBEAT_EPOCH is not an integer: {raw[:20]!r}") from None
    if value < 0:
        raise BadInput("HEARTBEAT_EPOCH must not be negative")
    return value


FENCED_COMMANDS = frozenset({"set", "add", "touch", "claim", "release", "snooze", "block", "unblock", "done",
                             "fail", "retry", "pause", "resume", "ask"})
"""The commands that change an existing task: an agent the daemon launched runs them on its own task only.
(``answer`` is the one exception, and only for a question asked of the agent's own task:
:func:`answerer_from_env`.)"""


def answerer_from_env(by: str | None, epoch: int | None, env: Mapping[str, str] | None = None
                      ) -> tuple[str, int | None]:
    """Who answers a question, and the epoch fencing it: an agent the daemon launched (``HEARTBEAT_TASK``
    and ``HEARTBEAT_EPOCH``) answers only as its own task, ``upstream:TASK`` at its epoch, so the
    question must have been asked of that task; anyone else answers as a person (``person:NAME``
    with ``by``)."""
    env = os.environ if env is None else env
    owner = env.get("HEARTBEAT_TASK")
    if owner and env.get("HEARTBEAT_EPOCH"):
        if by and by != f"upstream:{owner}":
            raise BadInput(f"this agent was launched for task {owner!r}: it answers as upstream:{owner} only",
                           field="--by")
        return f"upstream:{owner}", epoch if epoch is not None else epoch_from_env(owner, env)
    if epoch is not None:
        raise BadInput("--epoch fences an upstream agent's answer; a person answers without one", field="--epoch")
    if by and by.startswith("upstream:"):
        raise BadInput("only the upstream's own agent answers as upstream:ID; a person answers as --by NAME",
                       field="--by")
    return (f"person:{by}" if by and by != "person" else "person"), None


def refuse_foreign(task_id: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse a write to ``task_id`` from an agent the daemon launched for another task.

    The daemon gives each agent ``HEARTBEAT_TASK`` and ``HEARTBEAT_EPOCH``; the epoch fences only
    that task, so without this an agent (or a permission rule for any task) could write every
    other baton unfenced. A person's shell, with neither variable or only ``HEARTBEAT_TASK``
    (a session bound by hand), is not an agent the daemon launched and is not refused.
    """
    env = os.environ if env is None else env
    owner = env.get("HEARTBEAT_TASK")
    if owner and env.get("HEARTBEAT_EPOCH") and owner != task_id:
        from heartbeat.model.errors import NotYourTask

        raise NotYourTask(f"refused: this agent was launched for task {owner!r} (HEARTBEAT_TASK, HEARTBEAT_EPOCH) "
                          "and writes only that task's baton", task=task_id)


def refuse_agent_force(task_id: str, env: Mapping[str, str] | None = None, *, what: str = "") -> None:
    """Refuse ``done --force`` (or ``what``: ``needs --pin/--drop``) from an agent the daemon launched:
    only a person may finish past a downstream's unmet need, or change what an edge needs."""
    env = os.environ if env is None else env
    if not (env.get("HEARTBEAT_TASK") and env.get("HEARTBEAT_EPOCH")):
        return
    if what:
        raise BadInput(f"refused: an agent cannot {what}; a person can (`heartbeat needs ID --pin/--drop`)",
                       task=task_id)
    raise BadInput("refused: an agent cannot `done --force` past a downstream's need; fill the part it "
                   "needs (a person can force)", task=task_id, field="--force")


AGENT_FIXED_FIELDS = ("workdir", "launcher")
"""Fields an agent the daemon launched may not set on its own task: the workdir is what its ``--protect``
guards are relative to, the launcher picks its irreversible globs; a person sets them."""


def refuse_agent_fields(task_id: str, names: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """Refuse an agent the daemon launched setting :data:`AGENT_FIXED_FIELDS` (moving its workdir would
    step around every guard of its constraints)."""
    env = os.environ if env is None else env
    if not (env.get("HEARTBEAT_TASK") and env.get("HEARTBEAT_EPOCH")):
        return
    fixed = sorted({n for n in names if n in AGENT_FIXED_FIELDS})
    if fixed:
        raise BadInput(f"refused: an agent cannot set {', '.join(fixed)} of its task (its guards and irreversible "
                       "commands depend on them); a person can", task=task_id)


def actor_from_env(env: Mapping[str, str]) -> str:
    """Who writes: ``$HEARTBEAT_ACTOR``, else "agent" with an epoch in the environment, else "cli"."""
    return env.get("HEARTBEAT_ACTOR") or ("agent" if env.get("HEARTBEAT_EPOCH") else "cli")


def relayed(store: Store, write: Write | None, env: Mapping[str, str]) -> tuple[int, str]:
    """An agent's write the daemon received (None: the request was not one), run on ``store``
    with the caller's variables ``env``: the exit code and what the CLI would print on stderr
    (one line, or nothing)."""
    code, message, _ = answer(store, write, env)
    return code, message


def answer(store: Store, write: Write | None, env: Mapping[str, str]) -> tuple[int, str, str]:
    """:func:`relayed`, and what the CLI would print on stdout (``show``'s baton, else nothing);
    the code :data:`DECLINED` when the caller must run the command itself (nothing written)."""
    try:
        if write is None:
            raise BadInput("the daemon writes only an agent's `set ID F=V...` and `add ID FIELD V...`")
        if write.command == "show":  # the CLI's `show ID` (cmd_show), read by the daemon
            from heartbeat.model.baton import dump_baton

            return 0, "", dump_baton(store.load(write.id))
        refuse_foreign(write.id, env)
        if write.command == "set":
            refuse_agent_fields(write.id, (p.partition("=")[0] for p in write.pairs), env)
        if write.command == "done" and any(g.check for g in store.load(write.id).guarantees):
            return DECLINED, "", ""
        apply(store, write, epoch=epoch_from_env(write.id, env), actor=actor_from_env(env),
              config_path=env.get("HEARTBEAT_CONFIG") or None)  # the agent's config, not the daemon's search
    except StoreUnreachable as exc:
        if exc.unapplied:  # nothing landed: the agent writes itself, waiting as it does
            return DECLINED, "", ""
        return exc.exit_code, f"heartbeat: {exc}", ""
    except HeartbeatError as exc:
        return exc.exit_code, f"heartbeat: {exc}", ""
    return 0, "", ""
