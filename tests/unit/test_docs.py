"""The README is a front door and docs/ holds the rest, by reader: every doc is linked, every link lands.

Also: every TOML example the docs show parses as what it claims to be (a config or a
pipeline file), so a reader who copies one gets no error.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from heartbeat.config.load import parse_config
from heartbeat.tasks.pipeline import parse_pipeline

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 300

# The README's reader table: each of these must be linked from it and exist.
BY_READER = ["using", "agents", "pipelines", "operating", "systemd", "design", "threat-model", "development"]

FIRST_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/heartbeat demo",
    "bash scripts/test",
]

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose_and_blocks(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The lines outside fenced code blocks, and each block as (info string, body)."""
    prose: list[str] = []
    blocks: list[tuple[str, str]] = []
    info: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if _FENCE.match(line):
            if info is None:
                info, body = line[3:].strip(), []
            else:
                blocks.append((info, "\n".join(body) + "\n"))
                info = None
            continue
        (prose if info is None else body).append(line)
    assert info is None, "an unclosed code fence"
    return prose, blocks


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, -N for repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose_and_blocks(path.read_text(encoding="utf-8"))[0]:
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(path: Path) -> list[str]:
    prose = _prose_and_blocks(path.read_text(encoding="utf-8"))[0]
    # Inline code may show link syntax as an example; it is not a link.
    return [m.group(1) for line in prose for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line))]


class TestReadme:
    def test_it_is_a_front_door(self) -> None:
        """At most 300 lines: what it is, why, the two commands, a walk-through, the config, links."""
        lines = README.read_text(encoding="utf-8").splitlines()
        assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move sections to docs/"

    def test_it_starts_with_the_two_commands(self) -> None:
        """The first code block is the install + demo line, then the test line, exactly."""
        blocks = _prose_and_blocks(README.read_text(encoding="utf-8"))[1]
        first = [line.split("#", 1)[0].strip() for line in blocks[0][1].splitlines()]
        assert first == FIRST_COMMANDS

    def test_the_paragraph_under_the_commands_carries_no_figures(self) -> None:
        """Test counts and timings live in docs/development.md, once; the README points there."""
        text = README.read_text(encoding="utf-8")
        intro = text.split("```", 2)[2].split("\n## ", 1)[0]
        assert not re.search(r"\d[\d,]* tests", intro), intro
        assert not re.search(r"\d+ min|\d+ s\b", intro), intro
        assert "docs/development.md" in intro

    def test_it_links_every_doc_by_reader(self) -> None:
        """Each doc a reader needs exists and is linked; no doc in docs/ is left unlinked."""
        linked = {link.split("#", 1)[0] for link in _links(README)}
        for name in BY_READER:
            assert (ROOT / "docs" / f"{name}.md").is_file(), name
            assert f"docs/{name}.md" in linked, f"README.md does not link docs/{name}.md"
        orphans = [doc.name for doc in DOCS if f"docs/{doc.name}" not in linked]
        assert not orphans, f"docs the README does not link: {orphans}"


def _broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for link in _links(doc):
        if re.match(r"[a-z][a-z+.-]*:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.is_relative_to(root) or not path.exists():
            broken.append(f"{link}: no such file in the project")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(root)}")
    return broken


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_land(doc: Path) -> None:
    """Every relative link names a file in the project (never ../shared), and every #anchor a heading."""
    broken = _broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_the_link_check_sees_what_a_reader_would_hit(tmp_path: Path) -> None:
    """A missing file, a missing heading, a link out of the project: each is reported; code is not a link."""
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True)
    (project / "docs" / "b.md").write_text("# B\n\n## Running Claude Code / Codex\n\n```\n## Not a heading\n```\n")
    (project / "README.md").write_text(
        "[ok](docs/b.md#running-claude-code--codex) [gone](docs/c.md) [anchor](docs/b.md#not-a-heading)\n"
        "[out](../shared/x.md) [web](https://example.org/) `[code](nowhere.md)`\n"
        "```\n[block](nowhere.md)\n```\n"
    )
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "x.md").write_text("x\n")
    assert _broken_links(project / "README.md", project.resolve()) == [
        "docs/c.md: no such file in the project",
        "docs/b.md#not-a-heading: no heading #not-a-heading in docs/b.md",
        "../shared/x.md: no such file in the project",
    ]


def _toml_examples() -> list[tuple[str, str]]:
    found = []
    for doc in [README, *DOCS]:
        for n, (info, body) in enumerate(_prose_and_blocks(doc.read_text(encoding="utf-8"))[1]):
            if info == "toml":
                found.append((f"{doc.relative_to(ROOT).as_posix()}:{n}", body))
    return found


def test_there_are_toml_examples() -> None:
    """The check below sees the examples (a fence parser that found none would pass vacuously)."""
    assert len(_toml_examples()) >= 6


@pytest.mark.parametrize(("where", "body"), _toml_examples(), ids=[w for w, _ in _toml_examples()])
def test_toml_examples_parse(where: str, body: str, tmp_path: Path) -> None:
    """A pipeline example parses as a pipeline file; every other is a config (or a part of one) heartbeat accepts."""
    if re.search(r"^\[stages\.", body, re.M):
        assert parse_pipeline("feat", body, base_dir=str(tmp_path))
        return
    # A fragment (one launcher, one section) is read as part of a config whose default
    # launcher exists, as a user would paste it into the starter config.
    standalone = re.search(r"^default_launcher", body, re.M) or "[launchers.agent]" in body
    text = body if standalone else body + '\n[launchers.agent]\ncommand = ["true"]\n'
    parse_config(text, path=str(tmp_path / "heartbeat.toml"))
