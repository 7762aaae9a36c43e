"""The presets by name, and what the daemon asks of one: its argv, its result, its session plan."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from heartbeat.model import defaults

if TYPE_CHECKING:
    from heartbeat.config.shape import LauncherConfig
from heartbeat.presets.claude import claude_allow_rules, parse_claude
from heartbeat.presets.codex import CODEX_STATE_WRITABLE, parse_codex
from heartbeat.presets.common import Preset, PresetName, ResultInfo, SessionMode, SessionPlan, _text, valid_session_id
from heartbeat.presets.gemini import parse_gemini

__all__ = ["PRESETS", "preset_argv", "parse_result", "plan_session", "resume_note", "explain"]


PRESETS: dict[PresetName, Preset] = {
    PresetName.CLAUDE_CODE: Preset(
        name=PresetName.CLAUDE_CODE,
        program="claude",
        fixed=("-p", "--output-format", "stream-json", "--verbose",
               "--allowedTools", ",".join(claude_allow_rules("{id}")), "--settings", "{rail_settings}"),
        fresh=("--session-id", "{session}"),
        resume=("--resume", "{session}"),
        parse=parse_claude,
        pins_session=True,
        output="--allowedTools lets the agent run heartbeat's own commands on its task (show, brief, verify, "
               "set, add, touch, block, snooze, done) and the heartbeat MCP server's tools, nothing else; "
               "--settings adds the rail (a PreToolUse hook: `heartbeat hook claude` before every tool call); "
               "the final stream-json result line: is_error decides success (even with exit 0); "
               "not logged in / authentication errors block the task on a human; session_id, num_turns, "
               "total_cost_usd and token usage go into the exited event",
    ),
    PresetName.CODEX: Preset(
        name=PresetName.CODEX,
        program="codex",
        fixed=("exec", "--json", "--skip-git-repo-check", "-c", CODEX_STATE_WRITABLE, "-c", "{codex_rail_pre}",
               "-c", "{codex_rail_post}", "-c", "{codex_rail_trust}"),
        fresh=("-",),
        resume=("resume", "{session}", "-"),
        parse=parse_codex,
        pins_session=False,
        max_runtime=defaults.CODEX_MAX_RUNTIME,
        output="the JSONL events (the state dir is added to the workspace-write sandbox's writable roots so the "
               "agent can keep its note; three -c add the rail and the trail: `heartbeat hook codex` as this run's "
               "PreToolUse and PostToolUse hooks, with their trust entry for this run only): thread.started's "
               "thread_id is the session; turn.completed is success, turn.failed or a final error is a failed "
               "attempt (an authentication error blocks the task on a human); token usage goes into the exited "
               "event",
    ),
    PresetName.GEMINI: Preset(
        name=PresetName.GEMINI,
        program="gemini",
        fixed=("--output-format", "stream-json", "--skip-trust"),
        fresh=("--session-id", "{session}"),
        resume=("--resume", "{session}"),
        parse=parse_gemini,
        pins_session=True,
        max_runtime=defaults.GEMINI_MAX_RUNTIME,
        non_retryable_exit_codes=(41, 52),
        output="the final stream-json result event: status success or error; exit 41 (no auth method) and "
               "52 (bad config) block the task on a human; a resume of an unknown session starts a fresh one; "
               "token usage goes into the exited event",
    ),
}
"""Every preset, checked against the pinned releases in ``tests/support/agent_clis.py``."""


def preset_argv(preset: Preset, program: str, args: tuple[str, ...], *, resume: bool) -> tuple[str, ...]:
    """The argv template (placeholders unexpanded) of a fresh or a resumed session."""
    return (program or preset.program, *preset.fixed, *args, *(preset.resume if resume else preset.fresh))


def parse_result(preset_name: str, data: bytes) -> ResultInfo:
    """The preset's parser applied to ``data``; an unknown preset reads nothing."""
    try:
        preset = PRESETS[PresetName(preset_name)]
    except ValueError:
        return ResultInfo()
    return preset.parse(data)


