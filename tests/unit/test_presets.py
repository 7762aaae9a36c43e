"""Launcher presets and sessions: the config expansion, the result parsers on recorded streams,
session plans and reset times. The real CLIs' argument parsers are in
tests/external/test_presets_real_clis.py, the daemon's sessions in tests/system/test_presets_daemon.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import Result, clean_env
from daemon_harness import toml_list
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from heartbeat.config.load import parse_config
from heartbeat.config.shape import LauncherConfig
from heartbeat.launchers.base import LaunchRequest, build_argv
from heartbeat.model import defaults
from heartbeat.model.errors import ConfigError
from heartbeat.presets.claude import parse_claude
from heartbeat.presets.codex import parse_codex
from heartbeat.presets.common import (
    PresetName,
    ResultInfo,
    codex_rail_overrides,
    codex_trusted_hash,
    parse_reset,
    valid_session_id,
)
from heartbeat.presets.gemini import parse_gemini
from heartbeat.presets.registry import PRESETS, plan_session, resume_note
from heartbeat.system.safefile import read_log_ends

DATA = Path(__file__).resolve().parents[1] / "support" / "data"
UUID1 = "0b6f7c8e-1f6d-4b43-9c55-1b7e9f2a3c4d"
UUID2 = "7d1e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
CLAUDE_ARGS = ["--model", "sonnet", "--permission-mode", "acceptEdits", "--allowedTools", "Bash(git *),Edit,Read"]
CODEX_ARGS = ["--sandbox", "workspace-write", "-m", "gpt-5"]
GEMINI_ARGS = ["--model", "gemini-2.5-pro", "--approval-mode", "auto_edit"]


def config_with(body: str) -> str:
    return f'[daemon]\nstate_dir = "/tmp/x"\ndefault_launcher = "a"\n\n[launchers.a]\n{body}\n'


def launcher(body: str) -> LauncherConfig:
    return parse_config(config_with(body)).launchers["a"]


def request(tmp_path: Path, *, session: str = UUID1, resume: bool = False) -> LaunchRequest:
    return LaunchRequest(task_id="t1", epoch=1, attempt=1, workdir=str(tmp_path), brief_text="the brief",
                         brief_file=str(tmp_path / "1.brief.md"), log_file=str(tmp_path / "1.log"),
                         exit_file=str(tmp_path / "1.exit"), state_dir=str(tmp_path), config_path="",
                         session=session, resume=resume)


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


class TestPresetConfig:
    """``preset =`` expands into the argv, brief delivery and defaults of the real CLI."""

    def test_claude_code_expands_to_print_stream_json_with_a_pinned_session(self, tmp_path: Path) -> None:
        """claude-code: -p --output-format stream-json --verbose, --allowedTools for heartbeat's own commands on
        the task, the user's args, --session-id {session}; stdin."""
        lc = launcher(f'preset = "claude-code"\nargs = {toml_list(CLAUDE_ARGS)}')
        rules = ",".join(f"Bash(heartbeat {sub} {{id}}:*)" for sub in (
            "show", "brief", "verify", "set", "add", "touch", "block", "snooze", "done", "ask")) + ",mcp__heartbeat"
        assert lc.command == ("claude", "-p", "--output-format", "stream-json", "--verbose", "--allowedTools", rules,
                              "--settings", "{rail_settings}", *CLAUDE_ARGS, "--session-id", "{session}")
        assert build_argv(lc, request(tmp_path))[6] == rules.replace("{id}", "t1")
        settings = json.loads(build_argv(lc, request(tmp_path))[8])  # the rail, on every tool call
        [group] = settings["hooks"]["PreToolUse"]
        assert group["matcher"] == "*" and group["hooks"][0]["command"].endswith("hook claude # heartbeat-hook")
        assert lc.brief == "stdin" and lc.preset == "claude-code" and lc.session == "fresh"
        assert build_argv(lc, request(tmp_path))[-2:] == ["--session-id", UUID1]
        assert build_argv(lc, request(tmp_path, resume=True))[-2:] == ["--resume", UUID1]

    def test_codex_expands_to_exec_json_stdin_with_a_default_runtime(self, tmp_path: Path) -> None:
        """codex: exec --json --skip-git-repo-check ARGS -, resume puts `resume ID -` after the exec options."""
        lc = launcher(f'preset = "codex"\nprogram = "/opt/codex"\nargs = {toml_list(CODEX_ARGS)}')
        rail = ("-c", "{codex_rail_pre}", "-c", "{codex_rail_post}", "-c", "{codex_rail_trust}")
        assert lc.command == ("/opt/codex", "exec", "--json", "--skip-git-repo-check", "-c",
                              "sandbox_workspace_write.writable_roots=['{state_dir}']", *rail, *CODEX_ARGS, "-")
        assert lc.max_runtime == defaults.CODEX_MAX_RUNTIME
        argv = build_argv(lc, request(tmp_path, resume=True))
        assert argv[:6] == ["/opt/codex", "exec", "--json", "--skip-git-repo-check", "-c",
                            f"sandbox_workspace_write.writable_roots=['{tmp_path}']"]
        assert argv[12:] == [*CODEX_ARGS, "resume", UUID1, "-"]
        pre, post, trust = argv[7:12:2]  # the rail and the trail as this run's hooks, trusted for it only
        assert pre.startswith("hooks.PreToolUse=[") and post.startswith("hooks.PostToolUse=[")
        assert "hook codex # heartbeat-hook" in pre and pre.partition("=")[2] == post.partition("=")[2]
        import tomllib

        state = tomllib.loads(trust)["hooks"]["state"]
        assert set(state) == {"/<session-flags>/config.toml:pre_tool_use:0:0",
                              "/<session-flags>/config.toml:post_tool_use:0:0"}
        hook = tomllib.loads(pre)["hooks"]["PreToolUse"][0]["hooks"][0]
        assert state["/<session-flags>/config.toml:pre_tool_use:0:0"]["trusted_hash"] == codex_trusted_hash(
            "pre_tool_use", hook["command"], hook["timeout"])

    @pytest.mark.parametrize("command", ['/opt/my "hb"/bin/heartbeat hook codex', "C:\\hb\\heartbeat\x7f",
                                         "/home/zoë/😀/heartbeat hook codex", "a\nb\tc"])
    def test_codex_rail_overrides_carry_any_command_as_toml(self, command: str) -> None:
        """Quotes, backslashes, DEL, non-BMP characters and newlines in heartbeat's path reach codex
        as the very command the trust hash is of."""
        import tomllib

        values = codex_rail_overrides(command)
        hook = tomllib.loads(values["codex_rail_pre"])["hooks"]["PreToolUse"][0]["hooks"][0]
        assert hook["command"] == command
        state = tomllib.loads(values["codex_rail_trust"])["hooks"]["state"]
        assert state["/<session-flags>/config.toml:pre_tool_use:0:0"]["trusted_hash"] == codex_trusted_hash(
            "pre_tool_use", command, hook["timeout"])

    @pytest.mark.parametrize("args", [
        ["--disable", "hooks"], ["--disable=codex_hooks"], ["-c", "features.hooks=false"],
        ["--config", "features.codex_hooks = false"], ["-cfeatures.hooks=false"], ["--config=hooks={}"],
        ["-c", "hooks.PreToolUse=[]"], ["-c", 'hooks.state."/<session-flags>/config.toml:pre_tool_use:0:0"={}'],
    ])
    def test_codex_args_that_switch_its_hooks_off_are_refused(self, args: list[str]) -> None:
        """Turning codex's hooks off (or replacing the hooks the rail lives in) is one line naming the args."""
        with pytest.raises(ConfigError) as err:
            launcher(f'preset = "codex"\nargs = {toml_list(["-m", "gpt-5", *args])}')
        assert err.value.field == "launchers.a.args" and "hooks off" in err.value.message
        fine = ["-c", "features.hooks=true", "--disable", "x", "-c", "hooks_dir=1"]
        assert launcher(f'preset = "codex"\nargs = {toml_list(fine)}')

    def test_gemini_expands_and_merges_its_non_retryable_codes(self) -> None:
        """gemini: --output-format stream-json --session-id; exit 41/42/52 are non-retryable, with the user's."""
        lc = launcher('preset = "gemini"\nnon_retryable_exit_codes = [3]\nmax_runtime = "30m"')
        assert lc.command == ("gemini", "--output-format", "stream-json", "--skip-trust", "--session-id", "{session}")
        assert lc.non_retryable_exit_codes == (3, 41, 52)
        assert lc.max_runtime == 1800

    @pytest.mark.parametrize(("body", "key", "words"), [
        ('preset = "claude-code"\ncommand = ["claude"]', "command", "program ="),
        ('preset = "claude-code"\nbrief = "file"', "brief", "stdin"),
        ('preset = "claude"', "preset", "claude-code"),
        ('command = ["x"]\nargs = ["--y"]', "args", "only with a preset"),
        ('command = ["x"]\nprogram = "y"', "program", "only with a preset"),
        ('preset = "codex"\nargs = ["{nope}"]', "args", "unknown placeholder {nope}"),
        ('preset = "codex"\nargs = "--sandbox"', "args", "list of strings"),
        ('preset = "codex"\nprogram = "{workdir}/codex"', "program", "placeholder"),
        ('command = ["x"]\nsession = "sticky"', "session", "fresh, resume"),
        ('command = ["x"]\nmax_resumes_per_session = 0', "max_resumes_per_session", "at least 1"),
    ])
    def test_bad_preset_keys_are_one_line_errors(self, body: str, key: str, words: str) -> None:
        """Each misuse names the key and says what to write instead."""
        with pytest.raises(ConfigError) as err:
            launcher(body)
        assert err.value.field == f"launchers.a.{key}" and words in err.value.message
        assert "\n" not in str(err.value)

    def test_a_session_id_is_never_read_from_outside_as_an_option(self) -> None:
        """Only UUIDs are session ids: a value that could be an option or a path is refused."""
        assert valid_session_id(UUID1) == UUID1
        for bad in ("--dangerously-skip-permissions", "../x", "", None, 12, UUID1 + "\n", f"-{UUID1[1:]}"):
            assert valid_session_id(bad) == ""

    def test_check_config_explain_prints_everything_the_preset_sets(self, tmp_path: Path) -> None:
        """--explain shows program, argv (fresh and resumed), stdin, env, session, max_runtime and exit handling."""
        path = tmp_path / "heartbeat.toml"
        path.write_text(config_with(f'preset = "codex"\nprogram = "/opt/nowhere/codex"\n'
                                    f'args = {toml_list(CODEX_ARGS)}\nsession = "resume"\n'
                                    'env = { CODEX_HOME = "/srv/codex" }'))
        path.chmod(0o600)
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(path), "check-config", "--explain"],
                              capture_output=True, text=True, env=clean_env(), timeout=60)
        r = Result(proc.returncode, proc.stdout, proc.stderr)
        assert r.code == 2, r.err  # the program is not there (still explained)
        out = r.out
        codex = "/opt/nowhere/codex"
        assert "type: exec (preset codex)" in out and f"program: {codex}" in out
        writable = ["-c", "sandbox_workspace_write.writable_roots=['{state_dir}']",
                    "-c", "{codex_rail_pre}", "-c", "{codex_rail_post}", "-c", "{codex_rail_trust}"]
        assert json.dumps([codex, "exec", "--json", "--skip-git-repo-check", *writable, *CODEX_ARGS, "-"]) in out
        assert json.dumps([codex, "exec", "--json", "--skip-git-repo-check", *writable, *CODEX_ARGS, "resume",
                           "{session}", "-"]) in out
        assert "brief: on stdin" in out and "CODEX_HOME=/srv/codex" in out and "HEARTBEAT_TASK" in out
        assert "session: resume" in out and "max_runtime: 2h" in out
        assert "exit handling:" in out and "thread_id" in out
        assert f"launchers.a.program: '{codex}': no such file" in r.err


