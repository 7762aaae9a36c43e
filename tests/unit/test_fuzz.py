"""Fuzzing the parsers: any input gives a value or a clear HeartbeatError, never another exception, never a hang.

Hypothesis drives ``parse_baton`` (arbitrary text, arbitrary bytes, TOML-shaped noise and
structured mutations of a valid baton: every known field given every TOML type), the
config parser (the same, over a valid config), ``Gate.parse``, ``parse_duration``,
``parse_instant``, ``check_id``, ``expand_argv`` and the CLI itself, in-process. The
worst inputs we know of (10,000 levels of nesting, 100,000-part dotted keys, a megabyte
of the slowest TOML that is still accepted) run in a subprocess with a timeout, so a hang
fails the test instead of freezing the suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from heartbeat.config.load import parse_config
from heartbeat.config.shape import Config, expand_argv
from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Gate, check_id, dump_baton, load_toml, parse_baton
from heartbeat.model.errors import BadInput, ConfigError, HeartbeatError, InvalidBaton
from heartbeat.model.timeparse import parse_duration, parse_instant
from heartbeat.store.files import FileStore

FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Enough examples to shake the parsers, few enough that the whole module runs in about 30 s."""

CALL_BOUND = 30.0
"""Seconds any single parse may take: a hang guard, not a speed test (speed is measured in
scripts/). A quadratic parser takes minutes on a megabyte; the accepted megabyte here takes 1-6 s
depending on the machine's load (5.6 s was seen under a load average of 11, over the old 5 s)."""


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``: return its value or the HeartbeatError it raised; anything else fails the test."""
    started = time.monotonic()
    try:
        result: Any = fn(*args, **kwargs)
    except HeartbeatError as exc:
        result = exc
        text = str(exc)
        assert text and "\n" not in text, f"an error must be one line: {text!r}"
    elapsed = time.monotonic() - started
    assert elapsed < CALL_BOUND, f"{getattr(fn, '__name__', fn)} took {elapsed:.1f}s"
    return result


# -- strategies ------------------------------------------------------------------------------

def _datetimes() -> st.SearchStrategy[datetime]:
    offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
    return st.one_of(
        st.datetimes(timezones=offsets),  # includes year 1 and 9999 with offsets: out of range in UTC
        st.datetimes(),
    )


TOML_SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=30),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),  # nan and inf included: TOML has them
    st.booleans(),
    _datetimes(),
    st.dates(),
    st.times(),
)

TOML_VALUES: st.SearchStrategy[Any] = st.recursive(
    TOML_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)

TOML_NOISE = st.lists(
    st.sampled_from([*"[]{}=.,'\"\\\n\t #abcxyz019-_:+TZ", '"""', "'''", "\\u", "inf", "nan", "true",
                     "task", "step", "meta", "owner", "gate"]),
    max_size=60,
).map("".join)
"""Text made of TOML's own punctuation and keywords: far more of it reaches the parser's corners."""

VALID_BATON: dict[str, Any] = {
    "task": "Fix empty responses",
    "intent": "Users get blank answers",
    "step": "Write the fix",
    "next_step": "Deploy",
    "blocked_on": "",
    "key_files": ["src/fallback.py"],
    "constraints": ["Do not touch prod"],
    "workdir": "/srv/agents/fallback",
    "launcher": "agent",
    "done": ["Reproduced"],
    "plan": ["Reproduce", "Write the fix", "Deploy"],
    "decisions": [],
    "rejected": [],
    "unknowns": [],
    "handoff": "",
    "custom": {"kept": [1, 2]},
    "meta": {
        "schema": 1,
        "id": "t1",
        "status": "active",
        "revision": 3,
        "epoch": 2,
        "attempt": 1,
        "dispatches": 2,
        "idle_resumes": 0,
        "created_at": datetime(2026, 11, 29, 6, 0, tzinfo=UTC),
        "updated_at": datetime(2026, 11, 29, 6, 59, tzinfo=UTC),
        "last_failure": "exit 1 after 4m12s",
        "last_exit": 1,
        "owner": {"pid": 4242, "create_time": 1764396000.5, "host": "h", "launcher": "agent", "how": "dispatch",
                  "started_at": datetime(2026, 11, 29, 6, 1, tzinfo=UTC), "session": "abc"},
        "gate": {"kind": "file", "target": "/tmp/go"},
        "world": {"src/fallback.py": "sha256:00"},
    },
}


