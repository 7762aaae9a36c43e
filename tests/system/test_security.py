"""Security review, as tests: what a baton writer, a config writer and other local users can make heartbeat do.

Hostile values (shell metacharacters, ``$(...)``, backticks, newlines, NULs, megabyte
strings, ``../`` paths) go through the CLI, the Python API, the brief and a real daemon
dispatch with an exec launcher whose argv uses every placeholder: nothing is executed,
every value stays one literal argument, key files cannot leave the workdir, and a baton
can only choose among configured launchers. Symlink, FIFO and device batons are refused
without blocking; a state dir or config others can write to is refused; ledger rows are
data, never SQL; an agent's environment is what its launcher config says, without the
daemon's systemd plumbing. docs/threat-model.md names the test that pins each claim.
"""

from __future__ import annotations

import array
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Result, clean_env
from daemon_harness import DaemonHarness, toml_list

from heartbeat.api import open_task
from heartbeat.model.baton import dump_baton
from heartbeat.model.errors import BadInput, UnsafePath
from heartbeat.model.ledger import Event
from heartbeat.model.timeparse import utcnow
from heartbeat.reports.brief import render_brief
from heartbeat.store.files import FileStore
from heartbeat.tasks import verbs as tasks


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli



def payloads(canary: Path) -> list[str]:
    """Values that would create ``canary`` (or ./PWNED) if any of them ever reached a shell."""
    c = str(canary)
    return [
        f"; touch {c}", f"$(touch {c})", f"`touch {c}`", f"a\ntouch {c}", f"|| touch {c} &", f"'; touch {c}; '",
        f'"$(touch {c})"', f"${{IFS}}touch${{IFS}}{c}", "; touch PWNED", "$(touch PWNED)", "`touch PWNED`",
        "--help", "-rf /", "{id}{{x}}", "%s%n%x", "\u202e rtl \x1b[31m ansi \x07", "tab\there", "a\r\nb",
    ]


def no_pwned(*dirs: Path) -> None:
    for d in {*dirs, Path.cwd()}:
        assert not (d / "PWNED").exists(), f"something ran: {d / 'PWNED'}"
        assert not (d / "canary").exists(), f"something ran: {d / 'canary'}"


# -- hostile values through the CLI, the API and the brief ----------------------------------------