class TestParseRecordedStreams:
    """The parsers on streams recorded from the real CLIs (tests/support/data/README.md says which are derived)."""

    def test_claude_not_logged_in_is_a_non_retryable_error(self) -> None:
        """The real not-logged-in run: is_error, non-retryable, with its session id, turns and cost."""
        info = parse_claude(fixture("claude_not_logged_in.log"))
        assert info.found and info.is_error and info.non_retryable and not info.resume_failed
        assert info.reason == "Not logged in · Please run /login"
        assert info.session_id == UUID1 and info.num_turns == 1 and info.cost_usd == 0
        assert info.terminal_reason == "api_error"
        assert info.usage == {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                              "cache_creation_tokens": 0}

    def test_claude_success_records_cost_turns_and_tokens(self) -> None:
        """A successful result line: not an error; cost, turns and token usage go into the exited event."""
        info = parse_claude(fixture("claude_success.log"))
        assert info.found and not info.is_error and not info.non_retryable
        assert info.event_data() == {
            "is_error": False, "session_id": UUID1, "terminal_reason": "completed", "num_turns": 7,
            "cost_usd": 0.4213, "cost_source": "result", "input_tokens": 1834, "output_tokens": 4120,
            "cache_read_tokens": 88213, "cache_creation_tokens": 12007}

    def test_claude_is_error_with_subtype_success_is_a_retryable_failure(self) -> None:
        """`"subtype": "success", "is_error": true` (an overloaded API) is a failure, but a retry may help."""
        info = parse_claude(fixture("claude_error_exit0.log"))
        assert info.is_error and not info.non_retryable
        assert info.reason == "API Error: 529 Overloaded" and info.event_data()["result"] == info.reason

    def test_claude_rate_limit_is_a_wait_not_a_failure(self) -> None:
        """The real CLI's 429 result (api_error_status 429): an error, rate-limited, not non-retryable."""
        info = parse_claude(fixture("claude_rate_limited.log"))
        assert info.is_error and info.rate_limited and not info.non_retryable
        assert info.reason.startswith("API Error: Request rejected (429)")
        assert info.event_data()["rate_limited"] is True
        assert parse_reset(info.reason, datetime(2026, 12, 1, 16, 0, tzinfo=timezone.utc)) == (None, None)

    def test_claude_usage_limit_names_its_reset(self) -> None:
        """A usage limit the CLI passes on ("resets 3pm (UTC)") is rate-limited with the reset it names."""
        info = parse_claude(fixture("claude_usage_limit.log"))
        assert info.rate_limited and "resets 3pm (UTC)" in info.reason
        reset, _ = parse_reset(info.reason, datetime(2026, 12, 1, 16, 0, tzinfo=timezone.utc))
        assert reset == datetime(2026, 12, 2, 15, 0, tzinfo=timezone.utc)

    def test_an_overloaded_api_is_rate_limited_but_not_logged_in_is_not(self) -> None:
        """529 Overloaded waits; an authentication error stays non-retryable and never waits."""
        assert parse_claude(fixture("claude_error_exit0.log")).rate_limited
        assert not parse_claude(fixture("claude_not_logged_in.log")).rate_limited
        assert not parse_claude(fixture("claude_success.log")).rate_limited

    def test_claude_resume_of_an_unknown_session_marks_the_resume_failed(self) -> None:
        """The real "No conversation found" result: the next dispatch must start a fresh session."""
        info = parse_claude(fixture("claude_resume_unknown.log"))
        assert info.is_error and info.resume_failed and not info.non_retryable
        assert "No conversation found" in info.reason

    def test_codex_records_the_thread_and_sums_usage(self) -> None:
        """codex: thread.started names the session; turn.completed is success, with its usage."""
        info = parse_codex(fixture("codex_success.log"))
        assert info.found and not info.is_error and info.session_id == "01a22d3b-906d-79d2-8650-0ef8db32103e"
        assert info.usage == {"input_tokens": 24763, "cache_read_tokens": 24448, "output_tokens": 122}

    def test_codex_without_network_has_a_thread_but_no_result(self) -> None:
        """The real offline run (stopped by timeout): the thread id is known, the run did not end by itself."""
        info = parse_codex(fixture("codex_no_network.log"))
        assert valid_session_id(info.session_id) and not info.found and not info.non_retryable

    def test_codex_unauthorized_is_non_retryable(self) -> None:
        """A turn.failed with 401 Unauthorized blocks the task on a human."""
        info = parse_codex(fixture("codex_unauthorized.log"))
        assert info.is_error and info.non_retryable and "401" in info.reason

    def test_codex_resume_of_an_unknown_thread_marks_the_resume_failed(self) -> None:
        """The real `exec resume` of a thread it does not know (plain stderr, exit 1)."""
        info = parse_codex(fixture("codex_resume_unknown.log"))
        assert info.resume_failed and info.is_error and not info.non_retryable

    def test_gemini_without_auth_is_non_retryable(self) -> None:
        """The real "Please set an Auth method" (exit 41, no JSON) is non-retryable."""
        info = parse_gemini(fixture("gemini_no_auth.log"))
        assert info.is_error and info.non_retryable and info.reason.startswith("Please set an Auth method")

    def test_gemini_resume_of_an_unknown_session_marks_the_resume_failed(self) -> None:
        """The real "Error resuming session" (exit 42) is a failed resume, not a reason to block the task."""
        info = parse_gemini(fixture("gemini_resume_unknown.log"))
        assert info.is_error and info.resume_failed and not info.non_retryable

    def test_gemini_without_network_names_its_session(self) -> None:
        """The real offline run (API key set, stopped by timeout): the init event's session, no result."""
        info = parse_gemini(fixture("gemini_no_network.log"))
        assert info.session_id == UUID1 and not info.found and not info.is_error

    def test_gemini_success_records_tokens(self) -> None:
        """Gemini's result event with status success and stats."""
        info = parse_gemini(fixture("gemini_success.log"))
        assert info.found and not info.is_error and info.session_id == UUID1
        assert info.usage == {"input_tokens": 1900, "output_tokens": 200, "cache_read_tokens": 1200}


