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

Run as a script (``python tests/unit/test_layers.py``) it prints the strongly connected components
and the edges inside them.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def callbacks_set_after_construction() -> list[str]:
    """Every place in heartbeat/daemon/ that hands a part a callable by assigning it onto another
    object (``shared.poke = self.poke``, ``self.lease.on_stood_down = on_stood_down``): a lambda,
    a function defined in the enclosing function, or a method of the enclosing class; as ``path:
    target``. A part is given its callables in its constructor instead."""
    found = []
    for path in sorted((PACKAGE / "daemon").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
                local_defs = {n.name for n in ast.walk(func) if isinstance(n, ast.FunctionDef) and n is not func}
                for node in ast.walk(func):
                    if not isinstance(node, ast.Assign):
                        continue
                    value = node.value
                    is_callable = isinstance(value, ast.Lambda) or (
                        isinstance(value, ast.Name) and value.id in local_defs) or (
                        isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                        and value.value.id == "self" and value.attr in methods)
                    for target in node.targets:
                        onto_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self"
                        if is_callable and isinstance(target, ast.Attribute) and not onto_self:
                            found.append(f"{rel}: {ast.unparse(target)}")
    return sorted(found)


CALLBACKS_SET_LATE = ["heartbeat/daemon/core.py: self.store.ledger.on_unreadable"]
"""The store's ledger hook (a corrupt row logged once): set on the store, not on a daemon part."""


class TestDaemonComposition:
    """The daemon is composition: a service that has its parts, each given its dependencies in its constructor."""

    def test_no_daemon_class_subclasses_another_or_forwards_by_property(self) -> None:
        """No class of heartbeat/daemon/ inherits from another of them (``Daemon(Core)`` is gone), and
        the service, the loop and the shared context define no property (no forwarders under old names)."""
        import inspect

        from heartbeat.daemon import act, core, leased, observe, pokes, relay, service, shared, watch

        modules = (act, core, leased, observe, pokes, relay, service, shared, watch)
        ours = {c for m in modules for _, c in inspect.getmembers(m, inspect.isclass) if c.__module__ == m.__name__}
        inherited = sorted(f"{c.__name__}({b.__name__})" for c in ours for b in c.__mro__[1:] if b in ours)
        assert inherited == []
        for cls in (service.Daemon, core.Loop, shared.Shared):
            assert [n for n, v in vars(cls).items() if isinstance(v, property)] == [], cls

    def test_no_part_is_handed_a_callback_after_it_is_built(self) -> None:
        """Callbacks reach a part through its constructor: none is assigned onto a built part
        (on c31a8a9 the watcher set ``shared.poke``/``shared.exited``, the loop ``shared.lease``,
        the service ``lease.on_stood_down`` and ``watcher.on_missed``)."""
        assert callbacks_set_after_construction() == CALLBACKS_SET_LATE

    def test_the_parts_share_one_context_and_one_lease_part(self, tmp_path: Path) -> None:
        """A daemon on a file store: the loop, observer, actor and watcher hold the one ``Shared``
        the service built, and the lease part is None in each."""
        from heartbeat.config.load import parse_config
        from heartbeat.daemon import Daemon

        state = tmp_path / "state"
        config = parse_config(f'[daemon]\nstate_dir = "{state}"\n\n[launchers.agent]\ntype = "null"\n')
        daemon = Daemon(config, dry_run=True)
        try:
            parts = (daemon.loop, daemon.observer, daemon.actor, daemon.watcher)
            assert all(part.shared is daemon.shared for part in parts)
            assert daemon.lease is None and daemon.loop.lease is None and daemon.observer.lease is None \
                and daemon.actor.lease is None
            assert daemon.shared.pokes is daemon.pokes and daemon.loop.store is daemon.store is daemon.shared.store
        finally:
            daemon.shared.pool.shutdown(wait=True)
            daemon.store.close()
    def test_the_launch_reads_as_its_phases(self) -> None:
        """``Actor.launch`` is its named phases, each documented and short (on c31a8a9 one method
        of 116 lines): prepare, claim (phase 1), spawn, record (phase 2)."""
        import inspect

        from heartbeat.daemon.act import Actor

        phases = [Actor.launch, Actor._prepare, Actor._claim, Actor._spawn, Actor._record]
        lengths = {f.__name__: len(inspect.getsource(f).splitlines()) for f in phases}
        assert all(f.__doc__ for f in phases)
        assert max(lengths.values()) <= 45, lengths

    def test_the_daemon_imports_no_face_for_its_page(self) -> None:
        """``[http]`` inside ``heartbeat run``: the command line gives the daemon its page starter
        (:func:`heartbeat.web.server.start_for_daemon`); no daemon module imports anything of ``heartbeat.web``
        (on c31a8a9 daemon/service.py imported the page, listed in import-linter's ignore_imports)."""
        graph = import_graph()
        daemon_modules = [m for m in graph if m == "heartbeat.daemon" or m.startswith("heartbeat.daemon.")]
        assert [m for m in daemon_modules if any(t.startswith("heartbeat.web") for t in graph[m])] == []
        assert "heartbeat.web.server" in graph["heartbeat.cli.serve"]

    def test_a_daemon_without_a_page_loads_no_web_module(self, tmp_path: Path) -> None:
        """``heartbeat run`` without ``[http] listen`` never imports ``heartbeat.web.app`` (on 4c852cf
        the command line imported it to hand the daemon its page starter: 1.7 MB of RSS, with
        ``secrets`` and ``hmac``, in every daemon)."""
        import json
        import subprocess

        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        cfg = tmp_path / "heartbeat.toml"
        cfg.write_text(f'[daemon]\nstate_dir = {json.dumps(str(state))}\n')
        code = ("import sys\nfrom heartbeat.cli.main import main\n"
                f"status = main(['--config', {str(cfg)!r}, 'run', '--once', '--dry-run'])\n"
                "print(status, 'heartbeat.web.app' in sys.modules)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert r.stdout.split()[-2:] == ["0", "False"], (r.stdout, r.stderr[-2000:])

    def test_an_idle_daemon_loads_neither_psutil_nor_rich(self, tmp_path: Path) -> None:
        """A pass over tasks without an agent imports neither ``psutil`` (the boot time it notes every
        pass is read from ``/proc/stat`` as psutil reads it: 1.9 MB on 4a78701) nor ``rich``, which
        structlog loads when it is installed, for console tracebacks (4.9 MB on 4a78701); rich is
        installed here (import-linter needs it), so the test can fail."""
        import importlib.util
        import json
        import subprocess

        from heartbeat.model.baton import Baton, Meta, Status, dump_baton
        from heartbeat.model.timeparse import utcnow

        assert importlib.util.find_spec("rich") is not None, "rich is not installed: this test proves nothing"
        state = tmp_path / "state"
        (state / "batons").mkdir(mode=0o700, parents=True)
        now = utcnow()
        for i, status in enumerate((Status.DONE, Status.BLOCKED)):
            meta = Meta(id=f"t{i}", revision=1, status=status, created_at=now, updated_at=now, touched_at=now)
            (state / "batons" / f"t{i}.toml").write_text(dump_baton(Baton(task="x", step="s", meta=meta)))
        cfg = tmp_path / "heartbeat.toml"
        cfg.write_text(f'[daemon]\nstate_dir = {json.dumps(str(state))}\n[launchers.agent]\ntype = "null"\n')
        code = ("import sys\nfrom heartbeat.cli.main import main\n"
                f"status = main(['--config', {str(cfg)!r}, 'run', '--once', '--dry-run'])\n"
                "from heartbeat.launchers.liveness import _BOOT_TIMES\n"
                "print(status, bool(_BOOT_TIMES), 'psutil' in sys.modules, 'rich' in sys.modules)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert r.stdout.split()[-4:] == ["0", "True", "False", "False"], (r.stdout, r.stderr[-2000:])


if __name__ == "__main__":
    g = import_graph()
    for comp in cycles(g):
        print(f"{len(comp)} modules: {sorted(comp)}")
    for v, w in sorted(cycle_edges(g)):
        print(f"    ({v!r}, {w!r}),")
