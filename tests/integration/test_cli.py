"""Every verb of the agents' CLI, run for real as a subprocess against a private state dir."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Result, clean_env
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from heartbeat.cli import parser
from heartbeat.model import defaults
from heartbeat.model.errors import BadInput

Hb = Callable[..., Result]


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


def _baton(state_dir: Path, task_id: str) -> dict[str, Any]:
    return tomllib.loads((state_dir / "batons" / f"{task_id}.toml").read_text())


def _batons(state_dir: Path) -> Path:
    """The batons dir, made as the store makes it, for tests that plant files before any command ran."""
    path = state_dir / "batons"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _snapshot(path: Path) -> tuple[bytes, int]:
    return (path.read_bytes() if path.is_file() and not path.is_symlink() else b""), os.lstat(path).st_mtime_ns


def _one_line_error(r: Result, code: int, *fragments: str) -> None:
    """A refused command: exactly one line on stderr, prefixed, with the fragments; the given exit code."""
    assert r.code == code, (r.code, r.out, r.err)
    assert r.err.startswith("heartbeat: "), r.err
    assert r.err.count("\n") == 1 and r.err.endswith("\n"), repr(r.err)
    for fragment in fragments:
        assert fragment in r.err, (fragment, r.err)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not the caller: someone else's agent."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


class TestSetup:
    def test_init_then_check_config_accepts_the_starter(self, hb: Hb, tmp_path: Path) -> None:
        """`init DIR` writes a starter config and a 0700 state dir that `check-config` accepts."""
        target = tmp_path / "site"
        r = hb("init", str(target))
        assert r.code == 0, r.err
        config = target / "heartbeat.toml"
        assert f"wrote {config}" in r.out
        assert oct((target / "state").stat().st_mode & 0o777) == "0o700"
        r = hb("--config", str(config), "check-config")  # the starter's my-agent is a placeholder: named
        assert r.code == 2 and "launchers.agent.command: 'my-agent' is not on PATH" in r.err, r.err
        (tmp_path / "my-agent").write_text("#!/bin/sh\n")
        (tmp_path / "my-agent").chmod(0o755)
        r = hb("--config", str(config), "check-config", env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
        assert r.code == 0, r.err
        assert r.out.startswith(f"ok: {config}: state_dir {target / 'state'}")

    def test_init_refuses_to_overwrite(self, hb: Hb, tmp_path: Path) -> None:
        """A second `init` in the same place is refused unless --force."""
        assert hb("init", str(tmp_path)).code == 0
        _one_line_error(hb("init", str(tmp_path)), 2, "exists already", "--force")
        assert hb("init", str(tmp_path), "--force").code == 0

    def test_no_command_prints_usage(self, hb: Hb) -> None:
        """`heartbeat` alone prints the usage and exits 2."""
        r = hb()
        assert r.code == 2 and "usage: heartbeat" in r.err

    def test_output_errors_are_one_line(self, hb: Hb, state_dir: Path) -> None:
        """Output that cannot be written (stdout on a full disk) is a one-line error, exit 1, not a traceback."""
        if not Path("/dev/full").exists():
            pytest.skip("needs /dev/full")
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "heartbeat", "status"], stdout=full, stderr=subprocess.PIPE,
                                  text=True, env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)), timeout=60)
        assert proc.returncode == 1
        assert proc.stderr == "heartbeat: No space left on device\n"

    def test_new_from_a_deleted_directory(self, state_dir: Path, tmp_path: Path) -> None:
        """`new` without --workdir, run from a directory that was deleted, says so (exit 2)."""
        gone = tmp_path / "gone"
        gone.mkdir()
        script = f'cd "{gone}" && rmdir "{gone}" && exec "{sys.executable}" -m heartbeat new g --task t --step s'
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                              env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), PYTHONPATH=str(ROOT)))
        assert proc.returncode == 2
        assert proc.stderr == "heartbeat: the current directory no longer exists: pass --workdir DIR\n"

    def test_unknown_command(self, hb: Hb) -> None:
        """An unknown command is one line naming the valid ones, exit 2."""
        _one_line_error(hb("frobnicate", "x"), 2, "invalid choice: 'frobnicate'", "'touch'")


class TestNewShowStatus:
    def test_new_then_show(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """`new` writes every given field; `show` prints the TOML baton."""
        r = hb("new", "fix", "--task", "Fix the fallback", "--step", "Read logs", "--intent", "Users see blanks",
               "--next", "Patch", "--key-file", "src/a.py", "--key-file", "b.md", "--constraint", "Not prod",
               "--plan", "Read logs", "--plan", "Patch", "--launcher", "agent", "--workdir", str(tmp_path))
        assert (r.code, r.out, r.err) == (0, "", "")
        doc = _baton(state_dir, "fix")
        assert doc["task"] == "Fix the fallback" and doc["intent"] == "Users see blanks"
        assert doc["key_files"] == ["src/a.py", "b.md"] and doc["plan"] == ["Read logs", "Patch"]
        assert doc["workdir"] == str(tmp_path) and doc["launcher"] == "agent"
        assert doc["meta"]["revision"] == 1 and doc["meta"]["status"] == "active" and doc["meta"]["epoch"] == 0
        assert set(doc["meta"]["world"]) == {"src/a.py", "b.md"}
        r = hb("show", "fix")
        assert r.code == 0 and tomllib.loads(r.out) == doc

    def test_new_claim_prints_epoch_1(self, hb_process: Hb, state_dir: Path) -> None:
        """`new --claim` creates the task owned by the caller's parent and prints epoch 1."""
        hb = hb_process  # the owner is the command's parent process: a process of its own
        r = hb("new", "c", "--task", "t", "--step", "s", "--claim")
        assert (r.code, r.out) == (0, "1\n")
        owner = _baton(state_dir, "c")["meta"]["owner"]
        assert owner["pid"] == os.getpid() and owner["how"] == "claim" and owner["create_time"] > 0

    def test_new_blocked_with_a_gate(self, hb: Hb, state_dir: Path) -> None:
        """`new --blocked-on --gate` starts blocked with that gate."""
        assert hb("new", "b", "--task", "t", "--step", "s", "--blocked-on", "approval", "--gate", "task:other").code == 0
        doc = _baton(state_dir, "b")
        assert doc["blocked_on"] == "approval" and doc["meta"]["status"] == "blocked"
        assert doc["meta"]["gate"] == {"kind": "task", "target": "other"}

    def test_new_refusals(self, hb: Hb, state_dir: Path) -> None:
        """A taken id is exit 5; a bad id, an empty step or a --gate without --blocked-on is exit 2."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        before = _snapshot(state_dir / "batons" / "a.toml")
        _one_line_error(hb("new", "a", "--task", "t2", "--step", "s2"), 5, "a: a task with this id exists already")
        assert _snapshot(state_dir / "batons" / "a.toml") == before
        _one_line_error(hb("new", "Bad", "--task", "t", "--step", "s"), 2, "bad task id 'Bad'")
        _one_line_error(hb("new", "e", "--task", "t", "--step", " "), 2, "step: must not be empty")
        _one_line_error(hb("new", "g", "--task", "t", "--step", "s", "--gate", "human"), 2, "--gate goes with --blocked-on")
        assert sorted(p.name for p in (state_dir / "batons").iterdir()) == ["a.toml"]

    def test_key_files_must_stay_inside_the_workdir(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """A key file escaping the workdir (by .. or by a symlink) is exit 2; nothing is created or changed."""
        work = tmp_path / "work"
        work.mkdir()
        (work / "etc").symlink_to("/etc")
        _one_line_error(hb("new", "k", "--task", "t", "--step", "s", "--workdir", str(work), "--key-file", "../x"),
                        2, "k: key_files: key file '../x' is outside the workdir")
        _one_line_error(hb("new", "k", "--task", "t", "--step", "s", "--workdir", str(work), "--key-file",
                           "etc/passwd"), 2, "is a link to /etc/passwd, outside the workdir")
        assert not (state_dir / "batons" / "k.toml").exists()
        assert hb("new", "k", "--task", "t", "--step", "s", "--workdir", str(work)).code == 0
        before = _snapshot(state_dir / "batons" / "k.toml")
        _one_line_error(hb("add", "k", "key_files", "../../etc/shadow"), 2, "outside the workdir")
        assert _snapshot(state_dir / "batons" / "k.toml") == before

    def test_show_json_mirrors_the_toml(self, hb: Hb, state_dir: Path) -> None:
        """`show --json` has the TOML's keys, `meta` nested, unknown keys included, times as ISO text."""
        assert hb("new", "j", "--task", "t", "--step", "s", "--claim", "--key-file", "a.txt").code == 0
        path = state_dir / "batons" / "j.toml"
        path.write_text(path.read_text().replace("[meta]", 'custom = { a = [1, "two"] }\n\n[meta]\nvendor = "v"'))
        doc = _baton(state_dir, "j")
        r = hb("show", "j", "--json")
        assert r.code == 0, r.err
        shown = json.loads(r.out)
        assert set(shown) == set(doc)
        assert isinstance(shown["meta"], dict) and set(shown["meta"]) == set(doc["meta"])
        assert isinstance(shown["meta"]["world"], dict) and set(shown["meta"]["owner"]) == set(doc["meta"]["owner"])
        assert shown["custom"] == {"a": [1, "two"]} and shown["meta"]["vendor"] == "v"
        assert shown["meta"]["owner"]["pid"] == doc["meta"]["owner"]["pid"]
        assert datetime.fromisoformat(shown["meta"]["updated_at"]) == doc["meta"]["updated_at"]

    def test_show_json_is_strict_json(self, hb: Hb, state_dir: Path) -> None:
        """Unknown keys holding inf, nan, dates and times still give standard JSON (no bare Infinity/NaN)."""
        assert hb("new", "n", "--task", "t", "--step", "s").code == 0
        path = state_dir / "batons" / "n.toml"
        path.write_text(path.read_text().replace(
            "[meta]", "big = inf\nsmall = -inf\nodd = nan\nday = 2026-01-01\nat = 07:32:00\nxs = [inf, 1.5]\n\n[meta]"))
        r = hb("show", "n", "--json")
        assert r.code == 0, r.err

        def refuse(constant: str) -> None:
            raise AssertionError(f"not JSON: {constant}")

        shown = json.loads(r.out, parse_constant=refuse)
        assert (shown["big"], shown["small"], shown["odd"]) == ("inf", "-inf", "nan")
        assert (shown["day"], shown["at"], shown["xs"]) == ("2026-01-01", "07:32:00", ["inf", 1.5])

    def test_status_json(self, hb: Hb, state_dir: Path) -> None:
        """`status --json` has one row per task, invalid batons included with their error."""
        assert hb("new", "a", "--task", "t", "--step", "first step").code == 0
        (state_dir / "batons" / "broken.toml").write_text("task = \n")
        r = hb("status", "--json")
        assert r.code == 0, r.err
        rows = {row["id"]: row for row in json.loads(r.out)["tasks"]}
        assert rows["a"]["status"] == "active" and rows["a"]["step"] == "first step"
        assert rows["a"]["revision"] == 1 and rows["a"]["epoch"] == 0 and rows["a"]["error"] is None
        assert rows["broken"]["status"] == "invalid" and "not valid TOML" in rows["broken"]["error"]
        r = hb("status")
        assert r.code == 0 and "broken" in r.out and "invalid" in r.out and "first step" in r.out

    def test_status_with_no_tasks(self, hb: Hb) -> None:
        """An empty state dir says so."""
        r = hb("status")
        assert (r.code, r.out) == (0, "no tasks\n")


