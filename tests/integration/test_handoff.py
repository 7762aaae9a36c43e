"""The handoff between tasks: upstream packages in the brief, guarantees at done and verify, the edge policy."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import Result

from heartbeat.config.shape import CommandConfig
from heartbeat.daemon.gates import GateEvaluator
from heartbeat.model.baton import Baton, Gate, GateKind, Guarantee, Meta, Status, dump_baton, parse_baton
from heartbeat.model.errors import EXIT_NOT_ACTIVE, EXIT_STALE, BadInput, GuaranteeFailed, InvalidBaton
from heartbeat.model.policy import Action, Observation, Policy, decide
from heartbeat.reports.brief import render_brief
from heartbeat.store.files import FileStore
from heartbeat.tasks import handoff
from heartbeat.tasks import verbs as tasks
from heartbeat.tasks.verify import verify


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    """The CLI in this process (``cli``, tests/conftest.py): these tests need no process of their own;
    the few that do take ``hb_process``."""
    return cli


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CHECKS = {
    "marker": CommandConfig("marker", ("test", "-f", "{workdir}/ok"), 10.0),
    "ok": CommandConfig("ok", ("true",), 10.0),
}


def write_config(root: Path, state: Path) -> Path:
    path = root / "heartbeat.toml"
    path.write_text(f"""\
[daemon]
state_dir = {json.dumps(str(state))}