class TestHostileOutput:
    """The log is the agent's own output: garbage, truncation and lies never crash or mislead the parsers."""

    def test_a_truncated_result_line_falls_back_to_no_result(self) -> None:
        """A result line cut mid-JSON (the agent was killed while writing it) is not a result."""
        data = fixture("claude_success.log")
        info = parse_claude(data[: len(data) - 40])
        assert not info.found and info.session_id == UUID1

    def test_garbage_nesting_and_huge_lines_are_skipped(self) -> None:
        """Binary noise, a 200,000-deep nesting and a 1 MB line cost nothing but time."""
        data = (os.urandom(4096) + b"\n" + b"[" * 200_000 + b"\n" + b"{" + b"x" * 1_000_000 + b"\n"
                + b'{"type":"result","is_error":true,"result":"x"}\n' + b"[" * 200_000 + b"\n")
        for parse in (parse_claude, parse_codex, parse_gemini):
            assert isinstance(parse(data), ResultInfo)
        assert parse_claude(data).is_error

    def test_values_are_type_checked_and_cut_to_one_line(self) -> None:
        """A result with wrong types, NaN, a negative cost, control characters and a fake session id."""
        line = json.dumps({"type": "result", "is_error": True, "result": "bad\n\x1b[31mred\u2028" + "y" * 1000,
                           "session_id": "--dangerously-skip-permissions", "num_turns": True,
                           "total_cost_usd": -1, "usage": {"input_tokens": "many", "output_tokens": 2**70}})
        info = parse_claude(line.encode() + b"\n" + b'{"total_cost_usd": NaN}\n')
        assert info.is_error and info.session_id == "" and info.num_turns is None and info.cost_usd is None
        assert info.usage == {} and "\n" not in info.reason and "\x1b" not in info.reason
        assert len(info.reason) <= 300

    @settings(max_examples=examples(300), deadline=None)
    @given(st.binary(max_size=2000) | st.lists(st.sampled_from(
        [b'{"type":"result"', b'"is_error":true}', b"\n", b'{"type":"thread.started","thread_id":1}',
         b'{"type":"init","session_id":"' + UUID1.encode() + b'"}', b"\xff\xfe", b"[[[[", b'{"error":{}}']),
        max_size=40).map(b"".join))
    def test_no_input_makes_a_parser_raise(self, data: bytes) -> None:
        """Any bytes at all: each parser returns a ResultInfo."""
        for parse in (parse_claude, parse_codex, parse_gemini):
            info = parse(data)
            assert isinstance(info, ResultInfo) and valid_session_id(info.session_id) == info.session_id


