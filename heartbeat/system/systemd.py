"""The daemon's side of systemd's service protocol, with no third-party dependency.

``notify()`` speaks ``sd_notify(3)``: newline-separated ``KEY=VALUE`` states sent as one
datagram to the AF_UNIX socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means the
abstract namespace). ``watchdog_interval()`` reads ``$WATCHDOG_USEC`` the way
``sd_watchdog_enabled(3)`` does. Outside systemd both are harmless no-ops, so the daemon
calls them unconditionally.

``PLUMBING_ENV`` names the variables that belong to the daemon's own contract with
systemd: an agent that inherited them could send ``READY=1``/``WATCHDOG=1`` for the
daemon (or claim its socket-activation fds), so launchers strip them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from heartbeat.model import defaults

__all__ = [
    "PLUMBING_ENV",
    "STATUS_ORDER",
    "listening",
    "notify",
    "watchdog_interval",
    "status_line",
    "without_plumbing",
]

PLUMBING_ENV: tuple[str, ...] = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
)
"""Environment variables an agent must never inherit from the daemon."""

STATUS_ORDER: tuple[str, ...] = ("active", "blocked", "snoozed", "paused", "escalated", "failed", "done", "invalid")
"""The order states appear in ``STATUS=``: what needs attention first, finished work last."""

def listening(env: Mapping[str, str] = os.environ) -> bool:
    """Whether :func:`notify` has somewhere to send (``$NOTIFY_SOCKET`` set): a caller skips
    building what only systemd would read."""
    return bool(env.get("NOTIFY_SOCKET"))


def notify(*states: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send ``states`` (e.g. ``"READY=1"``, ``"STATUS=..."``) to ``$NOTIFY_SOCKET``.

    Returns True when the datagram was sent; False, doing nothing, when the variable is
    unset or empty, and False when the send fails. Never raises: a lost notification
    must not take the daemon down. A state containing a newline would be read as two
    states by systemd, so newlines inside a state are replaced by spaces.
    """
    address = env.get("NOTIFY_SOCKET", "")
    if not address or not states:
        return False
    if address.startswith("@"):
        target: str | bytes = b"\0" + address[1:].encode()
    elif address.startswith("/"):
        target = address
    else:
        # vsock: and other transports of newer systemd versions are not spoken here.
        return False
    payload = "\n".join(state.replace("\n", " ") for state in states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(defaults.SD_NOTIFY_TIMEOUT)
            sock.connect(target)
            sock.send(payload)
    except (OSError, ValueError):
        return False
    return True


def watchdog_interval(env: Mapping[str, str] = os.environ) -> float | None:
    """Seconds systemd waits for a ``WATCHDOG=1`` before it restarts us, or None.

    None when ``$WATCHDOG_USEC`` is absent, not a positive integer, or when
    ``$WATCHDOG_PID`` is set to some other process (the variables were inherited, not
    meant for us). The daemon pings at half of this.
    """
    raw_usec = env.get("WATCHDOG_USEC", "").strip()
    if not raw_usec:
        return None
    raw_pid = env.get("WATCHDOG_PID", "").strip()
    if raw_pid:
        try:
            if int(raw_pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000


def status_line(counts: Mapping[str, int]) -> str:
    """A one-line ``STATUS=`` text from task counts keyed by status.

    ``counts`` maps each status (``active``, ``blocked``, ... ``invalid``) to its number
    of tasks; the optional key ``running`` is how many agents are alive, a subset of the
    tasks rather than a state of its own, shown next to ``active``. States with no tasks
    are left out; unknown keys follow the known ones in name order. Example:
    ``"12 tasks: 4 active (3 running), 2 blocked, 6 done"``.
    """
    running = max(0, int(counts.get("running", 0)))
    states = {name: int(n) for name, n in counts.items() if name != "running" and int(n) > 0}
    total = sum(states.values())
    ordered = [name for name in STATUS_ORDER if name in states]
    ordered += sorted(name for name in states if name not in STATUS_ORDER)
    parts: list[str] = []
    for name in ordered:
        part = f"{states[name]} {name}"
        if name == "active" and running:
            part += f" ({running} running)"
        parts.append(part)
    if running and "active" not in states:
        parts.insert(0, f"{running} running")
    noun = "task" if total == 1 else "tasks"
    return f"{total} {noun}: {', '.join(parts)}" if parts else f"{total} {noun}"


def without_plumbing(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` without the variables of :data:`PLUMBING_ENV`."""
    return {key: value for key, value in env.items() if key not in PLUMBING_ENV}
