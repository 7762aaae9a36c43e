"""The brief: its order, its budget, its warnings and its marks on changed key files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Result

from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Status
from heartbeat.reports.brief import estimate_tokens, render_brief
from heartbeat.store.files import FileStore


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


HEADINGS = ("## Intent", "## Constraints", "## Where things stand", "## Context", "## Pointers",
            "## Keeping the baton")


def full_baton(**overrides: object) -> Baton:
    meta = Meta(id="fix-fallback", status=Status.ACTIVE, revision=12, epoch=3, attempt=2, dispatches=5,
                last_failure="exit 1 after 4m12s", last_exit=1)
    values: dict[str, object] = dict(
        task="Fix empty responses in the fallback path",
        intent="Users get blank answers when the primary model times out; make that impossible.",
        step="Save state and restart the service",
        next_step="Update the deploy script",
        constraints=["Do not touch config/prod.yaml: the client asked us not to"],
        done=["Reproduced the blank answer", "Wrote a failing test"],
        plan=["Reproduced the blank answer", "Wrote a failing test", "Save state and restart the service",
              "Update the deploy script"],
        decisions=["chose a retry with jitter because the upstream rate-limits bursts"],
        rejected=["tried a longer timeout, failed because users wait 60s"],
        unknowns=["whether the staging cache is warm"],
        handoff="/srv/notes/fallback.md",
        meta=meta,
    )
    values.update(overrides)
    return Baton(**values)  # type: ignore[arg-type]


class TestOrder:
    def test_sections_come_in_the_documented_order(self) -> None:
        """Intent, constraints, where things stand, context, pointers, then the how-to, in that order."""
        text = render_brief(full_baton()).text
        positions = [text.index(h) for h in HEADINGS]
        assert positions == sorted(positions)

    def test_intent_is_one_sentence_line_and_constraints_are_loud(self) -> None:
        """The intent is rendered on one line; each constraint is bold under a DO NOT BREAK heading."""
        brief = render_brief(full_baton(intent="Users get blank answers;\n   make that impossible."))
        assert "Users get blank answers; make that impossible.\n" in brief.text
        assert "DO NOT BREAK" in brief.text
        assert "- **Do not touch config/prod.yaml: the client asked us not to**" in brief.text

    def test_state_says_attempt_n_of_m_and_how_the_previous_one_ended(self) -> None:
        """A retry learns it is a retry: attempt N of M and the previous attempt's failure and exit code."""
        text = render_brief(full_baton(), max_attempts=5).text
        state = text[text.index("## Where things stand"):text.index("## Context")]
        assert "Attempt 2 of 5" in state
        assert "this is a retry" in state
        assert "exit 1 after 4m12s" in state and "exit code 1" in state
        assert "Step (current): **Save state and restart the service**" in state
        assert "Next step: Update the deploy script" in state

    def test_block_and_gate_are_shown(self) -> None:
        """A blocked baton's brief names what it is blocked on and the gate that clears it."""
        baton = full_baton(blocked_on="legal review")
        baton.meta.status = Status.BLOCKED
        baton.meta.gate = Gate(GateKind.FILE, "/srv/approved")
        text = render_brief(baton).text
        assert "Blocked on: legal review" in text
        assert "file:/srv/approved" in text

    def test_context_lists_done_plan_decisions_rejected_unknowns(self) -> None:
        """The minimum context carries every list, the plan marked with what is done and current."""
        text = render_brief(full_baton()).text
        context = text[text.index("## Context"):text.index("## Pointers")]
        for needle in ("Wrote a failing test", "[current] Save state and restart the service",
                       "[ ] Update the deploy script", "chose a retry", "tried a longer timeout",
                       "whether the staging cache is warm"):
            assert needle in context
        assert context.index("Done:") < context.index("Plan:") < context.index("Decisions:") \
            < context.index("Rejected") < context.index("Unknowns")

    def test_handoff_document_is_pointed_to(self) -> None:
        """The longer handoff document appears under the pointers."""
        text = render_brief(full_baton()).text
        assert "`/srv/notes/fallback.md`" in text[text.index("## Pointers"):]


