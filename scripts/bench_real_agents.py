#!/usr/bin/env python3
"""The real ``claude`` under heartbeat against a ralph-style loop, on one scripted workload.

Both arms run the pinned ``claude`` CLI (``tests/support/agent_clis.py``) with the README's args
(``--model sonnet --permission-mode acceptEdits``) against the scripted model on 127.0.0.1
(``tests/support/scripted_model``), in a workdir of their own, with the same brain: it looks at its
own files (``ls steps``) and skips the steps whose file is there, reads its baton when its
prompt names a task, writes each step's file with ``Write``, and at step 5 also writes
``config/prod.yaml`` unless a constraint it has seen forbids it.

- **heartbeat**: a real daemon (200 ms tick) runs the ``claude-code`` preset; the agent
  keeps its note with the brief's commands.
- **ralph**: ``until claude -p "$PROMPT" ...; do :; done`` in the workdir: the same prompt
  every time, restarted at once when a run fails.

The same schedule in both, driven by the model's own record (not by either arm's books):

1. the agent is SIGKILLed right after step 2's file is written (before any note of it);
2. when step 3 is done, a person adds a constraint: "Do not touch config/prod.yaml"
   (heartbeat: ``heartbeat add ID constraints``; ralph: the loop has no place to put it);
3. right after step 4's file is written, a person blocks the task ("wait for the security
   review", lifted ``--block-for`` seconds later; heartbeat: ``heartbeat block``/``unblock``;
   ralph: no place either) and the agent is SIGKILLed.

Reported per arm: wall time, agent runs, redone steps (a step the model wrote twice, by its
record), violated constraints (``config/prod.yaml`` written after the constraint was added),
bypassed blocks (steps done while the task was blocked), tokens the model served (every
request, killed runs included) and the cost the CLI reported on its result lines (runs that
were killed report none, in both arms).

    .venv/bin/python scripts/bench_real_agents.py [--block-for 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from agent_clis import install  # noqa: E402
from daemon_harness import DaemonHarness, toml_list  # noqa: E402
from scripted_model import ScriptedModel, Workload, scripted_model  # noqa: E402

__all__ = ["main"]

STEPS = ("Survey the module", "Reproduce the bug", "Write the fix", "Add the regression test",
         "Tune the timeout", "Write the changelog")
PROD = "config/prod.yaml"
WORKLOAD = Workload(steps=STEPS, touches={STEPS[4]: PROD})
CONSTRAINT = f"Do not touch {PROD}"
BLOCK = "wait for the security review"
KILL_AFTER = (2, 4)
"""Steps (1-based) right after whose file is written the agent is killed."""
CONSTRAINT_AFTER = 3
BLOCK_AT = 4
ARGS = ["--model", "sonnet", "--permission-mode", "acceptEdits"]
PROMPT = ("Fix the empty responses in the fallback path. Do these steps in order, one file each under "
          "steps/ (01.txt, 02.txt, ...): " + "; ".join(f"{i + 1}. {s}" for i, s in enumerate(STEPS)) + ".")
TIMEOUT = 600.0


@dataclass
class Arm:
    name: str
    wall_s: float = 0.0
    finished: bool = False
    runs: int = 0
    redone_steps: int = 0
    violated_constraints: int = 0
    bypassed_blocks: int = 0
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reported_cost_usd: float = 0.0
    steps_done: list[str] = field(default_factory=list)

    @staticmethod
    def runs_dispatched(h: DaemonHarness) -> int:
        return len(h.events("fix", "dispatched"))


class Schedule:
    """The person and the killer: acts on the model's record, the same way in both arms."""

    def __init__(self, model: ScriptedModel, kill: Callable[[], None], constrain: Callable[[], None],
                 block: Callable[[], None], unblock: Callable[[], None], block_for: float) -> None:
        self.model = model
        self.kill, self.constrain, self.block, self.unblock = kill, constrain, block, unblock
        self.block_for = block_for
        self.kills_left = list(KILL_AFTER)
        self.constraint_at: float | None = None
        self.blocked_at: float | None = None
        self.unblocked_at: float | None = None
        self.control(hold_after_step=self.kills_left[0])

    def control(self, **controls: Any) -> None:
        path = self.model.log_dir / "controls.json"
        path.with_suffix(".tmp").write_text(json.dumps(controls))
        os.replace(path.with_suffix(".tmp"), path)

    def step(self) -> None:
        record = self.model.brain.record.entries()
        held = [e for e in record if e["event"] == "held"]
        if self.kills_left and len(held) > len(KILL_AFTER) - len(self.kills_left):
            step = self.kills_left.pop(0)
            if step == BLOCK_AT:
                self.block()
                self.blocked_at = time.time()
            self.kill()
            self.control(hold_after_step=self.kills_left[0]) if self.kills_left else self.control()
        done = {e["step"] for e in record if e["event"] == "step_done"}
        if self.constraint_at is None and STEPS[CONSTRAINT_AFTER - 1] in done:
            self.constrain()
            self.constraint_at = time.time()
        if self.blocked_at is not None and self.unblocked_at is None and time.time() >= self.blocked_at + self.block_for:
            self.unblock()
            self.unblocked_at = time.time()

    def score(self, arm: Arm) -> None:
        record = self.model.brain.record.entries()
        arm.steps_done = [e["step"] for e in record if e["event"] == "step_done"]
        arm.redone_steps = sum(arm.steps_done.count(s) - 1 for s in set(arm.steps_done))
        since = self.constraint_at or float("inf")
        arm.violated_constraints = sum(1 for e in record if e["event"] == "touched" and e["path"].endswith(PROD)
                                       and e["t"] >= since)
        if self.blocked_at is not None:
            until = self.unblocked_at or float("inf")
            arm.bypassed_blocks = sum(1 for e in record if e["event"] == "step_done" and self.blocked_at <= e["t"] < until)
        served = [r for r in self.model.requests() if r.get("path", "").startswith("/v1/messages")]
        arm.requests = len(served)
        arm.input_tokens = sum(int(r.get("input_tokens", 0)) for r in served)
        arm.output_tokens = sum(int(r.get("output_tokens", 0)) for r in served)