def _paths(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in doc.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out.extend(_paths(value, (*prefix, key)))
    return out


BATON_PATHS = [*_paths(VALID_BATON), ("meta", "owner", "unit"), ("meta", "snooze_until"), ("meta", "ended_at")]


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc, default=str))  # a deep copy (times become strings: also valid)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _without(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = json.loads(json.dumps(doc, default=str))
    node = out
    for key in path[:-1]:
        node = node[key]
    node.pop(path[-1], None)
    return out


def _nested(depth: int, leaf: Any, kind: str) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "array" else {"k": value}
    return value


# -- the baton parser --------------------------------------------------------------------------

def check_baton_outcome(result: Any, path: str = "x.toml") -> None:
    """A parsed baton must also be writable and read back equal; an error must be InvalidBaton naming the file."""
    if isinstance(result, HeartbeatError):
        assert isinstance(result, InvalidBaton), f"{type(result).__name__}: {result}"
        assert result.path == path and str(result).startswith(path)
        return
    assert isinstance(result, Baton)
    text = dump_baton(result)
    again = parse_baton(text, path=path)
    # Compared as text: a NaN in an unknown key never equals itself, but it must survive the trip.
    assert dump_baton(again) == text


class TestBatonParser:
    """parse_baton: a Baton (that can be written back) or an InvalidBaton naming the file, whatever it reads."""

    @FUZZ
    @given(st.text())
    def test_arbitrary_text(self, text: str) -> None:
        """Any unicode text gives a baton or InvalidBaton."""
        check_baton_outcome(outcome(parse_baton, text, path="x.toml"))

    @FUZZ
    @given(st.binary(max_size=200))
    @example(b"\xff\xfe")
    @example(b"task = '\xed\xa0\x80'\nstep = 's'")  # an encoded surrogate: not UTF-8
    def test_arbitrary_bytes(self, data: bytes) -> None:
        """Any bytes (not UTF-8, NULs, BOMs) give a baton or InvalidBaton."""
        check_baton_outcome(outcome(parse_baton, data, path="x.toml"))

    @FUZZ
    @given(TOML_NOISE)
    def test_toml_shaped_noise(self, text: str) -> None:
        """Text made of TOML punctuation and baton keywords gives a baton or InvalidBaton."""
        check_baton_outcome(outcome(parse_baton, "task = 't'\nstep = 's'\n" + text, path="x.toml"))
        check_baton_outcome(outcome(parse_baton, text, path="x.toml"))

    @FUZZ
    @given(st.sampled_from(BATON_PATHS), TOML_VALUES)
    def test_every_field_with_every_type(self, path: tuple[str, ...], value: Any) -> None:
        """A valid baton with one field replaced by any TOML value: a baton that round-trips, or InvalidBaton."""
        doc = _set(VALID_BATON, path, value)
        try:
            text = tomli_w.dumps(doc)
        except (TypeError, ValueError):
            assume(False)  # a value tomli_w cannot write (a non-string key): not TOML
        result = outcome(parse_baton, text, path="x.toml", expected_id="t1")
        check_baton_outcome(result)
        if isinstance(result, InvalidBaton) and result.field and path[0] == "meta":
            assert result.field.split(".")[0] == "meta", str(result)

    @FUZZ
    @given(st.sampled_from(BATON_PATHS))
    def test_every_field_missing(self, path: tuple[str, ...]) -> None:
        """Dropping any one field gives a baton or InvalidBaton; only task and step are required."""
        result = outcome(parse_baton, tomli_w.dumps(_without(VALID_BATON, path)), path="x.toml")
        check_baton_outcome(result)
        if path in (("task",), ("step",)):
            assert isinstance(result, InvalidBaton) and result.field == path[0]

    @FUZZ
    @given(st.sampled_from(["array", "table"]), st.integers(1, 60), st.sampled_from(BATON_PATHS))
    def test_nesting_limit(self, kind: str, depth: int, path: tuple[str, ...]) -> None:
        """Nesting up to the limit may parse; deeper is always InvalidBaton, never RecursionError."""
        doc = _set(VALID_BATON, path, _nested(depth, 1, kind))
        result = outcome(parse_baton, tomli_w.dumps(doc), path="x.toml")
        check_baton_outcome(result)
        if depth + len(path) > defaults.MAX_NESTING:
            assert isinstance(result, InvalidBaton)

    @pytest.mark.parametrize("value", [
        "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "'9999-12-31T23:59:59-01:00'",
        "inf", "nan", "-inf", "1e999", "9223372036854775807", "-9223372036854775808", "1" * 5000,
        "0x" + "f" * 5000, "[[[[[]]]]]", "{a = {b = {c = 1}}}", "'\\u0000'", '"\\u0000"', '""""""',
        "2026-11-29", "06:59:00", "2026-11-29T06:59:00",
    ])
    @pytest.mark.parametrize("key", ["created_at", "revision", "epoch", "last_exit", "status", "id",
                                     "owner.pid", "owner.create_time", "owner.started_at", "gate.target",
                                     "gate.kind", "world.f"])
    def test_edge_values_in_meta(self, key: str, value: str) -> None:
        """Extreme times, numbers, integers too long to convert and odd strings in [meta] are values or InvalidBaton."""
        table, _, name = key.rpartition(".")
        header = f"[meta.{table}]" if table else "[meta]"
        text = f"task = 't'\nstep = 's'\n{header}\n{name} = {value}\n"
        check_baton_outcome(outcome(parse_baton, text, path="x.toml"))

    def test_owner_numbers_must_be_finite_and_in_range(self) -> None:
        """A create_time of inf or nan, or a revision past 2**53, is refused (it would break liveness or the ledger)."""
        for text in ("[meta.owner]\ncreate_time = inf", "[meta.owner]\ncreate_time = nan",
                     "[meta]\nrevision = 9223372036854775807", "[meta.owner]\npid = 9223372036854775807"):
            result = outcome(parse_baton, f"task = 't'\nstep = 's'\n{text}\n", path="x.toml")
            assert isinstance(result, InvalidBaton) and "out of range" in str(result), (text, result)

    @pytest.mark.parametrize("size", [1, 1000, 1024 * 1024])
    def test_huge_strings(self, size: int) -> None:
        """Megabyte strings in every text field parse (the store, not the parser, bounds a baton's size)."""
        big = "x" * size
        doc = _set(VALID_BATON, ("step",), big)
        doc["constraints"] = [big]
        doc["custom"] = {"s": big}
        result = outcome(parse_baton, tomli_w.dumps(doc), path="x.toml")
        assert isinstance(result, Baton) and result.step == big


