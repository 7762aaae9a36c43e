"""``heartbeat show`` and ``heartbeat brief`` as text: what the CLI prints, and the daemon's relay too.

An agent reads its baton and its brief often; in its own process each read costs the
interpreter starts of the store, the baton model and (for ``brief``) the config. The daemon
has them loaded: for an agent it launched, ``show ID [--json]`` and ``brief ID [--json]`` go
through its relay (:mod:`heartbeat.hotpath.relay`) and are answered by these same functions, so the
two print the same bytes. Both carry what the task's last run did since its note
(:mod:`heartbeat.hotpath.trail`), read from the local ``state_dir``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from heartbeat.model.errors import BadInput

__all__ = ["READ_COMMANDS", "json_text", "show_text", "brief_text", "read_request", "answer_read"]

READ_COMMANDS = ("show", "brief")
"""The reads an agent's relay carries (``ID``, optionally ``--json``)."""


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def json_text(value: Any) -> str:
    """``value`` as the CLI prints JSON (indented, UTF-8 as is, a newline at the end)."""
    from heartbeat.model.baton import json_safe

    return json.dumps(json_safe(value), ensure_ascii=False, indent=2, default=_json_default, allow_nan=False) + "\n"


def show_text(store: Any, state_dir: str, task_id: str, *, as_json: bool = False) -> str:
    """``heartbeat show ID [--json]``'s standard output."""
    from heartbeat.model.baton import dump_baton
    from heartbeat.model.errors import NotFound
    from heartbeat.reports.brief import unnoted_for

    try:
        baton = store.load(task_id)
    except NotFound:
        gone = archived_where(store, state_dir, task_id)
        if gone:
            raise NotFound(gone, task=task_id) from None
        raise
    from heartbeat.tasks.needs import downstream_needs, needs_lines

    unnoted = unnoted_for(state_dir, store, baton)
    if as_json:
        wanted = [{"downstream": d, "needs": [n.to_json() for n in found]} for d, found in
                  downstream_needs(store, baton.id)]
        return json_text({**baton.to_dict(), **({"unnoted": unnoted.to_json()} if unnoted else {}),
                          **({"downstream_needs": wanted} if wanted else {})})
    lines = needs_lines(store, baton)
    text = "".join(f"# {line}\n" for line in ["What the downstreams need of this package (`done` is refused "
                                              "until each is filled):", *lines]) if lines else ""
    text += dump_baton(baton)
    if unnoted:
        text += (f"\n# Since the last note, the run of epoch {unnoted.epoch} did (not in the note):\n"
                 + "".join(f"# {line}\n" for line in unnoted.lines()))
    return text


def archived_where(store: Any, state_dir: str, task_id: str) -> str:
    """Where an archived task went, from its latest ``archived`` event (gc's or ``rm``'s); ``""``
    when the ledger has none."""
    import os

    from heartbeat.model.ledger import EventKind
    from heartbeat.store.base import SharedStore
    from heartbeat.system.layout import StateLayout

    marks = [e for e in store.ledger.events(task_id) if e.kind == EventKind.ARCHIVED]
    if not marks:
        return ""
    mark = marks[-1]
    name = str(mark.data.get("archive", ""))
    where = (f"the database's archive {name} (table heartbeat_archive)" if isinstance(store, SharedStore)
             else f"{os.path.join(StateLayout(state_dir).archive_dir, name)} (`zcat` it)")
    return (f"archived by {mark.actor or '-'} at {mark.ts.isoformat(timespec='seconds')} into {where}, "
            f"with its baton and {mark.data.get('rows', '?')} ledger rows")


def brief_text(store: Any, state_dir: str, task_id: str, *, as_json: bool = False, max_attempts: int | None = None,
               epoch: int | None = None, budget: int | None = None) -> tuple[str, str]:
    """``heartbeat brief ID [--json]``'s standard output and its warnings (standard error)."""
    from heartbeat.reports.brief import render_brief, unnoted_for

    if budget is not None and budget < 1:
        raise BadInput("--budget must be a positive number of tokens")
    baton = store.load(task_id)
    kwargs: dict[str, Any] = {"max_attempts": max_attempts, "epoch": epoch}
    if budget is not None:
        kwargs["budget"] = budget
    if baton.after:
        from heartbeat.tasks.handoff import load_packages

        kwargs["upstream"] = load_packages(store, baton)
    from heartbeat.tasks.needs import needs_lines

    unnoted = unnoted_for(state_dir, store, baton)
    brief = render_brief(baton, unnoted=unnoted.lines() if unnoted else (), needs=needs_lines(store, baton),
                         **kwargs)
    warnings = "".join(f"heartbeat: warning: {task_id}: {w}\n" for w in brief.warnings)
    return (json_text(brief.to_json()) if as_json else brief.text), warnings


def read_request(argv: list[str]) -> tuple[str, str, bool] | None:
    """``(command, ID, --json)`` when ``argv`` is a read the relay carries (``show``/``brief`` ``ID``,
    optionally ``--json`` after it), else None."""
    if len(argv) not in (2, 3) or argv[0] not in READ_COMMANDS or argv[1].startswith("-"):
        return None
    if len(argv) == 3 and argv[2] != "--json":
        return None
    return argv[0], argv[1], len(argv) == 3


def answer_read(store: Any, state_dir: str, argv: list[str], env: Mapping[str, str], *,
                max_attempts: int | None) -> tuple[int, str, str] | None:
    """A relayed read, answered as the CLI would: ``(exit code, standard error, standard output)``;
    None when ``argv`` is not one (see :func:`read_request`)."""
    from heartbeat.model.errors import HeartbeatError
    from heartbeat.tasks.write import epoch_from_env

    parsed = read_request(argv)
    if parsed is None:
        return None
    command, task_id, as_json = parsed
    try:
        if command == "show":
            return 0, "", show_text(store, state_dir, task_id, as_json=as_json)
        out, warnings = brief_text(store, state_dir, task_id, as_json=as_json, max_attempts=max_attempts,
                                   epoch=epoch_from_env(task_id, env))
        return 0, warnings.rstrip("\n"), out
    except HeartbeatError as exc:
        return exc.exit_code, f"heartbeat: {exc}", ""
