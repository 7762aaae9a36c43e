"""The ledger's event kinds are one vocabulary: :class:`heartbeat.model.ledger.EventKind`.

Read from the source with :mod:`ast`, never by importing it: wherever heartbeat writes or reads an
event's kind, it names an ``EventKind`` member, not a bare string that a typo or a rename would
silently turn into a kind no reader knows. And every member is used somewhere outside its class.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat.model.baton import Status
from heartbeat.model.ledger import EventKind

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "heartbeat"
KINDS = {kind.value for kind in EventKind}
STATUSES = {status.value for status in Status}
"""A baton's statuses share words with the event kinds (done, blocked...): a table of those alone is a status table."""

EXEMPT: set[str] = set()
"""Modules not scanned (none: retention.py joined the scan once its rewrite was merged)."""


def _is_kind(node: ast.AST) -> bool:
    """``x.kind``, ``x["kind"]``, a name ``kind`` or ``kinds``/``*_KINDS``: an expression holding event kinds."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Name):
        return node.id in ("kind", "kinds") or node.id.upper().endswith("_KINDS")
    return False


WRITERS = {"Event": 1, "event": 0, "record": 0}
"""Calls that take an event kind positionally, and where: ``Event(task, kind)``, a writer's
``ed.event(kind, **data)``, the hook's ``record(kind, **data)``."""


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _bare(node: ast.AST | None) -> Iterator[ast.Constant]:
    """The bare kind strings in ``node``: itself, or the elements of a tuple, list, set or frozenset(...)."""
    if isinstance(node, ast.Constant) and node.value in KINDS:
        yield node
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _bare(element)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
        for arg in node.args:
            yield from _bare(arg)


def bare_kinds(source: str) -> Iterator[tuple[int, str]]:
    """(line, literal) of every bare kind string compared with, assigned to or passed as an event kind."""
    tree = ast.parse(source)
    module_level = {id(node) for node in tree.body}  # not an enum's own members
    for node in ast.walk(tree):
        found: list[ast.AST | None] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(side) for side in sides):
                found.extend(sides)
        elif isinstance(node, ast.keyword) and node.arg in ("kind", "kinds"):
            found.append(node.value)
        elif isinstance(node, ast.Call) and _callee(node) in WRITERS and len(node.args) > WRITERS[_callee(node)]:
            found.append(node.args[WRITERS[_callee(node)]])
        elif isinstance(node, ast.Dict):
            found.extend(value for key, value in zip(node.keys, node.values, strict=True)
                         if isinstance(key, ast.Constant) and key.value == "kind")
            keys = [key.value for key in node.keys if isinstance(key, ast.Constant)]
            if len(keys) == len(node.keys) >= 2 and set(keys) <= KINDS and not set(keys) <= STATUSES:
                found.extend(node.keys)  # a table keyed by event kind
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_kind(target) for target in targets):
                found.append(node.value)
            elif (id(node) in module_level and isinstance(node.value, ast.Constant) and any(isinstance(target, ast.Name)
                  and target.id.lower() == node.value.value for target in targets)):
                found.append(node.value)  # a constant restating a kind: HANDED_OFF = "handed_off"
        for expression in found:
            for constant in _bare(expression):
                yield constant.lineno, constant.value


def _modules() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name not in EXEMPT:
            yield name, path.read_text(encoding="utf-8")


class TestEventKinds:
    def test_no_bare_kind_strings(self) -> None:
        """No module compares, assigns or passes an event kind as a bare string."""
        found = [f"{name}:{line}: {value!r} (EventKind.{EventKind(value).name})"
                 for name, source in _modules() for line, value in bare_kinds(source)]
        assert not found, "\n".join(found)

    @pytest.mark.parametrize("source", [
        'e.kind == "done"', 'if "touched" != event.kind: pass', 'x = e.kind in ("claimed", "created")',
        'Event(task="t", kind="archived", ts=now)', 'ledger.events(kinds=["escalated"])',
        '_MARK_KINDS = frozenset({"session_started"})', 'doc = {"kind": "created"}', 'kind = "exited"',
        'row["kind"] == "stalled"', 'ed.event("stalled", why="x")', 'record("stop_blocked")',
        'Event("t", "touched", now)', 'HANDED_OFF = "handed_off"', 'KEYS = {"dispatched": 1, "exited": 2}',
    ])
    def test_the_scan_finds_each_form(self, source: str) -> None:
        """Each form a bare kind takes is found (so the scan above cannot pass by seeing nothing)."""
        assert list(bare_kinds(source))

    @pytest.mark.parametrize("source", [
        'e.kind == EventKind.DONE', 'baton.meta.status == "done"', 'owner.kind == "pid"',
        'log.info("exited", kind=kind.value)', 'ORDER = {"blocked": 1, "done": 2}', 'DONE = "finished"',
    ])
    def test_the_scan_leaves_the_rest(self, source: str) -> None:
        """Statuses, other kinds of thing and members are not event-kind literals."""
        assert not list(bare_kinds(source.replace('kind=kind.value', 'code=1')))

    def test_every_member_is_used(self) -> None:
        """Every EventKind member is named somewhere in the package besides its own definition."""
        used = {node.attr for _, source in _modules() for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "EventKind"}
        unused = sorted(kind.name for kind in EventKind if kind.name not in used)
        assert not unused, unused