class TestBudget:
    def test_default_budget_fits_a_normal_baton_whole(self) -> None:
        """A normal baton fits the default 4,000 tokens: nothing omitted, tokens = bytes / 4."""
        brief = render_brief(full_baton())
        assert brief.omitted == []
        assert brief.budget == 4000
        assert brief.tokens == estimate_tokens(brief.text) <= 4000
        assert "Left out" not in brief.text

    def test_estimate_is_utf8_bytes_over_four(self) -> None:
        """The token estimate counts UTF-8 bytes (not characters), divided by four, rounded up."""
        assert estimate_tokens("abcd") == 1
        assert estimate_tokens("abcde") == 2
        assert estimate_tokens("é" * 4) == 2  # 8 bytes

    def test_tiny_budget_keeps_intent_and_constraints_and_says_what_was_cut(self) -> None:
        """Under a tiny budget the intent and constraints survive whole; the rest is named as left out."""
        brief = render_brief(full_baton(), budget=10)
        assert "Users get blank answers when the primary model times out; make that impossible." in brief.text
        assert "Do not touch config/prod.yaml" in brief.text
        assert "## Context" not in brief.text and "## Pointers" not in brief.text
        assert "where things stand" in brief.omitted and "done" in brief.omitted
        assert "Left out to fit the budget of 10 tokens" in brief.text
        assert any("over the budget" in w for w in brief.warnings)

    def test_cut_comes_from_the_end(self) -> None:
        """What is kept is a prefix of the full brief: the end goes first, item by item."""
        baton = full_baton(decisions=[f"decision {i:03d} " + "x" * 80 for i in range(100)])
        full = render_brief(baton, budget=100_000)
        brief = render_brief(baton, budget=1500)
        assert brief.tokens <= 1500
        kept = brief.text[:brief.text.index("\n_Left out")]
        assert full.text.startswith(kept)
        assert "## Pointers" not in brief.text and "## Keeping the baton" not in brief.text
        cut = [o for o in brief.omitted if o.startswith("decisions (")]
        assert cut and cut[0].endswith("of 100)")
        assert "decision 000" in brief.text and "decision 099" not in brief.text
        assert brief.omitted[-2:] == ["handoff document", "how to keep the baton"]

    def test_long_done_list_is_summarized_not_crowding_out_the_rest(self) -> None:
        """Only the last ten done items are listed (one line says how many came before), so the decisions,
        rejected alternatives and pointers of a long task still fit."""
        baton = full_baton(done=[f"finished {i:03d} " + "x" * 100 for i in range(500)])
        brief = render_brief(baton)
        assert "finished 489" not in brief.text and "finished 490" in brief.text and "finished 499" in brief.text
        assert "490 earlier step(s) done" in brief.text
        assert brief.omitted == ["done (490 earlier items, summarized)"]
        assert "tried a longer timeout" in brief.text and "## Pointers" in brief.text

    def test_budget_is_met_whenever_intent_and_constraints_fit(self) -> None:
        """For every budget from the required minimum upwards, the brief's estimate stays within it."""
        baton = full_baton(done=[f"d{i}" * 10 for i in range(30)])
        minimum = render_brief(baton, budget=1).tokens + 1  # + 1: the note names the budget, in more digits
        for budget in range(minimum, render_brief(baton, budget=100_000).tokens + 5, 7):
            brief = render_brief(baton, budget=budget)
            assert brief.tokens <= budget, budget


