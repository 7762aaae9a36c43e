"""Log volume: one structured line per change of a task's state, not one per pass (issue 19, item 10)."""

from __future__ import annotations

import io
import json
import logging as stdlib_logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import structlog
from conftest import wait_for
from daemon_harness import in_process_config

from heartbeat.daemon import Daemon
from heartbeat.store.files import FileStore
from heartbeat.system import logging as hlog
from heartbeat.tasks import verbs as tasks

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Tests here configure the process-wide structlog; put everything back afterwards."""
    config = structlog.get_config()
    state = (hlog._state.stream, hlog._state.renderer, hlog._state.captured)
    root = stdlib_logging.getLogger()
    root_level, root_handlers = root.level, list(root.handlers)
    yield
    structlog.configure(**config)
    hlog._state.stream, hlog._state.renderer, hlog._state.captured = state
    root.handlers[:] = root_handlers
    root.setLevel(root_level)


def per_task(events: list[Any], name: str, **match: Any) -> Counter[str]:
    return Counter(e["task"] for e in events if e["event"] == name and match.items() <= e.items())


class TestQueuedTasks:
    def test_a_task_queued_at_capacity_says_it_waits_once(self, tmp_path: Path) -> None:
        """At capacity, each queued task logs its dispatch decision and ``waiting`` once over many
        passes (it was once per pass: 103 lines every 2 s for a fleet), and again only when its
        admission changes (here: it is dispatched)."""
        tmp_path.chmod(0o700)
        state, config = in_process_config(tmp_path, daemon="max_concurrent = 1\ndispatches_per_minute = 600")
        d = Daemon(config, store=FileStore(str(state)))
        try:
            ids = [f"q{i}" for i in range(8)]
            for task_id in ids:
                tasks.new_task(d.store, task_id, task="t", step="s")
            with hlog.capture() as events:
                for n in range(6):
                    d.tick(now=T0 + timedelta(seconds=2 * n))
            dispatched = set(per_task(events, "dispatched"))
            assert len(dispatched) == 1
            queued = set(ids) - dispatched
            assert per_task(events, "waiting") == Counter({task_id: 1 for task_id in queued})
            assert per_task(events, "decision", action="dispatch", level="info") == Counter({t: 1 for t in ids})
            waiting = [e for e in events if e["event"] == "waiting"]
            assert all(e["reason"] == "capacity full (1 agents running)" for e in waiting)
            # The running task is finished (its agent is stopped after the inactive grace): one
            # queued task is dispatched, the others stay silent.
            (running,) = dispatched
            tasks.finish(d.store, running, actor="agent")
            with hlog.capture() as later:
                for n in range(6, 200):
                    d.tick(now=T0 + timedelta(seconds=2 * n))
                    if per_task(later, "dispatched"):
                        break
            assert len(per_task(later, "dispatched")) == 1
            assert per_task(later, "waiting") == Counter()
            assert per_task(later, "decision", action="dispatch") == Counter()  # said once, when it queued
        finally:
            d.shutdown(timeout=5)


class TestSchedulerWarnings:
    def test_a_missed_run_is_a_structured_line(self) -> None:
        """APScheduler's own "Run time of job ... was missed by ..." warning, from a real scheduler
        whose only worker is busy, comes out as one JSON line with an event name and fields,
        not as free text in ``event``."""
        from apscheduler.schedulers.background import BackgroundScheduler

        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        release = threading.Event()
        scheduler = BackgroundScheduler(timezone="UTC", executors={"default": {"type": "threadpool",
                                                                                "max_workers": 1}})
        scheduler.start()
        try:
            scheduler.add_job(release.wait, id="blocker", kwargs={"timeout": 30})
            now = datetime.now(timezone.utc)
            # Due now with a grace of 0.1 s, but it can only start once the blocker ends.
            scheduler.add_job(lambda: None, "date", run_date=now, id="late", misfire_grace_time=1)
            wait_for(lambda: len(scheduler.get_jobs()) <= 1, timeout=10, message="both jobs submitted")
            time.sleep(1.2)  # past the late job's grace: a missed run when the worker frees
            release.set()
            wait_for(lambda: "missed" in buf.getvalue(), timeout=10, message="the missed-run warning")
        finally:
            release.set()
            scheduler.shutdown(wait=True)
        lines = [json.loads(line) for line in buf.getvalue().splitlines()]
        (missed,) = [e for e in lines if e["event"] == "scheduler_job_missed"]
        assert missed["level"] == "warning" and missed["logger"].startswith("apscheduler")
        assert missed["job"] == "late" and missed["missed_by_s"] > 1
        assert 'Run time of job "' in missed["message"]


class TestAStuckJobSaysSoOnce:
    def test_scheduler_job_skipped_repeated_every_beat_is_one_line(self) -> None:
        """Issue 24 item 17: a renewal stuck on a database that went away made APScheduler warn
        ``skipped: maximum number of running instances reached`` every 0.5 s (26 lines per host in
        10 s). Now once per job per quiet period; another job still gets its own line. At 4c852cf: 5 lines."""


        buf = io.StringIO()
        hlog.configure("json", stream=buf)
        aps = stdlib_logging.getLogger("apscheduler.scheduler")

        class Job:
            def __init__(self, id_: str) -> None:
                self.id = id_

        fmt = 'Execution of job "%s" skipped: maximum number of running instances reached (%d)'
        for _ in range(5):
            aps.warning(fmt, Job("lease"), 1)
        aps.warning(fmt, Job("gc"), 1)
        skipped = [json.loads(line) for line in buf.getvalue().splitlines()
                   if json.loads(line)["event"] == "scheduler_job_skipped"]
        assert [e["job"] for e in skipped] == ["lease", "gc"]
