#!/usr/bin/env python3
"""The handoff that learns: five builder → critic handoffs of real ``claude`` sessions, learning on and off.

Each arm is one real daemon (200 ms tick) and one state dir running the pinned ``claude`` CLI
(``tests/support/agent_clis.py``) through the ``claude-code`` preset against the scripted model on
127.0.0.1, whose mind here is ``tests/support/scripted_model/seam.py``: five pipelines ``p1..p5``
(``build → review``, one pipeline file, ``heartbeat pipeline new pN``) run one after the other, so
the edge profile of the ``build → review`` role carries from one to the next.

- The **builder** writes ``design.md`` (its decision, the alternative it rejected, an unknown), notes
  the decision and the unknown and runs ``done``: it leaves ``rejected`` out of its package unless
  its brief says a downstream needs it (or a refused ``done`` names it).
- The **critic** meets the gap in the package: ``heartbeat ask pN.review "..." --to upstream``; the
  daemon resumes the builder's recorded session with the question; the builder answers from that
  session's memory (``heartbeat answer``); the critic's next run records the part as re-derived
  (``heartbeat add pN.review rederived "rejected: ..."``) and finishes its review.
- **learning on** (``[handoff] learn_after``/``learn_window``: K of the last N handoffs): once the
  profile shows ``rejected`` missing or re-derived K times, the need is learned, the next builder's
  brief requires the part, its ``done`` is refused without it, and the critic gets it in the package.
  **learning off**: the same five handoffs, every one with its question.

Reported per arm (median over ``--runs``), per handoff and in sum: stages done per agent-minute
(agent time sampled from the process table every 200 ms: each live ``claude`` the daemon launched,
whatever heartbeat says) and per agent CPU-minute (their CPU time and their reaped children's, steadier
on a loaded machine), agent runs, questions asked, parts re-derived, ``done`` refusals, model requests and the input
tokens the scripted model received, wall time; and the witness, from the scripted model's own record:
whether the critic's first request carried the builder's rejected alternative (by its exact words),
and whether each resumed builder's request carried its earlier conversation.

    .venv/bin/python scripts/bench_learning.py [--runs 3] [--handoffs 5] [--json] [--quick] [--report FILE]

``--quick``: the smoke the test runs (two handoffs, learning on, learned after one).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from agent_clis import install  # noqa: E402
from daemon_harness import DaemonHarness, toml_list  # noqa: E402
from scripted_model import ScriptedModel  # noqa: E402
from scripted_model.anthropic import ROUTES  # noqa: E402
from scripted_model.brain import Record  # noqa: E402
from scripted_model.seam import Seam, SeamBrain  # noqa: E402

__all__ = ["main", "run_arm", "Arm", "Handoff"]

ARGS = ["--model", "sonnet", "--permission-mode", "acceptEdits"]
SEAM = Seam()
HANDOFF_TIMEOUT = 420.0
"""The longest one handoff may take before the arm is stopped as unfinished."""
SAMPLE = 0.2
"""Seconds between two looks at the process table (agent time)."""


def learning_config(on: bool, *, after: int, window: int) -> str:
    """The config lines of one arm: the profile's K of N, or learning off; questions wait long."""
    learn = f"learn_after = {after}\nlearn_window = {window}\n" if on else "learn = false\n"
    return f"\n[handoff]\n{learn}"


def pipeline_file(workdir: Path) -> str:
    """The pipeline every handoff runs: the builder's stable parts are in the file, its note adds the rest."""
    return f"""workdir = {json.dumps(str(workdir))}

[stages.build]
task = "Add the response cache"
intent = "p95 latency under 200 ms without a new service"
launcher = "claude"
constraints = ["no new services"]
guarantees = ["design.md says what was decided"]
key_files = ["design.md"]
handoff = "design.md"
plan = ["design the cache", "package the handoff"]

[stages.review]
task = "Review the cache"
intent = "the cache is right before it ships"
launcher = "claude"
after = ["build"]
plan = ["read the package", "write the review"]
"""


