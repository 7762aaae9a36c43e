"""Durations (``"250ms"``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"`` or plain seconds) and instants.

Every parser here returns a value or raises :class:`~heartbeat.model.errors.BadInput`; no other
exception escapes, whatever the input (the fuzz tests hold us to that).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from heartbeat.model import defaults
from heartbeat.model.errors import BadInput

__all__ = ["parse_duration", "parse_instant", "format_duration", "utcnow", "to_utc"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: object, *, field: str | None = None) -> float:
    """Return seconds for ``"250ms"``, ``"30s"``, ``"1h30m"`` or a non-negative number."""
    if isinstance(value, bool):
        raise BadInput(f"expected a duration, got {value!r}", field=field)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer too large for a float
            raise BadInput(f"duration out of range: {str(value)[:64]}", field=field) from None
    elif isinstance(value, str):
        text = value.strip().lower()
        if not text or len(text) > 64:
            raise BadInput(f"bad duration {value[:64]!r}: use e.g. 250ms, 30s, 10m, 2h", field=field)
        try:
            seconds = float(text)
        except ValueError:
            pos = 0
            seconds = 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or pos == 0:
                raise BadInput(
                    f"bad duration {value!r}: use e.g. 250ms, 30s, 10m, 2h", field=field
                ) from None
    else:
        raise BadInput(f"expected a duration, got {type(value).__name__}", field=field)
    if math.isnan(seconds) or seconds < 0 or seconds > defaults.MAX_DURATION:
        raise BadInput(f"duration out of range: {value!r}", field=field)
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds compactly for people: ``4m12s``, ``2h``, ``850ms``."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    total = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
    return "".join(parts[:2]) or "0s"


def utcnow() -> datetime:
    """The current instant, timezone-aware, in UTC, to the microsecond."""
    return datetime.now(UTC)


def to_utc(value: datetime) -> datetime:
    """Make a datetime aware and UTC; a naive one is taken to be UTC already.

    Raises :class:`BadInput` for an instant whose UTC form is not representable
    (``9999-12-31T23:59:59-01:00`` is in year 10000 in UTC).
    """
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise BadInput(f"time out of range: {value.isoformat()}") from None


def parse_instant(value: object, *, field: str | None = None, now: datetime | None = None) -> datetime:
    """Parse an ISO 8601 instant (``2026-11-29T06:59:00Z``); naive times are UTC.

    ``+DURATION`` (e.g. ``+10m``) is accepted as "that long after ``now``".
    """
    if isinstance(value, datetime):
        return to_utc(value)
    if not isinstance(value, str):
        raise BadInput(f"expected an ISO 8601 time, got {type(value).__name__}", field=field)
    text = value.strip()
    if text.startswith("+"):
        base = now or utcnow()
        seconds = parse_duration(text[1:], field=field)
        try:
            return to_utc(base + timedelta(seconds=seconds))
        except (OverflowError, BadInput):
            raise BadInput(f"time out of range: {value[:64]!r}", field=field) from None
    if len(text) > 64:
        raise BadInput("expected an ISO 8601 time, got a long string", field=field)
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(
            f"bad time {value!r}: use ISO 8601, e.g. 2026-11-29T06:59:00Z", field=field
        ) from None
    try:
        return to_utc(parsed)
    except BadInput as exc:
        raise BadInput(exc.message, field=field) from None