class TestWrites:
    def test_set_and_add(self, hb: Hb, state_dir: Path) -> None:
        """`set` changes scalar fields, `add` appends to lists; each write bumps the revision by one."""
        assert hb("new", "w", "--task", "t", "--step", "one").code == 0
        assert hb("set", "w", "step=two", "next_step=three = four", "intent=").code == 0
        assert hb("add", "w", "done", "one", "a second thing").code == 0
        doc = _baton(state_dir, "w")
        assert doc["step"] == "two" and doc["next_step"] == "three = four" and doc["intent"] == ""
        assert doc["done"] == ["one", "a second thing"] and doc["meta"]["revision"] == 3

    def test_expect_revision(self, hb: Hb, state_dir: Path) -> None:
        """`--expect-revision` that matches writes; one that moved on is exit 5 and changes nothing."""
        assert hb("new", "r", "--task", "t", "--step", "s").code == 0
        assert hb("set", "r", "step=s2", "--expect-revision", "1").code == 0
        path = state_dir / "batons" / "r.toml"
        before = _snapshot(path)
        _one_line_error(hb("set", "r", "step=s3", "--expect-revision", "1"), 5,
                        "expected revision 1 but the baton is at revision 2")
        _one_line_error(hb("add", "r", "done", "x", "--expect-revision", "1"), 5, "expected revision 1")
        assert _snapshot(path) == before

    @pytest.mark.parametrize(("args", "fragments"), [
        (("set", "x", "blocked_on=free"), ("x: blocked_on: is set only through `heartbeat block`",)),
        (("set", "x", "meta.status=done"), ("x: meta.status: is managed by heartbeat",)),
        (("set", "x", "meta.x=1"), ("x: meta.x: is managed by heartbeat",)),
        (("set", "x", "done=all"), ("x: done: is a list: use `heartbeat add x done VALUE...`",)),
        (("set", "x", "colour=red"), ("x: colour: unknown field (settable: task, intent, step",)),
        (("set", "x", "step"), ("expected FIELD=VALUE, got 'step'",)),
        (("set", "x", "step= "), ("x: step: must not be empty",)),
        (("set", "x", "workdir=relative"), ("x: workdir: must be an absolute path",)),
        (("add", "x", "intent", "y"), ("x: intent: is not a list field",)),
        (("add", "x", "done", ""), ("x: done: items must be non-empty text",)),
        (("set", "Bad", "step=x"), ("bad task id 'Bad'",)),
        (("touch", "../x"), ("bad task id '../x'",)),
        (("set", "x", "step=y", "--epoch", "-1"), ("--epoch must not be negative",)),
    ])
    def test_bad_writes_are_refused_and_change_nothing(self, hb: Hb, state_dir: Path, args: tuple[str, ...],
                                                       fragments: tuple[str, ...]) -> None:
        """Each bad write is one line on stderr, exit 2, and the baton is byte-for-byte unchanged."""
        assert hb("new", "x", "--task", "t", "--step", "s").code == 0
        path = state_dir / "batons" / "x.toml"
        before = _snapshot(path)
        _one_line_error(hb(*args), 2, *fragments)
        assert _snapshot(path) == before

    def test_missing_task(self, hb: Hb) -> None:
        """Writing a task that does not exist is exit 1 naming where it looked."""
        _one_line_error(hb("touch", "ghost"), 1, "ghost: no such task (looked for")

    def test_touch_is_not_progress(self, hb: Hb, state_dir: Path) -> None:
        """`touch` bumps revision and touched_at only."""
        assert hb("new", "t", "--task", "t", "--step", "s").code == 0
        before = _baton(state_dir, "t")["meta"]
        assert hb("touch", "t").code == 0
        after = _baton(state_dir, "t")["meta"]
        assert after["revision"] == 2 and after["touched_at"] > before["touched_at"]
        assert after["updated_at"] == before["updated_at"] and after["progress_at"] == before["progress_at"]


