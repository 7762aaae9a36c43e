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
A file holding a value JSON cannot (``1e400``, ``NaN``) is refused untouched.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from heartbeat import defaults
from heartbeat.errors import BadInput, HeartbeatError
from heartbeat.ledger import EventKind

if TYPE_CHECKING:
    from heartbeat.baton import Baton
    from heartbeat.config import HooksConfig
    from heartbeat.installs import InstallRecord
    from heartbeat.ledger import Event
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
    "install_claude",
    "uninstall_claude",
    "allow_rules",
    "install_codex",
    "uninstall_codex",
    "HOOK_AGENTS",
]

HOOK_EVENTS = ("SessionStart", "PreCompact", "Stop", "SessionEnd")
"""The hook events heartbeat installs and acts on (Claude Code 2.1.332 and codex 0.171.0 both fire them)."""

HOOK_AGENTS = ("claude", "codex")
"""The agent CLIs ``heartbeat hook`` serves."""

SEAM_KINDS = (EventKind.SESSION_STARTED, EventKind.COMPACTING, EventKind.STOP_BLOCKED, EventKind.STOP_ALLOWED,
              EventKind.SESSION_ENDED)
"""The ledger event kinds the hook records."""

_MARK_KINDS = (EventKind.SESSION_STARTED, EventKind.STOP_BLOCKED, EventKind.STOP_ALLOWED, EventKind.SESSION_ENDED)
_NOTE_KINDS = (EventKind.UPDATED, EventKind.DONE, EventKind.FAILED, EventKind.BLOCKED, EventKind.SNOOZED,
               EventKind.CREATED)
_ACTOR = "hook"
_AGENTS_BEGIN = "<!-- heartbeat:begin (written by `heartbeat hooks install codex`; remove with uninstall) -->"
_AGENTS_END = "<!-- heartbeat:end -->"
_MAX_SETTINGS_BYTES = 4 * 1024 * 1024
_MARK = "# heartbeat-hook"
"""Ends every hook command heartbeat writes: what install and uninstall recognise as theirs."""
_HOOK_OPTIONS = ("--state-dir", "--config", "--task")


# -- the hook ----------------------------------------------------------------------------


@dataclass
class HookResult:
    """What the hook prints on stdout (may be empty) and its exit code (always 0)."""

    stdout: str = ""
    code: int = 0


def _str(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    return value if isinstance(value, str) else ""


def _find_task(store: Store, task: str | None, cwd: str, env: Mapping[str, str]) -> Baton | None:
    """The task this session works on, or None when it cannot be told.

    ``$HEARTBEAT_TASK``, else ``--task``, else by the event's ``cwd``: of the tasks whose
    workdir is the cwd or one of its parents, the open ones (all, when none is open), the
    deepest workdir; two at that depth are ambiguous.
    """
    from heartbeat.baton import FINISHED_STATUSES

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
) -> HookResult:
    """Act on one hook event for the task it belongs to; record the seam."""
    from heartbeat.baton import Status
    from heartbeat.config import HooksConfig
    from heartbeat.ledger import Event
    from heartbeat.timeparse import utcnow

    env = os.environ if env is None else env
    hooks = hooks or HooksConfig()
    now = now or utcnow()
    name = _str(event, "hook_event_name")
    if name not in HOOK_EVENTS:
        return HookResult()
    baton = _find_task(store, task, _str(event, "cwd"), env)
    if baton is None:
        return HookResult()
    session_id = _str(event, "session_id")
    epoch = _epoch(baton, env)

    def record(kind: EventKind, **data: Any) -> None:
        store.record([Event(task=baton.id, kind=kind, ts=now, epoch=epoch, revision=baton.meta.revision,
                            actor=_ACTOR, data={"session_id": session_id, **data})])

    if name == "SessionStart":
        source = _str(event, "source") or "startup"
        record(EventKind.SESSION_STARTED, source=source)
        context = session_context(baton, source, env, max_attempts=max_attempts, epoch=epoch, now=now,
                                  prefix=command_prefix(state_dir_arg, config_arg))
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


