"""Every default heartbeat uses, in one place, each with a line saying what it is."""

from __future__ import annotations

SCHEMA = 1
"""The baton schema this heartbeat reads and writes; a newer one is refused, not misread."""

STATE_FORMAT = 1
"""The format of the file store's state dir (batons, ledger) this heartbeat reads and writes (``format.toml``)."""

STATE_FORMAT_MIN_READER = 1
"""The oldest state dir format whose code may still use a state dir of :data:`STATE_FORMAT`."""

STATE_DIR = "/var/lib/heartbeat"
"""Where batons, logs and the ledger live when the config does not say."""

CONFIG_PATHS = ("./heartbeat.toml", "/etc/heartbeat/heartbeat.toml")
"""Searched in order after ``--config`` and ``HEARTBEAT_CONFIG``."""

TICK = 30.0
"""Seconds between daemon ticks."""

SWEEP_EVERY = 60.0
"""Seconds between the daemon's full stat sweeps over every baton; between them it trusts the
watcher's reports (it sweeps at once after the watcher lost events or restarted). 0: every tick."""

VITALS_SAVE_EVERY = 10.0
"""Seconds a daemon pass that changed only the pass's own counters (its count, time and duration)
may go without rewriting ``<state_dir>/daemon.json``; anything else changed is written at that
pass's end. The rewrite (a new file and a rename over the old) was most of an idle daemon's CPU
at a 1 s tick; what reads the file's last pass alarms after a minute or more (``heartbeat
doctor``, the status page, the ``HeartbeatDaemonStalled`` alert)."""

STALL_AFTER = 600.0
"""Seconds without a write, a touch or any output of the agent's (or since dispatch) after which
a task is stalled."""

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

MAX_LIMIT_WAIT = 6 * 3600.0
"""The longest a task waits for a rate or usage limit to reset (from the first limited run of a
stretch to the reset the CLI names) before it is escalated instead: a five-hour window waits, a
weekly one asks a human."""

MAX_COST_USD = 0.0
"""What one task's runs may cost in all (USD, summed from the CLIs' result lines) before it is
escalated; 0: no budget."""

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
"""Seconds between SIGTERM and SIGKILL when stopping an agent (a launcher's ``stop_grace``). The shim
(:mod:`heartbeat.launchers.shim`, which imports nothing from heartbeat) holds a copy for a run
without ``--grace``; a test pins them equal."""

INACTIVE_GRACE = 5.0
"""Seconds an agent may keep running once its task is no longer active (a human blocked,
finished, snoozed or paused it) before the daemon stops it (SIGTERM, then ``stop_grace``,
then SIGKILL). Short: an agent that wrote the status itself is already exiting (its last
command), and SIGTERM is itself a request to wind down; anything longer keeps a task the
user stopped running and a concurrency slot taken. Well under any sensible ``max_runtime``."""

LEASE_TTL = 30.0
"""Seconds a daemon's lease on a task lasts in a shared (PostgreSQL) store. The daemon renews
the leases of the tasks it supervises every tick; a task whose owner host has not renewed
within this is taken over by another host's daemon. Keep it well above the tick."""

HOST_ENV = "HEARTBEAT_HOST"
"""The environment variable naming this host for leases and owners; wins over ``daemon.host``."""

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

DAEMON_LOCK_WAIT = 0.1
"""Seconds the daemon waits for a baton's lock; a task whose lock is held longer (a stuck writer,
an API user working inside ``with task.update():``) is skipped until its next look."""

PG_CONNECT_TIMEOUT = 5.0
"""Seconds a PostgreSQL store waits for a connection before saying it cannot reach the database."""

PG_POOL_SIZE = 3
"""Connections a PostgreSQL store's pool may hold (one is opened at start, the rest on demand):
the daemon's loop, its lease renewals and its change handling each take one for a statement."""

PG_RELAY_POOL = 2
"""Connections the daemon's relay holds on a PostgreSQL store: every agent of its host writes
(``set``, ``add``, ``touch``, ``done``) and reads (``show``) through them, so an agent holds none.
A daemon holds at most PG_POOL_SIZE + 1 (its change feed's LISTEN) + 1 (its host lock) +
PG_RELAY_POOL connections, plus PG_POOL_SIZE for ``[http]`` (see docs/operating.md)."""