class TestFencing:
    @pytest.fixture
    def claimed(self, hb: Hb, state_dir: Path) -> Path:
        """A task claimed twice: its epoch is 2, so epoch 1 is a superseded agent."""
        assert hb("new", "f", "--task", "t", "--step", "s", "--claim").out == "1\n"
        assert hb("claim", "f").out == "2\n"
        return state_dir / "batons" / "f.toml"

    @pytest.mark.parametrize("verb", [("set", "f", "step=zombie"), ("add", "f", "done", "zombie"), ("touch", "f"),
                                      ("done", "f"), ("snooze", "f", "--for", "1m"), ("block", "f", "--on", "z"),
                                      ("release", "f"), ("fail", "f", "--reason", "zombie")])
    def test_old_epoch_flag_is_refused(self, hb: Hb, claimed: Path, verb: tuple[str, ...]) -> None:
        """Every write verb with `--epoch` older than the baton's is exit 5, and the file is byte-identical."""
        before = _snapshot(claimed)
        _one_line_error(hb(*verb, "--epoch", "1"), 5, "f: epoch 1 has been superseded by epoch 2")
        assert _snapshot(claimed) == before

    def test_old_epoch_from_the_environment_is_refused(self, hb: Hb, claimed: Path) -> None:
        """HEARTBEAT_EPOCH with HEARTBEAT_TASK naming this task fences the write like --epoch."""
        before = _snapshot(claimed)
        env = {"HEARTBEAT_EPOCH": "1", "HEARTBEAT_TASK": "f"}
        _one_line_error(hb("set", "f", "step=zombie", env=env), 5, "superseded by epoch 2")
        _one_line_error(hb("touch", "f", env=env), 5, "superseded by epoch 2")
        assert _snapshot(claimed) == before

    def test_current_epoch_writes(self, hb: Hb, state_dir: Path, claimed: Path) -> None:
        """The holder's own epoch, by flag or environment, is accepted; --epoch wins over the environment."""
        assert hb("set", "f", "step=mine", env={"HEARTBEAT_EPOCH": "2", "HEARTBEAT_TASK": "f"}).code == 0
        assert hb("set", "f", "step=flag", "--epoch", "2", env={"HEARTBEAT_EPOCH": "1", "HEARTBEAT_TASK": "f"}).code == 0
        assert _baton(state_dir, "f")["step"] == "flag"

    def test_epoch_of_another_task_does_not_fence(self, hb: Hb, state_dir: Path, claimed: Path) -> None:
        """An agent's HEARTBEAT_EPOCH belongs to its HEARTBEAT_TASK: it does not fence another task, and
        that agent's write to another task is refused outright (tests/external/test_own_task.py), never unfenced."""
        before = _baton(state_dir, "f")["step"]
        _one_line_error(hb("set", "f", "step=helper", env={"HEARTBEAT_EPOCH": "1", "HEARTBEAT_TASK": "other"}), 2,
                        "launched for task 'other'")
        assert _baton(state_dir, "f")["step"] == before
        assert hb("set", "f", "step=helper", env={"HEARTBEAT_TASK": "other"}).code == 0  # bound by hand: a person

    def test_bad_epoch_in_the_environment(self, hb: Hb, claimed: Path) -> None:
        """A HEARTBEAT_EPOCH that is not a number is exit 2, not ignored."""
        _one_line_error(hb("touch", "f", env={"HEARTBEAT_EPOCH": "two"}), 2, "HEARTBEAT_EPOCH is not an integer")


