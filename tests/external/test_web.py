"""The status page: real daemon, real server, pages rendered by headless Chromium; hostile input stays text."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat.config.shape import Listen, parse_listen
from heartbeat.model.errors import BadInput
from heartbeat.web.guard import HostCheck, check_exposure, is_loopback
from heartbeat.web.views import LOG_TAIL_BYTES, log_tail_of
from tests.conftest import clean_env
from tests.support.web_scenario import HOSTILE_BLOCK, HOSTILE_STEP, Scenario, WebServer, chromium, start_scenario, start_web

pytestmark = pytest.mark.slow


def get(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), {k.lower(): v for k, v in exc.headers.items()}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    s = start_scenario(tmp_path_factory.mktemp("web"))
    yield s
    s.h.close()


@pytest.fixture(scope="module")
def web(scenario: Scenario) -> Iterator[WebServer]:
    server = start_web(scenario.h)
    yield server
    server.stop()


def rows(dom: str, table: str) -> list[str]:
    body = dom.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr data-task="([^"]+)"', body)


class TestInBrowser:
    def test_task_list_renders_every_task_with_counts(self, web: WebServer, scenario: Scenario) -> None:
        """/ in Chromium lists every task (the invalid one too) with status counts and links to each task's page."""
        owner = re.compile(r"pid \d+ on \S+ via toy \(dispatch\)")
        deadline = time.monotonic() + 30
        while True:  # alpha is between agents for a moment now and then (a stall, a backoff): render it owned
            owned = scenario.h.try_baton("alpha")
            dom = chromium(web.at())
            if owner.search(dom) or time.monotonic() > deadline or (
                    owned is not None and owned.meta.owner is not None and owned == scenario.h.try_baton("alpha")):
                break
        assert "<title>tasks · heartbeat</title>" in dom
        assert sorted(rows(dom, "tasks")) == ["alpha", "broken", "crashy", "hostile", "quick", "review"]
        for task in ("alpha", "crashy", "review"):
            assert f'href="/tasks/{task}?token={web.token}"' in dom
        assert re.search(r'data-status="blocked">blocked<span class="n">2</span>', dom)
        assert re.search(r'data-status="escalated">escalated<span class="n">1</span>', dom)
        assert "a design review by ops" in dom and "human" in dom
        assert "not valid TOML" in dom  # the broken baton shows its error in its row
        assert owner.search(dom)  # alpha's owner
        assert "killed by signal 9" in dom or "exit" in dom

    def test_hostile_step_renders_as_text(self, web: WebServer) -> None:
        """A step and a block holding <script>, <img onerror> and <b onmouseover> show as text: the script
        never runs (the title and the DOM are unchanged) and the only script element is the page's own."""
        for path in ("/", "/tasks/hostile", "/?status=blocked"):
            dom = chromium(web.at(path.lstrip("/")))
            assert "pwned" not in dom.split("</title>", 1)[0]
            assert "data-pwned" not in dom.split(">", 2)[1]  # the <html> element was not marked
            assert dom.count("<script") == 1, path
            assert "<img" not in dom and "<b " not in dom
            assert html.escape(HOSTILE_STEP, quote=False) in dom, path
            assert html.escape(HOSTILE_BLOCK, quote=False) in dom, path

    def test_status_filter(self, web: WebServer) -> None:
        """?status=blocked shows only the blocked tasks; an unknown status is a 400 naming the valid ones."""
        dom = chromium(web.at("?status=blocked"))
        assert sorted(rows(dom, "tasks")) == ["hostile", "review"]
        assert 'class="on" data-status="blocked"' in dom
        code, body, _ = get(web.at("?status=nonsense"))
        assert code == 400 and "unknown status" in body and "escalated" in body

    def test_task_page_shows_baton_brief_timeline_and_log(self, web: WebServer, scenario: Scenario) -> None:
        """/tasks/alpha: the baton, the brief the next agent reads, the ledger timeline (dispatch, the kill
        with its signal, the stall, the re-dispatch) and the tail of the current agent's log."""
        dom = chromium(web.at("tasks/alpha"))
        baton = scenario.h.baton("alpha")
        assert '<pre id="baton">' in dom and 'id = "alpha"' in dom
        brief = dom.split('<pre id="brief">', 1)[1].split("</pre>", 1)[0]
        assert "never push to main" in brief and "task alpha" in brief
        timeline = dom.split('<table id="timeline">', 1)[1].split("</table>", 1)[0]
        kinds = re.findall(r'data-kind="([a-z_]+)"', timeline)
        assert kinds.count("dispatched") >= 2 and "exited" in kinds and "stalled" in kinds and kinds[-1] == "created"
        assert re.search(r"<b>signal</b> 9", timeline)
        log = dom.split('<pre id="log">', 1)[1].split("</pre>", 1)[0]
        assert f"epoch {baton.meta.epoch}: read the baton first" in html.unescape(log)

    def test_older_epochs_logs(self, web: WebServer, scenario: Scenario) -> None:
        """/tasks/alpha links each epoch's log; ?epoch=1 shows the first agent's log (the one killed),
        and an epoch that is not 1 to the current one is a 400 with one line (issue 19 item 11)."""
        current = scenario.h.baton("alpha").meta.epoch
        dom = chromium(web.at("tasks/alpha"))
        links = dom.split('<p class="muted" id="epochs">', 1)[1].split("</p>", 1)[0]
        assert f'href="/tasks/alpha?epoch=1&amp;token={web.token}"' in links and f"<b>{current}</b>" in links
        dom = chromium(web.at("tasks/alpha?epoch=1"))
        log = html.unescape(dom.split('<pre id="log">', 1)[1].split("</pre>", 1)[0])
        assert "epoch 1: read the baton first" in log and f"epoch {current}:" not in log
        for bad in ("0", str(current + 1), "x", "-1"):
            code, body, _ = get(web.at(f"tasks/alpha?epoch={bad}"))
            assert code == 400 and "expected 1 to" in body, bad

    def test_timeline_hides_routine_writes_unless_asked(self, web: WebServer) -> None:
        """The timeline lists the seams and leaves the agent's updates and touches out; ?all=1 lists them too."""
        dom = chromium(web.at("tasks/alpha"))
        assert 'data-kind="updated"' not in dom and "updates and touches too" in dom
        everything = chromium(web.at("tasks/alpha?all=1"))
        assert 'data-kind="updated"' in everything and 'data-kind="dispatched"' in everything

    def test_escalated_task_timeline_names_the_escalation(self, web: WebServer) -> None:
        """The crashing task's page shows its exits with their codes and the escalation."""
        dom = chromium(web.at("tasks/crashy"))
        timeline = dom.split('<table id="timeline">', 1)[1].split("</table>", 1)[0]
        assert 'data-kind="escalated"' in timeline
        assert re.search(r"<b>code</b> 3", timeline)

    def test_report_lists_worst_first(self, web: WebServer) -> None:
        """/report is the handoff report with the escalated task first (highest score)."""
        dom = chromium(web.at("report"))
        order = rows(dom, "report")
        assert order[0] == "crashy"
        assert set(order) >= {"alpha", "crashy", "quick"}

    def test_invalid_baton_page_shows_the_error(self, web: WebServer) -> None:
        """A malformed baton's page shows its parse error instead of failing."""
        dom = chromium(web.at("tasks/broken"))
        assert '<div class="error" id="baton-error">' in dom and "not valid TOML" in dom

    def test_daemon_serves_the_same_pages(self, scenario: Scenario) -> None:
        """[http] listen in the config: `heartbeat run` itself serves the pages and reports its own last tick."""
        dom = chromium(scenario.at())
        assert sorted(rows(dom, "tasks")) == ["alpha", "broken", "crashy", "hostile", "quick", "review"]
        assert re.search(r'<span class="daemon " id="daemon">daemon pid \d+ last ticked', dom)