class TestReadLogTail:
    """The log is read in bounded pieces, and only when it is a regular file."""

    def test_reads_the_head_and_the_tail_of_a_big_log(self, tmp_path: Path) -> None:
        """Of a log larger than head + tail, exactly those two pieces are read."""
        path = tmp_path / "1.log"
        path.write_bytes(b"H" * 100 + b"M" * 10_000 + b"T" * 100)
        data = read_log_ends(str(path), head=100, tail=100, line=0)
        assert data == b"H" * 100 + b"\n" + b"T" * 100
        lines = b"H" * 100 + b"\n" + b"M" * 10_000 + b"\n" + b"L" * 500 + b"T" * 100
        path.write_bytes(lines)
        data = read_log_ends(str(path), head=100, tail=100, line=1000)
        assert data == b"H" * 100 + b"\n" + b"L" * 500 + b"T" * 100  # the tail's first line, whole

    def test_a_fifo_or_a_symlink_is_not_read(self, tmp_path: Path) -> None:
        """A FIFO in the log's place returns nothing at once (no writer, no hang); a symlink is not followed."""
        fifo = tmp_path / "fifo.log"
        os.mkfifo(fifo)
        assert read_log_ends(str(fifo)) == b""
        target = tmp_path / "secret"
        target.write_text('{"type":"result","is_error":true}\n')
        (tmp_path / "link.log").symlink_to(target)
        assert read_log_ends(str(tmp_path / "link.log")) == b""
        assert read_log_ends(str(tmp_path / "missing.log")) == b""


