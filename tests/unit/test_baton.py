"""The baton's TOML form: every valid baton round-trips; every invalid one names its field."""

from __future__ import annotations

import itertools
import tempfile
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from heartbeat.model.baton import (
    LIST_FIELDS,
    SCALAR_FIELDS,
    Baton,
    Gate,
    GateKind,
    Meta,
    Status,
    check_id,
    decision_view,
    dump_baton,
    parse_baton,
)
from heartbeat.model.errors import BadInput, InvalidBaton
from heartbeat.store.files import FileStore
from heartbeat.testing import batons, task_ids, toml_scalars, toml_values

PATH = "/state/batons/t.toml"

# Hypothesis runs are bounded so the whole file stays within a few seconds on a loaded
# 2-core CI machine; the strategies are cached, so examples are cheap to draw.
ROUND_TRIP = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROPERTY = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
STORE_ROUND_TRIP = settings(max_examples=examples(40), deadline=None,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _doc(**overrides: Any) -> dict[str, Any]:
    """A minimal valid baton document with ``overrides`` applied (``None`` deletes a key;
    dotted keys reach into ``meta``)."""
    doc: dict[str, Any] = {"task": "Fix it", "step": "Look", "meta": {"schema": 1, "id": "t", "status": "active"}}
    for key, value in overrides.items():
        parts = key.split(".")
        target = doc
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(parts[-1], None)
        else:
            target[parts[-1]] = value
    return doc


def _not_a_string(value: object) -> bool:
    return not isinstance(value, str)


def _text(doc: dict[str, Any]) -> str:
    return tomli_w.dumps(doc)


class TestRoundTrip:
    @pytest.mark.slow
    @ROUND_TRIP
    @given(batons())
    def test_dump_then_parse_is_identity_stable_and_the_same_from_bytes(self, baton: Baton) -> None:
        """Any valid baton, unknown keys and all, reads back equal after dump_baton -> parse_baton;
        dumping the parsed baton gives the same text again (a rewrite changes nothing it does not
        own); and the raw bytes the store hands parse_baton parse the same as the text. (One
        property per drawn baton: drawing a baton is most of the cost, so the three share it.)"""
        text = dump_baton(baton)
        parsed = parse_baton(text, path=PATH)
        assert parsed == baton
        assert dump_baton(parsed) == text
        assert parse_baton(text.encode("utf-8"), path=PATH) == parsed

    def test_carriage_returns_survive(self) -> None:
        """A string holding \\r\\n (a file edited on Windows) keeps its \\r through a rewrite."""
        baton = Baton(task="t", step="line one\r\nline two", constraints=["a\r\nb", "c\nd"], meta=Meta(id="t"),
                      extra={"notes": {"x": "1\r\n2"}})
        again = parse_baton(dump_baton(baton), path=PATH)
        assert again.step == "line one\r\nline two"
        assert again.constraints == ["a\r\nb", "c\nd"]
        assert again.extra == {"notes": {"x": "1\r\n2"}}

    def test_multiline_strings_are_written_readably(self) -> None:
        """A multi-line step is written as a TOML multi-line string, not one escaped line."""
        baton = Baton(task="t", step="first\nsecond", meta=Meta(id="t"))
        assert '"""\nfirst\nsecond"""' in dump_baton(baton)

    def test_known_fields_come_first_in_design_order(self) -> None:
        """The written file lists task, intent, step, ... in DESIGN.md's order, unknown keys after, meta last."""
        baton = Baton(task="t", step="s", meta=Meta(id="t"), extra={"zzz": 1, "aaa": "x"})
        lines = [line.split(" ")[0] for line in dump_baton(baton).splitlines() if " = " in line]
        assert lines[: len(SCALAR_FIELDS)] == list(SCALAR_FIELDS)
        assert lines.index("zzz") > lines.index("unknowns")
        assert dump_baton(baton).index("[meta]") > dump_baton(baton).index("aaa")

    def test_unknown_keys_everywhere_are_kept(self) -> None:
        """Unknown keys at the top, in [meta], [meta.owner], [meta.gate], nested tables and
        arrays of tables all survive a parse and a dump."""
        text = """
task = "t"
step = "s"
custom = "kept"
numbers = [1, 2.5, "three", 1979-05-27T07:32:00Z]

[[attempts]]
who = "agent-1"
when = 2026-01-01T00:00:00Z

[[attempts]]
who = "agent-2"
nested = { deep = { deeper = [true, false] } }

[tool.thing]
setting = "on"

[meta]
schema = 1
id = "t"
status = "blocked"
vendor_field = 7

[meta.owner]
pid = 12
host = "h"
lease = "abc"

[meta.gate]
kind = "file"
target = "/tmp/flag"
note = "someone's"
"""
        baton = parse_baton(text, path=PATH, expected_id="t")
        assert baton.extra["custom"] == "kept"
        assert baton.extra["attempts"][1]["nested"] == {"deep": {"deeper": [True, False]}}
        assert baton.extra["tool"] == {"thing": {"setting": "on"}}
        assert baton.meta.extra == {"vendor_field": 7}
        assert baton.meta.owner is not None and baton.meta.owner.extra == {"lease": "abc"}
        assert baton.meta.gate == Gate(GateKind.FILE, "/tmp/flag", extra={"note": "someone's"})
        again = tomllib.loads(dump_baton(baton))
        original = tomllib.loads(text)
        for key in ("custom", "numbers", "attempts", "tool"):
            assert again[key] == original[key]
        assert again["meta"]["vendor_field"] == 7
        assert again["meta"]["owner"]["lease"] == "abc"
        assert again["meta"]["gate"]["note"] == "someone's"

    def test_blocked_without_gate_reads_as_human_gate(self) -> None:
        """A blocked baton whose [meta.gate] is missing (a hand edit) is held by a human gate."""
        baton = parse_baton(_text(_doc(**{"meta.status": "blocked"}, blocked_on="x")), path=PATH)
        assert baton.meta.gate == Gate(GateKind.HUMAN)

    def test_string_times_and_naive_times_are_utc(self) -> None:
        """Meta times written as text or without an offset (a hand edit) read as aware UTC instants."""
        doc = _doc(**{"meta.updated_at": "2026-11-29T06:59:00Z", "meta.created_at": datetime(2026, 1, 1, 12)})
        meta = parse_baton(_text(doc), path=PATH).meta
        assert meta.updated_at == datetime(2026, 11, 29, 6, 59, tzinfo=UTC)
        assert meta.created_at == datetime(2026, 1, 1, 12, tzinfo=UTC)

    def test_missing_optional_fields_default(self) -> None:
        """A baton with only task and step is valid: lists empty, strings empty, status active, revision 0."""
        baton = parse_baton('task = "t"\nstep = "s"\n', path=PATH, expected_id="t")
        assert baton.meta.id == "t" and baton.status is Status.ACTIVE and baton.meta.revision == 0
        assert all(getattr(baton, name) == [] for name in LIST_FIELDS)
        assert baton.intent == "" and baton.blocked_on == ""


@pytest.fixture(scope="module")
def round_trip_store() -> Iterator[tuple[FileStore, Path]]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp, "state")
        state.mkdir(mode=0o700)
        workdir = Path(tmp, "work")
        workdir.mkdir()
        store = FileStore(str(state))
        yield store, workdir
        store.close()


