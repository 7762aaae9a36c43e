"""`heartbeat mcp`: the batons over MCP, driven by the official SDK's own client over stdio.

The server is a real subprocess (``python -m heartbeat mcp``) started by the SDK's
``stdio_client``; its environment carries ``HEARTBEAT_TASK``/``HEARTBEAT_EPOCH`` as an agent
the daemon launched would have them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import Result, clean_env
from mcp import Client  # the heartbeat[mcp] extra, which the test extra pulls in
from mcp.client.stdio import StdioServerParameters

from heartbeat.integrations.mcp_server import TOOL_NAMES
from heartbeat.store.files import FileStore


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


def run_client(state_dir: Path, body: Callable[[Client], Awaitable[Any]], **env: str) -> Any:
    params = StdioServerParameters(command=sys.executable, args=["-m", "heartbeat", "mcp"],
                                   env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir), **env))

    async def main() -> Any:
        with anyio.fail_after(60):
            async with Client(params) as client:
                return await body(client)

    return anyio.run(main)


def text_of(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "deploy.sh").write_text("echo v1\n")
    return path


@pytest.fixture
def task(hb: Callable[..., Result], work: Path) -> str:
    r = hb("new", "t1", "--task", "Ship it", "--step", "Build", "--intent", "Release 1.2",
           "--workdir", str(work), "--key-file", "deploy.sh")
    assert r.code == 0, r.err
    return "t1"


def claim(hb: Callable[..., Result]) -> int:
    r = hb("claim", "t1", "--pid", str(os.getpid()), "--force")
    assert r.code == 0, r.err
    return int(r.out)


class TestTools:
    """The tools are listed and behave as the CLI commands they mirror."""

    def test_lists_the_tools_and_the_resource(self, state_dir: Path, task: str) -> None:
        """Exactly the ten verbs, and the baton://{id} template."""
        async def body(c: Client) -> Any:
            tools = await c.list_tools()
            templates = await c.list_resource_templates()
            return [t.name for t in tools.tools], [t.uri_template for t in templates.resource_templates]

        names, templates = run_client(state_dir, body)
        assert sorted(names) == sorted(TOOL_NAMES)
        assert templates == ["baton://{id}"]

    def test_show_status_brief_and_resource(self, state_dir: Path, task: str) -> None:
        """show is the baton as data, status lists it, brief is the CLI's brief, baton://t1 its TOML."""
        async def body(c: Client) -> Any:
            show = await c.call_tool("show", {"id": "t1"})
            status = await c.call_tool("status", {})
            brief = await c.call_tool("brief", {"id": "t1"})
            resource = await c.read_resource("baton://t1")
            return show, status, brief, resource

        show, status, brief, resource = run_client(state_dir, body)
        assert not show.is_error and show.structured_content["task"] == "Ship it"
        assert show.structured_content["meta"]["id"] == "t1"
        assert [row["id"] for row in status.structured_content["tasks"]] == ["t1"]
        assert "Release 1.2" in text_of(brief)
        assert 'task = "Ship it"' in resource.contents[0].text

    def test_writes_land_in_the_baton_and_the_ledger(self, hb: Callable[..., Result], state_dir: Path,
                                                     task: str) -> None:
        """set, add and touch change the baton on disk like the CLI does, with the agent's epoch."""
        epoch = claim(hb)

        async def body(c: Client) -> Any:
            a = await c.call_tool("set", {"id": "t1", "fields": {"step": "Test", "next_step": "Tag"}})
            b = await c.call_tool("add", {"id": "t1", "field": "done", "values": ["Built"]})
            t = await c.call_tool("touch", {"id": "t1"})
            return a, b, t

        results = run_client(state_dir, body, HEARTBEAT_TASK="t1", HEARTBEAT_EPOCH=str(epoch))
        assert not any(r.is_error for r in results), [text_of(r) for r in results]
        baton = json.loads(hb("show", "t1", "--json").out)
        assert (baton["step"], baton["next_step"], baton["done"]) == ("Test", "Tag", ["Built"])
        store = FileStore(str(state_dir))
        actors = {e.actor for e in store.ledger.events("t1") if e.kind == "updated"}
        store.close()
        assert actors == {"agent"}

    def test_block_snooze_done(self, hb: Callable[..., Result], state_dir: Path, task: str) -> None:
        """block, then (after a human unblocks) snooze and done, with the CLI's statuses."""
        async def block(c: Client) -> Any:
            return await c.call_tool("block", {"id": "t1", "on": "a review"})

        assert run_client(state_dir, block).structured_content["status"] == "blocked"
        assert hb("unblock", "t1", "--by", "ann").code == 0

        async def rest(c: Client) -> Any:
            bad = await c.call_tool("snooze", {"id": "t1"})
            snooze = await c.call_tool("snooze", {"id": "t1", "duration": "30m"})
            done = await c.call_tool("done", {"id": "t1", "note": "shipped"})
            return bad, snooze, done

        bad, snooze, done = run_client(state_dir, rest)
        assert bad.is_error and "give one of until" in text_of(bad) and "(exit 2)" in text_of(bad)
        assert not snooze.is_error and done.structured_content["status"] == "done"