PG_RELAY_WAIT = 30.0
"""Seconds a relayed write waits for one of the relay's PG_RELAY_POOL connections (less than the
client's :data:`RELAY_REPLY_TIMEOUT`)."""

PG_REFUSED_WAIT = 300.0
"""Seconds an agent's own call (``$HEARTBEAT_EPOCH`` set; no daemon relayed it) waits, backing off,
while the database refuses connections ("too many clients", refused, starting up) before it
gives up with one line: a full or restarting server is not a failed attempt. A person's command,
the hooks (an agent's turn must not wait on them) and the daemon's own stores (its leases must not)
do not wait."""

PG_REFUSED_BACKOFF = (0.25, 5.0)
"""The first and the longest pause between two tries at a database that refused a connection."""

STORE_WAIT_INITIAL = 1.0
"""Seconds the daemon waits before its second try at a database it could not reach at start;
doubled after each failed try up to :data:`STORE_WAIT_MAX`."""

STORE_WAIT_MAX = 30.0
"""The longest wait between two tries at a database the daemon could not reach at start."""

PG_STATEMENT_TIMEOUT = 30.0
"""Seconds any one statement of the PostgreSQL store may run before it is cancelled."""

PG_IDLE_IN_TRANSACTION_TIMEOUT = 30.0
"""Seconds a PostgreSQL store's transaction may sit idle (its process paused, frozen or cut off
mid-write) before the server ends the session and releases its row locks: a frozen daemon's
locked task is then taken over (takeover skips locked rows) instead of pinned for ever. A leased
daemon's own sessions use half its ``lease_ttl`` when that is shorter (see PG_IDLE_IN_TRANSACTION_FLOOR)."""

PG_IDLE_IN_TRANSACTION_FLOOR = 2.0
"""The shortest idle-transaction timeout a leased daemon sets on its sessions (half its ``lease_ttl``,
no less): a host cut off mid-write must not hold its tasks' row locks beyond their lease."""

LEASE_KILL_MARGIN = 1.0
"""Seconds (at most a tenth of ``lease_ttl``) before a lease can expire in the database by which
the agent's shim has SIGKILLed what is left of an agent whose host's lease was not renewed (its
SIGTERM comes when the daemon itself would treat the lease as gone): no other host can take the
task over, and so start a replacement, while that agent still runs (issue 19 item 4)."""

FENCE_STOP_WAIT = 5.0
"""Seconds beyond the longest launcher ``stop_grace`` a daemon standing down (another daemon took
its host id) waits for the stops of its fenced agents before it exits."""

FENCED_REMEMBERED = 512
"""Agents (task, epoch) a daemon remembers having stopped for their lease, so their exits are
recorded as lease lapses, not as the agents' own ends."""

PG_KEEPALIVE_IDLE = 10.0
"""Seconds of silence on a PostgreSQL TCP connection before keepalive probes start (both ends)."""

PG_KEEPALIVE_INTERVAL = 5.0
"""Seconds between keepalive probes."""

PG_KEEPALIVE_COUNT = 3
"""Unanswered probes after which the peer counts as gone: a partitioned host's session, and its
locks, end in about PG_KEEPALIVE_IDLE + PG_KEEPALIVE_COUNT x PG_KEEPALIVE_INTERVAL seconds
(the operating system's default is two hours)."""

PG_TCP_USER_TIMEOUT = 25.0
"""Seconds data sent on a PostgreSQL TCP connection may stay unacknowledged before the client's
kernel drops the connection (libpq's ``tcp_user_timeout``): a partition in the middle of a write
ends like a quiet one, in about PG_KEEPALIVE_IDLE + PG_KEEPALIVE_COUNT x PG_KEEPALIVE_INTERVAL."""

PG_CLIENT_MARGIN = 5.0
"""Seconds beyond ``PG_STATEMENT_TIMEOUT`` after which heartbeat stops waiting for a statement's
answer and cuts the connection's socket (a black-holed flow that acknowledges and never answers)."""

