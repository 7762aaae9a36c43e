"""The boot time psutil's create times count from, read while another thread imports psutil.

The idle daemon reads ``btime`` itself and imports psutil only when an agent's liveness needs it
(issue 23): the tick's thread may be importing psutil when the main thread's clock check asks
for the boot time. Until its import ends, ``sys.modules["psutil"]`` is the module half made,
without its functions: a fresh-clone CI saw the daemon's main thread die on it
("partially initialized module 'psutil' has no attribute 'boot_time'") at its first dispatch.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from heartbeat.launchers import liveness


def btime() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise AssertionError("no btime in /proc/stat")


def test_psutil_half_imported_by_another_thread_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """A psutil module still being made (what CPython's import machinery puts in sys.modules first)
    gives the boot time from /proc/stat, not an AttributeError (fails on 674f791)."""
    half = types.ModuleType("psutil")
    half.__spec__ = None
    monkeypatch.setitem(sys.modules, "psutil", half)
    assert liveness.boot_time() == btime()


def test_psutil_loaded_whole_is_psutil_own() -> None:
    """Once psutil is loaded, its boot time is the one read (its create times come from the same /proc)."""
    import psutil

    assert abs(liveness.boot_time() - psutil.boot_time()) < 1.0


def test_the_boot_time_is_read_again_only_when_the_clocks_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass notes the boot time, but reads it (all of /proc/stat, a third of an idle pass)
    only when the wall clock less the boot clock moved: a step is still noted at the next pass."""
    reads: list[float] = []
    monkeypatch.setattr(liveness, "boot_time", lambda: reads.append(1.0) or 1000.0 + len(reads))
    monkeypatch.setattr(liveness, "_NOTED_ESTIMATE", [])
    monkeypatch.setattr(liveness, "_BOOT_TIMES", set())
    liveness.note_boot_time()
    liveness.note_boot_time()
    liveness.note_boot_time()
    assert len(reads) == 1
    real = liveness.time.time
    monkeypatch.setattr(liveness.time, "time", lambda: real() + 3600.0)  # the wall clock stepped an hour ahead
    liveness.note_boot_time()
    liveness.note_boot_time()
    assert len(reads) == 2
    assert sorted(liveness._BOOT_TIMES) == [1001.0, 1002.0]
