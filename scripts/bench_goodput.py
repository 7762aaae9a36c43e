#!/usr/bin/env python3
"""End-to-end goodput of pipelines of toy agents: heartbeat against a naive restarter.

A workload of pipelines (build -> test -> review), each stage a plan of steps, is run
twice from the same seed: once through heartbeat (real batons in heartbeat's store, the
real verbs, each agent started with the real brief, upstream packages included) and
once through a naive restart loop (each agent started with the stage's original
prompt only). Agents are killed at random; the same kill rates are used for both.

The toy agents read only what they are given, and behave exactly the same in both arms:

* each plan step costs one agent-minute; an agent is killed during a step with
  probability ``p`` (the half-done step's time is lost; one kill in eleven lands after
  the work but before it was written down, so the step is done again) and a new agent
  is started;
* it skips the steps its text marks done (``[done]`` in the plan) and does the rest,
  recording each step as it starts it (``set step=``) and when it is done (``add done``);
* at its "learn" step a human tells it a new constraint (heartbeat: it records it with
  ``add constraints``; the naive loop keeps nothing);
* at a "temptation" step it breaks a constraint unless that constraint is in its text
  (the stage's own runtime one; and the first stage's initial constraint, which only
  the first stage's prompt carries — heartbeat passes it downstream as inherited);
* a downstream stage's "use" step needs its upstream's decision; without it in its
  text the agent re-derives it (two agent-minutes; counted as redone work);
* the last stage's "ship" step needs a human sign-off (30 minutes after it is asked
  for). The first agent to reach it asks and stops (heartbeat: ``block``); an agent
  that reaches it later, without the sign-off and without the block in its text,
  ships anyway: a bypassed block.

Measured, per arm: stages completed per agent-minute, redone steps (a completed step
done again, plus re-derived upstream decisions), constraints violated and blocks
bypassed. The numbers show what the handoff machinery buys, not how good any model is.

    .venv/bin/python scripts/bench_goodput.py [--pipelines 20] [--steps 6] [--rates 0.05,0.15,0.3] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from heartbeat.model.baton import Gate, GateKind, Status
from heartbeat.reports.brief import render_brief
from heartbeat.store.memory import MemoryStore
from heartbeat.tasks import handoff
from heartbeat.tasks import verbs as tasks

__all__ = ["main"]

STAGES = ("build", "test", "review")
MAX_DISPATCHES = 60
"""Agents per stage before the stage is given up (counted as not completed)."""
SIGNOFF_DELAY = 30.0
REDERIVE_COST = 2.0
UNRECORDED_WINDOW = 0.1
"""A kill lands in the last tenth of a step's time (1/11 of kills): the work is done but not yet
recorded, so even a heartbeat successor does that step again."""


@dataclass
class Step:
    name: str
    kind: str  # work | learn | use | tempt-own | tempt-first | ship
    constraint: str = ""


@dataclass
class Tally:
    stages_completed: int = 0
    agent_minutes: float = 0.0
    redone_steps: int = 0
    constraints_violated: int = 0
    blocks_bypassed: int = 0
    agents: int = 0

    def goodput(self) -> float:
        return self.stages_completed / self.agent_minutes if self.agent_minutes else 0.0


def _plan(pipeline: int, stage: int, steps: int) -> list[Step]:
    runtime = f"never touch prod-{pipeline}-{stage}.yaml"
    plan = [Step(f"{STAGES[stage]} step {i + 1} (p{pipeline})", "work") for i in range(steps)]
    plan[0] = Step(f"{STAGES[stage]}: learn the rule (p{pipeline})", "learn", runtime)
    if stage > 0:
        plan[1] = Step(f"{STAGES[stage]}: use the upstream decision (p{pipeline})", "use")
    plan[-3] = Step(f"{STAGES[stage]}: tempting shortcut A (p{pipeline})", "tempt-own", runtime)
    plan[-2] = Step(f"{STAGES[stage]}: tempting shortcut B (p{pipeline})", "tempt-first",
                    f"no network calls in pipeline {pipeline}")
    if stage == len(STAGES) - 1:
        plan[-1] = Step(f"{STAGES[stage]}: ship (p{pipeline})", "ship")
    return plan


_CONSTRAINT = re.compile(r"^- \*\*(.+?)\*\*")
_DONE = re.compile(r"^- \[done\] (.+)$")


def _read(text: str) -> tuple[set[str], set[str]]:
    """What a toy agent takes from its text: the constraints (bold list items) and the steps marked done."""
    constraints, done = set(), set()
    for line in text.splitlines():
        if m := _CONSTRAINT.match(line):
            constraints.add(m.group(1))
        if m := _DONE.match(line):
            done.add(m.group(1))
    return constraints, done


@dataclass
class _Stage:
    pipeline: int
    index: int
    plan: list[Step]
    initial: list[str]
    decision: str
    completed: set[str] = field(default_factory=set)
    signoff_at: float | None = None
    asked: bool = False

    @property
    def id(self) -> str:
        return f"p{self.pipeline}.{STAGES[self.index]}"


def _run_agent(stage: _Stage, text: str, now: float, rng: random.Random, p: float, tally: Tally,
               record: Any) -> tuple[str, float]:
    """One toy agent on one stage: returns (how it ended, the time after it) - killed, blocked, done."""
    tally.agents += 1
    known, done = _read(text)
    for step in stage.plan:
        if step.name in done:
            continue
        record("start", step.name)
        if step.name in stage.completed:
            tally.redone_steps += 1
        if rng.random() < p:  # killed: the time is spent, the step is lost
            at = rng.random() * (1 + UNRECORDED_WINDOW)
            if at > 1:  # killed after the work, before writing it down: done, but nobody knows
                stage.completed.add(step.name)
                at = 1.0
            tally.agent_minutes += at
            return "killed", now + at
        cost = 1.0
        if step.kind == "learn":
            known.add(step.constraint)
            record("constraint", step.constraint)
        elif step.kind == "use" and f"decision: {stage.decision}" not in text:
            cost += REDERIVE_COST
            tally.redone_steps += 1
        elif step.kind in ("tempt-own", "tempt-first") and step.constraint not in known:
            tally.constraints_violated += 1
        elif step.kind == "ship" and (stage.signoff_at is None or now < stage.signoff_at):
            if not stage.asked:
                stage.asked = True
                stage.signoff_at = now + SIGNOFF_DELAY
                record("block", "waiting for the release sign-off")
                tally.agent_minutes += 0.1
                return "blocked", now + 0.1
            tally.blocks_bypassed += 1
        tally.agent_minutes += cost
        now += cost
        stage.completed.add(step.name)
        record("done", step.name)
    return "done", now


def _stages(pipelines: int, steps: int) -> list[list[_Stage]]:
    out = []
    for n in range(pipelines):
        chain = []
        for i in range(len(STAGES)):
            initial = [f"no network calls in pipeline {n}"] if i == 0 else []
            chain.append(_Stage(n, i, _plan(n, i, steps), initial, decision=f"cache key v{n}-{i - 1}"))
        out.append(chain)
    return out


def run_heartbeat(pipelines: int, steps: int, p: float, seed: int) -> Tally:
    """Every stage a real task with ``after``; every agent briefed by heartbeat's renderer."""
    rng = random.Random(seed)
    tally = Tally()
    store = MemoryStore()
    for chain in _stages(pipelines, steps):
        now = 0.0
        for stage in chain:
            upstream = [chain[stage.index - 1].id] if stage.index else []
            tasks.new_task(store, stage.id, task=f"{STAGES[stage.index]} of pipeline {stage.pipeline}",
                           step=stage.plan[0].name, plan=[s.name for s in stage.plan], constraints=stage.initial,
                           after=upstream)
            if upstream:
                tasks.unblock(store, stage.id, by="gate:after")  # the upstream is done: the gate opened
            if stage.index + 1 < len(chain):
                tasks.add_items(store, stage.id, "decisions", [f"decision: {chain[stage.index + 1].decision}"])

            def record(kind: str, value: str, stage: _Stage = stage) -> None:
                if kind == "constraint":
                    tasks.add_items(store, stage.id, "constraints", [value])
                elif kind == "block":
                    tasks.block(store, stage.id, value, Gate(GateKind.HUMAN))
                elif kind == "start":
                    tasks.set_fields(store, stage.id, {"step": value})
                else:
                    tasks.add_items(store, stage.id, "done", [value])

            for _ in range(MAX_DISPATCHES):
                baton = store.load(stage.id)
                if baton.status is Status.BLOCKED:  # held: never dispatched until the human signs off
                    assert stage.signoff_at is not None
                    now = max(now, stage.signoff_at)
                    tasks.unblock(store, stage.id, by="release-manager")
                    baton = store.load(stage.id)
                packages = handoff.load_packages(store, baton) if baton.after else []
                text = render_brief(baton, upstream=packages).text
                ended, now = _run_agent(stage, text, now, rng, p, tally, record)
                if ended == "done":
                    tasks.finish(store, stage.id, checks={})
                    tally.stages_completed += 1
                    break
            else:
                break  # given up: its downstreams never start
    return tally


