"""The rail: the PreToolUse decision as a table of cases over plain data, the hook around it, and
the guarded baton's hostile inputs.

The decision is :func:`heartbeat.tasks.rail.decide` (a call and a view of the task in, a decision out,
no store); the hook (``heartbeat hook claude`` with a ``PreToolUse`` event) is run for real on a
real state dir, and its refusals are read back from the ledger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Result, clean_env

from heartbeat.model.baton import Guard, Status, check_guard_glob, parse_baton
from heartbeat.model.errors import BadInput, InvalidBaton
from heartbeat.store.files import FileStore
from heartbeat.tasks.rail import Decision, RailView, Rule, ToolCall, Verified, decide, own_command, tool_call

WORK = "/srv/work"
GUARDS = (Guard("Do not touch config/prod.toml", protect=["config/prod.toml"]),
          Guard("Never delete the data", forbid=["rm -rf*"]),
          Guard("Keep out of secrets", protect=["secrets/"]))
IRREVERSIBLE = ("git push*", "npm publish*")


def view(status: Status = Status.ACTIVE, *, epoch: int = 3, mine: int = 3, guards: tuple[Guard, ...] = GUARDS,
         irreversible: tuple[str, ...] = IRREVERSIBLE) -> RailView:
    return RailView(task="t1", status=status, epoch=epoch, caller_epoch=mine, workdir=WORK,
                    blocked_on="waiting for Dana's review" if status is Status.BLOCKED else "",
                    gate="human" if status is Status.BLOCKED else "", guards=guards, irreversible=irreversible)


def bash(command: str) -> ToolCall:
    return ToolCall("Bash", command=command, cwd=WORK)


def write(path: str) -> ToolCall:
    return ToolCall("Write", paths=(path,), cwd=WORK)


FRESH = Verified(fresh=True, message="t1 is active")
STALE = Verified(fresh=False, message="the world changed", changed=("src/app.py", "git:HEAD"))

CASES: list[tuple[str, ToolCall, RailView, Verified | None, Rule | None]] = [
    # (what, call, view, verified, the rule that refuses it: None = allowed)
    ("an ordinary write on an active task", write(f"{WORK}/steps/01.txt"), view(), None, None),
    ("an ordinary command", bash("pytest -q"), view(), None, None),
    ("any call of a blocked task", write(f"{WORK}/steps/01.txt"), view(Status.BLOCKED), None, Rule.NOT_ACTIVE),
    ("a command of a done task", bash("ls"), view(Status.DONE), None, Rule.NOT_ACTIVE),
    ("a failed task", bash("ls"), view(Status.FAILED), None, Rule.NOT_ACTIVE),
    ("an escalated task", bash("ls"), view(Status.ESCALATED), None, Rule.NOT_ACTIVE),
    ("a paused (held) task", bash("ls"), view(Status.PAUSED), None, Rule.NOT_ACTIVE),
    ("a superseded epoch", bash("ls"), view(epoch=4, mine=3), None, Rule.SUPERSEDED),
    ("superseded before not active", bash("ls"), view(Status.BLOCKED, epoch=4, mine=3), None, Rule.SUPERSEDED),
    ("heartbeat's show on a blocked task", bash("heartbeat show t1 --json"), view(Status.BLOCKED), None, None),
    ("heartbeat's note by a zombie", bash('heartbeat add t1 done "x"'), view(epoch=4, mine=3), None, None),
    ("heartbeat with its options", bash("heartbeat --state-dir /s --config /c block t1 --on x"),
     view(Status.BLOCKED), None, None),
    ("this interpreter's -m heartbeat", bash(f"{sys.executable} -m heartbeat brief t1"), view(Status.DONE), None, None),
    ("another program named heartbeat", bash("/usr/bin/heartbeat show t1"), view(Status.BLOCKED), None,
     Rule.NOT_ACTIVE),
    ("a heartbeat the agent wrote", bash("./heartbeat show t1"), view(Status.BLOCKED), None, Rule.NOT_ACTIVE),
    ("a python -m that imports the workdir's heartbeat", bash("python3 -m heartbeat show t1"), view(Status.DONE),
     None, Rule.NOT_ACTIVE),
    ("heartbeat's MCP tool", ToolCall("mcp__heartbeat__show"), view(Status.BLOCKED), None, None),
    ("heartbeat chained to something else", bash("heartbeat show t1; rm -rf /"), view(Status.BLOCKED), None,
     Rule.NOT_ACTIVE),
    ("heartbeat's daemon command is not the agent's", bash("heartbeat run"), view(Status.BLOCKED), None,
     Rule.NOT_ACTIVE),
    ("a write to a protected path", write(f"{WORK}/config/prod.toml"), view(), None, Rule.PROTECTED),
    ("a relative path to it from a subdirectory", ToolCall("Edit", paths=("../config/prod.toml",), cwd=f"{WORK}/src"),
     view(), None, Rule.PROTECTED),
    ("a shell command naming it", bash("sed -i s/a/b/ config/prod.toml"), view(), None, Rule.PROTECTED),
    ("a redirect into it", bash("echo x >config/prod.toml"), view(), None, Rule.PROTECTED),
    ("its absolute path in a command", bash(f"cp /tmp/x {WORK}/config/prod.toml"), view(), None, Rule.PROTECTED),
    ("a file under a protected folder", write(f"{WORK}/secrets/key.pem"), view(), None, Rule.PROTECTED),
    ("a neighbour of the protected file", write(f"{WORK}/config/dev.toml"), view(), None, None),
    ("the same name outside the workdir", write("/elsewhere/config/prod.toml"), view(), None, None),
    ("a forbidden command", bash("rm -rf build"), view(), None, Rule.FORBIDDEN),
    ("a forbidden command chained", bash("make && rm  -rf build"), view(), None, Rule.FORBIDDEN),
    ("a command merely like it", bash("rm build.log"), view(), None, None),
    ("an irreversible command on a fresh world", bash("git push origin main"), view(), FRESH, None),
    ("an irreversible command on a stale world", bash("git push origin main"), view(), STALE, Rule.STALE),
    ("an irreversible command chained", bash("git commit -am x && git push"), view(), STALE, Rule.STALE),
    ("no irreversible globs: anything goes", bash("git push"), view(irreversible=()), None, None),
    ("an apply_patch into a protected file", ToolCall("apply_patch", paths=("config/prod.toml",), cwd=WORK),
     view(), None, Rule.PROTECTED),
]


class TestDecide:
    """The decision: refused with the rule that applies first, allowed otherwise."""

    @pytest.mark.parametrize(("what", "call", "task", "verified", "rule"), CASES, ids=[c[0] for c in CASES])
    def test_table(self, what: str, call: ToolCall, task: RailView, verified: Verified | None,
                   rule: Rule | None) -> None:
        decision = decide(call, task, verified=verified)
        assert decision.rule is rule, (what, decision)
        assert decision.allow is (rule is None), (what, decision)
        if rule is not None:
            assert decision.reason.startswith("heartbeat refused") and "\n" not in decision.reason

    def test_an_irreversible_call_asks_for_verify_first(self) -> None:
        """Without a verify result the decision neither allows nor refuses: it asks for one."""
        decision = decide(bash("git push"), view())
        assert decision == Decision(False, needs_verify=True, matched="git push*")

    def test_the_stale_reason_says_what_changed(self) -> None:
        reason = decide(bash("git push"), view(), verified=STALE).reason
        assert "src/app.py" in reason and "git:HEAD" in reason and "brief t1" in reason

    def test_the_block_reason_names_the_block(self) -> None:
        reason = decide(bash("ls"), view(Status.BLOCKED)).reason
        assert "waiting for Dana's review" in reason and "(gate human)" in reason

    def test_the_protected_reason_names_the_constraint(self) -> None:
        reason = decide(write(f"{WORK}/config/prod.toml"), view()).reason
        assert "Do not touch config/prod.toml" in reason and "config/prod.toml is protected" in reason


class TestToolCall:
    """What the rail reads of Claude Code's and codex's PreToolUse events."""

    def test_claude_write_and_bash(self) -> None:
        assert tool_call({"tool_name": "Write", "tool_input": {"file_path": "/w/a", "content": "x"}}).paths == ("/w/a",)
        assert tool_call({"tool_name": "Bash", "tool_input": {"command": "ls -1"}}).command == "ls -1"

    def test_codex_argv_and_patch(self) -> None:
        assert tool_call({"tool_name": "shell", "tool_input": {"command": ["rm", "-rf", "a b"]}}).command == \
            "rm -rf 'a b'"
        patch = "*** Begin Patch\n*** Update File: src/x.py\n@@\n-a\n+b\n*** Add File: new.txt\n*** End Patch\n"
        call = tool_call({"tool_name": "apply_patch", "tool_input": {"command": patch}})
        assert call.paths == ("src/x.py", "new.txt") and call.command == ""

    @pytest.mark.parametrize("event", [{}, {"tool_name": 3}, {"tool_name": "Bash", "tool_input": "rm"},
                                       {"tool_name": "Bash", "tool_input": {"command": {"a": 1}}},
                                       {"tool_name": "Write", "tool_input": {"file_path": ["x"]}}])
    def test_garbage_reads_as_an_empty_call(self, event: dict[str, Any]) -> None:
        call = tool_call(event)
        assert call.command == "" and call.paths == ()

    def test_a_huge_command_is_read_up_to_its_limit(self) -> None:
        call = tool_call({"tool_name": "Bash", "tool_input": {"command": "x" * 10_000_000}})
        assert len(call.command) == 64 * 1024

    def test_own_commands(self) -> None:
        assert own_command(bash("heartbeat set t1 step=x"))
        assert not own_command(bash("heartbeat set t1 step=$(rm -rf /)"))
        assert not own_command(bash("heartbeatx show t1"))


class TestHostileGlobs:
    """A guard glob the rail could not match sanely is refused in one line, and a baton holding one is invalid."""

    @pytest.mark.parametrize(("glob", "says"), [
        ("", "empty"), ("x" * 600, "600 characters"), ("a\0b", "control character"), ("a\nb", "control character"),
        ("*" * 17 + "a", "17 stars"), ("*", "matches everything"), ("**/*", "matches everything"),
        ("/etc/passwd", "relative to the workdir"), ("../up", "relative to the workdir"), ("~/x", "relative"),
    ])
    def test_refused(self, glob: str, says: str) -> None:
        with pytest.raises(BadInput) as info:
            check_guard_glob(glob, "protect")
        assert says in info.value.message and "\n" not in info.value.message

    def test_a_baton_with_a_hostile_guard_is_invalid_naming_the_field(self) -> None:
        text = 'task = "x"\nstep = "s"\n[[guards]]\nconstraint = "c"\nprotect = ["*"]\n[meta]\nid = "t1"\n'
        with pytest.raises(InvalidBaton) as info:
            parse_baton(text, path="t1.toml")
        assert "guards[0].protect[0]" in str(info.value)

    def test_too_many_guards(self) -> None:
        guards = "".join(f'[[guards]]\nconstraint = "c{i}"\nforbid = ["rm{i} *"]\n' for i in range(65))
        with pytest.raises(InvalidBaton, match="65 guards"):
            parse_baton(f'task = "x"\nstep = "s"\n{guards}[meta]\nid = "t1"\n', path="t1.toml")

    def test_an_old_baton_without_guards_reads_and_writes_back_without_them(self) -> None:
        baton = parse_baton('task = "x"\nstep = "s"\nconstraints = ["c"]\n[meta]\nid = "t1"\n', path="t1.toml")
        assert baton.guards == [] and baton.irreversible == []
        assert "guards" not in baton.to_dict() and "irreversible" not in baton.to_dict()

    def test_the_cli_refuses_in_one_line_and_writes_nothing(self, hb: Callable[..., Result], state_dir: Path,
                                                            tmp_path: Path) -> None:
        assert hb("new", "t1", "--task", "x", "--step", "s", "--workdir", str(tmp_path)).code == 0
        before = (state_dir / "batons" / "t1.toml").read_bytes()
        for args in (["--protect", "/etc/shadow"], ["--forbid", "*"], ["--protect", "a\x01b"]):
            r = hb("add", "t1", "constraints", "careful", *args)
            assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        assert (state_dir / "batons" / "t1.toml").read_bytes() == before


def pre_tool_use(cwd: Path, tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"session_id": "sess-1", "cwd": str(cwd), "hook_event_name": "PreToolUse", "tool_name": tool,
            "tool_input": tool_input, "tool_use_id": "toolu_1", "permission_mode": "acceptEdits"}


class TestTheHook:
    """`heartbeat hook claude` at PreToolUse, run for real on a real state dir."""

    @pytest.fixture
    def work(self, tmp_path: Path) -> Path:
        path = tmp_path / "work"
        path.mkdir()
        return path

    @pytest.fixture
    def bound(self, hb: Callable[..., Result], state_dir: Path, work: Path) -> dict[str, str]:
        r = hb("new", "t1", "--task", "Fix it", "--step", "one", "--workdir", str(work),
               "--constraint", "Do not touch prod.cfg", "--protect", "prod.cfg")
        assert r.code == 0, r.err
        claimed = hb("claim", "t1", "--pid", str(os.getpid()))
        assert claimed.code == 0, claimed.err
        return {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": claimed.out.strip()}

    def run(self, hb: Callable[..., Result], ev: dict[str, Any], env: dict[str, str]) -> dict[str, Any] | None:
        r = hb("hook", "claude", input=json.dumps(ev), env=env)
        assert r.code == 0 and not r.err, r.err
        return json.loads(r.out) if r.out.strip() else None

    def refusals(self, state_dir: Path) -> list[dict[str, Any]]:
        store = FileStore(str(state_dir))
        try:
            return [e.data for e in store.ledger.events("t1") if e.kind == "rail_refused"]
        finally:
            store.close()

    def test_an_allowed_call_prints_nothing(self, hb: Callable[..., Result], work: Path,
                                            bound: dict[str, str]) -> None:
        assert self.run(hb, pre_tool_use(work, "Write", file_path=str(work / "a.txt")), bound) is None

    def test_a_protected_write_is_denied_and_recorded(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                                     bound: dict[str, str]) -> None:
        out = self.run(hb, pre_tool_use(work, "Write", file_path=str(work / "prod.cfg"), content="x"), bound)
        assert out is not None
        decision = out["hookSpecificOutput"]
        assert decision["hookEventName"] == "PreToolUse" and decision["permissionDecision"] == "deny"
        assert "prod.cfg is protected" in decision["permissionDecisionReason"]
        [refusal] = self.refusals(state_dir)
        assert refusal["rule"] == "protected" and refusal["tool"] == "Write" and refusal["session_id"] == "sess-1"

    def test_a_block_holds_from_the_next_call(self, hb: Callable[..., Result], state_dir: Path, work: Path,
                                              bound: dict[str, str]) -> None:
        assert self.run(hb, pre_tool_use(work, "Bash", command="make"), bound) is None
        assert hb("block", "t1", "--on", "Dana's review").code == 0
        out = self.run(hb, pre_tool_use(work, "Bash", command="make"), bound)
        assert out is not None and "Dana's review" in out["hookSpecificOutput"]["permissionDecisionReason"]
        own = self.run(hb, pre_tool_use(work, "Bash", command="heartbeat show t1"), bound)
        assert own is not None and own["hookSpecificOutput"]["permissionDecision"] == "allow"  # reads why

    def test_a_constraint_added_mid_run_holds_from_the_next_call(self, hb: Callable[..., Result], work: Path,
                                                                 bound: dict[str, str]) -> None:
        call = pre_tool_use(work, "Bash", command="curl -X POST https://pay.example/charge")
        assert self.run(hb, call, bound) is None
        assert hb("add", "t1", "constraints", "No payments", "--forbid", "curl *pay.example*").code == 0
        assert self.run(hb, call, bound) is not None

    def test_a_persons_unbound_session_is_never_held(self, hb: Callable[..., Result], work: Path,
                                                     bound: dict[str, str]) -> None:
        assert self.run(hb, pre_tool_use(work, "Write", file_path=str(work / "prod.cfg")), {}) is None

    def test_an_irreversible_call_runs_verify_and_records_it(self, hb: Callable[..., Result], state_dir: Path,
                                                             work: Path, bound: dict[str, str]) -> None:
        (work / "key.txt").write_text("one")
        assert hb("add", "t1", "key_files", "key.txt").code == 0
        call = pre_tool_use(work, "Bash", command="git push origin main")
        assert self.run(hb, call, bound) is None  # fresh: allowed
        (work / "key.txt").write_text("two")
        out = self.run(hb, call, bound)
        assert out is not None and "key.txt" in out["hookSpecificOutput"]["permissionDecisionReason"]
        store = FileStore(str(state_dir))
        try:
            results = [e.data["result"] for e in store.ledger.events("t1") if e.kind == "verified"]
        finally:
            store.close()
        assert results == ["fresh", "stale"]
        assert [r["rule"] for r in self.refusals(state_dir)] == ["stale"]

    def test_the_rail_loads_nothing_heavy(self, state_dir: Path, work: Path, bound: dict[str, str]) -> None:
        """An allowed PreToolUse imports no argparse, scheduler, watcher, structlog, psutil or MCP SDK."""
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "heartbeat", "hook", "claude"],
                              input=json.dumps(pre_tool_use(work, "Bash", command="ls")), text=True,
                              capture_output=True, timeout=60,
                              env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), **bound))
        assert proc.returncode == 0
        modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                   if line.startswith("import time:")}
        assert "heartbeat.tasks.rail" in modules
        roots = {name.split(".")[0] for name in modules}
        assert not roots & {"argparse", "apscheduler", "watchdog", "structlog", "psutil", "mcp"}


class TestRelayed:
    """With a daemon running, a bound agent's PreToolUse is decided by the daemon's rail, as the hook decides it."""

    @pytest.mark.slow
    def test_the_daemon_answers_allow_and_deny(self, short_root: Path) -> None:
        from daemon_harness import DaemonHarness

        from heartbeat.hotpath import relay

        h = DaemonHarness(short_root, tick="200ms", stall_after="1h")
        h.start()
        try:
            h.wait(lambda: (h.state / relay.SOCKET_NAME).exists(), "the relay socket")
            r = h.cli("new", "r1", "--task", "t", "--step", "s", "--workdir", str(short_root), "--constraint",
                      "Leave prod.cfg", "--protect", "prod.cfg", "--claim", "--pid", str(os.getpid()))
            assert r.returncode == 0, r.stderr
            env = {**h.env(), "HEARTBEAT_STATE_DIR": str(h.state), "HEARTBEAT_TASK": "r1",
                   "HEARTBEAT_EPOCH": r.stdout.strip()}

            def hook(ev: dict[str, Any], **extra: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([sys.executable, "-m", "heartbeat", "hook", "claude"], input=json.dumps(ev),
                                      capture_output=True, text=True, env={**env, **extra}, timeout=60)

            allowed = hook(pre_tool_use(short_root, "Write", file_path=str(short_root / "a.txt")))
            assert (allowed.returncode, allowed.stdout, allowed.stderr) == (0, "", "")
            denied = hook(pre_tool_use(short_root, "Write", file_path=str(short_root / "prod.cfg")))
            assert denied.returncode == 0 and denied.stderr == ""
            assert json.loads(denied.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
            answered = [e for e in h.log() if e.get("event") == "rail_relayed"]
            assert [e["refused"] for e in answered] == [False, True]
            # the same answer without the daemon, decided in the hook's own process
            local = hook(pre_tool_use(short_root, "Write", file_path=str(short_root / "prod.cfg")),
                         HEARTBEAT_RELAY="off")
            assert json.loads(local.stdout) == json.loads(denied.stdout)
            kinds = [e.data["rule"] for e in h.events("r1") if e.kind == "rail_refused"]
            assert kinds == ["protected", "protected"]
        finally:
            h.stop()


class TestReachesEveryAgent:
    """The claude-code preset passes the rail with each run; a launcher that would switch it off is refused."""

    def test_check_config_refuses_bare(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """claude's --bare skips every hook, the rail with them: check-config exits 2 naming the key."""
        config = tmp_path / "heartbeat.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "s"}"\ndefault_launcher = "claude"\n'
                          '[launchers.claude]\npreset = "claude-code"\nargs = ["--model", "sonnet", "--bare"]\n')
        r = hb("--config", str(config), "check-config")
        assert r.code == 2 and "launchers.claude.args" in r.err and "--bare" in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1

    def test_the_rail_globs_of_a_launcher_and_of_the_config(self, tmp_path: Path) -> None:
        """A launcher's irreversible list replaces [guards]'s, which replaces the defaults; bad globs are refused."""
        from heartbeat.config.load import parse_config
        from heartbeat.model import defaults

        config = parse_config('[guards]\nirreversible = ["deploy *"]\n[launchers.agent]\ncommand = ["a"]\n'
                              '[launchers.careful]\ncommand = ["b"]\nirreversible = ["git push*"]\n', path="c.toml")
        assert config.irreversible("agent") == ("deploy *",) and config.irreversible("careful") == ("git push*",)
        assert parse_config("", path="c.toml").irreversible("") == defaults.IRREVERSIBLE
        with pytest.raises(BadInput, match=r"guards\.irreversible"):
            parse_config('[guards]\nirreversible = ["*"]\n', path="c.toml")