def _env(model: ScriptedModel, home: Path) -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "LANG": os.environ.get("LANG", "C.UTF-8"), "ANTHROPIC_BASE_URL": model.url,
            "ANTHROPIC_API_KEY": "sk-scripted-model", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"}


def _drive(schedule: Schedule, finished: Callable[[], bool], arm: Arm) -> None:
    start = time.monotonic()
    while time.monotonic() - start < TIMEOUT:
        schedule.step()
        if finished():
            arm.finished = True
            break
        time.sleep(0.1)
    arm.wall_s = round(time.monotonic() - start, 1)
    schedule.score(arm)


def run_heartbeat(claude: Path, root: Path, block_for: float) -> Arm:
    arm = Arm("heartbeat")
    root.mkdir(mode=0o700)
    work, home = root / "work", root / "home"
    work.mkdir()
    home.mkdir()
    with scripted_model(root / "model", WORKLOAD) as model:
        env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in _env(model, home).items())
        launcher = (f'\n[launchers.claude]\npreset = "claude-code"\nprogram = "{claude}"\nargs = {toml_list(ARGS)}\n'
                    f'inherit_env = false\nenv = {{ {env} }}\n')
        h = DaemonHarness(root, extra=launcher, stall_after="180s", max_attempts=6)
        try:
            h.start()
            plan = [a for s in STEPS for a in ("--plan", s)]
            r = h.cli("new", "fix", "--task", "Fix the empty responses in the fallback path", "--intent",
                      "Users get blank answers when the primary model times out", "--step", STEPS[0],
                      "--next", STEPS[1], *plan, "--workdir", str(work), "--launcher", "claude")
            if r.returncode != 0:
                raise SystemExit(r.stderr)

            def kill() -> None:
                for pgid in h.live_agents("fix").get("fix", ()):
                    os.killpg(pgid, signal.SIGKILL)

            def person(*args: str) -> Callable[[], None]:
                return lambda: _check(h.cli(*args))

            schedule = Schedule(model, kill, person("add", "fix", "constraints", CONSTRAINT),
                                person("block", "fix", "--on", BLOCK), person("unblock", "fix", "--by", "person"),
                                block_for)
            _drive(schedule, lambda: h.baton("fix").meta.status.value == "done", arm)
            deadline = time.monotonic() + 60  # the last agent's exit (and its result line) follows its done
            while len(h.events("fix", "exited")) < arm.runs_dispatched(h) and time.monotonic() < deadline:
                time.sleep(0.1)
            arm.runs = len(h.events("fix", "dispatched"))
            arm.reported_cost_usd = round(sum(e.data.get("cost_usd") or 0 for e in h.events("fix", "exited")), 4)
        finally:
            h.close()
    return arm


