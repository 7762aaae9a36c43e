"""The package's imports point one way: no heartbeat module is in an import cycle.

Import-linter (``lint-imports`` in scripts/test, contracts in pyproject.toml) holds the named
layers; this test holds the stronger, simpler rule under them, and counts what import-linter
cannot see the same way: an import inside a function is an edge here exactly like one at the
top of a module (a lazy import hides a cycle from the interpreter, not from a reader).

The graph is built from the source with :mod:`ast`, never by importing it. Counted: every
``import heartbeat...`` and ``from heartbeat... import ...`` (and the relative forms) anywhere in
a module, in functions too. Not counted: imports under ``if TYPE_CHECKING:`` (annotations only,
never run). ``from package import name`` is an edge to ``package.name`` when that is a module,
else to the package's ``__init__``. The optional extras (psycopg, mcp, starlette, uvicorn,
jinja2, prometheus_client) are outside heartbeat and so never in the graph.

Run as a script (``python tests/test_layers.py``) it prints the strongly connected components
and the edges inside them.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "heartbeat"

Graph = dict[str, set[str]]

TOLERATED: set[tuple[str, str]] = set()
"""Edges inside a cycle that this test lets pass: none since issue 18 broke the last one.

Keep it empty. (While cycles remained it listed their upward edges, so that only a new one failed.)
"""


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    names: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, except under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> Graph:
    """Module → the heartbeat modules it imports, counting imports inside functions."""
    modules = module_names()
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, name, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                while target and target not in modules:  # import heartbeat.x.y where y is a name
                    target = target.rpartition(".")[0]
                if target.startswith("heartbeat") and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Graph) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycle_edges(graph: Graph) -> set[tuple[str, str]]:
    """Every edge that lies on some cycle: both ends in one strongly connected component."""
    edges = set()
    for component in cycles(graph):
        for v in component:
            edges |= {(v, w) for w in graph[v] if w in component}
    return edges


def without(graph: Graph, edges: set[tuple[str, str]]) -> Graph:
    return {v: {w for w in ws if (v, w) not in edges} for v, ws in graph.items()}


class TestImportGraph:
    def test_the_graph_sees_imports_inside_functions(self) -> None:
        """The builder counts a lazy import: ``heartbeat/__init__`` reaches api only inside ``__getattr__``."""
        assert "heartbeat.api" in import_graph()["heartbeat"]

    def test_the_builder_finds_a_cycle(self) -> None:
        """A made-up two-module loop is one component, so an empty answer below means something."""
        assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]

    def test_no_import_cycle(self) -> None:
        """No heartbeat module is in an import cycle, counting imports inside functions."""
        remaining = cycles(without(import_graph(), TOLERATED))
        assert remaining == [], "\n".join(
            f"cycle: {sorted(c)}; its edges: {sorted(e for e in cycle_edges(import_graph()) if e[0] in c and e[1] in c)}"
            for c in remaining
        )

    def test_every_tolerated_edge_still_exists(self) -> None:
        """An edge that was broken leaves the list, so the list only shrinks."""
        graph = import_graph()
        gone = sorted((v, w) for v, w in TOLERATED if w not in graph.get(v, set()))
        assert gone == [], f"no longer imported, drop from TOLERATED: {gone}"



def _is_store(node: ast.expr) -> bool:
    """``store``, or ``<anything>.store`` (``self.store``, ``self.shared.store``)."""
    return (isinstance(node, ast.Name) and node.id == "store") or (isinstance(node, ast.Attribute) and node.attr == "store")


def store_reaches() -> list[str]:
    """Every place outside heartbeat/store/ that reaches past the Store protocol: ``getattr``/``hasattr``
    on a store, or a private (``_``) attribute of one; as ``path: expression``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("heartbeat/store/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            asks = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and bool(node.args) and _is_store(node.args[0]))
            private = isinstance(node, ast.Attribute) and node.attr.startswith("_") and _is_store(node.value)
            if asks or private:
                found.append(f"{rel}: {ast.unparse(node)}")
    return sorted(found)


STORE_REACHES_LEFT = sorted([
    "heartbeat/retention.py: store._locked",
])
"""The reaches past the Store still to be turned into capabilities (issue 18); only shrinks."""


class TestStoreCut:
    def test_the_check_knows_a_store(self) -> None:
        """A store is ``store`` or any ``<x>.store``: the walk's notion of what to watch."""
        assert _is_store(ast.parse("self.store", mode="eval").body) and _is_store(ast.parse("store", mode="eval").body)

    def test_nothing_outside_store_reaches_past_the_store_but_the_listed(self) -> None:
        """Outside heartbeat/store/ a store is asked with isinstance on its capabilities
        (store/base.py: FileBacked, PulseSink, TextImport, SharedStore), never with getattr,
        hasattr or a private attribute; a new reach fails here, and so does a fixed one still listed."""
        assert store_reaches() == STORE_REACHES_LEFT

if __name__ == "__main__":
    g = import_graph()
    for comp in cycles(g):
        print(f"{len(comp)} modules: {sorted(comp)}")
    for v, w in sorted(cycle_edges(g)):
        print(f"    ({v!r}, {w!r}),")