_ids = itertools.count()


class TestStoreRoundTrip:
    @STORE_ROUND_TRIP
    @given(st.data())
    def test_create_then_load_is_equal(self, round_trip_store: tuple[FileStore, Path], data: st.DataObject) -> None:
        """A baton created through the FileStore loads back equal to what create returned."""
        store, workdir = round_trip_store
        task_id = f"rt-{next(_ids)}"
        baton = data.draw(batons(task_id, workdir=str(workdir)))
        written = store.create(baton)
        assert store.load(task_id) == written
        assert written.meta.revision == 1

    @STORE_ROUND_TRIP
    @given(st.data())
    def test_edit_writes_exactly_the_edited_baton(self, round_trip_store: tuple[FileStore, Path],
                                                  data: st.DataObject) -> None:
        """Whatever an edit puts in the baton (unknown keys, unicode, multi-line text) is what the next load reads."""
        store, workdir = round_trip_store
        task_id = f"rt-{next(_ids)}"
        store.create(Baton(task="t", step="s", meta=Meta(id=task_id)))
        replacement = data.draw(batons(task_id, workdir=str(workdir)))
        with store.edit(task_id) as ed:
            ed.baton = replacement
        loaded = store.load(task_id)
        assert loaded == ed.baton
        assert loaded.meta.revision == 2
        assert loaded.extra == replacement.extra and loaded.meta.extra == replacement.meta.extra


