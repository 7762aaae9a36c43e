"""``heartbeat hooks install claude``: the hooks in ``.claude/settings.json``, the permission rules in
``.claude/settings.local.json``, and with ``--mcp`` the MCP server in ``.mcp.json``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from heartbeat.model.errors import BadInput

if TYPE_CHECKING:
    pass
from heartbeat.integrations.hooks import HOOK_EVENTS
from heartbeat.integrations.settings import (
    _dump,
    _load_json,
    _load_record,
    _merge_hooks,
    _Ours,
    _put_back,
    _read_ours,
    _save_record,
    _serving,
    _unmerge_hooks,
    _write_atomic,
    heartbeat_argv,
)

__all__ = ["install_claude", "uninstall_claude", "allow_rules"]


def settings_path(directory: str | None, *, user: bool) -> str:
    if user:
        return os.path.join(os.path.expanduser("~"), ".claude", "settings.json")
    return os.path.join(os.path.abspath(directory or "."), ".claude", "settings.json")


def allow_rules(*, state_dir: str | None = None, config: str | None = None, task: str | None = None) -> list[str]:
    """The permission rules ``install`` adds: heartbeat's agent commands (on ``task``, else on any task),
    as the brief writes them and with the global options the install was given, and the MCP server."""
    import shlex

    from heartbeat.presets.claude import claude_allow_rules

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
