"""What a run cost when its output has no final cost: the stream's own per-message usage, priced.

A run stopped by the daemon (``max_runtime``, hung, its lease lapsed, the daemon stopping) or
cut by a crash ends without Claude Code's final ``result`` line, whose ``total_cost_usd`` is the
only cost the CLI states; the real ``claude`` prints none when it is SIGTERMed. The stream still
carries what was spent: every ``{"type": "assistant"}`` message holds its model and its
``usage`` (the CLI prints one line per content block, each with the same message id, so the
last line of each id counts; its output count is the stream's start, 1, so the characters the
message's blocks hold, four to a token, stand in when more: an estimate, close for input and
cache tokens, which dominate an agent's spend). :func:`costed` prices those tokens with
:data:`heartbeat.model.defaults.CLAUDE_PRICES` (Anthropic's list prices, USD per million tokens) so
that ``max_cost_usd`` fires on runs that are always cut; a run whose output says nothing
priceable is recorded as of unknown cost, never as free.

The log is the agent's: it is read the way :func:`heartbeat.system.safefile.read_log_ends` reads it
(no symlink, no FIFO, regular files only), in chunks, a line longer than
:data:`~heartbeat.model.defaults.RESULT_LINE_BYTES` skipped (counted as unpriced when it is an
assistant message) without ever being held whole.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from heartbeat.model import defaults
from heartbeat.model.errors import UnsafePath
from heartbeat.presets.common import PresetName, ResultInfo
from heartbeat.system.safefile import open_regular

__all__ = ["StreamUsage", "costed", "price_of", "stream_usage"]

_CHUNK = 1 << 20
_ASSISTANT = b'"assistant"'  # a cheap filter before a parse; json.loads decides
_FAMILIES = ("opus", "sonnet", "haiku")


@dataclass(frozen=True)
class StreamUsage:
    """The assistant messages of one run's stream and what their tokens cost."""

    messages: int = 0
    """Distinct assistant messages (by id) whose usage was read."""
    priced: int = 0
    """Of those, the ones whose model has a price."""
    cost_usd: float = 0.0
    """What the priced ones cost at list prices."""
    unpriced: int = 0
    """Messages whose usage could not be read (a line past the cap) or whose model no price names."""


def price_of(model: str) -> tuple[float, float, float, float] | None:
    """(input, output, cache write, cache read) USD per million tokens for ``model``: the longest
    prefix :data:`~heartbeat.model.defaults.CLAUDE_PRICES` names, else its family's (opus, sonnet, haiku)
    highest price there, else None (not priced)."""
    found = [p for p in defaults.CLAUDE_PRICES if model.startswith(p)]
    if found:
        return defaults.CLAUDE_PRICES[max(found, key=len)]
    family = next((f for f in _FAMILIES if f in model.lower()), None)
    if family is None:
        return None
    prices = [v for k, v in defaults.CLAUDE_PRICES.items() if family in k]
    return max(prices) if prices else None


def _tokens(usage: Mapping[str, object], name: str) -> int:
    value = usage.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**53:
        return 0
    return value


def _message_cost(model: str, usage: Mapping[str, object]) -> float | None:
    prices = price_of(model)
    if prices is None:
        return None
    inp, out, write, read = prices
    total = (_tokens(usage, "input_tokens") * inp + _tokens(usage, "output_tokens") * out
             + _tokens(usage, "cache_creation_input_tokens") * write + _tokens(usage, "cache_read_input_tokens") * read)
    cost = total / 1_000_000
    return cost if math.isfinite(cost) else None


def _lines(path: str, limit: int) -> Iterator[bytes | None]:
    """The lines of the file at ``path`` (a regular file, never through a symlink); None for each
    line longer than ``limit``, whose first bytes are then yielded on their own as ``b"\\0" + head``."""
    try:
        fd = open_regular(path)
    except (OSError, UnsafePath):
        return
    try:
        carry = b""
        skipping = False
        while chunk := os.read(fd, _CHUNK):
            parts = (carry + chunk).split(b"\n")
            carry = parts.pop()
            for part in parts:
                if skipping:
                    skipping = False
                    continue
                yield part
            if len(carry) > limit:
                if not skipping:
                    yield None
                    yield b"\0" + carry[:256]
                skipping, carry = True, b""
        if carry and not skipping:
            yield carry
    except OSError:
        return
    finally:
        os.close(fd)


def stream_usage(paths: Sequence[str], *, limit: int = defaults.RESULT_LINE_BYTES) -> StreamUsage:
    """The assistant messages' usage in the logs ``paths`` (in order: a rotated ``.log.1`` first)."""
    last: dict[str, tuple[str, Mapping[str, object]]] = {}
    written: dict[str, int] = {}  # message id -> characters of content its lines carry
    overlong = 0
    cut = False
    for path in paths:
        for line in _lines(path, limit):
            if line is None:
                cut = True
                continue
            if cut:
                cut = False
                overlong += _ASSISTANT in line
                continue
            if _ASSISTANT not in line[:4096] or b'"usage"' not in line:
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            message = obj.get("message") if isinstance(obj, dict) else None
            if not isinstance(message, dict) or obj.get("type") != "assistant":
                continue
            usage, model, key = message.get("usage"), message.get("model"), message.get("id")
            if isinstance(usage, dict) and isinstance(model, str):
                key = key if isinstance(key, str) else f"#{len(last)}"
                written[key] = written.get(key, 0) + len(json.dumps(message.get("content"), ensure_ascii=False))
                last[key] = (model, usage)
    cost = 0.0
    # A streamed message's usage is its message_start's: output_tokens is 1 while it streams (claude
    # 2.1.332 prints each content block then); what it wrote, at ~4 characters a token, stands in.
    costs = [_message_cost(model, {**usage, "output_tokens": max(_tokens(usage, "output_tokens"), written[key] // 4)})
             for key, (model, usage) in last.items()]
    priced = [c for c in costs if c is not None]
    return StreamUsage(messages=len(last), priced=len(priced), cost_usd=round(sum(priced, cost), 6),
                       unpriced=overlong + len(costs) - len(priced))


def costed(preset: str, log_path: str, info: ResultInfo) -> ResultInfo:
    """``info`` with its cost: the CLI's own when it stated one, else (Claude Code) the stream's
    usage at list prices, else marked unknown."""
    if info.cost_usd is not None:
        return info
    if preset == PresetName.CLAUDE_CODE:
        found = stream_usage([f"{log_path}.1", log_path])
        if found.priced:
            return replace(info, cost_usd=found.cost_usd, cost_source="usage", unpriced_messages=found.unpriced)
    return replace(info, cost_unknown=True)