class TestPlanSession:
    """Fresh or resumed: the pure decision behind ``session =``."""

    def test_fresh_mode_gives_every_dispatch_a_new_uuid(self) -> None:
        """session = "fresh" never resumes, even a retry with a previous session."""
        a = plan_session("fresh", previous=UUID1, previous_resumes=0, retry=True)
        b = plan_session("fresh", previous=UUID1, previous_resumes=0, retry=True)
        assert not a.resume and valid_session_id(a.session) and a.session != b.session != UUID1

    def test_resume_mode_resumes_a_retry_until_the_limit(self) -> None:
        """A retry resumes the previous session; past max_resumes_per_session it starts fresh."""
        first = plan_session("resume", previous=UUID1, previous_resumes=0, retry=True, max_resumes=2)
        assert first.resume and first.session == UUID1 and first.resumes == 1
        second = plan_session("resume", previous=UUID1, previous_resumes=1, retry=True, max_resumes=2)
        assert second.resume and second.resumes == 2
        third = plan_session("resume", previous=UUID1, previous_resumes=2, retry=True, max_resumes=2)
        assert not third.resume and third.session != UUID1 and third.resumes == 0
        assert "max_resumes_per_session" in third.why

    @pytest.mark.parametrize(("kwargs", "why"), [
        ({"retry": False}, "ended its shift"),
        ({"previous": ""}, "no previous session"),
        ({"previous": "--resume"}, "no previous session"),
        ({"compactions": 3}, "compacted 3 times"),
    ])
    def test_resume_mode_starts_fresh_when_resuming_is_wrong(self, kwargs: dict[str, Any], why: str) -> None:
        """After a clean shift end, without a valid previous session, or after a compaction-heavy session."""
        base: dict[str, Any] = {"previous": UUID1, "previous_resumes": 0, "retry": True}
        plan = plan_session("resume", **{**base, **kwargs})
        assert not plan.resume and why in plan.why

    def test_codex_fresh_sessions_are_chosen_by_the_cli(self) -> None:
        """A CLI that does not take a session id (codex) gets "" for a fresh one; its thread id is read later."""
        plan = plan_session("resume", previous="", previous_resumes=0, retry=True, pins_session=False)
        assert plan.session == "" and not plan.resume

    def test_the_resume_note_says_how_the_session_ended(self) -> None:
        """The note names how the previous run ended and sends the agent back to the brief."""
        note = resume_note("killed by signal 9 after 4m")
        assert "killed by signal 9 after 4m" in note and "re-read the brief" in note


