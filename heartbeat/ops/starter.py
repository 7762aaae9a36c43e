"""``heartbeat init``: a commented starter config that ``check-config`` accepts."""

from __future__ import annotations

import json
import os

from heartbeat.model.errors import BadInput, StoreError

__all__ = ["STARTER", "write_starter"]

STARTER = '''\
# heartbeat config. Every key is documented in config/heartbeat.example.toml.
# Durations: "250ms", "30s", "10m", "2h", or a number of seconds.

[daemon]
state_dir = {state_dir}      # batons/, logs/, ledger.sqlite3 (created 0700)
tick = "30s"                      # how often every baton is re-read
stall_after = "10m"               # no write/touch and no output for this long: stalled
progress_after = "1h"             # alive and touching but the step has not moved: spinning
max_attempts = 5                  # dispatches without progress before escalation
max_idle_resumes = 3              # agents in a row that exited 0 without progress
backoff_initial = "30s"
backoff_max = "30m"
dispatches_per_minute = 30        # global budget
max_concurrent = 4                # agents running at once
default_launcher = "agent"

# How to start an agent. The command is an argv list: no shell is involved, and the
# placeholders {{id}} {{brief_file}} {{workdir}} {{epoch}} {{attempt}} {{state_dir}} are
# substituted inside single arguments. Replace my-agent with your agent's CLI.
[launchers.agent]
type = "exec"
command = ["my-agent", "--task", "{{id}}", "--brief", "{{brief_file}}"]
brief = "file"                    # file | stdin | arg
cwd = "{{workdir}}"
stop_grace = "10s"
max_runtime = "4h"
non_retryable_exit_codes = []     # exit codes that block the task instead of retrying

# Run on escalation (placeholders: {{id}} {{reason}} {{status}} {{epoch}} {{attempt}}).
[notify.log]
command = ["logger", "-t", "heartbeat", "{{id}} escalated: {{reason}}"]
timeout = "30s"
'''


def write_starter(directory: str, *, force: bool = False) -> str:
    """Write ``<directory>/heartbeat.toml`` and create ``<directory>/state``; returns the config path."""
    directory = os.path.abspath(directory)
    path = os.path.join(directory, "heartbeat.toml")
    if os.path.lexists(path) and not force:
        raise BadInput(f"{path} exists already (pass --force to overwrite it)")
    state_dir = os.path.join(directory, "state")
    from heartbeat.store.files import ensure_private_dir
    from heartbeat.system.safefile import write_file_atomic

    try:
        os.makedirs(directory, exist_ok=True)
        ensure_private_dir(state_dir)
        text = STARTER.format(state_dir=json.dumps(state_dir))  # a JSON string is a TOML string
        write_file_atomic(path, text.encode("utf-8"), mode=0o644)  # never into a file (a FIFO) planted there
    except OSError as exc:
        raise StoreError(f"cannot write the starter config: {exc.strerror}", path=path) from None
    return path