[checks.marker]
command = ["test", "-f", "{{workdir}}/ok"]
timeout = "10s"
""")
    os.chmod(path, 0o600)
    return path


def make_upstream(store: FileStore, workdir: Path, task_id: str = "build", **kwargs: object) -> Baton:
    values: dict[str, object] = dict(task="Build the feature", step="write code", intent="ship the cache",
                                     workdir=str(workdir), constraints=["no network in tests"])
    values.update(kwargs)
    lists = {k: values.pop(k) for k in ("decisions", "rejected", "unknowns") if k in values}
    baton = tasks.new_task(store, task_id, **values)  # type: ignore[arg-type]
    for name, items in lists.items():
        if items:
            baton = tasks.add_items(store, task_id, name, items)  # type: ignore[arg-type]
    return baton


class TestBatonFields:
    def test_after_guarantees_rederived_on_broken_round_trip(self) -> None:
        """The handoff fields are written after the lists and read back equal, unknown guarantee keys kept."""
        baton = Baton(task="t", step="s", after=["build", "test"], rederived=["why the key changed"],
                      guarantees=[Guarantee("tests pass", "pytest", extra={"owner": "ana"}), Guarantee("no todo")],
                      on_broken="fallback:claude", meta=Meta(id="review"))
        text = dump_baton(baton)
        assert "[[guarantees]]" in text or "guarantees = [" in text
        assert parse_baton(text, path="x", expected_id="review") == baton

    def test_a_baton_without_them_is_written_as_before(self) -> None:
        """No empty ``after``, ``guarantees``, ``rederived`` or ``on_broken`` keys appear in an ordinary baton."""
        text = dump_baton(Baton(task="t", step="s", meta=Meta(id="x")))
        for key in ("after", "guarantees", "rederived", "on_broken"):
            assert f"\n{key} =" not in text and f"[[{key}]]" not in text

    @pytest.mark.parametrize(("snippet", "field"), [
        ('after = ["Bad Id"]', "after[0]"),
        ('after = ["x"]', "after[0]"),
        ('after = ["a", "a"]', "after[1]"),
        ('after = "a"', "after"),
        ('guarantees = ["text"]', "guarantees[0]"),
        ('guarantees = [{ check = "x" }]', "guarantees[0].text"),
        ('guarantees = [{ text = "t", check = "Not A Name" }]', "guarantees[0].check"),
        ('on_broken = "retry"', "on_broken"),
        ('on_broken = "fallback:"', "on_broken"),
        ('on_broken = "reopen:x"', "on_broken"),
    ])
    def test_bad_values_are_refused_naming_the_field(self, snippet: str, field: str) -> None:
        """Each malformed handoff field is refused with one line naming it."""
        with pytest.raises(InvalidBaton) as exc:
            parse_baton(f'task = "t"\nstep = "s"\n{snippet}\n[meta]\nid = "x"\n', path="x.toml")
        assert exc.value.field == field
        assert "\n" not in str(exc.value)

    def test_after_gate_parses_and_opens_when_every_upstream_is_done(self) -> None:
        """``after:A,B`` is a gate: closed while one upstream is unfinished, open when both are done."""
        gate = Gate.parse("after:a,b")
        assert gate.kind is GateKind.AFTER and gate.target == "a,b"
        with pytest.raises(BadInput):
            Gate.parse("after:a,Bad")
        ev = GateEvaluator({})
        try:
            statuses = {"a": Status.DONE, "b": Status.ACTIVE}
            assert not ev.is_open("c", gate, NOW, task_status=statuses.get)
            statuses["b"] = Status.DONE
            assert ev.is_open("c", gate, NOW, task_status=statuses.get)
        finally:
            ev.close()

    def test_an_active_task_with_an_unfinished_upstream_is_not_dispatched(self) -> None:
        """A hand-written ``after`` without a block still holds the task: the decision waits."""
        baton = Baton(task="t", step="s", after=["build"], meta=Meta(id="review"))
        d = decide(baton, Observation(upstream_pending=("build",)), NOW, Policy())
        assert d.action is Action.NOTHING and "build" in d.reason
        assert decide(baton, Observation(), NOW, Policy()).action is Action.DISPATCH


class TestPackage:
    def test_new_after_starts_blocked_on_the_after_gate(self, file_store: FileStore, tmp_path: Path) -> None:
        """``new --after`` holds the downstream: blocked, gate ``after:build``, ``after`` recorded."""
        make_upstream(file_store, tmp_path)
        review = tasks.new_task(file_store, "review", task="Review", step="read", after=["build"])
        assert review.status is Status.BLOCKED
        assert review.meta.gate == Gate(GateKind.AFTER, "build")
        assert review.after == ["build"]

    def test_done_freezes_the_package_and_names_what_was_missing(self, file_store: FileStore,
                                                                 tmp_path: Path) -> None:
        """``handed_off`` records every part of the package, key file fingerprints, and each empty part as missing."""
        (tmp_path / "cache.py").write_text("v1")
        make_upstream(file_store, tmp_path, key_files=["cache.py"])
        tasks.add_items(file_store, "build", "decisions", ["key by user id"])
        tasks.finish(file_store, "build", note="built", checks={})
        (event,) = file_store.ledger.events("build", kinds=["handed_off"])
        data = event.data
        assert data["decisions"] == ["key by user id"]
        assert data["constraints"] == [{"text": "no network in tests", "from": "build"}]
        assert data["key_files"]["cache.py"].startswith("sha256:")
        assert data["missing"] == ["rejected", "unknowns", "handoff", "guarantees"]

    def test_brief_carries_upstream_context_in_budget_order(self, file_store: FileStore, tmp_path: Path) -> None:
        """Own constraints, then inherited ones (newest upstream first) marked with their origin, then the packages."""
        make_upstream(file_store, tmp_path, guarantees=[Guarantee("cache hit rate > 90%", "ok")])
        tasks.add_items(file_store, "build", "decisions", ["key by user id"])
        tasks.finish(file_store, "build", checks=CHECKS)
        make_upstream(file_store, tmp_path, "test", constraints=["never mock the clock"])
        tasks.add_items(file_store, "test", "decisions", ["property tests for expiry"])
        tasks.finish(file_store, "test", checks=CHECKS)
        review = tasks.new_task(file_store, "review", task="Review", step="read", after=["build", "test"],
                                constraints=["be concrete"], intent="a second pair of eyes")
        packages = handoff.load_packages(file_store, review)
        assert [p["upstream"] for p in packages] == ["test", "build"]  # newest first
        text = render_brief(review, upstream=packages).text
        order = ["- **be concrete**", "- **never mock the clock** _(inherited from `test`)_",
                 "- **no network in tests** _(inherited from `build`)_", "## Upstream handoff: test",
                 "property tests for expiry", "## Upstream handoff: build", "cache hit rate > 90% [check: ok]",
                 "key by user id", "## Where things stand"]
        positions = [text.index(s) for s in order]
        assert positions == sorted(positions)

    def test_a_tight_budget_cuts_packages_never_inherited_constraints(self, file_store: FileStore,
                                                                       tmp_path: Path) -> None:
        """Within a small budget the older package goes before the newer; inherited constraints always stay."""
        make_upstream(file_store, tmp_path, constraints=["keep the old API"])
        tasks.add_items(file_store, "build", "decisions", [f"decision {i} " + "x" * 60 for i in range(20)])
        tasks.finish(file_store, "build", checks={})
        make_upstream(file_store, tmp_path, "test", constraints=["no sleeps"])
        tasks.add_items(file_store, "test", "decisions", ["newest decision"])
        tasks.finish(file_store, "test", checks={})
        review = tasks.new_task(file_store, "review", task="Review", step="read", after=["build", "test"])
        brief = render_brief(review, upstream=handoff.load_packages(file_store, review), budget=350)
        assert brief.tokens <= 350
        assert "keep the old API** _(inherited from `build`)_" in brief.text
        assert "no sleeps** _(inherited from `test`)_" in brief.text
        assert "newest decision" in brief.text
        assert "decision 19" not in brief.text
        assert any(o.startswith("upstream build decisions") for o in brief.omitted)

    def test_constraints_cross_two_boundaries_with_their_origin(self, file_store: FileStore,
                                                                tmp_path: Path) -> None:
        """spec -> build -> review: review's brief still carries spec's constraint, marked as spec's."""
        make_upstream(file_store, tmp_path, "spec", constraints=["GDPR: no personal data in logs"])
        tasks.finish(file_store, "spec", checks={})
        tasks.new_task(file_store, "build", task="Build", step="code", after=["spec"], constraints=["py3.11"])
        tasks.unblock(file_store, "build", by="test")
        tasks.finish(file_store, "build", checks={})
        review = tasks.new_task(file_store, "review", task="Review", step="read", after=["build"])
        text = render_brief(review, upstream=handoff.load_packages(file_store, review), budget=1).text
        assert "- **GDPR: no personal data in logs** _(inherited from `spec`)_" in text
        assert "- **py3.11** _(inherited from `build`)_" in text


