"""A person's own session on a task the daemon also runs (issue 26 item 10).

``HEARTBEAT_TASK=ID claude`` binds a session by hand: its SessionStart hook claims the task for
the session's process, so the daemon dispatches no second, headless agent onto it. Here the hook
runs for real (``heartbeat hook claude``, a subprocess of a stand-in session process that stays
alive, as the CLI does), and the daemon for real (``heartbeat run --once``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env

HB = [sys.executable, "-m", "heartbeat"]
SESSION = """import subprocess, sys, time
r = subprocess.run(sys.argv[1:], input=sys.stdin.read(), capture_output=True, text=True)
print(json.dumps([r.returncode, r.stdout, r.stderr]), flush=True)
time.sleep(120)
""".replace("import subprocess", "import json, subprocess")
"""A stand-in for the agent CLI: runs the hook once (as Claude Code runs a hook), then lives on."""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, Path, list[subprocess.Popen[str]]]]:
    tmp_path.chmod(0o700)
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "dispatched"
    config = tmp_path / "heartbeat.toml"
    config.write_text(f"""[daemon]
state_dir = "state"
default_launcher = "agent"

[launchers.agent]
command = ["touch", "{marker}"]
""")
    r = subprocess.run([*HB, "--config", str(config), "new", "t1", "--task", "Fix the fallback", "--step", "Read",
                        "--workdir", str(work)], capture_output=True, text=True, env=clean_env())
    assert r.returncode == 0, r.stderr
    procs: list[subprocess.Popen[str]] = []
    yield config, work, procs
    for p in procs:
        p.kill()
        p.wait()


def session_start(config: Path, work: Path, procs: list[subprocess.Popen[str]]) -> tuple[int, str]:
    """Start a stand-in session bound by hand to t1; its pid and the SessionStart context."""
    event = json.dumps({"session_id": "s1", "cwd": str(work), "hook_event_name": "SessionStart", "source": "startup"})
    proc = subprocess.Popen([sys.executable, "-c", SESSION, *HB, "hook", "claude", "--config", str(config)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(work),
                            env=clean_env(HEARTBEAT_TASK="t1"))
    procs.append(proc)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(event)
    proc.stdin.close()
    code, out, err = json.loads(proc.stdout.readline())
    assert code == 0, err
    return proc.pid, json.loads(out)["hookSpecificOutput"]["additionalContext"]


def show(config: Path) -> dict[str, object]:
    r = subprocess.run([*HB, "--config", str(config), "show", "t1", "--json"], capture_output=True, text=True,
                       env=clean_env())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_the_daemon_dispatches_no_second_agent_onto_a_person_session(
        setup: tuple[Path, Path, list[subprocess.Popen[str]]], tmp_path: Path) -> None:
    config, work, procs = setup
    pid, context = session_start(config, work, procs)
    assert context.startswith(f"heartbeat: this session claimed task 't1' (epoch 1, pid {pid})"), context
    r = subprocess.run([*HB, "--config", str(config), "run", "--once"], capture_output=True, text=True,
                       env=clean_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert '"dispatched"' not in r.stderr and not (tmp_path / "dispatched").exists(), r.stderr
    baton = show(config)
    assert json.dumps(baton).count(f'"pid": {pid}') >= 1, baton


def test_a_task_another_live_agent_holds_is_not_taken(
        setup: tuple[Path, Path, list[subprocess.Popen[str]]]) -> None:
    """The daemon's agent (here a live stand-in that claimed first) keeps the task; the context says how to take it."""
    config, work, procs = setup
    holder = subprocess.Popen(["sleep", "120"])
    procs.append(holder)  # type: ignore[arg-type]
    r = subprocess.run([*HB, "--config", str(config), "claim", "t1", "--pid", str(holder.pid)], capture_output=True,
                       text=True, env=clean_env())
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    pid, context = session_start(config, work, procs)
    assert context.startswith("heartbeat: this session did NOT claim task 't1': held by a live agent"), context
    assert f"claim t1 --force --pid {pid}" in context
    baton = json.dumps(show(config))
    assert f'"pid": {holder.pid}' in baton and f'"pid": {pid}' not in baton


def test_a_paused_task_stays_paused(setup: tuple[Path, Path, list[subprocess.Popen[str]]]) -> None:
    """A session starting is no resume: an operator's pause holds, and nothing is claimed."""
    config, work, procs = setup
    r = subprocess.run([*HB, "--config", str(config), "pause", "t1", "--by", "ops"], capture_output=True, text=True,
                       env=clean_env())
    assert r.returncode == 0, r.stderr
    _, context = session_start(config, work, procs)
    assert context.startswith("heartbeat: this session works on task 't1'"), context
    baton = show(config)
    assert json.dumps(baton).count('"paused"') >= 1 and '"how": "claim"' not in json.dumps(baton), baton
