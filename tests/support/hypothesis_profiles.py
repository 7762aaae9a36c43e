"""How many examples each hypothesis test draws: a few in the edit loop, the full count in CI.

``HYPOTHESIS_PROFILE=ci`` (set by scripts/test, so by CI) gives every test its full count;
unset (plain ``pytest``, the loop after every edit) a tenth of it, at least 10. tests/conftest.py
loads the profile; a test that names its own count passes it through :func:`examples`.
"""

from __future__ import annotations

import os

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or "fast"
"""``ci`` or ``fast``: the profile tests/conftest.py loads."""

FAST_SHARE = 10
"""The fast profile draws one example in this many (at least :data:`FAST_MIN`)."""

FAST_MIN = 10
"""The fewest examples a test draws in the fast profile."""


def examples(full: int) -> int:
    """``full`` under the ``ci`` profile; a tenth of it (at least 10) under ``fast``."""
    return full if PROFILE == "ci" else min(full, max(FAST_MIN, full // FAST_SHARE))


def register() -> None:
    """Register both profiles with hypothesis and load :data:`PROFILE`."""
    from hypothesis import settings

    if PROFILE not in ("ci", "fast"):
        raise SystemExit(f"HYPOTHESIS_PROFILE={PROFILE!r}: use ci or fast")
    settings.register_profile("ci", max_examples=100)  # hypothesis's own default
    settings.register_profile("fast", max_examples=examples(100))
    settings.load_profile(PROFILE)
