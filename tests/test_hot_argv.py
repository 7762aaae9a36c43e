"""The one reader of an agent's call (:mod:`heartbeat.hotpath.argv`) and the hot paths built on it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heartbeat.cli import parser
from heartbeat.hotpath import relay
from heartbeat.hotpath.argv import agent_call
from heartbeat.tasks.write import parse_hot

CASES = [
    (["touch", "t"], ("touch", "t", (), None)),
    (["show", "t"], ("show", "t", (), None)),
    (["done", "t"], ("done", "t", (), None)),
    (["done", "t", "--note", "n"], ("done", "t", (), "n")),
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
    @given(st.lists(st.sampled_from(["touch", "show", "done", "set", "add", "t", "a=b", "done", "x", "--note",
                                     "-x", "--expect-revision", "3", ""]), max_size=6))
    def test_every_hot_path_reads_what_the_one_reader_reads(self, argv: list[str]) -> None:
        """The relay, the agent's write and the CLI's parser-free reader take exactly the calls the one
        reader calls theirs, for any arguments."""
        call = agent_call(argv)
        assert relay.relayable(argv) == (call is not None and call[0] in ("set", "add"))
        assert relay.relayable(argv, agent_commands=True) == (call is not None)
        assert (parse_hot(argv, agent_commands=True) is not None) == (call is not None)
        hot = parser._hot_args(argv)
        assert (hot is not None) == (call is not None and call[0] in ("touch", "set", "add"))
