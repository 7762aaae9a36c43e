"""A toy agent for the demo, the tests and the soak: it works through its task's plan.

It behaves like a well-mannered agent should: it reads its baton first, resumes at the
first plan step not yet done, writes the step before starting it, touches while it works,
records each step done, and marks the task done at the end — all through the Python API,
fenced by the epoch the daemon gave it. Options make it misbehave on purpose:

    python -m heartbeat.toyagent [--step-time S] [--steps-per-shift N] [--mode MODE]

``--mode``: ``work`` (default), ``hang`` (never writes, sleeps), ``spin`` (touches
forever without moving), ``crash`` (exits 1 after the first step), ``idle`` (exits 0
without doing anything), ``exit:N`` (exits N at once), ``block`` (blocks itself on a
human gate), ``snooze:DURATION`` (does one step, then snoozes), ``critic`` (a downstream:
reads its brief for one step time, then ``verify``: on ``broken`` or ``stale`` it stops, the
edge's policy having sent the upstream back; else it records the review and finishes).

A plan step ``decide: TEXT`` is also recorded as a decision; before ``done`` the agent
creates any key file that does not exist yet (a toy's artifacts are its key files).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heartbeat.toyagent")
    parser.add_argument("--step-time", type=float, default=1.0, help="seconds per plan step")
    parser.add_argument("--steps-per-shift", type=int, default=0, help="end the shift (exit 0) after N steps")
    parser.add_argument("--mode", default="work")
    args = parser.parse_args(argv)

    from heartbeat import open_task
    from heartbeat.model.errors import Conflict, HeartbeatError

    task_id = os.environ.get("HEARTBEAT_TASK", "")
    mode = args.mode
    if mode.startswith("exit:"):
        return int(mode.split(":", 1)[1])
    if mode == "idle":
        return 0
    if mode == "hang":
        while True:
            time.sleep(3600)
    try:
        task = open_task(task_id)
        baton = task.read()
        say(f"epoch {task.epoch}: read the baton first: step {baton.step!r}, done {len(baton.done)}/{len(baton.plan)}")
        if mode == "spin":
            while True:
                task.touch()
                time.sleep(max(args.step_time / 4, 0.05))
        if mode == "block":
            task.block("needs a human decision")
            return 0
        if mode == "critic":
            return _critic(task, args.step_time)
        remaining = [step for step in baton.plan if step not in baton.done]
        for number, step in enumerate(remaining, 1):
            later = remaining[number] if number < len(remaining) else ""
            with task.update() as b:
                b.step = step
                b.next_step = later
            say(f"working on {step!r}")
            deadline = time.monotonic() + args.step_time
            while time.monotonic() < deadline:
                time.sleep(min(args.step_time / 4, max(deadline - time.monotonic(), 0)))
                task.touch()
            with task.update() as b:
                b.done.append(step)
                if step.startswith("decide:"):
                    b.decisions.append(step[len("decide:"):].strip())
            if mode == "crash":
                say("crashing on purpose")
                return 1
            if mode.startswith("snooze:"):
                from heartbeat.model.timeparse import parse_duration, utcnow
                from heartbeat.tasks import verbs as tasks

                wait = parse_duration(mode.split(":", 1)[1])
                tasks.snooze(task.store, task.id, utcnow() + timedelta(seconds=wait), epoch=task.epoch)
                say(f"snoozing for {wait:g}s")
                return 0
            if args.steps_per_shift and number >= args.steps_per_shift and number < len(remaining):
                say("shift over; the next agent takes it from the baton")
                return 0
        _make_key_files(task.read())
        task.done("all plan steps done")
        say("task done")
        return 0
    except Conflict as exc:
        say(f"superseded, stopping: {exc}")
        return 0
    except HeartbeatError as exc:
        say(f"error: {exc}")
        return 1


def _make_key_files(baton: object) -> None:
    from heartbeat.system.world import resolve_key_file

    workdir, key_files = getattr(baton, "workdir", ""), getattr(baton, "key_files", [])
    for key in key_files if workdir else []:
        path = resolve_key_file(workdir, key)
        if not os.path.exists(path):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("built by the toy agent\n")


def _critic(task: object, step_time: float) -> int:
    from heartbeat.api import Task

    assert isinstance(task, Task)
    brief = os.environ.get("HEARTBEAT_BRIEF", "")
    if brief and os.path.exists(brief):
        with open(brief, encoding="utf-8") as handle:
            seen = [line for line in handle.read().splitlines() if line.startswith("## Upstream handoff")]
        say(f"read the brief: {len(seen)} upstream package(s)")
    deadline = time.monotonic() + step_time
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        task.touch()
    result = task.verify()
    if result.code != 0:
        say(f"verify says {result.status}: stopping ({'; '.join(result.actions) or result.message})")
        return 0
    with task.update() as b:
        b.step = "reviewed"
        b.done.append("reviewed the upstream's work")
    task.done("reviewed")
    say("review done")
    return 0


def say(text: str) -> None:
    print(f"toyagent[{os.getpid()}]: {text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
