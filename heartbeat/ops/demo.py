"""``heartbeat demo``: the whole idea in under a minute, on a temporary state dir.

A real daemon (``heartbeat run``, a subprocess with a half-second tick) supervises two
toy agents. The demo kills one agent mid-task with SIGKILL; the daemon notices, and the
successor it dispatches reads the baton and resumes at the next step instead of starting
over. The second task is blocked: it is held, tick after tick, until a human unblocks it.

A second act hands work from one agent to another: a pipeline builder → critic. The
critic's brief carries the builder's constraints and decisions; someone breaks the
builder's guarantee, the critic's ``verify`` says ``broken`` and the builder is reopened;
once it holds its promise again the critic finishes, and ``report --edges`` shows it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from heartbeat.model.errors import HeartbeatError
from heartbeat.model.ledger import EventKind
from heartbeat.system.layout import StateLayout

__all__ = ["run_demo"]

PLAN = ["Reproduce the empty response", "Write a failing test", "Fix the fallback path",
        "Run the test suite", "Update the changelog"]


class _Demo:
    def __init__(self, root: str) -> None:
        self.root = root
        self.config = os.path.join(root, "heartbeat.toml")
        self.state = os.path.join(root, "state")
        self.started = time.monotonic()
        self.daemon: subprocess.Popen[bytes] | None = None

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def hb(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "--config", self.config, *args],
                              capture_output=True, text=True, env=env, timeout=60, cwd=self.root)
        if proc.returncode != 0:
            raise HeartbeatError(f"heartbeat {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def baton(self, task_id: str) -> dict[str, Any]:
        return dict(json.loads(self.hb("show", task_id, "--json")))

    def wait(self, what: str, predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.daemon is not None and self.daemon.poll() is not None:
                raise HeartbeatError(f"the daemon exited ({self.daemon.returncode}); see {self.state}/daemon.log")
            time.sleep(0.1)
        raise HeartbeatError(f"timed out waiting for {what}; see {self.state}/daemon.log")

    def write_config(self) -> None:
        agent = [sys.executable, "-m", "heartbeat.toyagent", "--step-time", "1.2"]
        text = f"""\
[daemon]
state_dir = {json.dumps(self.state)}
tick = "500ms"
stall_after = "15s"
backoff_initial = "1s"
backoff_max = "5s"
default_launcher = "toy"
log_format = "json"

[launchers.toy]
type = "exec"
command = {json.dumps(agent)}
stop_grace = "2s"

[launchers.builder]
type = "exec"
command = {json.dumps([*agent[:-1], "0.6"])}
stop_grace = "2s"

[launchers.critic]
type = "exec"
command = {json.dumps([*agent[:-1], "0.8", "--mode", "critic"])}
stop_grace = "2s"

[checks.artifact]
command = ["test", "-f", "{{workdir}}/cache.built"]
timeout = "5s"
"""
        with open(self.config, "w", encoding="utf-8") as handle:
            handle.write(text)

    def start_daemon(self) -> None:
        os.makedirs(self.state, mode=0o700, exist_ok=True)
        log = open(os.path.join(self.state, "daemon.log"), "wb")  # noqa: SIM115 (the daemon writes it)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        env.pop("NOTIFY_SOCKET", None)
        self.daemon = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", self.config, "run"],
                                       stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root)
        log.close()

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()


def run_demo(args: Any) -> int:
    root = tempfile.mkdtemp(prefix="heartbeat-demo-")
    os.chmod(root, 0o700)
    demo = _Demo(root)
    try:
        return _story(demo)
    except HeartbeatError as exc:
        demo.say(f"demo failed: {exc}")
        return 1
    finally:
        demo.stop_daemon()
        _stop_leftover_agents(demo)
        if getattr(args, "keep", False):
            print(f"\nKept the demo's files in {root} (config, state/batons, state/logs, state/ledger.sqlite3).")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _story(demo: _Demo) -> int:
    say = demo.say
    demo.write_config()
    say(f"A temporary heartbeat in {demo.root}: a daemon ticking every 0.5 s, a toy agent as the launcher.")
    demo.start_daemon()
    plan_args = [a for step in PLAN for a in ("--plan", step)]
    demo.hb("new", "fix-fallback", "--task", "Fix empty responses in the fallback path",
            "--intent", "Users get blank answers when the primary model times out; make that impossible.",
            "--step", PLAN[0], "--next", PLAN[1], "--constraint", "Do not touch config/prod.yaml",
            "--workdir", demo.root, *plan_args)
    demo.hb("new", "deploy", "--task", "Deploy the fix", "--step", "Roll out to production",
            "--intent", "Ship the fix once a human has signed off.", "--workdir", demo.root,
            "--blocked-on", "waiting for the release manager's sign-off")
    say("Created two batons: 'fix-fallback' (a 5-step plan) and 'deploy' (blocked until a human signs off).")

    first = demo.wait("the first agent", lambda: _owner_pid(demo.baton("fix-fallback")))
    say(f"The daemon dispatched an agent for fix-fallback: pid {first}, epoch 1.")
    demo.wait("two steps done", lambda: len(demo.baton("fix-fallback")["done"]) >= 2)
    before = demo.baton("fix-fallback")
    _kill_group(first)
    say(f"Killed the agent (SIGKILL) mid-task, on step {before['step']!r} with {len(before['done'])}/5 done. "
        "Its context is gone.")

    def successor() -> dict[str, Any] | None:
        b = demo.baton("fix-fallback")
        return b if b["meta"]["epoch"] >= 2 and _owner_pid(b) else None

    after = demo.wait("the successor", successor)
    meta = after["meta"]
    say(f"The daemon saw the agent was gone and dispatched a successor: pid {_owner_pid(after)}, "
        f"epoch {meta['epoch']}, attempt {meta['attempt']}.")
    brief_path = StateLayout(demo.state).brief("fix-fallback", meta["epoch"])
    if os.path.exists(brief_path):
        with open(brief_path, encoding="utf-8") as handle:
            head = [line for line in handle.read().splitlines() if line.strip()][:6]
        say("Its brief (what it reads first) begins:")
        for line in head:
            print(f"           | {line}")

    held = demo.baton("deploy")
    say(f"Meanwhile 'deploy' is held: status {held['meta']['status']}, dispatched {held['meta']['dispatches']} "
        "times. A blocked task is never dispatched.")

    done = demo.wait("fix-fallback to finish", lambda: demo.baton("fix-fallback")["meta"]["status"] == "done",
                     timeout=40)
    final = demo.baton("fix-fallback")
    redone = _redone_steps(demo)
    say(f"fix-fallback is done: {len(final['done'])}/5 steps, {final['meta']['dispatches']} agents, "
        f"{'no step redone' if not redone else f'steps redone: {redone}'} — the successor resumed from the baton.")
    assert done
    demo.hb("unblock", "deploy", "--by", "release-manager", "--note", "signed off")
    say("A human ran `heartbeat unblock deploy --by release-manager`.")
    demo.wait("deploy to be dispatched", lambda: demo.baton("deploy")["meta"]["dispatches"] >= 1)
    say("The daemon dispatched 'deploy' on its next look.")
    demo.wait("deploy to finish", lambda: demo.baton("deploy")["meta"]["status"] == "done", timeout=30)
    say("deploy is done.")
    _second_act(demo)
    print()
    print(demo.hb("status"))
    try:
        print(demo.hb("report"))
        print(demo.hb("report", "--edges"))
    except HeartbeatError:
        pass
    say("That is heartbeat: the baton carried the work across the gap; the clock noticed the gap.")
    return 0


PIPELINE = """\
[stages.builder]
task = "Build the response cache"
intent = "Cut p95 latency under 200 ms without a new service."
constraints = ["No new services: the cache lives in-process"]
plan = ["decide: key the cache by user id, not by URL (URLs carry tracking params)", "Write the cache"]
key_files = ["cache.built"]
launcher = "builder"
guarantees = [{ text = "the cache artifact exists", check = "artifact" }]

