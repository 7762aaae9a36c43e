"""The ``heartbeat`` command (``bin/heartbeat`` and ``python -m heartbeat``): the entry.

An agent's touch is answered from its pulse (:mod:`heartbeat.pulse`), its set/add through the
daemon (:mod:`heartbeat.relay`), anything else by :mod:`heartbeat.cli`. Each is imported only
when reached: this module is what every ``heartbeat`` call loads first, and an agent's touch
must cost about one interpreter start.
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> int:
    """Run the command in ``sys.argv``; its exit code."""
    import os
    import sys

    from heartbeat.pulse import hot_touch

    argv = sys.argv[1:]
    if hot_touch(argv):
        return 0
    if argv[:1] in (["set"], ["add"]) or (argv[:1] in (["touch"], ["show"], ["done"])
                                          and os.environ.get("HEARTBEAT_STORE_URL")):  # written by the daemon
        # when one runs (heartbeat.relay); on a database store its touch, done and show too
        from heartbeat.relay import forward

        code = forward(argv)
        if code is not None:
            return code
    from heartbeat.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