# -- the real CLIs ---------------------------------------------------------------------------












# -- the daemon ------------------------------------------------------------------------------











def test_every_preset_is_tested_against_its_cli() -> None:
    """Each preset names a CLI that tests/support/agent_clis.py pins (so its argv test runs)."""
    from agent_clis import PACKAGES

    assert {PRESETS[name].program for name in PresetName} <= set(PACKAGES)




NOW = datetime(2026, 12, 1, 16, 20, tzinfo=timezone.utc)
RESETS = [
    ("You've hit your limit · resets 3pm (UTC)", datetime(2026, 12, 2, 15, 0, tzinfo=timezone.utc), None),
    ("5-hour limit reached ∙ resets 5:30pm (Europe/Paris)", datetime(2026, 12, 1, 16, 30, tzinfo=timezone.utc), None),
    ("Claude AI usage limit reached|1764612000", datetime(2025, 12, 1, 18, 0, tzinfo=timezone.utc), None),
    ("usage limit reached, resets at 2026-12-01T18:00:00Z", datetime(2026, 12, 1, 18, 0, tzinfo=timezone.utc), None),
    ("resets Dec 2, 5am (UTC)", datetime(2026, 12, 2, 5, 0, tzinfo=timezone.utc), None),
    ("try again at 3:45 PM", datetime(2026, 12, 2, 15, 45, tzinfo=timezone.utc), None),
    ("You've hit your usage limit. Try again in 2 days 3 hours 5 minutes.", None, 2 * 86400 + 3 * 3600 + 300.0),
    ("Quota exceeded. Please retry in 35.2s.", None, 35.2),
    ("429 Too Many Requests; retry-after: 30", None, 30.0),
    ("API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit", None, None),
    ("resets 11", None, None),
    ("resets 25:99pm (Not/AZone)", None, None),
    ("resets at 9999-12-31T23:59:00-05:00", None, None),
    ("resets at 0001-01-01T00:00:00+05:00", None, None),
    ("resets Feb 30, 5am (UTC)", None, None),
]