class TestHostileValues:
    """Shell metacharacters, newlines, NULs and huge strings are stored and shown as data, never run."""

    @pytest.mark.slow
    def test_cli_keeps_every_value_literal(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """new/set/add/show/brief/status/log with hostile values: exit 0, values read back verbatim, nothing runs."""
        canary = state_dir.parent / "canary"
        for i, value in enumerate(payloads(canary)):
            task = f"t{i}"
            r = hb("new", task, f"--task={value}", f"--step={value}", f"--intent={value}", f"--next={value}",
                   f"--constraint={value}", f"--plan={value}", f"--workdir={state_dir.parent}")
            assert r.code == 0, (value, r.err)
            assert hb("set", task, f"handoff={value}").code == 0
            assert hb("add", task, "decisions", "--", value, value).code == 0
            shown = json.loads(hb("show", task, "--json").out)
            for name in ("task", "step", "intent", "next_step", "handoff"):
                assert shown[name] == value, (name, value)
            assert shown["constraints"] == [value] and shown["decisions"] == [value]  # a duplicate is not added
            assert shown["plan"] == [value]
        brief = hb("brief", "t0")
        assert brief.code == 0 and f"touch {canary}" in brief.out
        assert hb("status").code == 0 and hb("report").code == 0 and hb("log", "t1").code == 0
        no_pwned(state_dir, state_dir.parent)

    def test_api_keeps_nul_and_megabyte_strings(self, file_store: FileStore, tmp_path: Path) -> None:
        """NULs (TOML's \\u0000) and 1 MB strings round-trip through the API; a baton over 1 MiB is refused, not cut."""
        big = "x" * (1024 * 1024 - 4096)
        tasks.new_task(file_store, "t1", task="a\0b", step="s\0", workdir=str(tmp_path))
        task = open_task("t1", store=file_store)
        assert task.read().task == "a\0b" and "\\u0000" in dump_baton(task.read())
        with task.update() as baton:
            baton.intent = big
        assert task.read().intent == big
        with pytest.raises(BadInput, match="at most"):
            with task.update() as baton:
                baton.constraints.append(big)
        assert task.read().constraints == []
        brief = render_brief(task.read(), budget=4000)
        assert brief.text  # the brief renders whatever the values hold

    @pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "a/../../x", "link/passwd", "escape"])
    def test_key_files_cannot_leave_the_workdir(self, hb: Callable[..., Result], tmp_path: Path, bad: str) -> None:
        """Key files with .., absolute paths outside, or symlinks out of the workdir are refused by the CLI and the API."""
        work = tmp_path / "work"
        work.mkdir()
        (work / "link").symlink_to("/etc")
        (work / "escape").symlink_to("/etc/passwd")
        r = hb("new", "t1", "--task", "t", "--step", "s", "--workdir", str(work), "--key-file", bad)
        assert r.code == 2 and ("outside the workdir" in r.err or "is a link to" in r.err), r.err
        assert hb("new", "t2", "--task", "t", "--step", "s", "--workdir", str(work)).code == 0
        r = hb("add", "t2", "key_files", bad)
        assert r.code == 2 and "key_files" in r.err, r.err
        assert json.loads(hb("show", "t2", "--json").out)["key_files"] == []
        store = FileStore(str(tmp_path / "state"))
        try:
            with pytest.raises(UnsafePath):
                with open_task("t2", store=store).update() as baton:
                    baton.key_files.append(bad)
        finally:
            store.close()

    def test_nul_in_paths_is_refused(self, file_store: FileStore, tmp_path: Path) -> None:
        """A NUL in the workdir or a key file is refused: no path may be cut short at the NUL."""
        tasks.new_task(file_store, "t1", task="t", step="s", workdir=str(tmp_path))
        for field, value in (("workdir", f"{tmp_path}\0/etc"), ("key_files", ["a\0b"])):
            with pytest.raises(BadInput, match=field):
                with file_store.edit("t1") as ed:
                    setattr(ed.baton, field, value)
        assert file_store.load("t1").workdir == str(tmp_path)

    @pytest.mark.parametrize("launcher", ["; touch PWNED", "$(touch PWNED)", "/bin/sh", "../x", "A", "x y", ""])
    def test_launcher_must_be_a_name(self, hb: Callable[..., Result], state_dir: Path, launcher: str) -> None:
        """A launcher value that is not a name is refused at write time (exit 2), never written into a baton."""
        r = hb("new", "t1", "--task", "t", "--step", "s", "--launcher", launcher)
        if launcher == "":
            assert r.code == 0  # empty: the config's default launcher
            return
        assert r.code == 2 and "launcher" in r.err, r.err
        assert not (state_dir / "batons" / "t1.toml").exists()
        assert hb("new", "t1", "--task", "t", "--step", "s").code == 0
        r = hb("set", "t1", f"launcher={launcher}")
        assert r.code == 2 and "launcher" in r.err
        assert json.loads(hb("show", "t1", "--json").out)["launcher"] == ""
        no_pwned(state_dir, state_dir.parent)

    @pytest.mark.slow
    def test_task_ids_cannot_traverse(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """Ids with / .. quotes or NUL-like bytes are refused before any path or SQL is built from them."""
        for bad in ("../x", "a/b", "..", ".hidden", "x'; DROP TABLE events; --", "A", "x" * 65, "a\nb"):
            for args in (("new", bad, "--task", "t", "--step", "s"), ("show", bad), ("log", bad), ("touch", bad)):
                r = hb(*args)
                assert r.code == 2 and "task id" in r.err, (args, r.err)
        assert not (state_dir / "batons").exists() or os.listdir(state_dir / "batons") == []


# -- a real daemon dispatching hostile batons -------------------------------------------------------

RECORDER = r"""
import hashlib, json, os, sys, time
record_dir = sys.argv[1]
with open("/proc/self/environ", "rb") as handle:   # the environment as exec'd (Python adds LC_CTYPE to its own)
    env = dict(item.decode("utf-8", "surrogateescape").split("=", 1) for item in handle.read().split(b"\0") if item)
stdin = sys.stdin.buffer.read() if not sys.stdin.isatty() else b""
report = {"argv": sys.argv[2:], "cwd": os.getcwd(), "env": env,
          "stdin_len": len(stdin), "stdin_sha": hashlib.sha256(stdin).hexdigest()}
name = f"{env.get('HEARTBEAT_TASK')}-{env.get('HEARTBEAT_EPOCH')}.json"
with open(os.path.join(record_dir, name + ".tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(record_dir, name + ".tmp"), os.path.join(record_dir, name))
if "NOTIFY_SOCKET" in env:   # an agent that could would speak for the daemon: it must never be able to
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"READY=1\nSTATUS=from an agent", env["NOTIFY_SOCKET"])
time.sleep(3600)
"""

EVERY_PLACEHOLDER = ["{id}", "{brief_file}", "{workdir}", "{epoch}", "{attempt}", "{state_dir}", "{session}",
                     "--mixed={id}:{workdir}:{epoch}", "{{literal}}"]


class Recorder:
    """A daemon whose launchers run RECORDER; each dispatch leaves a JSON record of argv, cwd, env and stdin."""

    def __init__(self, tmp_path: Path, extra_launchers: str = "", env: dict[str, str] | None = None) -> None:
        tmp_path.chmod(0o700)
        self.records = tmp_path / "records"
        self.records.mkdir()
        script = tmp_path / "recorder.py"
        script.write_text(RECORDER)
        self.argv_head = [sys.executable, str(script), str(self.records)]
        launchers = f"""
[launchers.rec]
type = "exec"
command = {toml_list([*self.argv_head, *EVERY_PLACEHOLDER])}
brief = "arg"
env = {{ FROM_CONFIG = "$(touch PWNED) `touch PWNED`" }}
stop_grace = "200ms"

[launchers.stdin]
type = "exec"
command = {toml_list(self.argv_head)}
brief = "stdin"
stop_grace = "200ms"
{extra_launchers}
"""
        self.h = DaemonHarness(tmp_path, stall_after="1h", extra=launchers)
        self.daemon_env = env or {}

    def start(self) -> None:
        base = self.h.env
        self.h.env = lambda: {**base(), **self.daemon_env}  # type: ignore[method-assign]
        self.h.start()

    def record(self, task: str, epoch: int = 1, timeout: float = 30) -> dict[str, Any]:
        path = self.records / f"{task}-{epoch}.json"
        self.h.wait(path.exists, f"the agent of {task} to record itself", timeout=timeout)
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def close(self) -> None:
        self.h.close()


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    r = Recorder(tmp_path)
    yield r
    r.close()


@pytest.mark.slow
class TestDaemonDispatch:
    """A real daemon dispatching hostile batons: argv stays literal, nothing runs, launchers stay the config's."""

    def test_every_placeholder_stays_one_literal_argument(self, recorder: Recorder, tmp_path: Path) -> None:
        """A workdir named with ; $() ` and a newline, hostile text in every field: the agent gets exactly this argv."""
        h = recorder.h
        recorder.start()
        canary = tmp_path / "canary"
        hostile = payloads(canary)
        work = tmp_path / "w; touch PWNED $(touch PWNED) `touch PWNED`\nline2 'q' \"dq\""
        work.mkdir()
        (work / "; touch PWNED").write_text("a key file named like a command\n")
        args = ["new", "hostile", f"--workdir={work}", "--launcher=rec", "--key-file=; touch PWNED"]
        for value in hostile:
            args += [f"--constraint={value}", f"--plan={value}"]
        r = h.cli(*args, f"--task={hostile[0]}", f"--step={hostile[1]}", f"--intent={hostile[2]}",
                  f"--next={hostile[3]}")
        assert r.returncode == 0, r.stderr
        report = recorder.record("hostile")
        brief_file = str(h.state / "logs" / "hostile" / "1.brief.md")
        session = h.baton("hostile").meta.session  # {session}: this dispatch's fresh session id, a UUID
        assert len(session) == 36 and session.count("-") == 4
        assert report["argv"][:-1] == [
            "hostile", brief_file, str(work), "1", "1", str(h.state), session,
            f"--mixed=hostile:{work}:1", "{literal}",
        ]
        assert report["argv"][-1] == Path(brief_file).read_text()  # brief = "arg": the brief, one argument
        for value in hostile[:3]:
            assert value.split("\n")[0] in report["argv"][-1]
        assert report["cwd"] == str(work)
        assert report["env"]["FROM_CONFIG"] == "$(touch PWNED) `touch PWNED`"
        assert report["env"]["HEARTBEAT_TASK"] == "hostile" and report["env"]["HEARTBEAT_EPOCH"] == "1"
        no_pwned(tmp_path, work, h.state, h.root)

    def test_megabyte_brief_on_stdin(self, recorder: Recorder, tmp_path: Path) -> None:
        """A 1 MB intent and constraint reach the agent whole on stdin (brief = "stdin"), as data."""
        h = recorder.h
        store = FileStore(str(h.state))
        big = "$(touch PWNED) " * 40_000  # 600 KB of text that would run something in a shell
        try:
            tasks.new_task(store, "big", task="t", step="s", intent=big, constraints=[big[:300_000]],
                           workdir=str(tmp_path), launcher="stdin")
        finally:
            store.close()
        recorder.start()
        report = recorder.record("big")
        brief = (h.state / "logs" / "big" / "1.brief.md").read_bytes()
        assert report["stdin_len"] == len(brief) > len(big)
        assert report["argv"] == []
        no_pwned(tmp_path, h.state)

    def test_a_baton_chooses_only_among_configured_launchers(self, recorder: Recorder, tmp_path: Path) -> None:
        """launcher = a valid name not in the config (or a type name like "exec"): `new` refuses it, and a
        baton that names it anyway (the API, a hand edit) is escalated with nothing started."""
        h = recorder.h
        recorder.start()
        for task, launcher in (("unknown", "evil"), ("typename", "exec"), ("nulltype", "null")):
            r = h.cli("new", task, "--task", "t", "--step", "s", "--workdir", str(tmp_path), "--launcher", launcher)
            assert r.returncode == 2 and f"unknown launcher {launcher!r}" in r.stderr, r.stderr
            tasks.new_task(h.store, task, task="t", step="s", workdir=str(tmp_path), launcher=launcher)
        for task, launcher in (("unknown", "evil"), ("typename", "exec"), ("nulltype", "null")):
            h.wait(lambda task=task: h.baton(task).meta.status.value == "escalated", f"{task} escalated")
            reasons = [e.data.get("reason", "") for e in h.events(task, "escalated")]
            assert any(f"launcher {launcher!r} is not in the config" in reason for reason in reasons), reasons
            assert not h.live_agents(task)
            assert not list(recorder.records.glob(f"{task}-*"))

    def test_hand_edited_baton_with_bad_launcher_is_invalid_not_run(self, recorder: Recorder) -> None:
        """A hand edit putting '; touch PWNED' in launcher makes the baton invalid: reported, never dispatched."""
        h = recorder.h
        recorder.start()
        (h.state / "batons" / "edited.toml").write_text(
            'task = "t"\nstep = "s"\nlauncher = "; touch PWNED"\n[meta]\nid = "edited"\n')
        h.wait(lambda: any(e.get("event") == "invalid_baton" and e.get("task") == "edited" for e in h.log()),
               "the invalid baton reported")
        assert not h.live_agents("edited")
        no_pwned(h.root, h.state)


# -- batons that are not regular files ----------------------------------------------------------

def special_batons(batons: Path, outside: Path) -> dict[str, str]:
    """Plant a symlink to /dev/null, a symlink to a valid baton outside, a FIFO, a char device and a directory."""
    outside.write_text('task = "t"\nstep = "s"\n[meta]\nid = "linked"\n')
    (batons / "devnull.toml").symlink_to("/dev/null")
    (batons / "linked.toml").symlink_to(outside)
    os.mkfifo(batons / "fifo.toml", 0o600)
    kinds = {"devnull": "symbolic link", "linked": "symbolic link", "fifo": "not a regular file",
             "dir": "not a regular file"}
    (batons / "dir.toml").mkdir()
    if os.geteuid() == 0:
        os.mknod(batons / "chardev.toml", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
        kinds["chardev"] = "not a regular file"
    return kinds


class TestSpecialFiles:
    """Symlink, FIFO, device and directory batons are refused quickly, without blocking, and left as they are."""

    @pytest.mark.slow
    def test_cli_refuses_them_without_blocking(self, hb_process: Callable[..., Result], state_dir: Path,
                                               tmp_path: Path) -> None:
        """show/set/touch/verify on each: exit 2 in well under the timeout (a FIFO read would hang), files untouched."""
        hb = hb_process  # a command blocked on a FIFO would block this process: a process, with a timeout
        assert hb("new", "good", "--task", "t", "--step", "s").code == 0
        outside = tmp_path / "outside.toml"
        kinds = special_batons(state_dir / "batons", outside)
        before = outside.read_bytes()
        for task, why in kinds.items():
            for args in (("show", task), ("set", task, "step=x"), ("touch", task), ("verify", task),
                         ("brief", task), ("done", task)):
                started = time.monotonic()
                r = hb(*args, timeout=20)
                assert time.monotonic() - started < 10
                assert r.code == 2 and why in r.err, (args, r.code, r.err)
        assert outside.read_bytes() == before
        assert stat.S_ISFIFO(os.lstat(state_dir / "batons" / "fifo.toml").st_mode)
        assert os.readlink(state_dir / "batons" / "devnull.toml") == "/dev/null"
        rows = {row["id"]: row for row in json.loads(hb("status", "--json").out)["tasks"]}
        assert rows["good"]["status"] == "active"
        for task, why in kinds.items():
            assert rows[task]["status"] == "invalid" and why in rows[task]["error"]
        r = hb("new", "fifo", "--task", "t", "--step", "s")
        assert r.code == 5  # exists already: a planted file is never replaced
        assert stat.S_ISFIFO(os.lstat(state_dir / "batons" / "fifo.toml").st_mode)

    @pytest.mark.slow
    def test_daemon_scan_refuses_them_and_serves_the_others(self, tmp_path: Path) -> None:
        """With special files planted among the batons, the daemon reports each as invalid and still dispatches 'good'."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path, stall_after="1h", agent=[sys.executable, "-c", "import time; time.sleep(3600)"])
        try:
            h.start()
            kinds = special_batons(h.state / "batons", tmp_path / "outside.toml")
            h.new("good")
            h.wait(lambda: h.live_agents("good"), "the good task's agent")
            for task in kinds:
                h.wait(lambda task=task: any(e.get("event") == "invalid_baton" and e.get("task") == task
                                             for e in h.log()), f"{task} reported invalid")
                assert h.events(task, "invalid")
            ticks = sum(1 for e in h.log() if e.get("event") == "tick")
            h.wait(lambda: sum(1 for e in h.log() if e.get("event") == "tick") >= ticks + 5, "more ticks")
            assert stat.S_ISFIFO(os.lstat(h.state / "batons" / "fifo.toml").st_mode)
        finally:
            h.close()


# -- who may write the state dir and the config ---------------------------------------------------

class TestPermissions:
    """A state dir or config that others can write to, or that belongs to another user, is refused with the fix."""

    @pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o720])
    def test_state_dir_writable_by_others(self, hb: Callable[..., Result], state_dir: Path, mode: int) -> None:
        """Group- or world-writable state dir: exit 2 naming the mode and 'chmod go-w <dir>'; nothing written."""
        os.chmod(state_dir, mode)
        r = hb("new", "t1", "--task", "t", "--step", "s")
        assert r.code == 2 and f"chmod go-w {state_dir}" in r.err and f"{mode:04o}" in r.err, r.err
        assert not (state_dir / "batons").exists()

    def test_batons_dir_writable_by_others(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """The batons dir is checked too: planting a baton there must need the state dir's owner."""
        assert hb("new", "t1", "--task", "t", "--step", "s").code == 0
        os.chmod(state_dir / "batons", 0o777)
        r = hb("show", "t1")
        assert r.code == 2 and f"chmod go-w {state_dir / 'batons'}" in r.err, r.err

    @pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
    def test_state_dir_of_another_user(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """A state dir owned by another (non-root) user is refused, naming the owner."""
        os.chown(state_dir, 65534, 65534)
        r = hb("status")
        assert r.code == 2 and "belongs to" in r.err, r.err

    @pytest.mark.parametrize("mode", [0o666, 0o664, 0o646, 0o620])
    def test_config_writable_by_others(self, tmp_path: Path, mode: int) -> None:
        """check-config and run refuse a config others can write: exit 2, 'chmod go-w <config>'."""
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
        os.chmod(config, mode)
        for command in ("check-config", "run"):
            r = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(config), command],
                               capture_output=True, text=True, env=clean_env(), timeout=30)
            assert r.returncode == 2 and f"chmod go-w {config}" in r.stderr, (command, r.stderr)

    @pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
    def test_config_of_another_user(self, tmp_path: Path) -> None:
        """A config owned by another user (who could chmod and rewrite it) is refused with the chown to run."""
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
        os.chmod(config, 0o644)
        os.chown(config, 65534, 65534)
        r = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(config), "run"],
                           capture_output=True, text=True, env=clean_env(), timeout=30)
        assert r.returncode == 2 and "belongs to" in r.stderr and f"chown {os.geteuid()} {config}" in r.stderr, \
            r.stderr