class TestFencingAndErrors:
    """The server's epoch fences its writes; refusals are tool errors with the message and exit code."""

    def test_set_with_a_superseded_epoch_is_refused(self, hb: Callable[..., Result], state_dir: Path,
                                                    task: str) -> None:
        """An agent whose epoch was superseded gets exit 5 as a tool error, and the baton is unchanged."""
        old = claim(hb)
        assert claim(hb) == old + 1
        before = json.loads(hb("show", "t1", "--json").out)

        async def body(c: Client) -> Any:
            return await c.call_tool("set", {"id": "t1", "fields": {"step": "Stale write"}})

        r = run_client(state_dir, body, HEARTBEAT_TASK="t1", HEARTBEAT_EPOCH=str(old))
        assert r.is_error
        assert "superseded" in text_of(r) and text_of(r).endswith("(exit 5)")
        assert json.loads(hb("show", "t1", "--json").out) == before

    def test_a_bound_server_refuses_an_epoch_argument_naming_another_epoch(
            self, hb: Callable[..., Result], state_dir: Path, task: str) -> None:
        """A server bound to epoch N by HEARTBEAT_EPOCH refuses every call naming another epoch, as an
        int or a string, write or verify, and the baton is unchanged: the refusal names the current
        epoch, and a confused agent retrying with it must not overwrite its successor (issue 20)."""
        old = claim(hb)
        new = claim(hb)
        before = json.loads(hb("show", "t1", "--json").out)

        async def body(c: Client) -> Any:
            tools = {t.name: t.description or "" for t in (await c.list_tools()).tools}
            calls = [
                await c.call_tool("set", {"id": "t1", "fields": {"step": "Stale write"}, "epoch": new}),
                await c.call_tool("set", {"id": "t1", "fields": {"step": "Stale write"}, "epoch": str(new)}),
                await c.call_tool("add", {"id": "t1", "field": "done", "values": ["x"], "epoch": new}),
                await c.call_tool("touch", {"id": "t1", "epoch": new}),
                await c.call_tool("block", {"id": "t1", "on": "me", "epoch": new}),
                await c.call_tool("snooze", {"id": "t1", "duration": "1h", "epoch": new}),
                await c.call_tool("done", {"id": "t1", "epoch": new}),
                await c.call_tool("verify", {"id": "t1", "epoch": new}),
            ]
            same = await c.call_tool("verify", {"id": "t1", "epoch": old})  # its own epoch: answered (superseded)
            return tools, calls, same

        tools, calls, same = run_client(state_dir, body, HEARTBEAT_TASK="t1", HEARTBEAT_EPOCH=str(old))
        for r in calls:
            assert r.is_error, text_of(r)
            assert f"bound to epoch {old}" in text_of(r) and text_of(r).endswith("(exit 2)")
        assert not same.is_error and same.structured_content["code"] == 5
        assert json.loads(hb("show", "t1", "--json").out) == before
        for name in ("set", "add", "touch", "block", "done", "snooze", "verify"):
            assert "HEARTBEAT_EPOCH" in tools[name] and "refuses any other" in tools[name]

    def test_an_unbound_server_writes_for_the_epoch_named(self, hb: Callable[..., Result], state_dir: Path,
                                                          task: str) -> None:
        """Without HEARTBEAT_EPOCH the argument is the fence: the current epoch writes, an old one is refused."""
        old = claim(hb)
        new = claim(hb)

        async def body(c: Client) -> Any:
            stale = await c.call_tool("set", {"id": "t1", "fields": {"step": "Stale"}, "epoch": old})
            fresh = await c.call_tool("set", {"id": "t1", "fields": {"step": "Fresh"}, "epoch": str(new)})
            return stale, fresh

        stale, fresh = run_client(state_dir, body)
        assert stale.is_error and text_of(stale).endswith("(exit 5)")
        assert not fresh.is_error
        assert json.loads(hb("show", "t1", "--json").out)["step"] == "Fresh"

    def test_errors_carry_the_one_line_message(self, state_dir: Path, task: str) -> None:
        """An unknown task, a refused field: the CLI's message and exit code, not a bare 'Error executing tool'."""
        async def body(c: Client) -> Any:
            missing = await c.call_tool("show", {"id": "nope"})
            meta = await c.call_tool("set", {"id": "t1", "fields": {"blocked_on": "x"}})
            return missing, meta

        missing, meta = run_client(state_dir, body)
        assert missing.is_error and "no such task" in text_of(missing) and "(exit 1)" in text_of(missing)
        assert meta.is_error and "blocked_on" in text_of(meta) and "(exit 2)" in text_of(meta)

    def test_verify_codes(self, hb: Callable[..., Result], state_dir: Path, work: Path, task: str) -> None:
        """verify answers 0 fresh, 3 stale (a key file changed), 5 superseded, 4 not active."""
        epoch = claim(hb)

        async def verify(c: Client) -> Any:
            return (await c.call_tool("verify", {"id": "t1"})).structured_content

        env = {"HEARTBEAT_TASK": "t1", "HEARTBEAT_EPOCH": str(epoch)}
        assert run_client(state_dir, verify, **env)["code"] == 0
        (work / "deploy.sh").write_text("echo v2\n")
        stale = run_client(state_dir, verify, **env)
        assert (stale["code"], stale["result"]) == (3, "stale") and stale["changed"]
        claim(hb)
        assert run_client(state_dir, verify, **env)["code"] == 5
        assert hb("done", "t1").code == 0
        assert run_client(state_dir, verify)["code"] == 4

    def test_a_missing_resource_is_an_error(self, state_dir: Path, task: str) -> None:
        """baton://nope is a resource error naming the task, not a crash."""
        async def body(c: Client) -> Any:
            try:
                await c.read_resource("baton://nope")
            except Exception as exc:  # the SDK raises its MCPError for a protocol error
                return str(exc)
            return "no error"

        assert "no such task" in run_client(state_dir, body)


