#!/usr/bin/env python3
"""The soak's agent: a toy agent that misbehaves at random, and says what it believed it wrote.

The daemon launches it (``[launchers.chaos]`` of the soak's config) with the usual
``HEARTBEAT_TASK`` / ``HEARTBEAT_EPOCH`` / ``HEARTBEAT_STATE_DIR``. It picks one behaviour
per dispatch from a generator seeded by (``--seed``, task, epoch):

- ``work``: a few plan steps (step written before, touches during, ``done`` after), then
  ends its shift (exit 0) or marks the task done when the plan is through;
- ``crash``: exit 1 after at most one step; ``idle``: exit 0 without a write;
- ``hang``: never writes again (the daemon must stop it after ``stall_after``);
- ``spin``: touches forever without moving (spinning: stopped and escalated);
- ``slow``: long steps, touching: runs into the launcher's ``max_runtime``;
- ``block-file`` / ``block-human``: blocks itself on a file gate the soak may open, or on
  a human gate the soak may unblock through the CLI, then exits;
- ``nonretry``: exits with the launcher's non-retryable code (the daemon blocks the task);
- ``snooze``: one step, then snoozes for a second or two;
- ``fail``: marks the task failed (rare);
- ``leftover``: leaves a ``sleep`` behind in its process group (the shim must stop it);
- ``setsid-child``: leaves a ``sleep`` behind in a *new session* (``setsid``; tagged
  ``SOAK_GRANDCHILD=1`` and ``SOAK_AGENT_PGID``), out of reach of a stop sent to the
  group: the shim (a child subreaper) must still stop it when the agent's shift ends;
- ``escape``: leaves a *zombie* behind in a new session (``SOAK_ZOMBIE=1``, outside the
  process group, so nothing in heartbeat can stop it) that keeps writing with this
  dispatch's epoch (for up to 15 s). Its writes must land only while that epoch is
  current, and be refused (Conflict, exit 5 on the CLI) once a later dispatch exists.

When ``<root>/calm`` exists (the soak's drain phase) every agent just works the plan through.

Every write it believes landed (and every refusal) is appended as one JSON line to
``<root>/writes/<task>.jsonl``: ``{"e": epoch, "r": revision, "k": kind, "pid": pid}``;
the soak's checker holds these against the ledger afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["main", "BEHAVIOURS", "NON_RETRYABLE_EXIT"]

NON_RETRYABLE_EXIT = 75
"""The exit code the soak's launcher config names as non-retryable."""

BEHAVIOURS: dict[str, float] = {
    "work": 34,
    "crash": 8,
    "idle": 4,
    "hang": 3,
    "spin": 3,
    "slow": 2,
    "block-file": 6,
    "block-human": 3,
    "nonretry": 3,
    "snooze": 4,
    "fail": 0.4,
    "leftover": 3,
    "escape": 3,
    "setsid-child": 5,
}
"""Relative weights of the behaviours, per dispatch."""