ARM_NAMES = {(True, False): "learning on", (False, False): "learning off",
             (True, True): "learning on, careless builder", (False, True): "learning off, careless builder"}
"""(learning, a builder deaf to its brief's needs) -> the arm's name."""


@dataclass
class Handoff:
    name: str
    finished: bool = False
    wall_s: float = 0.0
    agent_s: float = 0.0
    """Seconds a ``claude`` agent was alive, summed over agents (sampled every :data:`SAMPLE` s)."""
    agent_cpu_s: float = 0.0
    """CPU seconds of the agents and their reaped children, at the last sample (a lower bound)."""
    runs: int = 0
    stages_done: int = 0
    questions: int = 0
    answered_by: list[str] = field(default_factory=list)
    answer_runs: list[str] = field(default_factory=list)
    """The outcome of each run that resumed the builder's session (``answer_run`` events)."""
    rederived: int = 0
    done_refused: int = 0
    refusals: list[str] = field(default_factory=list)
    """The first line of each refused ``done`` of the builder, as its tool result said."""
    required_in_brief: bool = False
    packaged: bool = False
    """The builder's ``handed_off`` package held the part (the ledger)."""
    critic_carried_first: bool = False
    """The critic's first request carried the rejected alternative's words (the model's record)."""
    resumed_history: list[bool] = field(default_factory=list)
    """Per request of the builder answering a question: it carried its earlier conversation."""
    answer_wait_s: float = 0.0
    """Asked → answered, summed (the ``answered`` events' ``wait_s``)."""
    requests: int = 0
    input_tokens: int = 0
    answer_tokens: int = 0
    """The input tokens of the requests of the builder's resumed session (after ``answer_started``)."""
    output_tokens: int = 0


@dataclass
class Arm:
    name: str
    handoffs: list[Handoff] = field(default_factory=list)
    learned: list[str] = field(default_factory=list)
    """The ``need_learned`` events' evidence, in order (the ledger)."""

    def total(self, key: str) -> float:
        return sum(getattr(h, key) for h in self.handoffs)

    @property
    def stages_per_agent_minute(self) -> float:
        minutes = self.total("agent_s") / 60
        return round(self.total("stages_done") / minutes, 2) if minutes else 0.0

    @property
    def stages_per_cpu_minute(self) -> float:
        minutes = self.total("agent_cpu_s") / 60
        return round(self.total("stages_done") / minutes, 2) if minutes else 0.0


def _env(model: ScriptedModel, home: Path) -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "LANG": "C.UTF-8", "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-scripted-model",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0"}


@contextmanager
def seam_model(log_dir: Path, seam: Seam) -> Iterator[ScriptedModel]:
    """The scripted model with the builder/critic mind, on 127.0.0.1."""
    log_dir.mkdir(parents=True, exist_ok=True)
    brain = SeamBrain(Record(log_dir / "model.jsonl"), seam=seam, controls=log_dir / "controls.json")
    model = ScriptedModel(brain, dict(ROUTES), log_dir).start()
    try:
        yield model
    finally:
        model.stop()


def _check(r: subprocess.CompletedProcess[str]) -> str:
    if r.returncode != 0:
        raise SystemExit(f"bench_learning: heartbeat {' '.join(map(str, r.args[5:]))}: {r.stderr.strip()}")
    return r.stdout


def _status(h: DaemonHarness, task: str) -> str:
    baton = h.try_baton(task)
    return baton.meta.status.value if baton is not None else ""


def run_arm(claude: Path, root: Path, *, learning: bool, handoffs: int, after: int, window: int,
            careless: bool = False) -> Arm:
    arm = Arm(ARM_NAMES[(learning, careless)])
    root.mkdir(mode=0o700, parents=True)
    home = root / "home"
    home.mkdir()
    with seam_model(root / "model", Seam(reads_needs=not careless)) as model:
        env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in _env(model, home).items())
        launcher = (f'\n[launchers.claude]\npreset = "claude-code"\nprogram = "{claude}"\nargs = {toml_list(ARGS)}\n'
                    f'inherit_env = false\nenv = {{ {env} }}\nstop_grace = "2s"\n')
        h = DaemonHarness(root, extra=launcher + learning_config(learning, after=after, window=window),
                          stall_after="10m", max_attempts=6)
        h.write_config(h.config_text().replace('default_launcher = "toy"', 'default_launcher = "claude"'))
        try:
            h.start()
            for i in range(1, handoffs + 1):
                handoff = _handoff(h, model, root, f"p{i}")
                arm.handoffs.append(handoff)
                if not handoff.finished:
                    break
            arm.learned = [str(e.data.get("evidence") or e.data) for e in h.store.ledger.events(kinds=["need_learned"])]
        finally:
            h.close()
    return arm


