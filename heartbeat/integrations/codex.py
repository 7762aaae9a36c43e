"""``heartbeat hooks install codex``: the hooks in ``.codex/hooks.json`` and a marked section in ``AGENTS.md``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    pass
from heartbeat.integrations.hooks import HOOK_EVENTS, command_prefix
from heartbeat.integrations.settings import (
    _dump,
    _load_json,
    _load_record,
    _merge_hooks,
    _put_back,
    _read_ours,
    _read_text,
    _save_record,
    _serving,
    _unmerge_hooks,
    _write_atomic,
)

__all__ = ["install_codex", "uninstall_codex"]
_AGENTS_BEGIN = "<!-- heartbeat:begin (written by `heartbeat hooks install codex`; remove with uninstall) -->"
_AGENTS_END = "<!-- heartbeat:end -->"


def codex_hooks_path(directory: str | None, *, user: bool, env: Mapping[str, str] | None = None) -> str:
    """``.codex/hooks.json`` in the project, or (``user``) in ``$CODEX_HOME`` (default ``~/.codex``)."""
    env = os.environ if env is None else env
    if user:
        return os.path.join(env.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex"), "hooks.json")
    return os.path.join(os.path.abspath(directory or "."), ".codex", "hooks.json")


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
