"""The rail and the trail with the real ``codex`` (pinned 0.171.0) under the daemon, with no install.

The codex preset passes heartbeat's ``PreToolUse``/``PostToolUse`` hooks as ``-c`` overrides of the
run, with the trust entry of exactly those two hooks (``hooks.state``): codex runs them without
``hooks install``, without ``--dangerously-bypass-hook-trust`` and without a file of the person's
being written. The CODEX_HOME here is empty. Judged by the scripted model's own record of the tool
results codex sent back.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonHarness, toml_list
from scripted_model import Workload, scripted_model, step_file
from scripted_model.responses import codex_args

from tests.external.test_codex import NO_TMP, STEPS, codex, codex_env, root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

RAIL = "heartbeat refused"


def hooks_list(codex: Path, env: dict[str, str], cwd: Path,  # noqa: F811
               overrides: list[str]) -> list[dict[str, Any]]:
    """codex's own account of its hooks and their trust (``hooks/list`` of ``codex app-server``)."""
    requests = [{"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "hb-test", "version": "1"}}},
                {"method": "initialized"}, {"id": 2, "method": "hooks/list", "params": {"cwds": [str(cwd)]}}]
    proc = subprocess.Popen([str(codex), "app-server", *overrides], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, cwd=str(cwd), text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        proc.stdin.flush()
        for line in proc.stdout:
            reply = json.loads(line) if line.startswith("{") else {}
            if reply.get("id") == 2:
                return [h for entry in reply["result"]["data"] for h in entry["hooks"]]
        raise AssertionError("codex app-server ended without answering hooks/list")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_codex_trusts_the_presets_own_hooks_for_the_run(codex: Path, root: Path) -> None:  # noqa: F811
    """codex 0.171 lists the preset's two ``-c`` hooks as trusted: the hash heartbeat computes is codex's
    ``currentHash`` (a codex that hashes differently fails here, not silently in a run)."""
    from heartbeat.presets.common import codex_rail_overrides, codex_trusted_hash

    overrides = [a for v in codex_rail_overrides().values() for a in ("-c", v)]
    hooks = hooks_list(codex, codex_env(root), root / "work", overrides)
    ours = {h["eventName"]: h for h in hooks if h["command"].endswith("hook codex # heartbeat-hook")}
    assert set(ours) == {"preToolUse", "postToolUse"}, hooks
    assert all(h["trustStatus"] == "trusted" and h["source"] == "sessionFlags" for h in ours.values()), ours
    # the trust is of this exact hook: the same command in the user's hooks.json stays for the person to review
    (root / "home" / ".codex" / "hooks.json").write_text(json.dumps({"hooks": {"PreToolUse": [
        {"matcher": "*", "hooks": [{"type": "command", "command": ours["preToolUse"]["command"], "timeout": 30}]}]}}))
    user = [h for h in hooks_list(codex, codex_env(root), root / "work", overrides) if h["source"] == "user"]
    assert [h["trustStatus"] for h in user] == ["untrusted"], user
    # the person's own trust in config.toml stays in force beside the run's (codex merges the layers)
    trusted = codex_trusted_hash("pre_tool_use", ours["preToolUse"]["command"], 30)
    (root / "home" / ".codex" / "config.toml").write_text(
        f'[hooks.state.{json.dumps(user[0]["key"])}]\ntrusted_hash = "{trusted}"\n')
    listed = hooks_list(codex, codex_env(root), root / "work", overrides)
    assert [h["trustStatus"] for h in listed if h["source"] == "user"] == ["trusted"], listed
    assert [h["trustStatus"] for h in listed if h["source"] == "sessionFlags"] == ["trusted", "trusted"], listed


def test_a_block_set_while_codex_works_stops_its_next_tool_call(codex: Path, root: Path,  # noqa: F811
                                                                tmp_path: Path) -> None:
    """No hooks install, no bypass flag, an empty CODEX_HOME: the model holds its answer after step 1's
    write, a person blocks the task, and released, codex's next write (step 2) is refused by the rail with
    the block's reason; the trail holds the calls codex made (fails on 69ff15e: step 2 was written)."""
    model_dir = tmp_path / "model"
    with scripted_model(model_dir, Workload(steps=STEPS), sees_files=False, wires=("responses",)) as model:
        env = codex_env(root)
        args = ["--sandbox", "workspace-write", "-c", "allow_login_shell=false", *NO_TMP, *codex_args(model.url)]
        extra = f"""
[launchers.codex]
preset = "codex"
program = "{codex}"
args = {toml_list(args)}
inherit_env = ["LANG"]
env = {{ PATH = "{env['PATH']}", HOME = "{env['HOME']}", CODEX_HOME = "{env['CODEX_HOME']}", SCRIPTED_KEY = "sk-scripted" }}
"""
        h = DaemonHarness(root, extra=extra, stall_after="180s", max_attempts=2)
        record = model.brain.record

        def refused() -> list[dict[str, Any]]:
            return [e for e in record.entries() if e["event"] == "refused" and RAIL in e["reason"]]

        try:
            (model_dir / "controls.json").write_text(json.dumps({"hold_after_step": 1}))
            h.start()
            r = h.cli("new", "fix", "--task", "Fix empty responses", "--intent", "Users get blank answers",
                      "--step", STEPS[0], "--next", STEPS[1], "--workdir", str(root / "work"), "--launcher", "codex")
            assert r.returncode == 0, r.stderr
            h.wait(lambda: any(e["event"] == "held" for e in record.entries()), "the model holding step 1",
                   timeout=180)
            assert h.cli("block", "fix", "--on", "Dana's review of the fallback").returncode == 0
            tmp = model_dir / "controls.tmp"
            tmp.write_text("{}")
            os.replace(tmp, model_dir / "controls.json")
            h.wait(refused, "the rail refusing codex's next call", timeout=120)
            first = refused()[0]
            assert "is blocked" in first["reason"] and "Dana's review of the fallback" in first["reason"], first
            assert not (root / "work" / step_file(1)).exists()
            assert [e["step"] for e in record.entries() if e["event"] == "step_done"] == [STEPS[0]]
            assert [e.data["rule"] for e in h.events("fix", "rail_refused")][:1] == ["not_active"]
        finally:
            h.close()
    assert not (root / "home" / ".codex" / "hooks.json").exists()
    assert not (root / "home" / ".codex" / "config.toml").exists()
    from heartbeat.hotpath.trail import read_calls

    calls = [c for path in (h.state / "logs" / "fix").glob("*.trail") for c in read_calls(str(path))[0]]
    # the trail's two ends: step 1's write started and returned ok (PreToolUse, then PostToolUse)
    assert any(step_file(0) in c.what and c.finished and c.ok for c in calls), calls
