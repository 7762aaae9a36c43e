"""The Anthropic Messages API wire of the scripted model (what ``claude`` speaks).

``POST /v1/messages`` (Claude Code adds ``?beta=true``): streaming (server-sent events
``message_start``, ``content_block_start``/``delta``/``stop`` with ``text_delta`` and
``tool_use`` + ``input_json_delta``, ``message_delta``, ``message_stop``) or one JSON message;
``POST /v1/messages/count_tokens``; ``HEAD /api/hello`` (claude 2.1.332's connectivity probe at
start). A rate limit is the API's error body with ``retry-after`` (429 ``rate_limit_error``,
529 ``overloaded_error``).

Tool names map to the brain's neutral kinds: ``Bash`` is ``shell``, ``Write`` is ``write``.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from .brain import Call, Conversation, Reply, Result, shell_call
from .server import Exchange, Handler, ScriptedModel

__all__ = ["ROUTES", "conversation", "message_events"]

_KINDS = {"Bash": "shell", "Write": "write"}
_TOOL = {"shell": "Bash", "write": "Write"}


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            out.append(block["text"])
    return out


def conversation(req: dict[str, Any], session: str = "") -> Conversation:
    """The neutral view of one Messages API request."""
    texts = _texts(req.get("system") or [])
    calls: list[Call] = []
    results: dict[str, Result] = {}
    for message in req.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        texts.extend(_texts(content))
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                args = block.get("input") if isinstance(block.get("input"), dict) else {}
                kind = _KINDS.get(str(block.get("name")))
                if kind == "write":
                    calls.append(Call(id=str(block.get("id")), kind="write", path=str(args.get("file_path", "")),
                                      content=str(args.get("content", ""))))
                elif kind == "shell":
                    calls.append(shell_call(str(block.get("id")), str(args.get("command", ""))))
            elif block.get("type") == "tool_result":
                text = "\n".join(_texts(block.get("content") or []))
                results[str(block.get("tool_use_id"))] = Result(
                    call_id=str(block.get("tool_use_id")), text=text, is_error=block.get("is_error") is True)
    tools = frozenset(_KINDS[t["name"]] for t in req.get("tools") or ()
                      if isinstance(t, dict) and t.get("name") in _KINDS)
    return Conversation(texts=tuple(texts), calls=tuple(calls), results=results, tools=tools, session=session)


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.text or not reply.calls:
        blocks.append({"type": "text", "text": reply.text or "OK"})
    for call in reply.calls:
        if call.kind == "write":
            args = {"file_path": call.path, "content": call.content}
        else:
            args = {"command": call.command, "description": call.content or "Run a command"}
        blocks.append({"type": "tool_use", "id": call.id, "name": _TOOL[call.kind], "input": args})
    return blocks


def _usage(ex: Exchange) -> dict[str, int]:
    return {"input_tokens": max(1, len(ex.body) // 4), "output_tokens": 20,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message_events(reply: Reply, model: str, usage: dict[str, int]) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of one streamed message."""
    msg_id = "msg_" + uuid.uuid4().hex[:24]
    start = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "text_delta", "text": block["text"]}}))
        else:
            head = {k: block[k] for k in ("type", "id", "name")}
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {**head, "input": {}}}))
            raw = json.dumps(block["input"])
            cut = max(1, math.ceil(len(raw) / 2))  # two deltas: the CLI must join partial JSON
            for part in (raw[:cut], raw[cut:]):
                if part:
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "input_json_delta", "partial_json": part}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = "tool_use" if reply.calls else "end_turn"
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": usage["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def messages(ex: Exchange, model: ScriptedModel) -> None:
    req = ex.json()
    if not isinstance(req, dict):
        ex.send_json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "not JSON"}})
        return
    model.bodies.append(req)
    conv = conversation(req, ex.headers.get("x-claude-code-session-id", ""))
    reply = model.brain.answer(conv)
    if reply.fault is not None:
        fault = reply.fault
        if fault.hang:
            model.hold(fault.until or (lambda: True))
            if model.stopping.is_set():
                return
            reply = model.brain.decide(conv)
        else:
            kind = "overloaded_error" if fault.status == 529 else "rate_limit_error"
            headers = {"retry-after": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            ex.send_json(fault.status, {"type": "error", "error": {"type": kind, "message": fault.message}}, headers)
            return
    usage = ex.usage = _usage(ex)
    name = str(req.get("model") or "scripted")
    if req.get("stream"):
        ex.start_events()
        for event, data in message_events(reply, name, usage):
            ex.event(event, data)
        return
    ex.send_json(200, {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": name,
                       "content": _blocks(reply), "stop_reason": "tool_use" if reply.calls else "end_turn",
                       "stop_sequence": None, "usage": usage})


def count_tokens(ex: Exchange, model: ScriptedModel) -> None:
    ex.send_json(200, {"input_tokens": max(1, len(ex.body) // 4)})


def hello(ex: Exchange, model: ScriptedModel) -> None:
    ex.send_json(200, {})


ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/messages"): messages,
    ("POST", "/v1/messages/count_tokens"): count_tokens,
    ("HEAD", "/api/hello"): hello,
    ("GET", "/api/hello"): hello,
}
