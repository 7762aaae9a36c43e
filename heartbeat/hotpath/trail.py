"""The trail: what an agent did since its last note, kept by the hooks at the tool-call seam.

A note (``heartbeat set``/``add``) says what the agent finished; what it did after its last
note and before it was killed (a file written, an API called, a message sent) is the sliver
no note holds. The hooks keep it: ``PreToolUse`` appends a ``start`` line naming the call
(tool, and its target or command: never file contents), ``PostToolUse`` an ``end`` line
with ok or error. A kill between the two leaves "started, outcome unknown", which is what a
successor must be told before it repeats a payment.

One file per task and epoch, ``logs/<id>/<epoch>.trail`` in the local state dir, beside the
agent's log and pulse, on either store: the hooks of a launched agent write it without
opening the store (one append, about one interpreter start). On a PostgreSQL store the
daemon that saw the run end folds its unnoted part into the ledger (``unnoted``), which every
host reads; the file itself stays on the host the agent ran on.

The file is bounded (:data:`heartbeat.model.defaults.TRAIL_MAX_BYTES`: past it the oldest half is
cut and a ``cut`` line counts what was dropped), lines are bounded and one JSON object each,
and a reader takes whatever parses: a symlink, a FIFO or a device planted in its place is
never opened, a huge file is read only at its tail, a truncated or foreign line is skipped.

This module imports only the standard library's light modules, :mod:`heartbeat.model.defaults` and
:mod:`heartbeat.system.safefile` at load: the hooks run it at every tool call.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from heartbeat.model import defaults

__all__ = ["TRAIL_SUFFIX", "HOT_EVENTS", "Call", "Unnoted", "trail_path", "describe", "append", "record_start",
           "record_end", "record_session", "session_hook", "hot_hook", "end_hook", "read_calls", "unnoted",
           "since", "activity", "summary_lines"]

TRAIL_SUFFIX = ".trail"
"""The file name of an epoch's trail inside ``logs/<id>/`` is ``<epoch>.trail``."""

HOT_EVENTS = ("PreToolUse", "PostToolUse", "PostToolUseFailure")
"""The hook events the trail records (the tool-call seam)."""

_LAST_TIME = 32503680000.0
"""Year 3000 in epoch seconds: a trail time past it (or not above 0) is not read."""

_SECRET = re.compile(r"(?i)((?:authorization:\s*)?(?:bearer|basic)\s+"
                     r"|(?:token|password|passwd|secret|api[_-]?key)[\w-]*[=:]\s*)"
                     r"(\"[^\"]*\"|'[^']*'|[^\s&'\"]+)")
"""What looks like a credential in a command: kept out of the trail (and so of the ledger and the report)."""

_WHAT_KEYS = ("file_path", "notebook_path", "path", "url", "pattern", "query", "prompt", "description")


@dataclass(frozen=True)
class Call:
    """One tool call of the trail: started at ``started`` (epoch seconds), ended (ok or not) or not."""

    key: str
    tool: str
    what: str
    started: float
    ended: float | None = None
    ok: bool | None = None

    @property
    def finished(self) -> bool:
        return self.ended is not None

    @property
    def own_note(self) -> bool:
        """A heartbeat command of the agent's (its note): not part of the unnoted work."""
        return self.tool in ("Bash", "shell", "exec_command") and self.what.startswith("heartbeat ")

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "what": self.what, "started": _iso(self.started),
                "outcome": "unknown" if self.ok is None else ("ok" if self.ok else "error")}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def trail_path(state_dir: str, task_id: str, epoch: int) -> str:
    """``<state_dir>/logs/<id>/<epoch>.trail``."""
    return os.path.join(state_dir, "logs", task_id, f"{epoch}{TRAIL_SUFFIX}")