PG_WATCHDOG_THREAD = "heartbeat-pg-watchdog"
"""The name of the PostgreSQL connection watchdog's thread: a daemon thread that holds nothing, so a
stopping daemon does not wait for it (it ends with the last connection it watches)."""

PG_CLIENT_CHECK = 0.5
"""Seconds between two looks of the connection watchdog at the statements waiting for an answer."""

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

HOOK_FRESH_WITHIN = 300.0
"""Seconds: a note written at most this long before a context compaction counts as fresh
(``hooks.fresh_within``); the report counts compactions that found the note fresh or stale."""

HOOK_MAX_STOP_BLOCKS = 1
"""Stop-hook blocks per session (per ``session_id``, whatever the turns) before heartbeat lets
a bound agent stop anyway (``hooks.max_stop_blocks``): a reminder, never a loop."""

CLAUDE_HOOK_CONTEXT_LIMIT = 10_000
"""The longest ``additionalContext`` (in UTF-16 code units, JavaScript's string length) one hook
may give Claude Code and have the model receive it whole: past it, claude 2.1.332 puts a ~2 KB
preview and a file path in its place (measured against the real CLI: 10,000 passes, 10,001 is
previewed; tests/external/test_hook_context.py)."""

HOOK_BRIEF_BUDGET = 2000
"""Tokens (UTF-8 bytes / 4) of the brief the SessionStart hook gives: at most 8,000 bytes, so
at most 8,000 code units, which leaves room under ``CLAUDE_HOOK_CONTEXT_LIMIT`` for the hook's own
lines; what does not fit is named and left to ``heartbeat brief ID``."""

HOOK_TIMEOUT = 30
"""Seconds Claude Code and codex give ``heartbeat hook claude|codex`` (the ``timeout`` install writes)."""

TRAIL_MAX_BYTES = 64 * 1024
"""Bytes an epoch's trail (``logs/<id>/<epoch>.trail``) may grow to before its older half is cut."""

TRAIL_MAX_LINE = 4096
"""The longest trail line a reader parses; a longer one (planted, or cut short) is skipped."""

TRAIL_WHAT_CHARS = 200
"""Characters of a call's command or target the trail keeps (one line)."""

TRAIL_ACTIVITY_TAIL = 16 * 1024
"""Bytes of a running agent's trail the daemon reads at each look (whether a tool call is in flight)."""

TRAIL_BRIEF_CALLS = 12
"""Unnoted calls a brief lists (those whose outcome is unknown first); the rest are counted."""

HANG_AFTER = 120.0
"""Seconds an agent whose trail shows no tool call in flight may stay silent (no note, output or
call) before it counts as a hung model and is stopped; a run inside a tool call gets ``stall_after``."""

CODEX_SESSION_END_TIMEOUT = 3
"""The ``timeout`` install writes for codex's ``SessionEnd`` hook: codex 0.171 allows at most 3 s there
(more is clamped, with an error item on every run); the hook only records ``session_ended``."""

MAX_HOOK_INPUT_BYTES = 1024 * 1024
"""Bytes of hook event JSON read from stdin; a larger event is refused (the hook does nothing)."""

HTTP_LISTEN = "127.0.0.1:8787"
"""Where ``heartbeat web`` serves the status page without ``--listen`` (loopback: this machine only)."""

SESSION = "fresh"
"""A launcher's ``session``: ``fresh`` (a new session id per dispatch) or ``resume`` (a retry
after a failed attempt resumes the previous session)."""

MAX_RESUMES_PER_SESSION = 3
"""With ``session = "resume"``: resumes of one session before a retry starts a fresh one."""

MAX_COMPACTIONS_PER_SESSION = 3
"""With ``session = "resume"``: a session compacted this often (``compacting`` events in the
ledger) is not resumed; its context is more summary than work, and the brief is better."""

ANSWER_MAX_RUNTIME = 900.0
"""Seconds an upstream's resumed session may spend answering a question before it is stopped
(the launcher's own ``max_runtime`` when shorter) and the question goes to a person."""

ANSWER_HANG = 300.0
"""Seconds an answering run's output may stay silent before it is stopped as hung."""

