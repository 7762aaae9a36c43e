"""The chaos soak: a real daemon, hundreds of misbehaving agents, faults at random, and an
independent checker asserting the invariants all along.

    .venv/bin/python scripts/soak.py --short                  # CI: ~60 tasks, ~45 s of chaos
    .venv/bin/python scripts/soak.py --long                   # 300 tasks, 30 min of chaos
    .venv/bin/python scripts/soak.py --tasks 100 --duration 120 --seed 7 --tick 200ms \
        [--state DIR] [--keep] [--json FILE]

A real ``heartbeat run`` (short tick) serves tasks whose agents (``scripts/chaos_agent.py``)
work, touch, block, finish, crash, hang, spin, snooze, leave processes behind, escape
into a new session and keep writing, and exit with the launcher's non-retryable code, at
random. Meanwhile the soak:

- SIGKILLs agents (the whole process group; sometimes only the shim, or only the agent);
- SIGKILLs the daemon and restarts it, and sometimes stops it cleanly (SIGTERM);
- sends SIGHUP with a good config (a changed tick) and with a broken one (then repairs it
  and sends SIGHUP again);
- hand-edits batons: drops blocks, adds keys heartbeat does not know, writes garbage over
  them (binary junk, a torn half, a wrong type) and later puts the original back;
- opens file gates, unblocks human gates through the CLI, re-arms escalated tasks;
- writes with a superseded epoch through the CLI (must be refused, exit 5);
- plants FIFOs and symlinks where the daemon, the shim or the CLI will open: the next
  epoch's ``.exit``, ``.log``, ``.pid``, ``.brief.md`` under ``logs/<id>/`` (FIFOs, and links
  to files outside the state dir), the whole ``logs/<id>`` directory swapped for a link to
  an outside directory, and ``.git/HEAD``, a ref or a key file in a task's git workdir (then
  runs ``heartbeat verify`` / ``set`` on that task); after a few seconds it cleans up as a
  human would (opens the FIFO so whoever is stuck on it gets EOF, removes it, puts the file
  or directory back);
- races the daemon: ``block``, ``done`` or ``snooze`` written 0-200 ms after a task became
  dispatchable (created, unblocked or re-armed);
- copies batons aside and later copies one back (a backup restored: lower revision);
- corrupts ledger rows (``data = '{oops'``, a timestamp out of range or of the wrong type),
  runs ``heartbeat report``, and repairs the row a few seconds later;
- starts a second ``heartbeat run`` (or ``run --once`` / ``--dry-run``) on the same state
  dir: it must exit 1 at once naming the running daemon's pid;
- migrates the live store (``heartbeat migrate --from STATE --to`` a fresh dir) beside the
  running daemon: it must exit 1 naming the daemon's pid and how to stop it, and write no
  baton to the target (a daemon stopped by the soak meanwhile may let it copy: counted);
- holds a baton's lock (``locks/<id>.lock``, flock) from another process for 1-3 s;
- steps the daemon's wall clock by hours, forward and back (its test clock: ``heartbeat run``
  given ``HEARTBEAT_TEST_CLOCK_OFFSET_FILE`` reads its wall clock as the machine's plus the
  seconds in that file), and holds off its daemon kills for ``STEP_WATCH`` seconds so the
  daemon is there to see it: it must log ``clock_stepped``, tick on, and stop or escalate no
  agent over the step. The agents, the CLI and the soak keep the machine's clock; the checker
  maps the ledger times the daemon stamped on its shifted clock back to the machine's.

Agents may also leave a ``setsid`` grandchild behind (``chaos_agent.py``, behaviour
``setsid-child``), which must not outlive its agent's shift.

Then it stops the chaos (agents turn calm, every file gate opens), lets the daemon drain,
and checks the end state. The checker (``tests/support/soak_checker.py``) samples the process
table every 50 ms and the batons every 200 ms, and reads the ledger with sqlite3 at the
end; see its docstring for the invariants. Prints a summary; exit 0 when no invariant was
violated, 1 otherwise (the state dir is then kept for inspection).

The package, a module per job: ``common`` (constants, records, helpers), ``daemon`` (the daemon
under test), ``tasks`` (the workload and the humans), ``faults``, ``plants`` and ``rivals`` (what the
soak does to the system), ``judge`` (what must hold, beside ``tests/support/soak_checker.py``),
``run`` (the run that composes them, and ``main``). ``scripts/soak.py`` and ``python scripts/soak``
both run ``main``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))  # soak_checker: tests/ is no package