def plan_session(
    mode: str,
    *,
    previous: str,
    previous_resumes: int,
    retry: bool,
    compactions: int = 0,
    max_resumes: int = defaults.MAX_RESUMES_PER_SESSION,
    max_compactions: int = defaults.MAX_COMPACTIONS_PER_SESSION,
    pins_session: bool = True,
    new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> SessionPlan:
    """Fresh or resumed: resume only in ``resume`` mode, for a retry after a failed attempt,
    of a valid previous session that has not used up its resumes or compacted too often."""

    def fresh(why: str) -> SessionPlan:
        return SessionPlan(session=new_id() if pins_session else "", resume=False, resumes=0, why=why)

    if mode != SessionMode.RESUME:
        return fresh("fresh: session = \"fresh\"")
    previous = valid_session_id(previous)
    if not retry:
        return fresh("fresh: the previous agent ended its shift")
    if not previous:
        return fresh("fresh: no previous session to resume")
    if previous_resumes >= max_resumes:
        return fresh(f"fresh: the session was resumed {previous_resumes} times (max_resumes_per_session)")
    if compactions >= max_compactions:
        return fresh(f"fresh: the session was compacted {compactions} times")
    return SessionPlan(session=previous, resume=True, resumes=previous_resumes + 1,
                       why=f"resume {previous_resumes + 1} of {max_resumes}")


def resume_note(how_it_ended: str) -> str:
    """The few lines in front of the brief when a session is resumed."""
    how = _text(how_it_ended) or "an interruption"
    return (
        f"You are resuming this session after it ended: {how}. What you did since your last "
        "note to the baton may or may not have happened: re-read the brief below (it is the "
        "source of truth), check the world, and continue from there.\n\n"
    )


def explain(lc: LauncherConfig) -> list[str]:
    """The lines ``check-config --explain`` prints for one launcher: everything it will do."""
    lines = [f"[launchers.{lc.name}]"]
    lines.append(f"  type: {lc.type}" + (f" (preset {lc.preset})" if lc.preset else ""))
    if lc.command:
        lines.append(f"  program: {lc.command[0]}")
        lines.append(f"  argv: {json.dumps(list(lc.command))}")
    preset = PRESETS.get(PresetName(lc.preset)) if lc.preset else None
    if preset is not None:
        resume_argv = preset_argv(preset, lc.command[0], lc.args, resume=True)
        lines.append(f"  argv when resuming: {json.dumps(list(resume_argv))}")
    brief = {"stdin": "on stdin (a resumed session gets a short note before it)",
             "file": "as a file ({brief_file}, $HEARTBEAT_BRIEF)",
             "arg": "as the last argument"}.get(lc.brief, lc.brief)
    lines.append(f"  brief: {brief}")
    lines.append(f"  cwd: {lc.cwd}")
    if isinstance(lc.inherit_env, tuple):
        inherit = "the daemon's " + (", ".join(lc.inherit_env) or "(none listed)")
    else:
        inherit = "all of the daemon's" if lc.inherit_env else "none of the daemon's"
    env = ", ".join(f"{k}={v}" for k, v in lc.env.items())
    lines.append(f"  env: {inherit}" + (f"; plus {env}" if env else "")
                 + "; plus HEARTBEAT_TASK, HEARTBEAT_EPOCH, HEARTBEAT_BRIEF, HEARTBEAT_CONFIG, HEARTBEAT_STATE_DIR")
    lines.append(f"  session: {lc.session}" + (
        f" (a retry after a failed attempt resumes the previous session, at most {lc.max_resumes_per_session} times)"
        if lc.session == SessionMode.RESUME else " (a new session id every dispatch)"))
    from heartbeat.model.timeparse import format_duration

    runtime = "no limit" if lc.max_runtime is None else format_duration(lc.max_runtime)
    lines.append(f"  max_runtime: {runtime}; stop_grace: {format_duration(lc.stop_grace)}")
    codes = ", ".join(str(c) for c in lc.non_retryable_exit_codes) or "none"
    lines.append(f"  exit handling: exit 0 ends the shift, any other exit or a signal is a failed attempt; "
                 f"non-retryable exit codes: {codes}")
    if preset is not None:
        lines.append(f"  output: {preset.output}")
    return lines
