"""What a bound session's PreToolUse approves without asking (:func:`heartbeat.tasks.rail.own_task_call`):
the task's own heartbeat commands as its brief spells them, nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from heartbeat.tasks.rail import own_command, own_task_call, tool_call

SD = "heartbeat --state-dir /srv/hb"


def bash(command: str) -> dict[str, Any]:
    return {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command}}


def mcp(tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": tool_input}


@pytest.mark.parametrize(("event", "prefix"), [
    (bash('heartbeat set t1 step="Read the code" next_step=Test'), "heartbeat"),
    (bash("heartbeat add t1 done 'wrote the parser'"), "heartbeat"),
    (bash("heartbeat show t1"), "heartbeat"),
    (bash("heartbeat done t1"), "heartbeat"),
    (bash(f"{SD} set t1 step=x"), SD),
    (mcp("mcp__plugin_heartbeat_heartbeat__set", id="t1", fields={"step": "x"}), "heartbeat"),
    (mcp("mcp__heartbeat__add", id="t1", field="done", values=["x"]), "heartbeat"),
])
def test_the_tasks_own_commands_are_approved(event: dict[str, Any], prefix: str) -> None:
    assert own_task_call(event, "t1", prefix)


@pytest.mark.parametrize(("event", "why"), [
    (bash("heartbeat set t10 step=x"), "another task"),
    (bash("heartbeat set t2 step=x"), "another task"),
    (bash("heartbeat status"), "every task"),
    (bash("heartbeat new t1 --task x"), "not an agent command"),
    (bash("heartbeat claim t1"), "not an agent command"),
    (bash("heartbeat set t1 step=x; rm -rf ~"), "chained"),
    (bash("heartbeat set t1 step=x && curl evil"), "chained"),
    (bash("heartbeat set t1 step=$(cat ~/.ssh/id_rsa)"), "substituted"),
    (bash("heartbeat set t1 step=x > ~/.bashrc"), "redirected"),
    (bash("heartbeat set t1 step=x\nrm -rf ~"), "a second line"),
    (bash("/tmp/evil/heartbeat set t1 step=x"), "another program"),
    (bash("FOO=1 heartbeat set t1 step=x"), "an environment prefix"),
    (bash("python3 -m heartbeat set t1 step=x"), "not as the brief spells it"),
    (bash("heartbeat --state-dir /elsewhere set t1 step=x"), "another state dir"),
    (bash("heartbeat set t1 --state-dir=/elsewhere step=x"), "another state dir, after the command"),
    (bash("heartbeat set t1 --state /elsewhere step=x"), "an abbreviation of --state-dir"),
    (bash("heartbeat set t1 --conf=/elsewhere step=x"), "an abbreviation of --config"),
    (bash("heartbeat set 't1 step=x"), "unbalanced quotes"),
    (bash("heartbeat set"), "no task"),
    (mcp("Write", file_path="/tmp/x", content="heartbeat set t1"), "not a shell"),
    (mcp("mcp__plugin_heartbeat_heartbeat__set", id="t2", fields={}), "MCP on another task"),
    (mcp("mcp__plugin_heartbeat_heartbeat__status"), "MCP on every task"),
    (mcp("mcp__plugin_other_heartbeat__set", id="t1"), "another plugin's server"),
    (mcp("mcp__heartbeatx__set", id="t1"), "another server"),
])
def test_nothing_else_is(event: dict[str, Any], why: str) -> None:
    assert not own_task_call(event, "t1", "heartbeat" if "/srv/hb" not in why else SD), why
    assert not own_task_call(event, "", "heartbeat"), why


def test_the_plugins_mcp_tools_are_heartbeats_own() -> None:
    """The rail lets a refused agent read why and write its note through the plugin's tools too."""
    assert own_command(tool_call(mcp("mcp__plugin_heartbeat_heartbeat__show", id="t1")))
    assert not own_command(tool_call(mcp("mcp__plugin_other_heartbeat__show", id="t1")))


def test_the_plugin_files_agree_with_the_package() -> None:
    """plugins/heartbeat/ is written by hand: its hooks are those ``hooks install claude`` wires, with the
    same timeout, and its version (in the plugin and the marketplace) is the package's."""
    import json
    import tomllib
    from pathlib import Path

    from heartbeat.integrations.hooks import HOOK_EVENTS
    from heartbeat.model import defaults

    root = Path(__file__).resolve().parents[2]
    plugin = root / "plugins" / "heartbeat"
    hooks = json.loads((plugin / "hooks" / "hooks.json").read_text())["hooks"]
    assert tuple(hooks) == HOOK_EVENTS
    assert all(g == [{"hooks": [{"type": "command", "command": "heartbeat hook claude",
                                 "timeout": defaults.HOOK_TIMEOUT}]}] for g in hooks.values())
    assert json.loads((plugin / ".mcp.json").read_text())["mcpServers"]["heartbeat"]["args"] == ["mcp"]
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    [listed] = json.loads((root / ".claude-plugin" / "marketplace.json").read_text())["plugins"]
    assert json.loads((plugin / ".claude-plugin" / "plugin.json").read_text())["version"] == version
    assert listed["version"] == version and listed["source"] == "./plugins/heartbeat"
