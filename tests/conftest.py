"""Shared fixtures: a private state dir, stores, and the real CLI run as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore
from tests.support import hypothesis_profiles

ROOT = Path(__file__).resolve().parent.parent
hypothesis_profiles.register()

LAYERS = ("unit", "integration", "system", "external", "soak")
"""The folders of tests/, each a marker of the same name (pyproject.toml), set on its tests here."""


SLOW_FIRST = ("external", "system", "soak", "integration", "unit")
"""The order the layers run in: the files that take longest (real CLIs, databases, daemons, few
tests each) first, so under xdist the short ones fill the workers' last minutes instead of one
long file running alone at the end. scripts/test passes ``--no-loadscope-reorder``, which keeps
this order (xdist's default sorts files by their number of tests, putting these last)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its folder's layer, so ``-m "unit or integration"`` picks by layer too;
    order the layers :data:`SLOW_FIRST` (within a layer, files keep their order)."""
    tests = Path(__file__).resolve().parent
    rank: dict[int, int] = {}
    for item in items:
        try:
            layer = Path(item.path).resolve().relative_to(tests).parts[0]
        except ValueError:
            continue
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
            rank[id(item)] = SLOW_FIRST.index(layer)
    items.sort(key=lambda item: rank.get(id(item), len(SLOW_FIRST)))  # (stable: a file stays in one piece)


@dataclass
class Result:
    code: int
    out: str
    err: str


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a CLI subprocess: no stray HEARTBEAT_* from the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    env.pop("NOTIFY_SOCKET", None)
    env.update(extra)
    return env


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    return path


@pytest.fixture
def file_store(state_dir: Path) -> Iterator[FileStore]:
    store = FileStore(str(state_dir))
    yield store
    store.close()


@pytest.fixture
def memory_store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def hb(state_dir: Path) -> Callable[..., Result]:
    """Run ``heartbeat ARGS...`` for real (a subprocess) against ``state_dir``; ``env=`` adds variables.
    A file whose tests need no process of their own overrides it with ``cli`` (in this process)."""
    return _subprocess_cli(state_dir)


@pytest.fixture
def hb_process(state_dir: Path) -> Callable[..., Result]:
    """``hb`` as a subprocess, for the tests of a file that overrides ``hb`` with ``cli``."""
    return _subprocess_cli(state_dir)


def _subprocess_cli(state_dir: Path) -> Callable[..., Result]:
    def run(*args: str, env: Mapping[str, str] | None = None, input: str | None = None,
            timeout: float = 60) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "heartbeat", *args],
            env=clean_env(**{"HEARTBEAT_STATE_DIR": str(state_dir), **(env or {})}),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(state_dir.parent),
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def cli(state_dir: Path) -> Callable[..., Result]:
    """``heartbeat ARGS...`` in this process (tests/support/inprocess_cli.py), with what ``hb`` gives
    a subprocess: ``state_dir``, a clean environment plus ``env=``, the state dir's parent as the
    working directory, ``input=`` on stdin; every process-wide setting is put back afterwards. The
    default for CLI behaviour; ``hb`` where the process is the point."""
    from tests.support.inprocess_cli import run as run_in_process

    def run(*args: str, env: Mapping[str, str] | None = None, input: str | None = None,
            timeout: float = 60) -> Result:
        code, out, err = run_in_process(args, env=clean_env(**{"HEARTBEAT_STATE_DIR": str(state_dir), **(env or {})}),
                                        cwd=str(state_dir.parent), input=input)
        return Result(code, out, err)

    return run


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.01,
             message: str = "condition") -> object:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


# -- PostgreSQL: one throwaway cluster per run, one fresh database per test (tests/support/pg.py) --

_pg_counter = iter(range(1, 1 << 30))


@contextmanager
def _throwaway_cluster() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster on a Unix socket, removed at the end; the test fails (never
    skips) when none can start."""
    from tests.support.pg import start_cluster

    try:
        cluster = start_cluster()
    except RuntimeError as exc:
        pytest.fail(f"cannot start a throwaway PostgreSQL cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster on a Unix socket, with an upgraded template database."""
    with _throwaway_cluster() as cluster:
        from heartbeat.store.postgres.schema import upgrade

        upgrade(cluster.create_db("hb_template"))
        yield cluster


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Any]:
    """A cluster of the test module's own, to stop and start without disturbing the others."""
    with _throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_empty_url(pg_cluster: Any) -> str:
    """The URL of a new database that heartbeat has never upgraded."""
    return str(pg_cluster.create_db(f"hb_empty_{os.getpid()}_{next(_pg_counter)}"))


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """The URL of a new database at the current schema (copied from the template)."""
    import psycopg

    name = f"hb_{os.getpid()}_{next(_pg_counter)}"
    with psycopg.connect(pg_cluster.host_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE hb_template')  # type: ignore[arg-type]
    return str(pg_cluster.url(name))


# -- pytest-xdist: a test marked `exclusive` runs while no other worker runs a test ---------------

_EXCLUSIVE_WAIT = 900.0
"""Seconds a worker waits for an exclusive test elsewhere to end before it runs its own test anyway."""


@pytest.fixture(autouse=True)
def _exclusive_under_xdist(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under xdist (``scripts/test`` runs four workers, or ``HEARTBEAT_TEST_WORKERS``) every
    test holds a shared lock on a file of the run's temp root while it runs; a test marked
    ``exclusive`` (none is now: the short soak was, until it passed beside busy workers) announces
    itself with a marker file and takes the lock exclusively, so the other workers finish their
    current test and wait. Without xdist: nothing."""
    import fcntl

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    root = tmp_path_factory.getbasetemp().parent  # pytest-N/, shared by the workers of this run
    wanted = root / "exclusive.wanted"
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(root / "exclusive.lock", "a") as lock:
        if exclusive:
            wanted.touch()
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                wanted.unlink(missing_ok=True)
                fcntl.flock(lock, fcntl.LOCK_UN)
            return
        deadline = time.monotonic() + _EXCLUSIVE_WAIT
        while wanted.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _daemon_exports_restored() -> Iterator[None]:
    """A daemon built in this process exports ``HEARTBEAT_STORE_URL`` and ``HEARTBEAT_HOST`` for its
    launchers (its process's environment is theirs); no test hands them on to the next one (under
    xdist a file's neighbours vary: test_api once found a test_lease daemon's database URL)."""
    saved = {key: os.environ.get(key) for key in ("HEARTBEAT_STORE_URL", "HEARTBEAT_HOST")}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def short_root() -> Iterator[Path]:
    """A fresh 0700 directory right under /tmp: a Unix socket's path in it stays under Linux's 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))
    path.chmod(0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)