class TestParseReset:
    """What a limit message says about when to try again, read without a clock."""

    @pytest.mark.parametrize(("text", "reset", "retry_after"), RESETS, ids=[r[0][:40] for r in RESETS])
    def test_row(self, text: str, reset: datetime | None, retry_after: float | None) -> None:
        """The reset the text names (as UTC, the next such instant) and its retry-after, each or neither."""
        assert parse_reset(text, NOW, timezone.utc) == (reset, retry_after)

    def test_a_reset_in_a_zone_that_does_not_exist_names_no_instant(self) -> None:
        """"resets 3pm (Mars/Olympus)" is not 3pm local time (issue 24 item 12): no reset, the retry-after
        still read, the zone named by unknown_reset_zone; a real zone is not reported."""
        from heartbeat.presets.common import unknown_reset_zone

        text = "You've hit your limit · resets 3pm (Mars/Olympus)"
        assert parse_reset(text, NOW, timezone.utc) == (None, None)
        assert parse_reset(text + "; retry in 35s", NOW, timezone.utc) == (None, 35.0)
        assert unknown_reset_zone(text) == "Mars/Olympus"
        assert unknown_reset_zone("resets 3pm (Europe/Paris)") == unknown_reset_zone("resets 3pm") == ""

    def test_a_time_of_day_without_a_zone_is_read_in_the_local_zone(self) -> None:
        """"resets 3pm" with no zone is 3pm where the daemon runs (the CLI printed its own local time)."""
        from zoneinfo import ZoneInfo

        reset, _ = parse_reset("resets 3pm", NOW, ZoneInfo("America/New_York"))
        assert reset == datetime(2026, 12, 1, 20, 0, tzinfo=timezone.utc)
