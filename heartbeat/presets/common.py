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
a compaction-heavy session make a fresh one the better choice."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from heartbeat.model import defaults

if TYPE_CHECKING:
    pass

__all__ = [
    "PresetName",
    "SessionMode",
    "Preset",
    "ResultInfo",
    "SessionPlan",
    "parse_reset",
    "unknown_reset_zone",
    "valid_session_id",
    "AGENT_COMMANDS",
    "AGENT_READS",
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
# A limit is what the CLI itself says when the API refused the run, in the CLI's own shapes,
# anchored at the start of its error text: a task's own output that mentions limits ("fix the
# rate limiter", "429 handling") is never a wait.
_CLAUDE_LIMIT = re.compile(
    r"^API Error: (?:[^·{]*\((?:429|529)\)|(?:Repeated )?(?:429|529)\b)|^Claude AI usage limit reached\b|"
    r"^You've hit your (?:usage )?limit\b|^(?:\d+-hour|[Ww]eekly|Opus weekly|Session) limit reached\b")
"""Claude Code's result text for a refused run ("API Error: Request rejected (429) · ...", "API Error: 529
Overloaded", "Claude AI usage limit reached|1764612000", "You've hit your limit · resets 3pm")."""
_CODEX_LIMIT = re.compile(
    r"^(?:exceeded retry limit, last status: |unexpected status )(?:429|529)\b|^You've hit your usage limit\b|"
    r"^Quota exceeded\b|^Selected model is at capacity\b")
"""codex's error messages for a refused run ("exceeded retry limit, last status: 429 Too Many Requests",
"unexpected status 529 <unknown status code>: Overloaded", its usage-limit and quota errors)."""
_GEMINI_LIMIT_TYPES = ("TerminalQuotaError", "RetryableQuotaError")
_GEMINI_LIMIT = re.compile(r"^\[?API Error: .*(?:\b429\b|RESOURCE_EXHAUSTED)|^You have exhausted your capacity\b|"
                           r"^Quota exceeded for quota metric\b")
"""Gemini CLI's result error for a refused run (its quota error types, an API error with 429 or
RESOURCE_EXHAUSTED)."""
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


def final_text(value: object) -> str:
    """An agent's final message as an answer can hold it: printable, newlines kept, bounded."""
    from heartbeat.model.defaults import ANSWER_MAX_CHARS

    if not isinstance(value, str):
        return ""
    text = _ANSWER_CONTROL.sub(" ", value).strip()
    return text if len(text) <= ANSWER_MAX_CHARS else text[: ANSWER_MAX_CHARS - 1] + "…"


_ANSWER_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]+")


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
    text: str = ""
    """The run's final answer in full (Claude's ``result``, Codex's last agent message), control
    characters but newlines and tabs taken out, at most ``ANSWER_MAX_CHARS``; "" on an error."""
    session_id: str = ""
    terminal_reason: str = ""
    num_turns: int | None = None
    cost_usd: float | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    """Token counts: ``input_tokens``, ``output_tokens``, ``cache_read_tokens``, ``cache_creation_tokens``."""
    cost_source: str = ""
    """Where ``cost_usd`` comes from: ``result`` (the CLI's own total), ``usage`` (the stream's
    per-message token counts at list prices: a run cut before its result line) or ``""``."""
    cost_unknown: bool = False
    """The run spent what nothing in its output says (no cost, no priceable usage)."""
    unpriced_messages: int = 0
    """With ``cost_source`` ``usage``: messages left out of the cost (unreadable, or no price for the model)."""

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
        if self.cost_source:
            data["cost_source"] = self.cost_source
        if self.cost_unknown:
            data["cost"] = "unknown"
        if self.unpriced_messages:
            data["unpriced_messages"] = self.unpriced_messages
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
        zone = _zone(found["tz"])
        if zone is None:  # "resets 3pm (Mars/Olympus)": no instant is named (not one in the daemon's zone)
            return None
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


def _zone(name: str) -> tzinfo | None:
    """The zone a reset time names (``UTC``, ``GMT``, an IANA name), or None when there is no such zone."""
    if name.upper() in ("UTC", "GMT"):
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, ZoneInfoNotFoundError):
        return None


