"""One home per mechanism, read from the source with :mod:`ast`: every timeout and interval in
:mod:`heartbeat.model.defaults`, every whole-file atomic write through :mod:`heartbeat.system.safefile`.

Each names its documented exceptions (the fast paths that may import nothing more), and each of those
is pinned: a copy of a default is equal to it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat.hotpath import pulse
from heartbeat.launchers import shim
from heartbeat.model import defaults

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "heartbeat"

TIME_NAME = re.compile(r"TIMEOUT|GRACE|INTERVAL|WAIT|RETRY|SKEW|EVERY|SECONDS|DELAY|AFTER|TTL|PERIOD|LISTEN")
"""A module-level name that holds a duration."""

TIME_COPIES = {
    ("heartbeat/hotpath/pulse.py", "FUTURE_SKEW"): defaults.PULSE_FUTURE_SKEW,
    ("heartbeat/launchers/shim.py", "STOP_GRACE"): defaults.STOP_GRACE,
}
"""Durations a fast path holds as its own literal, because it loads nothing from heartbeat (the
shim runs as a plain script) or only itself (an agent's touch): each equals its default."""


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _number(node: ast.expr) -> bool:
    """A literal number, or arithmetic on literal numbers only (``6 * 3600.0``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    return False


def time_literals(tree: ast.Module) -> Iterator[str]:
    """Module-level names of durations given as a literal number."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and TIME_NAME.search(target.id.upper()) and value and _number(value):
                yield target.id


class TestTimeoutsHaveOneHome:
    def test_no_duration_literal_outside_defaults(self) -> None:
        """No module but defaults.py names a duration as a literal number (beyond the pinned copies)."""
        found = [f"{name}: {constant}" for name, tree in _sources() if name != "heartbeat/model/defaults.py"
                 for constant in time_literals(tree) if (name, constant) not in TIME_COPIES]
        assert not found, found

    def test_the_copies_equal_their_defaults(self) -> None:
        """The pulse's and the shim's own copies are the defaults' values."""
        assert pulse.FUTURE_SKEW == defaults.PULSE_FUTURE_SKEW
        assert shim.STOP_GRACE == defaults.STOP_GRACE
        sources = dict(_sources())
        for (name, constant) in TIME_COPIES:
            assert constant in set(time_literals(sources[name])), (name, constant)

    @pytest.mark.parametrize(("source", "found"), [
        ("REPLY_TIMEOUT = 75.0", ["REPLY_TIMEOUT"]), ("_STOP_WAIT: float = 2.0", ["_STOP_WAIT"]),
        ("MAX_LIMIT_WAIT = 6 * 3600.0", ["MAX_LIMIT_WAIT"]), ("X = defaults.TICK", []), ("MAX_PATH = 107", []),
        ("def f():\n    TIMEOUT = 3\n", []),
    ])
    def test_the_scan(self, source: str, found: list[str]) -> None:
        """The scan finds module-level literal durations, not references to defaults or other numbers."""
        assert list(time_literals(ast.parse(source))) == found


REPLACE_BY_HAND = {"heartbeat/launchers/shim.py"}
"""Modules that rename a temp file over another by hand, beside safefile.py: the shim alone, which
imports nothing from heartbeat (documented in safefile.py's docstring and docs/design.md)."""


def renames(tree: ast.Module) -> Iterator[int]:
    """Lines of ``os.replace``/``os.rename``/``os.renames`` calls and of ``from os import`` any of them."""
    names = {"replace", "rename", "renames"}
    for node in ast.walk(tree):
        by_attribute = (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
                        and node.value.id == "os")
        by_import = isinstance(node, ast.ImportFrom) and node.module == "os" and bool(
            {alias.name for alias in node.names} & names)
        if by_attribute or by_import:
            yield node.lineno


class TestWholeFileWritesHaveOneHome:
    def test_no_rename_outside_safefile(self) -> None:
        """No module but safefile.py (and the documented shim) renames a file into place by hand."""
        found = [f"{name}:{line}" for name, tree in _sources()
                 if name != "heartbeat/system/safefile.py" and name not in REPLACE_BY_HAND for line in renames(tree)]
        assert not found, found

    def test_the_exception_is_documented(self) -> None:
        """Each hand-rolled writer left is named in safefile.py's docstring and in docs/design.md."""
        from heartbeat.system import safefile

        design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
        for name in REPLACE_BY_HAND:
            module = name.removesuffix(".py").replace("/", ".")
            assert module in (safefile.__doc__ or ""), module
            assert name in design, name
        assert list(renames(ast.parse((ROOT / "heartbeat/launchers/shim.py").read_text()))), "the shim still renames"

    @pytest.mark.parametrize(("source", "count"), [
        ("os.replace(a, b)", 1), ("os.rename(a, b, src_dir_fd=d)", 1), ("from os import replace", 1),
        ("s.replace('a', 'b')", 0), ("path.rename(x)", 0),
    ])
    def test_the_scan(self, source: str, count: int) -> None:
        """The scan finds os's renames, not str.replace or anything else named so."""
        assert len(list(renames(ast.parse(source)))) == count


READ_BY_HAND = {
    "heartbeat/launchers/shim.py": 4,
    "heartbeat/hotpath/pulse.py": 2,
    "heartbeat/launchers/liveness.py": 1,
    "heartbeat/cli/state.py": 1,
    "heartbeat/ops/demo.py": 2,
    "heartbeat/toyagent.py": 1,
}
"""Modules that open a file for reading by hand, beside safefile.py, and how many times: the shim
(a plain script that imports nothing from heartbeat: ``/proc`` and its lease file), the pulse (an
agent's touch imports nothing more), the liveness check (``/proc/<pid>/stat`` and ``/proc/stat``, the kernel's), ``heartbeat
import FILE`` (a file the human names, streamed, a pipe such as ``<(zcat export.gz)`` included), the demo
and the toy agent (their own files in their own temp dir). Documented in safefile.py's docstring and
docs/design.md."""

_WRITE_FLAGS = ("WRONLY", "RDWR", "CREAT", "DIR")
"""Words in an ``os.open`` flags expression that make it a write, a lock or a directory, not a read."""


def _argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def reads(tree: ast.Module) -> Iterator[int]:
    """Lines of ``os.open`` calls whose flags neither write, create nor open a directory, and of
    builtin ``open`` calls whose mode (when a literal) neither writes nor appends."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "open" and isinstance(func.value, ast.Name) \
                and func.value.id == "os":
            flags = _argument(node, 1, "flags")
            if flags is None or not any(word in ast.unparse(flags) for word in _WRITE_FLAGS):
                yield node.lineno
        elif isinstance(func, ast.Name) and func.id == "open":
            mode = _argument(node, 1, "mode")
            if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+")):
                yield node.lineno


class TestReadsOfPlantedFilesHaveOneHome:
    def test_no_read_by_hand_outside_safefile(self) -> None:
        """No module but safefile.py (and the pinned exceptions) opens a file for reading by hand: a
        FIFO, a symlink or a huge file where heartbeat reads is refused the same way everywhere."""
        found = {name: len(list(reads(tree))) for name, tree in _sources() if name != "heartbeat/system/safefile.py"}
        unexpected = {name: count for name, count in found.items() if count and name not in READ_BY_HAND}
        assert not unexpected, unexpected
        assert {name: found.get(name, 0) for name in READ_BY_HAND} == READ_BY_HAND

    def test_the_exceptions_are_documented(self) -> None:
        """Each hand-rolled reader left is named in safefile.py's docstring and in docs/design.md."""
        from heartbeat.system import safefile

        design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
        for name in READ_BY_HAND:
            module = name.removesuffix(".py").replace("/", ".")
            assert module in (safefile.__doc__ or ""), module
            assert name in design, name

    @pytest.mark.parametrize(("source", "count"), [
        ("os.open(p, os.O_RDONLY | os.O_NONBLOCK)", 1), ("os.open(p, _READ, dir_fd=d)", 1),
        ("open(p)", 1), ("open(p, 'rb')", 1), ("open(p, encoding='utf-8')", 1), ("open(p, mode)", 1),
        ("os.open(p, os.O_WRONLY | os.O_CREAT)", 0), ("os.open(p, os.O_RDWR)", 0), ("os.open(d, _DIR_FLAGS)", 0),
        ("open(p, 'w')", 0), ("open(p, mode='ab')", 0), ("gzip.open(p)", 0), ("os.fdopen(fd, 'rb')", 0),
    ])
    def test_the_scan(self, source: str, count: int) -> None:
        """The scan finds reads by ``os.open`` and ``open``, not writes, locks, directories or other opens."""
        assert len(list(reads(ast.parse(source)))) == count
