"""The codex preset's reading of Codex's ``exec --json`` output: its thread, usage and errors."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from heartbeat.presets.common import (
    _AUTH,
    _CODEX_LIMIT,
    ResultInfo,
    _objects,
    _text,
    _usage,
    final_text,
    valid_session_id,
)

__all__ = ["parse_codex"]


_CODEX_USAGE = {"input_tokens": "input_tokens", "output_tokens": "output_tokens",
                "cached_input_tokens": "cache_read_tokens"}
_CODEX_NO_THREAD = re.compile(rb"no rollout found for thread id|thread/resume failed")


def parse_codex(data: bytes) -> ResultInfo:
    """Codex's ``exec --json`` JSONL: ``thread.started`` names the thread (the session id);
    ``turn.completed`` (with ``usage``) is success, ``turn.failed`` or a final ``error`` is failure.

    ``codex exec resume`` of a thread it does not know prints a plain error (no JSON) and
    exits 1: that marks the resume as failed.
    """
    thread = ""
    turns = 0
    last: dict[str, Any] | None = None
    usage: dict[str, int] = {}
    said = ""
    for obj in _objects(data):
        kind = obj.get("type")
        item = obj.get("item")
        if kind == "item.completed" and isinstance(item, dict) and item.get("type") == "agent_message":
            said = final_text(item.get("text")) or said
        if kind == "thread.started":
            thread = valid_session_id(obj.get("thread_id")) or thread
        elif kind in ("turn.completed", "turn.failed"):
            turns += 1
            last = obj
            if kind == "turn.completed":
                for key, value in _usage(obj.get("usage"), _CODEX_USAGE).items():
                    usage[key] = usage.get(key, 0) + value
        elif kind == "error" and not _text(obj.get("message")).startswith("Reconnecting"):
            last = obj  # "Reconnecting... 2/5" is a retry under way, not an end
    resume_failed = bool(_CODEX_NO_THREAD.search(data))
    if last is None:
        return ResultInfo(session_id=thread, resume_failed=resume_failed, is_error=resume_failed,
                          reason="the thread to resume was not found" if resume_failed else "")
    is_error = last.get("type") != "turn.completed"
    error = last.get("error")
    reason = _text(error.get("message")) if isinstance(error, dict) else _text(last.get("message"))
    non_retryable = is_error and bool(_AUTH.search(reason))
    return ResultInfo(
        found=True,
        is_error=is_error,
        non_retryable=non_retryable,
        rate_limited=is_error and not non_retryable and bool(_CODEX_LIMIT.match(reason)),
        resume_failed=resume_failed,
        reason=reason,
        text="" if is_error else said,
        session_id=thread,
        num_turns=turns or None,
        usage=usage,
    )


CODEX_STATE_WRITABLE = "sandbox_workspace_write.writable_roots=['{state_dir}']"
"""The codex preset's ``-c``: the state dir is writable from codex's ``workspace-write`` sandbox, so the
agent's ``heartbeat set``/``add``/``done`` can write its note (the sandbox makes everything outside the
workdir, ``/tmp`` and ``$TMPDIR`` read-only: "cannot open lock: Read-only file system")."""
