"""Launcher presets: the agent CLIs people run (Claude Code, Codex, Gemini CLI), and sessions.

``[launchers.NAME] preset = "claude-code" | "codex" | "gemini"`` expands, when the config is
loaded, into the argv, brief delivery and defaults checked against the real CLIs (see
:data:`PRESETS`); ``args = [...]`` adds the user's flags (model, permission mode, sandbox)
before the session flags. Nothing is hidden: ``heartbeat check-config --explain`` prints the
expanded launcher (:func:`explain`).

After the agent exits, the daemon reads the tail of its log and hands it to the preset's
parser (:func:`parse_claude`, :func:`parse_codex`, :func:`parse_gemini`), a pure function
from bytes to a :class:`ResultInfo`: did the run succeed, is it an error no retry can fix
(not logged in), which session did it use, what did it cost. The log is the agent's own
output, so the parsers treat it as hostile: bounded, garbage and truncation tolerated,
every value type-checked and cut to one short line.

Sessions: ``session = "fresh"`` (the default) gives every dispatch a new session id;
``"resume"`` resumes the previous session after a failed attempt, with a short note
in front of the brief (:func:`plan_session`), until ``max_resumes_per_session`` resumes or
a compaction-heavy session make a fresh one the better choice.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from heartbeat import defaults

if TYPE_CHECKING:
    from heartbeat.config import LauncherConfig

__all__ = [
    "PresetName",
    "SessionMode",
    "Preset",
    "PRESETS",
    "ResultInfo",
    "SessionPlan",
    "parse_claude",
    "parse_codex",
    "parse_gemini",
    "preset_argv",
    "parse_result",
    "parse_reset",
    "read_log_tail",
    "plan_session",
    "resume_note",
    "valid_session_id",
    "explain",
    "AGENT_COMMANDS",
    "claude_allow_rules",
]


class PresetName(StrEnum):
    """The agent CLIs heartbeat knows how to run."""

    CLAUDE_CODE = "claude-code"
    CODEX = "codex"
    GEMINI = "gemini"


class SessionMode(StrEnum):
    """``session =``: what a retry does with the previous agent's session."""

    FRESH = "fresh"
    """A new session for every dispatch; the brief carries the state."""
    RESUME = "resume"
    """A retry after a failed attempt resumes the previous session (up to ``max_resumes_per_session``)."""


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_MAX_TEXT = 300
_MAX_NUMBER = 2**53
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_LIMIT = re.compile(
    r"\b(429|529)\b|rate[ _-]?limit|usage[ _-]?limit|hit your (usage )?limit|limit reached|overloaded|"
    r"quota exceeded|resource[_ ]exhausted|too many requests",
    re.IGNORECASE,
)
"""A rate limit, an overload or a usage limit: the run waits for it, it did not fail."""
_AUTH = re.compile(
    r"not logged in|please run /login|invalid api key|authentication[_ ]?(failed|error)|"
    r"unauthori[sz]ed|oauth token|set an auth method|\b401\b",
    re.IGNORECASE,
)


def valid_session_id(value: object) -> str:
    """``value`` if it is a UUID (the only session ids the CLIs take and heartbeat passes on), else ``""``.

    A session id read from a log or a baton becomes an argument (``--resume ID``): a UUID
    can never be read as an option or a path.
    """
    return value if isinstance(value, str) and _UUID.fullmatch(value) else ""


def _text(value: object) -> str:
    """One short line of printable text, or ``""`` for anything that is not a string."""
    if not isinstance(value, str):
        return ""
    line = _CONTROL.sub(" ", value).strip()
    return line if len(line) <= _MAX_TEXT else line[: _MAX_TEXT - 1] + "…"


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_NUMBER:
        return None
    return value


