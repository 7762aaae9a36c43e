"""Test helpers shipped with the package: hypothesis strategies for batons and TOML values.

Like ``structlog.testing``, this lets code built on heartbeat (and heartbeat's own tests)
generate batons without re-deriving what a valid one is::

    from hypothesis import given
    from heartbeat.model.baton import dump_baton, parse_baton
    from heartbeat.testing import batons

    @given(batons())
    def test_round_trip(baton):
        assert parse_baton(dump_baton(baton), path="x") == baton

Needs ``hypothesis`` (installed with the ``test`` extra); importing this module without it
raises :class:`ImportError`. Every generated baton is valid and reads back equal after
``dump_baton`` → ``parse_baton``: unknown keys at the top level, inside ``[meta]``,
``[meta.owner]`` and ``[meta.gate]``, nested tables, arrays of tables, unicode and
multi-line strings included.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from functools import cache
from typing import Any

from hypothesis import strategies as st

from heartbeat.model.baton import (
    HANDOFF_FIELDS,
    ID_PATTERN,
    LIST_FIELDS,
    PACKAGE_PARTS,
    SCALAR_FIELDS,
    Baton,
    Gate,
    GateKind,
    Guarantee,
    Meta,
    Owner,
    Question,
    QuestionTo,
    Status,
)

__all__ = [
    "task_ids",
    "texts",
    "toml_keys",
    "toml_scalars",
    "toml_values",
    "toml_tables",
    "utc_datetimes",
    "questions",
    "key_file_paths",
    "owners",
    "gates",
    "metas",
    "batons",
    "guarantees",
    "KNOWN_TOP_KEYS",
    "KNOWN_META_KEYS",
]

KNOWN_TOP_KEYS = frozenset({*SCALAR_FIELDS, *LIST_FIELDS, *HANDOFF_FIELDS, "guards", "irreversible", "questions",
                            "meta"})
"""Top-level keys heartbeat reads itself; an unknown key must not be one of them."""

KNOWN_META_KEYS = frozenset(f for f in Meta.__dataclass_fields__ if f != "extra")
"""Keys of ``[meta]`` heartbeat reads itself (``owner``, ``gate`` and ``world`` are tables)."""

_KNOWN_OWNER_KEYS = frozenset(f for f in Owner.__dataclass_fields__ if f != "extra")
_KNOWN_GATE_KEYS = frozenset({"kind", "target"})

_INT64 = (-(2**63), 2**63 - 1)


class _LongEnough:
    # A named callable rather than a lambda: hypothesis parses a lambda filter's source.
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, text: str) -> bool:
        return len(text) >= self.size


class _Not:
    def __init__(self, value: str) -> None:
        self.value = value

    def __call__(self, text: str) -> bool:
        return text != self.value


class _Absent:
    def __init__(self, known: frozenset[str]) -> None:
        self.known = known

    def __call__(self, key: str) -> bool:
        return key not in self.known


def _not_blank(text: str) -> bool:
    return bool(text.strip())


def _not_dot_segment(text: str) -> bool:
    return text not in (".", "..")


def _slash_joined(parts: list[str]) -> str:
    return "/".join(parts)


def _rooted(path: str) -> str:
    return "/" + path


def _utc_offset(minutes: int) -> timezone:
    return timezone(timedelta(minutes=minutes))


@cache
def task_ids() -> st.SearchStrategy[str]:
    """Valid task ids: 1-64 of ``a-z 0-9 . _ -``, starting with a letter or digit."""
    return st.from_regex(ID_PATTERN, fullmatch=True)


@cache
def texts(*, min_size: int = 0, max_size: int = 40, multiline: bool = True) -> st.SearchStrategy[str]:
    """Unicode text as TOML can hold it: any code point but surrogates; newlines, tabs,
    quotes, backslashes and control characters included (``multiline=False`` drops line breaks)."""
    excluded = "\n\r" if not multiline else ""
    alphabet = st.characters(exclude_categories=["Cs"], exclude_characters=excluded)
    interesting = st.sampled_from(['"""', "'''", "\\", '"', "\n", "\r\n", "\t", "\x00", "\x7f", "é", "日本", "🙂"])
    pieces = st.lists(st.one_of(st.text(alphabet, max_size=8), interesting if multiline else st.text(alphabet)),
                      max_size=6)
    text = st.one_of(st.text(alphabet, min_size=min_size, max_size=max_size), pieces.map("".join))
    return text.filter(_LongEnough(min_size)) if min_size else text