class TestHttp:
    def test_unknown_task_is_404(self, web: WebServer) -> None:
        """An unknown task, a bad id and an unknown path are 404 pages."""
        for path in ("tasks/nope", "tasks/..%2F..%2Fetc", "tasks/%3Cscript%3E", "nowhere"):
            code, body, _ = get(web.at(path))
            assert code == 404, path
            assert "<script>alert" not in body

    def test_only_get_and_head(self, web: WebServer) -> None:
        """No verb changes anything: POST, PUT, DELETE, PATCH are 405 with Allow: GET, HEAD; HEAD works."""
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            code, _, headers = get(web.at("tasks/alpha"), method=method)
            assert code == 405 and headers["allow"] == "GET, HEAD", method
        code, body, _ = get(web.at(), method="HEAD")
        assert code == 200 and body == ""

    def test_pages_carry_a_strict_policy(self, web: WebServer) -> None:
        """Every page is sent with a nonce-based Content-Security-Policy and nosniff, and is not cached."""
        code, body, headers = get(web.at("tasks/hostile"))
        assert code == 200
        policy = headers["content-security-policy"]
        nonce = re.search(r"script-src 'nonce-([^']+)'", policy)
        assert nonce and f'<script nonce="{nonce.group(1)}">' in body
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"
        assert HOSTILE_STEP not in body  # escaped in the raw HTML too, not only in the DOM


