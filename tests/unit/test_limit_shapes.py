"""A limit is a wait only in the CLI's own API-error shapes (issue 24 item 5).

Before, any failed run whose error text held "429", "rate limiter", "Overloaded" or "limit
reached" gave its attempt back until the 6 h longest wait (the probe: 9 runs, attempt 0). Per
CLI, a failed run of a task whose own output mentions limits must fail like any other, beside
the real shapes (recorded from the real CLIs in tests/support/data) that must wait.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heartbeat.presets.claude import parse_claude
from heartbeat.presets.codex import parse_codex
from heartbeat.presets.gemini import parse_gemini

DATA = Path(__file__).resolve().parents[1] / "support" / "data"
OWN_WORDS = (
    "Fixed the rate limiter; the 429 handling test still fails",
    "Overloaded: the queue worker drops jobs past its limit reached check",
    "The job limit reached 500; see the rate limit section",
)
"""A task's own failure text that mentions limits: the work is about limits, the API was fine."""


def _claude_error(result: str) -> bytes:
    """claude's result line of a run that failed for its own reasons (no api_error_status)."""
    return json.dumps({"type": "result", "subtype": "success", "is_error": True, "result": result,
                       "session_id": "0b6f7c8e-1f6d-4b43-9c55-1b7e9f2a3c4d", "terminal_reason": "completed"}).encode()


def _codex_failed(message: str) -> bytes:
    return (json.dumps({"type": "thread.started", "thread_id": "01a22d3b-906d-79d2-8650-0ef8db32103e"}) + "\n"
            + json.dumps({"type": "turn.failed", "error": {"message": message}})).encode()


def _gemini_error(message: str, kind: str = "Error") -> bytes:
    return json.dumps({"type": "result", "status": "error", "error": {"type": kind, "message": message},
                       "stats": {}}).encode()


class TestClaude:
    @pytest.mark.parametrize("text", OWN_WORDS)
    def test_its_own_words_about_limits_are_a_failure(self, text: str) -> None:
        """An is_error result in the task's own words (no API error status): failed, not a wait
        (on 4c852cf: rate_limited True)."""
        info = parse_claude(_claude_error(text))
        assert info.is_error and not info.rate_limited

    @pytest.mark.parametrize("fixture", ["claude_rate_limited.log", "claude_usage_limit.log", "claude_error_exit0.log"])
    def test_the_real_limit_shapes_wait(self, fixture: str) -> None:
        """The real 429, usage limit and 529 results wait."""
        assert parse_claude((DATA / fixture).read_bytes()).rate_limited

    @pytest.mark.parametrize("text", ["API Error: Request rejected (429) · slow down", "API Error: 529 Overloaded",
                                      "API Error: Repeated 529 Overloaded errors",
                                      "Claude AI usage limit reached|1764612000",
                                      "You've hit your limit · resets 3pm (UTC)", "5-hour limit reached ∙ resets 3pm"])
    def test_the_clis_own_limit_texts_wait_without_a_status(self, text: str) -> None:
        """The CLI's limit texts wait even where the result carries no api_error_status."""
        assert parse_claude(_claude_error(text)).rate_limited


class TestCodex:
    @pytest.mark.parametrize("text", OWN_WORDS)
    def test_its_own_words_about_limits_are_a_failure(self, text: str) -> None:
        """A turn.failed in other words: failed, not a wait (on 4c852cf: rate_limited True)."""
        info = parse_codex(_codex_failed(text))
        assert info.is_error and not info.rate_limited

    @pytest.mark.parametrize("fixture", ["codex_rate_limited.log", "codex_overloaded.log"])
    def test_the_real_limit_shapes_wait(self, fixture: str) -> None:
        """codex 0.171.0's real 429 ("exceeded retry limit, last status: 429 Too Many Requests") and 529
        ("unexpected status 529 ...: Overloaded") wait."""
        info = parse_codex((DATA / fixture).read_bytes())
        assert info.is_error and info.rate_limited

    def test_a_400_quoting_a_429_is_a_failure(self) -> None:
        """An API error of another status whose body mentions 429 is not a limit."""
        assert not parse_codex(_codex_failed("unexpected status 400 Bad Request: the prompt says 429")).rate_limited


class TestGemini:
    @pytest.mark.parametrize("text", OWN_WORDS)
    def test_its_own_words_about_limits_are_a_failure(self, text: str) -> None:
        """A result error in other words: failed, not a wait (on 4c852cf: rate_limited True)."""
        info = parse_gemini(_gemini_error(text))
        assert info.is_error and not info.rate_limited

    @pytest.mark.parametrize(("kind", "text"), [
        ("TerminalQuotaError", "You have exhausted your daily quota on this model."),
        ("RetryableQuotaError", "Please retry in 35s"),
        ("Error", '[API Error: {"error":{"code":429,"message":"Resource exhausted","status":"RESOURCE_EXHAUSTED"}}]'),
    ])
    def test_its_quota_errors_wait(self, kind: str, text: str) -> None:
        """Gemini CLI's quota error types and a 429 API error wait."""
        assert parse_gemini(_gemini_error(text, kind)).rate_limited