class TestWarnings:
    def test_missing_intent_and_constraints_are_flagged_in_the_brief(self) -> None:
        """A baton without intent or constraints gets a WARNING for each at the top of the brief."""
        brief = render_brief(full_baton(intent="", constraints=[]))
        assert len([w for w in brief.warnings if w.startswith(("no intent", "no constraints"))]) == 2
        head = brief.text[:brief.text.index("## Intent")]
        assert head.count("**WARNING:**") == 2

    def test_complete_baton_has_no_warnings(self) -> None:
        """Intent and constraints present, world unchanged: no warning at all."""
        brief = render_brief(full_baton())
        assert brief.warnings == []
        assert "WARNING" not in brief.text

    def test_superseded_epoch_is_warned(self) -> None:
        """A caller whose epoch is behind the baton's is told its writes will be refused."""
        brief = render_brief(full_baton(), epoch=2)
        assert any("epoch 2" in w and "refused" in w for w in brief.warnings)

    def test_cli_prints_warnings_on_stderr(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """`heartbeat brief` on a baton with no intent and no constraints warns twice on stderr, exits 0."""
        assert hb("new", "t1", "--task", "Do it", "--step", "first", "--workdir", str(tmp_path)).code == 0
        r = hb("brief", "t1")
        assert r.code == 0
        assert r.err.count("heartbeat: warning: t1:") == 2
        assert "no intent" in r.err and "no constraints" in r.err
        assert r.out.startswith("# Brief: t1 - Do it")

    def test_cli_no_warning_when_complete(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """With intent and a constraint, `heartbeat brief` writes nothing on stderr."""
        assert hb("new", "t1", "--task", "Do it", "--step", "first", "--intent", "Because.",
                  "--constraint", "Never force-push", "--workdir", str(tmp_path)).code == 0
        r = hb("brief", "t1")
        assert (r.code, r.err) == (0, "")


class TestChangedKeyFiles:
    @pytest.fixture
    def work(self, tmp_path: Path) -> Path:
        work = tmp_path / "work"
        work.mkdir()
        (work / "a.py").write_text("a = 1\n")
        (work / "b.py").write_text("b = 1\n")
        (work / "c.py").write_text("c = 1\n")
        return work

    def test_changed_and_deleted_files_are_marked_unchanged_are_not(
        self, hb: Callable[..., Result], work: Path
    ) -> None:
        """A modified and a deleted key file are marked CHANGED in the pointers; the untouched one is not."""
        assert hb("new", "t1", "--task", "T", "--step", "s", "--intent", "I", "--constraint", "C",
                  "--workdir", str(work), "--key-file", "a.py", "--key-file", "b.py", "--key-file", "c.py").code == 0
        (work / "a.py").write_text("a = 2\n")
        (work / "b.py").unlink()
        r = hb("brief", "t1", "--json")
        assert r.code == 0
        doc = json.loads(r.out)
        lines = {line.split("`")[1]: line for line in doc["text"].splitlines() if line.startswith("- `")}
        assert "CHANGED since the baton was written: modified" in lines["a.py"]
        assert "CHANGED since the baton was written: deleted" in lines["b.py"]
        assert "CHANGED" not in lines["c.py"]
        assert {c["key"]: c["change"] for c in doc["changed"]} == {"a.py": "modified", "b.py": "deleted"}
        assert any("verify" in w for w in doc["warnings"])

    def test_rewriting_the_note_refreshes_the_fingerprints(self, hb: Callable[..., Result], work: Path) -> None:
        """After a content write the world is re-recorded, so the brief no longer marks the file."""
        assert hb("new", "t1", "--task", "T", "--step", "s", "--workdir", str(work), "--key-file", "a.py").code == 0
        (work / "a.py").write_text("a = 2\n")
        assert "CHANGED" in hb("brief", "t1").out
        assert hb("add", "t1", "decisions", "checked a.py after the config change").code == 0
        assert "CHANGED" not in hb("brief", "t1").out

    def test_render_brief_compares_meta_world_with_the_disk(self, state_dir: Path, work: Path) -> None:
        """render_brief (the daemon's entry point) reads the key files afresh and compares with meta.world."""
        store = FileStore(str(state_dir))
        try:
            from heartbeat.tasks import verbs as tasks

            baton = tasks.new_task(store, "t1", task="T", step="s", workdir=str(work), key_files=["a.py"])
            assert "CHANGED" not in render_brief(baton).text
            os.utime(work / "a.py")  # a touch is not a change: content hashes
            assert "CHANGED" not in render_brief(baton).text
            (work / "a.py").write_text("different\n")
            assert "CHANGED since the baton was written: modified" in render_brief(baton).text
        finally:
            store.close()


class TestCli:
    def test_budget_flag_and_json(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """`brief --budget N --json` gives text, tokens within N, the omitted list and the warnings."""
        assert hb("new", "t1", "--task", "T", "--step", "s", "--intent", "Why", "--constraint", "Never X",
                  "--workdir", str(tmp_path), *[a for i in range(40) for a in ("--plan", f"plan step {i} " + "y" * 60)]
                  ).code == 0
        r = hb("brief", "t1", "--budget", "300", "--json")
        assert r.code == 0, r.err
        doc = json.loads(r.out)
        assert set(doc) == {"id", "text", "tokens", "budget", "warnings", "omitted", "changed"}
        assert doc["budget"] == 300 and doc["tokens"] <= 300
        assert any(o.startswith("plan") for o in doc["omitted"])
        assert "Never X" in doc["text"] and "Why" in doc["text"]

    def test_bad_budget_and_unknown_task(self, hb: Callable[..., Result]) -> None:
        """A non-positive budget is bad input (2); an unknown task is not found (1)."""
        assert hb("new", "t1", "--task", "T", "--step", "s").code == 0
        assert hb("brief", "t1", "--budget", "0").code == 2
        r = hb("brief", "nope")
        assert r.code == 1 and "nope" in r.err