# Every known field with a value of the wrong type, and the one line that must name it.
WRONG_TYPES = [
    ({"step": 3}, "step: expected a string, got 3"),
    ({"task": True}, "task: expected a string, got a boolean true"),
    ({"task": None}, "task: missing (required)"),
    ({"step": "  "}, "step: must not be empty"),
    ({"intent": ["a"]}, "intent: expected a string, got a list"),
    ({"next_step": {"a": 1}}, "next_step: expected a string, got a table"),
    ({"key_files": "src.py"}, "key_files: expected a list of strings, got a string 'src.py'"),
    ({"done": ["ok", 2]}, "done[1]: expected a string, got 2"),
    ({"constraints": [1.5]}, "constraints[0]: expected a string, got 1.5"),
    ({"key_files": [""]}, "key_files[0]: must be a non-empty path"),
    ({"workdir": "relative/dir"}, "workdir: must be an absolute path"),
    ({"launcher": "Not A Name"}, "launcher: bad launcher name"),
    ({"meta": "x"}, "meta: expected a table, got a string 'x'"),
    ({"meta.schema": 2}, "meta.schema: written by a newer heartbeat (schema 2"),
    ({"meta.schema": 0}, "meta.schema: unknown schema 0"),
    ({"meta.schema": "1"}, "meta.schema: expected an integer, got a string '1'"),
    ({"meta.id": "other"}, "meta.id: is 'other' but the file is named for 't'"),
    ({"meta.status": "running"}, "meta.status: unknown status 'running'"),
    ({"meta.status": "invalid"}, "meta.status: unknown status 'invalid'"),
    ({"meta.revision": -1}, "meta.revision: must not be negative, got -1"),
    ({"meta.epoch": "3"}, "meta.epoch: expected an integer, got a string '3'"),
    ({"meta.attempt": 1.0}, "meta.attempt: expected an integer, got 1.0"),
    ({"meta.updated_at": "yesterday"}, "meta.updated_at: expected a date-time, got a string 'yesterday'"),
    ({"meta.last_exit": "1"}, "meta.last_exit: expected an integer"),
    ({"meta.owner": 5}, "meta.owner: expected a table, got 5"),
    ({"meta.owner.pid": "12"}, "meta.owner.pid: expected an integer, got a string '12'"),
    ({"meta.owner.create_time": "now"}, "meta.owner.create_time: expected a number"),
    ({"meta.gate.kind": "magic"}, "meta.gate.kind: unknown gate kind 'magic'"),
    ({"meta.world.src": 1}, "meta.world.src: expected a string, got 1"),
]


class TestInvalid:
    @pytest.mark.parametrize(("overrides", "expected"), WRONG_TYPES, ids=[m.split(":")[0] for _, m in WRONG_TYPES])
    def test_wrong_type_names_file_and_field(self, overrides: dict[str, Any], expected: str) -> None:
        """A wrong value fails with InvalidBaton: one line, the file's path, then the field and what is wrong."""
        with pytest.raises(InvalidBaton) as info:
            parse_baton(_text(_doc(**overrides)), path=PATH, expected_id="t")
        message = str(info.value)
        assert message.startswith(f"{PATH}: "), message
        assert expected in message
        assert "\n" not in message
        assert info.value.exit_code == 2

    @PROPERTY
    @given(batons(), st.sampled_from(SCALAR_FIELDS), toml_values().filter(_not_a_string))
    def test_any_non_string_in_a_string_field_is_refused(self, baton: Baton, name: str, value: Any) -> None:
        """Whatever non-string value lands in a string field, parsing names that field."""
        doc = tomllib.loads(dump_baton(baton))
        doc[name] = value
        with pytest.raises(InvalidBaton) as info:
            parse_baton(tomli_w.dumps(doc), path=PATH)
        assert f"{PATH}: {name}: expected a string" in str(info.value)

    @PROPERTY
    @given(batons(), st.sampled_from(LIST_FIELDS), st.integers(0, 3), toml_scalars().filter(_not_a_string))
    def test_any_non_string_in_a_list_field_names_the_item(self, baton: Baton, name: str, index: int, value: Any) -> None:
        """A non-string item in a list field is refused naming the list and the item's index."""
        doc = tomllib.loads(dump_baton(baton))
        items = ["x"] * index + [value]
        doc[name] = items
        with pytest.raises(InvalidBaton) as info:
            parse_baton(tomli_w.dumps(doc), path=PATH)
        assert f"{name}[{index}]: expected a string" in str(info.value)

    @pytest.mark.parametrize("text", ["task = ", "task = 'a'\ntask = 'b'", "[meta\n", "step = \"\"\"open", "= 1"])
    def test_not_toml(self, text: str) -> None:
        """Text that is not TOML fails with one line naming the file and the parser's complaint."""
        with pytest.raises(InvalidBaton) as info:
            parse_baton(text, path=PATH)
        assert str(info.value).startswith(f"{PATH}: not valid TOML")
        assert "\n" not in str(info.value)

    def test_not_utf8(self) -> None:
        """Bytes that are not UTF-8 fail naming the byte offset."""
        with pytest.raises(InvalidBaton, match=r"not UTF-8 text \(byte 8\)"):
            parse_baton(b'task = "\xff"', path=PATH)

    def test_deep_nesting_is_refused_not_a_crash(self) -> None:
        """A pathologically nested document is an InvalidBaton, not a RecursionError."""
        with pytest.raises(InvalidBaton, match="not valid TOML"):
            parse_baton("x = " + "[" * 100_000 + "]" * 100_000, path=PATH)

    @ROUND_TRIP
    @given(st.text(max_size=200))
    def test_any_text_either_parses_or_is_invalid(self, text: str) -> None:
        """No input makes parse_baton raise anything but InvalidBaton, and its message is one line."""
        try:
            parse_baton(text, path=PATH)
        except InvalidBaton as exc:
            assert "\n" not in str(exc)

    def test_message_from_file_content_stays_on_one_line(self) -> None:
        """A bad value holding newlines does not break the error onto several lines."""
        with pytest.raises(InvalidBaton) as info:
            parse_baton(_text(_doc(**{"meta.status": "a\nb\nc"})), path=PATH)
        assert "\n" not in str(info.value)


