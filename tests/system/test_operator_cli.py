"""The operator's commands work as a user of comparable tools expects (issue 26, items 12 and 14).

Every verb through the real CLI against a real state dir (the ``hb`` fixture).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import Result

HB = Callable[..., Result]


def show(hb: HB, task_id: str) -> dict:  # type: ignore[type-arg]
    r = hb("show", task_id, "--json")
    assert r.code == 0, r.err
    return json.loads(r.out)  # type: ignore[no-any-return]


class TestAddDoesNotDuplicate:
    def test_adding_what_is_already_done_appends_nothing(self, hb: HB) -> None:
        """`add ID done X` twice keeps one X and writes nothing the second time (no new revision);
        duplicates within one call collapse; a plan may still repeat a step."""
        assert hb("new", "t", "--task", "t", "--step", "s").code == 0
        assert hb("add", "t", "done", "built it").code == 0
        revision = show(hb, "t")["meta"]["revision"]
        assert hb("add", "t", "done", "built it").code == 0
        after = show(hb, "t")
        assert after["done"] == ["built it"] and after["meta"]["revision"] == revision
        assert hb("add", "t", "done", "tested", "built it", "tested").code == 0
        assert show(hb, "t")["done"] == ["built it", "tested"]
        assert hb("add", "t", "plan", "run tests", "run tests").code == 0
        assert show(hb, "t")["plan"] == ["run tests", "run tests"]

    def test_a_duplicate_from_a_fenced_agent_is_still_refused(self, hb: HB, state_dir: Path) -> None:
        """Writing nothing is no way round the fence: an old epoch is exit 5 as before."""
        assert hb("new", "t", "--task", "t", "--step", "s").code == 0
        assert hb("add", "t", "done", "x").code == 0
        r = hb("add", "t", "done", "x", env={"HEARTBEAT_EPOCH": "7", "HEARTBEAT_TASK": "t"})
        assert r.code == 5, (r.code, r.err)


class TestWebPrintsItsUrl:
    def run_web(self, state_dir: Path, terminal: bool) -> str:
        """``heartbeat web`` with a token, its stderr a pty or a pipe: its first line."""
        import os
        import pty
        import signal
        import subprocess
        import sys
        import time

        from conftest import clean_env

        env = clean_env(HEARTBEAT_STATE_DIR=str(state_dir), HEARTBEAT_WEB_TOKEN="s3cret-token")
        argv = [sys.executable, "-m", "heartbeat", "web", "--listen", "127.0.0.1:0"]
        if terminal:
            main, side = pty.openpty()
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=side, stdin=subprocess.DEVNULL)
            os.close(side)
            out = b""
            deadline = time.monotonic() + 60
            while b"\n" not in out and time.monotonic() < deadline:
                out += os.read(main, 4096)
            os.close(main)
        else:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            out = proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        return out.decode(errors="replace").splitlines()[0]

    def test_at_a_terminal_the_url_carries_the_token(self, state_dir: Path) -> None:
        line = self.run_web(state_dir, terminal=True)
        assert "at http://127.0.0.1:" in line and "/?token=s3cret-token" in line, line

    def test_into_a_pipe_the_token_is_not_written(self, state_dir: Path) -> None:
        """A journal or a log file may be read by others: the URL says where the token goes, not what it is."""
        line = self.run_web(state_dir, terminal=False)
        assert "?token=TOKEN" in line and "s3cret-token" not in line, line


class TestMissingRoleOrDatabase:
    """A server that answers but lacks the role or the database says which and how to create it,
    not "cannot reach the database" (the throwaway cluster)."""

    def run_status(self, url: str) -> Result:
        import subprocess
        import sys

        from conftest import clean_env

        proc = subprocess.run([sys.executable, "-m", "heartbeat", "status"], capture_output=True, text=True,
                              timeout=120, env=clean_env(HEARTBEAT_STORE_URL=url))
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def test_a_missing_role(self, pg_cluster: object) -> None:
        url = f"postgresql://nosuchrole@/hb_template?host={pg_cluster.socket_dir}"  # type: ignore[attr-defined]
        r = self.run_status(url)
        assert r.code == 1 and r.err.count("\n") == 1, r
        assert "has no role 'nosuchrole': create it as PostgreSQL's superuser (sudo -u postgres createuser " \
               "nosuchrole" in r.err, r.err
        assert "cannot reach" not in r.err

    def test_a_missing_database(self, pg_cluster: object) -> None:
        user = pg_cluster.user  # type: ignore[attr-defined]
        url = f"postgresql://{user}@/nosuchdb?host={pg_cluster.socket_dir}"  # type: ignore[attr-defined]
        r = self.run_status(url)
        assert r.code == 1 and f"has no database 'nosuchdb': create it as PostgreSQL's superuser " \
                               f"(sudo -u postgres createdb -O {user} nosuchdb" in r.err, r.err


class TestPauseResumeHelp:
    def test_pause_and_resume(self, hb: HB) -> None:
        """pause holds an active task (paused, recorded with who), resume makes it active again; resuming
        an active task is refused in one line."""
        assert hb("new", "t", "--task", "t", "--step", "s").code == 0
        assert hb("pause", "t", "--by", "ops", "--reason", "maintenance").code == 0
        assert show(hb, "t")["meta"]["status"] == "paused"
        log = hb("log", "t", "--json")
        assert '"paused"' in log.out and "maintenance" in log.out, log.out
        row = json.loads(hb("status", "--json").out)["tasks"][0]
        assert row["state"] == "paused" and "heartbeat resume t" in row["why"]
        assert hb("resume", "t").code == 0
        assert show(hb, "t")["meta"]["status"] == "active"
        r = hb("resume", "t")
        assert r.code != 0 and r.err.count("\n") == 1 and "cannot resume: the task is active" in r.err, r.err

    def test_help_lists_the_commands_and_one_commands_options(self, hb: HB) -> None:
        r = hb("help")
        assert r.code == 0 and "pause" in r.out and "doctor" in r.out and "status" in r.out
        r = hb("help", "pause")
        assert r.code == 0 and r.out.startswith("usage: heartbeat pause")

    def test_errors_have_one_prefix(self, hb: HB) -> None:
        """`heartbeat: pause: ...`, never `heartbeat: heartbeat pause: ...`."""
        r = hb("pause")
        assert r.code == 2 and r.err == "heartbeat: pause: the following arguments are required: id\n", r.err
        r = hb("nosuch")
        assert r.code == 2 and r.err.startswith("heartbeat: argument COMMAND: invalid choice: 'nosuch'"), r.err

    def test_status_shows_progress_against_the_plan(self, hb: HB) -> None:
        assert hb("new", "t", "--task", "t", "--step", "a", "--plan", "a", "--plan", "b", "--plan", "c").code == 0
        assert hb("add", "t", "done", "a").code == 0
        row = json.loads(hb("status", "--json").out)["tasks"][0]
        assert row["progress"] == "done 1 of 3"
        assert "(done 1 of 3) [due: new task, no agent yet] a" in hb("status").out
