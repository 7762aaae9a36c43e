"""The real ``claude`` under the daemon: the unnoted sliver is handed on (issue 25, item 5).

The daemon runs the pinned ``claude`` through the ``claude-code`` preset against the scripted
model on 127.0.0.1, with heartbeat's hooks installed in the workdir (``hooks install claude``,
a person's one step). Step 2 of the workload makes an external call first (``pay``: a
payment no file in the workdir shows); the agent is killed after it returned and before the
step's note. What the agent did is judged by the scripted model's own record, and by the
payment service's own log.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_clis import agent_cli
from daemon_harness import DaemonHarness, toml_list
from scripted_model import ScriptedModel, Workload, scripted_model

from tests.external.test_real_sessions import README_ARGS, STEPS, claude_env

pytestmark = pytest.mark.slow

PAY = "pay --invoice 2"
"""Step 2's external effect: the command the scripted model runs (``pay`` appends to the service's log)."""


def pay_script(bin_dir: Path, ledger: Path) -> None:
    bin_dir.mkdir()
    script = bin_dir / "pay"
    script.write_text(f"#!/bin/sh\necho \"paid $*\" >> '{ledger}'\necho paid\n")
    script.chmod(0o755)


class PayRun:
    """A daemon whose ``claude`` runs in a workdir with the hooks installed and ``pay`` allowed."""

    def __init__(self, root: Path, model: ScriptedModel, *, stall_after: str = "180s", daemon: str = "") -> None:
        root.chmod(0o700)
        self.model = model
        self.work = root / "work"
        self.work.mkdir()
        home = root / "home"
        home.mkdir()
        self.payments = root / "payments.log"
        pay_script(root / "bin", self.payments)
        env = claude_env(model, home)
        env["PATH"] = f"{root / 'bin'}:{env['PATH']}"
        pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
        extra = f"""
[launchers.claude]
preset = "claude-code"
program = "{agent_cli("claude")}"
args = {toml_list(README_ARGS)}
inherit_env = ["LANG"]
env = {{ {pairs} }}
stop_grace = "2s"
"""
        self.h = DaemonHarness(root, extra=extra, stall_after=stall_after, max_attempts=4)
        text = self.h.config_text().replace('default_launcher = "toy"', 'default_launcher = "claude"')
        self.h.write_config(text.replace('log_level = "debug"\n', f'log_level = "debug"\n{daemon}\n'))
        r = self.h.cli("hooks", "install", "claude", "--dir", str(self.work))
        assert r.returncode == 0, r.stderr
        local = self.work / ".claude" / "settings.local.json"
        doc = json.loads(local.read_text())
        doc["permissions"]["allow"].append("Bash(pay:*)")  # the person lets the agent make the call
        local.write_text(json.dumps(doc))

    def control(self, **controls: object) -> None:
        path = self.model.log_dir / "controls.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(controls))
        tmp.replace(path)

    def new(self, task: str) -> None:
        plan = [a for s in STEPS for a in ("--plan", s)]
        r = self.h.cli("new", task, "--task", "Bill the customer", "--intent", "The invoice is paid once",
                       "--step", STEPS[0], "--next", STEPS[1], *plan, "--workdir", str(self.work))
        assert r.returncode == 0, r.stderr

    def record(self) -> list[dict[str, object]]:
        return self.model.brain.record.entries()

    def status(self, task: str) -> str:
        return self.h.baton(task).meta.status.value


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedModel]:
    agent_cli("claude")  # skip early, with the reason, when the CLI cannot be had
    with scripted_model(tmp_path / "model", Workload(steps=STEPS, effects={STEPS[1]: PAY}), sees_files=False) as m:
        yield m


class TestTheUnnotedSliver:
    """A kill between an external effect and its note: the fresh successor is told, and pays nothing twice."""

    def test_a_fresh_successor_does_not_repeat_the_payment(self, tmp_path: Path, model: ScriptedModel) -> None:
        """The model holds its answer after `pay` returned, before step 2's write and note; the agent's
        process group is SIGKILLed there. The successor (a fresh session from the brief) finishes the
        task; the model's record holds one `pay` and the successor's `effect_skipped`, the payment
        service's log one payment (fails on 4c852cf: the brief said nothing of the call, the successor
        paid again: two `effect` entries, two payments)."""
        run = PayRun(tmp_path, model)
        run.control(hold_after_effect=2)
        try:
            run.h.start()
            run.new("bill")
            run.h.wait(lambda: any(e["event"] == "held" for e in run.record()), "the model holding after pay",
                       timeout=240)
            groups = run.h.live_agents("bill")["bill"]
            run.control()  # the successor gets answers
            for pgid in groups:
                os.killpg(pgid, signal.SIGKILL)
            run.h.wait(lambda: run.status("bill") == "done", "the successor finishing", timeout=300)
            record = run.record()
            effects = [e for e in record if e["event"] == "effect"]
            assert [e["command"] for e in effects] == [PAY], record
            assert [e for e in record if e["event"] == "effect_skipped"], "the successor was not told of the call"
            assert run.payments.read_text().splitlines() == ["paid --invoice 2"]
            assert [e["step"] for e in record if e["event"] == "step_done"] == list(STEPS)
            assert len(run.h.events("bill", "dispatched")) == 2
            brief = (run.h.state / "logs" / "bill" / "2.brief.md").read_text()
            assert "Since the last note, the last run did" in brief and f"`{PAY}` - ok" in brief
            [killed] = [e for e in run.h.events("bill", "exited") if e.epoch == 1]
            assert killed.data["unnoted"]["calls"] == 1 and killed.data["unnoted"]["last"][0]["what"] == PAY
            r = run.h.cli("report", "--json")
            assert json.loads(r.stdout)["tasks"][0]["metrics"]["unnoted_calls"] == 1, r.stdout
        finally:
            run.h.close()


class TestAHungModel:
    """The trail tells a wait on the model from a tool call in flight."""

    def test_a_model_that_answers_nothing_is_stopped_at_hang_after_not_stall_after(
            self, tmp_path: Path, model: ScriptedModel) -> None:
        """The model answers nothing from the first request (claude waits, no tool runs): with
        hang_after 8s and stall_after 10m the agent is stopped as model_hung within seconds, and once
        the model answers a successor finishes (fails on 4c852cf: no hang_after key, the agent waits
        out stall_after)."""
        run = PayRun(tmp_path, model, stall_after="10m", daemon='hang_after = "8s"')
        run.control(hang=True)
        try:
            run.h.start()
            run.new("stuck")
            stopped = run.h.wait(lambda: run.h.events("stuck", "stopped"), "the hung agent stopped", timeout=120)
            assert stopped[0].data["why"] == "model_hung", stopped[0].data
            run.control()
            run.h.wait(lambda: run.status("stuck") == "done", "a successor to finish", timeout=300)
        finally:
            run.h.close()