class TestClaimRelease:
    def test_claim_of_a_task_held_by_a_live_agent(self, hb_process: Hb, state_dir: Path,
                                                  sleeper: subprocess.Popen[bytes]) -> None:
        """`claim` of a task held by another live process is exit 5, unless --force (which bumps the epoch)."""
        hb = hb_process  # the owner is the command's parent process: a process of its own
        assert hb("new", "h", "--task", "t", "--step", "s").code == 0
        assert hb("claim", "h", "--pid", str(sleeper.pid)).out == "1\n"
        path = state_dir / "batons" / "h.toml"
        before = _snapshot(path)
        _one_line_error(hb("claim", "h"), 5, f"held by a live agent (pid {sleeper.pid}", "--force")
        assert _snapshot(path) == before
        r = hb("claim", "h", "--force")
        assert (r.code, r.out) == (0, "2\n")
        meta = _baton(state_dir, "h")["meta"]
        assert meta["owner"]["pid"] == os.getpid() and meta["epoch"] == 2

    def test_claim_from_a_dead_owner_needs_no_force(self, hb: Hb, state_dir: Path,
                                                    sleeper: subprocess.Popen[bytes]) -> None:
        """When the holder has died, `claim` takes the task without --force."""
        assert hb("new", "d", "--task", "t", "--step", "s").code == 0
        assert hb("claim", "d", "--pid", str(sleeper.pid)).code == 0
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        assert hb("claim", "d").out == "2\n"

    def test_claim_refusals(self, hb: Hb, state_dir: Path) -> None:
        """A --pid that runs no process is exit 2; claiming a finished task is exit 4."""
        assert hb("new", "c", "--task", "t", "--step", "s").code == 0
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        _one_line_error(hb("claim", "c", "--pid", str(dead.pid)), 2, f"no running process with pid {dead.pid}")
        assert hb("done", "c").code == 0
        _one_line_error(hb("claim", "c"), 4, "cannot claim: the task is done")

    def test_release_clears_the_owner(self, hb: Hb, state_dir: Path) -> None:
        """`release` hands the task back: no owner, still active, same epoch."""
        assert hb("new", "r", "--task", "t", "--step", "s", "--claim").code == 0
        assert hb("release", "r").code == 0
        meta = _baton(state_dir, "r")["meta"]
        assert "owner" not in meta and meta["status"] == "active" and meta["epoch"] == 1