def unknown_reset_zone(text: str) -> str:
    """The zone a reset time in ``text`` names that does not exist ("Mars/Olympus"), else ``""``:
    such a reset is not read (:func:`parse_reset` falls back to the retry-after or the backoff),
    and the daemon says why."""
    for found in _RESETS.finditer(text or ""):
        clock = _CLOCK.match(found["when"].strip())
        if clock is not None and clock["tz"] and _zone(clock["tz"]) is None:
            return _text(clock["tz"])
    return ""


def parse_reset(text: str, now: datetime, local: tzinfo | None = None) -> tuple[datetime | None, float | None]:
    """What a limit message says about when to try again: ``(reset, retry_after)``.

    ``reset``: the instant the CLI names ("resets 3pm (UTC)", "resets at 2026-12-01T18:00Z",
    "try again at 3:45 PM", Claude's older "usage limit reached|1764612000"), as UTC, or None.
    ``retry_after``: seconds the text says to wait ("try again in 2 hours 5 minutes", "retry in
    35s", "retry-after: 30"), or None. A time of day with no zone is read in ``local`` (the
    daemon's own zone when None) and is the next such instant after ``now``; one in a zone that does
    not exist ("3pm (Mars/Olympus)") names no instant (:func:`unknown_reset_zone`). Pure: no clock.
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


AGENT_COMMANDS = ("show", "brief", "verify", "set", "add", "touch", "block", "snooze", "done", "ask")
"""The heartbeat commands the brief and the hooks tell an agent to run on its task (``ask``: a
question to its upstream or a person, which it then waits on)."""

AGENT_READS = ("show", "brief", "verify")
"""Those of :data:`AGENT_COMMANDS` that change no baton: the only ones a rule may allow on any task."""

MCP_SERVER_RULE = "mcp__heartbeat"
"""Claude Code's rule for every tool of the MCP server ``hooks install claude --mcp`` registers."""


def heartbeat_argv() -> list[str]:
    """How this heartbeat is run from a hook: its ``heartbeat`` script when that is on PATH and is
    this install's, else this interpreter with ``-m heartbeat``."""
    import sys

    script = next((os.path.join(d, "heartbeat") for d in os.environ.get("PATH", "").split(os.pathsep)
                   if d and os.access(os.path.join(d, "heartbeat"), os.X_OK)
                   and os.path.isfile(os.path.join(d, "heartbeat"))), None)
    mine = os.path.join(os.path.dirname(sys.executable), "heartbeat")
    if script and os.path.realpath(script) == os.path.realpath(mine):
        return [os.path.abspath(script)]
    if os.path.isfile(mine) and os.access(mine, os.X_OK):
        return [mine]
    return [sys.executable, "-m", "heartbeat"]


HOOK_MARK = "# heartbeat-hook"
"""Ends every hook command heartbeat writes: what install and uninstall recognise as theirs."""


def rail_hook_command(agent: str = "claude") -> str:
    """The rail's command line (``heartbeat hook AGENT``, no options: the agent's environment names the
    state dir and config), as ``hooks install`` writes it without options, so a CLI that dedups
    identical hook commands runs it once."""
    import shlex

    return f"{shlex.join([*heartbeat_argv(), 'hook', agent])} {HOOK_MARK}"


def claude_rail_settings() -> str:
    """``claude --settings``'s JSON for every run the ``claude-code`` preset launches (the
    ``{rail_settings}`` of its argv, filled in at launch): the rail (``PreToolUse``) on every tool, and
    the trail's end of each call (``PostToolUse``, :mod:`heartbeat.hotpath.trail`), so every agent the
    daemon launches keeps its trail without an install."""
    hook = {"type": "command", "command": rail_hook_command("claude"), "timeout": defaults.HOOK_TIMEOUT}
    tools = [{"matcher": "*", "hooks": [hook]}]
    return json.dumps({"hooks": {"PreToolUse": tools, "PostToolUse": tools}}, separators=(",", ":"))


RAIL_SETTINGS = "rail_settings"
"""The placeholder a preset's own argv holds for :func:`claude_rail_settings` (not one a config may use)."""