class TestGuardsEverywhere:
    """Guards from a pipeline file and from the MCP server's add land in the baton as the CLI's do."""

    def test_a_pipeline_stage_with_guards(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        pipeline = tmp_path / "p.toml"
        pipeline.write_text('[stages.build]\ntask = "build"\nirreversible = ["make release*"]\n'
                            'guards = [{ constraint = "Leave prod.cfg", protect = ["prod.cfg"] },'
                            ' { constraint = "No deploys", forbid = ["deploy *"] }]\n')
        r = hb("pipeline", "new", "feat", "--from", str(pipeline))
        assert r.code == 0, r.err
        doc = json.loads(hb("show", "feat.build", "--json").out)
        assert doc["constraints"] == ["Leave prod.cfg", "No deploys"] and doc["irreversible"] == ["make release*"]
        assert doc["guards"] == [{"constraint": "Leave prod.cfg", "protect": ["prod.cfg"]},
                                 {"constraint": "No deploys", "forbid": ["deploy *"]}]

    @pytest.mark.parametrize("guards", ['[{ constraint = "c", protect = ["/etc/x"] }]', '[{ constraint = "c", x = 1 }]',
                                        '"prod.cfg"', '[{ constraint = "c", forbid = ["*"] }]'])
    def test_a_hostile_stage_guard_is_one_line_and_creates_nothing(self, hb: Callable[..., Result], tmp_path: Path,
                                                                   state_dir: Path, guards: str) -> None:
        pipeline = tmp_path / "p.toml"
        pipeline.write_text(f'[stages.build]\ntask = "build"\nguards = {guards}\n')
        r = hb("pipeline", "new", "feat", "--from", str(pipeline))
        assert r.code == 2 and "stages.build.guards" in r.err and len(r.err.strip().splitlines()) == 1, r.err
        assert not list((state_dir / "batons").glob("*.toml")) if (state_dir / "batons").exists() else True

    def test_the_mcp_add_with_protect(self, hb: Callable[..., Result], state_dir: Path, tmp_path: Path) -> None:
        pytest.importorskip("mcp")
        from test_mcp import run_client, text_of

        assert hb("new", "t1", "--task", "x", "--step", "s", "--workdir", str(tmp_path)).code == 0

        async def body(c: Any) -> Any:
            ok = await c.call_tool("add", {"id": "t1", "field": "constraints", "values": ["Leave prod.cfg"],
                                          "protect": ["prod.cfg"]})
            bad = await c.call_tool("add", {"id": "t1", "field": "done", "values": ["x"], "forbid": ["rm *"]})
            return ok, bad

        ok, bad = run_client(state_dir, body)
        assert not ok.is_error and bad.is_error and "protect and forbid" in text_of(bad)
        doc = json.loads(hb("show", "t1", "--json").out)
        assert doc["guards"] == [{"constraint": "Leave prod.cfg", "protect": ["prod.cfg"]}]


class TestSymlinks:
    """A write through a symlink in the workdir to a protected file is refused (the target is read through it)."""

    def test_a_link_to_the_protected_file(self, tmp_path: Path) -> None:
        (tmp_path / "prod.cfg").write_text("x")
        (tmp_path / "innocent.txt").symlink_to(tmp_path / "prod.cfg")
        guards = (Guard("Leave prod.cfg", protect=["prod.cfg"]),)
        task = RailView(task="t1", status=Status.ACTIVE, epoch=1, caller_epoch=1, workdir=str(tmp_path), guards=guards)
        decision = decide(ToolCall("Write", paths=(str(tmp_path / "innocent.txt"),), cwd=str(tmp_path)), task)
        assert decision.rule is Rule.PROTECTED