class TestWithoutTheSdk:
    """Without the extra installed, `heartbeat mcp` says what to install, in one line."""

    def test_one_line_error(self, state_dir: Path) -> None:
        """The SDK missing (its import made to fail) is exit 2 naming the mcp extra and the pip line
        that installs it from this checkout into this interpreter (not PyPI's unrelated `heartbeat`)."""
        import subprocess

        code = ("import sys; sys.modules['mcp'] = None; from heartbeat.cli.main import main; "
                "raise SystemExit(main(['mcp']))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env=clean_env(HEARTBEAT_STATE_DIR=str(state_dir)), stdin=subprocess.DEVNULL)
        assert proc.returncode == 2
        root = Path(__file__).resolve().parents[2]
        assert proc.stderr == (f"heartbeat: mcp needs the MCP SDK 2.x (the mcp extra): {sys.executable} -m pip "
                               f"install -e '{root}[mcp]'\n")


class TestQuestions:
    """`ask` and `answer` over MCP: the downstream's agent asks, the upstream's agent or a person answers."""

    @pytest.fixture
    def seam(self, hb: Callable[..., Result], state_dir: Path) -> FileStore:
        from heartbeat.model.baton import Status

        assert hb("new", "build", "--task", "Build it", "--step", "build", "--claim").code == 0
        assert hb("new", "critic", "--task", "Review it", "--step", "review", "--after", "build").code == 0
        store = FileStore(str(state_dir))
        with store.edit("critic") as ed:  # as the daemon's dispatch leaves it: active, epoch 1
            ed.baton.meta.status, ed.baton.meta.gate, ed.baton.blocked_on = Status.ACTIVE, None, ""
            ed.baton.meta.epoch = 1
        return store

    def test_the_asker_asks_and_the_upstreams_agent_answers(self, seam: FileStore, state_dir: Path) -> None:
        """critic's server asks (q1, held); build's server answers as upstream:build; critic's own server cannot."""
        async def asker(c: Client) -> Any:
            asked = await c.call_tool("ask", {"id": "critic", "question": "Why sqlite?"})
            own = await c.call_tool("answer", {"id": "critic", "qid": "q1", "text": "me"})
            return asked, own

        asked, own = run_client(state_dir, asker, HEARTBEAT_TASK="critic", HEARTBEAT_EPOCH="1")
        assert not asked.is_error and asked.structured_content == {"id": "critic", "qid": "q1"}
        assert own.is_error and "not of 'critic'" in text_of(own) and text_of(own).endswith("(exit 2)")
        assert seam.load("critic").meta.gate.spec() == "question:q1"  # type: ignore[union-attr]

        async def upstream(c: Client) -> Any:
            return await c.call_tool("answer", {"id": "critic", "qid": "q1", "text": "One file, no server."})

        answered = run_client(state_dir, upstream, HEARTBEAT_TASK="build", HEARTBEAT_EPOCH="1")
        assert not answered.is_error and answered.structured_content["answered_by"] == "upstream:build"
        baton = seam.load("critic")
        assert baton.questions[0].answer == "One file, no server." and baton.meta.gate is None

    def test_a_person_answers_and_bad_input_is_one_line(self, seam: FileStore, state_dir: Path) -> None:
        """An unbound server answers as person:NAME; an empty question, a twice-answered qid: tool errors."""
        async def body(c: Client) -> Any:
            empty = await c.call_tool("ask", {"id": "critic", "question": " "})
            asked = await c.call_tool("ask", {"id": "critic", "question": "Who owns it?", "to": "person"})
            first = await c.call_tool("answer", {"id": "critic", "qid": "q1", "text": "Ana.", "by": "ana"})
            again = await c.call_tool("answer", {"id": "critic", "qid": "q1", "text": "Bo."})
            return empty, asked, first, again

        empty, asked, first, again = run_client(state_dir, body)
        assert empty.is_error and "empty" in text_of(empty) and text_of(empty).endswith("(exit 2)")
        assert not asked.is_error and not first.is_error
        assert again.is_error and "answered already" in text_of(again) and text_of(again).endswith("(exit 5)")
        assert seam.load("critic").questions[0].answered_by == "person:ana"
