"""A person answers a question across the seam on the status page (issue 27, item 3): the page's one
write, typed and submitted by headless Chromium on a real ``heartbeat web``, and the attacks an outsider
would try on it with curl, each refused with nothing written."""

from __future__ import annotations

import html
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from heartbeat.model import defaults
from heartbeat.web.answer import FormKey
from tests.support.browser import Browser
from tests.support.daemon_harness import DaemonHarness
from tests.support.web_scenario import TOKEN, Scenario, WebServer, start_web

pytestmark = pytest.mark.slow

QUESTION = "Why sqlite and not <b>postgres</b>?"
ANSWER = "One file, no server — and <script>document.title='pwned'</script> stays text.\nSecond line."


def ask(h: DaemonHarness, task_id: str, text: str = QUESTION) -> str:
    r = h.cli("ask", task_id, text, "--to", "person")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonHarness, WebServer]]:
    """``heartbeat web`` with a token over a state dir holding: ``asker`` (q1 open, the browser answers
    it), ``held`` (q1, q2 open: what the attacks aim at), ``raced`` (q1, answered behind the page's back)."""
    root = tmp_path_factory.mktemp("webanswer")
    root.chmod(0o700)
    h = DaemonHarness(root)
    for task_id in ("asker", "held", "raced", "other"):
        h.new(task_id, step="critique the build")
    assert ask(h, "asker") == "q1"
    assert [ask(h, "held"), ask(h, "held", "And which port?")] == ["q1", "q2"]
    ask(h, "raced")
    server = start_web(h)
    try:
        yield h, server
    finally:
        server.stop()


def curl(*args: str) -> tuple[int, str, dict[str, str]]:
    """``curl -sS ARGS``: the HTTP status, the body and the response headers (lowercased names)."""
    path = shutil.which("curl")
    assert path, "curl is not installed: scripts/test installs it (apt-get install -y curl)"
    proc = subprocess.run([path, "-sS", "--max-time", "30", "-D", "-", "-w", "\n%{http_code}", *args],
                          capture_output=True, text=True, timeout=60)
    out, _, code = proc.stdout.rpartition("\n")
    head, _, body = out.partition("\n\n")  # (text mode: the CRLFs are newlines already)
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in head.splitlines()[1:]))
    return int(code or 0), body, headers


def form_of(server: WebServer | Scenario, task_id: str, qid: str) -> tuple[str, str]:
    """The action and the anti-forgery value of ``qid``'s form, as the task's page serves them."""
    code, body, _ = curl(server.at(f"tasks/{task_id}"))
    assert code == 200
    form = re.search(rf'<form class="answer" method="post" action="([^"]+)" data-qid="{qid}">\s*'
                     r'<input type="hidden" name="form" value="([0-9a-f]+)">', body)
    assert form, f"no form for {task_id} {qid}"
    return html.unescape(form.group(1)), form.group(2)


def post(url: str, *fields: str, headers: tuple[str, ...] = ("Content-Type: application/x-www-form-urlencoded",),
         extra: tuple[str, ...] = ()) -> tuple[int, str, dict[str, str]]:
    return curl("-X", "POST", *(a for h in headers for a in ("-H", h)),
                *(a for f in fields for a in ("--data-urlencode", f)), *extra, url)


def snapshot(h: DaemonHarness, *task_ids: str) -> list[tuple[bytes, int]]:
    """What a refused request must leave as it was: each baton's bytes and its ledger's length."""
    return [((h.state / "batons" / f"{t}.toml").read_bytes(), len(h.events(t))) for t in task_ids]