class TestLifecycle:
    def test_snooze_for_and_until(self, hb: Hb, state_dir: Path) -> None:
        """`snooze --for` and `--until` set status snoozed and the wake time."""
        assert hb("new", "s", "--task", "t", "--step", "s").code == 0
        start = datetime.now(UTC)
        assert hb("snooze", "s", "--for", "10m").code == 0
        meta = _baton(state_dir, "s")["meta"]
        assert meta["status"] == "snoozed"
        assert start + timedelta(minutes=10) <= meta["snooze_until"] <= datetime.now(UTC) + timedelta(minutes=10)
        assert hb("snooze", "s", "--until", "2030-01-02T03:04:05Z").code == 0
        assert _baton(state_dir, "s")["meta"]["snooze_until"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

    @pytest.mark.parametrize(("args", "fragment"), [
        ((), "give one of --until ISO8601 or --for DURATION"),
        (("--for", "10m", "--until", "2030-01-01T00:00:00Z"), "give one of"),
        (("--for", "soon"), "--for: bad duration 'soon'"),
        (("--until", "tomorrow"), "--until: bad time 'tomorrow'"),
    ])
    def test_snooze_refusals(self, hb: Hb, state_dir: Path, args: tuple[str, ...], fragment: str) -> None:
        """A snooze without exactly one good time is exit 2 and changes nothing."""
        assert hb("new", "s", "--task", "t", "--step", "s").code == 0
        before = _snapshot(state_dir / "batons" / "s.toml")
        _one_line_error(hb("snooze", "s", *args), 2, fragment)
        assert _snapshot(state_dir / "batons" / "s.toml") == before

    @pytest.mark.parametrize(("gate", "stored"), [
        ("human", {"kind": "human", "target": ""}),
        ("file:/srv/flags/approved", {"kind": "file", "target": "/srv/flags/approved"}),
        ("time:2030-01-02T03:04:05Z", {"kind": "time", "target": "2030-01-02T03:04:05+00:00"}),
        ("task:upstream", {"kind": "task", "target": "upstream"}),
        ("check:ci-green", {"kind": "check", "target": "ci-green"}),
    ])
    def test_block_stores_every_gate_kind_and_unblock_lifts_it(self, hb: Hb, state_dir: Path, gate: str,
                                                               stored: dict[str, str]) -> None:
        """`block --gate` stores the gate and blocked_on; `unblock --by` makes the task active again."""
        assert hb("new", "b", "--task", "t", "--step", "s").code == 0
        assert hb("block", "b", "--on", "waiting for it", "--gate", gate).code == 0
        doc = _baton(state_dir, "b")
        assert doc["blocked_on"] == "waiting for it" and doc["meta"]["status"] == "blocked"
        assert doc["meta"]["gate"] == stored
        assert hb("unblock", "b", "--by", "alice", "--note", "checked").code == 0
        doc = _baton(state_dir, "b")
        assert doc["blocked_on"] == "" and doc["meta"]["status"] == "active" and "gate" not in doc["meta"]

    def test_block_refusals(self, hb: Hb, state_dir: Path) -> None:
        """A bad gate is exit 2; unblocking a task that is not blocked is exit 4; an empty --by is exit 2."""
        assert hb("new", "b", "--task", "t", "--step", "s").code == 0
        _one_line_error(hb("block", "b", "--on", "x", "--gate", "door:3"), 2, "gate: bad gate 'door:3'")
        _one_line_error(hb("block", "b", "--on", "x", "--gate", "file:relative"), 2, "absolute path")
        _one_line_error(hb("unblock", "b", "--by", "alice"), 4, "cannot unblock: the task is active")
        assert hb("block", "b", "--on", "x").code == 0
        _one_line_error(hb("unblock", "b", "--by", " "), 2, "name who unblocks")

    def test_done_fail_retry(self, hb: Hb, state_dir: Path) -> None:
        """`done` finishes; `fail` records the reason; `retry` re-arms a failed task, but not an active one (exit 4)."""
        assert hb("new", "d", "--task", "t", "--step", "s").code == 0
        assert hb("done", "d", "--note", "shipped").code == 0
        assert _baton(state_dir, "d")["meta"]["status"] == "done"
        _one_line_error(hb("fail", "d", "--reason", "late"), 4, "cannot fail: the task is done")
        assert hb("new", "f", "--task", "t", "--step", "s").code == 0
        _one_line_error(hb("retry", "f", "--by", "alice"), 4, "cannot retry: the task is active")
        assert hb("fail", "f", "--reason", "quota exhausted").code == 0
        meta = _baton(state_dir, "f")["meta"]
        assert meta["status"] == "failed" and meta["last_failure"] == "quota exhausted"
        assert hb("retry", "f", "--by", "alice", "--note", "quota raised").code == 0
        assert _baton(state_dir, "f")["meta"]["status"] == "active"

    def test_retry_of_an_escalated_task(self, hb: Hb, state_dir: Path) -> None:
        """An escalated task (as the daemon leaves it) is re-armed by `retry`, attempts reset."""
        from heartbeat.model.baton import Status
        from heartbeat.store.files import FileStore

        assert hb("new", "e", "--task", "t", "--step", "s").code == 0
        store = FileStore(str(state_dir))
        with store.edit("e") as ed:
            ed.baton.meta.status = Status.ESCALATED
            ed.baton.meta.attempt = 5
            ed.event("escalated", reason="5 attempts without progress")
        store.close()
        assert hb("retry", "e", "--by", "alice").code == 0
        meta = _baton(state_dir, "e")["meta"]
        assert meta["status"] == "active" and meta["attempt"] == 0

    def test_log_json(self, hb: Hb) -> None:
        """`log --json` prints the task's events in order as one JSON document."""
        assert hb("new", "l", "--task", "t", "--step", "s").code == 0
        assert hb("set", "l", "step=two").code == 0
        r = hb("log", "l", "--json")
        assert r.code == 0, r.err
        doc = json.loads(r.out)
        assert doc["task"] == "l" and [e["kind"] for e in doc["events"]] == ["created", "updated"]
        assert doc["events"][1]["data"]["changed"] == ["step"] and doc["events"][1]["revision"] == 2
        r = hb("log", "l")
        assert r.code == 0 and "created" in r.out and "updated" in r.out


class TestBadBatonFiles:
    """Hostile or broken files where a baton should be: refused in one line, never touched."""

    def _check(self, hb: Hb, path: Path, code: int, *fragments: str) -> None:
        task_id = path.name.removesuffix(".toml")
        before = _snapshot(path)
        for args in (("show", task_id), ("set", task_id, "step=overwritten")):
            _one_line_error(hb(*args, timeout=20), code, *fragments)
        assert _snapshot(path) == before
        rows = {row["id"]: row for row in json.loads(hb("status", "--json").out)["tasks"]}
        assert rows[task_id]["status"] == "invalid"

    def test_symlink(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """A baton that is a symlink is refused (exit 2) and the link's target is not written through."""
        assert hb("new", "real", "--task", "t", "--step", "s").code == 0
        target = tmp_path / "target.toml"
        target.write_text((state_dir / "batons" / "real.toml").read_text().replace('id = "real"', 'id = "link"'))
        link = state_dir / "batons" / "link.toml"
        link.symlink_to(target)
        target_before = _snapshot(target)
        self._check(hb, link, 2, f"{link}: is a symbolic link")
        assert _snapshot(target) == target_before

    def test_fifo(self, hb: Hb, state_dir: Path) -> None:
        """A FIFO is refused at once (the commands run with a timeout: blocking on it fails the test)."""
        fifo = _batons(state_dir) / "pipe.toml"
        os.mkfifo(fifo)
        self._check(hb, fifo, 2, f"{fifo}: is not a regular file")

    def test_over_one_mebibyte(self, hb: Hb, state_dir: Path) -> None:
        """A baton over 1 MiB is refused naming its size."""
        path = _batons(state_dir) / "big.toml"
        path.write_text('task = "t"\nstep = "s"\nnotes = "' + "x" * defaults.MAX_BATON_BYTES + '"\n')
        self._check(hb, path, 2, f"{path}: is {path.stat().st_size} bytes; a baton may be at most 1048576 bytes")

    def test_unreadable(self, hb: Hb, state_dir: Path) -> None:
        """A baton this user cannot read is refused as unreadable."""
        if os.geteuid() == 0:
            pytest.skip("running as root: chmod 000 does not stop root from reading the file")
        assert hb("new", "u", "--task", "t", "--step", "s").code == 0
        path = state_dir / "batons" / "u.toml"
        path.chmod(0)
        self._check(hb, path, 2, f"{path}: unreadable: Permission denied")

    @pytest.mark.parametrize(("content", "fragment"), [
        ('task = "t"\nstep = \n', "not valid TOML"),
        ('task = "t"\nstep = 3\n', "step: expected a string, got 3"),
        ('task = "t"\nstep = "s"\nkey_files = "a.py"\n', "key_files: expected a list of strings"),
        ('task = "t"\nstep = "s"\n[meta]\nschema = 2\n', "meta.schema: written by a newer heartbeat (schema 2"),
        ('task = "t"\nstep = "s"\n[meta]\nid = "someone-else"\n', "meta.id: is 'someone-else' but the file is named"),
        ('task = "t"\nstep = "s"\n[meta]\nstatus = "running"\n', "meta.status: unknown status 'running'"),
        (b'task = "\xff"\n', "not UTF-8 text"),
    ])
    def test_invalid_content(self, hb: Hb, state_dir: Path, content: str | bytes, fragment: str) -> None:
        """Invalid TOML, wrong types, a newer schema or another task's id: exit 2 naming file and field."""
        path = _batons(state_dir) / "bad.toml"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        self._check(hb, path, 2, f"{path}: ", fragment)

    def test_group_writable_state_dir(self, hb: Hb, state_dir: Path) -> None:
        """A state dir others can write to is refused for every command, with the chmod that fixes it."""
        state_dir.chmod(0o777)
        try:
            for args in (("status",), ("show", "x"), ("touch", "x")):
                _one_line_error(hb(*args), 2, f"{state_dir}: state dir is group- and world-writable (mode 0777)",
                                f"fix it with: chmod go-w {state_dir}")
        finally:
            state_dir.chmod(0o700)


def _imports_of(args: list[str], state_dir: Path, env: dict[str, str] | None = None, code: str = "") -> set[str]:
    # The command as an agent runs it (bin/heartbeat, the installed script), not `python -m heartbeat`,
    # whose runpy loads importlib.util and contextlib: an editable install's import finder loaded those
    # in the `-c pass` baseline too, and hid them (scripts/test now installs without that finder).
    program = ["-c", code] if code else [str(ROOT / "bin" / "heartbeat"), *args]
    proc = subprocess.run([sys.executable, "-X", "importtime", *program],
                          env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), **(env or {})), capture_output=True,
                          text=True, cwd=str(ROOT), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


class TestHotPath:
    HEAVY = ("apscheduler", "watchdog", "structlog", "psutil")

    @pytest.mark.parametrize("args", [["touch", "hot"], ["set", "hot", "step=next"], ["add", "hot", "done", "x"],
                                      ["set", "hot", "step=flagged", "--epoch", "0"]])
    def test_agent_writes_do_not_import_the_daemon_stack(self, hb: Hb, state_dir: Path, args: list[str]) -> None:
        """The calls an agent makes often import no scheduler, watcher, structlog or psutil, and no config
        parser when HEARTBEAT_STATE_DIR is set."""
        assert hb("new", "hot", "--task", "t", "--step", "s").code == 0
        modules = _imports_of(args, state_dir)
        assert "heartbeat.tasks.verbs" in modules  # the measurement works
        roots = {name.split(".")[0] for name in modules}
        assert not roots & set(self.HEAVY), sorted(roots & set(self.HEAVY))
        assert "heartbeat.config.load" not in modules

    @pytest.mark.parametrize("args", [["set", "hot", "step=next"], ["add", "hot", "done", "x"]])
    def test_agent_writes_load_no_inspect_or_openssl(self, hb: Hb, state_dir: Path, args: list[str]) -> None:
        """An agent's set or add (key files hashed) loads neither inspect (with ast, dis, tokenize), which
        dataclasses imports for a call it does not make here, nor hashlib's OpenSSL, nor argparse."""
        (state_dir / "k.txt").write_text("k")
        epoch = hb("new", "hot", "--task", "t", "--step", "s", "--claim", "--workdir", str(state_dir),
                   "--key-file", "k.txt").out.strip()
        env = {"HEARTBEAT_EPOCH": epoch, "HEARTBEAT_TASK": "hot"}
        modules = _imports_of(args, state_dir, env) - _imports_of([], state_dir, env, code="pass")
        assert "heartbeat.system.world" in modules and "dataclasses" in modules  # the measurement works
        assert not modules & {"inspect", "ast", "dis", "tokenize", "_hashlib", "argparse", "importlib.util"}

    @pytest.mark.parametrize("event", ["PostToolUse", "PostToolUseFailure"])
    def test_a_tool_calls_end_loads_only_the_trail(self, hb: Hb, state_dir: Path, event: str) -> None:
        """A launched agent's ``heartbeat hook claude`` at a tool call's end (every call Claude Code makes)
        appends its trail line with heartbeat.hotpath's trail alone: no hook runtime, store, config or
        inspect (the full hook cost three times an interpreter start)."""
        epoch = hb("new", "hot", "--task", "t", "--step", "s", "--claim").out.strip()
        (state_dir / "logs" / "hot").mkdir(parents=True, exist_ok=True, mode=0o700)
        env = {"HEARTBEAT_EPOCH": epoch, "HEARTBEAT_TASK": "hot"}
        payload = json.dumps({"hook_event_name": event, "tool_name": "Bash", "tool_input": {"command": "ls"},
                              "tool_response": {"stdout": ""}, "session_id": "s"})
        proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "bin" / "heartbeat"), "hook", "claude"],
                              input=payload, env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), **env),
                              capture_output=True, text=True, cwd=str(ROOT), timeout=60)
        assert proc.returncode == 0 and proc.stdout == "", proc.stderr[-2000:]
        modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert "heartbeat.hotpath.trail" in modules  # the measurement works
        trail = (state_dir / "logs" / "hot" / f"{epoch}.trail").read_text()
        assert json.loads(trail.splitlines()[-1])["ev"] == "end", trail
        assert not modules & {"heartbeat.integrations.hooks", "heartbeat.store", "heartbeat.config.load", "inspect",
                              "sqlite3", "tomllib", "argparse"}, sorted(modules)

    @pytest.mark.parametrize(("args", "fast"), [
        (["claude"], True), (["codex"], True), (["claude", "--task", "t"], True), (["claude", "--config=c"], True),
        (["claude", "--state-dir", "d", "--task=t"], True), ([], False), (["gemini"], False),
        (["claude", "--task"], False), (["claude", "x"], False), (["claude", "--other", "v"], False),
        (["-x"], False), (["claude", "claude"], False)])
    def test_the_hooks_fast_way_takes_only_what_the_full_hook_takes_silently(self, args: list[str], fast: bool) -> None:
        """The tool-call end's fast way (heartbeat.__main__) takes only arguments the full hook parses
        without a word to say; anything else goes the full way, which says what is wrong."""
        from heartbeat.hotpath.argv import HOOK_AGENTS, hook_args
        from heartbeat.integrations.hooks import hook_main

        agent, _, problem = hook_args(args)
        assert (agent in HOOK_AGENTS and not problem) is fast
        if fast:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                hook_main(args, stdin=io.BytesIO(b'{"hook_event_name": "PostToolUse"}'))
            assert err.getvalue() == "", err.getvalue()

    def test_importing_the_cli_leaves_the_module_table_alone(self) -> None:
        """Importing heartbeat.cli.main (as the MCP server, the hooks and tests do) puts no stand-in in
        sys.modules: inspect is either not loaded or the real module, with its spec."""
        code = ("import sys, heartbeat.cli.main, heartbeat.integrations.hooks; m = sys.modules.get('inspect'); "
                "print('absent' if m is None else type(m).__name__, getattr(m, '__spec__', None) is not None)")
        proc = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True,
                              cwd=str(ROOT), timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() in (["absent", "False"], ["module", "True"]), proc.stdout

    def test_an_agents_touch_loads_only_the_pulse(self, hb: Hb, state_dir: Path) -> None:
        """An agent's touch with its pulse armed (heartbeat.hotpath.pulse) loads heartbeat and
        heartbeat.hotpath's pulse and argv reader, and of the rest of Python nothing that parses, types or stores:
        no TOML, typing, re, sqlite3 or dataclasses."""
        epoch = hb("new", "hot", "--task", "t", "--step", "s", "--claim").out.strip()
        env = {"HEARTBEAT_EPOCH": epoch, "HEARTBEAT_TASK": "hot"}
        assert hb("touch", "hot", env=env).code == 0  # arms the pulse
        modules = _imports_of(["touch", "hot"], state_dir, env)
        assert {name for name in modules if name.startswith("heartbeat")} == {
            "heartbeat", "heartbeat.__main__", "heartbeat.hotpath", "heartbeat.hotpath.argv", "heartbeat.hotpath.pulse"}
        modules -= _imports_of([], state_dir, env, code="pass")  # what this interpreter loads at start (an
        # editable install's finder loads re and pathlib for every program)
        heavy = {*self.HEAVY, "tomllib", "typing", "re", "sqlite3", "dataclasses", "json", "argparse", "datetime"}
        assert not {name.split(".")[0] for name in modules} & heavy

    @pytest.mark.parametrize("argv", [
        ["touch", "t"], ["set", "t", "step=a"], ["set", "t", "step=a=b", "intent=", "next_step=x y"],
        ["add", "t", "done", "one"], ["add", "t", "constraints", "a", "b", "c"], ["set", "t", ""], ["add", "t", "done", ""],
    ])
    def test_hot_arguments_match_the_parser(self, argv: list[str]) -> None:
        """The argparse-free fast path yields exactly the namespace the full parser would."""
        fast = parser._hot_args(argv)
        assert fast is not None
        assert vars(fast) == vars(parser.build_parser().parse_args(argv))

    @settings(max_examples=examples(300), deadline=None)
    @given(st.sampled_from([*parser.AGENT_WRITES, "show", "new"]),
           st.lists(st.sampled_from(["t", "", "step=a", "done", "a b", "=", "--epoch", "3", "-x", "--", "--check",
                                     "--state-dir", "--expect-revision", "--config=c", "ü"]), max_size=6))
    def test_the_hot_reader_and_argparse_never_disagree(self, command: str, words: list[str]) -> None:
        """For any arguments: when the argparse-free reader answers, argparse gives the same namespace;
        when an agent's write has no option and argparse accepts it, the reader answers too."""
        argv = [command, *words]
        fast = parser._hot_args(argv)
        try:
            parsed: Any = parser.build_parser().parse_args(argv)
        except (BadInput, SystemExit):
            parsed = None
        if fast is not None:
            assert parsed is not None and vars(fast) == vars(parsed)
        elif command in parser.AGENT_WRITES and not any(word.startswith("-") for word in words):
            assert parsed is None

    @pytest.mark.parametrize("argv", [
        ["touch"], ["touch", "t", "extra"], ["touch", "t", "--epoch", "3"], ["--state-dir", "/x", "touch", "t"],
        ["set", "t"], ["add", "t", "done"], ["show", "t"], ["touch", "-h"], ["set", "t", "-x=1"],
    ])
    def test_anything_else_goes_through_the_parser(self, argv: list[str]) -> None:
        """Options, wrong arities and other commands are left to argparse."""
        assert parser._hot_args(argv) is None

    @pytest.mark.parametrize("command", ["new", "show", "touch", "status", "log", "claim", "snooze"])
    def test_partial_parser_matches_the_full_one(self, command: str) -> None:
        """The parser built for one command parses that command exactly like the full parser."""
        argv = {"new": ["new", "x", "--task", "t", "--step", "s", "--plan", "a", "--claim"],
                "status": ["status", "--json"], "snooze": ["snooze", "x", "--for", "1m", "--epoch", "2"]}.get(
                    command, [command, "x"])
        argv = ["--state-dir", "/s", *argv]
        assert vars(parser.build_parser(command).parse_args(argv)) == vars(parser.build_parser().parse_args(argv))


