"""The status page over a fleet: 10,000 tasks searched and paged server-side, and what each row says
(title, in this state since, snooze wake time, escalation reason) (issue 19, item 11)."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Gate, GateKind, Meta, Status, dump_baton
from heartbeat.model.ledger import Event, EventKind
from heartbeat.model.timeparse import utcnow
from tests.external.test_web import get, rows
from tests.support.daemon_harness import DaemonHarness
from tests.support.web_scenario import WebServer, chromium, start_web

pytestmark = pytest.mark.slow

COUNT = 10_000
ESCALATION = "stalled 3 times: <no progress> & no heartbeat"


def make_fleet(h: DaemonHarness) -> None:
    """10,000 batons written straight to the state dir (the CLI would take minutes): a tenth of
    them snoozed, a few escalated with a reason in the ledger, the rest done or blocked."""
    batons = h.state / "batons"
    batons.mkdir(mode=0o700, exist_ok=True)
    now = utcnow()
    escalations = []
    for i in range(COUNT):
        task_id = f"task-{i:05d}"
        meta = Meta(id=task_id, revision=2, epoch=1, dispatches=1, created_at=now - timedelta(days=2),
                    updated_at=now - timedelta(hours=3), touched_at=now - timedelta(hours=3))
        if i % 10 == 1:
            meta.status, meta.snooze_until = Status.SNOOZED, now + timedelta(days=3)
        elif i % 1000 == 7:
            meta.status = Status.ESCALATED
            escalations.append(Event(task=task_id, kind=EventKind.ESCALATED, ts=now - timedelta(minutes=20),
                                     actor="daemon", epoch=1, data={"reason": ESCALATION}))
        elif i % 10 == 2:
            meta.status, meta.blocked_at, meta.gate = Status.BLOCKED, now - timedelta(hours=5), Gate(GateKind.HUMAN)
        else:
            meta.status, meta.ended_at = Status.DONE, now - timedelta(hours=1)
        baton = Baton(task=f"Fleet job {i} title", step=f"step of {task_id}", meta=meta,
                      blocked_on="ops review" if meta.status is Status.BLOCKED else "")
        path = batons / f"{task_id}.toml"
        path.write_text(dump_baton(baton))
        os.chmod(path, 0o600)
    h.store.ledger.append(escalations)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    root = tmp_path_factory.mktemp("fleet")
    root.chmod(0o700)
    h = DaemonHarness(root)
    make_fleet(h)
    server = start_web(h)
    yield server
    server.stop()


class TestPaging:
    def test_chromium_renders_one_page_of_ten_thousand(self, fleet: WebServer) -> None:
        """/ over 10,000 tasks renders one page (100 rows, escalated first), says which page of how
        many, links the next page with the token kept, and counts every task."""
        dom = chromium(fleet.at())
        listed = rows(dom, "tasks")
        assert len(listed) == defaults.WEB_PAGE_SIZE
        assert listed[:10] == [f"task-{i:05d}" for i in range(7, COUNT, 1000)]  # the escalated, first
        assert f"({COUNT})" in dom
        assert re.search(r'page <span id="page-no">1</span> of <span id="pages">100</span>', dom)
        assert html.escape(f"/?page=2&token={fleet.token}") in dom

    def test_pages_search_and_bounds_over_http(self, fleet: WebServer) -> None:
        """?page and ?per move through the list; ?q finds by id, title or step; a page size over
        the bound or a page that is not a number is a 400 with one line, never the whole list."""
        code, body, _ = get(fleet.at("?status=done&per=50&page=3"))
        assert code == 200
        done = rows(body, "tasks")
        assert len(done) == 50 and done == sorted(done)
        code, first_page, _ = get(fleet.at("?status=done&per=50"))
        assert not set(done) & set(rows(first_page, "tasks"))
        code, body, _ = get(fleet.at("?q=task-0424"))
        assert code == 200 and sorted(rows(body, "tasks")) == [f"task-0424{d}" for d in range(10)]
        code, body, _ = get(fleet.at("?q=Fleet+job+4242+title"))
        assert rows(body, "tasks") == ["task-04242"]
        code, body, _ = get(fleet.at("?q=nothing-like-this"))
        assert code == 200 and "no tasks" in body and rows_or_none(body) == []
        code, body, _ = get(fleet.at(f"?per={defaults.WEB_PAGE_MAX + 1}"))
        assert code == 400 and "per" in body and 'data-task="' not in body
        code, body, _ = get(fleet.at("?page=two"))
        assert code == 400 and "whole number" in body
        code, body, _ = get(fleet.at("?page=999999"))  # past the end: the last page
        assert code == 200 and len(rows(body, "tasks")) == defaults.WEB_PAGE_SIZE
        assert 'page <span id="page-no">100</span> of <span id="pages">100</span>' in body


def rows_or_none(body: str) -> list[str]:
    return rows(body, "tasks") if '<table id="tasks">' in body else []


class TestRowFacts:
    def test_title_since_wake_and_reason_on_the_index(self, fleet: WebServer) -> None:
        """Each row names the task's title and how long it has been in its state; a snoozed row
        its wake time; an escalated row the escalation's reason from the ledger, as text."""
        dom = chromium(fleet.at("?status=snoozed&per=10"))
        assert "Fleet job 1 title" in dom
        assert re.search(r'class="muted wake">wakes <time datetime="\d{4}-\d\d-\d\dT', dom)
        assert re.search(r'<time class="since" datetime="[^"]+" title="since [^"]+">3h', dom)
        dom = chromium(fleet.at("?status=escalated"))
        assert len(rows(dom, "tasks")) == 10
        assert html.escape(ESCALATION, quote=False) in dom
        # (the escalation's time from the ledger, minutes ago; not the baton's update, hours ago)
        assert re.search(r'<time class="since" datetime="[^"]+" title="since [^"]+">\d+m(\d+s)?</time>', dom)
        code, body, _ = get(fleet.at("?status=blocked&per=5"))
        assert code == 200 and len(rows(body, "tasks")) == 5
        assert re.search(r'<time class="since" datetime="[^"]+" title="since [^"]+">5h', body)


