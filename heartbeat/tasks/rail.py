"""The rail: heartbeat on the tool-call seam, refusing what the baton says must not happen.

A note asks a model to obey; the rail does not ask. Claude Code and codex run
``heartbeat hook claude|codex`` before every tool call (``PreToolUse``); for a session bound
to a task (``$HEARTBEAT_TASK``) the hook hands the call and the task to :func:`decide`, a pure
function over plain data, which refuses the call, with one line the model reads, when:

1. the session's epoch is superseded (a zombie's side effects stop, not only its writes);
2. the task is not active: blocked (a person, a gate, a hold), snoozed, paused, done, failed
   or escalated. A block takes effect at the agent's next tool call;
3. the call names a guarded path (a ``protect`` glob: a Write/Edit target, or a word of a shell
   command, relative to the workdir) or matches a guarded command (a ``forbid`` glob);
4. the call matches an irreversible glob (the baton's ``irreversible``, else the launcher's,
   else ``[guards] irreversible``, else ``defaults.IRREVERSIBLE``) and ``verify`` is not fresh:
   :func:`decide` answers :attr:`Decision.needs_verify`, :func:`check` runs ``verify`` (which
   records it) and decides again with what it found.

heartbeat's own commands that read or hand back the task (``heartbeat show|brief|verify|set|
add|touch|block|snooze|done|status|ask|answer``, one plain command, and the ``heartbeat`` MCP server's
tools) are always allowed: the refused agent must still be able to read why and write its note.
Those on the session's own task, spelt as its brief spells them, the hook also approves
(:func:`own_task_call`): the Claude Code plugin carries no permission rules.
Every refusal is recorded as a ``rail_refused`` event (the rule, the tool, what it named).

A command glob matches the whole command (its words joined by single spaces) or any one of the
commands it chains with ``;``, ``&&``, ``||``, ``|`` or a newline; ``*`` matches anything,
``/`` included.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Guard, Status
from heartbeat.model.ledger import Event, EventKind

if TYPE_CHECKING:
    from datetime import datetime

    from heartbeat.store.base import Store
    from heartbeat.tasks.verify import VerifyResult

__all__ = ["Rule", "ToolCall", "RailView", "Decision", "Verified", "tool_call", "view_of", "decide", "check",
           "own_command", "deny_output", "relayed"]


class Rule(StrEnum):
    """Why the rail refused a call (the ``rail_refused`` event's ``rule``)."""

    SUPERSEDED = "superseded"
    NOT_ACTIVE = "not_active"
    PROTECTED = "protected"
    FORBIDDEN = "forbidden"
    STALE = "stale"


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the rail reads it: the tool's name, its shell command, the paths it writes."""

    tool: str
    command: str = ""
    paths: tuple[str, ...] = ()
    cwd: str = ""
    cut: bool = False
    """A command or path was longer than the rail reads (``RAIL_COMMAND_CHARS``): what lies past it is unread."""


@dataclass(frozen=True)
class RailView:
    """What :func:`decide` reads of a task: plain data, no store."""

    task: str
    status: Status
    epoch: int
    caller_epoch: int
    workdir: str = ""
    blocked_on: str = ""
    gate: str = ""
    guards: tuple[Guard, ...] = ()
    irreversible: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verified:
    """What ``verify`` found for an irreversible call: fresh or not, and what changed."""

    fresh: bool
    message: str = ""
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Allow (``reason`` empty), refuse (``rule`` and ``reason``), or run ``verify`` first."""

    allow: bool
    rule: Rule | None = None
    reason: str = ""
    needs_verify: bool = False
    matched: str = ""
    """The glob or path that decided it (for the ledger)."""
    data: dict[str, Any] = field(default_factory=dict)


ALLOW = Decision(True)

_OWN_COMMANDS = frozenset({"show", "brief", "verify", "set", "add", "touch", "block", "snooze", "done", "status",
                           "ask", "answer"})
_TASK_COMMANDS = _OWN_COMMANDS - {"status", "answer"}
"""(``answer`` names the asking task, not the session's own: an upstream's resumed session, bound to its
done task, answers a downstream's question with it; the CLI's fence lets only that question through.)"""
_OWN_OPTIONS = ("--state-dir", "--config")
_OWN_MCP = ("mcp__heartbeat__", "mcp__plugin_heartbeat_heartbeat__")
"""heartbeat's MCP tools: registered by ``hooks install claude --mcp``, and by the plugin (claude 2.1.332
names a plugin's tools ``mcp__plugin_<plugin>_<server>__<tool>``)."""
_SHELL_META = re.compile(r"[;&|`$<>\n\r(){}]")
_CHAIN = re.compile(r"\s*(?:&&|\|\||[;|\n])\s*")
_PATCH_FILE = re.compile(r"^\*\*\* (?:(?:Add|Update|Delete) File|Move to): (.+)$", re.MULTILINE)
_PATH_KEYS = ("file_path", "path", "notebook_path", "destination", "source", "target", "file", "new_path",
              "old_path")
"""The keys a write tool (Claude Code's, codex's, an MCP server's) names its files under."""
_SHELL_TOOLS = frozenset({"Bash", "shell", "local_shell", "exec_command", "container.exec", "unified_exec"})


def _text(value: object) -> str:
    return value[: defaults.RAIL_COMMAND_CHARS] if isinstance(value, str) else ""


def _too_long(value: object) -> bool:
    return isinstance(value, str) and len(value) > defaults.RAIL_COMMAND_CHARS


def tool_call(event: Mapping[str, Any]) -> ToolCall:
    """The call of a ``PreToolUse`` event (Claude Code's ``tool_name``/``tool_input``, codex's the same):
    a shell tool's ``command`` (text, or an argv list), the ``file_path`` of Write/Edit/MultiEdit, the
    files an ``apply_patch`` names."""
    tool = _text(event.get("tool_name"))
    raw = event.get("tool_input")
    tool_input: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    command = tool_input.get("command", tool_input.get("cmd", ""))
    if isinstance(command, list) and all(isinstance(a, str) for a in command):
        command = shlex.join(command)
    cut = _too_long(command) or any(_too_long(tool_input.get(k)) for k in _PATH_KEYS)
    command = _text(command)
    paths = [p for p in (_text(tool_input.get(k)) for k in _PATH_KEYS) if p]
    listed = tool_input.get("paths")
    if isinstance(listed, list):
        paths += [_text(p) for p in listed[:64] if isinstance(p, str) and p]
    patch = (command if tool == "apply_patch" or "*** Begin Patch" in command else "") or \
        _text(tool_input.get("patch")) or _text(tool_input.get("input"))
    if patch:
        paths += [m.strip() for m in _PATCH_FILE.findall(patch)]
        if tool == "apply_patch":
            command = ""
    if tool not in _SHELL_TOOLS and tool != "apply_patch" and not command.strip():
        command = ""
    return ToolCall(tool=tool, command=command, paths=tuple(paths), cwd=_text(event.get("cwd")), cut=cut)


def view_of(baton: Baton, caller_epoch: int, irreversible: Sequence[str]) -> RailView:
    """A task as :func:`decide` reads it; ``irreversible`` is the launcher's (or the config's) list,
    which the baton's own replaces when it has one."""
    gate = baton.meta.gate.spec() if baton.meta.gate else ""
    return RailView(task=baton.id, status=baton.meta.status, epoch=baton.meta.epoch, caller_epoch=caller_epoch,
                    workdir=baton.workdir, blocked_on=" ".join(baton.blocked_on.split())[:200], gate=gate,
                    guards=tuple(baton.guards), irreversible=tuple(baton.irreversible or irreversible))


def _own_programs() -> tuple[str, ...]:
    """The paths of this install's ``heartbeat`` command (the one its hooks and briefs run)."""
    from heartbeat.presets.common import heartbeat_argv

    first = heartbeat_argv()[0]
    return (first,) if os.path.basename(first) == "heartbeat" else ()


_FENCE_VARIABLE = re.compile(r"\bHEARTBEAT_(?:TASK|EPOCH|STATE_DIR|STORE_URL|CONFIG|RELAY)\s*=|"
                             r"(?:\bunset|\s-u)\s+HEARTBEAT_\w+")
"""A shell command that sets or drops one of the variables that bind an agent to its task and fence it."""


def own_command(call: ToolCall) -> bool:
    """Whether ``call`` is one of heartbeat's own agent commands (or its MCP server's tools), written as
    one plain command: nothing chained, redirected or substituted."""
    if call.tool.startswith(_OWN_MCP):
        return True
    if not call.command or _SHELL_META.search(call.command):
        return False
    try:
        argv = shlex.split(call.command)
    except ValueError:
        return False
    # Only heartbeat itself: the bare command (found on PATH as the agent's brief spells it), this
    # install's own script, or this interpreter's -m. A program the agent wrote and named
    # ``heartbeat`` (./heartbeat, /tmp/x/heartbeat) is not heartbeat, and passes nothing.
    if argv[:1] and (argv[0] == "heartbeat" or argv[0] in _own_programs()):
        rest = argv[1:]
    elif len(argv) >= 3 and argv[0] == sys.executable and argv[1:3] == ["-m", "heartbeat"]:
        rest = argv[3:]
    else:
        return False
    while len(rest) >= 2 and rest[0] in _OWN_OPTIONS:
        rest = rest[2:]
    return bool(rest) and rest[0] in _OWN_COMMANDS


def own_task_call(event: Mapping[str, Any], task: str, prefix: str) -> bool:
    """Whether ``event``'s call is one of heartbeat's agent commands on ``task`` itself, exactly as the
    brief writes it (``prefix``, a command of :data:`_TASK_COMMANDS`, ``task``; one plain shell command,
    no other global option), or a heartbeat MCP tool given ``id`` ``task``: what the hook of a session
    bound to ``task`` approves without asking, the per-task rules of ``claude_allow_rules`` as an answer."""
    call = tool_call(event)
    if call.tool.startswith(_OWN_MCP):
        raw = event.get("tool_input")
        return isinstance(raw, Mapping) and raw.get("id") == task and bool(task)
    if call.tool not in _SHELL_TOOLS or not call.command or _SHELL_META.search(call.command):
        return False
    try:
        argv, spelt = shlex.split(call.command), shlex.split(prefix)
    except ValueError:
        return False
    rest = argv[len(spelt):]
    return (argv[:len(spelt)] == spelt and len(rest) >= 2 and rest[0] in _TASK_COMMANDS and rest[1] == task
            and not any(_global_option(w) for w in rest))


def _global_option(word: str) -> bool:
    """``--state-dir``/``--config`` in any spelling argparse takes (``--state=X``, ``--conf``)."""
    name = word.split("=", 1)[0]
    return len(name) > 2 and name.startswith("--") and any(o.startswith(name) for o in _OWN_OPTIONS)


def _commands(command: str) -> list[str]:
    """The command, and each command it chains, with its words joined by single spaces."""
    whole = " ".join(command.split())
    parts = [" ".join(p.split()) for p in _CHAIN.split(command)]
    return [whole, *(p for p in parts if p and p != whole)]


def _matches_command(command: str, globs: Sequence[str]) -> str:
    """The first glob ``command`` (or one of its chained commands) matches, or ""."""
    if not command.strip():
        return ""
    commands = _commands(command)
    for glob in globs:
        pattern = " ".join(glob.split())
        if any(fnmatch.fnmatchcase(c, pattern) for c in commands):
            return glob
    return ""


def _words(command: str) -> list[str]:
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        words = command.split()
    return [w.lstrip("<>&|;") for w in words if w.lstrip("<>&|;")]


def _relative(path: str, cwd: str, workdir: str) -> str | None:
    """``path`` relative to the workdir (None when it lies outside it)."""
    if not workdir:
        return None
    try:
        absolute = os.path.normpath(os.path.join(cwd or workdir, os.path.expanduser(path)))
        rel = os.path.relpath(absolute, os.path.normpath(workdir))
    except ValueError:  # (a NUL in it: no tool can open such a path)
        return None
    return None if rel == ".." or rel.startswith("../") else rel


def _resolved(path: str, cwd: str, workdir: str) -> str | None:
    """A Write/Edit target through its symlinks, relative to the workdir's real path (None: outside, or unchanged)."""
    if not workdir:
        return None
    try:
        real = os.path.realpath(os.path.join(cwd or workdir, os.path.expanduser(path)))
        rel = os.path.relpath(real, os.path.realpath(workdir))
    except (ValueError, OSError):
        return None
    return None if rel == ".." or rel.startswith("../") else rel


def _protected(call: ToolCall, view: RailView, guard: Guard) -> str:
    """The path of ``call`` that ``guard`` protects, or "" (a file target is also read through its symlinks)."""
    words = _words(call.command) if call.command else []
    named = [_relative(t, call.cwd, view.workdir) for t in (*call.paths, *words)]
    named += [_resolved(t, call.cwd, view.workdir) for t in call.paths]
    for rel in named:
        if rel is None:
            continue
        for glob in guard.protect:
            bare = glob.rstrip("/")
            if fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(rel, bare) or fnmatch.fnmatchcase(rel, bare + "/*"):
                return rel
    return ""


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decide(call: ToolCall, view: RailView, *, verified: Verified | None = None,
           prefix: str = "heartbeat") -> Decision:
    """Allow or refuse ``call`` on ``view``'s task (see the module docstring for the order).

    An irreversible call with ``verified`` None answers ``needs_verify``: the caller runs
    ``verify`` and calls again with what it found. ``prefix`` is how the reason spells heartbeat.
    """
    if own_command(call):
        return ALLOW
    task = view.task
    if view.caller_epoch < view.epoch:
        return Decision(False, Rule.SUPERSEDED,
                        f"heartbeat refused this call: your epoch {view.caller_epoch} of task {task!r} was superseded "
                        f"by epoch {view.epoch} (another agent holds the task). Stop now: do no more work.")
    if view.status is not Status.ACTIVE:
        if view.status is Status.BLOCKED:
            why = f"blocked on {view.blocked_on!r}" + (f" (gate {view.gate})" if view.gate else "")
            then = f"Stop here and end your turn; it resumes when the block clears (`{prefix} show {task}`)."
        else:
            why = view.status.value
            then = "Stop here and end your turn: there is nothing more to do under this task."
        return Decision(False, Rule.NOT_ACTIVE, f"heartbeat refused this call: task {task!r} is {why}. {then}",
                        data={"status": view.status.value})
    if call.command and _FENCE_VARIABLE.search(call.command):
        return Decision(False, Rule.FORBIDDEN,
                        f"heartbeat refused this call: it changes the variables that bind you to task {task!r} "
                        "(HEARTBEAT_TASK, HEARTBEAT_EPOCH, ...); they are not yours to change. Go on without it.",
                        matched="HEARTBEAT_*=")
    if call.cut and (view.guards or view.irreversible):
        return Decision(False, Rule.FORBIDDEN,
                        f"heartbeat refused this call: its command or path is longer than the rail reads "
                        f"({defaults.RAIL_COMMAND_CHARS} characters), and task {task!r} has guards to check. "
                        "Split it into shorter calls.", matched="too long")
    for guard in view.guards:
        path = _protected(call, view, guard) if guard.protect else ""
        if path:
            return Decision(False, Rule.PROTECTED,
                            f"heartbeat refused this call: {path} is protected by the constraint "
                            f"{_short(guard.constraint)!r} of task {task!r}. Leave it alone and go on without it.",
                            matched=path)
        glob = _matches_command(call.command, guard.forbid) if guard.forbid else ""
        if glob:
            return Decision(False, Rule.FORBIDDEN,
                            f"heartbeat refused this call: the constraint {_short(guard.constraint)!r} of task "
                            f"{task!r} forbids commands like {glob!r}. Go on without it.", matched=glob)
    glob = _matches_command(call.command, view.irreversible)
    if not glob:
        return ALLOW
    if verified is None:
        return Decision(False, needs_verify=True, matched=glob)
    if verified.fresh:
        return Decision(True, matched=glob)
    changed = ", ".join(verified.changed[:5]) + (f" and {len(verified.changed) - 5} more" if len(verified.changed) > 5
                                                 else "")
    return Decision(False, Rule.STALE,
                    f"heartbeat refused this irreversible call ({glob!r}): the baton of task {task!r} is stale"
                    + (f" ({changed} changed)" if changed else f" ({_short(verified.message)})")
                    + f". Re-read `{prefix} brief {task}`, check the world, write the note, then try again.",
                    matched=glob, data={"changed": list(verified.changed)})


def _verified(result: VerifyResult) -> Verified:
    return Verified(fresh=result.ok, message=result.message,
                    changed=tuple(str(c.get("key", "")) for c in result.changed)
                    + tuple(str(b.get("upstream", "")) for b in result.broken))


def check(event: Mapping[str, Any], baton: Baton, store: Store, *, caller_epoch: int, irreversible: Sequence[str],
          session_id: str = "", prefix: str = "heartbeat", now: datetime | None = None,
          later: list[Callable[[], None]] | None = None) -> Decision:
    """Decide ``event``'s tool call for ``baton``'s task: run ``verify`` when the decision needs it
    (recording a ``verified`` event) and record a refusal (``rail_refused``)."""
    call = tool_call(event)
    view = view_of(baton, caller_epoch, irreversible)
    decision = decide(call, view, prefix=prefix)
    if decision.needs_verify:
        from heartbeat.model.errors import HeartbeatError
        from heartbeat.tasks.verify import verify

        try:
            result = verify(store, baton.id, epoch=caller_epoch, actor="rail", now=now)
        except (HeartbeatError, OSError, ValueError) as exc:  # no verify, no irreversible call
            decision = Decision(False, Rule.STALE, f"heartbeat refused this irreversible call ({decision.matched!r}): "
                                f"verify could not run ({_short(str(exc))}). Try again later.", matched=decision.matched)
        else:
            decision = decide(call, view, verified=_verified(result), prefix=prefix)
    if not decision.allow and decision.rule is not None:
        def record() -> None:
            _record_refusal(store, baton, call, decision, caller_epoch=caller_epoch, session_id=session_id, now=now)

        if later is None:
            record()
        else:  # the caller answers the agent first: a slow ledger never delays (or undoes) a refusal
            later.append(record)
    return decision


def _clean(text: str) -> str:
    """``text`` as the ledger can hold it (a lone surrogate, which JSON lets a model send, escaped)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _record_refusal(store: Store, baton: Baton, call: ToolCall, decision: Decision, *, caller_epoch: int,
                    session_id: str, now: datetime | None) -> None:
    """Record ``rail_refused``, best effort: the refusal stands whether or not the ledger takes it
    (a locked or full ledger must not turn a refusal into an allow)."""
    from heartbeat.model.errors import HeartbeatError
    from heartbeat.model.timeparse import utcnow

    try:
        store.record([Event(task=baton.id, kind=EventKind.RAIL_REFUSED, ts=now or utcnow(), epoch=caller_epoch,
                            revision=baton.meta.revision, actor="hook",
                            data={"rule": decision.rule.value if decision.rule else "", "tool": _clean(call.tool[:80]),
                                  "target": _clean(_short(call.command or " ".join(call.paths), 200)),
                                  "session_id": _clean(session_id), **({"matched": decision.matched[:200]}
                                                               if decision.matched else {}), **decision.data})])
    except (HeartbeatError, OSError, ValueError):
        pass


def relayed(store: Store, args: Sequence[str], env: Mapping[str, str],
            irreversible: Callable[[str], Sequence[str]] | None,
            later: list[Callable[[], None]] | None = None) -> str | None:
    """The daemon's relay answering an agent's ``PreToolUse`` (``args``: the task and the event's JSON,
    ``env``: the agent's ``HEARTBEAT_TASK``/``HEARTBEAT_EPOCH``): the hook's stdout, the deny line or
    nothing. Not an agent's event answers nothing, as the hook would; a decision that could not be
    made here (the store failing) is None: the agent's own hook decides, never an allow by default."""
    import json

    from heartbeat.model.errors import HeartbeatError
    from heartbeat.tasks.write import epoch_from_env

    if len(args) != 2 or env.get("HEARTBEAT_TASK") != args[0]:
        return ""
    try:
        event = json.loads(args[1])
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or event.get("hook_event_name") != "PreToolUse":
        return ""
    try:
        baton = store.load(args[0])
        mine = epoch_from_env(baton.id, env)
        launcher = (baton.meta.owner.launcher if baton.meta.owner else "") or baton.launcher
        globs = defaults.IRREVERSIBLE if irreversible is None else irreversible(launcher)
        session = event.get("session_id")
        decision = check(event, baton, store, caller_epoch=baton.meta.epoch if mine is None else mine,
                         irreversible=globs, session_id=session if isinstance(session, str) else "", later=later)
    except (HeartbeatError, ValueError, RecursionError, OSError):
        return None
    return "" if decision.allow else json.dumps(deny_output(decision.reason), ensure_ascii=False)


def allow_output(task: str) -> dict[str, Any]:
    """The hook's answer that approves a call :func:`own_task_call` recognised (no permission prompt)."""
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                   "permissionDecisionReason": f"heartbeat: task {task!r}'s own command"}}


def deny_output(reason: str) -> dict[str, Any]:
    """The hook's answer that refuses the call (Claude Code 2.1.332 and codex 0.171 read the same)."""
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                   "permissionDecisionReason": reason}}
