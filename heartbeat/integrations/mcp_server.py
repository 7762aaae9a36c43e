"""``heartbeat mcp``: the batons over the Model Context Protocol, on stdio.

An agent that speaks MCP (Claude Code, Codex, any MCP client) reads and keeps its baton
through tools instead of shelling out: ``show``, ``status``, ``brief``, ``verify``, ``set``,
``add``, ``touch``, ``block``, ``done``, ``snooze``, ``ask``, ``answer``, with the CLI's semantics (the same verbs
in :mod:`heartbeat.tasks.verbs`) and its epoch fencing: the server's ``HEARTBEAT_EPOCH`` applies to
the server's ``HEARTBEAT_TASK``, so a superseded agent's writes are refused here too, and a
call naming another ``epoch`` is refused rather than obeyed (the argument is for a server no
environment binds). A refused call is an MCP tool error (``isError``) whose text is the CLI's one-line message and
its exit code, ``... (exit 5)``. ``verify`` answers its code as data (0 fresh, 3 stale,
4 not active, 5 superseded), as the CLI answers it as an exit status. The resource
``baton://{id}`` is the baton's TOML.

Built on the official Python SDK, ``mcp`` 2.x (``MCPServer``; 1.x called it ``FastMCP``),
installed by the ``mcp`` extra. 2.x is pinned because its ``ToolError`` carries
the message to the client, while a plain exception reaches it only as "Error executing tool".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from heartbeat.model.errors import BadInput, HeartbeatError

if TYPE_CHECKING:
    from heartbeat.store.base import Store

__all__ = ["EPOCH_NOTE", "TOOL_NAMES", "build_server", "serve"]

EPOCH_NOTE = (" `epoch` fences the call for a server not bound to one; a server started with HEARTBEAT_EPOCH "
              "(an agent the daemon launched) acts only for that epoch and refuses any other.")
"""Said in the description of every tool that takes ``epoch``."""

TOOL_NAMES = ("show", "status", "brief", "verify", "set", "add", "touch", "block", "done", "snooze", "ask", "answer")
"""The tools the server offers, each named as the CLI command it mirrors."""


def _actor() -> str:
    return os.environ.get("HEARTBEAT_ACTOR") or ("agent" if os.environ.get("HEARTBEAT_EPOCH") else "mcp")


_INT64_MAX = 2**63 - 1


def _in_range(name: str, value: int | None) -> int | None:
    """``value`` when the ledger's 64 bits hold it, else the CLI's one line (``argument --epoch: ...``)."""
    if value is not None and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise BadInput(f"argument {name}: {str(value)[:40]} is out of range (at most {_INT64_MAX})")
    return value


def argument_error(errors: list[dict[str, Any]]) -> str:
    """Arguments that do not match a tool's schema (pydantic's ``errors()``), in one line and the
    CLI's words: ``argument budget: expected an integer, got 'x'``, not a dump with a URL."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
        kind, given = str(error.get("type", "")), repr(error.get("input"))[:40]
        if kind == "missing":
            parts.append(f"the following arguments are required: {where}")
        elif kind.startswith("int_"):
            parts.append(f"argument {where}: expected an integer, got {given}")
        else:
            message = str(error.get("msg", "invalid value"))
            parts.append(f"argument {where}: {message[:1].lower()}{message[1:]}, got {given}")
    more = f"; and {len(parts) - 3} more" if len(parts) > 3 else ""
    return " ".join(("; ".join(parts[:3]) + more).split())