def _one_line(text: str, limit: int = defaults.TRAIL_WHAT_CHARS) -> str:
    flat = _SECRET.sub(r"\1***", " ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def describe(event: Mapping[str, Any]) -> tuple[str, str]:
    """``(tool, what)`` of a tool-call hook event: the command of a shell call, the path (relative
    to the event's ``cwd`` when inside it) or URL of another; never the content it writes."""
    tool = event.get("tool_name")
    tool = _one_line(tool, 80) if isinstance(tool, str) and tool else "?"
    args = event.get("tool_input")
    what = ""
    if isinstance(args, Mapping):
        command = args.get("command")
        if isinstance(command, list) and all(isinstance(c, str) for c in command):
            import shlex

            command = shlex.join(command)
        if isinstance(command, str):
            what = command
        else:
            for key in _WHAT_KEYS:
                value = args.get(key)
                if isinstance(value, str) and value:
                    what = value
                    break
    cwd = event.get("cwd")
    if what.startswith("/") and isinstance(cwd, str) and cwd.startswith("/"):
        base = cwd.rstrip("/") + "/"
        if what.startswith(base):
            what = what[len(base):]
    return tool, _one_line(what)


def _key(event: Mapping[str, Any], tool: str, what: str) -> str:
    call_id = event.get("tool_use_id") or event.get("call_id")
    return _one_line(call_id, 100) if isinstance(call_id, str) and call_id else f"{tool}:{what}"


def _ok(event: Mapping[str, Any]) -> bool:
    if event.get("hook_event_name") == "PostToolUseFailure" or event.get("error"):
        return False
    response = event.get("tool_response")
    if isinstance(response, Mapping):
        return not (response.get("is_error") or response.get("error") or response.get("interrupted"))
    return True


def append(path: str, entry: Mapping[str, Any], *, max_bytes: int = defaults.TRAIL_MAX_BYTES) -> None:
    """Append one line to the trail at ``path`` (its directory must exist: the daemon made it).

    Refuses (:class:`heartbeat.model.errors.UnsafePath`) a symlink or anything but a regular file of
    ours; past ``max_bytes`` the older half is cut under an exclusive lock (a ``cut`` line keeps
    the count). Appends of parallel calls are whole lines: one ``write`` of ``O_APPEND``."""
    import fcntl
    import json

    from heartbeat.model.errors import UnsafePath
    from heartbeat.system.safefile import open_regular

    line = (json.dumps(dict(entry), ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")
    for _ in range(3):
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise UnsafePath("is not owned by this user; heartbeat does not write it", path=path)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                here = os.lstat(path)
            except FileNotFoundError:
                continue  # cut and replaced under us: append to the new file
            if (here.st_ino, here.st_dev) != (st.st_ino, st.st_dev):
                continue
            os.write(fd, line)
            if os.fstat(fd).st_size > max_bytes:
                _cut(path, max_bytes)
            return
        finally:
            os.close(fd)


def _cut(path: str, max_bytes: int) -> None:
    """Keep the newer half of the trail (whole lines), with a ``cut`` line counting the calls that
    went (at least: of a planted file larger than four times the bound only the tail is read)."""
    import json

    from heartbeat.system.safefile import open_parent, open_regular, write_atomic

    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - 4 * max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        data = b""
        while len(data) < size - start:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    keep_from = data.find(b"\n", max(0, len(data) - max_bytes // 2)) + 1
    dropped, kept = data[:keep_from], data[keep_from:]
    cut = 1 if start else 0
    for raw in dropped.splitlines():
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict):
            cut += int(doc["n"]) if doc.get("ev") == "cut" and isinstance(doc.get("n"), int) else \
                int(doc.get("ev") == "start")
    head = json.dumps({"ev": "cut", "t": round(time.time(), 3), "n": cut}).encode() + b"\n"
    dir_fd = open_parent(path, follow=False)
    try:
        write_atomic(dir_fd, os.path.basename(path), head + kept)
    finally:
        os.close(dir_fd)


def record_start(path: str, event: Mapping[str, Any], *, now: float | None = None) -> None:
    """A ``PreToolUse``: the call starts (its outcome unknown until its ``end``)."""
    tool, what = describe(event)
    key = _key(event, tool, what)
    if not _seen(path, "start", event, key):
        append(path, {"ev": "start", "t": round(time.time() if now is None else now, 3),
                      "id": key, "tool": tool, "what": what})


def record_end(path: str, event: Mapping[str, Any], *, now: float | None = None) -> None:
    """A ``PostToolUse`` (or ``PostToolUseFailure``): the call returned, ok or with an error."""
    tool, what = describe(event)
    key = _key(event, tool, what)
    if not _seen(path, "end", event, key):
        append(path, {"ev": "end", "t": round(time.time() if now is None else now, 3), "id": key, "ok": _ok(event)})


def _seen(path: str, ev: str, event: Mapping[str, Any], key: str) -> bool:
    """Whether this very call (its CLI's ``tool_use_id``) was already recorded: two hook sources (the
    preset's ``--settings`` and a ``hooks install`` in the workdir) fire for one call, and count once."""
    call_id = event.get("tool_use_id") or event.get("call_id")
    if not (isinstance(call_id, str) and call_id):
        return False
    lines, _ = _lines(path, defaults.TRAIL_DEDUP_TAIL)
    return any(line.get("ev") == ev and line.get("id") == key for line in lines)


def record_session(path: str, source: str, *, now: float | None = None) -> None:
    """A ``SessionStart``: the trail exists from the run's start, so a silent run is told apart early."""
    append(path, {"ev": "session", "t": round(time.time() if now is None else now, 3), "source": _one_line(source, 40)})


def _lines(path: str, tail: int) -> tuple[list[dict[str, Any]], bool]:
    """The parsed lines of the trail's last ``tail`` bytes, and whether anything was left before them."""
    import json

    from heartbeat.model.errors import UnsafePath
    from heartbeat.system.safefile import open_regular

    try:
        fd = open_regular(path)
    except (OSError, UnsafePath):  # a planted link or FIFO reads as no trail
        return [], False
    chunks: list[bytes] = []
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - tail)
        os.lseek(fd, start, os.SEEK_SET)
        left = size - start
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return [], False
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if start:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    out = []
    for raw in data.split(b"\n"):
        if not raw or len(raw) > defaults.TRAIL_MAX_LINE:
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # a truncated last line, a foreign one
        t = doc.get("t") if isinstance(doc, dict) else None
        # (a planted NaN, a negative or a far-future time must not crash a reader's datetime)
        if isinstance(t, int | float) and 0 < t < _LAST_TIME and isinstance(doc.get("ev"), str):
            out.append(doc)
    return out, start > 0


def read_calls(path: str, *, tail: int = defaults.TRAIL_MAX_BYTES) -> tuple[list[Call], int]:
    """The calls of the trail at ``path``, in start order, each paired with its end; and how many
    earlier calls are not there any more (cut, or before the tail read). No trail: ``([], 0)``."""
    lines, truncated = _lines(path, tail)
    calls: dict[str, Call] = {}
    cut = 1 if truncated else 0
    for doc in lines:
        ev, key = doc["ev"], doc.get("id")
        if ev == "cut" and isinstance(doc.get("n"), int):
            cut += max(0, doc["n"])
        elif ev == "start" and isinstance(key, str):
            if key in calls:  # the same key again (no call id): keep both, apart
                calls[f"{key}#{len(calls)}"] = calls.pop(key)
            calls[key] = Call(key=key, tool=str(doc.get("tool", "?"))[:80], what=str(doc.get("what", ""))[:400],
                              started=float(doc["t"]))
        elif ev == "end" and isinstance(key, str) and key in calls and not calls[key].finished:
            c = calls[key]
            calls[key] = Call(c.key, c.tool, c.what, c.started, float(doc["t"]), doc.get("ok") is not False)
    return sorted(calls.values(), key=lambda c: c.started), cut


def since(calls: Sequence[Call], note_at: datetime | None) -> list[Call]:
    """The calls started after the last note (``note_at``; None: all), the note's own commands left out."""
    after = note_at.timestamp() if note_at is not None else float("-inf")
    return [c for c in calls if c.started > after and not c.own_note]


def activity(path: str) -> tuple[datetime | None, bool | None]:
    """When the trail last moved (a call started or ended, a session started) and whether a tool call
    is in flight now; ``(None, None)`` when there is no trail (the hooks are not wired in)."""
    lines, _ = _lines(path, defaults.TRAIL_ACTIVITY_TAIL)
    if not lines:
        return None, None
    open_calls: set[str] = set()
    for doc in lines:
        key = doc.get("id")
        if doc["ev"] == "start" and isinstance(key, str):
            open_calls.add(key)
        elif doc["ev"] == "end" and isinstance(key, str):
            open_calls.discard(key)
        elif doc["ev"] == "session":
            open_calls.clear()  # a new session: the calls of one before it are not running
    last = max(float(doc["t"]) for doc in lines)
    return datetime.fromtimestamp(min(last, time.time() + 5), UTC), bool(open_calls)


def summary_lines(calls: Sequence[Call], *, cut: int = 0, limit: int = defaults.TRAIL_BRIEF_CALLS) -> list[str]:
    """The brief's lines for the unnoted calls: those whose outcome is unknown first (the run ended
    inside them), then the newest, at most ``limit``; what is left out is counted."""
    if not calls:
        return []
    unknown = [c for c in calls if not c.finished]
    rest = [c for c in calls if c.finished]
    shown = (unknown + rest[-max(0, limit - len(unknown)):])[:limit] if limit else []
    shown.sort(key=lambda c: c.started)
    out = []
    for c in shown:
        outcome = "**started, outcome unknown** (the run ended inside it)" if not c.finished else \
            ("ok" if c.ok else "error")
        out.append(f"- {c.tool}: `{c.what or '(no target)'}` - {outcome}")
    left = len(calls) - len(shown) + cut
    if left:
        out.append(f"- _({left} earlier call(s) not listed)_")
    return out


@dataclass(frozen=True)
class Unnoted:
    """The unnoted calls of a task's newest run that made any: which epoch, the calls, how many were cut."""

    epoch: int
    calls: tuple[Call, ...]
    cut: int = 0

    def lines(self, limit: int = defaults.TRAIL_BRIEF_CALLS) -> list[str]:
        return summary_lines(self.calls, cut=self.cut, limit=limit)

    @property
    def unknown(self) -> int:
        return sum(1 for c in self.calls if not c.finished)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "calls": [c.to_json() for c in self.calls], "cut": self.cut}


def unnoted(state_dir: str, task_id: str, epoch: int, note_at: datetime | None) -> Unnoted | None:
    """What the run of ``epoch`` (else, when it made no unnoted call yet, the run before it) did since
    the note was last written at ``note_at``; None when neither did anything unnoted."""
    for e in (epoch, epoch - 1):
        if e < 0:
            continue
        calls, cut = read_calls(trail_path(state_dir, task_id, e))
        left = since(calls, note_at)
        if left:
            return Unnoted(e, tuple(left), cut)
    return None


def _own_dir(path: str) -> bool:
    """Whether ``path`` is a directory of ours itself, not a link to one (the daemon made it)."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _bound_path(env: Mapping[str, str]) -> str | None:
    """The trail of the run ``env`` belongs to (an agent the daemon launched), or None."""
    task, epoch, state_dir = env.get("HEARTBEAT_TASK", ""), env.get("HEARTBEAT_EPOCH", ""), \
        env.get("HEARTBEAT_STATE_DIR", "")
    if not task or not epoch.isdigit() or not state_dir or "/" in task or task.startswith("."):
        return None
    path = trail_path(os.path.abspath(state_dir), task, int(epoch))
    return path if _own_dir(os.path.dirname(path)) else None


def session_hook(source: str, env: Mapping[str, str]) -> None:
    """A ``SessionStart`` of an agent the daemon launched: its trail starts (see :func:`record_session`)."""
    path = _bound_path(env)
    if path is not None:
        record_session(path, source)


def end_hook(raw: bytes, env: Mapping[str, str]) -> bool:
    """``heartbeat hook``'s fast way for a tool call's end (``PostToolUse``, ``PostToolUseFailure``) of an
    agent the daemon launched: the event parsed and its ``end`` appended with nothing but this module
    loaded (the full hook costs three times an interpreter start, at every tool call). False when the
    event is anything else, or unreadable: the full hook then reads it again and says what is wrong."""
    if len(raw) > defaults.MAX_HOOK_INPUT_BYTES:
        return False
    import json

    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    if not isinstance(event, dict) or event.get("hook_event_name") not in ("PostToolUse", "PostToolUseFailure"):
        return False
    return hot_hook(event, env)


def hot_hook(event: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Record a tool-call event of an agent the daemon launched (``$HEARTBEAT_TASK``,
    ``$HEARTBEAT_EPOCH`` and ``$HEARTBEAT_STATE_DIR`` set) without opening the store; False when
    this is not such an event (the caller goes the slow way). The task's log directory must exist."""
    name = event.get("hook_event_name")
    path = _bound_path(env) if name in HOT_EVENTS else None
    if path is None:
        return False
    if name == "PreToolUse":
        record_start(path, event)
    else:
        record_end(path, event)
    return True
