"""Merging heartbeat's hooks into an agent CLI's JSON settings, and taking exactly them out again.

Each hook heartbeat writes ends in the marker ``# heartbeat-hook``; install and uninstall touch only
marked hooks (and those of the same state dir and config), never a person's own. A file holding a value
JSON cannot (``1e400``, ``NaN``) is refused untouched."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heartbeat.integrations.hooks import HOOK_EVENTS
from heartbeat.model import defaults
from heartbeat.model.errors import BadInput, UnsafePath
from heartbeat.system.safefile import read_regular

if TYPE_CHECKING:
    from heartbeat.integrations.installs import InstallRecord

_MAX_SETTINGS_BYTES = 4 * 1024 * 1024
_MARK = "# heartbeat-hook"
"""Ends every hook command heartbeat writes: what install and uninstall recognise as theirs."""
_HOOK_OPTIONS = ("--state-dir", "--config", "--task")


# -- install / uninstall -----------------------------------------------------------------


def heartbeat_argv() -> list[str]:
    """How this heartbeat is run from a hook (:func:`heartbeat.presets.common.heartbeat_argv`)."""
    from heartbeat.presets.common import heartbeat_argv as argv

    return argv()


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
        raw = read_regular(path, _MAX_SETTINGS_BYTES + 1, follow=True)
    except FileNotFoundError:
        return None
    except UnsafePath as exc:
        kind = "a directory" if "a directory" in exc.message else "not a regular file"
        raise BadInput(f"{path}: {kind}, not {what}; left untouched") from None
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
    from heartbeat.integrations.installs import write_keeping_owner

    write_keeping_owner(path, text.encode("utf-8"))


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


def _dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _serving(state_dir: str | None, config: str | None) -> _Ours:
    return _Ours(state_dir=os.path.abspath(state_dir) if state_dir else "",
                 config=os.path.abspath(config) if config else "")


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


def _read_text(path: str) -> str:
    """All of ``path`` (``""`` when missing): a file cut at the size limit would be written back cut."""
    raw = _read_bytes(path, "an AGENTS.md")
    try:
        return "" if raw is None else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8; left untouched") from None


def _load_record(settings_file: str) -> InstallRecord:
    from heartbeat.integrations.installs import InstallRecord, record_path

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


def _hook_timeout(agent: str, event: str) -> int:
    """The ``timeout`` written for ``agent``'s hook at ``event``: the most the CLI accepts there."""
    return defaults.CODEX_SESSION_END_TIMEOUT if (agent, event) == ("codex", "SessionEnd") else defaults.HOOK_TIMEOUT