class TestHostsView:
    def test_hosts_page_shows_what_heartbeat_hosts_shows(self, tmp_path_factory: pytest.TempPathFactory,
                                                          pg_url: str, fleet: WebServer) -> None:
        """/hosts on a PostgreSQL store lists each daemon's row as `heartbeat hosts` does (state,
        pid, running/capacity, labels), hostile text as text; on a file store it says there are none."""
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO heartbeat_hosts (host, pid, labels, capacity, running, lease_ttl, renewed_at) "
                         "VALUES ('host-a', 4242, '{gpu}', 8, 3, 30, now()), "
                         "('host-b', 77, '{\"<b>x</b>\"}', 4, 0, 30, now() - interval '5 minutes')")
        root = tmp_path_factory.mktemp("hosts")
        root.chmod(0o700)
        h = DaemonHarness(root)
        server = start_web(h, env={"HEARTBEAT_STORE_URL": pg_url})
        try:
            dom = chromium(server.at("hosts"))
            table = dom.split('<table id="hosts">', 1)[1].split("</table>", 1)[0]
            assert re.findall(r'data-host="([^"]+)"', table) == ["host-a", "host-b"]
            assert 'data-state="live"' in table and 'data-state="lost"' in table
            assert "4242" in table and "3/8" in table and "gpu" in table
            assert "&lt;b&gt;x&lt;/b&gt;" in table and "<b>x" not in table
            cli = h.cli("hosts", env={"HEARTBEAT_STORE_URL": pg_url})
            assert cli.returncode == 0 and "host-a" in cli.stdout and "lost" in cli.stdout
        finally:
            server.stop()
        code, body, _ = get(fleet.at("hosts"))  # a file store
        assert code == 200 and "file store" in body and '<table id="hosts">' not in body