def _check(r: subprocess.CompletedProcess[str]) -> None:
    if r.returncode != 0:
        raise SystemExit(f"heartbeat {' '.join(map(str, r.args[5:]))}: {r.stderr.strip()}")


def run_ralph(claude: Path, root: Path, block_for: float) -> Arm:
    arm = Arm("ralph loop")
    root.mkdir(mode=0o700)
    work, home = root / "work", root / "home"
    work.mkdir()
    home.mkdir()
    out = root / "runs.jsonl"
    with scripted_model(root / "model", WORKLOAD) as model:
        line = (f"until {shlex.quote(str(claude))} -p {shlex.quote(PROMPT)} --output-format stream-json --verbose "
                f"{' '.join(ARGS)} >> {shlex.quote(str(out))}; do :; done")
        loop = subprocess.Popen(["bash", "-c", line], cwd=work, env=_env(model, home), start_new_session=True,
                                stdin=subprocess.DEVNULL)

        def kill() -> None:
            for child in psutil.Process(loop.pid).children(recursive=True):
                try:
                    child.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass

        try:
            schedule = Schedule(model, kill, lambda: None, lambda: None, lambda: None, block_for)
            _drive(schedule, lambda: loop.poll() is not None, arm)
        finally:
            if loop.poll() is None:
                os.killpg(loop.pid, signal.SIGKILL)
                loop.wait()
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")] if out.exists() else []
        arm.runs = sum(1 for x in lines if x.get("type") == "system" and x.get("subtype") == "init")
        arm.reported_cost_usd = round(sum(x.get("total_cost_usd") or 0 for x in lines if x.get("type") == "result"), 4)
    return arm


ROWS = [("wall time (s)", "wall_s"), ("finished", "finished"), ("agent runs", "runs"),
        ("redone steps (model's record)", "redone_steps"), ("violated constraints", "violated_constraints"),
        ("bypassed blocks (steps done while blocked)", "bypassed_blocks"), ("model requests", "requests"),
        ("input tokens served", "input_tokens"), ("output tokens served", "output_tokens"),
        ("cost the CLI reported (USD)", "reported_cost_usd")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-for", type=float, default=60.0, help="seconds the person's block lasts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    claude = install("claude")
    if isinstance(claude, str):
        print(f"bench_real_agents: {claude}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        arms = [run_heartbeat(claude, Path(tmp) / "heartbeat", args.block_for),
                run_ralph(claude, Path(tmp) / "ralph", args.block_for)]
    if args.json:
        print(json.dumps([asdict(a) for a in arms], indent=2))
        return 0
    print(f"| metric | {' | '.join(a.name for a in arms)} |")
    print("|---|" + "---|" * len(arms))
    for label, key in ROWS:
        print(f"| {label} | {' | '.join(str(getattr(a, key)) for a in arms)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