def build_server(store_factory: Callable[[], Store]) -> Any:
    """The MCP server over the store ``store_factory`` opens (once, on first use)."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ResourceError, ToolError
    except ImportError:
        from heartbeat.system.extras import Extra, install_hint

        raise BadInput(f"heartbeat mcp needs the MCP SDK 2.x (the mcp extra): {install_hint(Extra.MCP)}") from None
    from pydantic import ValidationError

    from heartbeat.api import epoch_from_env
    from heartbeat.tasks import verbs as tasks
    from heartbeat.tasks.write import refuse_foreign

    opened: list[Store] = []

    def store() -> Store:
        if not opened:
            opened.append(store_factory())
        return opened[0]

    def fence(task_id: str, epoch: int | None, *, write: bool = True) -> int | None:
        # The environment's epoch is the agent's identity, not a default: a refusal names the
        # current epoch, and a confused model must not be one retry away from writing for it.
        if write:
            refuse_foreign(task_id)
        _in_range("epoch", epoch)
        bound = epoch_from_env(task_id)
        if epoch is None or epoch == bound:
            return bound
        if bound is not None:
            raise BadInput(f"this server is bound to epoch {bound} of task {task_id} by HEARTBEAT_EPOCH and "
                           f"acts for no other epoch (asked for {epoch})")
        if epoch < 0:
            raise BadInput("epoch must not be negative")
        return epoch

    @contextmanager
    def tool_errors() -> Iterator[None]:
        try:
            yield
        except HeartbeatError as exc:
            raise ToolError(f"{exc} (exit {exc.exit_code})") from None

    class Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                if isinstance(exc.__cause__, ValidationError):
                    problem = argument_error(exc.__cause__.errors(include_url=False))  # type: ignore[arg-type]
                    raise ToolError(f"Error executing tool {name}: {problem} (exit 2)") from None
                raise

    server = Server(
        "heartbeat",
        instructions=("heartbeat keeps this task's state in a baton that survives context compaction, crashes and "
                      "handoffs. Call `brief` first; `verify` before anything irreversible; after each step `set` "
                      "step/next_step and `add` to done; `touch` while working; `block` when waiting on a person; "
                      "`ask` when the handoff left a gap only the upstream or a person can fill; "
                      "`done` when finished."),
        log_level="WARNING",
    )

    @server.tool(name="show", description="The baton of a task, as data.")
    def show(id: str) -> dict[str, Any]:
        with tool_errors():
            from heartbeat.model.baton import json_safe

            return dict(json_safe(store().load(id).to_dict()))

    @server.tool(name="status", description="One row per task: id, status, step, attempt, epoch, revision, age.")
    def status() -> dict[str, Any]:
        from heartbeat.model.timeparse import utcnow

        with tool_errors():
            now = utcnow()
            rows: list[dict[str, Any]] = []
            for entry in store().scan():
                if entry.baton is None:
                    rows.append({"id": entry.id, "status": "invalid", "error": str(entry.error)})
                    continue
                meta = entry.baton.meta
                last = meta.touched_at or meta.updated_at
                rows.append({"id": entry.id, "status": meta.status.value, "step": entry.baton.step,
                             "attempt": meta.attempt, "epoch": meta.epoch, "revision": meta.revision,
                             "age_s": round((now - last).total_seconds(), 3) if last else None,
                             "blocked_on": entry.baton.blocked_on})
            return {"tasks": rows}

    @server.tool(name="brief", description="What the next agent reads first: intent, constraints, state, pointers.")
    def brief(id: str, budget: int | None = None) -> str:
        from heartbeat.reports.brief import render_brief

        with tool_errors():
            if budget is not None and budget < 1:
                raise BadInput("budget must be a positive number of tokens")
            kwargs: dict[str, Any] = {"epoch": fence(id, None, write=False)}
            if budget is not None:
                kwargs["budget"] = budget
            from heartbeat.tasks.needs import needs_lines

            baton = store().load(id)
            return render_brief(baton, needs=needs_lines(store(), baton), **kwargs).text

    @server.tool(name="verify", description="Does the baton still hold? code 0 fresh, 3 stale, 4 not active, "
                                            "5 superseded (your epoch is no longer the task's)." + EPOCH_NOTE)
    def verify(id: str, epoch: int | None = None) -> dict[str, Any]:
        from heartbeat.tasks.verify import verify as verify_task

        with tool_errors():
            result = verify_task(store(), id, epoch=fence(id, epoch, write=False), actor=_actor())
            return dict(result.to_json())

    @server.tool(name="set", description="Set scalar fields (step, next_step, intent, ...), like "
                                         "`heartbeat set ID FIELD=VALUE`." + EPOCH_NOTE)
    def set_(id: str, fields: dict[str, str], expect_revision: int | None = None,
             epoch: int | None = None) -> dict[str, Any]:
        with tool_errors():
            from heartbeat.tasks.write import refuse_agent_fields

            refuse_agent_fields(id, fields)
            baton = tasks.set_fields(store(), id, fields, expect_revision=_in_range("expect_revision", expect_revision),
                                     epoch=fence(id, epoch),
                                     actor=_actor())
            return {"id": id, "revision": baton.meta.revision}

    @server.tool(name="add", description="Append items to a list field (done, decisions, constraints, ...). "
                                         "With field constraints and one value, protect (path globs relative to "
                                         "the workdir) and forbid (shell command globs) give it teeth: the rail "
                                         "refuses matching tool calls." + EPOCH_NOTE)
    def add(id: str, field: str, values: list[str], expect_revision: int | None = None,
            epoch: int | None = None, protect: list[str] | None = None,
            forbid: list[str] | None = None) -> dict[str, Any]:
        with tool_errors():
            if protect or forbid:
                if field != "constraints" or len(values) != 1:
                    raise BadInput("protect and forbid go with field constraints and one value")
                baton = tasks.add_constraint(store(), id, values[0], protect=protect or (), forbid=forbid or (),
                                             expect_revision=_in_range("expect_revision", expect_revision),
                                             epoch=fence(id, epoch), actor=_actor())
            else:
                baton = tasks.add_items(store(), id, field, values,
                                        expect_revision=_in_range("expect_revision", expect_revision),
                                        epoch=fence(id, epoch), actor=_actor())
            return {"id": id, "revision": baton.meta.revision}

    @server.tool(name="touch", description="Alive, still on this step (not progress)." + EPOCH_NOTE)
    def touch(id: str, epoch: int | None = None) -> dict[str, Any]:
        with tool_errors():
            baton = tasks.touch(store(), id, epoch=fence(id, epoch), actor=_actor())
            return {"id": id, "revision": baton.meta.revision}

    @server.tool(name="block", description="Block the task on something (a person by default) until a gate "
                                           "opens." + EPOCH_NOTE)
    def block(id: str, on: str, gate: str = "human", epoch: int | None = None) -> dict[str, Any]:
        from heartbeat.model.baton import Gate

        with tool_errors():
            baton = tasks.block(store(), id, on, Gate.parse(gate), epoch=fence(id, epoch), actor=_actor())
            return {"id": id, "revision": baton.meta.revision, "status": baton.meta.status.value}

    @server.tool(name="done", description="Mark the task done." + EPOCH_NOTE)
    def done(id: str, note: str = "", epoch: int | None = None) -> dict[str, Any]:
        with tool_errors():
            baton = tasks.finish(store(), id, note=note, epoch=fence(id, epoch), actor=_actor())
            return {"id": id, "revision": baton.meta.revision, "status": baton.meta.status.value}

    @server.tool(name="ask", description="Ask a question across the seam (a gap the handoff left): the task is "
                                         "held until it is answered, and its next brief carries the answer. `to`: "
                                         "upstream (default when the task has exactly one) or person; `upstream` "
                                         "names which of several. Returns the question's id." + EPOCH_NOTE)
    def ask(id: str, question: str, to: str | None = None, upstream: str | None = None,
            epoch: int | None = None) -> dict[str, Any]:
        from heartbeat.tasks import questions

        with tool_errors():
            qid = questions.ask(store(), id, question, to=to, upstream=upstream, epoch=fence(id, epoch),
                                actor=_actor())
            return {"id": id, "qid": qid}

    @server.tool(name="answer", description="Answer question `qid` of task `id`. A server bound to an agent "
                                            "(HEARTBEAT_TASK, HEARTBEAT_EPOCH) answers only as that task, and only "
                                            "a question asked of it; any other answers as a person (`by`: a name).")
    def answer(id: str, qid: str, text: str, by: str | None = None) -> dict[str, Any]:
        from heartbeat.tasks import questions
        from heartbeat.tasks.write import answerer_from_env

        with tool_errors():
            who, epoch = answerer_from_env(by, None)
            questions.answer(store(), id, qid, text, by=who, epoch=epoch, actor=_actor())
            return {"id": id, "qid": qid, "answered_by": who}

    @server.tool(name="snooze", description="End the shift; the daemon wakes the task later. Give `until` "
                                            "(ISO 8601) or `duration` (30m, 2h)." + EPOCH_NOTE)
    def snooze(id: str, until: str | None = None, duration: str | None = None,
               epoch: int | None = None) -> dict[str, Any]:
        from datetime import timedelta

        from heartbeat.model.timeparse import parse_duration, parse_instant, utcnow

        with tool_errors():
            if bool(until) == bool(duration):
                raise BadInput("give one of until (ISO 8601) or duration (30m, 2h)")
            when = (parse_instant(until, field="until") if until
                    else utcnow() + timedelta(seconds=parse_duration(duration or "", field="duration")))
            baton = tasks.snooze(store(), id, when, epoch=fence(id, epoch), actor=_actor())
            return {"id": id, "revision": baton.meta.revision, "until": when.isoformat()}

    @server.resource("baton://{id}", name="baton", description="A task's baton (TOML).", mime_type="application/toml")
    def baton_resource(id: str) -> str:
        from heartbeat.model.baton import dump_baton

        try:
            return dump_baton(store().load(id))
        except HeartbeatError as exc:
            raise ResourceError(f"{exc} (exit {exc.exit_code})") from None

    return server


def serve(*, state_dir: str | None = None, config: str | None = None) -> int:
    """Run the server on stdio until the client closes it."""
    from heartbeat.config.load import resolve_store
    from heartbeat.store import open_store

    path, url = resolve_store(state_dir, config)  # a missing config is an error now, not at the first call
    server = build_server(lambda: open_store(path, url))
    server.run("stdio")
    return 0