def _claudes(state: Path) -> dict[int, float]:
    """The live ``claude`` agents the daemon launched on this state dir, from the process table, each
    with the CPU seconds it and its reaped children (its tools' shells, heartbeat's commands) used so
    far: one pid per agent (a ``claude`` whose parent is a ``claude`` is that agent's helper, counted
    with it)."""
    found: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        try:
            argv = proc.info["cmdline"] or []
            if not any(Path(a).name == "claude" for a in argv[:2]) or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("HEARTBEAT_STATE_DIR") == str(state):
                found[proc.pid] = proc.info["ppid"]
                t = proc.cpu_times()
                cpu[proc.pid] = t.user + t.system + t.children_user + t.children_system
        except (psutil.Error, OSError):
            continue
    agents = {pid: cpu[pid] for pid, ppid in found.items() if ppid not in found}
    for pid, ppid in found.items():
        if ppid in agents:
            agents[ppid] += cpu[pid]
    return agents


def _handoff(h: DaemonHarness, model: ScriptedModel, root: Path, name: str) -> Handoff:
    """One pipeline, created and run to the critic's ``done``; its figures from the windows it ran in."""
    out = Handoff(name)
    work = root / "work" / name
    work.mkdir(parents=True)
    spec = root / f"{name}.toml"
    spec.write_text(pipeline_file(work))
    build, review = f"{name}.build", f"{name}.review"
    agent_s: dict[int, float] = {}
    agent_cpu: dict[int, float] = {}
    start = time.time()
    _check(h.cli("pipeline", "new", name, "--from", str(spec)))
    last = time.monotonic()
    deadline = last + HANDOFF_TIMEOUT
    while time.monotonic() < deadline:
        time.sleep(SAMPLE)
        now = time.monotonic()
        live = _claudes(h.state)
        for pid, used in live.items():
            agent_s[pid] = agent_s.get(pid, 0.0) + (now - last)
            agent_cpu[pid] = max(agent_cpu.get(pid, 0.0), used)
        last = now
        if _status(h, review) == "done" and not live:
            out.finished = True
            break
        if "escalated" in (_status(h, build), _status(h, review)):
            break
    end = time.time()
    out.wall_s = round(end - start, 1)
    out.agent_s = round(sum(agent_s.values()), 1)
    out.agent_cpu_s = round(sum(agent_cpu.values()), 1)
    out.runs = len(agent_s)
    out.stages_done = sum(_status(h, t) == "done" for t in (build, review))
    _score(out, h, model, name, start, end)
    return out