@pytest.fixture(scope="module")
def guarded(scenario: Scenario) -> Iterator[WebServer]:
    server = start_web(scenario.h, env={"HEARTBEAT_WEB_TOKEN": "s3cret-token"})
    yield server
    server.stop()


class TestToken:
    def test_requests_need_the_token(self, guarded: WebServer) -> None:
        """With a token, a request without it or with a wrong one is 401; Bearer or ?token= is served."""
        assert get(guarded.url)[0] == 401
        assert get(guarded.url + "metrics")[0] == 401
        assert get(guarded.url, headers={"Authorization": "Bearer wrong"})[0] == 401
        assert get(guarded.url + "?token=s3cret-tokenX")[0] == 401
        assert get(guarded.url, headers={"Authorization": "Bearer s3cret-token"})[0] == 200
        assert get(guarded.url + "metrics", headers={"Authorization": "Bearer s3cret-token"})[0] == 200

    def test_query_token_is_carried_by_links(self, guarded: WebServer) -> None:
        """Opened with ?token=, the page's links keep it, so a browser can navigate (Chromium follows one)."""
        dom = chromium(guarded.url + "?token=s3cret-token")
        assert 'href="/tasks/alpha?token=s3cret-token"' in dom
        page = chromium(guarded.url + "tasks/alpha?token=s3cret-token")
        assert '<pre id="baton">' in page

    @pytest.mark.parametrize("listen", ["127.0.0.1:0", "[::1]:0", "localhost:0", "0.0.0.0:0", None])
    def test_tcp_without_token_is_refused(self, scenario: Scenario, listen: str | None) -> None:
        """`heartbeat web` on any TCP address, loopback and the default included, without a token exits 2
        with one line saying how to set one, and never listens: every local user can connect to a
        loopback port (on c684e38 loopback was served to anyone; issue 17, item 1)."""
        proc = subprocess.run([sys.executable, "-m", "heartbeat", "--config", str(scenario.h.config), "web",
                               *(["--listen", listen] if listen else [])], capture_output=True, text=True,
                              timeout=30, env=clean_env())
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1
        assert "without a token" in proc.stderr and "--token" in proc.stderr and "unix:PATH" in proc.stderr

    def test_daemon_refuses_http_without_token(self, tmp_path: Path) -> None:
        """`[http] listen` on loopback without a token: the daemon logs http_failed and keeps the clock."""
        from tests.support.daemon_harness import DaemonHarness

        h = DaemonHarness(tmp_path, extra='[http]\nlisten = "127.0.0.1:0"\n')
        try:
            h.start()
            failed = h.wait_log(lambda e: e.get("event") == "http_failed", "http_failed")
            assert "without a token" in failed["error"] and "[http] token" in failed["error"]
            h.new("t", plan=1)
            h.wait(lambda: h.events("t", "dispatched"), "the clock still dispatches")
        finally:
            h.close()