def run_naive(pipelines: int, steps: int, p: float, seed: int) -> Tally:
    """A plain restart loop: every agent gets the stage's original prompt, nothing more."""
    rng = random.Random(seed)
    tally = Tally()
    for chain in _stages(pipelines, steps):
        now = 0.0
        for stage in chain:
            prompt = "\n".join([f"# {STAGES[stage.index]} of pipeline {stage.pipeline}", "", "Constraints:",
                                *(f"- **{c}**" for c in stage.initial), "", "Plan:",
                                *(f"- [ ] {s.name}" for s in stage.plan)])
            for _ in range(MAX_DISPATCHES):
                ended, now = _run_agent(stage, prompt, now, rng, p, tally, lambda kind, value: None)
                if ended == "done":
                    tally.stages_completed += 1
                    break
            else:
                break
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", type=int, default=20)
    parser.add_argument("--steps", type=int, default=6, help="plan steps per stage (at least 4)")
    parser.add_argument("--rates", default="0.05,0.15,0.3", help="kill probabilities per step, comma-separated")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 4 or args.pipelines < 1:
        parser.error("--steps must be at least 4 and --pipelines at least 1")
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for p in rates:
        hb = run_heartbeat(args.pipelines, args.steps, p, args.seed)
        naive = run_naive(args.pipelines, args.steps, p, args.seed)
        results[f"{p:g}"] = {name: {**t.__dict__, "stages_per_agent_minute": round(t.goodput(), 4)}
                             for name, t in (("heartbeat", hb), ("naive", naive))}
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    total = args.pipelines * len(STAGES)
    print(f"goodput: {args.pipelines} pipelines x {len(STAGES)} stages ({' -> '.join(STAGES)}) x {args.steps} steps "
          f"= {total} stages; seed {args.seed}\n")
    header = "| metric | " + " | ".join(f"p={p} heartbeat | p={p} naive" for p in results) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(results)))
    rows = [("stages completed per agent-minute", "stages_per_agent_minute"),
            ("stages completed", "stages_completed"), ("agent-minutes", "agent_minutes"),
            ("agents started", "agents"), ("redone steps", "redone_steps"),
            ("constraints violated", "constraints_violated"), ("blocks bypassed", "blocks_bypassed")]
    for label, key in rows:
        cells = []
        for r in results.values():
            for arm in ("heartbeat", "naive"):
                value = r[arm][key]
                cells.append(f"{value:.1f}" if key == "agent_minutes" else f"{value}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