def _score(out: Handoff, h: DaemonHarness, model: ScriptedModel, name: str, start: float, end: float) -> None:
    record = [e for e in model.brain.record.entries() if start <= e["t"] <= end + 1]
    requests = [e for e in record if e["event"] == "request" and e["pipeline"] == name]
    notes = [e for e in record if e["event"] == "note" and not e.get("error")]
    out.questions = sum(1 for e in notes if e["command"].startswith(f"heartbeat ask {name}.review "))
    out.rederived = sum(1 for e in notes if e["command"].startswith(f"heartbeat add {name}.review rederived "))
    refused = [e for e in record if e["event"] == "note" and e.get("error")
               and e["command"].startswith(f"heartbeat done {name}.build ")]
    out.done_refused = len(refused)
    out.refusals = [" ".join(str(e.get("output", "")).split())[:200] for e in refused]
    out.required_in_brief = any(e.get("required") for e in requests if e["role"] == "builder")
    critic = [e for e in requests if e["role"] == "critic"]
    out.critic_carried_first = bool(critic) and bool(critic[0]["carried"])
    out.resumed_history = [bool(e.get("history")) for e in requests if e["role"] == "answer"]
    packages = h.store.ledger.events(f"{name}.build", kinds=["handed_off"])
    out.packaged = bool(packages) and SEAM.part not in packages[-1].data.get("missing", [SEAM.part])
    answered = h.store.ledger.events(f"{name}.review", kinds=["answered"])
    out.answered_by = [str(e.data.get("by", "")) for e in answered]
    out.answer_wait_s = round(sum(float(e.data.get("wait_s") or 0) for e in answered), 1)
    started = h.store.ledger.events(f"{name}.build", kinds=["answer_started"])
    out.answer_runs = [str(e.data.get("outcome", "")) for e in h.store.ledger.events(f"{name}.build",
                                                                                   kinds=["answer_run"])]
    served = [r for r in model.requests() if r.get("path", "").startswith("/v1/messages")
              and not r.get("path", "").startswith("/v1/messages/count_tokens") and start <= r["t"] <= end + 1]
    out.requests = len(served)
    out.input_tokens = sum(int(r.get("input_tokens", 0)) for r in served)
    out.output_tokens = sum(int(r.get("output_tokens", 0)) for r in served)
    resumed = [(str(e.data.get("session", "")), e.ts.timestamp()) for e in started]
    out.answer_tokens = sum(int(r.get("input_tokens", 0)) for r in served
                            if any(r.get("session") == sid and r["t"] >= at for sid, at in resumed))


PER_HANDOFF = [("agent runs", "runs"), ("questions asked", "questions"), ("parts re-derived", "rederived"),
               ("`done` refused", "done_refused"), ("input tokens", "input_tokens"),
               ("of which the resumed builder", "answer_tokens"), ("agent s", "agent_s"), ("agent CPU s", "agent_cpu_s"),
               ("wall s", "wall_s")]
TOTALS = [("stages done", "stages_done"), ("agent time (s)", "agent_s"), ("agent CPU (s)", "agent_cpu_s"),
          ("agent runs", "runs"), ("questions asked", "questions"), ("parts re-derived", "rederived"),
          ("`done` refused", "done_refused"), ("builder briefs that named the need", "required_in_brief"),
          ("model requests", "requests"), ("input tokens (model's count)", "input_tokens"),
          ("input tokens of resumed builders", "answer_tokens"), ("time to answer (s)", "answer_wait_s"),
          ("wall time (s)", "wall_s")]


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    text = f"{med:g}" if isinstance(med, float) else str(med)
    return text if min(values) == max(values) else f"{text} ({min(values):g}-{max(values):g})"


def _witness(h: Handoff) -> str:
    parts = ["package had it" if h.packaged else "package lacked it",
             "critic's first request carried it" if h.critic_carried_first else "critic's first request lacked it"]
    if h.required_in_brief:
        parts.append("the builder's brief named the need")
    if h.done_refused:
        parts.append(f"builder's done refused {h.done_refused}x")
    if h.resumed_history:
        parts.append("resumed builder had its history" if all(h.resumed_history) else "resumed builder LOST its history")
    return "; ".join(parts)


