"""Every shell block of the README runs as pasted, in order, on a fresh machine (issue 26 item 8).

The README's ```sh/```bash blocks are run in one bash, in the order they appear, with a fresh
``HOME`` and no ``HEARTBEAT_*`` variables: what one block exports or ``cd``s into, the next
sees, as in a person's terminal. Each block runs under ``set -e``, so any command in it that
fails fails the test, naming the block.

A block that installs (``pip install``, ``scripts/test``) carries the marker comment
``not run by tests/system/test_readme.py`` and is skipped; in its place this venv's ``bin`` is
on ``PATH``, which is what the README's install leaves you with. Keep that set minimal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "not run by tests/system/test_readme.py"
"""The comment that marks a README block as an install step this test does not run."""
_FENCE = re.compile(r"^```(\S*)\s*$")


def shell_blocks(text: str) -> list[str]:
    """The bodies of the ```sh and ```bash blocks, in order."""
    blocks: list[str] = []
    info: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence and info is None:
            info, body = fence.group(1), []
        elif line.strip() == "```" and info is not None:
            if info in ("sh", "bash"):
                blocks.append("\n".join(body) + "\n")
            info = None
        elif info is not None:
            body.append(line)
    return blocks


def script(blocks: list[str]) -> str:
    parts = ["trap 'kill $(jobs -p) 2>/dev/null' EXIT\n"]  # a block that fails leaves no stand-in agent behind
    for n, block in enumerate(blocks, 1):
        if MARKER in block:
            continue
        parts.append(f"echo '::block {n}' >&2\nset -e\n{block}set +e\necho '::ok {n}' >&2\n")
    return "".join(parts)


def test_every_readme_block_runs_as_pasted(tmp_path: Path) -> None:
    blocks = shell_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    run = [n for n, b in enumerate(blocks, 1) if MARKER not in b]
    skipped = [b for b in blocks if MARKER in b]
    assert all(re.search(r"pipx? install|scripts/test|activate", b) for b in skipped), "only installs are skipped"
    assert len(blocks) >= 5 and len(run) >= 3, f"{len(blocks)} shell blocks, {len(run)} run"
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "LANG": os.environ.get("LANG", "C.UTF-8"), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", "--noprofile", "--norc"], input=script(blocks), text=True,
                          capture_output=True, cwd=str(tmp_path), env=env, timeout=300)
    done = [int(m) for m in re.findall(r"^::ok (\d+)$", proc.stderr, re.M)]
    failed = next((n for n in run if n not in done), None)
    assert proc.returncode == 0 and done == run, (
        f"README shell block {failed} failed (exit {proc.returncode}):\n{blocks[failed - 1] if failed else ''}\n"
        f"--- stdout:\n{proc.stdout[-3000:]}\n--- stderr:\n{proc.stderr[-3000:]}")
    # What the worked example's comments say it prints, it prints.
    for said in ("fresh: fix-fallback is active", "stale: fix-blank: the world changed", "\nexit 3\n",
                 "superseded: fix-blank: your epoch 1 has been superseded by the task's epoch 2", "\nexit 5\n",
                 "fix-blank: redone_steps: back to 'Reproduce the blank answer'"):
        assert said in proc.stdout, f"{said!r} not in the README's output:\n{proc.stdout[-3000:]}"
    assert re.search(r"^fix-blank +active +7 +2 +1 +\. +1 ", proc.stdout, re.M), proc.stdout[-3000:]