class TestGuarantees:
    def test_done_with_a_failing_guarantee_is_refused_and_recorded(self, file_store: FileStore,
                                                                    tmp_path: Path) -> None:
        """The task stays active, a ``guarantee_failed`` event names the guarantee and the check's exit."""
        make_upstream(file_store, tmp_path, guarantees=[Guarantee("the marker exists", "marker")])
        with pytest.raises(GuaranteeFailed) as exc:
            tasks.finish(file_store, "build", checks=CHECKS)
        assert exc.value.exit_code == EXIT_NOT_ACTIVE
        assert "'the marker exists'" in str(exc.value) and "exit 1" in str(exc.value)
        assert file_store.load("build").status is Status.ACTIVE
        (event,) = file_store.ledger.events("build", kinds=["guarantee_failed"])
        assert event.data["failed"][0]["check"] == "marker" and event.data["failed"][0]["code"] == 1
        (tmp_path / "ok").write_text("")
        assert tasks.finish(file_store, "build", checks=CHECKS).status is Status.DONE

    def test_a_check_that_hangs_is_bounded_by_its_timeout(self, file_store: FileStore, tmp_path: Path) -> None:
        """A guarantee whose check never returns fails at the check's timeout, not never."""
        make_upstream(file_store, tmp_path, guarantees=[Guarantee("fast", "slow")])
        slow = {"slow": CommandConfig("slow", ("sleep", "30"), 0.3)}
        with pytest.raises(GuaranteeFailed, match="timed out"):
            tasks.finish(file_store, "build", checks=slow)

    def test_cli_done_refuses_with_exit_4_and_one_line(self, hb: Callable[..., Result], state_dir: Path,
                                                       tmp_path: Path) -> None:
        """``heartbeat done`` runs the check from the config in the workdir: exit 4, one line, the task unfinished."""
        write_config(tmp_path, state_dir)
        assert hb("new", "build", "--task", "b", "--step", "s", "--workdir", str(tmp_path),
                  "--guarantee", "marker present::marker").code == 0
        assert hb("add", "build", "guarantees", "docs updated").code == 0
        r = hb("done", "build")
        assert r.code == EXIT_NOT_ACTIVE, r.err
        assert r.err.count("\n") == 1 and "marker present" in r.err and "exit 1" in r.err
        shown = json.loads(hb("show", "build", "--json").out)
        assert shown["meta"]["status"] == "active"
        assert shown["guarantees"] == [{"text": "marker present", "check": "marker"}, {"text": "docs updated"}]
        assert "guarantee_failed" in hb("log", "build").out
        (tmp_path / "ok").write_text("")
        assert hb("done", "build").code == 0

    def test_add_guarantees_with_check(self, hb: Callable[..., Result]) -> None:
        """``add ID guarantees TEXT --check NAME`` appends a checked guarantee; a bad check name is exit 2."""
        assert hb("new", "b", "--task", "b", "--step", "s").code == 0
        assert hb("add", "b", "guarantees", "tests pass", "--check", "pytest").code == 0
        assert json.loads(hb("show", "b", "--json").out)["guarantees"] == [{"text": "tests pass", "check": "pytest"}]
        assert hb("add", "b", "guarantees", "x", "--check", "Bad Name").code == 2
        assert hb("add", "b", "decisions", "x", "--check", "pytest").code == 2