def report(arms: dict[str, list[Arm]]) -> str:
    lines: list[str] = []
    runs = max(len(v) for v in arms.values())
    count = max((len(a.handoffs) for v in arms.values() for a in v), default=0)
    names = list(arms)
    lines.append(f"{runs} run(s) per arm; median (range). Per handoff, {' / '.join(names)}:\n")
    lines.append("| handoff | " + " | ".join(label for label, _ in PER_HANDOFF) + " |")
    lines.append("|---|" + "---|" * len(PER_HANDOFF))
    for i in range(count):
        cells = []
        for _, key in PER_HANDOFF:
            per = [_median([getattr(a.handoffs[i], key) for a in arms[n] if i < len(a.handoffs)]) for n in names]
            cells.append(" / ".join(per))
        lines.append(f"| p{i + 1} | " + " | ".join(cells) + " |")
    lines.append("\nIn sum:\n")
    lines.append(f"| metric | {' | '.join(names)} |")
    lines.append("|---|" + "---|" * len(names))
    lines.append("| finished handoffs | " + " | ".join(
        _median([sum(h.finished for h in a.handoffs) for a in arms[n]]) for n in names) + " |")
    lines.append("| **stages done per agent-minute** | " + " | ".join(
        _median([a.stages_per_agent_minute for a in arms[n]]) for n in names) + " |")
    lines.append("| stages done per agent CPU-minute | " + " | ".join(
        _median([a.stages_per_cpu_minute for a in arms[n]]) for n in names) + " |")
    for label, key in TOTALS:
        lines.append(f"| {label} | " + " | ".join(_median([a.total(key) for a in arms[n]]) for n in names) + " |")
    lines.append("\nThe witness (the scripted model's record and the ledger's packages), first run of each arm:\n")
    for n in names:
        for h in arms[n][0].handoffs:
            answered = f"; answered by {', '.join(h.answered_by)} ({', '.join(h.answer_runs)})" if h.answered_by else ""
            lines.append(f"- {n}, {h.name}: {_witness(h)}{answered}")
        for evidence in arms[n][0].learned:
            lines.append(f"- {n}: learned: {evidence}")
    return "\n".join(lines)


def load(path: Path) -> dict[str, list[Arm]]:
    """The arms of a ``--json`` output."""
    doc = json.loads(path.read_text())
    fields = set(Handoff.__dataclass_fields__)
    return {name: [Arm(a["name"], [Handoff(**{k: v for k, v in h.items() if k in fields}) for h in a["handoffs"]],
                       list(a.get("learned", []))) for a in runs] for name, runs in doc.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per arm (default 3)")
    parser.add_argument("--handoffs", type=int, default=5, help="handoffs in a row per arm (default 5)")
    parser.add_argument("--learn-after", type=int, default=2, help="K: the part missing in K of ... (default 2)")
    parser.add_argument("--learn-window", type=int, default=3, help="... the last N handoffs (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="the smoke: one run, two handoffs, learning on only, learned after one")
    parser.add_argument("--json", action="store_true", help="the raw figures")
    parser.add_argument("--report", metavar="FILE", help="print the tables of a --json output, running nothing")
    args = parser.parse_args(argv)
    if args.report:
        print(report(load(Path(args.report))))
        return 0
    if min(args.runs, args.handoffs, args.learn_after, args.learn_window) < 1:
        parser.error("--runs, --handoffs, --learn-after and --learn-window take a whole number of at least 1")
    # a SIGTERM (a timeout, a person) unwinds like ^C, so every arm's daemon and agents are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    claude = install("claude")
    if isinstance(claude, str):
        print(f"bench_learning: {claude}", file=sys.stderr)
        return 2
    plan = [(True, False)] if args.quick else [(True, False), (False, False), (True, True)]
    runs, handoffs = (1, 2) if args.quick else (args.runs, args.handoffs)
    after, window = (1, 1) if args.quick else (args.learn_after, args.learn_window)
    arms: dict[str, list[Arm]] = {ARM_NAMES[p]: [] for p in plan}
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp:
        for i in range(runs):
            for n, (on, careless) in enumerate(plan):
                arms[ARM_NAMES[(on, careless)]].append(run_arm(
                    claude, Path(tmp) / f"arm{n}-{i}", learning=on, handoffs=handoffs, after=after, window=window,
                    careless=careless))
    if args.json:
        print(json.dumps({name: [{**asdict(a), "stages_per_agent_minute": a.stages_per_agent_minute,
                                  "stages_per_cpu_minute": a.stages_per_cpu_minute}
                                 for a in runs_] for name, runs_ in arms.items()}, indent=2))
    else:
        print(report(arms))
    finished = all(h.finished for v in arms.values() for a in v for h in a.handoffs) and all(
        len(a.handoffs) == handoffs for v in arms.values() for a in v)
    return 0 if finished else 1


if __name__ == "__main__":
    raise SystemExit(main())