class Agent:
    """One dispatch's agent: the task handle, a seeded generator and the write record."""

    def __init__(self, root: str, step_time: float, seed: int, zombie: bool = False) -> None:
        from heartbeat import open_task

        self.root = root
        self.step_time = step_time
        self.task_id = os.environ["HEARTBEAT_TASK"]
        self.task = open_task(self.task_id)
        self.epoch = self.task.epoch
        self.zombie = zombie
        self.rng = random.Random(f"{seed}:{self.task_id}:{self.epoch}:{int(zombie)}")
        self.cli_rng = random.Random(f"{seed}:{self.task_id}:{self.epoch}:{int(zombie)}:cli")
        """Which step changes go through the CLI (apart from ``rng``: the behaviours stay the seed's)."""
        self.record_path = os.path.join(root, "writes", f"{self.task_id}.jsonl")

    def record(self, kind: str, revision: int | None, **extra: Any) -> None:
        line = {"e": self.epoch, "r": revision, "k": kind, "pid": os.getpid(), "t": time.time(), **extra}
        if self.zombie:
            line["z"] = 1
        data = (json.dumps(line) + "\n").encode()
        fd = os.open(self.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)  # one O_APPEND write of a short line: never interleaved
        finally:
            os.close(fd)

    def write(self, kind: str, action: Callable[[], Any]) -> Any:
        """Run one write; record it if it landed. Conflict ends the agent (superseded)."""
        from heartbeat.model.errors import Conflict, InvalidBaton

        for _ in range(40):
            try:
                baton = action()
            except InvalidBaton:
                time.sleep(0.1)  # the soak wrote garbage over the baton: wait for a human to fix it
                continue
            except Conflict as exc:
                self.record(kind, None, refused=str(exc)[:160])
                raise Superseded() from None
            revision = getattr(getattr(baton, "meta", None), "revision", None)
            self.record(kind, revision)
            return baton
        raise SystemExit(1)

    def touch(self) -> None:
        self.write("touch", self.task.touch)

    def update(self, kind: str, change: Callable[[Any], None]) -> Any:
        def run() -> Any:
            with self.task.update() as baton:
                change(baton)
            return baton

        return self.write(kind, run)

    def cli_set(self, kind: str, field: str, value: str) -> None:
        """``heartbeat set ID FIELD=VALUE`` as an agent types it: written by the daemon's relay
        when one runs (heartbeat.hotpath.relay), else by the CLI here. Its revision is not known (the
        command prints none), so the checker holds only the ledger to it; exit 5 is a refusal."""
        from heartbeat.model.errors import Conflict, InvalidBaton

        def run() -> None:
            r = subprocess.run([sys.executable, "-m", "heartbeat", "set", self.task_id, f"{field}={value}"],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            if r.returncode == 5:
                raise Conflict(r.stderr.strip()[:160] or "refused")
            if r.returncode == 2:  # garbage over the baton, or a planted file: wait for a human
                raise InvalidBaton(r.stderr.strip()[:160] or "invalid")
            if r.returncode != 0:
                raise SystemExit(1)

        self.write(kind, run)

    def step(self, step: str) -> None:
        """Move to ``step``: through the API, or (a third of the time) through the CLI, relayed."""
        if self.cli_rng.random() < 1 / 3:
            self.cli_set("step", "step", step)
        else:
            self.update("step", lambda b, s=step: setattr(b, "step", s))

    def work_steps(self, count: int, step_time: float) -> bool:
        """Work up to ``count`` remaining plan steps; True when the plan is through."""
        baton = self.task.read()
        remaining = [s for s in baton.plan if s not in baton.done]
        for step in remaining[:count]:
            self.step(step)
            deadline = time.monotonic() + step_time
            while time.monotonic() < deadline:
                time.sleep(min(max(step_time / 3, 0.01), max(deadline - time.monotonic(), 0)))
                self.touch()
            self.update("done", lambda b, s=step: b.done.append(s))
        return len(remaining) <= count

    def finish(self) -> None:
        from heartbeat.tasks import verbs as tasks

        self.write("finish", lambda: tasks.finish(self.task.store, self.task_id, note="plan through",
                                                  epoch=self.epoch, actor="chaos"))


class Superseded(Exception):
    """A write was refused because a later dispatch holds the task."""


def run_behaviour(agent: Agent, behaviour: str, calm: bool) -> int:
    from heartbeat.model.baton import Gate
    from heartbeat.tasks import verbs as tasks

    rng = agent.rng
    step = agent.step_time
    if calm:
        if agent.work_steps(1000, step / 2):
            agent.finish()
        return 0
    if behaviour == "idle":
        return 0
    if behaviour == "hang":
        while True:
            time.sleep(3600)
    if behaviour == "nonretry":
        return NON_RETRYABLE_EXIT
    if behaviour == "spin":
        while True:
            agent.touch()
            time.sleep(0.15)
    if behaviour == "crash":
        if rng.random() < 0.5:
            agent.work_steps(1, step)
        return 1
    if behaviour == "slow":
        if agent.work_steps(3, 2.5):
            agent.finish()
        return 0
    if behaviour in ("block-file", "block-human"):
        if rng.random() < 0.5:
            agent.work_steps(1, step)
        if behaviour == "block-file":
            gate = f"file:{os.path.join(agent.root, 'gates', f'{agent.task_id}.{agent.epoch}.{rng.randrange(10**6)}')}"
        else:
            gate = "human"
        agent.write("block", lambda: tasks.block(agent.task.store, agent.task_id, f"chaos {behaviour}",
                                                 Gate.parse(gate), epoch=agent.epoch, actor="chaos"))
        time.sleep(rng.uniform(0, 0.3))  # an agent may linger a little after blocking itself
        return 0
    if behaviour == "snooze":
        agent.work_steps(1, step)
        from heartbeat.model.timeparse import utcnow

        until = utcnow() + timedelta(seconds=rng.uniform(0.5, 2.0))
        agent.write("snooze", lambda: tasks.snooze(agent.task.store, agent.task_id, until, epoch=agent.epoch,
                                                   actor="chaos"))
        return 0
    if behaviour == "fail":
        agent.write("fail", lambda: tasks.fail(agent.task.store, agent.task_id, reason="chaos: gave up",
                                               epoch=agent.epoch, actor="chaos"))
        return 0
    if behaviour == "leftover":
        subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        agent.work_steps(1, step)
        return 0
    if behaviour == "setsid-child":
        spawn_setsid_child()
        agent.work_steps(1, step)
        return rng.choice([0, 0, 1])
    if behaviour == "escape":
        # Started in our group (so until it execs it is one of ours), it leaves the group by
        # itself once its environment says what it is (SOAK_ZOMBIE=1): see run_zombie.
        env = {**os.environ, "SOAK_ZOMBIE": "1"}
        zombie = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--root", agent.root, "--zombie",
                                   "--step-time", str(step)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and zombie.poll() is None:
            try:
                if os.getpgid(zombie.pid) != os.getpgrp():
                    break  # it has left our group: our shim's clean-up will not reach it
            except ProcessLookupError:
                break
            time.sleep(0.02)
        agent.work_steps(rng.randint(0, 1), step)
        return rng.choice([0, 1])
    # work: a shift of a few steps, done when the plan is through
    if agent.work_steps(rng.randint(1, 3), step):
        agent.finish()
    return 0


def spawn_setsid_child(seconds: float = 30.0) -> int:
    """Start ``sleep`` in a new session, as a daemonizing helper would; return its pid.

    It is tagged in its environment before exec (so the soak's checker never mistakes it
    for a second agent of the task) and calls setsid only after exec (the ``setsid``
    program, or Python where that is missing), so no sample sees an untagged process
    outside the agent's group.
    """
    env = {**os.environ, "SOAK_GRANDCHILD": "1", "SOAK_AGENT_PGID": str(os.getpgrp())}
    import shutil

    setsid = shutil.which("setsid")
    argv = [setsid, "sleep", str(seconds)] if setsid else [
        sys.executable, "-c", "import os, sys, time; os.setsid(); time.sleep(float(sys.argv[1]))", str(seconds)]
    child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    return child.pid


def run_zombie(agent: Agent) -> int:
    """Keep writing with this dispatch's epoch until refused (a later dispatch exists), the task
    is finished, or 15 s have passed."""
    os.setsid()  # escape the agent's process group: the shim's clean-up and the daemon's stop miss us
    deadline = time.monotonic() + 15.0
    count = 0
    while time.monotonic() < deadline:
        count += 1
        if count % 6 == 3:  # its epoch's write as an agent types it: relayed when a daemon runs
            agent.cli_set("intent", "intent", f"zombie write {count}")
            baton = agent.task.read()
        elif count % 3:
            baton = agent.write("touch", agent.task.touch)
        else:
            baton = agent.update("intent", lambda b, n=count: setattr(b, "intent", f"zombie write {n}"))
        if baton.meta.status.value in ("done", "failed"):
            return 0
        time.sleep(0.2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos_agent")
    parser.add_argument("--root", required=True, help="the soak's root directory")
    parser.add_argument("--step-time", type=float, default=0.08)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zombie", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--behaviour", default="", help="force one behaviour (for tests)")
    parser.add_argument("--without", action="append", default=[], choices=list(BEHAVIOURS),
                        help="never pick this behaviour (repeatable)")
    args = parser.parse_args(argv)

    from heartbeat.model.errors import HeartbeatError, NotActive

    try:
        agent = Agent(args.root, args.step_time, args.seed, zombie=args.zombie)
        if args.zombie:
            return run_zombie(agent)
        calm = os.path.exists(os.path.join(args.root, "calm"))
        names = [n for n in BEHAVIOURS if n not in args.without]
        behaviour = args.behaviour or agent.rng.choices(names, weights=[BEHAVIOURS[n] for n in names])[0]
        print(f"chaos_agent[{os.getpid()}] epoch {agent.epoch}: {'calm' if calm else behaviour}", flush=True)
        return run_behaviour(agent, behaviour, calm)
    except Superseded:
        return 0
    except NotActive:
        return 0
    except HeartbeatError as exc:
        print(f"chaos_agent: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
