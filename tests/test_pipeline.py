"""Pipelines: created all or nothing from a TOML file, shown as a tree, and run end to end by a real daemon."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Result
from daemon_harness import DaemonHarness

PIPELINE = """\
[stages.build]
task = "Add the response cache"
intent = "p95 latency under 200 ms"
constraints = ["no new services"]
guarantees = [{ text = "the marker exists", check = "marker" }, "docs updated"]
plan = ["write the cache", "write the tests"]

[stages.test]
task = "Load-test the cache"
after = ["build"]

[stages.review]
task = "Review the cache"
after = ["build", "test"]
on_broken = "escalate"
"""


def write(tmp_path: Path, text: str, name: str = "feat.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


class TestPipelineNew:
    def test_creates_every_stage_with_ids_and_edges(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """NAME.STAGE ids, ``after`` mapped to task ids, the root active and the rest held on their gates."""
        r = hb("pipeline", "new", "feat", "--from", write(tmp_path, PIPELINE))
        assert r.code == 0, r.err
        build = json.loads(hb("show", "feat.build", "--json").out)
        review = json.loads(hb("show", "feat.review", "--json").out)
        assert build["meta"]["status"] == "active" and build["step"] == "write the cache"
        assert build["guarantees"] == [{"text": "the marker exists", "check": "marker"}, {"text": "docs updated"}]
        assert review["after"] == ["feat.build", "feat.test"] and review["on_broken"] == "escalate"
        assert review["meta"]["status"] == "blocked"
        assert review["meta"]["gate"] == {"kind": "after", "target": "feat.build,feat.test"}

    @pytest.mark.parametrize(("text", "named"), [
        ('[stages.a]\ntask = "a"\nafter = ["b"]\n[stages.b]\ntask = "b"\nafter = ["a"]\n', "a -> b -> a"),
        ('[stages.a]\ntask = "a"\nafter = ["nope"]\n', "'nope'"),
        ('[stages.a]\ntask = "a"\nafer = ["b"]\n', "'afer'"),
        ('[stages.a]\ntask = "a"\nlauncher = "Not A Name"\n', "launcher"),
        ('[stages.a]\nintent = "x"\n', "stages.a.task"),
        ('[stages.a]\ntask = "a"\non_broken = "retry"\n', "on_broken"),
        ("stages = 1\n", "no stages"),
    ])
    def test_bad_files_are_exit_2_naming_the_problem_and_create_nothing(
            self, hb: Callable[..., Result], tmp_path: Path, text: str, named: str) -> None:
        """A cycle, an unknown stage, a typo or a bad value: one line naming it, exit 2, no task created."""
        r = hb("pipeline", "new", "p", "--from", write(tmp_path, text))
        assert r.code == 2, r.err
        assert named in r.err and r.err.count("\n") == 1
        assert hb("status", "--json").out.count('"id"') == 0

    def test_all_or_nothing_when_an_id_is_taken(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """One stage's id already exists: exit 5 and none of the other stages is created."""
        assert hb("new", "feat.test", "--task", "t", "--step", "s").code == 0
        r = hb("pipeline", "new", "feat", "--from", write(tmp_path, PIPELINE))
        assert r.code == 5 and "feat.test" in r.err
        ids = [t["id"] for t in json.loads(hb("status", "--json").out)["tasks"]]
        assert ids == ["feat.test"]

    def test_status_shows_the_pipeline_as_a_tree(self, hb: Callable[..., Result], tmp_path: Path) -> None:
        """Each downstream is indented under its upstream; a join names all its upstreams."""
        assert hb("new", "alone", "--task", "t", "--step", "s").code == 0
        assert hb("pipeline", "new", "feat", "--from", write(tmp_path, PIPELINE)).code == 0
        lines = hb("status").out.splitlines()
        width = lines[0].index("STATUS")
        ids = [line[:width].rstrip() for line in lines[1:]]
        assert ids == ["alone", "feat.build", "└─ feat.test", "   └─ feat.review (after feat.build, feat.test)"]


AGENT = """\
import os, subprocess, sys, time
task, workdir = os.environ["HEARTBEAT_TASK"], os.getcwd()
epoch = os.environ["HEARTBEAT_EPOCH"]
with open(os.environ["HEARTBEAT_BRIEF"], encoding="utf-8") as f:
    brief = f.read()
with open(os.path.join(workdir, f"{task}.{epoch}.brief.md"), "w", encoding="utf-8") as f:
    f.write(brief)
def hb(*args):
    return subprocess.run([sys.executable, "-m", "heartbeat", *args]).returncode
if task.endswith(".build"):
    open(os.path.join(workdir, "ok"), "w").close()  # make the guarantee hold (again)
    hb("add", task, "decisions", "key the cache by user id")
    hb("add", task, "done", "write the cache")
    sys.exit(hb("done", task, "--note", "cache in"))
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(workdir, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
if hb("verify", task) != 0:
    sys.exit(0)  # the boundary broke: stop; the edge's policy has the upstream reopened
hb("add", task, "done", "reviewed")
sys.exit(hb("done", task))
"""


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    tmp_path.chmod(0o700)
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    h = DaemonHarness(tmp_path, agent=[sys.executable, str(agent)],
                      extra='[checks.marker]\ncommand = ["test", "-f", "{workdir}/ok"]\ntimeout = "10s"\n')
    yield h
    h.close()


