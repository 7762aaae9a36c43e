"""The ``cli`` fixture (tests/support/inprocess_cli.py): the same answers as the real entry in a
subprocess, and nothing process-wide left changed behind it."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from conftest import Result

Hb = Callable[..., Result]

CASES = [
    ("--version",),
    ("status",),
    ("show", "ghost"),
    ("show", "Bad Id"),
    ("set", "ghost", "step=x"),
    ("no-such-command",),
    ("new", "t1"),
    ("show", "t1", "--json"),
    ("log", "t1", "--json"),
    ("brief", "t1"),
]


def ages(text: str) -> str:
    """``text`` with the ages ``status`` prints (``4s``, ``681ms``) masked, and the columns they widen:
    the two runs are moments apart."""
    return re.sub(r" +", " ", re.sub(r"\b\d+(ms|[smhd])\b", "N", text))


class TestSameAsTheRealEntry:
    def test_codes_and_output_match_a_subprocess(self, cli: Hb, hb_process: Hb, tmp_path: Path) -> None:
        """Each case, run in this process and by ``python -m heartbeat``, gives the same exit code and the
        same stdout and stderr (the state dir named in both the same way)."""
        for made in (False, True):  # before and after t1 exists (made in this process)
            for args in CASES:
                mine, real = cli(*args), hb_process(*args)
                assert (mine.code, ages(mine.out), mine.err) == (real.code, ages(real.out), real.err), args
            if not made:
                assert cli("new", "t1", "--task", "T", "--step", "s").code == 0

    def test_stdin_and_env_reach_the_command(self, cli: Hb, tmp_path: Path) -> None:
        """An export read back by ``import -`` from stdin, into the state dir named by ``env=``."""
        assert cli("new", "t1", "--task", "Carry me", "--step", "s").code == 0
        exported = cli("export")
        assert exported.code == 0 and "Carry me" in exported.out
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        env = {"HEARTBEAT_STATE_DIR": str(other)}
        assert cli("show", "t1", env=env).code != 0
        assert cli("import", "-", env=env, input=exported.out).code == 0
        assert "Carry me" in cli("show", "t1", env=env).out


class TestNothingLeftBehind:
    def test_process_wide_settings_are_put_back(self, cli: Hb, tmp_path: Path) -> None:
        """Environment, working directory, argv, umask, signal handlers and structlog's configuration are
        the test's own again after a command that sets them (``run --once``-free: ``status`` and a failure)."""

        def mine(signum: int, frame: object) -> None:
            pass

        previous = signal.signal(signal.SIGUSR1, mine)
        os.environ["HB_TEST_SENTINEL"] = "kept"
        before = (dict(os.environ), os.getcwd(), sys.argv[:], structlog.get_config())
        try:
            for args in (("status",), ("show", "ghost"), ("--version",)):
                cli(*args, env={"HEARTBEAT_TASK": "t9", "HEARTBEAT_EPOCH": "3"})
                assert (dict(os.environ), os.getcwd(), sys.argv[:], structlog.get_config()) == before, args
                assert signal.getsignal(signal.SIGUSR1) is mine
        finally:
            signal.signal(signal.SIGUSR1, previous)
            os.environ.pop("HB_TEST_SENTINEL", None)

    def test_a_crash_is_exit_1_with_the_traceback(self, cli: Hb, monkeypatch: pytest.MonkeyPatch) -> None:
        """An exception the CLI does not catch is what the interpreter would make of it: exit 1, traceback."""
        import heartbeat.cli.main

        def boom(argv: object = None) -> int:
            raise RuntimeError("boom")

        monkeypatch.setattr(heartbeat.cli.main, "main", boom)
        r = cli("status")
        assert r.code == 1 and "RuntimeError: boom" in r.err