class TestConfigAdvice:
    """check-config points out a launcher program that a baton could choose."""

    def test_relative_program_run_in_the_workdir_is_warned(self, tmp_path: Path) -> None:
        """command = ["./agent.sh"] with cwd = "{workdir}": a warning naming the launcher (the workdir is the baton's)."""
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\ndefault_launcher = "rel"\n'
                          '[launchers.rel]\ncommand = ["./agent.sh", "{id}"]\n'
                          '[launchers.fixed]\ncommand = ["./agent.sh"]\ncwd = "/opt/agents"\n')
        os.chmod(config, 0o644)
        r = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(config), "check-config"],
                           capture_output=True, text=True, env=clean_env(), timeout=30)
        assert r.returncode == 2, r.stderr  # /opt/agents/agent.sh is not there: named, exit 2
        assert "launchers.fixed.command: './agent.sh': no such file" in r.stderr
        warnings = [line for line in r.stderr.splitlines() if "is a relative path" in line]
        assert len(warnings) == 1 and "launchers.rel.command" in warnings[0] and "absolute path" in warnings[0]


# -- the ledger is data --------------------------------------------------------------------------

INJECTIONS = ["'); DROP TABLE events; --", "\" OR 1=1 --", "x'||(SELECT sql FROM sqlite_master)||'",
              "'; UPDATE events SET kind='done'; --", "\\'; DELETE FROM events WHERE 1=1; --", "%' OR '%'='"]


