"""MCP tool errors in one line and the CLI's words (issue 24, item 9), through the official SDK's client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Result
from mcp import Client

from tests.system.test_mcp import run_client, text_of


def test_arguments_that_do_not_match_the_schema_are_one_line(hb: Callable[..., Result], state_dir: Path) -> None:
    """A wrong type, a missing argument, a number that is no number: one line each, exit 2, naming the
    argument as the CLI does, no pydantic dump and no URL."""
    assert hb("new", "t1", "--task", "Ship it", "--step", "Build").code == 0

    async def body(c: Client) -> Any:
        return [await c.call_tool("add", {"id": "t1", "field": "done", "values": 5}),
                await c.call_tool("set", {"id": "t1"}),
                await c.call_tool("brief", {"id": "t1", "budget": "x"})]

    texts = [text_of(r) for r in run_client(state_dir, body)]
    assert texts == [
        "Error executing tool add: argument values: input should be a valid list, got 5 (exit 2)",
        "Error executing tool set: the following arguments are required: fields (exit 2)",
        "Error executing tool brief: argument budget: expected an integer, got 'x' (exit 2)",
    ]


def test_an_epoch_past_64_bits_is_refused_as_the_cli_refuses_it(hb: Callable[..., Result], state_dir: Path) -> None:
    """verify/set with epoch (or expect_revision) 2^70: the CLI's out-of-range line, not a SQLite error,
    and nothing written."""
    assert hb("new", "t1", "--task", "Ship it", "--step", "Build").code == 0
    cli = hb("verify", "t1", "--epoch", str(2**70))
    assert cli.code == 2 and f"argument --epoch: {2**70} is out of range (at most {2**63 - 1})" in cli.err
    before = hb("log", "t1", "--json").out

    async def body(c: Client) -> Any:
        return [await c.call_tool("verify", {"id": "t1", "epoch": 2**70}),
                await c.call_tool("set", {"id": "t1", "fields": {"step": "x"}, "epoch": 2**70}),
                await c.call_tool("set", {"id": "t1", "fields": {"step": "x"}, "expect_revision": 2**70})]

    verify, set_, revision = run_client(state_dir, body)
    for r, name in ((verify, "epoch"), (set_, "epoch"), (revision, "expect_revision")):
        assert r.is_error and text_of(r).endswith(
            f"argument {name}: {2**70} is out of range (at most {2**63 - 1}) (exit 2)"), text_of(r)
        assert "SQLite" not in text_of(r) and "\n" not in text_of(r)
    assert hb("log", "t1", "--json").out == before