[stages.critic]
task = "Review the cache"
intent = "A second pair of eyes before it ships."
launcher = "critic"
after = ["builder"]
"""


def _second_act(demo: _Demo) -> None:
    say = demo.say
    print()
    say("Act 2: one agent's work becomes another's input. A pipeline: builder -> critic.")
    path = os.path.join(demo.root, "feature.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(PIPELINE)
    demo.hb("pipeline", "new", "feature", "--from", path)
    say("`heartbeat pipeline new feature --from feature.toml`: the critic is held until the builder is done.")
    brief_path = StateLayout(demo.state).brief("feature.critic", 1)
    demo.wait("the critic's dispatch", lambda: os.path.exists(brief_path), timeout=40)
    artifact = os.path.join(demo.root, "cache.built")
    if os.path.exists(artifact):
        os.unlink(artifact)  # before the critic verifies: it reads its brief first
    say("The builder finished; the daemon dispatched the critic. Its brief carries the builder's package:")
    with open(brief_path, encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("## Constraints")), 0)
    end = next((i for i, line in enumerate(lines) if line.startswith("## Where things stand")), len(lines))
    for line in lines[start:end][:14]:
        print(f"           | {line}")
    say("Meanwhile someone deleted cache.built: the builder's guarantee no longer holds.")

    def reopened() -> dict[str, Any] | None:
        b = demo.baton("feature.builder")
        return b if b["meta"].get("last_failure") and b["meta"]["dispatches"] >= 1 else None

    builder = demo.wait("the critic's verify to reopen the builder", reopened, timeout=30)
    say(f"The critic ran `heartbeat verify`: broken (exit 3). Policy reopen: the builder is back to work "
        f"({builder['meta']['last_failure']}); the critic waits.")
    demo.wait("the critic to finish", lambda: demo.baton("feature.critic")["meta"]["status"] == "done", timeout=60)
    builder = demo.baton("feature.builder")
    say(f"The builder made the artifact again and finished ({builder['meta']['dispatches']} agents); the critic "
        "verified fresh and finished.")


def _owner_pid(baton: dict[str, Any]) -> int | None:
    owner = baton.get("meta", {}).get("owner") or {}
    pid = owner.get("pid")
    return int(pid) if pid else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _redone_steps(demo: _Demo) -> list[str]:
    events = json.loads(demo.hb("log", "fix-fallback", "--json"))["events"]
    started: dict[str, int] = {}
    for e in events:
        if e["kind"] == EventKind.UPDATED and "step" in e["data"].get("changed", []):
            step = e["data"].get("step", "")
            started[step] = started.get(step, 0) + 1
    return [s for s, n in started.items() if n > 1]


def _stop_leftover_agents(demo: _Demo) -> None:
    batons = StateLayout(demo.state).batons_dir
    if not os.path.isdir(batons):
        return
    for name in os.listdir(batons):
        if name.endswith(".toml") and not name.startswith("."):
            try:
                pid = _owner_pid(demo.baton(name[:-5]))
            except (HeartbeatError, ValueError):
                continue
            if pid:
                _kill_group(pid)