class TestInBrowser:
    def test_a_person_types_the_answer_and_the_gate_lifts(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """Chromium follows the list's link to /tasks/asker#q1, types into q1's form and clicks Answer: a 303
        back to the task's page (token kept), which shows the answer as text; the baton holds it by person:web, the gate
        `question:q1` has lifted, and the ledger has `answered` and `unblocked` like the CLI's."""
        h, server = site
        assert h.baton("asker").meta.gate is not None and h.baton("asker").meta.gate.spec() == "question:q1"
        with Browser() as browser:
            browser.open(server.at())  # from the list's open questions to the question's form
            browser.click('a[data-answer="asker/q1"]')
            browser.wait_for("location.pathname === '/tasks/asker' && location.hash === '#q1' && "
                             "document.readyState === 'complete'", "asker's page")
            browser.type_into('form[data-qid="q1"] textarea', ANSWER)
            browser.click('form[data-qid="q1"] button')
            browser.wait_for("location.pathname === '/tasks/asker' && document.readyState === 'complete' && "
                             "document.querySelector('tr[data-qid=\"q1\"]').dataset.open === 'no'", "the answered page")
            assert browser.evaluate("location.search") == f"?token={TOKEN}"
            assert browser.evaluate("document.title") == "asker · heartbeat"
            dom = browser.dom()
        row = dom.split('<tr id="q1"', 1)[1].split("</tr>", 1)[0]
        assert html.escape(ANSWER.split("\n")[0], quote=False) in row and "person:web" in row and "<form" not in row
        (question,) = h.baton("asker").questions
        assert (question.answer, question.answered_by) == (ANSWER, "person:web")
        baton = h.baton("asker")
        assert baton.meta.status.value == "active" and baton.meta.gate is None and not baton.blocked_on
        [answered] = h.events("asker", "answered")
        assert answered.data["by"] == "person:web" and answered.data["qid"] == "q1" and answered.data["wait_s"] >= 0
        assert h.events("asker", "unblocked")[-1].data["gate_opened"] == "question:q1"

    def test_the_page_does_not_refresh_under_a_person_typing(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """The page refreshes its main part in place every WEB_REFRESH_SECONDS; it does, untouched, but not
        while an answer is typed: the form and its text stay (one refresh would have replaced them)."""
        h, server = site
        every = defaults.WEB_REFRESH_SECONDS
        with Browser(timeout=every * 3) as browser:
            browser.open(server.at("tasks/held"))
            browser.evaluate("document.getElementById('main').dataset.mark = 'old'; 1")
            browser.wait_for("document.getElementById('main').dataset.mark !== 'old'", "a refresh, untouched")
            browser.evaluate("document.getElementById('main').dataset.mark = 'typing'; 1")
            browser.type_into('form[data-qid="q2"] textarea', "half an answer")
            browser.evaluate("document.activeElement.blur(); 1")  # filled, no longer focused: still kept
            started = time.monotonic()
            while time.monotonic() - started < every * 1.5:
                assert browser.evaluate("document.getElementById('main').dataset.mark") == "typing"
                time.sleep(0.5)
            assert browser.evaluate("document.querySelector('form[data-qid=\"q2\"] textarea').value") == "half an answer"
        assert h.baton("held").questions[1].open


class TestAttacks:
    def test_no_token_or_a_wrong_one_writes_nothing(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """The POST needs the token as every GET does (401), whatever else it carries."""
        h, server = site
        _, value = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        for url in (server.url + "tasks/held/questions/q1/answer",
                    server.url + "tasks/held/questions/q1/answer?token=wrong",
                    server.url + f"tasks/held/questions/q1/answer?token={TOKEN}x"):
            code, _, _ = post(url, "answer=forged", f"form={value}")
            assert code == 401, url
        assert snapshot(h, "held") == before

    def test_a_wrong_or_missing_anti_forgery_value_writes_nothing(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """No `form` field, a wrong one, q1's value sent for q2, and a field given twice: refused."""
        h, server = site
        _, q1 = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        q2_url = server.at("tasks/held/questions/q2/answer")
        for fields, want in ((("answer=forged",), 400), (("answer=forged", "form=" + "0" * 64), 403),
                             (("answer=forged", f"form={q1}"), 403), (("answer=a", "answer=b", f"form={q1}"), 400)):
            code, body, _ = post(q2_url, *fields)
            assert code == want, (fields, body)
        assert snapshot(h, "held") == before

    def test_a_qid_of_another_task_writes_nothing(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """held's q2 form value posted to `other`'s q2 (which it does not have) or to `raced`'s q1: 403."""
        h, server = site
        _, held_q2 = form_of(server, "held", "q2")
        _, held_q1 = form_of(server, "held", "q1")
        before = snapshot(h, "held", "other", "raced")
        assert post(server.at("tasks/other/questions/q2/answer"), "answer=x", f"form={held_q2}")[0] == 403
        assert post(server.at("tasks/raced/questions/q1/answer"), "answer=x", f"form={held_q1}")[0] == 403
        assert snapshot(h, "held", "other", "raced") == before

    def test_a_cross_origin_post_writes_nothing(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """A valid form sent with another site's Origin, `Origin: null`, or `Sec-Fetch-Site: cross-site`: 403."""
        h, server = site
        action, value = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        form = "Content-Type: application/x-www-form-urlencoded"
        host = server.url.split("//", 1)[1].rstrip("/")
        for header in ("Origin: http://evil.example", "Origin: null", f"Origin: http://{host}.evil.example",
                       "Sec-Fetch-Site: cross-site", "Sec-Fetch-Site: same-site"):
            code, body, _ = post(server.url.rstrip("/") + action, "answer=forged", f"form={value}",
                                 headers=(form, header))
            assert code == 403 and "cross-origin" in body, header
        assert snapshot(h, "held") == before

    def test_other_content_types_write_nothing(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """text/plain (what a cross-site form may send without a preflight), multipart, JSON, none,
        and a charset other than UTF-8: 415."""
        h, server = site
        action, value = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        url = server.url.rstrip("/") + action
        for kind in ("text/plain", "multipart/form-data; boundary=x", "application/json", "",
                     "application/x-www-form-urlencoded; charset=latin-1"):
            code, _, _ = post(url, "answer=forged", f"form={value}", headers=(f"Content-Type: {kind}",))
            assert code == 415, kind
        assert snapshot(h, "held") == before

    def test_a_huge_body_writes_nothing(self, site: tuple[DaemonHarness, WebServer], tmp_path: Path) -> None:
        """A 10 MB body, declared or chunked, is refused (413) before it is read whole."""
        h, server = site
        action, value = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        big = tmp_path / "big"
        big.write_bytes(f"form={value}&answer=".encode() + b"a" * 10_000_000)
        url = server.url.rstrip("/") + action
        form = "Content-Type: application/x-www-form-urlencoded"
        for headers in ((form,), (form, "Transfer-Encoding: chunked")):
            code, body, _ = curl("-X", "POST", *(a for x in headers for a in ("-H", x)), "--data-binary", f"@{big}", url)
            assert code == 413 and f"over {defaults.MAX_ANSWER_CHARS * 12 + 1024} bytes" in body, headers
        assert snapshot(h, "held") == before

    def test_a_body_that_never_arrives_is_cut_off(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """A POST that declares a body and sends a part of it, then nothing: 408 within
        WEB_REQUEST_TIMEOUT (the connection is not held for ever), nothing written."""
        h, server = site
        action, value = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        host, port = server.url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=defaults.WEB_REQUEST_TIMEOUT * 3) as conn:
            conn.sendall(f"POST {action} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                         "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n"
                         f"form={value}&answer=slow".encode())
            started = time.monotonic()
            reply = conn.recv(4096).decode()
            assert reply.startswith("HTTP/1.1 408"), reply[:200]
            assert time.monotonic() - started < defaults.WEB_REQUEST_TIMEOUT * 2
        assert snapshot(h, "held") == before

    def test_post_anywhere_else_and_other_verbs_stay_405(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """Every other path refuses POST (and the answer path every other write verb) with 405, Allow: GET,
        HEAD, token or not; GET and HEAD still serve every page."""
        h, server = site
        before = snapshot(h, "held")
        for path in ("", "tasks/held", "report", "hosts", "metrics", "tasks/held/questions/q1",
                     "tasks/held/questions/q1/answer/", "tasks/held/questions/q1/answer/x",
                     "tasks/held/questions/x1/answer", "tasks/held/questions/q1/answers", "nowhere"):
            code, _, headers = post(server.at(path), "answer=x", "form=x")
            assert code == 405 and headers["allow"] == "GET, HEAD", path
        for verb in ("PUT", "DELETE", "PATCH"):
            code, _, headers = curl("-X", verb, server.at("tasks/held/questions/q1/answer"))
            assert code == 405 and headers["allow"] == "GET, HEAD", verb
        for path in ("", "tasks/held", "report", "hosts", "metrics"):
            assert curl(server.at(path))[0] == 200, path
            assert curl("-I", server.at(path))[0] == 200, path
        assert snapshot(h, "held") == before


class TestOneLineErrors:
    def test_an_answer_over_the_cap_is_refused_on_the_page(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """An answer of MAX_ANSWER_CHARS + 1 characters: the task page again (400) with the CLI's line
        beside q1's form, the text kept in it, and nothing written."""
        h, server = site
        action, value = form_of(server, "held", "q1")
        before = snapshot(h, "held")
        code, body, _ = post(server.url.rstrip("/") + action, "answer=" + "x" * (defaults.MAX_ANSWER_CHARS + 1),
                             f"form={value}")
        assert code == 400
        shown = re.search(r'<div class="error" id="answer-error">([^<]*)</div>', body)
        assert shown and shown.group(1) == (f"held: answer: the answer is {defaults.MAX_ANSWER_CHARS + 1} characters, "
                                            f"over {defaults.MAX_ANSWER_CHARS}")
        kept = body.split('id="answer-error"', 1)[1].split("</textarea>", 1)[0]
        assert kept.endswith(">" + "x" * (defaults.MAX_ANSWER_CHARS + 1))  # the person's text, to shorten
        assert snapshot(h, "held") == before

    def test_an_answer_already_given_is_refused_on_the_page(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """The page was opened, then `heartbeat answer` answered q1: the form's post is a 409 naming who did."""
        h, server = site
        action, value = form_of(server, "raced", "q1")
        r = h.cli("answer", "raced", "q1", "port 5432", "--by", "ana")
        assert r.returncode == 0, r.stderr
        before = snapshot(h, "raced")
        code, body, _ = post(server.url.rstrip("/") + action, "answer=late", f"form={value}")
        assert code == 409 and "raced: q1 was answered already, by person:ana" in body
        assert snapshot(h, "raced") == before and h.baton("raced").questions[0].answer == "port 5432"

    def test_an_unknown_qid_is_refused_on_the_page(self, site: tuple[DaemonHarness, WebServer]) -> None:
        """A form value for a question the task does not hold (one only the token's holder could make)
        is the CLI's line: no question 'q9' on this task."""
        h, server = site
        before = snapshot(h, "held")
        code, body, _ = post(server.at("tasks/held/questions/q9/answer"), "answer=x",
                             f"form={FormKey(TOKEN).value('held', 'q9')}")
        assert code == 400 and "held: qid: no question &#39;q9&#39; on this task (its questions: q1, q2)" in body
        assert snapshot(h, "held") == before


def test_a_unix_socket_page_answers_without_a_token(tmp_path: Path) -> None:
    """`heartbeat web --listen unix:PATH` (0600, no token): its form answers too (the same user's power as
    `heartbeat answer`), through the same anti-forgery and origin checks."""
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path)
    h.new("sock")
    ask(h, "sock")
    socket_path = tmp_path / "web.sock"
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--config", str(h.config), "web",
                             "--listen", f"unix:{socket_path}"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=h.env())
    try:
        assert proc.stderr is not None and "serving" in proc.stderr.readline()
        unix = ("--unix-socket", str(socket_path))
        code, body, _ = curl(*unix, "http://localhost/tasks/sock")
        assert code == 200
        value = re.search(r'name="form" value="([0-9a-f]+)"', body)
        assert value
        form = "Content-Type: application/x-www-form-urlencoded"
        refused = post("http://localhost/tasks/sock/questions/q1/answer", "answer=x", f"form={value.group(1)}",
                       headers=(form, "Origin: http://evil.example"), extra=unix)
        assert refused[0] == 403 and h.baton("sock").questions[0].open
        code, _, headers = post("http://localhost/tasks/sock/questions/q1/answer", "answer=over the socket",
                                f"form={value.group(1)}", headers=(form, "Origin: http://localhost"), extra=unix)
        assert code == 303 and headers["location"] == "/tasks/sock#q1"
        assert h.baton("sock").questions[0].answer == "over the socket"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_daemons_own_page_answers_and_the_daemon_dispatches(tmp_path: Path) -> None:
    """`[http] listen` inside `heartbeat run`: its page's form answers from the server's thread, on the
    daemon's store, and the daemon, seeing the gate lifted, dispatches the task's next agent."""
    tmp_path.chmod(0o700)
    h = DaemonHarness(tmp_path, extra=f'\n[http]\nlisten = "127.0.0.1:0"\ntoken = "{TOKEN}"\n')
    try:
        h.new("held", plan=1)
        h.new("free", plan=1)
        ask(h, "held")
        h.start()
        served = h.wait_log(lambda e: e.get("event") == "http_serving", "the daemon's [http] server")
        page = Scenario(h, str(served["url"]))
        action, value = form_of(page, "held", "q1")
        h.wait(lambda: h.events("free", "dispatched"), "the daemon dispatching the task beside it")
        assert not h.events("held", "dispatched")  # held on its question meanwhile
        code, _, headers = post(page.url.rstrip("/") + action, "answer=Ship it.", f"form={value}",
                                headers=("Content-Type: application/x-www-form-urlencoded",
                                         f"Origin: {page.url.rstrip('/')}", "Sec-Fetch-Site: same-origin"))
        assert code == 303 and headers["location"] == f"/tasks/held?token={TOKEN}#q1"
        assert h.baton("held").questions[0].answered_by == "person:web"
        h.wait(lambda: h.events("held", "dispatched"), "the daemon dispatching the answered task", timeout=30)
    finally:
        h.close()
