"""``heartbeat rm``, ``heartbeat logs`` and ``show`` of an archived task (issue 26, item 12), in this process.

rm archives as gc does (the baton and every ledger event into a new archive, read back before
anything goes) and is refused, changing nothing, for a running task or one others depend on;
logs reads the agent's own output through no symlink and never opens a FIFO.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from conftest import Result

Cli = Callable[..., Result]


def _archives(state_dir: Path) -> list[Path]:
    return sorted((state_dir / "archive").glob("*.jsonl.gz")) if (state_dir / "archive").is_dir() else []


class TestRm:
    def test_rm_archives_the_baton_and_the_ledger_and_show_says_where(self, cli: Cli, state_dir: Path) -> None:
        assert cli("new", "t", "--task", "x", "--step", "first").code == 0
        assert cli("set", "t", "step=second").code == 0
        before = json.loads(cli("log", "t", "--json").out)["events"]
        r = cli("rm", "t", "--by", "alice")
        assert r.code == 0, r.err
        [archive] = _archives(state_dir)
        assert archive.name in r.out
        [record] = [json.loads(line) for line in gzip.decompress(archive.read_bytes()).splitlines()]
        assert record["task"] == "t" and 'step = "second"' in record["baton"]
        assert [e["kind"] for e in record["events"]] == [e["kind"] for e in before]
        assert not (state_dir / "batons" / "t.toml").exists()
        [mark] = json.loads(cli("log", "t", "--json").out)["events"]
        assert mark["kind"] == "archived" and mark["actor"] == "alice" and mark["data"]["rows"] == len(before)
        shown = cli("show", "t")
        assert shown.code != 0 and str(archive) in shown.err and "archived by alice" in shown.err, shown.err
        assert cli("rm", "t").code != 0  # gone: nothing to remove twice
        assert len(_archives(state_dir)) == 1

    def test_rm_of_a_task_others_depend_on_is_refused_in_one_line(self, cli: Cli, state_dir: Path) -> None:
        assert cli("new", "up", "--task", "x", "--step", "s").code == 0
        assert cli("new", "down", "--task", "x", "--step", "s", "--after", "up").code == 0
        r = cli("rm", "up")
        assert r.code == 2 and "task down depends on it" in r.err and r.err.count("\n") == 1, r.err
        assert (state_dir / "batons" / "up.toml").exists() and not _archives(state_dir)

    def test_rm_of_a_running_task_is_refused(self, cli: Cli, state_dir: Path) -> None:
        assert cli("new", "t", "--task", "x", "--step", "s", "--claim", "--pid", str(os.getpid())).code == 0
        r = cli("rm", "t")
        assert r.code == 2 and "is running" in r.err and r.err.count("\n") == 1, r.err
        assert (state_dir / "batons" / "t.toml").exists() and not _archives(state_dir)
        assert [e["kind"] for e in json.loads(cli("log", "t", "--json").out)["events"]][-1] != "archived"


class TestLogs:
    def test_the_current_epochs_output_or_a_given_one(self, cli: Cli, state_dir: Path) -> None:
        assert cli("new", "t", "--task", "x", "--step", "s", "--claim", "--pid", str(os.getpid())).code == 0
        epoch = json.loads(cli("show", "t", "--json").out)["meta"]["epoch"]
        logs = state_dir / "logs" / "t"
        logs.mkdir(parents=True)
        (logs / f"{epoch}.log").write_text("the agent said this\n")
        (logs / "0.log").write_text("an older run\n")
        assert cli("logs", "t").out == "the agent said this\n"
        assert cli("logs", "t", "--epoch", "0").out == "an older run\n"
        r = cli("logs", "t", "--epoch", "99")
        assert r.code != 0 and "no output of epoch 99" in r.err, r.err

    def test_a_planted_symlink_or_fifo_is_refused_without_hanging(self, cli: Cli, state_dir: Path,
                                                                  tmp_path: Path) -> None:
        assert cli("new", "t", "--task", "x", "--step", "s").code == 0
        logs = state_dir / "logs" / "t"
        logs.mkdir(parents=True)
        secret = tmp_path / "secret"
        secret.write_text("not yours\n")
        (logs / "1.log").symlink_to(secret)
        os.mkfifo(logs / "2.log")
        results: dict[str, Result] = {}

        def run() -> None:
            results["link"] = cli("logs", "t", "--epoch", "1")
            results["fifo"] = cli("logs", "t", "--epoch", "2")

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "heartbeat logs hung on a FIFO"
        assert results["link"].code == 2 and "symbolic link" in results["link"].err, results["link"].err
        assert "not yours" not in results["link"].out
        assert results["fifo"].code == 2 and "FIFO" in results["fifo"].err, results["fifo"].err


class TestFinishedStep:
    def test_a_done_task_shows_the_step_it_ended_on_not_its_first(self, cli: Cli) -> None:
        assert cli("new", "t", "--task", "x", "--step", "write the parser", "--plan", "write the parser",
                   "--plan", "ship it").code == 0
        assert cli("add", "t", "done", "write the parser", "ship it").code == 0
        assert cli("done", "t").code == 0
        [row] = json.loads(cli("status", "--json").out)["tasks"]
        assert row["step"] == "ship it", row
        line = cli("status").out.splitlines()[1]
        assert line.endswith("(done 2 of 2) ship it"), line


class TestWatchOptions:
    def test_a_bad_interval_or_json_is_one_line_and_exit_2(self, cli: Cli) -> None:
        """--watch loops until Ctrl-C (tests/system/test_watch_and_follow.py); what it refuses returns at once."""
        for args, said in ((("--watch", "0"), "above 0"), (("--watch", "nan"), "above 0"),
                           (("--watch", "1e9"), "at most a day"), (("--watch", "--json"), "without --json")):
            r = cli("status", *args)
            assert r.code == 2 and said in r.err and r.err.count("\n") == 1, (args, r.err)
