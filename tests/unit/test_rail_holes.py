"""The rail's holes an outside attack found this turn, each closed: a refusal that a failing ledger,
a long command, a renamed program, a changed fence variable, a protected folder named bare, a lost
relay answer or an agent's own workdir change used to turn into an allow."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from heartbeat.hotpath import relay
from heartbeat.model import defaults
from heartbeat.model.baton import Guard, Status
from heartbeat.model.errors import BadInput, StoreError
from heartbeat.store.memory import MemoryStore
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.rail import RailView, Rule, ToolCall, check, decide
from heartbeat.tasks.write import FENCED_COMMANDS, refuse_agent_fields

WORK = "/srv/work"
GUARDS = (Guard("Do not touch config/prod.toml", protect=["config/prod.toml"]),
          Guard("Keep out of secrets", protect=["secrets/"]))


def view(status: Status = Status.ACTIVE, *, guards: tuple[Guard, ...] = GUARDS,
         irreversible: tuple[str, ...] = ("git push*",)) -> RailView:
    return RailView(task="t1", status=status, epoch=3, caller_epoch=3, workdir=WORK, blocked_on="",
                    gate="", guards=guards, irreversible=irreversible)


def bash(command: str, *, cut: bool = False) -> ToolCall:
    return ToolCall("Bash", command=command, cwd=WORK, cut=cut)


class TestTheDecision:
    @pytest.mark.parametrize(("what", "call", "rule"), [
        ("the fence's epoch dropped for a write", bash("HEARTBEAT_EPOCH= heartbeat set t2 step=x"), Rule.FORBIDDEN),
        ("the task variable unset", bash("unset HEARTBEAT_TASK; heartbeat add t2 done x"), Rule.FORBIDDEN),
        ("env -u of the epoch", bash("env -u HEARTBEAT_EPOCH heartbeat set t1 step=x"), Rule.FORBIDDEN),
        ("a protected folder named bare", bash("rm -r secrets"), Rule.PROTECTED),
        ("a protected folder moved away", bash("mv secrets /tmp/gone"), Rule.PROTECTED),
        ("a command longer than the rail reads", bash("echo", cut=True), Rule.FORBIDDEN),
    ])
    def test_refused(self, what: str, call: ToolCall, rule: Rule) -> None:
        """Each of these was allowed on the rail before this change (the attack's findings 2, 6, 9)."""
        assert decide(call, view()).rule is rule, what

    def test_reading_the_variables_stays_allowed(self) -> None:
        """Naming $HEARTBEAT_TASK is not changing it."""
        assert decide(bash('heartbeat show "$HEARTBEAT_TASK"'), view()).allow

    def test_a_long_command_of_a_task_with_nothing_to_check_is_allowed(self) -> None:
        """With no guard and no irreversible glob there is nothing the unread part could hide."""
        assert decide(bash("echo", cut=True), view(guards=(), irreversible=())).allow


class FailingLedger(MemoryStore):
    def record(self, events: object) -> None:  # type: ignore[override]
        raise StoreError("cannot write the ledger: database is locked")


class TestARefusalStands:
    def test_a_ledger_that_cannot_take_the_record_leaves_the_refusal(self) -> None:
        """A refusal is not undone by its record failing (before: the hook's one line and exit 0, an allow)."""
        store = FailingLedger()
        tasks.new_task(store, "t1", task="t", step="s", blocked_on="a human")
        baton = store.load("t1")
        event = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls \ud800"},
                 "cwd": WORK}
        decision = check(event, baton, store, caller_epoch=baton.meta.epoch, irreversible=())
        assert not decision.allow and decision.rule is Rule.NOT_ACTIVE

    def test_the_record_waits_for_the_answer(self) -> None:
        """With ``later``, the record is handed back to run once the answer is out."""
        store = MemoryStore()
        tasks.new_task(store, "t1", task="t", step="s", blocked_on="a human")
        baton = store.load("t1")
        later: list = []
        event = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}, "cwd": WORK}
        check(event, baton, store, caller_epoch=baton.meta.epoch, irreversible=(), later=later)
        assert [e for e in store.ledger.events("t1") if e.kind == "rail_refused"] == []
        [record] = later
        record()
        assert [e.data["rule"] for e in store.ledger.events("t1") if e.kind == "rail_refused"] == ["not_active"]


class TestTheFence:
    def test_pause_and_resume_are_fenced(self) -> None:
        """An agent of one task may not pause or resume another (they were missing from the fence)."""
        assert {"pause", "resume"} <= FENCED_COMMANDS

    def test_an_agent_cannot_move_its_workdir_or_launcher(self) -> None:
        """Moving the workdir stepped around every --protect guard; a person still can."""
        agent = {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "3"}
        with pytest.raises(BadInput, match="workdir"):
            refuse_agent_fields("t1", ["step", "workdir"], agent)
        with pytest.raises(BadInput, match="launcher"):
            refuse_agent_fields("t1", ["launcher"], agent)
        refuse_agent_fields("t1", ["workdir"], {"HEARTBEAT_TASK": "t1"})  # a person's bound session
        refuse_agent_fields("t1", ["step"], agent)


class TestALostRelayAnswer:
    def test_a_daemon_that_greets_then_drops_the_call_leaves_the_decision_to_the_hook(self, tmp_path: Path) -> None:
        """The daemon's rail answering garbage or nothing is not an allow: the hook decides itself (None)."""
        state = tmp_path / "s"
        state.mkdir()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(state / relay.SOCKET_NAME))
        server.listen(1)

        def serve() -> None:
            conn, _ = server.accept()
            conn.sendall(relay.greeting(""))
            conn.recv(65536)
            conn.sendall(b"garbage")
            conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        env = {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": "3", "HEARTBEAT_STATE_DIR": str(state)}
        event = b'{"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}'
        try:
            assert relay.forward_rail(event, env) is None
        finally:
            thread.join(5)
            server.close()

    def test_the_hook_waits_less_for_the_rail_than_its_cli_waits_for_the_hook(self) -> None:
        """A slow daemon is left before the agent CLI's hook timeout lets the call go on by itself."""
        assert defaults.RAIL_REPLY_TIMEOUT < defaults.HOOK_TIMEOUT


class TestWriteTargets:
    @pytest.mark.parametrize(("what", "event"), [
        ("an apply_patch that moves a file onto it",
         {"tool_name": "apply_patch", "tool_input": {"command": "*** Begin Patch\n*** Update File: a.txt\n"
                                                                "*** Move to: config/prod.toml\n*** End Patch"}}),
        ("a patch under tool_input.input", {"tool_name": "apply_patch",
                                            "tool_input": {"input": "*** Begin Patch\n*** Add File: config/prod.toml"}}),
        ("an MCP move's destination", {"tool_name": "mcp__fs__move_file",
                                       "tool_input": {"source": "x", "destination": "config/prod.toml"}}),
        ("an MCP tool's list of paths", {"tool_name": "mcp__fs__write_many",
                                         "tool_input": {"paths": ["ok.txt", "config/prod.toml"]}}),
    ])
    def test_every_named_target_is_read(self, what: str, event: dict) -> None:
        """Write targets the rail did not read (the attack's finding 7) are protected like a Write's."""
        from heartbeat.tasks.rail import tool_call

        call = tool_call({"hook_event_name": "PreToolUse", "cwd": WORK, **event})
        assert decide(call, view()).rule is Rule.PROTECTED, what