def _money(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value <= _MAX_NUMBER:
        return None
    return round(float(value), 6)


@dataclass(frozen=True)
class ResultInfo:
    """What an agent's output says about how its run ended (all fields optional)."""

    found: bool = False
    """A final result (Claude's ``result`` line, Codex's ``turn.completed``/``turn.failed``, ...) was read."""
    is_error: bool = False
    """The CLI reports the run failed, whatever its exit code."""
    non_retryable: bool = False
    """No retry can fix it (not logged in, a bad API key): a human is needed."""
    resume_failed: bool = False
    """The session to resume does not exist (any more): the next dispatch must start a fresh one."""
    rate_limited: bool = False
    """The run was refused by a rate or usage limit (429, 529, "usage limit reached", ...): a wait."""
    reason: str = ""
    """One line: the CLI's result or error text."""
    session_id: str = ""
    terminal_reason: str = ""
    num_turns: int | None = None
    cost_usd: float | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    """Token counts: ``input_tokens``, ``output_tokens``, ``cache_read_tokens``, ``cache_creation_tokens``."""

    def event_data(self) -> dict[str, Any]:
        """The fields the ``exited`` event records (only the known ones)."""
        data: dict[str, Any] = {}
        if self.found:
            data["is_error"] = self.is_error
        if self.session_id:
            data["session_id"] = self.session_id
        if self.terminal_reason:
            data["terminal_reason"] = self.terminal_reason
        if self.num_turns is not None:
            data["num_turns"] = self.num_turns
        if self.cost_usd is not None:
            data["cost_usd"] = self.cost_usd
        data.update(self.usage)
        if self.is_error and self.reason:
            data["result"] = self.reason
        if self.non_retryable:
            data["non_retryable"] = True
        if self.resume_failed:
            data["resume_failed"] = True
        if self.rate_limited:
            data["rate_limited"] = True
        return data


def _objects(data: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``data``, one per line, in order; anything else is skipped."""
    for raw in data.splitlines():
        raw = raw.strip()
        if not raw.startswith(b"{"):
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):  # garbage, a cut line, or nesting deep enough to recurse
            continue
        if isinstance(obj, dict):
            yield obj


def _usage(doc: object, names: Mapping[str, str]) -> dict[str, int]:
    if not isinstance(doc, dict):
        return {}
    out = {}
    for theirs, ours in names.items():
        value = _count(doc.get(theirs))
        if value is not None:
            out[ours] = value
    return out


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
        or bool(_LIMIT.search(reason)))
    return ResultInfo(
        found=True,
        is_error=is_error,
        non_retryable=non_retryable,
        rate_limited=limited,
        resume_failed=is_error and any("No conversation found" in e for e in errors),
        reason=reason,
        session_id=valid_session_id(result.get("session_id")) or session,
        terminal_reason=_text(result.get("terminal_reason")),
        num_turns=_count(result.get("num_turns")),
        cost_usd=_money(result.get("total_cost_usd")),
        usage=_usage(result.get("usage"), _CLAUDE_USAGE),
    )


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
    for obj in _objects(data):
        kind = obj.get("type")
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
        rate_limited=is_error and not non_retryable and bool(_LIMIT.search(reason)),
        resume_failed=resume_failed,
        reason=reason,
        session_id=thread,
        num_turns=turns or None,
        usage=usage,
    )


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
        rate_limited=is_error and not non_retryable and bool(_LIMIT.search(reason)),
        reason=reason,
        session_id=session,
        usage=_usage(stats, _GEMINI_USAGE),
    )


_EPOCH_SUFFIX = re.compile(r"\|\s*(\d{10})(?!\d)")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_RESETS = re.compile(r"(?:resets?|try again|retry)(?: at| on)?\s+(?P<when>[^.;·∙\n]{1,80})", re.IGNORECASE)
_CLOCK = re.compile(r"^(?:(?P<month>[A-Za-z]{3})[a-z]*\s+(?P<day>\d{1,2}),?\s+(?:at\s+)?)?"
                    r"(?P<h>\d{1,2})(?::(?P<m>\d{2}))?\s*(?P<ampm>[ap]\.?m\.?)?"
                    r"(?:\s*\(?(?P<tz>UTC|GMT|[A-Za-z_]+/[A-Za-z_/+-]+)\)?)?", re.IGNORECASE)
_IN = re.compile(r"(?:try again|retry|resets?)\s+(?:in|after)\s+(?P<span>(?:\d+(?:\.\d+)?\s*"
                 r"(?:days?|d|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)\b[\s,]*(?:and\s+)?)+)", re.IGNORECASE)
_RETRY_AFTER = re.compile(r"retry[- ]after:?\s*(?P<seconds>\d+(?:\.\d+)?)", re.IGNORECASE)
_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def _span_seconds(span: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", span.lower()):
        total += float(number) * _UNIT.get(unit[0], 0.0)
    return total


def _clock_reset(when: str, now: datetime, local: tzinfo | None) -> datetime | None:
    """``3pm``, ``3:45 PM (Europe/Paris)``, ``Dec 2, 5am (UTC)``, ``15:00``: the next such instant after ``now``."""
    found = _CLOCK.match(when.strip())
    if found is None or (found["m"] is None and found["ampm"] is None):
        return None  # a bare number is not a time of day
    hour, minute = int(found["h"]), int(found["m"] or 0)
    if found["ampm"]:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if found["ampm"][0].lower() == "p" else 0)
    if hour > 23 or minute > 59:
        return None
    zone: tzinfo | None = local
    if found["tz"]:
        name = found["tz"].upper() if found["tz"].upper() in ("UTC", "GMT") else found["tz"]
        try:
            zone = timezone.utc if name in ("UTC", "GMT") else ZoneInfo(name)
        except (ValueError, OSError, ZoneInfoNotFoundError):
            zone = local
    here = now.astimezone(zone)
    if found["month"]:
        try:
            month = _MONTHS.index(found["month"][:3].lower()) + 1
            candidate = here.replace(month=month, day=int(found["day"]), hour=hour, minute=minute, second=0,
                                     microsecond=0)
        except ValueError:
            return None
        if candidate < here - timedelta(days=1):  # "Jan 2" seen on Dec 31 is next year's
            candidate = candidate.replace(year=candidate.year + 1)
        return candidate.astimezone(timezone.utc)
    candidate = here.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if candidate <= here:
        candidate += timedelta(days=1)
    return candidate.astimezone(timezone.utc)


def parse_reset(text: str, now: datetime, local: tzinfo | None = None) -> tuple[datetime | None, float | None]:
    """What a limit message says about when to try again: ``(reset, retry_after)``.

    ``reset``: the instant the CLI names ("resets 3pm (UTC)", "resets at 2026-12-01T18:00Z",
    "try again at 3:45 PM", Claude's older "usage limit reached|1764612000"), as UTC, or None.
    ``retry_after``: seconds the text says to wait ("try again in 2 hours 5 minutes", "retry in
    35s", "retry-after: 30"), or None. A time of day with no zone is read in ``local`` (the
    daemon's own zone when None) and is the next such instant after ``now``. Pure: no clock.
    """
    if not text:
        return None, None
    reset: datetime | None = None
    epoch = _EPOCH_SUFFIX.search(text)
    if epoch is not None:
        reset = datetime.fromtimestamp(int(epoch.group(1)), timezone.utc)
    for found in _RESETS.finditer(text) if reset is None else ():
        when = found["when"].strip()
        iso = _ISO.match(when)
        try:
            if iso is not None:
                parsed = datetime.fromisoformat(iso.group(0).replace("Z", "+00:00"))
                reset = (parsed if parsed.tzinfo else parsed.replace(tzinfo=local or now.astimezone().tzinfo))
                reset = reset.astimezone(timezone.utc)
                break
            reset = _clock_reset(when, now, local)
        except (ValueError, OverflowError):  # year 9999 in a zone west of UTC, a 30th of February
            reset = None
            continue
        if reset is not None:
            break
    retry_after: float | None = None
    span = _IN.search(text)
    if span is not None:
        retry_after = _span_seconds(span["span"]) or None
    else:
        header = _RETRY_AFTER.search(text)
        if header is not None:
            retry_after = float(header["seconds"])
    return reset, retry_after


CODEX_STATE_WRITABLE = "sandbox_workspace_write.writable_roots=['{state_dir}']"
"""The codex preset's ``-c``: the state dir is writable from codex's ``workspace-write`` sandbox, so the
agent's ``heartbeat set``/``add``/``done`` can write its note (the sandbox makes everything outside the
workdir, ``/tmp`` and ``$TMPDIR`` read-only: "cannot open lock: Read-only file system")."""


AGENT_COMMANDS = ("show", "brief", "verify", "set", "add", "touch", "block", "snooze", "done")
"""The heartbeat commands the brief and the hooks tell an agent to run on its task."""

MCP_SERVER_RULE = "mcp__heartbeat"
"""Claude Code's rule for every tool of the MCP server ``hooks install claude --mcp`` registers."""


def claude_allow_rules(task: str = "", *, prefix: str = "heartbeat") -> tuple[str, ...]:
    """Claude Code permission rules that allow exactly heartbeat's agent commands, nothing else.

    One ``Bash(PREFIX SUB TASK:*)`` per :data:`AGENT_COMMANDS` (``:*`` is a prefix match at a
    word boundary, so ``heartbeat show t1`` does not allow ``heartbeat show t10``, and the CLI
    still refuses a command joined to another with ``&&``, ``;`` or ``|``, or holding
    ``$(...)`` or ``$VAR``), plus :data:`MCP_SERVER_RULE`. With no ``task``, any task.
    A headless ``claude -p`` refuses every Bash command no rule allows ("This command requires
    approval"), whatever ``--permission-mode`` short of bypassing them all.
    """
    target = f" {task}" if task else ""
    return (*(f"Bash({prefix} {sub}{target}:*)" for sub in AGENT_COMMANDS), MCP_SERVER_RULE)


@dataclass(frozen=True)
class Preset:
    """How to run one agent CLI: ``program *fixed *args *fresh`` (or ``*resume``), brief on stdin."""

    name: PresetName
    program: str
    fixed: tuple[str, ...]
    fresh: tuple[str, ...]
    resume: tuple[str, ...]
    parse: Callable[[bytes], ResultInfo]
    pins_session: bool
    """The CLI takes a session id heartbeat chooses (else it reports one, read from its output)."""
    max_runtime: float | None = None
    non_retryable_exit_codes: tuple[int, ...] = ()
    output: str = ""
    """What the exit handling reads, for ``--explain``."""


PRESETS: dict[PresetName, Preset] = {
    PresetName.CLAUDE_CODE: Preset(
        name=PresetName.CLAUDE_CODE,
        program="claude",
        fixed=("-p", "--output-format", "stream-json", "--verbose",
               "--allowedTools", ",".join(claude_allow_rules("{id}"))),
        fresh=("--session-id", "{session}"),
        resume=("--resume", "{session}"),
        parse=parse_claude,
        pins_session=True,
        output="--allowedTools lets the agent run heartbeat's own commands on its task (show, brief, verify, "
               "set, add, touch, block, snooze, done) and the heartbeat MCP server's tools, nothing else; "
               "the final stream-json result line: is_error decides success (even with exit 0); "
               "not logged in / authentication errors block the task on a human; session_id, num_turns, "
               "total_cost_usd and token usage go into the exited event",
    ),
    PresetName.CODEX: Preset(
        name=PresetName.CODEX,
        program="codex",
        fixed=("exec", "--json", "--skip-git-repo-check", "-c", CODEX_STATE_WRITABLE),
        fresh=("-",),
        resume=("resume", "{session}", "-"),
        parse=parse_codex,
        pins_session=False,
        max_runtime=defaults.CODEX_MAX_RUNTIME,
        output="the JSONL events (the state dir is added to the workspace-write sandbox's writable roots so the "
               "agent can keep its note): thread.started's thread_id is the session; turn.completed is success, "
               "turn.failed or a final error is a failed attempt (an authentication error blocks the task "
               "on a human); token usage goes into the exited event",
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


def read_log_tail(path: str, *, head: int = defaults.RESULT_HEAD_BYTES, tail: int = defaults.RESULT_TAIL_BYTES) -> bytes:
    """The first ``head`` and the last ``tail`` bytes of the agent's log (all of a small one), or ``b""``.

    The log is written by the agent: a FIFO, a symlink or a device in its place is not
    read (non-blocking open, no symlinks followed, regular files only), and nothing more
    than ``head + tail`` bytes is ever read. A cut first line is dropped by the parser.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        if st.st_size <= head + tail:
            return _read(fd, head + tail)
        first = _read(fd, head)
        os.lseek(fd, st.st_size - tail, os.SEEK_SET)
        return first + b"\n" + _read(fd, tail)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _read(fd: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class SessionPlan:
    """The session of one dispatch."""

    session: str
    """The id for ``{session}`` and ``meta.session``; ``""`` when the CLI chooses it (a fresh Codex thread)."""
    resume: bool
    resumes: int
    """Resumes of this session so far, this one included (0 for a fresh one)."""
    why: str


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
    from heartbeat.timeparse import format_duration

    runtime = "no limit" if lc.max_runtime is None else format_duration(lc.max_runtime)
    lines.append(f"  max_runtime: {runtime}; stop_grace: {format_duration(lc.stop_grace)}")
    codes = ", ".join(str(c) for c in lc.non_retryable_exit_codes) or "none"
    lines.append(f"  exit handling: exit 0 ends the shift, any other exit or a signal is a failed attempt; "
                 f"non-retryable exit codes: {codes}")
    if preset is not None:
        lines.append(f"  output: {preset.output}")
    return lines
