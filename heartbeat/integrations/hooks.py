"""The compaction seam: Claude Code and Codex hooks, and the install that wires them in.

A live agent session crosses seams no process exit shows: its context is compacted,
cleared or resumed, and the agent goes on from a summary. ``heartbeat hook claude`` (and
``heartbeat hook codex``: codex 0.171's hooks take the same JSON in and out) is the command
the CLI runs at those moments (one hook event as JSON on stdin); it acts on
``hook_event_name``:

``SessionStart``
    prints the task's brief as ``additionalContext`` (whatever the ``source``), and records
    ``session_started`` (``source``, ``session_id``) in the ledger.
``PreCompact``
    records ``compacting`` (``trigger``, ``note_age_s``: seconds since the note was last
    written, ``fresh``: within ``hooks.fresh_within``).
``Stop``
    only in a session *bound* to the task (its environment names it: ``$HEARTBEAT_TASK``,
    which the daemon sets for every agent it launches and a person sets to bind a session
    by hand): when the task is still active and its note was not written since the
    session's last start or previous stop, blocks the stop (``{"decision": "block",
    "reason": ...}``, the reason naming the ``heartbeat set``/``add`` to run) and records
    ``stop_blocked``; at most ``hooks.max_stop_blocks`` times per session, never when
    ``stop_hook_active`` is true, never for an agent whose epoch was superseded. An allowed
    stop is recorded as ``stop_allowed`` (the next stop's reference point).
``SessionEnd``
    records ``session_ended`` (``reason``).

The task is ``$HEARTBEAT_TASK``, else ``--task``, else the one open task whose ``workdir`` is
the event's ``cwd`` or holds it (the deepest such workdir); with none (or several) the hook
does nothing. Every command it prints carries the ``--state-dir``/``--config`` it was run
with. A hook never breaks the agent: every failure is one line on stderr and exit 0. It
never creates a state dir.

``heartbeat hooks install claude`` merges the four hooks into ``.claude/settings.json``
(``--user``: ``~/.claude/settings.json``) keeping everything already there, adds permission
rules that let a session run heartbeat's own agent commands (:func:`allow_rules`) to
``.claude/settings.local.json`` (``--user``: the same file), and with
``--mcp`` registers ``heartbeat mcp`` in ``.mcp.json``; ``heartbeat hooks install codex``
merges them into ``.codex/hooks.json`` (``--user``: ``$CODEX_HOME/hooks.json``) and adds a
marked section to ``AGENTS.md``. Each hook heartbeat writes ends in the marker
``# heartbeat-hook``; install and uninstall touch only marked hooks (and those of the same
state dir and config, when another heartbeat install serves another), never a person's own.
A file holding a value JSON cannot (``1e400``, ``NaN``) is refused untouched."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from heartbeat.model import defaults
from heartbeat.model.errors import BadInput, HeartbeatError, NotFound
from heartbeat.model.ledger import EventKind

if TYPE_CHECKING:
    from heartbeat.config.shape import HooksConfig
    from heartbeat.model.baton import Baton
    from heartbeat.model.ledger import Event
    from heartbeat.store.base import Store

__all__ = [
    "HOOK_EVENTS",
    "SEAM_KINDS",
    "HookResult",
    "handle_event",
    "run_hook",
    "hook_main",
    "session_context",
    "context_length",
    "HOOK_AGENTS",
]

HOOK_EVENTS = ("SessionStart", "PreCompact", "Stop", "SessionEnd", "PreToolUse", "PostToolUse")
"""The hook events heartbeat installs and acts on (Claude Code 2.1.332 and codex 0.171.0 both fire them)."""

HOOK_AGENTS = ("claude", "codex")
"""The agent CLIs ``heartbeat hook`` serves."""

SEAM_KINDS = (EventKind.SESSION_STARTED, EventKind.COMPACTING, EventKind.STOP_BLOCKED, EventKind.STOP_ALLOWED,
              EventKind.SESSION_ENDED)
"""The ledger event kinds the hook records."""

_MARK_KINDS = (EventKind.SESSION_STARTED, EventKind.STOP_BLOCKED, EventKind.STOP_ALLOWED, EventKind.SESSION_ENDED)
_NOTE_KINDS = (EventKind.UPDATED, EventKind.DONE, EventKind.FAILED, EventKind.BLOCKED, EventKind.SNOOZED,
               EventKind.CREATED)
_TOOL_EVENTS = ("PreToolUse", "PostToolUse")
_ACTOR = "hook"


# -- the hook ----------------------------------------------------------------------------


@dataclass
class HookResult:
    """What the hook prints on stdout (may be empty) and its exit code (always 0)."""

    stdout: str = ""
    code: int = 0
    after: tuple[Callable[[], None], ...] = ()
    """What is recorded once the answer is out (a refusal's ``rail_refused``): never before it."""
    refused: bool = False
    """A ``PreToolUse`` the rail refused: the call does not start."""


def _str(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    return value if isinstance(value, str) else ""


def _find_task(store: Store, task: str | None, cwd: str, env: Mapping[str, str]) -> Baton | None:
    """The task this session works on, or None when it cannot be told.

    ``$HEARTBEAT_TASK``, else ``--task``, else by the event's ``cwd``: of the tasks whose
    workdir is the cwd or one of its parents, the open ones (all, when none is open), the
    deepest workdir; two at that depth are ambiguous.
    """
    from heartbeat.model.baton import FINISHED_STATUSES

    task_id = env.get("HEARTBEAT_TASK") or task
    if task_id:
        return store.load(task_id)
    if not cwd:
        return None
    here = os.path.realpath(cwd)
    holding: list[tuple[int, Baton]] = []
    for entry in store.scan():
        baton = entry.baton
        if baton is None or not baton.workdir:
            continue
        workdir = os.path.realpath(baton.workdir)
        if here == workdir or here.startswith(workdir.rstrip(os.sep) + os.sep):
            holding.append((len(workdir), baton))
    pool = [(depth, b) for depth, b in holding if b.meta.status not in FINISHED_STATUSES] or holding
    if not pool:
        return None
    deepest = max(depth for depth, _ in pool)
    found = [b for depth, b in pool if depth == deepest]
    return found[0] if len(found) == 1 else None


def _bound(baton: Baton, env: Mapping[str, str]) -> bool:
    """Whether the session is bound to ``baton``'s task: its environment names the task
    (``$HEARTBEAT_TASK``, set by the daemon for its agents and by a person who binds a session)."""
    return env.get("HEARTBEAT_TASK") == baton.id


def _epoch(baton: Baton, env: Mapping[str, str]) -> int:
    from heartbeat.api import epoch_from_env

    try:
        mine = epoch_from_env(baton.id, env)
    except BadInput:
        mine = None
    return baton.meta.epoch if mine is None else mine


def _last_note_write(events: Sequence[Event]) -> datetime | None:
    """When the note was last written by anyone but the daemon (a content write or a status verb)."""
    for e in reversed(events):
        if e.kind in _NOTE_KINDS and e.actor != "daemon" and (e.kind != EventKind.UPDATED or e.data.get("changed")):
            return e.ts
    return None


def _session_marks(events: Sequence[Event], session_id: str) -> list[Event]:
    """The session's starts, stops and end: the reference points of the Stop hook."""
    return [e for e in events if e.kind in _MARK_KINDS and e.data.get("session_id") == session_id]


def command_prefix(state_dir_arg: str = "", config_arg: str = "") -> str:
    """``heartbeat`` with the ``--state-dir``/``--config`` the hook was run with, for the commands it prints."""
    import shlex

    argv = ["heartbeat"]
    if state_dir_arg:
        argv += ["--state-dir", os.path.abspath(state_dir_arg)]
    if config_arg:
        argv += ["--config", os.path.abspath(config_arg)]
    return shlex.join(argv)


def _with_prefix(text: str, prefix: str) -> str:
    """``text`` with every quoted heartbeat command (`` `heartbeat ...` ``) run as ``prefix``."""
    return text if prefix == "heartbeat" else text.replace("`heartbeat ", f"`{prefix} ")


def handle_event(
    event: Mapping[str, Any],
    store: Store,
    *,
    task: str | None = None,
    hooks: HooksConfig | None = None,
    env: Mapping[str, str] | None = None,
    state_dir_arg: str = "",
    config_arg: str = "",
    max_attempts: int | None = None,
    now: datetime | None = None,
    trail_dir: str = "",
    irreversible: Callable[[str], Sequence[str]] | None = None,
) -> HookResult:
    """Act on one hook event for the task it belongs to; record the seam. ``PreToolUse`` is the
    rail (:mod:`heartbeat.tasks.rail`), ``irreversible`` giving a launcher's globs (None: the defaults);
    ``trail_dir``: the local state dir whose trails the brief of a SessionStart reads
    (:mod:`heartbeat.hotpath.trail`)."""
    from heartbeat.config.shape import HooksConfig
    from heartbeat.model.baton import Status
    from heartbeat.model.ledger import Event
    from heartbeat.model.timeparse import utcnow

    env = os.environ if env is None else env
    hooks = hooks or HooksConfig()
    now = now or utcnow()
    name = _str(event, "hook_event_name")
    if name not in HOOK_EVENTS or (name in _TOOL_EVENTS and name != "PreToolUse"):
        return HookResult()  # a tool call's end is kept in its trail before the store is opened (run_hook)
    if name == "PreToolUse" and not env.get("HEARTBEAT_TASK"):
        return HookResult()  # the rail holds only a session bound to a task
    found = _find_task(store, task, _str(event, "cwd"), env)
    if found is None:
        return HookResult()
    baton: Baton = found  # (rebound when a person's session claims the task)
    session_id = _str(event, "session_id")
    epoch = _epoch(baton, env)
    if name == "PreToolUse":
        return _rail(event, baton, store, env=env, epoch=epoch, session_id=session_id, now=now,
                     irreversible=irreversible, prefix=command_prefix(state_dir_arg, config_arg))

    def record(kind: EventKind, **data: Any) -> None:
        store.record([Event(task=baton.id, kind=kind, ts=now, epoch=epoch, revision=baton.meta.revision,
                            actor=_ACTOR, data={"session_id": session_id, **data})])

    if name == "SessionStart":
        source = _str(event, "source") or "startup"
        baton, claimed = _person_claims(store, baton, env, prefix=command_prefix(state_dir_arg, config_arg))
        epoch = _epoch(baton, env)
        record(EventKind.SESSION_STARTED, source=source)
        from heartbeat.reports.brief import unnoted_for

        unnoted = unnoted_for(trail_dir, store, baton, epoch=epoch)
        from heartbeat.tasks.needs import needs_lines

        context = claimed + session_context(baton, source, env, max_attempts=max_attempts, epoch=epoch, now=now,
                                  prefix=command_prefix(state_dir_arg, config_arg),
                                  unnoted=unnoted.lines() if unnoted else (), needs=needs_lines(store, baton))
        out = {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}
        return HookResult(json.dumps(out, ensure_ascii=False) + "\n")
    events = store.ledger.events(baton.id)
    last_write = _last_note_write(events)
    if name == "PreCompact":
        written = last_write or baton.meta.updated_at or baton.meta.created_at
        age = round(max(0.0, (now - written).total_seconds()), 3) if written else None
        record(EventKind.COMPACTING, trigger=_str(event, "trigger") or "auto", note_age_s=age,
               fresh=age is not None and age <= hooks.fresh_within, fresh_within_s=hooks.fresh_within)
        return HookResult()
    if name == "SessionEnd":
        record(EventKind.SESSION_ENDED, reason=_str(event, "reason") or "other")
        return HookResult()
    # Stop
    if not _bound(baton, env):
        return HookResult()  # a person's own session in the workdir is never held up
    if event.get("stop_hook_active") is True:
        record(EventKind.STOP_ALLOWED, why="stop_hook_active")
        return HookResult()
    if baton.meta.status is not Status.ACTIVE or epoch < baton.meta.epoch:
        return HookResult()
    mine = _session_marks(events, session_id)
    since = mine[-1].ts if mine and mine[-1].kind != EventKind.SESSION_ENDED else None
    blocked = sum(1 for e in mine if e.kind == EventKind.STOP_BLOCKED)
    stale = since is not None and (last_write is None or last_write < since)
    if not stale or blocked >= hooks.max_stop_blocks:
        record(EventKind.STOP_ALLOWED, why="note written" if not stale else f"{blocked} block(s) in this session")
        return HookResult()
    hb = command_prefix(state_dir_arg, config_arg)
    reason = (f"heartbeat: the state note of task {baton.id!r} has not been written since this session "
              f"{'started' if mine[-1].kind == EventKind.SESSION_STARTED else 'last stopped'}. Before you stop, write it so "
              f"the next session (after a compaction, a crash or a handoff) can continue: run "
              f"`{hb} set {baton.id} step=\"<where you are now>\" next_step=\"<what comes next>\"` and "
              f"`{hb} add {baton.id} done \"<what you finished>\"` (or `{hb} done {baton.id}` if the task is "
              "finished), then stop.")
    record(EventKind.STOP_BLOCKED, note_age_s=round((now - last_write).total_seconds(), 3) if last_write else None)
    return HookResult(json.dumps({"decision": "block", "reason": reason}, ensure_ascii=False) + "\n")


_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish"})
"""What the CLI runs a hook command through: the session is the first ancestor that is none of these."""


def _session_process() -> tuple[int, float] | None:
    """``(pid, create_time)`` of the agent CLI that runs this hook: the nearest ancestor that is not a shell."""
    import psutil

    try:
        proc = psutil.Process(os.getppid())
        while proc.name() in _SHELLS and proc.ppid() > 1:
            proc = psutil.Process(proc.ppid())
        return proc.pid, proc.create_time()
    except (psutil.Error, ValueError):
        return None


def _person_claims(store: Store, baton: Baton, env: Mapping[str, str], *, prefix: str) -> tuple[Baton, str]:
    """A session a person bound by hand (``$HEARTBEAT_TASK`` without ``$HEARTBEAT_EPOCH``: the daemon sets
    both for its agents) claims its task for the session's process, so the daemon dispatches no second
    agent onto it while the session runs. A task another live agent holds is left to it: the context's
    first line says so and how to take it. Returns the baton and that line ("" when nothing to say)."""
    from heartbeat.launchers.liveness import this_host
    from heartbeat.model.baton import Owner, Status
    from heartbeat.model.errors import Conflict, NotActive
    from heartbeat.model.timeparse import utcnow
    from heartbeat.tasks.verbs import claim

    if not _bound(baton, env) or env.get("HEARTBEAT_EPOCH"):
        return baton, ""
    if baton.meta.status not in (Status.ACTIVE, Status.SNOOZED):
        return baton, ""  # a paused task stays paused: a session starting is no resume
    found = _session_process()
    if found is None:
        return baton, ""
    held = baton.meta.owner
    if held is not None and held.pid == found[0] and held.host == this_host():
        return baton, ""  # this session's own claim (a resume, a compaction, a clear)
    owner = Owner(pid=found[0], create_time=found[1], host=this_host(), how="claim", started_at=utcnow())
    try:
        baton = claim(store, baton.id, owner, actor=_ACTOR)
    except NotActive:
        return baton, ""
    except Conflict as exc:
        return baton, (f"heartbeat: this session did NOT claim task {baton.id!r}: {exc.message}. Another agent "
                       f"works it; to take it over run `{prefix} claim {baton.id} --force --pid {found[0]}`.\n\n")
    except HeartbeatError as exc:  # (a busy or lost database): the brief still comes, and says so
        return baton, (f"heartbeat: this session could not claim task {baton.id!r} ({exc.message}); the daemon may "
                       f"dispatch an agent onto it: run `{prefix} claim {baton.id} --pid {found[0]}`.\n\n")
    return baton, (f"heartbeat: this session claimed task {baton.id!r} (epoch {baton.meta.epoch}, pid {found[0]}): "
                   f"the daemon dispatches no agent onto it while this session runs; `{prefix} release {baton.id}` "
                   "hands it back.\n\n")


def _rail(event: Mapping[str, Any], baton: Baton, store: Store, *, env: Mapping[str, str], epoch: int,
          session_id: str, now: datetime, irreversible: Callable[[str], Sequence[str]] | None,
          prefix: str) -> HookResult:
    """``PreToolUse`` in a bound session: the rail's answer (nothing printed: the call goes on, as the
    CLI's permissions say; the task's own heartbeat commands approved)."""
    from heartbeat.tasks.rail import allow_output, check, deny_output, own_task_call

    if not _bound(baton, env):
        return HookResult()
    launcher = (baton.meta.owner.launcher if baton.meta.owner else "") or baton.launcher
    globs = defaults.IRREVERSIBLE if irreversible is None else irreversible(launcher)
    later: list[Callable[[], None]] = []
    decision = check(event, baton, store, caller_epoch=epoch, irreversible=globs, session_id=session_id,
                     prefix=prefix, now=now, later=later)
    if decision.allow and own_task_call(event, baton.id, prefix):
        return HookResult(json.dumps(allow_output(baton.id), ensure_ascii=False) + "\n")
    if decision.allow:
        return HookResult()
    return HookResult(json.dumps(deny_output(decision.reason), ensure_ascii=False) + "\n", refused=True,
                      after=tuple(later))


def context_length(text: str) -> int:
    """``text``'s length as Claude Code measures it (JavaScript's: UTF-16 code units)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def session_context(baton: Baton, source: str, env: Mapping[str, str], *, max_attempts: int | None = None,
                    epoch: int | None = None, now: datetime | None = None,
                    budget: int = defaults.HOOK_BRIEF_BUDGET,
                    limit: int = defaults.CLAUDE_HOOK_CONTEXT_LIMIT, prefix: str = "heartbeat",
                    unnoted: Sequence[str] = (), needs: Sequence[str] = ()) -> str:
    """The SessionStart hook's ``additionalContext``: always within ``limit`` code units, so the CLI
    never swaps it for a preview. Essentials first (intent, every constraint, the current and next
    step, the block, the note-keeping commands with the task id spelled out), then as much of the
    rest of the brief as ``budget`` holds, the rest named and left to ``heartbeat brief ID`` (and the
    dispatch's brief file). Every `` `heartbeat ...` `` command is run as ``prefix`` (with the
    ``--state-dir``/``--config`` the hook was installed with), which the limit counts too. Should
    the essentials alone not fit (hundreds of constraints), the context says so and points at the
    whole brief instead of letting the CLI cut it."""
    from heartbeat.reports.brief import render_brief

    brief_file = env.get("HEARTBEAT_BRIEF", "") if env.get("HEARTBEAT_TASK") == baton.id else ""
    where = f"`heartbeat brief {baton.id}`" + (f" or `{brief_file}`" if brief_file else "")
    head = (f"heartbeat: this session works on task {baton.id!r} (session {source}). Its baton is the "
            "state note that survives compaction and restarts: read the brief below first, and keep the "
            f"note current with `heartbeat set {baton.id}`/`heartbeat add {baton.id}` as you go "
            f"(the whole brief: {where}).\n\n")
    brief = render_brief(baton, budget=budget, max_attempts=max_attempts, epoch=epoch, now=now,
                         essentials_first=True, brief_file=brief_file, unnoted=unnoted, needs=needs)
    for smaller in (budget, budget * 3 // 4, budget // 2, budget // 4):  # long prefixes take room too
        if smaller != budget:
            brief = render_brief(baton, budget=smaller, max_attempts=max_attempts, epoch=epoch, now=now,
                                 essentials_first=True, brief_file=brief_file, unnoted=unnoted, needs=needs)
        text = _with_prefix(head + brief.text, prefix)
        if context_length(text) <= limit:
            return text
    for cap in _FIELD_CAPS:  # one long field (a 9,500-character intent): cut it, keep the rest whole
        cut = _cut_fields(baton, cap)
        if cut is None:
            continue
        brief = render_brief(cut, budget=budget // 4, max_attempts=max_attempts, epoch=epoch, now=now,
                             essentials_first=True, brief_file=brief_file, needs=needs)
        text = _with_prefix(head + brief.text, prefix)
        if context_length(text) <= limit:
            return text
    short = (f"heartbeat: this session works on task {baton.id!r} (session {source}). Its brief is too long "
             f"to give here whole ({context_length(brief.text)} characters): before anything else, run "
             f"{where} and read it all, above all its {len(baton.constraints)} constraints (DO NOT BREAK THESE). "
             f"Keep the note with `heartbeat set {baton.id} step=\"...\" next_step=\"...\"` and "
             f"`heartbeat add {baton.id} done \"...\"`; `heartbeat done {baton.id}` when finished.\n")
    short = _with_prefix(short, prefix)
    if context_length(short) > limit:  # a path of thousands of characters: cut, never over the limit
        short = short.encode("utf-16-le", "surrogatepass")[: 2 * limit].decode("utf-16-le", "ignore")
    return short


_CUT_FIELDS = ("task", "intent", "step", "next_step", "blocked_on")
"""The one-line fields of the essentials a hook's context may cut (never a constraint: the pointer
fallback names those)."""
_FIELD_CAPS = (2000, 1000, 400)
"""Characters each of :data:`_CUT_FIELDS` is cut to, tried in turn, when the essentials do not fit."""


def _cut_fields(baton: Baton, cap: int) -> Baton | None:
    """A copy of ``baton`` with each of :data:`_CUT_FIELDS` longer than ``cap`` cut there, saying so;
    None when none is that long."""
    cut = baton.copy()
    changed = False
    for name in _CUT_FIELDS:
        value = getattr(cut, name)
        if len(value) > cap:
            setattr(cut, name, f"{value[:cap]}... [cut here: {len(value)} characters in all, the whole in "
                               f"`heartbeat brief {baton.id}`]")
            changed = True
    return cut if changed else None


def _read_event(stdin: IO[bytes]) -> dict[str, Any]:
    raw = stdin.read(defaults.MAX_HOOK_INPUT_BYTES + 1)
    if len(raw) > defaults.MAX_HOOK_INPUT_BYTES:
        raise BadInput(f"the hook event is larger than {defaults.MAX_HOOK_INPUT_BYTES} bytes")
    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadInput("the hook event on stdin is not JSON") from None
    if not isinstance(event, dict):
        raise BadInput("the hook event on stdin is not a JSON object")
    return event


def run_hook(
    agent: str,
    *,
    task: str | None = None,
    state_dir: str | None = None,
    config: str | None = None,
    stdin: IO[bytes] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """``heartbeat hook AGENT``: read the event, act, print; any failure is one stderr line and exit 0."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    env = os.environ if env is None else env
    try:
        if agent not in HOOK_AGENTS:
            raise BadInput(f"no hooks for {agent!r} (known: {', '.join(HOOK_AGENTS)})")
        event = _read_event(stdin or sys.stdin.buffer)
        name = _str(event, "hook_event_name")
        if name != "PreToolUse" and _trail_hook(event, env, state_dir, task):
            return 0
        store, hooks, max_attempts, where, loaded = _open(state_dir, config, env)
        if store is None:
            if name not in _TOOL_EVENTS:  # (a tool call is not the moment to say it: every call would)
                print(f"heartbeat hook: {_unserved(state_dir, config, env)}", file=stderr)
            if name == "PreToolUse":
                _trail_hook(event, env, state_dir, task)  # nothing to decide on: the call goes on
            return 0
        result = handle_event(event, store, task=task, hooks=hooks, env=env, state_dir_arg=state_dir or "",
                              config_arg=config or "", max_attempts=max_attempts, trail_dir=where,
                              irreversible=None if loaded is None else loaded.irreversible)
        if name == "PreToolUse" and not result.refused:
            _trail_hook(event, env, state_dir, task)  # the rail let it through: the call starts
        if result.stdout:
            stdout.write(result.stdout)
            stdout.flush()
        _after_the_answer(result.after)
        return result.code
    except NotFound as exc:  # no such task: nothing the rail holds, nothing to say at every tool call
        seen = event if "event" in locals() else {}
        if _str(seen, "hook_event_name") not in _TOOL_EVENTS:
            print(f"heartbeat hook: {exc}", file=stderr)
        elif _str(seen, "hook_event_name") == "PreToolUse":
            try:  # the call goes on: its trail says it started
                _trail_hook(seen, env, state_dir, task)
            except (HeartbeatError, OSError) as failed:  # (a FIFO planted as the trail: one line)
                print(f"heartbeat hook: {failed}", file=stderr)
    except HeartbeatError as exc:
        print(f"heartbeat hook: {exc}", file=stderr)
        _refuse_unchecked(event if "event" in locals() else {}, env, stdout, str(exc))
    except Exception as exc:  # a hook must never break the agent it serves
        text = " ".join(str(exc).split())[:300]
        print(f"heartbeat hook: internal error: {type(exc).__name__}: {text}", file=stderr)
        _refuse_unchecked(event if "event" in locals() else {}, env, stdout, f"{type(exc).__name__}: {text}")
    return 0


def _refuse_unchecked(event: Mapping[str, Any], env: Mapping[str, str], stdout: IO[str], why: str) -> None:
    """A bound agent's ``PreToolUse`` the rail could not decide (its store failing, a broken event) is
    refused, not let through: the rail fails closed for the sessions it holds (a person's unbound
    session is never held up)."""
    if _str(event, "hook_event_name") != "PreToolUse" or not env.get("HEARTBEAT_TASK"):
        return
    from heartbeat.tasks.rail import deny_output

    reason = f"heartbeat refused this call: the rail could not check it ({' '.join(why.split())[:200]}). Try again."
    with contextlib.suppress(OSError, ValueError):
        stdout.write(json.dumps(deny_output(reason), ensure_ascii=False) + "\n")
        stdout.flush()


def _after_the_answer(callbacks: Sequence[Callable[[], None]]) -> None:
    """Run what records a refusal once the answer is printed, bounded: a locked ledger costs the agent at
    most ``HOOK_RECORD_WAIT`` seconds, past which the record is given up (the refusal stands)."""
    if not callbacks:
        return
    import threading

    def run() -> None:
        for callback in callbacks:
            with contextlib.suppress(Exception):
                callback()

    worker = threading.Thread(target=run, name="heartbeat-hook-record", daemon=True)
    worker.start()
    worker.join(defaults.HOOK_RECORD_WAIT)


def _unserved(state_dir: str | None, config: str | None, env: Mapping[str, str]) -> str:
    """Why the hook has no store to serve: one line, so a session left without its brief says why."""
    from heartbeat.config.load import find_config, load_config

    path = state_dir or (env.get("HEARTBEAT_STATE_DIR") if not config else None)
    found = find_config(config, env=env)
    if not path and found:
        path = load_config(found).state_dir  # (read already by _open: it loads)
    if path:
        return f"no state dir at {os.path.abspath(path)}: nothing to brief (a hook never creates one)"
    return ("no config found (tried --config, $HEARTBEAT_CONFIG, ./heartbeat.toml, /etc/heartbeat/heartbeat.toml) "
            "and no --state-dir: nothing to brief; re-run `heartbeat hooks install` where the config is found")


def _trail_hook(event: Mapping[str, Any], env: Mapping[str, str], state_dir: str | None, task: str | None) -> bool:
    """Keep the trail (:mod:`heartbeat.hotpath.trail`) of an agent the daemon launched: a tool call's start
    and end, a session's start. True when the event is done with (a tool call of such an agent: the
    store is not opened); a person's session, not bound to a task, keeps no trail."""
    from heartbeat.hotpath import trail

    name = _str(event, "hook_event_name")
    if name in trail.HOT_EVENTS:
        trail.hot_hook(event, env)
        return True  # (nothing else acts on a tool call here)
    if name == "SessionStart":
        trail.session_hook(_str(event, "source") or "startup", env)
    return False


def _open(state_dir: str | None, config: str | None,
          env: Mapping[str, str]) -> tuple[Any, Any, int | None, str, Any]:
    """The store, hooks config, max_attempts, the local state dir ("" when none) and the config
    (None without one); no store when there is no state dir (never created here)."""
    from heartbeat.config.load import find_config, load_config
    from heartbeat.config.shape import HooksConfig

    hooks, max_attempts, path, loaded = HooksConfig(), None, None, None
    url = env.get("HEARTBEAT_STORE_URL", "").strip()  # (as heartbeat.config.load.resolve_store orders them)
    if state_dir:
        path = os.path.abspath(state_dir)
    elif not config and env.get("HEARTBEAT_STATE_DIR"):
        path = os.path.abspath(env["HEARTBEAT_STATE_DIR"])
    found = find_config(config, env=env)
    if found is not None:
        try:
            loaded = load_config(found)
            hooks, max_attempts = loaded.hooks, loaded.daemon.max_attempts
            if path is None:
                path, url = loaded.state_dir, url or loaded.store.url
        except HeartbeatError:
            if path is None:
                raise
    from heartbeat.store import open_store

    if url:  # a database store needs no state dir
        # (refused_wait 0: a hook answers at once, never holding its agent's turn; it never fails the agent)
        return open_store(path or "", url, refused_wait=0.0), hooks, max_attempts, path or "", loaded
    if path is None or not os.path.isdir(path):
        return None, hooks, max_attempts, "", loaded
    return open_store(path), hooks, max_attempts, path, loaded


def hook_main(argv: Sequence[str], *, stdin: IO[bytes] | None = None) -> int:
    """``heartbeat hook claude|codex [--task ID] [--state-dir DIR] [--config FILE]``, parsed without
    argparse (the CLI runs the hook at every turn's end: :func:`heartbeat.hotpath.argv.hook_args`)."""
    from heartbeat.hotpath.argv import hook_args

    agent, opts, problem = hook_args(list(argv))
    if problem:
        print(f"heartbeat hook: {problem}", file=sys.stderr)
        return 0
    return run_hook(agent or "claude", task=opts.get("--task"), state_dir=opts.get("--state-dir"),
                    config=opts.get("--config"), stdin=stdin)