def context_length(text: str) -> int:
    """``text``'s length as Claude Code measures it (JavaScript's: UTF-16 code units)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def session_context(baton: Baton, source: str, env: Mapping[str, str], *, max_attempts: int | None = None,
                    epoch: int | None = None, now: datetime | None = None,
                    budget: int = defaults.HOOK_BRIEF_BUDGET,
                    limit: int = defaults.CLAUDE_HOOK_CONTEXT_LIMIT, prefix: str = "heartbeat") -> str:
    """The SessionStart hook's ``additionalContext``: always within ``limit`` code units, so the CLI
    never swaps it for a preview. Essentials first (intent, every constraint, the current and next
    step, the block, the note-keeping commands with the task id spelled out), then as much of the
    rest of the brief as ``budget`` holds, the rest named and left to ``heartbeat brief ID`` (and the
    dispatch's brief file). Every `` `heartbeat ...` `` command is run as ``prefix`` (with the
    ``--state-dir``/``--config`` the hook was installed with), which the limit counts too. Should
    the essentials alone not fit (hundreds of constraints), the context says so and points at the
    whole brief instead of letting the CLI cut it."""
    from heartbeat.brief import render_brief

    brief_file = env.get("HEARTBEAT_BRIEF", "") if env.get("HEARTBEAT_TASK") == baton.id else ""
    where = f"`heartbeat brief {baton.id}`" + (f" or `{brief_file}`" if brief_file else "")
    head = (f"heartbeat: this session works on task {baton.id!r} (session {source}). Its baton is the "
            "state note that survives compaction and restarts: read the brief below first, and keep the "
            f"note current with `heartbeat set {baton.id}`/`heartbeat add {baton.id}` as you go "
            f"(the whole brief: {where}).\n\n")
    brief = render_brief(baton, budget=budget, max_attempts=max_attempts, epoch=epoch, now=now,
                         essentials_first=True, brief_file=brief_file)
    for smaller in (budget, budget * 3 // 4, budget // 2, budget // 4):  # long prefixes take room too
        if smaller != budget:
            brief = render_brief(baton, budget=smaller, max_attempts=max_attempts, epoch=epoch, now=now,
                                 essentials_first=True, brief_file=brief_file)
        text = _with_prefix(head + brief.text, prefix)
        if context_length(text) <= limit:
            return text
    for cap in _FIELD_CAPS:  # one long field (a 9,500-character intent): cut it, keep the rest whole
        cut = _cut_fields(baton, cap)
        if cut is None:
            continue
        brief = render_brief(cut, budget=budget // 4, max_attempts=max_attempts, epoch=epoch, now=now,
                             essentials_first=True, brief_file=brief_file)
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
        store, hooks, max_attempts = _open(state_dir, config, env)
        if store is None:
            print(f"heartbeat hook: {_unserved(state_dir, config, env)}", file=stderr)
            return 0
        result = handle_event(event, store, task=task, hooks=hooks, env=env, state_dir_arg=state_dir or "",
                              config_arg=config or "", max_attempts=max_attempts)
        if result.stdout:
            stdout.write(result.stdout)
            stdout.flush()
        return result.code
    except HeartbeatError as exc:
        print(f"heartbeat hook: {exc}", file=stderr)
    except Exception as exc:  # a hook must never break the agent it serves
        text = " ".join(str(exc).split())[:300]
        print(f"heartbeat hook: internal error: {type(exc).__name__}: {text}", file=stderr)
    return 0


def _unserved(state_dir: str | None, config: str | None, env: Mapping[str, str]) -> str:
    """Why the hook has no store to serve: one line, so a session left without its brief says why."""
    from heartbeat.config import find_config, load_config

    path = state_dir or (env.get("HEARTBEAT_STATE_DIR") if not config else None)
    found = find_config(config, env=env)
    if not path and found:
        path = load_config(found).state_dir  # (read already by _open: it loads)
    if path:
        return f"no state dir at {os.path.abspath(path)}: nothing to brief (a hook never creates one)"
    return ("no config found (tried --config, $HEARTBEAT_CONFIG, ./heartbeat.toml, /etc/heartbeat/heartbeat.toml) "
            "and no --state-dir: nothing to brief; re-run `heartbeat hooks install` where the config is found")


def _open(state_dir: str | None, config: str | None, env: Mapping[str, str]) -> tuple[Any, Any, int | None]:
    """The store, hooks config and max_attempts; no store when there is no state dir (never created here)."""
    from heartbeat.config import HooksConfig, find_config, load_config

    hooks, max_attempts, path = HooksConfig(), None, None
    url = env.get("HEARTBEAT_STORE_URL", "").strip()  # (as heartbeat.config.resolve_store orders them)
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
        return open_store(path or "", url, refused_wait=0.0), hooks, max_attempts
    if path is None or not os.path.isdir(path):
        return None, hooks, max_attempts
    return open_store(path), hooks, max_attempts


def hook_main(argv: Sequence[str]) -> int:
    """``heartbeat hook claude|codex [--task ID] [--state-dir DIR] [--config FILE]``, parsed without
    argparse (the CLI runs the hook at every turn's end)."""
    opts: dict[str, str] = {}
    agent = ""
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, sep, value = arg.partition("=")
        if key in ("--task", "--state-dir", "--config"):
            if not sep:
                if not args:
                    print(f"heartbeat hook: {key} needs a value", file=sys.stderr)
                    return 0
                value = args.pop(0)
            opts[key] = value
        elif not agent and not arg.startswith("-"):
            agent = arg
        else:
            print(f"heartbeat hook: unexpected argument {arg[:80]!r}", file=sys.stderr)
            return 0
    return run_hook(agent or "claude", task=opts.get("--task"), state_dir=opts.get("--state-dir"),
                    config=opts.get("--config"))


# -- install / uninstall -----------------------------------------------------------------


def heartbeat_argv() -> list[str]:
    """How this heartbeat is run from a hook: its ``heartbeat`` script when that is on PATH and is
    this install's, else this interpreter with ``-m heartbeat``."""
    import shutil

    script = shutil.which("heartbeat")
    mine = os.path.join(os.path.dirname(sys.executable), "heartbeat")
    if script and os.path.realpath(script) == os.path.realpath(mine):
        return [os.path.abspath(script)]
    if os.path.isfile(mine) and os.access(mine, os.X_OK):
        return [mine]
    return [sys.executable, "-m", "heartbeat"]


def hook_command(*, agent: str = "claude", state_dir: str | None = None, config: str | None = None,
                 task: str | None = None) -> str:
    """The shell command line written into the CLI's settings for ``heartbeat hook AGENT``, marked
    as heartbeat's by its trailing ``# heartbeat-hook`` comment."""
    import shlex

    argv = [*heartbeat_argv(), "hook", agent]
    if state_dir:
        argv += ["--state-dir", os.path.abspath(state_dir)]
    if config:
        argv += ["--config", os.path.abspath(config)]
    if task:
        argv += ["--task", task]
    return f"{shlex.join(argv)} {_MARK}"


@dataclass(frozen=True)
class _Ours:
    """One of heartbeat's hook commands, read back: which state dir and config it serves."""

    state_dir: str
    config: str


def _read_ours(entry: Any, agent: str) -> _Ours | None:
    """``entry`` as one of heartbeat's hooks for ``agent``, or None when it is anyone else's.

    Heartbeat's own: a command hook whose command is ``HEARTBEAT hook AGENT [--state-dir D]
    [--config F] [--task T]``, HEARTBEAT being a ``heartbeat`` executable or ``PYTHON -m
    heartbeat``, and ending in the marker (or, as written before the marker existed, without
    it). Anything else that merely mentions heartbeat is not.
    """
    import shlex

    if not isinstance(entry, dict) or entry.get("type") != "command":
        return None
    command = entry.get("command")
    if not isinstance(command, str) or len(command) > 8192:
        return None
    body = command[: -len(_MARK)].rstrip() if command.endswith(" " + _MARK) else command
    try:
        argv = shlex.split(body)
    except ValueError:
        return None
    for at in range(len(argv) - 1):
        if argv[at:at + 2] == ["hook", agent]:
            break
    else:
        return None
    program, rest = argv[:at], argv[at + 2:]
    runs_heartbeat = (len(program) == 1 and os.path.basename(program[0]) == "heartbeat") or (
        len(program) == 3 and program[1:] == ["-m", "heartbeat"])
    if not runs_heartbeat or len(rest) % 2:
        return None
    options = dict(zip(rest[::2], rest[1::2], strict=True))
    if len(options) * 2 != len(rest) or not set(options) <= set(_HOOK_OPTIONS):
        return None
    return _Ours(state_dir=options.get("--state-dir", ""), config=options.get("--config", ""))


def settings_path(directory: str | None, *, user: bool) -> str:
    if user:
        return os.path.join(os.path.expanduser("~"), ".claude", "settings.json")
    return os.path.join(os.path.abspath(directory or "."), ".claude", "settings.json")


def codex_hooks_path(directory: str | None, *, user: bool, env: Mapping[str, str] | None = None) -> str:
    """``.codex/hooks.json`` in the project, or (``user``) in ``$CODEX_HOME`` (default ``~/.codex``)."""
    env = os.environ if env is None else env
    if user:
        return os.path.join(env.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex"), "hooks.json")
    return os.path.join(os.path.abspath(directory or "."), ".codex", "hooks.json")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is too large for a JSON number")
    return value


def _read_bytes(path: str, what: str) -> bytes | None:
    """The whole of the regular file at ``path`` (through a symlink), None when there is none;
    anything else there (a directory, a FIFO, a device) or a file past the size limit is refused
    with one line. Opened without blocking: a FIFO would wait for a writer for ever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not {what}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # (before fdopen, which refuses a directory naming only the descriptor)
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise BadInput(f"{path}: {kind}, not {what}; left untouched")
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(_MAX_SETTINGS_BYTES + 1)
        except OSError as exc:
            raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > _MAX_SETTINGS_BYTES:
        raise BadInput(f"{path}: larger than {_MAX_SETTINGS_BYTES} bytes; left untouched")
    return raw


def _load_json(path: str, what: str) -> dict[str, Any]:
    """A JSON object file, or {} when missing; anything else is refused with one line.

    A number no JSON reader can hold (``1e400``, ``NaN``, ``Infinity``) is refused too: Python
    would read it as infinity and write it back as ``Infinity``, which is not JSON.
    """
    raw = _read_bytes(path, what)
    if raw is None or not raw.strip():
        return {}
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8; left untouched") from None
    except RecursionError:
        raise BadInput(f"{path}: nested too deeply; left untouched") from None
    except ValueError as exc:
        raise BadInput(f"{path}: not valid JSON ({' '.join(str(exc).split())}); left untouched") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: expected a JSON object, got {type(doc).__name__}; left untouched")
    return doc


def _write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (through a symlink, to its target: a settings file kept in a dotfiles
    repository stays one) by rename, keeping its mode (0644 for a new file) and owner."""
    from heartbeat.installs import write_keeping_owner

    write_keeping_owner(path, text.encode("utf-8"))


def _load_record(settings_file: str) -> InstallRecord:
    from heartbeat.installs import InstallRecord, record_path

    path = record_path(settings_file)
    return InstallRecord.from_doc(path, _load_json(path, "heartbeat's install record"))


def _save_record(record: InstallRecord) -> None:
    """Write the record, or remove it once it records nothing."""
    if record.files:
        _write_atomic(record.path, _dump(record.to_doc()))
    elif os.path.lexists(record.path):
        os.unlink(record.path)


def _put_back(path: str, doc: dict[str, Any], record: InstallRecord, written: list[str]) -> None:
    """Uninstall's write of ``doc`` to ``path``: a file install created, left as ``{}``, goes."""
    if not doc and record.created(path):
        os.unlink(path)
        record.forget(path)
    else:
        _write_atomic(path, _dump(doc))
    written.append(path)


def _hooks_table(doc: dict[str, Any], path: str) -> dict[str, Any]:
    hooks = doc.get("hooks", {})
    if not isinstance(hooks, dict):
        raise BadInput(f"{path}: hooks: expected a JSON object, got {type(hooks).__name__}; left untouched")
    for name in HOOK_EVENTS:
        groups = hooks.get(name, [])
        if not isinstance(groups, list):
            raise BadInput(f"{path}: hooks.{name}: expected a list, got {type(groups).__name__}; left untouched")
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("hooks", []), list):
                raise BadInput(f"{path}: hooks.{name}: each entry must be an object with a list of hooks; "
                               "left untouched")
    return hooks


def _without_ours(groups: list[Any], agent: str, serving: _Ours | None) -> list[Any]:
    """``groups`` with heartbeat's hook entries taken out (only those serving ``serving``'s state dir
    and config, when given), and groups left empty by that removed."""
    kept = []
    for group in groups:
        inner = group.get("hooks", [])
        remaining = []
        for hook in inner:
            ours = _read_ours(hook, agent)
            if ours is None or (serving is not None and ours != serving):
                remaining.append(hook)
        if len(remaining) == len(inner):
            kept.append(group)
        elif remaining:
            kept.append({**group, "hooks": remaining})
    return kept


def allow_rules(*, state_dir: str | None = None, config: str | None = None, task: str | None = None) -> list[str]:
    """The permission rules ``install`` adds: heartbeat's agent commands (on ``task``, else on any task),
    as the brief writes them and with the global options the install was given, and the MCP server."""
    import shlex

    from heartbeat.presets import claude_allow_rules

    prefixes = ["heartbeat"]
    options = [*(["--state-dir", os.path.abspath(state_dir)] if state_dir else []),
               *(["--config", os.path.abspath(config)] if config else [])]
    if options:
        prefixes.append(shlex.join(["heartbeat", *options]))
    rules: list[str] = []
    for prefix in prefixes:
        rules += [r for r in claude_allow_rules(task or "", prefix=prefix) if r not in rules]
    return rules


def _rule_serves(rule: str, serving: _Ours) -> bool:
    """Whether a permission rule is the one install wrote for that state dir and config."""
    import shlex

    options = [*(["--state-dir", serving.state_dir] if serving.state_dir else []),
               *(["--config", serving.config] if serving.config else [])]
    return bool(options) and rule.startswith(f"Bash({shlex.join(['heartbeat', *options])} ")


def _permissions(doc: dict[str, Any], path: str) -> tuple[dict[str, Any], list[Any]]:
    perms = doc.get("permissions", {})
    if not isinstance(perms, dict):
        raise BadInput(f"{path}: permissions: expected a JSON object, got {type(perms).__name__}; left untouched")
    allow = perms.get("allow", [])
    if not isinstance(allow, list):
        raise BadInput(f"{path}: permissions.allow: expected a list, got {type(allow).__name__}; left untouched")
    return perms, allow


def local_settings_path(directory: str | None) -> str:
    """``.claude/settings.local.json``: where the permission rules go (claude 2.1.332 takes no allow rule
    from a project's ``.claude/settings.json`` in a headless run; it does from this file and the user's)."""
    return os.path.join(os.path.abspath(directory or "."), ".claude", "settings.local.json")


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _serving(state_dir: str | None, config: str | None) -> _Ours:
    return _Ours(state_dir=os.path.abspath(state_dir) if state_dir else "",
                 config=os.path.abspath(config) if config else "")


def _hook_timeout(agent: str, event: str) -> int:
    """The ``timeout`` written for ``agent``'s hook at ``event``: the most the CLI accepts there."""
    return defaults.CODEX_SESSION_END_TIMEOUT if (agent, event) == ("codex", "SessionEnd") else defaults.HOOK_TIMEOUT


def _merge_hooks(doc: dict[str, Any], path: str, agent: str, *, state_dir: str | None, config: str | None,
                 task: str | None) -> tuple[dict[str, Any], bool]:
    """``doc`` (the settings file at ``path``) with heartbeat's hooks for ``agent`` (re)placed, and
    whether that changed it."""
    hooks = _hooks_table(doc, path)
    command = hook_command(agent=agent, state_dir=state_dir, config=config, task=task)
    serving = _serving(state_dir, config)
    new_hooks = dict(hooks)
    for name in HOOK_EVENTS:
        entry = {"type": "command", "command": command, "timeout": _hook_timeout(agent, name)}
        groups = list(hooks.get(name, []))
        serving_this = [h for g in groups for h in g.get("hooks", []) if _read_ours(h, agent) == serving]
        if serving_this == [entry]:
            continue  # already there as it would be written: keep its place
        new_hooks[name] = [*_without_ours(groups, agent, serving), {"hooks": [entry]}]
    return {**doc, "hooks": new_hooks}, new_hooks != hooks or "hooks" not in doc


def _unmerge_hooks(doc: dict[str, Any], path: str, agent: str, serving: _Ours | None) -> dict[str, Any]:
    """``doc`` without heartbeat's hooks for ``agent`` (those serving ``serving``, when given)."""
    if "hooks" not in doc:
        return doc
    hooks = _hooks_table(doc, path)
    new_hooks = dict(hooks)
    for name in HOOK_EVENTS:
        if name in hooks:
            groups = _without_ours(hooks[name], agent, serving)
            if groups:
                new_hooks[name] = groups
            elif hooks[name]:  # we emptied it: the key was ours
                del new_hooks[name]
    if new_hooks == hooks:
        return doc
    new_doc = dict(doc)
    if new_hooks or not hooks:
        new_doc["hooks"] = new_hooks
    else:
        del new_doc["hooks"]
    return new_doc


def install_claude(
    directory: str | None = None,
    *,
    user: bool = False,
    mcp: bool = False,
    state_dir: str | None = None,
    config: str | None = None,
    task: str | None = None,
) -> list[str]:
    """Merge heartbeat's hooks into the settings file (idempotent); returns the files written."""
    path = settings_path(directory, user=user)
    if mcp and user:
        raise BadInput("--mcp registers the server per project (.mcp.json in --dir), not with --user")
    doc, changed = _merge_hooks(_load_json(path, "a settings file"), path, "claude", state_dir=state_dir,
                                config=config, task=task)
    rules_file = path if user else local_settings_path(directory)
    rules_doc = doc if user else _load_json(rules_file, "a settings file")
    perms, allow = _permissions(rules_doc, rules_file)
    new_allow = allow + [r for r in allow_rules(state_dir=state_dir, config=config, task=task) if r not in allow]
    mcp_file = mcp_path(directory) if mcp else None
    mcp_doc = _mcp_doc_with_server(mcp_file, state_dir=state_dir, config=config) if mcp_file else None
    record = _load_record(path)  # (read before anything is written: refused, nothing is)
    added = [r for r in new_allow if r not in allow]
    written = []
    if new_allow != allow and not user:
        record.note(rules_file, existed=os.path.lexists(rules_file), rules=added)
        _write_atomic(rules_file, _dump({**rules_doc, "permissions": {**perms, "allow": new_allow}}))
        written.append(rules_file)
    if changed or (user and new_allow != allow):
        rules = {"permissions": {**perms, "allow": new_allow}} if user else {}
        record.note(path, existed=os.path.lexists(path), rules=added if user else ())
        _write_atomic(path, _dump({**doc, **rules}))
        written.append(path)
    if mcp_file is not None and mcp_doc is not None and mcp_doc != _load_json(mcp_file, "an MCP config"):
        record.note(mcp_file, existed=os.path.lexists(mcp_file))
        _write_atomic(mcp_file, _dump(mcp_doc))
        written.append(mcp_file)
    if written:
        _save_record(record)
    return written


def uninstall_claude(directory: str | None = None, *, user: bool = False, state_dir: str | None = None,
                     config: str | None = None) -> list[str]:
    """Remove exactly the hooks (and the ``.mcp.json`` server) install added; returns the files written.

    With ``state_dir`` or ``config``, only the hooks serving that state dir and config go.
    """
    path = settings_path(directory, user=user)
    written: list[str] = []
    serving = _serving(state_dir, config) if state_dir or config else None
    original = _load_json(path, "a settings file")
    record = _load_record(path)
    doc = _unmerge_hooks(original, path, "claude", serving)
    # The rules install added go, but those another install still serving this file needs stay.
    others = any(_read_ours(h, "claude") is not None for name in HOOK_EVENTS
                 for g in (doc.get("hooks") or {}).get(name, []) for h in g.get("hooks", []))

    def without_rules(d: dict[str, Any], file: str) -> dict[str, Any]:
        perms, allow = _permissions(d, file)
        ours = record.rules(file)  # only what install recorded adding: a person's own rule stays
        kept = [r for r in allow if not (isinstance(r, str) and r in ours and (
            not others or (serving is not None and _rule_serves(r, serving))))]
        record.forget_rules(file, [r for r in allow if r not in kept])
        if kept == allow:
            return d
        # a permissions table or allow list we emptied goes too
        new_perms = {**perms, "allow": kept} if kept else {k: v for k, v in perms.items() if k != "allow"}
        return {**d, "permissions": new_perms} if new_perms else {k: v for k, v in d.items() if k != "permissions"}

    if not user:
        rules_file = local_settings_path(directory)
        local = _load_json(rules_file, "a settings file")
        new_local = without_rules(local, rules_file)
        if new_local != local:
            _put_back(rules_file, new_local, record, written)
    doc = without_rules(doc, path)  # (--user: install wrote them here)
    if doc != original:
        _put_back(path, doc, record, written)
    if not user:
        mcp_file = mcp_path(directory)
        mcp_doc = _load_json(mcp_file, "an MCP config")
        servers = mcp_doc.get("mcpServers")
        if isinstance(servers, dict) and _is_our_server(servers.get("heartbeat")):
            servers = {k: v for k, v in servers.items() if k != "heartbeat"}
            new_doc = {**mcp_doc, "mcpServers": servers} if servers else {
                k: v for k, v in mcp_doc.items() if k != "mcpServers"}
            _put_back(mcp_file, new_doc, record, written)
    if not others:  # no heartbeat hook is left in these files: a file without recorded rules is done with
        for file in [*record.files]:
            if not record.rules(file):
                record.forget(file)
    if written or not record.files:
        _save_record(record)
    return written


def mcp_path(directory: str | None) -> str:
    return os.path.join(os.path.abspath(directory or "."), ".mcp.json")


def _is_our_server(server: Any) -> bool:
    if not isinstance(server, dict):
        return False
    args = server.get("args")
    command = server.get("command")
    return isinstance(command, str) and isinstance(args, list) and bool(args) and args[-1] == "mcp" and (
        "heartbeat" in command or "heartbeat" in args)


def _mcp_doc_with_server(path: str, *, state_dir: str | None, config: str | None) -> dict[str, Any]:
    doc = _load_json(path, "an MCP config")
    servers = doc.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise BadInput(f"{path}: mcpServers: expected a JSON object; left untouched")
    if "heartbeat" in servers and not _is_our_server(servers["heartbeat"]):
        raise BadInput(f"{path}: mcpServers.heartbeat is another server; left untouched")
    argv = heartbeat_argv()
    if state_dir:
        argv += ["--state-dir", os.path.abspath(state_dir)]
    if config:
        argv += ["--config", os.path.abspath(config)]
    server = {"type": "stdio", "command": argv[0], "args": [*argv[1:], "mcp"]}
    return {**doc, "mcpServers": {**servers, "heartbeat": server}}


def agents_section(task: str | None = None, hb: str = "heartbeat") -> str:
    """The marked AGENTS.md section for Codex (and any agent that reads AGENTS.md); ``hb`` is how
    heartbeat is run (with the ``--state-dir``/``--config`` install was given)."""
    task_ref = task or "$HEARTBEAT_TASK"
    return "\n".join([
        _AGENTS_BEGIN,
        "## heartbeat: keep the baton",
        "",
        "This work is kept alive by heartbeat across context loss, crashes and handoffs. Its state",
        f"lives in the task's baton (task `{task_ref}`; `{hb} status` lists the tasks), not in your memory.",
        "",
        f"- **First**, before anything else: `{hb} brief {task_ref}` and read all of it.",
        f"- Before anything irreversible: `{hb} verify {task_ref}` (0 fresh, 3 stale: re-read, "
        "5 superseded: stop).",
        f"- After each step: `{hb} set {task_ref} step=\"...\" next_step=\"...\"` and "
        f"`{hb} add {task_ref} done \"...\"`; while working, `{hb} touch {task_ref}`.",
        f"- Blocked on a person: `{hb} block {task_ref} --on \"...\"`; finished: `{hb} done {task_ref}`.",
        _AGENTS_END,
        "",
    ])


def _read_text(path: str) -> str:
    """All of ``path`` (``""`` when missing): a file cut at the size limit would be written back cut."""
    raw = _read_bytes(path, "an AGENTS.md")
    try:
        return "" if raw is None else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8; left untouched") from None


def _strip_section(text: str, path: str) -> str:
    start = text.find(_AGENTS_BEGIN)
    if start < 0:
        return text
    end = text.find(_AGENTS_END, start)
    if end < 0:
        raise BadInput(f"{path}: heartbeat's section has no end marker; left untouched")
    end += len(_AGENTS_END)
    if text[end:end + 1] == "\n":
        end += 1
    before = text[:start]
    if before.endswith("\n\n"):
        before = before[:-1]  # the blank line install put before the section
    return before + text[end:]


def install_codex(directory: str | None = None, *, user: bool = False, state_dir: str | None = None,
                  config: str | None = None, task: str | None = None,
                  env: Mapping[str, str] | None = None) -> list[str]:
    """Merge heartbeat's hooks into codex's ``hooks.json`` and add (or refresh) the marked section at
    the end of the project's ``AGENTS.md`` (read even where the hooks are not trusted yet; with
    ``user`` only when ``directory`` names the project); returns the files written."""
    path = codex_hooks_path(directory, user=user, env=env)
    doc, changed = _merge_hooks(_load_json(path, "a hooks file"), path, "codex", state_dir=state_dir,
                                config=config, task=task)
    project = not (user and directory is None)
    agents = os.path.join(os.path.abspath(directory or "."), "AGENTS.md")
    text = _read_text(agents) if project else ""  # (read before anything is written: refused, nothing is)
    record = _load_record(path)
    written = []
    if changed:
        record.note(path, existed=os.path.lexists(path))
        _write_atomic(path, _dump(doc))
        written.append(path)
        _save_record(record)
    if not project:
        return written
    base = _strip_section(text, agents)
    if base and not base.endswith("\n"):
        base += "\n"
    new = base + ("\n" if base else "") + agents_section(task, command_prefix(state_dir or "", config or ""))
    if new != text:
        _write_atomic(agents, new)
        written.append(agents)
    return written


def uninstall_codex(directory: str | None = None, *, user: bool = False, state_dir: str | None = None,
                    config: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """Remove heartbeat's hooks from codex's ``hooks.json`` and its section from ``AGENTS.md`` (that
    file too, when nothing else is left in it)."""
    path = codex_hooks_path(directory, user=user, env=env)
    serving = _serving(state_dir, config) if state_dir or config else None
    written: list[str] = []
    original = _load_json(path, "a hooks file")
    new_doc = _unmerge_hooks(original, path, "codex", serving)
    project = not (user and directory is None)
    agents = os.path.join(os.path.abspath(directory or "."), "AGENTS.md")
    text = _read_text(agents) if project else ""  # (read before anything is written: refused, nothing is)
    new = _strip_section(text, agents)
    record = _load_record(path)
    if new_doc != original:
        _put_back(path, new_doc, record, written)
        if not any(_read_ours(h, "codex") is not None for name in HOOK_EVENTS
                   for g in (new_doc.get("hooks") or {}).get(name, []) for h in g.get("hooks", [])):
            record.forget(path)
        _save_record(record)
    if not project:
        return written
    if new != text:
        if new.strip():
            _write_atomic(agents, new)
        else:
            os.unlink(agents)
        written.append(agents)
    return written
