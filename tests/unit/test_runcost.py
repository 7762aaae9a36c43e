"""A run's cost is read from its whole stream (issue 24 item 4): a final result line longer than
the tail, and runs cut before any result line, are charged, or said to be of unknown cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heartbeat.presets.claude import parse_claude
from heartbeat.presets.common import PresetName, ResultInfo
from heartbeat.presets.registry import parse_result
from heartbeat.presets.runcost import costed, price_of, stream_usage
from heartbeat.system.safefile import read_log_ends

DATA = Path(__file__).resolve().parents[1] / "support" / "data"
SESSION = "0b6f7c8e-1f6d-4b43-9c55-1b7e9f2a3c4d"


def _assistant(msg_id: str, model: str = "claude-sonnet-4-5-20250929", *, text: str = "working",
               input_tokens: int = 10_000, output_tokens: int = 2_000, cache_read: int = 0) -> str:
    """One stream-json assistant line in the shape claude 2.1.332 prints (one per content block)."""
    usage = {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cache_read,
             "output_tokens": output_tokens, "service_tier": "standard"}
    return json.dumps({"type": "assistant", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}], "stop_reason": None, "usage": usage},
        "parent_tool_use_id": None, "session_id": SESSION}, separators=(",", ":"))


def _init() -> str:
    return (DATA / "claude_success.log").read_text().splitlines()[0]


class TestALongResultLineIsReadWhole:
    def test_a_result_line_longer_than_the_tail_keeps_its_cost_error_and_session(self, tmp_path: Path) -> None:
        """A 400 KiB final answer (the tail is 256 KiB): its total_cost_usd, is_error and session are read
        (on 4c852cf: found False, cost None: the run was free)."""
        lines = (DATA / "claude_error_exit0.log").read_text().splitlines()
        result = json.loads(lines[-1])
        result["result"] = "x" * (400 * 1024)
        result["total_cost_usd"] = 3.0
        log = tmp_path / "1.log"
        log.write_text("\n".join([*lines[:-1], *(_assistant(f"msg_{i}") for i in range(50)),
                                  json.dumps(result)]) + "\n")
        info = parse_result("claude-code", read_log_ends(str(log)))
        assert info.found and info.is_error and info.cost_usd == 3.0
        assert info.session_id == SESSION

    def test_a_line_past_the_cap_is_never_read_whole(self, tmp_path: Path) -> None:
        """The tail reaches back at most RESULT_LINE_BYTES: a longer line is cut, as before, never held."""
        log = tmp_path / "1.log"
        log.write_bytes(b"{" + b"x" * 3000 + b"\n")
        data = read_log_ends(str(log), head=100, tail=500, line=1000)
        assert len(data) <= 100 + 1 + 500
        assert parse_claude(data) == ResultInfo()


class TestCutRunsAreCharged:
    def test_usage_per_message_is_priced_once_per_message_id(self, tmp_path: Path) -> None:
        """Two messages, each printed as two content-block lines: 2 x (10k in x $3 + 2k out x $15) per
        million = $0.12; a cut last line and a non-JSON line are skipped."""
        log = tmp_path / "1.log"
        log.write_text("\n".join([_init(), _assistant("msg_a", text="thinking"), _assistant("msg_a"),
                                  _assistant("msg_b"), _assistant("msg_b", text="tool"), "not json",
                                  _assistant("msg_c")[:80]]))
        found = stream_usage([str(log)])
        assert (found.messages, found.priced, found.unpriced) == (2, 2, 0)
        assert found.cost_usd == pytest.approx(0.12)

    def test_a_run_with_no_result_line_is_charged_its_usage(self, tmp_path: Path) -> None:
        """costed() of a SIGTERMed run (no result line): cost_usd from the usage, cost_source usage."""
        log = tmp_path / "1.log"
        log.write_text("\n".join([_init(), _assistant("msg_a"), _assistant("msg_b", cache_read=100_000)]) + "\n")
        info = costed("claude-code", str(log), parse_result("claude-code", read_log_ends(str(log))))
        assert info.cost_usd == pytest.approx(0.12 + 100_000 * 0.30 / 1e6)
        assert info.event_data()["cost_source"] == "usage"

    def test_the_real_claude_sigtermed_is_charged(self) -> None:
        """The real claude 2.1.332, SIGTERMed mid-run, prints no result line (tests/support/data/claude_sigterm.log):
        its two messages of claude-opus-5-5 (an opus the table does not list: opus's highest price) are
        charged, about 24.7k input tokens at $15 per million."""
        log = str(DATA / "claude_sigterm.log")
        info = parse_result("claude-code", read_log_ends(log))
        assert not info.found and info.cost_usd is None
        charged = costed("claude-code", log, info)
        assert charged.cost_source == "usage" and 0.37 < (charged.cost_usd or 0) < 0.39

    def test_the_results_own_cost_wins(self) -> None:
        """A result line's total_cost_usd is the cost; nothing else is read."""
        info = parse_claude((DATA / "claude_success.log").read_bytes())
        assert costed("claude-code", "/nonexistent", info) is info
        assert info.event_data()["cost_source"] == "result"

    def test_nothing_priceable_is_unknown_cost_not_free(self, tmp_path: Path) -> None:
        """No usage at all, or a model no price names: ``cost: unknown`` in the exited event's data."""
        log = tmp_path / "1.log"
        log.write_text(_init() + "\n" + _assistant("msg_a", model="gpt-9") + "\n")
        info = costed("claude-code", str(log), parse_result("claude-code", read_log_ends(str(log))))
        assert info.cost_usd is None and info.event_data()["cost"] == "unknown"
        codex = parse_result("codex", (DATA / "codex_success.log").read_bytes())
        assert costed(PresetName.CODEX, "/nonexistent", codex).event_data()["cost"] == "unknown"

    def test_an_overlong_assistant_line_is_counted_unpriced_and_skipped(self, tmp_path: Path) -> None:
        """A 2 MiB assistant line past a 1 MiB cap: counted unpriced, the others priced."""
        log = tmp_path / "1.log"
        log.write_text("\n".join([_assistant("msg_a"), _assistant("msg_big", text="y" * (2 << 20)),
                                  _assistant("msg_b")]) + "\n")
        found = stream_usage([str(log)], limit=1 << 20)
        assert (found.priced, found.unpriced) == (2, 1)
        assert found.cost_usd == pytest.approx(0.12)

    def test_hostile_logs_are_not_read(self, tmp_path: Path) -> None:
        """A symlink or a FIFO in the log's place: nothing read, nothing hangs."""
        import os

        target = tmp_path / "real.log"
        target.write_text(_assistant("msg_a") + "\n")
        (tmp_path / "link.log").symlink_to(target)
        os.mkfifo(tmp_path / "fifo.log")
        assert stream_usage([str(tmp_path / "link.log"), str(tmp_path / "fifo.log")]).messages == 0

    def test_prices_by_prefix_then_family(self) -> None:
        """The longest prefix wins; an unlisted model of a family is priced at its family's highest."""
        assert price_of("claude-opus-4-5-20251101") == (5.0, 25.0, 6.25, 0.50)
        assert price_of("claude-opus-4-1-20250805") == (15.0, 75.0, 18.75, 1.50)
        assert price_of("claude-opus-5-5") == (15.0, 75.0, 18.75, 1.50)
        assert price_of("gpt-9") is None
