"""The presets' argv accepted by the real claude, codex and gemini CLIs (pinned in
tests/support/agent_clis.py), and a real daemon with the real claude CLI."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_clis import agent_cli
from daemon_harness import DaemonHarness, toml_list

from heartbeat.launchers.base import build_argv
from heartbeat.presets.claude import parse_claude
from heartbeat.presets.codex import parse_codex
from heartbeat.presets.common import valid_session_id
from heartbeat.presets.gemini import parse_gemini
from tests.unit.test_presets import CLAUDE_ARGS, CODEX_ARGS, GEMINI_ARGS, UUID1, launcher, request


def run_cli(argv: list[str], home: Path, cwd: Path, *, timeout: float,
            extra_env: dict[str, str] | None = None,
            stop_when: Callable[[str, str], object] | None = None) -> tuple[int | None, str, str]:
    """Run a real agent CLI with a private HOME and no login, the brief on stdin, for at most ``timeout`` s.

    ``stop_when(stdout, stderr)`` ends it early, like the timeout, once its output so far shows
    what the test waits for (a CLI retrying an unreachable network would otherwise run out the
    whole timeout). Returns (exit code, or None when it had to be stopped, stdout, stderr)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           **(extra_env or {})}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=str(cwd), env=env, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    chunks: tuple[list[bytes], list[bytes]] = ([], [])
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(iter(lambda: f.read1(65536), b"")),
                                daemon=True) for f, into in ((proc.stdout, chunks[0]), (proc.stderr, chunks[1]))]
    for reader in readers:
        reader.start()
    try:
        proc.stdin.write(b"the brief\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass

    def text(i: int) -> str:
        return b"".join(chunks[i]).decode(errors="replace")

    deadline = time.monotonic() + timeout
    code: int | None = None
    while (code := proc.poll()) is None and time.monotonic() < deadline:
        if stop_when is not None and stop_when(text(0), text(1)) and (code := proc.poll()) is None:
            break
        time.sleep(0.05)
    if code is None:
        os.killpg(proc.pid, 9)
        proc.wait()
    for reader in readers:
        reader.join()
    return code, text(0), text(1)


def codex_retrying(out: str, err: str) -> bool:
    """codex named its thread and is retrying the unreachable model API: the argv was taken."""
    return bool(parse_codex(out.encode()).session_id) and '"Reconnecting' in out


def gemini_retrying(out: str, err: str) -> bool:
    """gemini named its session, recorded the prompt and is retrying the unreachable API."""
    return bool(parse_gemini(out.encode()).session_id) and '"role":"user"' in out and "Retrying" in err


@pytest.fixture
def cli_home(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    yield home, work


class TestRealCLIsAcceptThePresetArgv:
    """The exact argv each preset builds gets past the real CLI's argument parser (pinned releases, no login)."""

    def test_claude_fresh_then_resume(self, cli_home: tuple[Path, Path], tmp_path: Path) -> None:
        """claude reaches "Not logged in" with a result line for the fresh argv, then for --resume of that session."""
        home, work = cli_home
        lc = launcher(f'preset = "claude-code"\nprogram = "{agent_cli("claude")}"\nargs = {toml_list(CLAUDE_ARGS)}')
        for resume in (False, True):
            argv = build_argv(lc, request(work, resume=resume))
            code, out, err = run_cli(argv, home, work, timeout=90)
            assert code == 1, (argv, code, err[-500:])
            assert "unknown option" not in err and "error:" not in err.lower(), err[-500:]
            info = parse_claude(out.encode())
            assert info.found and info.non_retryable and info.session_id == UUID1, out[-800:]
            assert not info.resume_failed  # the resumed session exists: the fresh run created it

    def test_claude_refuses_a_reused_session_id(self, cli_home: tuple[Path, Path]) -> None:
        """Why "fresh" means a new UUID per dispatch: the real claude refuses --session-id of an existing session."""
        home, work = cli_home
        lc = launcher(f'preset = "claude-code"\nprogram = "{agent_cli("claude")}"')
        argv = build_argv(lc, request(work))
        assert run_cli(argv, home, work, timeout=90)[0] == 1
        code, _out, err = run_cli(argv, home, work, timeout=90)
        assert code == 1 and "already in use" in err

    def test_codex_fresh_then_resume(self, cli_home: tuple[Path, Path]) -> None:
        """codex starts a thread for the fresh argv, and `exec ... resume ID -` continues that same thread."""
        home, work = cli_home
        lc = launcher(f'preset = "codex"\nprogram = "{agent_cli("codex")}"\nargs = {toml_list(CODEX_ARGS)}')
        code, out, err = run_cli(build_argv(lc, request(work, session="")), home, work, timeout=15,
                                 stop_when=codex_retrying)
        assert code is None, (code, err[-500:])  # it got going and retried the network until stopped
        thread = parse_codex(out.encode()).session_id
        assert thread, out[:500] + err[-500:]
        code, out, err = run_cli(build_argv(lc, request(work, session=thread, resume=True)), home, work, timeout=15,
                                 stop_when=codex_retrying)
        assert code is None, (code, err[-500:])
        assert "unexpected argument" not in err
        assert parse_codex(out.encode()).session_id == thread

    def test_codex_rejects_exec_options_after_resume(self, cli_home: tuple[Path, Path]) -> None:
        """Why the preset puts args before `resume`: the real codex refuses --sandbox after it (exit 2)."""
        home, work = cli_home
        argv = [str(agent_cli("codex")), "exec", "--json", "resume", "--sandbox", "read-only", UUID1, "-"]
        code, _out, err = run_cli(argv, home, work, timeout=15)
        assert code == 2 and "unexpected argument '--sandbox'" in err

    def test_gemini_without_auth_stops_at_the_auth_check(self, cli_home: tuple[Path, Path]) -> None:
        """Without an auth method gemini exits 41 past its argument parser: non-retryable."""
        home, work = cli_home
        lc = launcher(f'preset = "gemini"\nprogram = "{agent_cli("gemini")}"\nargs = {toml_list(GEMINI_ARGS)}')
        code, out, err = run_cli(build_argv(lc, request(work)), home, work, timeout=90)
        assert code == 41 and "Unknown argument" not in err, (code, err[-500:])
        assert parse_gemini((out + err).encode()).non_retryable

    def test_gemini_fresh_then_resume(self, cli_home: tuple[Path, Path]) -> None:
        """With an (unusable) API key, gemini starts the pinned session for the fresh argv, then resumes it."""
        home, work = cli_home
        lc = launcher(f'preset = "gemini"\nprogram = "{agent_cli("gemini")}"\nargs = {toml_list(GEMINI_ARGS)}')
        key = {"GEMINI_API_KEY": "not-a-key"}
        for resume in (False, True):
            code, out, err = run_cli(build_argv(lc, request(work, resume=resume)), home, work, timeout=25,
                                     extra_env=key, stop_when=gemini_retrying)
            assert "Unknown argument" not in err and "trusted directory" not in err, err[-500:]
            info = parse_gemini((out + err).encode())
            assert info.session_id == UUID1 and not info.resume_failed, (code, out[:500], err[-500:])


class TestDaemonWithRealClaude:
    """A real daemon dispatching the real ``claude`` (not logged in) through the claude-code preset."""

    def test_not_logged_in_blocks_the_task_on_a_human(self, tmp_path: Path) -> None:
        """The task ends blocked (human gate) with the "Not logged in" reason; the exited event carries the session."""
        tmp_path.chmod(0o700)
        home = tmp_path / "home"
        home.mkdir()
        extra = f"""
[launchers.claude]
preset = "claude-code"
program = "{agent_cli("claude")}"
args = ["--model", "sonnet"]
inherit_env = ["PATH", "LANG"]
env = {{ HOME = "{home}" }}
"""
        h = DaemonHarness(tmp_path, extra=extra, stall_after="120s")  # claude never writes the baton itself
        try:
            h.start()
            h.new("real", "--launcher", "claude")
            b = h.wait(lambda: (x := h.baton("real")).meta.status.value == "blocked" and x, "the block", timeout=120)
            assert "Not logged in · Please run /login" in b.blocked_on and "a human is needed" in b.blocked_on
            assert b.meta.gate is not None and b.meta.gate.kind.value == "human"
            exited = h.events("real", "exited")[0]
            assert exited.data["code"] == 1 and exited.data["kind"] == "non-retryable"
            assert exited.data["session_id"] == b.meta.session and valid_session_id(b.meta.session)
            assert exited.data["num_turns"] == 1 and exited.data["cost_usd"] == 0
            assert exited.data["non_retryable"] is True and exited.data["input_tokens"] == 0
            assert h.events("real", "dispatched")[0].data["session"] == b.meta.session
            assert len(h.events("real", "dispatched")) == 1
        finally:
            h.close()