class TestDownstreamVerify:
    def _pipeline(self, store: FileStore, root: Path, on_broken: str = "") -> None:
        (root / "ok").write_text("")
        make_upstream(store, root, guarantees=[Guarantee("the marker exists", "marker")])
        tasks.finish(store, "build", checks=CHECKS)
        tasks.new_task(store, "review", task="Review", step="read", after=["build"], on_broken=on_broken)
        tasks.unblock(store, "review", by="gate:after:build")

    def test_fresh_when_the_upstream_guarantee_holds(self, file_store: FileStore, tmp_path: Path) -> None:
        """A consumer whose upstream still keeps its promise verifies fresh."""
        self._pipeline(file_store, tmp_path)
        assert verify(file_store, "review", checks=CHECKS).code == 0

    def test_broken_guarantee_reopens_the_upstream_by_default(self, file_store: FileStore, tmp_path: Path) -> None:
        """Someone breaks the promise: verify says broken (exit 3), the upstream is active again, the consumer waits."""
        self._pipeline(file_store, tmp_path)
        (tmp_path / "ok").unlink()
        result = verify(file_store, "review", checks=CHECKS)
        assert (result.code, result.status) == (EXIT_STALE, "broken")
        assert result.broken[0]["upstream"] == "build" and result.broken[0]["guarantee"] == "the marker exists"
        build = file_store.load("build")
        assert build.status is Status.ACTIVE
        assert "the marker exists" in build.meta.last_failure and "review" in build.meta.last_failure
        review = file_store.load("review")
        assert review.status is Status.BLOCKED and review.meta.gate == Gate(GateKind.AFTER, "build")
        assert [e.data["by"] for e in file_store.ledger.events("build", kinds=["reopened"])] == ["review"]
        assert file_store.ledger.events("review", kinds=["guarantee_broken"])

    def test_escalate_policy_escalates_the_upstream(self, file_store: FileStore, tmp_path: Path) -> None:
        """``on_broken = "escalate"``: the upstream goes to a human instead of back to work."""
        self._pipeline(file_store, tmp_path, on_broken="escalate")
        (tmp_path / "ok").unlink()
        assert verify(file_store, "review", checks=CHECKS).status == "broken"
        assert file_store.load("build").status is Status.ESCALATED

    def test_fallback_policy_reopens_on_another_launcher(self, file_store: FileStore, tmp_path: Path) -> None:
        """``on_broken = "fallback:codex"``: the upstream is active again with launcher codex."""
        self._pipeline(file_store, tmp_path, on_broken="fallback:codex")
        (tmp_path / "ok").unlink()
        verify(file_store, "review", checks=CHECKS)
        build = file_store.load("build")
        assert (build.status, build.launcher) == (Status.ACTIVE, "codex")

    def test_changed_upstream_key_file_reads_stale(self, file_store: FileStore, tmp_path: Path) -> None:
        """A key file changed since the upstream finished is listed like a stale file, exit 3, nothing reopened."""
        (tmp_path / "cache.py").write_text("v1")
        make_upstream(file_store, tmp_path, key_files=["cache.py"])
        tasks.finish(file_store, "build", checks={})
        tasks.new_task(file_store, "review", task="Review", step="read", after=["build"])
        tasks.unblock(file_store, "review", by="me")
        (tmp_path / "cache.py").write_text("v2")
        result = verify(file_store, "review", checks={})
        assert (result.code, result.status) == (EXIT_STALE, "stale")
        assert result.changed[0]["key"] == "upstream:build:cache.py"
        assert file_store.load("build").status is Status.DONE

    def test_a_check_missing_from_the_config_never_reopens(self, file_store: FileStore, tmp_path: Path) -> None:
        """A consumer without the upstream's check reports it unchecked: not broken, nothing reopened."""
        self._pipeline(file_store, tmp_path)
        (tmp_path / "ok").unlink()
        result = verify(file_store, "review", checks={})
        assert result.code == 0 and result.unchecked
        assert file_store.load("build").status is Status.DONE

    def test_cli_verify_says_broken_and_exits_3(self, hb: Callable[..., Result], state_dir: Path,
                                                tmp_path: Path) -> None:
        """The real CLI: verify prints broken, the guarantee and the policy's action, exit 3."""
        write_config(tmp_path, state_dir)
        (tmp_path / "ok").write_text("")
        assert hb("new", "build", "--task", "b", "--step", "s", "--workdir", str(tmp_path),
                  "--guarantee", "the marker exists::marker").code == 0
        assert hb("done", "build").code == 0
        assert hb("new", "review", "--task", "r", "--step", "s", "--after", "build").code == 0
        assert hb("unblock", "review", "--by", "me").code == 0
        assert hb("verify", "review").code == 0
        (tmp_path / "ok").unlink()
        r = hb("verify", "review")
        assert r.code == 3
        assert r.out.startswith("broken:") and "the marker exists" in r.out and "build reopened" in r.out
        assert json.loads(hb("show", "build", "--json").out)["meta"]["status"] == "active"

    def test_new_after_an_unknown_task_is_refused(self, hb: Callable[..., Result]) -> None:
        """A typo in ``--after`` would hold the task forever: exit 2 naming it."""
        r = hb("new", "review", "--task", "r", "--step", "s", "--after", "biuld")
        assert r.code == 2 and "biuld" in r.err