class TestEndToEnd:
    def test_builder_to_reviewer_through_a_broken_guarantee(self, harness: DaemonHarness, tmp_path: Path) -> None:
        """A real daemon: the reviewer is briefed with the builder's package, a broken guarantee reopens the
        builder, the reviewer waits, and both finish; ``report --edges`` counts exactly that."""
        h = harness
        (tmp_path / "p.toml").write_text(textwrap.dedent(f"""\
            workdir = {json.dumps(str(tmp_path))}
            [stages.build]
            task = "Add the cache"
            intent = "p95 under 200 ms"
            constraints = ["no new services"]
            guarantees = [{{ text = "the marker exists", check = "marker" }}]
            [stages.review]
            task = "Review the cache"
            after = ["build"]
            """))
        r = h.cli("pipeline", "new", "feat", "--from", str(tmp_path / "p.toml"))
        assert r.returncode == 0, r.stderr
        h.start()
        first = h.wait(lambda: (tmp_path / "feat.review.1.brief.md").exists() and
                       (tmp_path / "feat.review.1.brief.md").read_text(), "the reviewer's first brief")
        assert "key the cache by user id" in first
        assert "- **no new services** _(inherited from `feat.build`)_" in first
        assert "the marker exists [check: marker]" in first
        assert h.baton("feat.build").meta.status.value == "done"
        (tmp_path / "ok").unlink()  # someone breaks the builder's promise
        (tmp_path / "go").touch()
        h.wait(lambda: h.baton("feat.review").meta.status.value == "done", "the reviewer to finish", timeout=40)
        build = h.baton("feat.build")
        assert build.meta.status.value == "done" and build.meta.dispatches == 2
        second = (tmp_path / "feat.build.2.brief.md").read_text()
        assert "the marker exists" in second and "broke for feat.review" in second
        assert h.baton("feat.review").meta.dispatches == 2
        edges = json.loads(h.cli("report", "--edges", "--json").stdout)["edges"]
        assert [(e["upstream"], e["downstream"], e["handoffs"], e["broken"], e["reopens"], e["rederived"])
                for e in edges] == [("feat.build", "feat.review", 2, 1, 1, 0)]
        assert h.cli("status").stdout.count("└─ feat.review") == 1


class TestHeldByAfter:
    def test_a_hand_added_after_holds_an_active_task_until_the_upstream_is_done(self, tmp_path: Path) -> None:
        """A real daemon never dispatches an active task whose ``after`` names an unfinished upstream; once the
        upstream is done, it is dispatched with the package in its brief."""
        tmp_path.chmod(0o700)
        h = DaemonHarness(tmp_path)
        try:
            h.new("up", "--blocked-on", "a human first", plan=1)
            h.new("down", plan=1)
            r = h.cli("add", "down", "after", "up")
            assert r.returncode == 0, r.stderr
            assert h.baton("down").meta.status.value == "active"
            h.start()
            h.wait_log(lambda e: e.get("task") == "down" and "waiting for upstream up" in str(e.get("reason")),
                       "the daemon to hold down")
            assert h.baton("down").meta.dispatches == 0
            assert h.cli("unblock", "up", "--by", "test").returncode == 0
            h.wait(lambda: h.baton("down").meta.status.value == "done", "down to run after up", timeout=40)
            assert h.baton("up").meta.status.value == "done"
            up_done = h.events("up", "handed_off")[-1].ts
            assert h.events("down", "dispatched")[0].ts > up_done
            assert "## Upstream handoff: up" in (h.state / "logs" / "down" / "1.brief.md").read_text()
        finally:
            h.close()


class TestGoodputBench:
    def test_the_bench_runs_and_heartbeat_keeps_what_it_was_told(self) -> None:
        """A tiny run of scripts/bench_goodput.py: both arms finish; only the naive one breaks constraints and blocks."""
        import subprocess

        root = Path(__file__).resolve().parent.parent
        proc = subprocess.run([sys.executable, str(root / "scripts" / "bench_goodput.py"), "--pipelines", "3",
                               "--rates", "0.2", "--json"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)["0.2"]
        hb, naive = result["heartbeat"], result["naive"]
        assert hb["stages_completed"] == 9
        assert hb["constraints_violated"] == hb["blocks_bypassed"] == 0
        assert naive["constraints_violated"] > 0 and naive["blocks_bypassed"] > 0
        assert hb["stages_per_agent_minute"] > naive["stages_per_agent_minute"]


class TestPipelineFile:
    def test_a_fifo_or_a_missing_file_is_refused_not_waited_on(self, hb: Callable[..., Result],
                                                                 tmp_path: Path) -> None:
        """``--from`` a FIFO is exit 2 at once (no hang); a missing file is exit 2 naming it."""
        import os

        fifo = tmp_path / "p.toml"
        os.mkfifo(fifo)
        r = hb("pipeline", "new", "p", "--from", str(fifo), timeout=20)
        assert r.code == 2 and "not a regular file" in r.err
        r = hb("pipeline", "new", "p", "--from", str(tmp_path / "nope.toml"))
        assert r.code == 2 and "nope.toml" in r.err
