"""The OpenAI Responses API wire of the scripted model (what ``codex`` speaks).

``POST /v1/responses``, streamed as server-sent events: ``response.created``, then per output
item ``response.output_item.added``, ``response.output_text.delta`` (a message's text) and
``response.output_item.done`` (the whole item: a ``message`` or a ``function_call``), and
``response.completed`` with ``usage``. That is all codex 0.171.0 needs to run a turn
(found by logging its requests against a loopback provider: it never asks for anything but
``/v1/responses`` there). A rate limit is an error body with ``retry-after`` (429, or 529
for overloaded).

codex reaches it through a provider of its own config, on the command line::

    codex exec -c model_provider=scripted -c model_providers.scripted.name=scripted \\
        -c model_providers.scripted.base_url=http://127.0.0.1:PORT/v1 \\
        -c model_providers.scripted.wire_api=responses -c model_providers.scripted.env_key=SCRIPTED_KEY ...

(:func:`codex_args`). The shell tool is ``exec_command`` (``{"cmd": ...}``); its output comes back
as ``function_call_output`` text with a header (``Process exited with code N`` then ``Output:``),
read here into the brain's neutral :class:`~tests.scripted_model.brain.Result`. codex 0.171.0 offers
no edit tool to a model it has no metadata for, so the brain writes its step files through the
shell. codex puts the working directory in an ``<environment_context>``; the brain reads it in the
words claude uses (``Primary working directory: ...``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from .brain import Call, Conversation, Reply, Result, shell_call
from .server import Exchange, Handler, ScriptedModel

__all__ = ["ROUTES", "PROVIDER", "codex_args", "conversation", "response_events"]

PROVIDER = "scripted"
"""The provider name :func:`codex_args` gives codex."""

_SHELL = "exec_command"
_EXIT = re.compile(r"^Process exited with code (-?\d+)$", re.MULTILINE)
_CWD = re.compile(r"<cwd>([^<\n]+)</cwd>")


def codex_args(base_url: str, *, env_key: str = "SCRIPTED_KEY", model: str = "scripted-model") -> list[str]:
    """The ``codex exec`` options that point it at the scripted model at ``base_url`` (``http://127.0.0.1:PORT``)."""
    p = f"model_providers.{PROVIDER}"
    return ["-c", f"model_provider={PROVIDER}", "-c", f"{p}.name={PROVIDER}", "-c", f"{p}.base_url={base_url}/v1",
            "-c", f"{p}.wire_api=responses", "-c", f"{p}.env_key={env_key}", "-c", f"{p}.request_max_retries=0",
            "-c", f"{p}.stream_max_retries=1", "-m", model]


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)] \
        if isinstance(content, list) else []


def _result(call_id: str, output: Any) -> Result:
    text = output if isinstance(output, str) else "\n".join(_texts(output))
    code = _EXIT.search(text)
    _, sep, body = text.partition("\nOutput:\n")
    # codex 0.171 answers a call its PreToolUse hook denied with the hook's reason and no exit code
    refused = text.startswith(_HOOK_DENIED)
    return Result(call_id=call_id, text=body if sep else text, is_error=refused or bool(code and code.group(1) != "0"))


_HOOK_DENIED = "Command blocked by PreToolUse hook"


def conversation(req: dict[str, Any], session: str = "") -> Conversation:
    """The neutral view of one Responses API request."""
    texts = _texts(req.get("instructions") or "")
    calls: list[Call] = []
    results: dict[str, Result] = {}
    for item in req.get("input") or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for text in _texts(item.get("content")):
                texts.append(text)
                cwd = _CWD.search(text)
                if cwd:
                    texts.append(f"Primary working directory: {cwd.group(1).strip()}")
        elif kind == "function_call" and item.get("name") == _SHELL:
            try:
                args = json.loads(item.get("arguments") or "{}")
            except ValueError:
                args = {}
            command = args.get("cmd") if isinstance(args, dict) else ""
            calls.append(shell_call(str(item.get("call_id")), command if isinstance(command, str) else ""))
        elif kind == "function_call_output":
            call_id = str(item.get("call_id"))
            results[call_id] = _result(call_id, item.get("output"))
    tools = frozenset({"shell"} if any(isinstance(t, dict) and t.get("name") == _SHELL
                                       for t in req.get("tools") or ()) else ())
    return Conversation(texts=tuple(texts), calls=tuple(calls), results=results, tools=tools, session=session)


def _items(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text or not reply.calls:
        items.append({"type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "role": "assistant",
                      "status": "completed",
                      "content": [{"type": "output_text", "text": reply.text or "OK", "annotations": []}]})
    for call in reply.calls:
        # the brain writes through the shell here (no edit tool is offered)
        items.append({"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:24], "call_id": call.id,
                      "name": _SHELL, "arguments": json.dumps({"cmd": call.command}), "status": "completed"})
    return items


def response_events(reply: Reply, usage: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of one streamed response."""
    rid = "resp_" + uuid.uuid4().hex[:24]
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"type": "response.created", "response": {"id": rid, "status": "in_progress"}})]
    for index, item in enumerate(_items(reply)):
        if item["type"] == "message":
            events.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                          "item": {**item, "content": [], "status": "in_progress"}}))
            events.append(("response.output_text.delta", {
                "type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                "content_index": 0, "delta": item["content"][0]["text"]}))
        else:
            events.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                          "item": item}))
        events.append(("response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                     "item": item}))
    events.append(("response.completed", {"type": "response.completed",
                                          "response": {"id": rid, "status": "completed", "usage": usage}}))
    return events


def _usage(ex: Exchange) -> dict[str, Any]:
    tokens = max(1, len(ex.body) // 4)
    return {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens + 20}


def responses(ex: Exchange, model: ScriptedModel) -> None:
    req = ex.json()
    if not isinstance(req, dict):
        ex.send_json(400, {"error": {"type": "invalid_request_error", "message": "not JSON"}})
        return
    model.bodies.append(req)
    conv = conversation(req, ex.headers.get("session-id", ""))
    reply = model.brain.answer(conv)
    if reply.fault is not None:
        fault = reply.fault
        if fault.hang:
            model.hold(fault.until or (lambda: True))
            if model.stopping.is_set():
                return
            reply = model.brain.decide(conv)
        else:
            kind = "server_error" if fault.status == 529 else "rate_limit_exceeded"
            headers = {"retry-after": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            ex.send_json(fault.status, {"error": {"type": kind, "code": kind, "message": fault.message}}, headers)
            return
    ex.start_events()
    for event, data in response_events(reply, _usage(ex)):
        ex.event(event, data)


ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/responses"): responses,
}
