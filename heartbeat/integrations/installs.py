"""What ``heartbeat hooks install`` wrote into a person's files, so uninstall takes back exactly that.

A permission rule carries no marker (a person's own ``Bash(heartbeat show:*)`` reads the same as
one install added), and an emptied ``{}`` file says nothing about who made it: so install keeps a
record beside the files it touches (``heartbeat-installed.json`` in ``.claude/``, ``.codex/``,
``~/.claude/`` or ``$CODEX_HOME``): for each file, whether install created it and the rules it
added. Uninstall removes only recorded rules, and a file it created once nothing else is left in it.

Writing a person's file keeps its owner and mode: run as root (a provisioning script), install
would otherwise hand the person's settings file to root.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from heartbeat.model.errors import BadInput
from heartbeat.system.safefile import write_file_atomic

__all__ = ["RECORD_NAME", "InstallRecord", "write_keeping_owner", "record_path"]

RECORD_NAME = "heartbeat-installed.json"
"""The record's file name, in the directory of the settings (or hooks) file install merged into."""


def record_path(settings_file: str) -> str:
    """Where the record of an install into ``settings_file`` (and the files beside it) is kept."""
    return os.path.join(os.path.dirname(os.path.abspath(settings_file)), RECORD_NAME)


@dataclass
class InstallRecord:
    """Per file (an absolute path): ``created`` (install made it) and ``rules`` (permission rules it added)."""

    path: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, path: str, doc: Mapping[str, Any]) -> InstallRecord:
        files = doc.get("files", {})
        if not isinstance(files, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("created", False), bool)
                and isinstance(v.get("rules", []), list) and all(isinstance(r, str) for r in v.get("rules", []))
                for v in files.values()):
            raise BadInput(f"{path}: not heartbeat's install record (expected files: {{PATH: {{created, rules}}}}); "
                           "left untouched")
        return cls(path, {k: {"created": bool(v.get("created")), "rules": list(v.get("rules", []))}
                          for k, v in files.items()})

    def to_doc(self) -> dict[str, Any]:
        return {"written_by": "heartbeat hooks install; read by uninstall", "files": self.files}

    def note(self, file: str, *, existed: bool, rules: Iterable[str] = ()) -> None:
        """Install wrote ``file`` (it was there before unless ``existed`` is False), adding ``rules``."""
        entry = self.files.setdefault(os.path.abspath(file), {"created": not existed, "rules": []})
        entry["rules"] += [r for r in rules if r not in entry["rules"]]

    def created(self, file: str) -> bool:
        return bool(self.files.get(os.path.abspath(file), {}).get("created"))

    def rules(self, file: str) -> list[str]:
        return list(self.files.get(os.path.abspath(file), {}).get("rules", []))

    def forget_rules(self, file: str, rules: Iterable[str]) -> None:
        entry = self.files.get(os.path.abspath(file))
        if entry is not None:
            gone = set(rules)
            entry["rules"] = [r for r in entry["rules"] if r not in gone]

    def forget(self, file: str) -> None:
        self.files.pop(os.path.abspath(file), None)


def _owner_for_new(path: str) -> tuple[int, int] | None:
    """The owner a new file (or directory) at ``path`` gets when root writes it: its directory's."""
    parent = os.path.dirname(path)
    while parent and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    try:
        st = os.stat(parent or ".")
    except OSError:
        return None
    return st.st_uid, st.st_gid


def write_keeping_owner(path: str, data: bytes) -> None:
    """Write ``path`` whole (through a symlink, to its target) by rename, keeping its mode (0644 for a
    new file) and, when run as root, its owner (a new file: its directory's owner)."""
    target = os.path.realpath(path)
    missing_dirs = []
    parent = os.path.dirname(target)
    while parent and not os.path.isdir(parent):
        missing_dirs.append(parent)
        parent = os.path.dirname(parent)
    owner = None
    try:
        st = os.stat(target)
        mode, owner = st.st_mode & 0o777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        mode = 0o644
    root = os.geteuid() == 0
    if root and owner is None:
        owner = _owner_for_new(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if root and owner is not None:
        for made in reversed(missing_dirs):
            os.chown(made, *owner)
    write_file_atomic(target, data, mode)
    if root and owner is not None and owner != (0, 0):
        os.chown(target, *owner)
