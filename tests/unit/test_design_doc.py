"""docs/design.md is the contract as built: every test it cites exists, every CLI command is in it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from heartbeat.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)*)`")


@functools.cache
def _defined(path: Path) -> frozenset[str]:
    """Every ``Class``, ``Class::method`` and top-level ``function`` defined in a test file (parsed
    once: the design cites about a hundred files nearly four hundred times)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}::{item.name}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
    return frozenset(names)


def _cli_commands() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            return set(choices)
    raise AssertionError("the CLI parser has no subcommands")


class TestDesignDoc:
    def test_every_cited_test_exists(self) -> None:
        """A test named in docs/design.md is a real file, class and function: the promise is pinned."""
        text = DESIGN.read_text(encoding="utf-8")
        cited = _REFERENCE.findall(text)
        assert len(cited) >= 20, "docs/design.md should pin its promises to tests"
        missing = []
        for file, parts in cited:
            path = ROOT / file
            if not path.is_file():
                missing.append(file)
                continue
            name = parts.removeprefix("::")
            if name and name not in _defined(path):
                missing.append(f"{file}::{name}")
        assert not missing, f"docs/design.md cites tests that do not exist: {missing}"

    def test_every_cli_command_is_documented(self) -> None:
        """The command table names every command the CLI has, and no command it lacks."""
        text = DESIGN.read_text(encoding="utf-8")
        section = text.split("## 9. The command line", 1)[1].split("\n## ", 1)[0]
        documented = set()
        for line in section.splitlines():
            if line.startswith("| `"):
                documented.update(re.findall(r"`([a-z][a-z-]*)`", line.split("|")[1]))
        assert documented == _cli_commands()

    def test_readme_links_the_design_in_the_project(self) -> None:
        """Users have the project, not the steering repo: no link leaves it."""
        for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
            assert "../shared" not in doc.read_text(encoding="utf-8"), doc
        assert "docs/design.md" in (ROOT / "README.md").read_text(encoding="utf-8")
