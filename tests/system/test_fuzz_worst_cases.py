"""The parsers' worst cases, each timed in a fresh interpreter of its own:
the slowest inputs found by the fuzzers (tests/unit/test_fuzz.py) stay bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, parse_baton
from tests.unit.test_fuzz import check_baton_outcome

_WORST_RUNNER = r"""
import json, sys, time
from heartbeat.model.baton import parse_baton
from heartbeat.config.load import parse_config
from heartbeat.model.errors import HeartbeatError
cases = json.load(sys.stdin)
for name, (parser, text) in cases.items():
    started = time.monotonic()
    try:
        (parse_baton if parser == "baton" else parse_config)(text, **({"path": "x.toml"}))
        result = "value"
    except HeartbeatError as exc:
        result = "error: " + str(exc)[:120]
    print(json.dumps({"case": name, "result": result, "seconds": round(time.monotonic() - started, 3)}), flush=True)
"""


def run_worst(cases: dict[str, tuple[str, str]], timeout: float) -> dict[str, dict[str, Any]]:
    """Parse each case in one subprocess; any exception other than HeartbeatError, or a hang, fails."""
    proc = subprocess.run([sys.executable, "-c", _WORST_RUNNER], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["case"] for r in rows] == list(cases)
    return {r["case"]: r for r in rows}


N = 10_000


DEEP = {
    "arrays": "x = " + "[" * N + "]" * N,
    "inline tables": "x = " + "{a = " * N + "1" + "}" * N,
    "arrays of inline tables": "x = " + "[{a = " * N + "1" + "}]" * N,
    "unclosed arrays": "x = " + "[" * N,
    "dotted key": ".".join(["a"] * N) + " = 1",
    "dotted key, 100k parts": ".".join(["a"] * 100_000) + " = 1",
    "spaced dotted key": " . ".join(["a"] * N) + " = 1",
    "quoted dotted key": ".".join(['"a"'] * N) + " = 1",
    "table header": "[" + ".".join(["a"] * N) + "]",
    "array-of-tables header": "[[" + ".".join(["a"] * N) + "]]",
    "dotted key in an inline table": "x = {" + ".".join(["a"] * N) + " = 1}",
    "33 dotted parts": ".".join(["a"] * 33) + " = 1",
}


class TestWorstCases:
    """The nastiest inputs known: each gives a value or a HeartbeatError, within a time bound, in a subprocess."""

    def test_deep_nesting_is_refused_quickly(self) -> None:
        """10,000 levels of arrays, inline tables, dotted keys, headers: refused, each in well under a second."""
        cases = {f"baton {k}": ("baton", "task = 't'\nstep = 's'\n" + v) for k, v in DEEP.items()}
        cases |= {f"config {k}": ("config", v) for k, v in DEEP.items()}
        rows = run_worst(cases, timeout=120)
        for row in rows.values():
            assert row["result"].startswith("error: "), row
            assert "nested too deeply" in row["result"] or "not valid TOML" in row["result"], row
            assert row["seconds"] < 2.0, row

    def test_thirty_two_dotted_parts_are_allowed(self) -> None:
        """The limit is exact: a key of 31 parts under the root is a valid unknown key (depth 32 counting the document)."""
        text = "task = 't'\nstep = 's'\n" + ".".join(["a"] * (defaults.MAX_NESTING - 1)) + " = 1\n"
        baton = parse_baton(text, path="x.toml")
        check_baton_outcome(baton)

    def test_text_that_looks_like_a_long_key_is_not_refused(self) -> None:
        """Dots in strings and comments are text: a value of 1,000 dotted words parses."""
        dotted = ".".join(["a"] * 1000)
        for text in (f"x = '{dotted}'", f'x = "{dotted}"', f"x = '''{dotted}'''", f'x = """\n{dotted}"""',
                     f"# {dotted}\nx = 1", f'x = "\\"{dotted}"'):
            baton = parse_baton(f"task = 't'\nstep = 's'\n{text}\n", path="x.toml")
            assert isinstance(baton, Baton), text

    @pytest.mark.slow
    def test_the_slowest_megabytes_are_bounded(self) -> None:
        """A megabyte of the slowest TOML still accepted (long keys, headers, arrays) parses in bounded time."""
        mb = defaults.MAX_BATON_BYTES
        head = "task = 't'\nstep = 's'\n"
        cases = {
            "31-part keys": ("baton", head + "".join(f"k{i}." + "a." * 29 + "a = 1\n" for i in range(mb // 70))),
            "15-part keys": ("baton", head + "".join(f"k{i}." + "a." * 13 + "a = 1\n" for i in range(mb // 35))),
            "headers": ("baton", head + "".join(f"[t{i}]\n" for i in range(mb // 10))),
            "a long array": ("baton", head + "x = [" + "1," * (mb // 2) + "]"),
            "escapes": ("baton", head + 'x = "' + "\\u0041" * (mb // 6) + '"'),
            "31-part chains in a string": ("baton", head + "x = '" + ("a." * 30 + "a ") * (mb // 64) + "'"),
            "quotes": ("baton", '"' * mb),
            "config of 31-part keys": ("config", "".join(f"k{i}." + "a." * 29 + "a = 1\n" for i in range(mb // 70))),
        }
        rows = run_worst(cases, timeout=300)
        for row in rows.values():
            assert row["seconds"] < 30, row