class TestHostColumn:
    def test_the_list_names_each_tasks_host_on_a_shared_store(self, tmp_path_factory: pytest.TempPathFactory,
                                                               pg_url: str) -> None:
        """On PostgreSQL the task list has a Host column, as `heartbeat status` has HOST (issue 26, item 5);
        a task no host holds says "-"."""
        from heartbeat.model.baton import Owner
        from heartbeat.store.postgres.store import PostgresStore
        from heartbeat.tasks import verbs as tasks

        store = PostgresStore(pg_url)
        try:
            tasks.new_task(store, "held", task="held", step="s")
            tasks.new_task(store, "free", task="free", step="s")
            with store.edit("held") as ed:
                ed.baton.meta.owner = Owner(pid=4242, host="host-a", how="dispatch", launcher="toy")
        finally:
            store.close()
        root = tmp_path_factory.mktemp("hostcol")
        root.chmod(0o700)
        h = DaemonHarness(root)
        server = start_web(h, env={"HEARTBEAT_STORE_URL": pg_url})
        try:
            dom = chromium(server.at())
            assert "<th>Host</th>" in dom
            held = re.search(r'<tr data-task="held">.*?</tr>', dom, re.S)
            free = re.search(r'<tr data-task="free">.*?</tr>', dom, re.S)
            assert held and 'data-host="host-a">host-a</td>' in held.group(0), held
            assert free and 'data-host="">-</td>' in free.group(0), free
        finally:
            server.stop()
        fleet_dom = chromium(start_file_web(tmp_path_factory))
        assert "<th>Host</th>" not in fleet_dom  # one host: no column


class TestLostHost:
    def test_a_lost_host_runs_nothing_on_the_page_and_its_tasks_say_lost(
            self, tmp_path_factory: pytest.TempPathFactory, pg_url: str) -> None:
        """A host that held 4/4 and stopped renewing (its shims stopped its agents) is lost with 0
        running on /hosts, as `heartbeat hosts` says, and the list marks its task's host lost
        (issue 26, item 5); a live host's task is not marked."""
        import psycopg

        from heartbeat.model.baton import Owner
        from heartbeat.store.postgres.store import PostgresStore
        from heartbeat.tasks import verbs as tasks

        store = PostgresStore(pg_url)
        try:
            for task_id, host in (("on-lost", "host-a"), ("on-live", "host-b")):
                tasks.new_task(store, task_id, task=task_id, step="s")
                with store.edit(task_id) as ed:
                    ed.baton.meta.owner = Owner(pid=4242, host=host, how="dispatch", launcher="toy")
        finally:
            store.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO heartbeat_hosts (host, pid, labels, capacity, running, lease_ttl, renewed_at) "
                         "VALUES ('host-a', 4242, '{}', 4, 4, 30, now() - interval '5 minutes'), "
                         "('host-b', 77, '{}', 4, 1, 30, now())")
        root = tmp_path_factory.mktemp("losthost")
        root.chmod(0o700)
        h = DaemonHarness(root)
        server = start_web(h, env={"HEARTBEAT_STORE_URL": pg_url})
        try:
            hosts = chromium(server.at("hosts"))
            lost = re.search(r'<tr data-host="host-a">.*?</tr>', hosts, re.S)
            assert lost and 'data-state="lost"' in lost.group(0) and ">0/4<" in lost.group(0), lost
            assert "4/4" not in hosts
            dom = chromium(server.at())
            on_lost = re.search(r'<tr data-task="on-lost">.*?</tr>', dom, re.S)
            on_live = re.search(r'<tr data-task="on-live">.*?</tr>', dom, re.S)
            assert on_lost and 'data-state="lost"' in on_lost.group(0), on_lost
            assert on_live and 'data-state="lost"' not in on_live.group(0), on_live
            cli = h.cli("hosts", env={"HEARTBEAT_STORE_URL": pg_url})
            assert cli.returncode == 0 and re.search(r"host-a\s+lost\s+4242\s+0/4", cli.stdout), cli.stdout
        finally:
            server.stop()


def start_file_web(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("onehost")
    root.chmod(0o700)
    h = DaemonHarness(root)
    h.new("t")
    server = start_web(h)
    try:
        return chromium(server.at())
    finally:
        server.stop()
