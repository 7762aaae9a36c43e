"""The claude-code preset's reading of Claude Code's output: its result line, its usage, its limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from heartbeat.presets.common import (
    _AUTH,
    _CLAUDE_LIMIT,
    AGENT_COMMANDS,
    AGENT_READS,
    MCP_SERVER_RULE,
    ResultInfo,
    _count,
    _money,
    _objects,
    _text,
    _usage,
    final_text,
    valid_session_id,
)

__all__ = ["parse_claude", "claude_allow_rules"]


_CLAUDE_USAGE = {"input_tokens": "input_tokens", "output_tokens": "output_tokens",
                 "cache_read_input_tokens": "cache_read_tokens",
                 "cache_creation_input_tokens": "cache_creation_tokens"}


def parse_claude(data: bytes) -> ResultInfo:
    """Claude Code's ``--output-format stream-json``: the last ``{"type": "result"}`` line decides.

    ``is_error`` decides success (a ``"subtype": "success"`` line can carry ``is_error: true``);
    ``terminal_reason`` is recorded. Not logged in (the result text, or an assistant message
    with ``error: authentication_failed``) is non-retryable; "No conversation found" for a
    resumed session marks the resume as failed.
    """
    result: dict[str, Any] | None = None
    session = ""
    auth = False
    for obj in _objects(data):
        session = valid_session_id(obj.get("session_id")) or session
        if obj.get("type") == "assistant" and obj.get("error") in ("authentication_failed", "authentication_error"):
            auth = True
        if obj.get("type") == "result":
            result = obj
    if result is None:
        return ResultInfo(session_id=session, non_retryable=False)
    is_error = result.get("is_error") is True or (
        "is_error" not in result and str(result.get("subtype", "")).startswith("error"))
    errors = result.get("errors")
    errors = [_text(e) for e in errors if isinstance(e, str)] if isinstance(errors, list) else []
    reason = _text(result.get("result")) or (errors[0] if errors else "") or _text(result.get("terminal_reason")) \
        or _text(result.get("subtype"))
    status = result.get("api_error_status")
    non_retryable = is_error and (auth or bool(_AUTH.search(reason)) or status in (401, 403))
    limited = is_error and not non_retryable and (
        status in (429, 529) or result.get("api_error_type") in ("rate_limit_error", "overloaded_error")
        or bool(_CLAUDE_LIMIT.match(reason)))
    return ResultInfo(
        found=True,
        is_error=is_error,
        non_retryable=non_retryable,
        rate_limited=limited,
        resume_failed=is_error and any("No conversation found" in e for e in errors),
        reason=reason,
        text="" if is_error else final_text(result.get("result")),
        session_id=valid_session_id(result.get("session_id")) or session,
        terminal_reason=_text(result.get("terminal_reason")),
        num_turns=_count(result.get("num_turns")),
        cost_usd=(cost := _money(result.get("total_cost_usd"))),
        cost_source="result" if cost is not None else "",
        usage=_usage(result.get("usage"), _CLAUDE_USAGE),
    )


def claude_allow_rules(task: str = "", *, prefix: str = "heartbeat") -> tuple[str, ...]:
    """Claude Code permission rules that allow exactly heartbeat's agent commands, nothing else.

    One ``Bash(PREFIX SUB TASK:*)`` per :data:`AGENT_COMMANDS` (``:*`` is a prefix match at a
    word boundary, so ``heartbeat show t1`` does not allow ``heartbeat show t10``, and the CLI
    still refuses a command joined to another with ``&&``, ``;`` or ``|``, or holding
    ``$(...)`` or ``$VAR``), plus :data:`MCP_SERVER_RULE`. With no ``task``, only the
    :data:`AGENT_READS`, on any task: a rule letting any task's agent write every task is how one
    task's agent wrote another's note (the CLI refuses that too: :func:`heartbeat.tasks.write.refuse_foreign`).
    A headless ``claude -p`` refuses every Bash command no rule allows ("This command requires
    approval"), whatever ``--permission-mode`` short of bypassing them all.
    """
    if not task:
        return (*(f"Bash({prefix} {sub}:*)" for sub in AGENT_READS), MCP_SERVER_RULE)
    return (*(f"Bash({prefix} {sub} {task}:*)" for sub in AGENT_COMMANDS), MCP_SERVER_RULE)