# -- worst cases, in a subprocess so a hang fails instead of freezing ---------------------------









# -- the config parser -------------------------------------------------------------------------

VALID_CONFIG: dict[str, Any] = {
    "daemon": {"state_dir": "/var/lib/heartbeat", "tick": "30s", "stall_after": "10m", "progress_after": "1h",
               "max_attempts": 5, "max_idle_resumes": 3, "backoff_initial": "30s", "backoff_max": "30m",
               "dispatches_per_minute": 30, "max_concurrent": 4, "default_launcher": "agent",
               "on_spinning": "escalate", "log_format": "json", "log_level": "info"},
    "launchers": {"agent": {"type": "exec", "command": ["my-agent", "--task", "{id}", "--brief", "{brief_file}"],
                            "brief": "file", "cwd": "{workdir}", "env": {"MODEL": "large"},
                            "inherit_env": ["PATH"], "stop_grace": "10s", "max_runtime": "4h",
                            "max_concurrent": 2, "non_retryable_exit_codes": [3], "max_log_bytes": 1048576},
                  "dry": {"type": "null", "exit_code": 0, "runtime": "1s"}},
    "notify": {"ops": {"command": ["logger", "{id} escalated: {reason}"], "timeout": "10s"}},
    "checks": {"ci": {"command": ["./ci.sh", "{workdir}"], "timeout": "30s"}},
}
CONFIG_PATHS = _paths(VALID_CONFIG)


def check_config_outcome(result: Any) -> None:
    if isinstance(result, HeartbeatError):
        assert isinstance(result, ConfigError), f"{type(result).__name__}: {result}"
        assert str(result).startswith("c.toml"), str(result)
        return
    assert isinstance(result, Config)