CODEX_RAIL = ("codex_rail_pre", "codex_rail_post", "codex_rail_trust")
"""The placeholders of the codex preset's three ``-c`` values (:func:`codex_rail_overrides`)."""

CODEX_SESSION_FLAGS = "/<session-flags>/config.toml"
"""The source codex 0.171 names its ``-c`` layer by in a hook's trust key (``hooks/list`` of ``codex app-server``)."""


def codex_trusted_hash(event_label: str, command: str, timeout: int) -> str:
    """codex 0.171's trust hash of one command hook (``currentHash`` in ``hooks/list``): SHA-256 of the
    canonical JSON (sorted keys, compact) of ``{event_name, matcher, hooks: [the normalized handler]}``;
    pinned against the real codex in ``tests/external/test_codex_rail.py``."""
    import hashlib

    identity = {"event_name": event_label, "matcher": "*",
                "hooks": [{"type": "command", "command": command, "timeout": timeout, "async": False}]}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's escapes, which TOML shares, and DEL, which JSON leaves raw."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def codex_rail_overrides(command: str = "") -> dict[str, str]:
    """The codex preset's ``-c`` values for every run (its ``{codex_rail_*}`` placeholders): the rail
    (``PreToolUse``) and the trail's end (``PostToolUse``) as hooks of this invocation's ``-c`` layer, and
    the trust record of exactly those two hooks. codex runs a non-managed hook only when its trust entry
    holds the hook's current hash; giving it with the run trusts heartbeat's own two hooks for this run
    only: no file of the person's is written and every other hook keeps codex's review."""
    command = command or rail_hook_command("codex")
    timeout = defaults.HOOK_TIMEOUT
    hook = f"[{{matcher=\"*\",hooks=[{{type=\"command\",command={_toml_string(command)},timeout={timeout}}}]}}]"
    trust = ",".join(f"{json.dumps(f'{CODEX_SESSION_FLAGS}:{label}:0:0')}="
                     f"{{trusted_hash={json.dumps(codex_trusted_hash(label, command, timeout))}}}"
                     for label in ("pre_tool_use", "post_tool_use"))
    pre, post, state = CODEX_RAIL
    return {pre: f"hooks.PreToolUse={hook}", post: f"hooks.PostToolUse={hook}", state: f"hooks.state={{{trust}}}"}


BARE_ARGS = {"claude-code": ("--bare",)}
"""Agent CLI flags that switch the hooks (and so the rail) off: ``check-config`` refuses a launcher with them."""

CODEX_HOOKS_OFF = re.compile(r"^\s*features\.(?:codex_)?hooks\s*=\s*false\s*$"
                             r"|^\s*hooks\s*(?:=|\.\s*(?:PreToolUse|PostToolUse|state)\b)")
"""A codex ``-c`` value that turns hooks off (``features.hooks=false``, its old name ``codex_hooks``) or
replaces what the rail's hooks or their trust are (a later ``-c`` of the same key wins)."""


def hooks_off_arg(preset: str, args: Sequence[str]) -> str:
    """The first of a launcher's ``args`` that would switch the agent CLI's hooks (the rail) off, or ``""``."""
    for i, arg in enumerate(args):
        if arg in BARE_ARGS.get(preset, ()):
            return arg
        if preset != "codex":
            continue
        value = args[i + 1] if arg in ("-c", "--config", "--disable") and i + 1 < len(args) else ""
        for flag in ("--config=", "--disable="):
            if arg.startswith(flag):
                arg, value = flag[:-1], arg[len(flag):]
        if arg.startswith("-c") and len(arg) > 2 and not arg.startswith("--"):
            arg, value = "-c", arg[2:]
        if (arg == "--disable" and value.strip() in ("hooks", "codex_hooks")) or \
                (arg in ("-c", "--config") and CODEX_HOOKS_OFF.search(value)):
            return f"{arg} {value}"
    return ""


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


@dataclass(frozen=True)
class SessionPlan:
    """The session of one dispatch."""

    session: str
    """The id for ``{session}`` and ``meta.session``; ``""`` when the CLI chooses it (a fresh Codex thread)."""
    resume: bool
    resumes: int
    """Resumes of this session so far, this one included (0 for a fresh one)."""
    why: str