def _heartbeat(*args: str, env: dict[str, str]) -> Result:
    """The real CLI with exactly this environment (the ``hb`` fixture always sets a state dir)."""
    proc = subprocess.run([sys.executable, "-m", "heartbeat", *args], env=env, capture_output=True, text=True,
                          timeout=60)
    return Result(proc.returncode, proc.stdout, proc.stderr)


class TestExportToAFile:
    def test_a_failed_export_leaves_no_temp_file(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """An export that fails midway (here: past the file size limit) says so in one line, exit 1, and
        leaves neither the target nor a temp file in its directory."""
        assert hb("new", "big", "--task", "t", "--step", "s", "--intent", "x" * 90_000).code == 0
        out_dir = tmp_path / "out"
        out_dir.mkdir()

        def limit_file_size() -> None:  # Python ignores SIGXFSZ: the write fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))

        proc = subprocess.run([sys.executable, "-m", "heartbeat", "export", "--to", str(out_dir / "all.jsonl")],
                              env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)), capture_output=True, text=True,
                              timeout=60, preexec_fn=limit_file_size)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "too large" in proc.stderr, proc.stderr
        assert list(out_dir.iterdir()) == []
        assert hb("export", "--to", str(out_dir / "all.jsonl")).code == 0  # and without the limit, it lands
        assert sorted(p.name for p in out_dir.iterdir()) == ["all.jsonl"]
        assert stat.S_IMODE((out_dir / "all.jsonl").stat().st_mode) == 0o600