class TestConfigParser:
    """parse_config: a Config or a ConfigError naming the file (and the key), whatever it reads."""

    def test_the_base_config_is_valid(self) -> None:
        """The config the mutations start from parses (so the mutations test something)."""
        assert isinstance(parse_config(tomli_w.dumps(VALID_CONFIG), path="c.toml"), Config)

    @FUZZ
    @given(st.text())
    def test_arbitrary_text(self, text: str) -> None:
        """Any text gives a Config or ConfigError."""
        check_config_outcome(outcome(parse_config, text, path="c.toml"))

    @FUZZ
    @given(TOML_NOISE)
    def test_toml_shaped_noise(self, text: str) -> None:
        """TOML punctuation after a valid [daemon] header gives a Config or ConfigError."""
        check_config_outcome(outcome(parse_config, "[daemon]\n" + text, path="c.toml"))

    @FUZZ
    @given(st.sampled_from(CONFIG_PATHS), TOML_VALUES)
    def test_every_key_with_every_type(self, path: tuple[str, ...], value: Any) -> None:
        """The valid config with one key replaced by any TOML value: a Config, or a ConfigError naming that key."""
        doc = _set(VALID_CONFIG, path, value)
        try:
            text = tomli_w.dumps(doc)
        except (TypeError, ValueError):
            assume(False)
        result = outcome(parse_config, text, path="c.toml")
        check_config_outcome(result)
        if isinstance(result, ConfigError) and result.field:
            assert result.field.split(".")[0] == path[0], (path, str(result))

    @FUZZ
    @given(st.text(max_size=12), st.text(max_size=12))
    def test_any_launcher_and_env_names(self, name: str, env_name: str) -> None:
        """Launcher names and env variable names of any text are accepted only when safe."""
        doc = {"launchers": {name: {"command": ["x"], "env": {env_name: "v"}}}, "daemon": {"default_launcher": name}}
        result = outcome(parse_config, tomli_w.dumps(doc), path="c.toml")
        check_config_outcome(result)
        if isinstance(result, Config):
            assert name in result.launchers and "=" not in env_name and "\0" not in env_name


# -- the small parsers -------------------------------------------------------------------------

ANY_OBJECT = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(10**400), 10**400), st.floats(),
                       st.text(), st.binary(max_size=10), st.lists(st.integers(), max_size=2), _datetimes())


class TestSmallParsers:
    """Durations, instants, gates, ids and argv templates: a value or BadInput for any input."""

    @FUZZ
    @given(st.one_of(ANY_OBJECT, TOML_NOISE, st.from_regex(r"\s*[0-9.]{0,30}(ms|s|m|h|d){0,3}\s*", fullmatch=True)))
    @example(10**400)
    @example("9" * 64)
    @example("1e999")
    def test_parse_duration(self, value: Any) -> None:
        """parse_duration gives finite seconds from 0 to ten years, or BadInput."""
        result = outcome(parse_duration, value, field="f")
        if not isinstance(result, HeartbeatError):
            assert isinstance(result, float) and math.isfinite(result) and 0 <= result <= 10 * 365 * 86400
        else:
            assert isinstance(result, BadInput) and result.field == "f"

    @FUZZ
    @given(st.one_of(ANY_OBJECT, TOML_NOISE, st.text().map(lambda s: "+" + s),
                     _datetimes().map(lambda d: d.isoformat())),
           st.one_of(st.none(), _datetimes().map(lambda d: d if d.tzinfo else d.replace(tzinfo=UTC))))
    @example("+3650d", datetime.max.replace(tzinfo=UTC))
    @example("9999-12-31T23:59:59-23:59", None)
    @example("0001-01-01T00:00:00+23:59", None)
    def test_parse_instant(self, value: Any, now: datetime | None) -> None:
        """parse_instant gives an aware UTC datetime or BadInput, even at the ends of the calendar."""
        result = outcome(parse_instant, value, field="f", now=now)
        if not isinstance(result, HeartbeatError):
            assert isinstance(result, datetime) and result.utcoffset() == timedelta(0)
        else:
            assert isinstance(result, BadInput)

    @FUZZ
    @given(st.one_of(st.text(), TOML_NOISE,
                     st.tuples(st.sampled_from(["human", "file", "time", "task", "check", "File", " file", ""]),
                               st.sampled_from([":", "", "::"]), st.one_of(st.text(), TOML_NOISE))
                     .map("".join)))
    @example("time:0001-01-01T00:00:00+23:59")
    @example("file:/a\0b")
    def test_gate_parse(self, spec: str) -> None:
        """Gate.parse gives a gate whose spec parses to itself, or BadInput naming the gate."""
        result = outcome(Gate.parse, spec)
        if isinstance(result, HeartbeatError):
            assert isinstance(result, BadInput)
            return
        assert "\0" not in result.target
        assert Gate.parse(result.spec()) == result

    @FUZZ
    @given(st.one_of(ANY_OBJECT, st.from_regex(r"[a-z0-9._/\\-]{0,70}", fullmatch=True)))
    @example("..")
    @example("a/../../etc/passwd")
    @example("a\n")
    def test_check_id(self, value: Any) -> None:
        """An accepted id names a file inside the batons dir; anything else is BadInput."""
        result = outcome(check_id, value)
        if isinstance(result, HeartbeatError):
            assert isinstance(result, BadInput)
            return
        batons = "/state/batons"
        path = os.path.normpath(os.path.join(batons, f"{result}.toml"))
        assert os.path.dirname(path) == batons and result == value

    @FUZZ
    @given(st.lists(st.text(st.sampled_from(list("{}ab_ ;$`'\"\n")), max_size=12), min_size=1, max_size=5),
           st.dictionaries(st.sampled_from(["id", "workdir", "epoch", "a", "", "{", "}"]),
                           st.one_of(st.text(), st.integers()), max_size=4))
    def test_expand_argv(self, argv: list[str], values: dict[str, Any]) -> None:
        """expand_argv keeps one argument per template argument, whatever the values hold."""
        result = outcome(expand_argv, argv, values)
        assert isinstance(result, list) and len(result) == len(argv) and all(isinstance(a, str) for a in result)
        for template, arg in zip(argv, result, strict=True):
            if "{" not in template and "}" not in template:
                assert arg == template

    @FUZZ
    @given(st.text(max_size=200))
    def test_load_toml_never_escapes(self, text: str) -> None:
        """load_toml, shared by both parsers, gives a dict or BadInput."""
        result = outcome(load_toml, text)
        assert isinstance(result, (dict, BadInput))


