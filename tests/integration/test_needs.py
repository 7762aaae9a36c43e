"""Needs per edge through the CLI (the ``cli`` fixture, file store): declared by the downstream,
learned from the profile across pipeline runs, pinned and dropped by a person; the upstream's
``done`` refused while one is unmet, ``--force`` a person's only; shown in the brief, ``show``,
``report --edges`` and ``heartbeat needs``."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Result

PIPELINE = """
[stages.build]
task = "Build the cache"
intent = "p95 under 200 ms"
constraints = ["no new services"]

[stages.review]
task = "Review the cache"
after = ["build"]
{needs}
"""


@pytest.fixture
def hb(cli: Callable[..., Result]) -> Callable[..., Result]:
    return cli


def ok(result: Result) -> Result:
    assert result.code == 0, result.err
    return result


def _events(hb: Callable[..., Result], task: str, kind: str) -> list[dict[str, object]]:
    log = json.loads(ok(hb("log", task, "--json")).out)
    rows = log["events"] if isinstance(log, dict) else log
    return [e for e in rows if e["kind"] == kind]


def _pipeline(hb: Callable[..., Result], tmp_path: Path, name: str, needs: str = "") -> None:
    path = tmp_path / f"{name}.toml"
    path.write_text(PIPELINE.format(needs=needs))
    ok(hb("pipeline", "new", name, "--from", str(path)))


def _up_and_down(hb: Callable[..., Result], *needs: str) -> None:
    ok(hb("new", "up", "--task", "Build", "--step", "build", "--intent", "why"))
    ok(hb("new", "down", "--task", "Review", "--step", "review", "--after", "up", *needs))


class TestDeclared:
    def test_a_declared_need_refuses_the_upstreams_done_until_met(self, hb: Callable[..., Result]) -> None:
        """`--needs rejected` on the downstream: the upstream's done is exit 4, one line naming the part, the
        downstream and the command; a needs_unmet event; once the part is filled, done goes through."""
        _up_and_down(hb, "--needs", "rejected,decisions")
        refused = hb("done", "up")
        assert refused.code == 4
        assert refused.err.count("\n") == 1
        assert "down needs `decisions` (declared)" in refused.err and "down needs `rejected` (declared)" in refused.err
        assert 'heartbeat add up rejected "..."' in refused.err
        assert json.loads(ok(hb("show", "up", "--json")).out)["meta"]["status"] == "active"
        unmet = _events(hb, "up", "needs_unmet")
        assert [u["part"] for u in unmet[0]["data"]["unmet"]] == ["decisions", "rejected"]
        ok(hb("add", "up", "rejected", "Redis: a new service"))
        assert "rejected" not in hb("done", "up").err  # still decisions
        ok(hb("add", "up", "decisions", "an in-process LRU"))
        ok(hb("done", "up"))
        assert json.loads(ok(hb("show", "up", "--json")).out)["meta"]["status"] == "done"

    def test_an_unknown_part_is_refused_naming_the_valid_ones(self, hb: Callable[..., Result]) -> None:
        """`--needs reasons` is exit 2, one line with every valid part; nothing is created."""
        ok(hb("new", "up", "--task", "Build", "--step", "build"))
        result = hb("new", "down", "--task", "Review", "--step", "r", "--after", "up", "--needs", "reasons")
        assert result.code == 2 and "'reasons'" in result.err and "key_files" in result.err
        assert hb("show", "down").code != 0
        assert hb("new", "lone", "--task", "t", "--step", "s", "--needs", "rejected").code == 2

    def test_needs_are_stored_only_when_set(self, hb: Callable[..., Result], state_dir: Path) -> None:
        """The downstream's baton holds `needs = [...]`; a baton without needs has no such key."""
        _up_and_down(hb, "--needs", "rejected")
        assert tomllib.loads((state_dir / "batons" / "down.toml").read_text())["needs"] == ["rejected"]
        assert "needs" not in tomllib.loads((state_dir / "batons" / "up.toml").read_text())
        ok(hb("add", "down", "needs", "key_files"))
        assert json.loads(ok(hb("show", "down", "--json")).out)["needs"] == ["rejected", "key_files"]
        assert hb("add", "up", "needs", "rejected").code == 2  # up has no upstream

    def test_a_pipeline_stage_declares_needs(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """`needs = [...]` in a stage; a bad part refuses the whole file, naming the stage."""
        _pipeline(hb, tmp_path, "p1", 'needs = ["decisions"]')
        assert json.loads(ok(hb("show", "p1.review", "--json")).out)["needs"] == ["decisions"]
        assert hb("done", "p1.build").code == 4
        bad = tmp_path / "bad.toml"
        bad.write_text(PIPELINE.format(needs='needs = ["why"]'))
        result = hb("pipeline", "new", "p2", "--from", str(bad))
        assert result.code == 2 and "stages.review.needs" in result.err
        assert hb("show", "p2.build").code != 0

    def test_the_upstreams_brief_and_show_say_what_is_needed(self, hb: Callable[..., Result]) -> None:
        """Up front, with where it came from and the command that fills it while it is empty."""
        _up_and_down(hb, "--needs", "rejected")
        brief = ok(hb("brief", "up")).out
        section = brief.index("## What your downstreams need")
        assert section < brief.index("## Where things stand")
        assert "`down` needs `rejected` (declared) - **EMPTY: fill it with" in brief
        shown = ok(hb("show", "up")).out
        assert shown.startswith("# What the downstreams need")
        assert json.loads(ok(hb("show", "up", "--json")).out)["downstream_needs"][0]["downstream"] == "down"
        ok(hb("add", "up", "rejected", "Redis"))
        assert "EMPTY" not in ok(hb("brief", "up")).out


class TestForce:
    def test_a_persons_force_is_recorded(self, hb: Callable[..., Result]) -> None:
        """`done --force` finishes and a done_forced event names what was unmet and who forced it."""
        _up_and_down(hb, "--needs", "rejected")
        ok(hb("done", "up", "--force"))
        forced = _events(hb, "up", "done_forced")
        assert len(forced) == 1 and forced[0]["data"]["unmet"][0]["part"] == "rejected"
        assert forced[0]["data"]["by"] and forced[0]["actor"] == forced[0]["data"]["by"]

    def test_an_agent_the_daemon_launched_may_not_force(self, hb: Callable[..., Result]) -> None:
        """With HEARTBEAT_TASK and HEARTBEAT_EPOCH set: one line, exit 2, the task still active."""
        _up_and_down(hb, "--needs", "rejected")
        env = {"HEARTBEAT_TASK": "up", "HEARTBEAT_EPOCH": "0"}
        result = hb("done", "up", "--force", env=env)
        assert result.code == 2 and "an agent cannot `done --force`" in result.err
        assert result.err.count("\n") == 1
        assert json.loads(ok(hb("show", "up", "--json")).out)["meta"]["status"] == "active"
        assert _events(hb, "up", "done_forced") == []
        dropped = hb("needs", "down", "--drop", "rejected", env=env)  # nor step around it by dropping it
        assert dropped.code == 2 and "an agent cannot pin or drop a need" in dropped.err
        assert _events(hb, "down", "need_dropped") == []
        assert hb("done", "up", env=env).code == 4


class TestLearned:
    def _run(self, hb: Callable[..., Result], tmp_path: Path, name: str, rederived: str = "") -> None:
        _pipeline(hb, tmp_path, name)
        ok(hb("done", f"{name}.build"))
        if rederived:
            ok(hb("add", f"{name}.review", "rederived", rederived))

    def test_a_part_rederived_in_two_runs_is_required_of_the_next(self, hb: Callable[..., Result],
                                                                  tmp_path: Path) -> None:
        """Two pipeline runs' reviews re-derive `rejected`: a need_learned event with its evidence, and
        the third run's build is refused until it packages `rejected`."""
        self._run(hb, tmp_path, "p1", "rejected: build had tried Redis")
        assert _events(hb, "p1.review", "need_learned") == []
        self._run(hb, tmp_path, "p2", "rejected: Redis again")
        learned = _events(hb, "p2.review", "need_learned")
        assert len(learned) == 1
        assert learned[0]["data"]["role"] == "*.build->*.review"
        assert learned[0]["data"]["evidence"] == "review re-derived `rejected` in 2 of the last 2 handoffs"
        _pipeline(hb, tmp_path, "p3")
        refused = hb("done", "p3.build")
        assert refused.code == 4 and "p3.review needs `rejected` (learned: review re-derived" in refused.err
        assert "review re-derived `rejected` in 2 of the last 2 handoffs" in ok(hb("brief", "p3.build")).out
        listed = ok(hb("needs", "p3.review")).out
        assert "needs rejected (learned: review re-derived `rejected`" in listed
        edges = json.loads(ok(hb("report", "--edges", "--json")).out)["edges"]
        p3 = next(e for e in edges if e["downstream"] == "p3.review")
        assert p3["role"] == "*.build->*.review" and p3["needs"][0]["source"] == "learned"
        assert "`rejected` (learned: review re-derived" in ok(hb("report", "--edges")).out

    def test_one_loss_teaches_nothing_and_an_unprefixed_item_no_part(self, hb: Callable[..., Result],
                                                                      tmp_path: Path) -> None:
        """A single re-derived part, or items naming no part, leave the next run free."""
        self._run(hb, tmp_path, "p1", "rejected: once")
        self._run(hb, tmp_path, "p2", "re-read the whole diff")
        _pipeline(hb, tmp_path, "p3")
        ok(hb("done", "p3.build"))

    def test_learning_off_and_the_knobs(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """`[handoff] learn = false` learns nothing; `learn_after = 1` learns from one loss; a knob past
        its window is refused by check-config in one line."""
        config = tmp_path / "heartbeat.toml"
        config.write_text("[handoff]\nlearn = false\n")
        env = {"HEARTBEAT_CONFIG": str(config)}
        for name in ("p1", "p2"):
            _pipeline(hb, tmp_path, name)
            ok(hb("done", f"{name}.build", env=env))
            ok(hb("add", f"{name}.review", "rederived", "rejected: again", env=env))
        assert _events(hb, "p2.review", "need_learned") == []
        config.write_text("[handoff]\nlearn_after = 1\nlearn_window = 1\n")
        _pipeline(hb, tmp_path, "p3")
        ok(hb("done", "p3.build", env=env))
        ok(hb("add", "p3.review", "rederived", "decisions: which TTL", env=env))
        assert _events(hb, "p3.review", "need_learned")[0]["data"]["part"] == "decisions"
        config.write_text("[handoff]\nlearn_after = 4\nlearn_window = 3\n")
        bad = hb("check-config", "--config", str(config))
        assert bad.code == 2 and "handoff.learn_after" in bad.err
        for text, key in (('learn = "yes"', "handoff.learn"), ('learn_from = "missing"', "handoff.learn_from"),
                          ("learn_window = 0", "handoff.learn_window")):
            config.write_text(f"[handoff]\n{text}\n")
            bad = hb("check-config", "--config", str(config))
            assert bad.code == 2 and key in bad.err and bad.err.count("\n") == 1, bad.err

    def test_learning_from_missing_parts(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """With `learn_from = "rederived+missing"` a part empty in two handoffs is required."""
        config = tmp_path / "heartbeat.toml"
        config.write_text('[handoff]\nlearn_from = "rederived+missing"\n')
        env = {"HEARTBEAT_CONFIG": str(config)}
        for name in ("p1", "p2"):
            _pipeline(hb, tmp_path, name)
            ok(hb("done", f"{name}.build", env=env))
        learned = {e["data"]["part"] for e in _events(hb, "p2.review", "need_learned")}
        assert {"decisions", "rejected", "unknowns"} <= learned
        assert "intent" not in learned and "constraints" not in learned

    def test_pin_and_drop(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """A person pins and drops: need_pinned/need_dropped events by them; a drop outranks a learned need
        and the evidence it was dropped against does not bring it back."""
        self._run(hb, tmp_path, "p1", "rejected: a")
        self._run(hb, tmp_path, "p2", "rejected: b")
        _pipeline(hb, tmp_path, "p3")
        out = ok(hb("needs", "p3.review", "--drop", "rejected", "--pin", "key_files", "--by", "ann")).out
        assert "key_files (pinned: pinned by ann)" in out and "rejected" not in out
        assert _events(hb, "p3.review", "need_dropped")[0]["actor"] == "ann"
        refused = hb("done", "p3.build")
        assert refused.code == 4 and "`key_files` (pinned" in refused.err and "rejected" not in refused.err
        ok(hb("add", "p3.build", "key_files", "cache.py"))
        ok(hb("done", "p3.build"))
        assert _events(hb, "p3.review", "need_learned") == []
        both = hb("needs", "p3.review", "--pin", "rejected", "--drop", "rejected")
        assert both.code == 2 and "both pinned and dropped" in both.err
        assert hb("needs", "p3.review", "--pin", "nonsense").code == 2


class TestWhichConfig:
    def test_a_relayed_rederived_learns_with_the_agents_config(self, tmp_path: Path, file_store: object) -> None:
        """The daemon's relay runs an agent's `add ID rederived` with the agent's HEARTBEAT_CONFIG, not the
        daemon's own search: `learn = false` there learns nothing (it learned with the defaults before)."""
        from heartbeat.store.files import FileStore
        from heartbeat.tasks import verbs
        from heartbeat.tasks.write import Write, answer

        assert isinstance(file_store, FileStore)
        config = tmp_path / "agent.toml"
        config.write_text("[handoff]\nlearn = false\n")
        for run in ("p1", "p2"):
            verbs.new_task(file_store, f"{run}.build", task="Build", step="b", intent="why")
            verbs.new_task(file_store, f"{run}.review", task="Review", step="r", after=[f"{run}.build"])
            verbs.finish(file_store, f"{run}.build", checks={})
            code, message, _ = answer(file_store, Write("add", f"{run}.review", field="rederived",
                                                        values=("rejected: again",)),
                                      {"HEARTBEAT_CONFIG": str(config)})
            assert code == 0, message
        assert file_store.ledger.events(kinds=["need_learned"]) == []

    def test_add_with_config_reads_its_knobs(self, hb: Callable[..., Result], tmp_path: Path,
                                             state_dir: Path) -> None:
        """`heartbeat --config FILE add ... rederived` learns with FILE's [handoff] (learn_after = 1)."""
        config = tmp_path / "one.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state_dir}"\n[handoff]\nlearn_after = 1\nlearn_window = 1\n')
        _pipeline(hb, tmp_path, "p1")
        ok(hb("done", "p1.build"))
        ok(hb("--config", str(config), "add", "p1.review", "rederived", "unknowns: the flaky test"))
        assert _events(hb, "p1.review", "need_learned")[0]["data"]["part"] == "unknowns"


class TestTheDaemonsBrief:
    def test_the_dispatch_brief_says_what_the_downstream_needs(self, tmp_path: Path) -> None:
        """An in-process daemon ticked once (a null launcher): the brief it writes for the upstream's
        dispatch has the needs section, found from its own pass (the downstream is held by a person's
        gate, so no pass looks at it as waiting on the upstream)."""
        from daemon_harness import in_process_config

        from heartbeat.daemon import Daemon
        from heartbeat.store.files import FileStore
        from heartbeat.system.layout import StateLayout
        from heartbeat.tasks import verbs

        state, config = in_process_config(tmp_path)
        store = FileStore(str(state))
        verbs.new_task(store, "up", task="Build", step="build", intent="why", workdir=str(tmp_path))
        verbs.new_task(store, "down", task="Review", step="review", after=["up"], needs=["rejected"],
                       blocked_on="a person first", workdir=str(tmp_path))
        d = Daemon(config, store=store)
        try:
            d.tick()
            baton = store.load("up")
            assert baton.meta.epoch == 1
            brief = Path(StateLayout(str(state)).brief("up", 1)).read_text()
        finally:
            d.shutdown()
            store.close()
        assert "## What your downstreams need" in brief
        assert "`down` needs `rejected` (declared) - **EMPTY" in brief


class TestAPipelineIsWrittenDownstreamsFirst:
    def test_every_stage_exists_before_a_stage_it_comes_after(self, tmp_path: Path) -> None:
        """``pipeline new`` writes a stage's downstreams before the stage: once the first stage can be
        dispatched, the daemon's first brief of it finds every downstream's needs. Written in file
        order (build first), the daemon could dispatch build in the pass between the two creates and
        brief it without review's needs (seen by scripts/bench_learning.py: 7 of 9 briefs)."""
        from heartbeat.store.files import FileStore
        from heartbeat.tasks.pipeline import create_pipeline, parse_pipeline

        spec = tmp_path / "p.toml"
        spec.write_text('[stages.build]\ntask = "Build"\n\n[stages.review]\ntask = "Review"\nafter = ["build"]\n'
                        'needs = ["rejected"]\n\n[stages.ship]\ntask = "Ship"\nafter = ["review", "build"]\n')
        store = FileStore(str(tmp_path / "state"))
        try:
            stages = parse_pipeline("p", spec.read_text(), base_dir=str(tmp_path))
            assert create_pipeline(store, "p", stages, workdir=str(tmp_path)) == ["p.build", "p.review", "p.ship"]
            first = {t: store.ledger.events(t)[0].id for t in ("p.build", "p.review", "p.ship")}
        finally:
            store.close()
        assert first["p.ship"] < first["p.review"] < first["p.build"], first

    def test_an_upstream_not_yet_written_is_not_reported_missing_at_once(self, tmp_path: Path) -> None:
        """A downstream written a moment before its upstream is held without an ``upstream_missing``
        event for ``UPSTREAM_MISSING_GRACE``; an upstream still missing after it is reported."""
        from datetime import timedelta

        from daemon_harness import in_process_config

        from heartbeat.daemon import Daemon
        from heartbeat.model import defaults
        from heartbeat.model.baton import Baton
        from heartbeat.model.ledger import EventKind
        from heartbeat.store.files import FileStore

        state, config = in_process_config(tmp_path)
        store = FileStore(str(state))
        baton = Baton(task="Review", step="review", after=["ghost"], workdir=str(tmp_path))
        baton.meta.id = "down"
        created = store.create(baton).meta.created_at
        assert created is not None
        d = Daemon(config, store=store)
        try:
            d.tick(now=created + timedelta(seconds=defaults.UPSTREAM_MISSING_GRACE / 2))
            assert not store.ledger.events("down", kinds=[EventKind.UPSTREAM_MISSING])
            d.tick(now=created + timedelta(seconds=defaults.UPSTREAM_MISSING_GRACE + 1))
            (event,) = store.ledger.events("down", kinds=[EventKind.UPSTREAM_MISSING])
            assert event.data["upstreams"] == ["ghost"]
            assert store.load("down").meta.dispatches == 0
        finally:
            d.shutdown()
            store.close()

    def test_the_watchers_look_at_a_fresh_stage_briefs_it_with_its_downstreams_needs(self, tmp_path: Path) -> None:
        """A pipeline created beside a running daemon: the watcher's look at each new baton (as it is
        written, downstreams first) dispatches the first stage with a brief naming what the next one
        needs. The looks grow the loop's index of downstreams; before, the brief read the last full
        pass's entries, which did not hold a stage written since (scripts/bench_learning.py)."""
        from daemon_harness import in_process_config

        from heartbeat.daemon import Daemon
        from heartbeat.store.files import FileStore
        from heartbeat.system.layout import StateLayout
        from heartbeat.tasks.pipeline import create_pipeline, parse_pipeline

        state, config = in_process_config(tmp_path)
        store = FileStore(str(state))
        d = Daemon(config, store=store)
        try:
            d.tick()  # a first pass over an empty store, as a running daemon has done
            stages = parse_pipeline("p", '[stages.build]\ntask = "Build"\n\n[stages.review]\ntask = "Review"\n'
                                    'after = ["build"]\nneeds = ["rejected"]\n', base_dir=str(tmp_path))
            create_pipeline(store, "p", stages, workdir=str(tmp_path))
            d.evaluate("p.review")
            d.evaluate("p.build")
            assert store.load("p.build").meta.epoch == 1
            brief = Path(StateLayout(str(state)).brief("p.build", 1)).read_text()
        finally:
            d.shutdown()
            store.close()
        assert "`p.review` needs `rejected` (declared)" in brief