class TestEdgesFoundUnderAttack:
    """Issue 8's CLI edges: each refused with one line and the right exit code, or accepted as a user expects."""

    def test_claim_with_pid_zero_is_refused(self, hb: Hb) -> None:
        """``--pid 0`` (or below) is refused, not taken as "the caller's parent"."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        _one_line_error(hb("claim", "a", "--pid", "0"), 2, "--pid: must be a process id above 0, got 0")
        _one_line_error(hb("claim", "a", "--pid", "-5"), 2, "above 0")
        _one_line_error(hb("new", "b", "--task", "t", "--step", "s", "--claim", "--pid", "0"), 2, "above 0")
        assert json.loads(hb("show", "a", "--json").out)["meta"].get("owner") in (None, {})

    @pytest.mark.parametrize("argv", [
        ("verify", "a", "--epoch", "99999999999999999999999"),
        ("touch", "a", "--epoch", "99999999999999999999999"),
        ("set", "a", "step=x", "--expect-revision", "-99999999999999999999999"),
        ("claim", "a", "--pid", "99999999999999999999999"),
    ])
    def test_integers_past_64_bits_are_bad_input(self, hb: Hb, argv: tuple[str, ...]) -> None:
        """An integer option too large for the ledger is exit 2 with one line, not "Python int too large"."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        _one_line_error(hb(*argv), 2, "out of range")

    def test_a_task_gate_on_itself_is_refused(self, hb: Hb) -> None:
        """``--gate task:ID`` naming the task itself could never open: refused by block and new."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        _one_line_error(hb("block", "a", "--on", "x", "--gate", "task:a"), 2, "task:a names the task itself")
        _one_line_error(hb("new", "b", "--task", "t", "--step", "s", "--blocked-on", "x", "--gate", "task:b"), 2,
                        "names the task itself")
        assert hb("block", "a", "--on", "x", "--gate", "task:other").code == 0

    @pytest.mark.parametrize("argv", [("status",), ("show", "a"), ("log", "a"), ("report",), ("verify", "a"),
                                      ("brief", "a")])
    def test_read_commands_never_create_a_state_dir(self, hb: Hb, tmp_path: Path, argv: tuple[str, ...]) -> None:
        """A mistyped state dir is exit 1 naming it; nothing is created."""
        typo = tmp_path / "typo"
        _one_line_error(_heartbeat(*argv, env=clean_env(HEARTBEAT_STATE_DIR=str(typo))), 1,
                        f"{typo}: no such state dir")
        assert not typo.exists()

    def test_a_directory_as_config_is_named(self, hb: Hb, tmp_path: Path) -> None:
        """``--config DIR`` names the directory, not a file descriptor number."""
        _one_line_error(hb("--config", str(tmp_path), "check-config"), 2, f"{tmp_path}: is a directory")
        _one_line_error(_heartbeat("--config", str(tmp_path), "status", env=clean_env()), 2,
                        f"{tmp_path}: is a directory")

    def test_global_options_are_accepted_after_the_command(self, hb: Hb, state_dir: Path, tmp_path: Path) -> None:
        """``--state-dir`` and ``--config`` work anywhere on the line, as before the command."""
        other = tmp_path / "other"
        r = hb("new", "a", "--task", "t", "--step", "s", "--state-dir", str(other))
        assert r.code == 0, r.err
        assert (other / "batons" / "a.toml").exists() and not (state_dir / "batons" / "a.toml").exists()
        r = hb("status", f"--state-dir={other}", "--json")
        assert r.code == 0 and [t["id"] for t in json.loads(r.out)["tasks"]] == ["a"], r.err
        r = hb("set", "a", "step=two", "--state-dir", str(other))
        assert r.code == 0, r.err
        assert hb("show", "a", "--state-dir", str(other), "--json").out.count('"step": "two"') == 1

    @pytest.mark.parametrize("command,ok", [('["a", "{"]', False), ('["a", "}x"]', False),
                                           ('["a", "{id"]', False), ('["true", "{{literal}}", "{id}"]', True)])
    def test_unbalanced_braces_in_a_command_are_refused(self, hb: Hb, tmp_path: Path, command: str,
                                                        ok: bool) -> None:
        """check-config refuses a lone brace in a launcher's argv; ``{{`` and ``}}`` stay literal braces."""
        config = tmp_path / "hb.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "s"}"\n[launchers.agent]\ntype = "exec"\n'
                          f'command = {command}\n')
        config.chmod(0o600)
        r = hb("--config", str(config), "check-config")
        if ok:
            assert r.code == 0, r.err
        else:
            _one_line_error(r, 2, "launchers.agent.command: unbalanced brace")

    def test_a_full_disk_leaves_no_exit_temp_file(self, tmp_path: Path) -> None:
        """The shim's exit-file writer on a full disk (RLIMIT_FSIZE 0: writes fail with EFBIG) removes its temp file."""
        script = (
            "import resource, signal, sys\n"
            "from heartbeat.launchers.shim import write_exit_file\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
            "try:\n"
            "    write_exit_file(sys.argv[1], 0, None, 0.0)\n"
            "except OSError as exc:\n"
            "    print(exc.errno)\n"
        )
        r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "1.exit")], capture_output=True, text=True,
                           env=clean_env(), timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "27", (r.stdout, r.stderr)  # EFBIG
        assert sorted(p.name for p in tmp_path.iterdir()) == []