class TestListen:
    @pytest.mark.parametrize(("value", "expected"), [
        ("127.0.0.1:8787", Listen("127.0.0.1", 8787)), ("[::1]:80", Listen("::1", 80)),
        ("localhost:0", Listen("localhost", 0)), ("0.0.0.0:9", Listen("0.0.0.0", 9)),
        ("unix:web.sock", Listen(path="web.sock")), ("unix:/run/hb/web.sock", Listen(path="/run/hb/web.sock")),
    ])
    def test_parse(self, value: str, expected: Listen) -> None:
        """HOST:PORT, [v6]:PORT and unix:PATH parse, and print back as given."""
        assert parse_listen(value) == expected
        assert str(parse_listen(value)) == value

    @pytest.mark.parametrize("value", ["8787", "host:", ":80", "h:99999", "h:x", "unix:"])
    def test_bad(self, value: str) -> None:
        """Anything else is BadInput naming the value."""
        with pytest.raises(BadInput, match="--listen"):
            parse_listen(value)

    def test_a_relative_socket_is_in_the_state_dir(self) -> None:
        """unix:web.sock is <state_dir>/web.sock; an absolute path and TCP are left as they are."""
        assert Listen(path="web.sock").in_dir("/s") == Listen(path="/s/web.sock")
        assert Listen(path="/run/w.sock").in_dir("/s") == Listen(path="/run/w.sock")
        assert Listen("127.0.0.1", 1).in_dir("/s") == Listen("127.0.0.1", 1)

    def test_token_rule(self) -> None:
        """Every TCP address needs a token, loopback too; a Unix socket does not (it is 0600)."""
        assert is_loopback("127.0.0.1") and is_loopback("127.9.9.9") and is_loopback("::1") and is_loopback("localhost")
        assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("example.org")
        for host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.1"):
            with pytest.raises(BadInput, match="without a token"):
                check_exposure(Listen(host, 8787), "")
            check_exposure(Listen(host, 8787), "t")
        check_exposure(Listen(path="web.sock"), "")

    @pytest.mark.parametrize(("listen", "names", "served", "refused"), [
        (Listen("127.0.0.1", 8787), (), ["127.0.0.1:8787", "localhost:8787", "localhost", "LOCALHOST.:1", "[::1]:8787"],
         ["attacker.example", "attacker.example:8787", "10.0.0.1:8787", "", "127.0.0.1:x", "a b", "[::1"]),
        (Listen("localhost", 8787), (), ["localhost:8787", "127.0.0.1:8787"], ["evil.localhost.example:8787"]),
        (Listen("0.0.0.0", 8787), (), ["192.0.2.7:8787", "[2001:db8::1]:8787", "localhost"], ["box.example:8787"]),
        (Listen("192.0.2.7", 80), ("status.example.org",), ["192.0.2.7", "status.example.org:80"],
         ["localhost:80", "127.0.0.1:80", "192.0.2.8", "example.org"]),
        (Listen(path="/s/web.sock"), (), ["localhost", "127.0.0.1"], ["attacker.example"]),
        (Listen("::1", 80), ("Status.Example.org.:8443", "192.0.2.9", "[2001:db8::2]:80", "2001:db8::3"),
         ["[::1]:80", "localhost", "status.example.org", "192.0.2.9:80", "[2001:db8::2]", "[2001:db8::3]:1"],
         ["192.0.2.10", "example.org"]),
    ])
    def test_host_check(self, listen: Listen, names: tuple[str, ...], served: list[str], refused: list[str]) -> None:
        """A Host header naming the listen address, localhost on loopback, any address literal on a
        wildcard, or a configured name is served; any other name is not (DNS rebinding)."""
        check = HostCheck(listen, names)
        assert [h for h in served if not check.allows(h)] == []
        assert [h for h in refused if check.allows(h)] == []

    def test_bad_config_listen(self, tmp_path: Path) -> None:
        """`[http] listen` that is not HOST:PORT or unix:PATH is a config error with file, line and key."""
        from heartbeat.config.load import parse_config
        from heartbeat.model.errors import ConfigError

        with pytest.raises(ConfigError, match=r":2: http.listen: 'nope': expected HOST:PORT or unix:PATH"):
            parse_config('[http]\nlisten = "nope"\n', path=str(tmp_path / "h.toml"))

    def test_allowed_hosts_in_config(self, tmp_path: Path) -> None:
        """`[http] allowed_hosts` is a list of names; anything else is a config error naming the key."""
        from heartbeat.config.load import parse_config
        from heartbeat.model.errors import ConfigError

        config = parse_config('[http]\nallowed_hosts = ["status.example.org"]\n', path=str(tmp_path / "h.toml"))
        assert config.http.allowed_hosts == ("status.example.org",)
        for bad in ('"status.example.org"', '[1]', '[""]'):
            with pytest.raises(ConfigError, match=r"http\.allowed_hosts: expected a list of host names"):
                parse_config(f"[http]\nallowed_hosts = {bad}\n", path=str(tmp_path / "h.toml"))