@cache
def toml_keys() -> st.SearchStrategy[str]:
    """Table keys: bare words and arbitrary (quoted) unicode, the empty key included."""
    bare = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
    return st.one_of(bare, texts(max_size=12))


@cache
def utc_datetimes() -> st.SearchStrategy[datetime]:
    """Timezone-aware UTC instants with microseconds, as heartbeat stores its times."""
    return st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC))


@cache
def _offsets() -> st.SearchStrategy[timezone]:
    # TOML offsets have minute precision.
    return st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(_utc_offset)


@cache
def toml_scalars() -> st.SearchStrategy[Any]:
    """Every TOML scalar type: string, 64-bit integer, float (no NaN: it never equals
    itself), boolean, offset and local date-times, local dates and local times."""
    return st.one_of(
        texts(),
        st.integers(*_INT64),
        st.floats(allow_nan=False),
        st.booleans(),
        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_offsets()),
        st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
        st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31)),
        st.times(),
    )


@cache
def toml_values(*, max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Any TOML value: scalars, arrays (mixed, nested, of tables) and tables, nested."""
    return st.recursive(
        toml_scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(toml_keys(), inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


@cache
def toml_tables(*, exclude: frozenset[str] = frozenset(), max_size: int = 4) -> st.SearchStrategy[dict[str, Any]]:
    """A table of unknown keys (none of ``exclude``) holding any TOML values."""
    return st.dictionaries(toml_keys().filter(_Absent(exclude)), toml_values(), max_size=max_size)


@cache
def key_file_paths() -> st.SearchStrategy[str]:
    """Relative paths that stay inside a workdir: no ``..``, no leading ``/``, no NUL."""
    segment = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="/\x00"), min_size=1,
                      max_size=12).filter(_not_dot_segment)
    return st.lists(segment, min_size=1, max_size=3).map(_slash_joined)


@cache
def _absolute_paths() -> st.SearchStrategy[str]:
    return key_file_paths().map(_rooted)


@cache
def owners() -> st.SearchStrategy[Owner]:
    """``[meta.owner]`` with any subset of its fields and unknown keys of its own."""
    optional_text = st.one_of(st.just(""), texts(max_size=20))
    return st.builds(
        Owner,
        pid=st.one_of(st.none(), st.integers(0, 2**22)),
        create_time=st.one_of(st.none(), st.floats(min_value=0, max_value=4e9, allow_nan=False)),
        host=optional_text,
        launcher=optional_text,
        unit=optional_text,
        session=optional_text,
        how=st.sampled_from(["", "dispatch", "claim"]),
        started_at=st.one_of(st.none(), utc_datetimes()),
        extra=toml_tables(exclude=_KNOWN_OWNER_KEYS, max_size=2),
    )


@cache
def gates() -> st.SearchStrategy[Gate]:
    """``[meta.gate]`` of every kind, with unknown keys of its own."""
    return st.builds(
        Gate,
        kind=st.sampled_from(list(GateKind)),
        target=texts(max_size=30),
        extra=toml_tables(exclude=_KNOWN_GATE_KEYS, max_size=2),
    )


@st.composite
def metas(draw: st.DrawFn, task_id: str | None = None) -> Meta:
    """``[meta]`` in any stored state, with unknown keys; ``task_id`` fixes ``meta.id``."""
    status = draw(st.sampled_from([s for s in Status if s is not Status.INVALID]))
    gate = draw(st.one_of(st.none(), gates()))
    if status is Status.BLOCKED and gate is None:
        gate = Gate(GateKind.HUMAN)  # what parsing a blocked baton without a gate gives
    counter = st.integers(0, 2**31)
    maybe_time = st.one_of(st.none(), utc_datetimes())
    return Meta(
        schema=1,
        id=task_id if task_id is not None else draw(task_ids()),
        status=status,
        revision=draw(counter),
        epoch=draw(counter),
        attempt=draw(counter),
        dispatches=draw(counter),
        idle_resumes=draw(counter),
        created_at=draw(maybe_time),
        updated_at=draw(maybe_time),
        touched_at=draw(maybe_time),
        progress_at=draw(maybe_time),
        dispatched_at=draw(maybe_time),
        blocked_at=draw(maybe_time),
        snooze_until=draw(maybe_time),
        ended_at=draw(maybe_time),
        last_failure=draw(st.one_of(st.just(""), texts())),
        last_exit=draw(st.one_of(st.none(), st.integers(-255, 255))),
        session=draw(st.one_of(st.just(""), texts(max_size=40))),
        session_resumes=draw(st.integers(0, 50)),
        wait_until=draw(maybe_time),
        wait_since=draw(maybe_time),
        wait_reason=draw(st.one_of(st.just(""), texts())),
        limit_hits=draw(st.integers(0, 50)),
        launch_failures=draw(st.integers(0, 50)),
        cost_usd=draw(st.one_of(st.just(0.0), st.floats(0, 1e6, allow_nan=False, allow_infinity=False))),
        owner=draw(st.one_of(st.none(), owners())),
        gate=gate,
        world=draw(st.dictionaries(st.one_of(key_file_paths(), st.just(":git-head")), texts(max_size=70), max_size=3)),
        extra=draw(toml_tables(exclude=KNOWN_META_KEYS, max_size=3)),
    )


@st.composite
def guarantees(draw: st.DrawFn) -> Guarantee:
    """A guarantee: non-blank text, an optional check name, unknown keys kept."""
    return Guarantee(
        text=draw(texts(min_size=1).filter(_not_blank)),
        check=draw(st.one_of(st.just(""), st.from_regex(ID_PATTERN, fullmatch=True))),
        extra=draw(toml_tables(exclude=frozenset({"text", "check"}), max_size=2)),
    )


_KNOWN_QUESTION_KEYS = frozenset({"id", "to", "upstream", "text", "asked_at", "epoch", "sent_at", "answer",
                                  "answered_by", "answered_at", "escalated_at"})


@st.composite
def questions(draw: st.DrawFn, number: int = 1) -> Question:
    """A valid question ``q<number>``: to an upstream or a person, open or answered, maybe sent or escalated."""
    to = draw(st.sampled_from(list(QuestionTo)))
    escalated = draw(st.one_of(st.none(), utc_datetimes())) if to is QuestionTo.PERSON else None
    upstream = draw(task_ids()) if to is QuestionTo.UPSTREAM or (escalated and draw(st.booleans())) else ""
    answered = draw(st.booleans())
    return Question(
        id=f"q{number}", to=to, text=draw(texts(min_size=1).filter(_not_blank)), asked_at=draw(utc_datetimes()),
        upstream=upstream, epoch=draw(st.integers(0, 1000)),
        sent_at=draw(st.one_of(st.none(), utc_datetimes())),
        answer=draw(texts(min_size=1).filter(_not_blank)) if answered else "",
        answered_by=draw(st.sampled_from(["person", "person:ana", f"upstream:{upstream or 'up'}"])) if answered else "",
        answered_at=draw(utc_datetimes()) if answered else None,
        escalated_at=escalated,
        extra=draw(toml_tables(exclude=_KNOWN_QUESTION_KEYS, max_size=2)),
    )


@st.composite
def batons(draw: st.DrawFn, task_id: str | None = None, *, workdir: str | None = None) -> Baton:
    """A valid baton with every field exercised, unknown keys included.

    ``task_id`` fixes the id; ``workdir`` fixes the workdir (e.g. a real temp dir, so a
    store can fingerprint the key files, which always stay inside it).
    """
    required = texts(min_size=1).filter(_not_blank)
    meta = draw(metas(task_id))
    lists: dict[str, Any] = {name: draw(st.lists(texts(), max_size=4)) for name in LIST_FIELDS if name != "key_files"}
    return Baton(
        task=draw(required),
        step=draw(required),
        intent=draw(texts()),
        next_step=draw(texts()),
        blocked_on=draw(texts()),
        workdir=workdir if workdir is not None else draw(st.one_of(st.just(""), _absolute_paths())),
        launcher=draw(st.one_of(st.just(""), st.from_regex(ID_PATTERN, fullmatch=True))),
        handoff=draw(texts()),
        key_files=draw(st.lists(key_file_paths(), max_size=3)),
        meta=meta,
        extra=draw(toml_tables(exclude=KNOWN_TOP_KEYS)),
        after=draw(st.lists(st.from_regex(ID_PATTERN, fullmatch=True).filter(_Not(meta.id)),
                            max_size=3, unique=True)),
        guarantees=draw(st.lists(guarantees(), max_size=2)),
        questions=[draw(questions(i + 1)) for i in range(draw(st.integers(0, 2)))],
        rederived=draw(st.lists(texts(), max_size=3)),
        needs=draw(st.lists(st.sampled_from(PACKAGE_PARTS), max_size=3, unique=True)),
        on_broken=draw(st.one_of(st.just(""), st.sampled_from(["reopen", "escalate"]),
                                 st.from_regex(ID_PATTERN, fullmatch=True).map("fallback:{}".format))),
        **lists,
    )
