"""The real agent CLIs (Claude Code, Codex, Gemini CLI) from npm, for the tests that need them.

:func:`agent_cli` installs a pinned release into a cache directory the first time it is asked
(``$HEARTBEAT_TEST_CACHE``, default ``~/.cache/heartbeat-tests``) and returns the path of its
executable. Installs are serialised by a lock file, so parallel test processes share one
install. Without ``npm`` or without a reachable registry the calling test is skipped with the
reason printed; CI reaches npm, so there they run.

``python3 tests/support/agent_clis.py`` installs all three at once, in parallel, with any Python (no
pytest needed): ``scripts/test`` starts it in the background first, so the downloads overlap the
venv install, lint, type-check and the first tests; a test that needs a CLI still being
installed waits on its lock.

The versions are pinned because the CLIs' flags drift between releases: a preset is tested
against a known release, and moving the pin is a deliberate change that re-runs those tests.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["PACKAGES", "agent_cli", "cache_dir", "install"]

PACKAGES: dict[str, tuple[str, str]] = {
    "claude": ("@anthropic-ai/claude-code", "2.1.332"),
    "codex": ("@openai/codex", "0.171.0"),
    "gemini": ("@google/gemini-cli", "0.61.0"),
}
"""Executable name -> (npm package, pinned version)."""

_INSTALL_TIMEOUT = 600.0


def cache_dir() -> Path:
    return Path(os.environ.get("HEARTBEAT_TEST_CACHE") or Path.home() / ".cache" / "heartbeat-tests")


def agent_cli(name: str) -> Path:
    """The path of the real ``name`` CLI at its pinned version, installing it if needed (or skip)."""
    import pytest

    found = install(name)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def install(name: str) -> Path | str:
    """Install the pinned ``name`` CLI unless it is there: its executable, or why it cannot be had."""
    package, version = PACKAGES[name]
    prefix = cache_dir() / "npm" / f"{name}-{version}"
    binary = prefix / "node_modules" / ".bin" / name
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        return f"npm is not installed: cannot install {package}@{version}"
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        try:
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(prefix),
                 f"{package}@{version}"],
                capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return f"npm install {package}@{version} timed out after {_INSTALL_TIMEOUT:.0f}s"
        if proc.returncode != 0 or not binary.exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return f"npm install {package}@{version} failed (exit {proc.returncode}): {last}"
    return binary


def main() -> int:
    """Install every pinned CLI in parallel; print one line per CLI. Exit 0 even when one fails:
    the tests that need it then skip, naming the reason."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(PACKAGES)) as pool:
        for name, found in zip(PACKAGES, pool.map(install, PACKAGES), strict=True):
            print(f"agent_clis: {name}: {found}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
