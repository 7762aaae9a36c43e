"""A state dir this user cannot read is one line with the fix, as a state dir of another user is
(issue 26, item 12).

Root reads any directory whatever its mode, so the command runs in a forked child that has become
uid 65534 (the modules it needs loaded beforehand, by the same commands run as root on a readable state dir):
a real process of another user, against real directories.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env

from tests.support.inprocess_cli import run

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")


def as_nobody(state_dir: Path, *args: str) -> tuple[int, str]:
    """``heartbeat ARGS`` in a child that is uid/gid 65534: its exit code and standard error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            code, _, err = run(args, env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)), cwd="/")
            os.write(write, json.dumps([code, err]).encode())
        except BaseException:
            import traceback

            os.write(write, json.dumps([-1, traceback.format_exc()]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    code, err = json.loads(data)
    return int(code), str(err)


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="hb-unreadable-"))
    root.chmod(0o755)
    warm = root / "warm"
    warm.mkdir(mode=0o700)
    for command in (("new", "t", "--task", "x", "--step", "s"), ("show", "t"), ("status",)):
        # here, as root: the modules they import are loaded before the child, which cannot read the stdlib
        code, _, err = run(command, env=clean_env(HEARTBEAT_STATE_DIR=str(warm)), cwd="/")
        assert code == 0, err
    try:
        yield root
    finally:
        for path in sorted(root.rglob("*"), reverse=True):
            path.chmod(0o700) if path.is_dir() else None
        import shutil

        shutil.rmtree(root)


@pytest.mark.parametrize("command", [("status",), ("show", "t"), ("new", "t", "--task", "x", "--step", "s")])
def test_a_state_dir_closed_to_its_owner_says_chmod(open_root: Path, command: tuple[str, ...]) -> None:
    state = open_root / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    state.chmod(0)
    code, err = as_nobody(state, *command)
    assert code == 2 and err == (f"heartbeat: {state}: state dir is not readable by this user (mode 0000); "
                                 f"fix it with: chmod u+rwx {state}\n"), err


def test_a_state_dir_behind_a_closed_directory_says_so(open_root: Path) -> None:
    closed = open_root / "closed"
    closed.mkdir(mode=0o700)  # root's, closed to others
    state = closed / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    code, err = as_nobody(state, "status")
    assert code != 0 and err.count("\n") == 1 and "cannot reach state dir" in err and f"namei -l {state}" in err, err