class TestLogTail:
    """The agent's log is hostile: never followed through a symlink, never a FIFO, always bounded."""

    def logs(self, tmp_path: Path) -> Path:
        d = tmp_path / "logs" / "t"
        d.mkdir(parents=True)
        return d

    def test_tail_of_a_big_log_is_bounded(self, tmp_path: Path) -> None:
        """A log larger than the limit yields only its last whole lines, within the limit."""
        d = self.logs(tmp_path)
        (d / "3.log").write_text("".join(f"line {i}\n" for i in range(100_000)))
        tail = log_tail_of(str(tmp_path), "t", 3)
        assert tail.truncated and len(tail.text.encode()) <= LOG_TAIL_BYTES
        assert tail.text.startswith("line ") and tail.text.endswith("line 99999\n")

    def test_symlink_is_not_followed(self, tmp_path: Path) -> None:
        """A log replaced by a symlink to a secret is not read."""
        d = self.logs(tmp_path)
        secret = tmp_path / "secret"
        secret.write_text("TOPSECRET")
        (d / "1.log").symlink_to(secret)
        tail = log_tail_of(str(tmp_path), "t", 1)
        assert tail.text == "" and "not shown" in tail.problem

    def test_symlinked_task_dir_is_not_followed(self, tmp_path: Path) -> None:
        """logs/<task> replaced by a symlink to another directory is not entered."""
        other = tmp_path / "elsewhere"
        other.mkdir()
        (other / "1.log").write_text("TOPSECRET")
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "t").symlink_to(other)
        tail = log_tail_of(str(tmp_path), "t", 1)
        assert tail.text == "" and "not shown" in tail.problem

    def test_fifo_never_hangs(self, tmp_path: Path) -> None:
        """A FIFO in place of the log returns at once with a note (no writer ever opens it)."""
        d = self.logs(tmp_path)
        os.mkfifo(d / "1.log")
        result: list[object] = []
        reader = threading.Thread(target=lambda: result.append(log_tail_of(str(tmp_path), "t", 1)), daemon=True)
        started = time.monotonic()
        reader.start()
        reader.join(timeout=10)
        assert result, f"log_tail_of hung on a FIFO for {time.monotonic() - started:.1f}s"
        assert "not a regular file" in result[0].problem  # type: ignore[attr-defined]

    def test_missing_log(self, tmp_path: Path) -> None:
        """No log yet is said so."""
        assert log_tail_of(str(tmp_path), "t", 1).problem == "no log yet"