class TestIds:
    @given(task_ids())
    def test_valid_ids_pass(self, task_id: str) -> None:
        """Every id the pattern allows is accepted."""
        assert check_id(task_id) == task_id

    @pytest.mark.parametrize("bad", ["", "A", "-x", ".x", "_x", "a/b", "a b", "../x", "x" * 65, "é", "a\n", 3, None])
    def test_bad_ids_are_refused(self, bad: object) -> None:
        """Upper case, a leading punctuation mark, slashes, spaces, >64 chars and non-strings are refused."""
        with pytest.raises(BadInput, match="bad task id"):
            check_id(bad)

    @pytest.mark.parametrize("spec", ["human", "file:/tmp/x", "time:2026-11-29T06:59:00Z", "task:other", "check:ci"])
    def test_gate_specs_round_trip(self, spec: str) -> None:
        """Every gate kind parses from its CLI form and renders back to it."""
        gate = Gate.parse(spec)
        assert Gate.parse(gate.spec()) == gate
        assert gate.kind.value == spec.split(":")[0]

    @pytest.mark.parametrize(("spec", "message"), [
        ("door", "bad gate"), ("human:x", "takes no target"), ("file:", "needs a target"),
        ("file:relative", "absolute path"), ("time:soon", "bad time"), ("task:Bad", "bad task id"),
    ])
    def test_bad_gate_specs(self, spec: str, message: str) -> None:
        """A malformed gate is refused with what a good one looks like."""
        with pytest.raises(BadInput, match=message):
            Gate.parse(spec)


class TestDecisionView:
    def test_a_view_keeps_what_decisions_read_and_drops_the_prose(self) -> None:
        """A decision view keeps meta, step, blocked_on, workdir, launcher, after, on_broken; none of the prose."""
        meta = Meta(id="t1", status=Status.BLOCKED, revision=4, gate=Gate(GateKind.FILE, "/tmp/go"))
        full = Baton(task="Ship it", step="build", intent="why", blocked_on="the build", workdir="/srv/x",
                     launcher="claude", after=["up"], on_broken="reopen", plan=["build", "ship"], done=["read"],
                     constraints=["no prod"], extra={"mine": 1}, meta=meta)
        view = decision_view(full)
        assert (view.step, view.blocked_on, view.workdir, view.launcher, view.after, view.on_broken) == \
            ("build", "the build", "/srv/x", "claude", ["up"], "reopen")
        assert view.meta is full.meta
        assert (view.task, view.intent, list(view.plan), list(view.done), list(view.constraints), view.extra) == \
            ("", "", [], [], [], {})
        with pytest.raises(AttributeError):
            view.plan.append("more")  # one shared empty tuple: a view is never written to

    def test_a_store_with_a_view_lists_views_and_loads_whole_batons(self, tmp_path: Path) -> None:
        """A file store built with a scan view lists views; load and edit still give the whole baton."""
        store = FileStore(str(tmp_path / "state"), scan_view=decision_view)
        try:
            store.create(Baton(task="Ship it", step="build", plan=["build"], meta=Meta(id="t1")))
            (entry,) = store.scan()
            assert entry.baton is not None and entry.baton.task == "" and entry.baton.step == "build"
            assert store.load("t1").task == "Ship it" and store.load("t1").plan == ["build"]
            with store.edit("t1") as ed:
                ed.baton.step = "ship"
            assert store.load("t1").plan == ["build"]
            (entry,) = store.scan(only=["t1"])
            assert entry.baton is not None and entry.baton.step == "ship" and entry.baton.task == ""
        finally:
            store.close()
