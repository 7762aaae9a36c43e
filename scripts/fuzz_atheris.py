#!/usr/bin/env python3
"""Coverage-guided fuzzing of heartbeat's parsers with atheris (libFuzzer for Python).

The hypothesis tests in ``tests/unit/test_fuzz.py`` run in CI; this harness is for longer,
coverage-guided runs that instrument tomllib and heartbeat together, so inputs that
reach new branches of either are kept and mutated further. Every target holds the same
contract as the tests: any input gives a value or a ``HeartbeatError``; anything else
(an exception, a baton that parses but cannot be written back and read equal) is a
crash that libFuzzer saves as ``crash-<sha1>``; an input slower than ``-timeout`` is
saved as ``timeout-<sha1>``.

Usage (atheris is not a dependency of heartbeat; install it where you fuzz)::

    pip install atheris
    python scripts/fuzz_atheris.py baton  -max_total_time=300 [CORPUS_DIR ...] [libFuzzer flags]
    python scripts/fuzz_atheris.py config -max_total_time=300
    python scripts/fuzz_atheris.py small  -max_total_time=300   # gates, durations, instants, ids, argv

With no corpus directory a temporary one is seeded with a valid baton and config. A
TOML dictionary (``-dict``) is written and passed automatically unless one is given.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime

import atheris

with atheris.instrument_imports(include=["heartbeat", "tomllib", "tomli_w"]):
    import tomllib  # noqa: F401  (instrumented: its branches guide the fuzzer)

    from heartbeat.config.load import parse_config
    from heartbeat.config.shape import expand_argv
    from heartbeat.model.baton import Gate, check_id, dump_baton, parse_baton
    from heartbeat.model.errors import HeartbeatError
    from heartbeat.model.timeparse import parse_duration, parse_instant

__all__ = ["TARGETS", "main"]

SEED_BATON = b"""task = "Fix empty responses"
intent = "Users get blank answers"
step = "Write the fix"
key_files = ["src/fallback.py"]
constraints = ["Do not touch prod"]
workdir = "/srv/agents/fallback"
launcher = "agent"
plan = ["Reproduce", "Write the fix"]
custom = { kept = [1, 2.5, true, 1979-05-27T07:32:00Z] }

[meta]
schema = 1
id = "t1"
status = "blocked"
revision = 3
epoch = 2
created_at = 2026-11-29T06:00:00Z
[meta.owner]
pid = 4242
create_time = 1764396000.5
how = "dispatch"
[meta.gate]
kind = "time"
target = "2026-11-29T07:00:00+00:00"
[meta.world]
"src/fallback.py" = "sha256:00"
"""

SEED_CONFIG = b"""[daemon]
state_dir = "/var/lib/heartbeat"
tick = "30s"
stall_after = "10m"
max_attempts = 5
default_launcher = "agent"

[launchers.agent]
type = "exec"
command = ["my-agent", "--task", "{id}", "--brief", "{brief_file}"]
env = { MODEL = "large" }
inherit_env = ["PATH"]
max_log_bytes = 1048576
non_retryable_exit_codes = [3]

[notify.ops]
command = ["logger", "{id}: {reason}"]

[checks.ci]
command = ["./ci.sh", "{workdir}"]
timeout = "30s"
"""

DICTIONARY = ['"["', '"]"', '"[["', '"]]"', '"{"', '"}"', '"="', '"."', '","', '"\\""', '"\'"', '"\\"\\"\\""',
              '"\'\'\'"', '"\\\\u0000"', '"\\\\U0010FFFF"', '"inf"', '"nan"', '"true"', '"0x"', '"0o"', '"0b"',
              '"1979-05-27T07:32:00Z"', '"T"', '"Z"', '"+23:59"', '"task"', '"step"', '"meta"', '"owner"',
              '"gate"', '"world"', '"status"', '"blocked"', '"kind"', '"target"', '"pid"', '"create_time"',
              '"revision"', '"epoch"', '"launchers"', '"daemon"', '"command"', '"checks"', '"notify"',
              '"{id}"', '"{{"', '"}}"', '"ms"', '"30s"', '"human"', '"file:/"', '"time:"', '"task:"', '"check:"']


def baton_target(data: bytes) -> None:
    """parse_baton: a Baton whose TOML form reads back to the same TOML form, or a HeartbeatError.

    (Compared as text, not as objects: a ``nan`` never equals itself.)
    """
    try:
        baton = parse_baton(data, path="fuzz.toml")
    except HeartbeatError:
        return
    text = dump_baton(baton)
    again = dump_baton(parse_baton(text, path="fuzz.toml"))
    if again != text:
        raise AssertionError(f"a rewrite changed the baton:\n{text}\n---\n{again}")


def config_target(data: bytes) -> None:
    """parse_config: a Config or a HeartbeatError."""
    try:
        parse_config(data.decode("utf-8", "replace"), path="fuzz.toml")
    except HeartbeatError:
        return


def small_target(data: bytes) -> None:
    """Gate.parse, parse_duration, parse_instant, check_id, expand_argv on strings the fuzzer chooses."""
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 5)
    text = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 200))
    try:
        if which == 0:
            gate = Gate.parse(text)
            if Gate.parse(gate.spec()) != gate:
                raise AssertionError(f"gate spec does not round-trip: {text!r}")
        elif which == 1:
            parse_duration(text)
        elif which == 2:
            parse_duration(fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 300)))
        elif which == 3:
            parse_instant(text, now=datetime.max.replace(tzinfo=UTC) if fdp.ConsumeBool() else None)
        elif which == 4:
            check_id(text)
        else:
            argv = [text[: len(text) // 2], text[len(text) // 2:]]
            out = expand_argv(argv, {"id": fdp.ConsumeUnicodeNoSurrogates(20), "workdir": text})
            if len(out) != len(argv):
                raise AssertionError("expand_argv changed the number of arguments")
    except HeartbeatError:
        return


TARGETS: dict[str, tuple[Callable[[bytes], None], bytes]] = {
    "baton": (baton_target, SEED_BATON),
    "config": (config_target, SEED_CONFIG),
    "small": (small_target, b"\x00file:/tmp/x"),
}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.stderr.write(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [CORPUS_DIR ...] [libFuzzer flags]\n")
        sys.exit(2)
    target, seed = TARGETS[argv[1]]
    args = [argv[0], *argv[2:]]
    work = tempfile.mkdtemp(prefix=f"heartbeat-fuzz-{argv[1]}-")
    if not any(not a.startswith("-") for a in args[1:]):
        corpus = os.path.join(work, "corpus")
        os.mkdir(corpus)
        with open(os.path.join(corpus, "seed"), "wb") as handle:
            handle.write(seed)
        args.append(corpus)
    if not any(a.startswith("-dict=") for a in args):
        path = os.path.join(work, "toml.dict")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(DICTIONARY) + "\n")
        args.append(f"-dict={path}")
    if not any(a.startswith("-timeout=") for a in args):
        args.append("-timeout=10")
    atheris.Setup(args, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