FULL = dict(intent="ship the cache", constraints=["no network in tests"], decisions=["key by user id"],
            rejected=["memcached: one more service"], unknowns=["eviction under load"], handoff="/notes/cache.md",
            key_files=["cache.py"])


class TestEdgeReport:
    """``report --edges`` counts exactly the induced failures; one scenario per metric."""

    def _edge(self, store: FileStore, root: Path, *, upstream: dict[str, object] | None = None,
              on_broken: str = "", progress: bool = True) -> None:
        (root / "cache.py").write_text("v1")
        (root / "ok").write_text("")
        values = dict(FULL, guarantees=[Guarantee("the marker exists", "marker")])
        values.update(upstream or {})
        make_upstream(store, root, **values)
        tasks.finish(store, "build", checks=CHECKS)
        tasks.new_task(store, "review", task="Review", step="read the diff", after=["build"], on_broken=on_broken)
        tasks.unblock(store, "review", by="gate:after:build")
        if progress:
            tasks.set_fields(store, "review", {"step": "comment"})

    def _report(self, hb: Callable[..., Result]) -> dict[str, object]:
        r = hb("report", "--edges", "--json")
        assert r.code == 0, r.err
        return dict(json.loads(r.out))

    def test_a_clean_pipeline_reports_zero(self, file_store: FileStore, hb: Callable[..., Result],
                                           tmp_path: Path) -> None:
        """A full package, no re-derivation, guarantees kept: one handoff and nothing else."""
        self._edge(file_store, tmp_path)
        assert verify(file_store, "review", checks=CHECKS).code == 0
        report = self._report(hb)
        (edge,) = report["edges"]  # type: ignore[misc]
        assert list(edge) == ["upstream", "downstream", "handoffs", "missing", "missing_parts", "rederived",
                              "guarantee_failed", "broken", "reopens", "time_to_progress_s", "asked", "answered",
                              "escalated", "time_to_answer_s", "role", "needs"]
        assert edge["role"] == "build->review" and edge["needs"] == []
        assert {k: edge[k] for k in ("upstream", "downstream", "handoffs", "missing", "missing_parts", "rederived",
                                     "guarantee_failed", "broken", "reopens")} == {
            "upstream": "build", "downstream": "review", "handoffs": 1, "missing": 0, "missing_parts": [],
            "rederived": 0, "guarantee_failed": 0, "broken": 0, "reopens": 0}
        assert edge["time_to_progress_s"] >= 0
        (pair,) = report["pairs"]  # type: ignore[misc]
        assert pair["upstream_launcher"] == pair["downstream_launcher"] == "default" and pair["edges"] == 1
        assert pair["broken"] == pair["missing"] == 0

    def test_missing_parts_are_counted(self, file_store: FileStore, hb: Callable[..., Result],
                                       tmp_path: Path) -> None:
        """An upstream that recorded no decisions and no unknowns: one package with those two parts missing."""
        self._edge(file_store, tmp_path, upstream={"decisions": [], "unknowns": []})
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert (edge["missing"], edge["missing_parts"]) == (1, ["decisions", "unknowns"])
        assert edge["broken"] == edge["reopens"] == edge["rederived"] == 0

    def test_rederived_items_are_counted(self, file_store: FileStore, hb: Callable[..., Result],
                                         tmp_path: Path) -> None:
        """Two items the downstream had to re-derive, in two calls: rederived is 2."""
        self._edge(file_store, tmp_path)
        assert hb("add", "review", "rederived", "why the cache key changed").code == 0
        assert hb("add", "review", "rederived", "which tests are flaky").code == 0
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert (edge["rederived"], edge["missing"], edge["broken"], edge["reopens"]) == (2, 0, 0, 0)

    def test_broken_and_reopened(self, file_store: FileStore, hb: Callable[..., Result], tmp_path: Path) -> None:
        """A broken guarantee under the default policy: broken 1, reopens 1; the second done is a second handoff."""
        self._edge(file_store, tmp_path)
        (tmp_path / "ok").unlink()
        assert verify(file_store, "review", checks=CHECKS).status == "broken"
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert (edge["broken"], edge["reopens"], edge["handoffs"]) == (1, 1, 1)
        (tmp_path / "ok").write_text("")
        tasks.finish(file_store, "build", checks=CHECKS)
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert (edge["broken"], edge["reopens"], edge["handoffs"]) == (1, 1, 2)

    def test_escalate_counts_broken_not_reopens(self, file_store: FileStore, hb: Callable[..., Result],
                                                tmp_path: Path) -> None:
        """Under ``escalate`` the boundary broke but nothing was sent back to work: broken 1, reopens 0."""
        self._edge(file_store, tmp_path, on_broken="escalate")
        (tmp_path / "ok").unlink()
        verify(file_store, "review", checks=CHECKS)
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert (edge["broken"], edge["reopens"]) == (1, 0)

    def test_time_to_progress_waits_for_the_downstream(self, file_store: FileStore, hb: Callable[..., Result],
                                                       tmp_path: Path) -> None:
        """No progress yet: null; after the downstream's first step change: the seconds since the upstream's done."""
        self._edge(file_store, tmp_path, progress=False)
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert edge["time_to_progress_s"] is None
        tasks.set_fields(file_store, "review", {"step": "comment"})
        (edge,) = self._report(hb)["edges"]  # type: ignore[misc]
        assert edge["time_to_progress_s"] is not None and edge["time_to_progress_s"] >= 0

    def test_worst_first_and_text(self, file_store: FileStore, hb: Callable[..., Result], tmp_path: Path) -> None:
        """A broken edge sorts before a clean one; the text table names both."""
        self._edge(file_store, tmp_path)
        tasks.new_task(file_store, "docs", task="Docs", step="write", after=["build"])
        tasks.unblock(file_store, "docs", by="me")
        (tmp_path / "ok").unlink()
        verify(file_store, "review", checks=CHECKS)
        edges = self._report(hb)["edges"]
        assert [e["downstream"] for e in edges] == ["review", "docs"]  # type: ignore[attr-defined]
        text = hb("report", "--edges").out
        assert "build -> review" in text and "build -> docs" in text
        assert text.index("build -> review") < text.index("build -> docs")