ANSWER_MAX_CHARS = 4000
"""Characters of an answering run's final text kept as the answer (the rest is cut, and said so)."""

CODEX_MAX_RUNTIME = 7200.0
"""The ``codex`` preset's ``max_runtime``: without a network Codex retries forever."""

GEMINI_MAX_RUNTIME = 7200.0
"""The ``gemini`` preset's ``max_runtime``, for the same reason."""

RESULT_HEAD_BYTES = 64 * 1024
"""Bytes read from the start of an agent's log for a preset's exit handling (Codex names its thread there)."""

RESULT_TAIL_BYTES = 256 * 1024
"""Bytes read from the end of an agent's log for a preset's exit handling (the final result line)."""

CLAUDE_PRICES: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-5": (5.0, 25.0, 6.25, 0.50),
    "claude-opus-4": (15.0, 75.0, 18.75, 1.50),
    "claude-3-opus": (15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4": (3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": (3.0, 15.0, 3.75, 0.30),
    "claude-3-5-sonnet": (3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": (1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": (0.80, 4.0, 1.0, 0.08),
    "claude-3-haiku": (0.25, 1.25, 0.30, 0.03),
}
"""USD per million tokens (input, output, cache write, cache read) by model-id prefix: Anthropic's list prices
(https://docs.anthropic.com/en/docs/about-claude/pricing), what a run cut before its result line is charged
(:mod:`heartbeat.presets.runcost`); a model no prefix names is priced at its family's (opus, sonnet, haiku) highest."""

RESULT_LINE_BYTES = 16 * 1024 * 1024
"""Bytes further back the tail may reach to read its first line whole (a final result line longer than the tail)."""

KEEP_EPOCHS = 5
"""``[retention] keep_epochs``: per task, the log/brief/pid/exit files of this many latest epochs are
kept by ``heartbeat gc`` (the current epoch's are always kept, whatever the number)."""

FINISHED_AFTER = 30 * 86400.0
"""``[retention] finished_after``: seconds a task must have been done before gc archives it
(its baton and ledger events move into ``<state_dir>/archive/``)."""

GC_EVERY = 86400.0
"""``[retention] every``: seconds between the daemon's gc runs (a job beside the tick, never in it)."""

LAUNCH_TIMEOUT = 10.0
"""Seconds a recorded dispatch may wait for its agent's pid (from the launch, or the shim's pid file)
before the launch counts as failed. Ten, as every daemon has run with: the shim writes its pid file
as it starts, so this only bounds the recovery of a daemon that died mid-launch."""

WORKER_THREADS = 4
"""Threads of the daemon's worker pool: agent stops and notify commands run there, off the tick."""

CHECK_THREADS = 2
"""Threads that run ``check:`` gate commands when the caller gives no pool of its own."""

GC_FIRST_DELAY_MAX = 300.0
"""Seconds after start, at most, before the daemon's first gc run (``[retention] every`` if shorter)."""

RELAY_MAX_CLIENTS = 16
"""Agents' writes the daemon's relay (:mod:`heartbeat.hotpath.relay`) serves at once; one more writes by itself."""

RELAY_GREETING_TIMEOUT = 2.0
"""Seconds an agent's ``set``/``add`` waits to connect to the relay and be greeted before writing by itself."""

RELAY_REPLY_TIMEOUT = 75.0
"""Seconds an agent's relayed write waits for the daemon's answer (more than a write's lock wait, 30 s)."""

RELAY_REQUEST_TIMEOUT = 5.0
"""Seconds a greeted relay client has to send its request whole (a dribbling client holds no slot for long)."""

RELAY_STOP_WAIT = 2.0
"""Seconds a stopping daemon waits for the relayed writes under way."""

RELAY_STOP_LISTEN = 0.5
"""Seconds a stopping daemon still gives greeted relay clients for their request before closing on them."""

RELAY_ACCEPT_RETRY = 0.1
"""Seconds the relay pauses after a failed ``accept()`` (no descriptor left) before trying again."""

PULSE_FUTURE_SKEW = 5.0
"""Seconds a pulse's (or an agent log's) mtime may lie ahead of the reader's clock before it is
ignored as forged. :mod:`heartbeat.hotpath.pulse` holds a copy (it loads nothing else; a test pins them equal)."""

SYSTEMD_QUERY_TIMEOUT = 2.0
"""Seconds a ``systemctl is-active``/``show`` may take: liveness checks must not stall the daemon."""

SYSTEMD_START_TIMEOUT = 30.0
"""Seconds ``systemd-run`` may take to create and start an agent's unit."""

SYSTEMD_STOP_MARGIN = 10.0
"""Seconds beyond the unit's stop grace that ``systemctl stop`` may take before the daemon stops waiting."""

SD_NOTIFY_TIMEOUT = 1.0
"""Seconds an sd_notify message may block on a full socket queue before it is given up: the watchdog
ping runs on the daemon's own threads, and a wedged service manager must not wedge the daemon with it
(systemd notices the missing pings on its own)."""

KILL_CONFIRM_WAIT = 2.0
"""Seconds to wait after SIGKILL for the kernel to take an agent's processes away."""

MAX_DURATION = 10 * 365 * 86400.0
"""The longest duration a config or a command accepts (ten years: anything longer is a typo)."""

WEB_MAX_CONNECTIONS = 32
"""Connections the status page holds open at once; one more is closed as it is accepted, so a flood
of idle connections costs the daemon at most this many descriptors (its clock shares them)."""

WEB_REQUEST_TIMEOUT = 10.0
"""Seconds a connection to the status page may take to send a request (from its accept, or from the
previous response) before it is closed: an idle or trickling client cannot keep its descriptor."""

WEB_REFRESH_SECONDS = 15
"""How often an open status page refreshes itself (a fetch of the same URL, when the tab is visible)."""

WEB_REPORT_CACHE_SECONDS = 30.0
"""The handoff report replays the whole ledger: the status page's ``/report`` rebuilds it at most this
often (and does not refresh itself)."""

WEB_BACKLOG = 16
"""The status page's listen backlog: connections the kernel queues (holding none of the daemon's
descriptors), and the most asyncio accepts in one go before the cap of :data:`WEB_MAX_CONNECTIONS`
closes the ones over it: the server holds at most that cap plus a few such batches of descriptors."""

WEB_ERROR_LOG_EVERY = 60.0
"""Seconds between two log lines of the same status-page server error (``socket.accept() out of
system resource`` repeats thousands of times a second while descriptors are short); the next line
says how many were left out."""
CLOCK_STEP_TOLERANCE = 1.0
"""Seconds the wall clock may move apart from the monotonic one between two looks before the
daemon calls it a step (logs ``clock_stepped`` and re-arms its scheduler); NTP's slewing stays far below."""

BOOT_TIME_MOVED = 0.5
"""Seconds the boot time estimated from the clocks (the wall clock less ``CLOCK_BOOTTIME``) must
move (a step, or slewing adding up) before a pass reads the kernel's boot time again."""

CLOCK_CHECK_EVERY = 1.0
"""Seconds, at most, between the daemon's looks for a wall-clock step (its main thread, on the monotonic clock)."""

TEST_CLOCK_ENV = "HEARTBEAT_TEST_CLOCK_OFFSET_FILE"
"""A test seam, never for production: ``heartbeat run`` started with this set reads its wall clock
as the machine's plus the seconds written in that file, re-read at every look, so a test (the soak)
steps the daemon's wall clock by rewriting the file (:class:`heartbeat.system.clock.OffsetFileClock`). The
daemon logs ``test_clock`` at start when it is set."""

WEB_QUESTIONS_SHOWN = 50
"""Open questions the status page's list shows at its top (oldest first; the rest: ``heartbeat status``)."""

WEB_PAGE_SIZE = 100
"""Tasks on one page of the status page's list (``?per=`` chooses up to :data:`WEB_PAGE_MAX`)."""

WEB_PAGE_MAX = 500
"""The most tasks one page of the status page lists: a 10,000-task store is paged, never rendered whole."""

WEB_QUERY_MAX = 200
"""The longest ``?q=`` search the status page accepts."""

IRREVERSIBLE = ("git push*", "gh pr merge*", "gh release create*", "npm publish*", "twine upload*",
                "cargo publish*", "kubectl apply*", "kubectl delete*", "terraform apply*", "terraform destroy*",
                "docker push*", "helm upgrade*", "helm install*")
"""Shell command globs the rail holds until ``verify`` is fresh (``[guards] irreversible`` replaces them;
``[launchers.NAME] irreversible`` and a baton's ``irreversible`` replace those in turn)."""

MAX_GUARDS = 64
"""Guarded constraints one baton may hold (``[[guards]]``)."""

MAX_GUARD_GLOBS = 32
"""Globs one guard (``protect`` plus ``forbid``) or one ``irreversible`` list may hold."""

MAX_GUARD_GLOB_CHARS = 512
"""The longest guard glob, in characters; a longer one is refused with one line."""

MAX_GUARD_GLOB_STARS = 16
"""The most ``*`` one guard glob may hold (each costs the matcher a scan of the command)."""

RAIL_COMMAND_CHARS = 64 * 1024
"""Characters of a tool call's command or path the rail reads; a longer one is matched on its start."""

LIBRARY_REPEAT_QUIET = 60.0
"""Seconds a library's repeating warning (APScheduler's ``scheduler_job_skipped`` for a job stuck on
an unreachable database, every beat) stays quiet per job after it was logged."""

RAIL_REPLY_TIMEOUT = 10.0
"""Seconds a bound agent's hook waits for the daemon's rail to answer a ``PreToolUse`` before it
decides in its own process: well inside the agent CLI's hook timeout (``HOOK_TIMEOUT``), so a slow
daemon never turns a refusal into the CLI's timeout (which lets the call go on)."""

HOOK_RECORD_WAIT = 5.0
"""Seconds a hook waits, after printing a refusal, for the ledger to take its ``rail_refused`` record
before it exits without it (a locked ledger must not keep the agent's CLI past its hook timeout)."""

LOGS_FOLLOW_POLL = 0.5
"""Seconds between reads of an agent's log by ``heartbeat logs -f`` once it has printed all there was."""

STATUS_WATCH_INTERVAL = 2.0
"""Seconds between redraws of ``heartbeat status --watch`` when no interval is given."""

TRAIL_DEDUP_TAIL = 8 * 1024
"""Bytes at a trail's end read to see whether a tool call (by its ``tool_use_id``) was recorded already."""

LEARN_NEEDS = True
"""``[handoff] learn``: whether an edge's profile turns a part it keeps losing into a required need."""

LEARN_AFTER = 2
"""``[handoff] learn_after``: in how many of an edge role's last :data:`LEARN_WINDOW` handoffs a part
must have been re-derived (or missing, with ``learn_from``) before it becomes a learned need."""

LEARN_WINDOW = 3
"""``[handoff] learn_window``: how many of an edge role's latest handoffs the learning rule looks at."""

LEARN_FROM = "rederived"
"""``[handoff] learn_from``: what counts as a part lost in a handoff: ``rederived`` (the downstream said it
re-derived the part) or ``rederived+missing`` (also: the part was empty in the package)."""

QUESTION_WAIT = 1800.0
"""Seconds a question across the seam may wait unanswered before it escalates to a person
(``[daemon] question_wait``; 0: never)."""

MAX_QUESTIONS = 64
"""Questions one baton may hold (``[[questions]]``, answered ones included)."""

MAX_QUESTION_CHARS = 4000
"""The longest question, in characters; a longer one is refused with one line."""

MAX_ANSWER_CHARS = 16000
"""The longest answer, in characters; a longer one is refused with one line."""

QUESTION_BRIEF_CHARS = 1200
"""Characters of one question or answer the asker's brief carries; the rest is in ``heartbeat show ID``."""

QUESTION_EVENT_CHARS = 500
"""Characters of a question's text its ``asked`` event carries (the baton keeps it whole)."""

UPSTREAM_MISSING_GRACE = 2.0
"""Seconds after a task's creation before the daemon reports an upstream of it that does not exist
(``upstream_missing``): ``pipeline new`` writes a stage's downstreams before the stage itself."""