# -- the CLI, in-process -----------------------------------------------------------------------

COMMANDS = ["new", "show", "set", "add", "touch", "claim", "release", "snooze", "block", "unblock", "done", "fail",
            "retry", "brief", "verify", "status", "log", "report"]
WORDS = st.one_of(
    st.sampled_from(["t1", "t2", "--task", "--step", "--epoch", "--for", "--until", "--gate", "--on", "--by",
                     "--reason", "--note", "--json", "--budget", "--key-file", "--workdir", "--plan", "--pid",
                     "--expect-revision", "--launcher", "step=x", "task=", "blocked_on=x", "meta=1", "workdir=rel",
                     "workdir=/", "launcher=; touch PWNED", "launcher=ok", "constraints", "done", "key_files",
                     "../../etc/passwd", "1", "-1", "0",
                     "file:/tmp/x", "time:+1s", "check:c", "task:t2", "human", "10m", "$(touch PWNED)", "a\nb",
                     "9" * 30, "2026-11-29T06:59:00Z", "\x00"]),
    st.text(max_size=10),
)


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@pytest.fixture(scope="module")
def cli_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-fuzz")
    root.chmod(0o700)
    state = root / "state"
    state.mkdir(mode=0o700)
    return state


class TestCli:
    """heartbeat's main(): any argv gives an exit code and a one-line error, never a traceback."""

    @settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(COMMANDS), st.lists(WORDS, max_size=7))
    def test_any_arguments(self, cli_state: Path, command: str, words: list[str]) -> None:
        """main() returns 0-5 for any arguments; on failure stderr is one line starting 'heartbeat:'."""
        from heartbeat.cli.main import main

        out, err = io.StringIO(), io.StringIO()
        with environment(HEARTBEAT_STATE_DIR=str(cli_state)), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = main([command, *words])
            except SystemExit as exc:  # argparse's --help/--version
                code = int(exc.code or 0)
        assert code in (0, 1, 2, 3, 4, 5), (code, err.getvalue())
        lines = [line for line in err.getvalue().splitlines() if not line.startswith("heartbeat: warning:")]
        if code not in (0, 3, 4, 5):
            assert len(lines) == 1 and lines[0].startswith("heartbeat: "), err.getvalue()
        assert not (cli_state.parent / "PWNED").exists() and not Path("PWNED").exists()
        store = FileStore(str(cli_state))
        try:
            invalid = [str(e.error) for e in store.scan() if e.error is not None]
        finally:
            store.close()
        assert not invalid, f"the CLI wrote a baton it cannot read back: {invalid}"
