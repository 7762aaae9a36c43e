"""The gemini preset's reading of Gemini CLI's output."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from heartbeat.presets.common import (
    _AUTH,
    _GEMINI_LIMIT,
    _GEMINI_LIMIT_TYPES,
    ResultInfo,
    _objects,
    _text,
    _usage,
    valid_session_id,
)

__all__ = ["parse_gemini"]


_GEMINI_USAGE = {"input_tokens": "input_tokens", "output_tokens": "output_tokens", "cached": "cache_read_tokens"}
_GEMINI_AUTH_LINE = re.compile(rb"Please set an Auth method[^\n]{0,300}")
_GEMINI_NO_SESSION = re.compile(rb"Error resuming session[^\n]{0,300}|Invalid session identifier[^\n]{0,300}")


def parse_gemini(data: bytes) -> ResultInfo:
    """Gemini CLI's ``--output-format stream-json``: ``init`` names the session, the last
    ``{"type": "result"}`` says ``status`` success or error (with ``stats`` token counts).

    An unconfigured login ends before any JSON, with "Please set an Auth method ..." on
    stderr and exit 41: non-retryable. ``--resume`` of a session it does not have ends with
    "Error resuming session: ..." and exit 42: the resume failed (a fresh session follows).
    """
    session = ""
    result: dict[str, Any] | None = None
    for obj in _objects(data):
        if obj.get("type") == "init":
            session = valid_session_id(obj.get("session_id")) or session
        elif obj.get("type") == "result":
            result = obj
    auth = _GEMINI_AUTH_LINE.search(data)
    no_session = _GEMINI_NO_SESSION.search(data)
    if result is None:
        if auth:
            reason = _text(auth.group(0).decode("utf-8", "replace"))
            return ResultInfo(is_error=True, non_retryable=True, reason=reason, session_id=session)
        if no_session:
            reason = _text(no_session.group(0).decode("utf-8", "replace"))
            return ResultInfo(is_error=True, resume_failed=True, reason=reason, session_id=session)
        return ResultInfo(session_id=session)
    is_error = result.get("status") != "success"
    error = result.get("error")
    reason = _text(error.get("message")) if isinstance(error, dict) else ""
    stats = result.get("stats")
    non_retryable = is_error and bool(_AUTH.search(reason))
    return ResultInfo(
        found=True,
        is_error=is_error,
        non_retryable=non_retryable,
        rate_limited=is_error and not non_retryable and (
            (error.get("type") in _GEMINI_LIMIT_TYPES if isinstance(error, dict) else False)
            or bool(_GEMINI_LIMIT.match(reason))),
        reason=reason,
        session_id=session,
        usage=_usage(stats, _GEMINI_USAGE),
    )
