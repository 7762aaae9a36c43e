"""Every default heartbeat uses, in one place, each with a line saying what it is."""

from __future__ import annotations

SCHEMA = 1
"""The baton schema this heartbeat reads and writes; a newer one is refused, not misread."""

STATE_DIR = "/var/lib/heartbeat"
"""Where batons, logs and the ledger live when the config does not say."""

CONFIG_PATHS = ("./heartbeat.toml", "/etc/heartbeat/heartbeat.toml")
"""Searched in order after ``--config`` and ``HEARTBEAT_CONFIG``."""

TICK = 30.0
"""Seconds between daemon ticks."""

STALL_AFTER = 600.0
"""Seconds without a write or touch (or since dispatch) after which a task is stalled."""

PROGRESS_AFTER = 3600.0
"""Seconds an alive, touching agent may stay on one step before it counts as spinning."""

MAX_ATTEMPTS = 5
"""Dispatches without progress that died, failed or stalled before the task is escalated."""

MAX_IDLE_RESUMES = 3
"""Dispatches in a row that exited 0 without progress before the task is escalated."""

BACKOFF_INITIAL = 30.0
"""Seconds before the first re-dispatch after a failed attempt; doubles each attempt."""

BACKOFF_MAX = 1800.0
"""The cap on the backoff between re-dispatches."""

DISPATCHES_PER_MINUTE = 30
"""Global budget of dispatches per minute, so a mass failure does not relaunch everything."""

MAX_CONCURRENT = 4
"""Agents running at once across all launchers."""

ON_SPINNING = "escalate"
"""What to do with a spinning agent (alive, touching, step unchanged past progress_after):
``escalate`` (stop it, escalate the task), ``restart`` (stop it, count a failed attempt) or ``report`` only."""

DEFAULT_LAUNCHER = "agent"
"""The launcher a baton uses when it names none."""

STOP_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping an agent."""

CHECK_TIMEOUT = 30.0
"""Seconds a gate's check command may run before it counts as closed."""

NOTIFY_TIMEOUT = 30.0
"""Seconds a notify command may run."""

BRIEF_BUDGET = 4000
"""Tokens a brief may use; one token is estimated as four bytes."""

MAX_BATON_BYTES = 1024 * 1024
"""Batons larger than this are refused: no legitimate state note is a megabyte."""

FINGERPRINT_HASH_LIMIT = 8 * 1024 * 1024
"""Key files up to this size are fingerprinted by content hash; larger ones by size and mtime."""

LOCK_TIMEOUT = 30.0
"""Seconds a writer waits for a baton's lock before giving up with an error."""

PG_CONNECT_TIMEOUT = 5.0
"""Seconds a PostgreSQL store waits for a connection before saying it cannot reach the database."""

PG_STATEMENT_TIMEOUT = 30.0
"""Seconds any one statement of the PostgreSQL store may run before it is cancelled."""

TOUCH_COALESCE = 60.0
"""Touches of one task within this many seconds share a single ledger row."""

WATCH_DEBOUNCE = 0.05
"""Seconds the watcher waits for a burst of file events on one baton to settle."""

MAX_NESTING = 32
"""Tables and arrays in a baton or config may nest this deep (dotted keys count a level per
part); deeper documents are refused before they can cost quadratic parse time or overflow
the stack when written back."""

MAX_LOG_BYTES = 64 * 1024 * 1024
"""Bytes an agent's log (``logs/<id>/<epoch>.log``) may reach before the daemon keeps only
its tail (in ``<epoch>.log.1``) and starts the live file again; ``max_log_bytes`` per launcher."""
