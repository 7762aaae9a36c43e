"""The one reader of an agent's call (:mod:`heartbeat.hotpath.argv`) and the hot paths built on it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heartbeat.cli import parser
from heartbeat.hotpath import relay
from heartbeat.hotpath.argv import AGENT_COMMANDS, READS, agent_call
from heartbeat.tasks.write import parse_hot

CASES = [
    (["touch", "t"], ("touch", "t", (), None)),
    (["show", "t"], ("show", "t", (), None)),
    (["done", "t"], ("done", "t", (), None)),
    (["done", "t", "--note", "n"], ("done", "t", (), "n")),
    (["brief", "t"], ("brief", "t", (), None)),
    (["show", "t", "--json"], ("show", "t", ("--json",), None)),
    (["brief", "t", "--json"], ("brief", "t", ("--json",), None)),
    (["show", "t", "--full"], None),
    (["touch", "t", "--json"], None),
    (["set", "t", "step=x", "next_step=y"], ("set", "t", ("step=x", "next_step=y"), None)),
    (["add", "t", "done", "a", "b"], ("add", "t", ("done", "a", "b"), None)),
    (["touch"], None),
    (["touch", "--help"], None),
    (["touch", "t", "extra"], None),
    (["done", "t", "--note"], None),
    (["done", "t", "--force"], None),
    (["set", "t"], None),
    (["set", "t", "--expect-revision", "3", "a=b"], None),
    (["add", "t", "done"], None),
    (["add", "t", "done", "-x"], None),
    (["status"], None),
    ([], None),
]


class TestTheShapes:
    @pytest.mark.parametrize(("argv", "call"), CASES)
    def test_each_shape_of_an_agents_call(self, argv: list[str], call: object) -> None:
        """Each hot shape is read as itself; anything with another option or a missing argument is not hot."""
        assert agent_call(argv) == call


class TestTheHotPathsAgree:
    @given(st.lists(st.sampled_from(["touch", "show", "brief", "done", "set", "add", "t", "a=b", "x", "--note",
                                     "--json", "-x", "--expect-revision", "3", ""]), max_size=6))
    def test_every_hot_path_reads_what_the_one_reader_reads(self, argv: list[str]) -> None:
        """The relay, the agent's write and the CLI's parser-free reader take exactly the calls the one
        reader calls theirs, for any arguments."""
        call = agent_call(argv)
        write = call is not None and call[0] in ("set", "add")
        agent_command = call is not None and call[0] in AGENT_COMMANDS and not call[2]
        assert relay.relayable(argv) == write
        assert relay.relayable(argv, agent_commands=True) == (write or agent_command)
        assert (parse_hot(argv, agent_commands=True) is not None) == (write or agent_command)
        assert relay.is_read(argv) == (call is not None and call[0] in READS)
        hot = parser._hot_args(argv)
        assert (hot is not None) == (call is not None and call[0] in ("touch", "set", "add"))