class TestLedgerInjection:
    """Notes, reasons, steps and names holding SQL are stored verbatim; the table and its rows survive."""

    @pytest.mark.slow
    def test_sql_in_every_event_field(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """set/block/unblock/done/fail/retry with SQL in every text: log --json shows it verbatim, no row lost."""
        for i, sql in enumerate(INJECTIONS):
            task = f"t{i}"
            assert hb("new", task, "--task", sql, "--step", sql).code == 0
            assert hb("set", task, f"step={sql} 2").code == 0
            assert hb("block", task, "--on", sql).code == 0
            assert hb("unblock", task, "--by", sql, "--note", sql).code == 0
            assert hb("fail", task, "--reason", sql).code == 0
            assert hb("retry", task, "--by", sql, "--note", sql).code == 0
            assert hb("done", task, "--note", sql).code == 0
            events = json.loads(hb("log", task, "--json").out)["events"]
            kinds = [e["kind"] for e in events]
            assert kinds == ["created", "updated", "blocked", "unblocked", "failed", "retried", "done",
                             "handed_off"], kinds
            data = {e["kind"]: e["data"] for e in events}
            assert data["blocked"]["on"] == sql and data["unblocked"]["by"] == sql
            assert data["unblocked"]["note"] == sql and data["failed"]["reason"] == sql
            assert data["retried"]["by"] == sql and data["done"]["note"] == sql
            assert data["updated"]["step"] == f"{sql} 2"
        with sqlite3.connect(state_dir / "ledger.sqlite3") as conn:
            assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 8 * len(INJECTIONS)
            assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")} >= {"events"}
        assert hb("report", "--json").code == 0

    def test_sql_in_kinds_actors_and_data_keys(self, file_store: FileStore) -> None:
        """Through the store: SQL as an event kind, actor, data key and value is stored and read back as is."""
        sql = INJECTIONS[0]
        file_store.record([Event(task="t1", kind=sql, ts=utcnow(), actor=sql, data={sql: sql, "nested": [sql]})])
        got = file_store.ledger.events("t1")
        assert len(got) == 1 and got[0].kind == sql and got[0].actor == sql
        assert got[0].data == {sql: sql, "nested": [sql]}
        assert file_store.ledger.events(kinds=[sql, "x' OR '1'='1"])[0].kind == sql
        assert file_store.ledger.events("t1' OR '1'='1") == []


# -- the agent's environment ----------------------------------------------------------------------

class CredListener:
    """A notification socket that records the sender's pid of every datagram (SO_PASSCRED)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setblocking(False)
        self.received: list[tuple[int, str]] = []

    def drain(self) -> list[tuple[int, str]]:
        while True:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(12))
            except BlockingIOError:
                return self.received
            pid = -1
            for level, kind, cdata in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = array.array("i", cdata[:12])[0]
            self.received.append((pid, data.decode(errors="replace")))

    def close(self) -> None:
        self.sock.close()


PLUMBING = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}


@pytest.mark.slow
class TestAgentEnvironment:
    """Under a daemon started with systemd's variables, agents get the config's environment and none of the plumbing."""

    def test_inherited_and_allow_listed_environments(self, tmp_path: Path) -> None:
        """Default: the daemon's env minus plumbing and its HEARTBEAT_*; an allow-list: PATH + env + HEARTBEAT_* only."""
        listener = CredListener(tmp_path / "notify.sock")
        allow = """
[launchers.allow]
type = "exec"
command = {command}
inherit_env = ["PATH", "NOTIFY_SOCKET", "WATCHDOG_USEC"]  # plumbing is removed even when allow-listed
env = {{ FROM_CONFIG = "yes" }}
stop_grace = "200ms"
"""
        recorder = Recorder(tmp_path, env={
            "NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": "600000000", "WATCHDOG_PID": "1",
            "LISTEN_FDS": "3", "LISTEN_PID": "1", "LISTEN_FDNAMES": "x", "SECRET_FROM_DAEMON": "kept",
            "HEARTBEAT_EPOCH": "99", "HEARTBEAT_TASK": "not-this",
        })
        h = recorder.h
        h.extra += allow.format(command=toml_list(recorder.argv_head))
        h.write_config()
        try:
            recorder.start()
            assert h.proc is not None
            for task, launcher in (("inherits", "rec"), ("allowed", "allow")):
                r = h.cli("new", task, "--task", "t", "--step", "s", "--workdir", str(tmp_path), "--launcher", launcher)
                assert r.returncode == 0, r.stderr
            inherited = recorder.record("inherits")["env"]
            allowed = recorder.record("allowed")["env"]
            heartbeat_vars = {"HEARTBEAT_TASK", "HEARTBEAT_EPOCH", "HEARTBEAT_BRIEF", "HEARTBEAT_STATE_DIR",
                              "HEARTBEAT_CONFIG"}
            assert not PLUMBING & set(inherited) and not PLUMBING & set(allowed)
            assert inherited["SECRET_FROM_DAEMON"] == "kept" and inherited["PATH"] == os.environ["PATH"]
            assert inherited["FROM_CONFIG"] == "$(touch PWNED) `touch PWNED`"
            assert inherited["HEARTBEAT_EPOCH"] == "1" and inherited["HEARTBEAT_TASK"] == "inherits"
            assert set(allowed) == {"PATH", "FROM_CONFIG"} | heartbeat_vars, sorted(allowed)
            assert allowed["HEARTBEAT_TASK"] == "allowed" and allowed["HEARTBEAT_EPOCH"] == "1"
            assert allowed["HEARTBEAT_CONFIG"] == str(h.config)
            assert allowed["HEARTBEAT_STATE_DIR"] == str(h.state)
            assert Path(allowed["HEARTBEAT_BRIEF"]) == h.state / "logs" / "allowed" / "1.brief.md"
            # The daemon itself does speak to the socket (READY, WATCHDOG, STATUS); only the daemon does.
            h.wait(lambda: listener.drain(), "the daemon's notifications")
            time.sleep(0.5)  # give an agent that could send (it cannot) the time to do it
            senders = {pid for pid, _ in listener.drain()}
            assert senders == {h.proc.pid}, (senders, h.proc.pid)
            assert any("READY=1" in text for _, text in listener.received)
        finally:
            recorder.close()
            listener.close()


# -- the task graph: what a writer of `after` can make the daemon wait on ----------------------


class TestGraphAttacks:
    """An ``after`` edge can hold a task forever; none may be written that no event will ever open,
    and one that appears anyway (a baton removed by hand) is reported, never waited on in silence."""

    def test_add_after_refuses_a_cycle_an_unknown_task_and_itself(self, hb: Callable[..., Result]) -> None:
        """``add ID after X``: a cycle (at any distance), an unknown task or the task itself are exit 2 with
        a one-line reason, and the baton is unchanged (on c684e38 each was exit 0 and both tasks stalled)."""
        assert hb("new", "a", "--task", "t", "--step", "s").code == 0
        assert hb("new", "b", "--task", "t", "--step", "s", "--after", "a").code == 0
        assert hb("new", "c", "--task", "t", "--step", "s", "--after", "b").code == 0
        before = hb("show", "a", "--json").out
        for upstream, named in (("c", "a -> c -> b -> a"), ("b", "a -> b -> a"), ("nosuch", "'nosuch'"),
                                ("a", "itself")):
            r = hb("add", "a", "after", upstream)
            assert r.code == 2 and named in r.err and r.err.count("\n") == 1, (upstream, r.err)
        assert hb("show", "a", "--json").out == before
        assert hb("add", "c", "after", "a").code == 0  # a second path to the same upstream is no cycle

    def test_a_task_held_by_a_missing_upstream_is_logged_and_shown(self, tmp_path: Path) -> None:
        """An upstream whose baton was removed by hand: the daemon logs ``upstream_missing`` and records it
        (the page's timeline shows the event), and ``status`` says the task is held by a task that does not
        exist (on c684e38: nothing, the task waited in silence)."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path)
        try:
            h.new("up", "--blocked-on", "a human first")
            h.new("down", "--after", "up")
            h.new("side")
            assert h.cli("add", "side", "after", "up").returncode == 0
            (h.state / "batons" / "up.toml").unlink()
            h.start()
            for task in ("down", "side"):
                h.wait_log(lambda e, t=task: e.get("event") == "upstream_missing" and e.get("task") == t
                           and e.get("upstreams") == ["up"], f"the daemon to report {task}'s missing upstream")
                h.wait(lambda t=task: h.events(t, "upstream_missing"), f"an upstream_missing event of {task}")
            status = h.cli("status").stdout
            assert status.count("[held: upstream up does not exist]") == 2, status
            rows = {r["id"]: r for r in json.loads(h.cli("status", "--json").stdout)["tasks"]}
            assert rows["down"]["missing_upstreams"] == ["up"] and rows["side"]["missing_upstreams"] == ["up"]
            assert h.baton("side").meta.dispatches == 0
        finally:
            h.close()

    def test_gc_keeps_an_upstream_a_live_downstream_waits_on(self, tmp_path: Path) -> None:
        """A finished upstream of a join whose other upstream is still working survives gc: the join opens
        when the second upstream is done, and its brief carries the first one's package and its never-cut
        constraint (on c684e38 gc archived it: the join stayed blocked, the brief said "no package yet
        from upstream a" and the constraint was gone). Once the whole chain is done, gc archives it all."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path)
        try:
            h.new("a", "--constraint", "never re-issue a refund")
            h.new("b", "--blocked-on", "a human first")
            h.new("c", "--after", "a", "--after", "b", "--blocked-on", "its upstreams", "--gate", "after:a,b")
            assert h.cli("done", "a").returncode == 0
            later = "2099-01-01T00:00:00Z"
            gc = json.loads(h.cli("gc", "--now", later, "--json").stdout)
            assert gc["archived"] == [] and {"task": "a", "why": "kept: task c depends on it"} in gc["skipped"]
            assert h.baton("a").meta.status.value == "done"
            assert h.cli("unblock", "b", "--by", "test").returncode == 0
            assert h.cli("done", "b").returncode == 0
            h.start()
            h.wait(lambda: h.events("c", "unblocked"), "the join to open")
            brief = h.cli("brief", "c")
            assert "never re-issue a refund" in brief.stdout and "no package yet" not in brief.stdout + brief.stderr
            h.wait(lambda: h.baton("c").meta.status.value == "done" and h.baton("c").meta.owner is None,
                   "c to finish and its agent to be settled", timeout=40)
            h.stop()
            gc = json.loads(h.cli("gc", "--now", later, "--json").stdout)
            assert sorted(gc["archived"]) == ["a", "b", "c"], gc["skipped"]
        finally:
            h.close()
