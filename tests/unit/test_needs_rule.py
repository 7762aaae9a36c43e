"""The needs of an edge as pure rules (heartbeat/tasks/needs.py): the learning rule as a table of
cases, the fold of declared parts and ``need_*`` events, a re-derived item's part, an edge's role."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from heartbeat.model.errors import BadInput
from heartbeat.model.ledger import Event, EventKind
from heartbeat.tasks.needs import Lost, NeedSource, edge_role, effective, learned_parts, parse_parts, part_of

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def _h(minute: int, rederived: str = "", missing: str = "") -> Lost:
    return Lost(T0 + timedelta(minutes=minute), frozenset(p for p in rederived.split(",") if p),
                frozenset(p for p in missing.split(",") if p))


LEARNING_CASES = [
    # (what it pins, handoffs, after, window, sources, since minute per part, needed, expected)
    ("no handoff teaches nothing", [], 2, 3, ("rederived",), {}, (), {}),
    ("one loss of two required is not enough", [_h(1, "rejected"), _h(2)], 2, 3, ("rederived",), {}, (), {}),
    ("two of the last three", [_h(1, "rejected"), _h(2), _h(3, "rejected")], 2, 3, ("rederived",), {}, (),
     {"rejected": (2, 3)}),
    ("two of two when only two exist", [_h(1, "rejected"), _h(2, "rejected")], 2, 3, ("rederived",), {}, (),
     {"rejected": (2, 2)}),
    ("losses outside the window do not count",
     [_h(1, "rejected"), _h(2, "rejected"), _h(3), _h(4), _h(5)], 2, 3, ("rederived",), {}, (), {}),
    ("handoffs are ordered by time, not by list order",
     [_h(5), _h(1, "rejected"), _h(4, "rejected"), _h(3, "rejected")], 2, 2, ("rederived",), {}, (), {}),
    ("a missing part teaches nothing by default", [_h(1, missing="unknowns"), _h(2, missing="unknowns")],
     2, 3, ("rederived",), {}, (), {}),
    ("with learn_from missing, an empty part teaches", [_h(1, missing="unknowns"), _h(2, missing="unknowns")],
     2, 3, ("rederived", "missing"), {}, (), {"unknowns": (2, 2)}),
    ("a part already needed is not learned again", [_h(1, "rejected"), _h(2, "rejected")], 2, 3,
     ("rederived",), {}, ("rejected",), {}),
    ("a drop is not overturned by the evidence it was dropped against",
     [_h(1, "rejected"), _h(2, "rejected")], 2, 3, ("rederived",), {"rejected": 2}, (), {}),
    ("after a drop, fresh evidence teaches again",
     [_h(1, "rejected"), _h(2, "rejected"), _h(3, "rejected"), _h(4, "rejected")], 2, 3, ("rederived",),
     {"rejected": 2}, (), {"rejected": (2, 2)}),
    ("each part on its own", [_h(1, "rejected,decisions"), _h(2, "decisions")], 2, 3, ("rederived",), {}, (),
     {"decisions": (2, 2)}),
    ("K of one, a window of one", [_h(1, "intent")], 1, 1, ("rederived",), {}, (), {"intent": (1, 1)}),
]


class TestLearningRule:
    @pytest.mark.parametrize(("handoffs", "after", "window", "sources", "since", "needed", "expected"),
                             [case[1:] for case in LEARNING_CASES], ids=[case[0] for case in LEARNING_CASES])
    def test_the_rule(self, handoffs: list[Lost], after: int, window: int, sources: tuple[str, ...],
                      since: dict[str, int], needed: tuple[str, ...], expected: dict[str, tuple[int, int]]) -> None:
        """A part is learned when at least K of the role's last N handoffs (after its last need event) lost it."""
        stamps = {part: T0 + timedelta(minutes=m) for part, m in since.items()}
        assert learned_parts(handoffs, after=after, window=window, sources=sources, since=stamps,
                             needed=needed) == expected


def _event(kind: EventKind, part: str, minute: int, **data: str) -> Event:
    return Event(task="p.review", kind=kind, ts=T0 + timedelta(minutes=minute), actor="ann",
                 data={"role": "*.build->*.review", "part": part, **data})


class TestEffectiveNeeds:
    def test_declared_alone(self) -> None:
        """With no event, the declared parts are the needs, in the package's order."""
        found = effective(["rejected", "decisions"], [])
        assert [(n.part, n.source) for n in found] == [("decisions", NeedSource.DECLARED),
                                                        ("rejected", NeedSource.DECLARED)]

    def test_learned_then_pinned_then_dropped(self) -> None:
        """For each part the latest event decides: learned, pinned (by whom), dropped (gone, even declared)."""
        events = [_event(EventKind.NEED_LEARNED, "rejected", 1, evidence="review re-derived `rejected` ..."),
                  _event(EventKind.NEED_PINNED, "key_files", 2, by="ann"),
                  _event(EventKind.NEED_DROPPED, "decisions", 3, by="bob")]
        found = {n.part: n for n in effective(["decisions"], events)}
        assert set(found) == {"rejected", "key_files"}
        assert found["rejected"].source is NeedSource.LEARNED
        assert found["rejected"].evidence.startswith("review re-derived")
        assert found["key_files"].describe() == "pinned: pinned by ann"

    def test_a_pin_after_a_drop_brings_it_back(self) -> None:
        """A drop holds until a later pin or a later learning."""
        events = [_event(EventKind.NEED_DROPPED, "rejected", 1), _event(EventKind.NEED_PINNED, "rejected", 2)]
        assert [n.part for n in effective([], events)] == ["rejected"]

    def test_an_event_naming_no_part_is_ignored(self) -> None:
        """A hand-written or newer event with an unknown part changes nothing."""
        assert effective([], [_event(EventKind.NEED_PINNED, "<script>", 1)]) == []


class TestWords:
    @pytest.mark.parametrize(("item", "part"), [
        ("rejected: the upstream had tried Redis", "rejected"),
        ("`decisions`: which TTL", "decisions"),
        ("Key-Files: which module", "key_files"),
        ("  unknowns : the flaky test", "unknowns"),
        ("re-read the whole diff", ""),
        ("cache: which one", ""),
        ("", ""),
    ])
    def test_a_rederived_item_names_its_part_by_a_prefix(self, item: str, part: str) -> None:
        """``PART: ...`` counts for PART; anything else counts for no part."""
        assert part_of(item) == part

    @pytest.mark.parametrize(("up", "down", "role"), [
        ("p1.build", "p1.review", "*.build->*.review"),
        ("p2.build", "p2.review", "*.build->*.review"),
        ("a.b.build", "a.b.review", "*.build->*.review"),
        ("build", "review", "build->review"),
        ("p1.build", "p2.review", "p1.build->p2.review"),
    ])
    def test_an_edge_role_recurs_across_pipeline_runs(self, up: str, down: str, role: str) -> None:
        """Two stages of one pipeline are their stage names; any other pair is its ids."""
        assert edge_role(up, down) == role

    def test_parts_are_checked(self) -> None:
        """``a,b`` splits; a repeat is kept once; an unknown part is one line naming the valid ones."""
        assert parse_parts(["rejected,decisions", "rejected"]) == ["rejected", "decisions"]
        with pytest.raises(BadInput) as info:
            parse_parts(["rejected,reasons"])
        assert "'reasons'" in str(info.value) and "key_files" in str(info.value)
        assert "\n" not in str(info.value)