class TestMessages:
    """What heartbeat says about guarantees, finished tasks, reopened upstreams and next steps is exact."""

    def test_done_names_every_failed_guarantee_with_what_happened(self, file_store: FileStore,
                                                                   tmp_path: Path) -> None:
        """Three checked guarantees fail three ways: the refusal names each, with its exit, its timeout and
        the missing check (on c684e38: the first one "(and 2 more)", the timeout and missing check hidden)."""
        make_upstream(file_store, tmp_path, guarantees=[Guarantee("the marker exists", "marker"),
                                                        Guarantee("fast enough", "slow"),
                                                        Guarantee("docs build", "nosuch")])
        checks = {**CHECKS, "slow": CommandConfig("slow", ("sleep", "30"), 0.3)}
        with pytest.raises(GuaranteeFailed) as exc:
            tasks.finish(file_store, "build", checks=checks)
        message = str(exc.value)
        assert "\n" not in message and "more" not in message and "3 guarantees failed" in message
        for text, detail in (("'the marker exists'", "exit 1"), ("'fast enough'", "timed out after 0.3s"),
                             ("'docs build'", "no [checks.nosuch] in the config")):
            assert text in message and detail in message, message

    def test_verify_on_a_finished_task_does_not_say_blocked(self, file_store: FileStore, tmp_path: Path) -> None:
        """A done task verifies as not active (exit 4), not as "blocked: ... is done" (c684e38)."""
        make_upstream(file_store, tmp_path)
        tasks.finish(file_store, "build", checks=CHECKS)
        result = verify(file_store, "build", checks=CHECKS)
        assert result.code == EXIT_NOT_ACTIVE and result.status == "not_active"
        assert "blocked" not in result.render_text() and "build is done, not active" in result.render_text()

    def test_a_reopened_upstream_is_dispatched_for_the_broken_guarantee(self, file_store: FileStore,
                                                                       tmp_path: Path) -> None:
        """An upstream whose last agent ended cleanly, sent back by its consumer's verify: the dispatch's
        reason names the reopening and the guarantee, not "the previous agent ended its shift" (c684e38)."""
        (tmp_path / "ok").write_text("")
        make_upstream(file_store, tmp_path, guarantees=[Guarantee("the marker exists", "marker")])
        with file_store.edit("build", actor="daemon") as ed:  # an agent ran and ended its shift cleanly
            ed.baton.meta.dispatches, ed.baton.meta.epoch, ed.baton.meta.last_exit = 1, 1, 0
        tasks.finish(file_store, "build", checks=CHECKS)
        tasks.new_task(file_store, "review", task="Review", step="read", after=["build"])
        tasks.unblock(file_store, "review", by="gate:after:build")
        (tmp_path / "ok").unlink()
        assert verify(file_store, "review", checks=CHECKS).status == "broken"
        d = decide(file_store.load("build"), Observation(), NOW, Policy())
        assert d.action is Action.DISPATCH and "ended its shift" not in d.reason
        assert d.reason.startswith("reopened by review") and "the marker exists" in d.reason

    @pytest.mark.parametrize(("step", "next_step", "plan", "shown"), [
        ("write tests", "write tests", ["write code", "write tests", "ship"], "ship _(from the plan)_"),
        ("write tests", "write tests", [], "_(not recorded)_"),
        ("ship", "ship", ["write code", "ship"], "_(not recorded)_"),
        ("write code", "write tests", ["write code", "write tests"], "write tests"),
    ])
    def test_the_brief_never_shows_the_current_step_as_next(self, step: str, next_step: str, plan: list[str],
                                                            shown: str) -> None:
        """A ``next_step`` left behind when the step moved on is not shown as the next step: the plan's next
        one is, or "not recorded" (on c684e38 the brief said "Next step: write tests" on step write tests)."""
        baton = Baton(task="t", step=step, next_step=next_step, plan=plan, meta=Meta(id="t"))
        text = render_brief(baton, now=NOW).text
        assert f"- Next step: {shown}\n" in text, text
