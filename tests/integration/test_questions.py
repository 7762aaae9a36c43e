"""Questions across the seam, the library: ask, answer, the question gate, sending, escalating."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from heartbeat.model.baton import GateKind, Owner, QuestionTo, Status, dump_baton, parse_baton
from heartbeat.model.errors import BadInput, Conflict, NotActive
from heartbeat.model.ledger import EventKind
from heartbeat.store.files import FileStore
from heartbeat.store.memory import MemoryStore
from heartbeat.tasks import questions as qs
from heartbeat.tasks import verbs as tasks

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


@pytest.fixture
def store() -> MemoryStore:
    """An upstream ``build`` and its downstream ``critic``, claimed at epoch 1 (its agent runs)."""
    s = MemoryStore()
    tasks.new_task(s, "build", task="Build it", step="build", owner=Owner(pid=1), now=T0)
    tasks.new_task(s, "critic", task="Review it", step="review", now=T0)
    with s.edit("critic") as ed:
        ed.baton.after.append("build")
        ed.baton.meta.epoch = 1
    return s


class TestAsk:
    def test_ask_holds_the_task_on_its_question(self, store: MemoryStore) -> None:
        """The question lands in the baton and the task is blocked on question:q1, addressed to its one upstream."""
        qid = qs.ask(store, "critic", "Why sqlite?", epoch=1, now=T0)
        assert qid == "q1"
        baton = store.load("critic")
        assert baton.meta.status is Status.BLOCKED
        assert baton.meta.gate is not None and baton.meta.gate.spec() == "question:q1"
        (q,) = baton.questions
        assert (q.to, q.upstream, q.text, q.asked_at, q.epoch, q.sent_at) == (
            QuestionTo.UPSTREAM, "build", "Why sqlite?", T0, 1, None)
        assert baton.blocked_on == "waiting on q1 to build"
        kinds = [e.kind for e in store.ledger.events("critic")]
        assert kinds[-2:] == [EventKind.ASKED, EventKind.BLOCKED]

    def test_a_second_question_joins_the_gate(self, store: MemoryStore) -> None:
        """A task already waiting on q1 may ask q2; the gate then names both."""
        qs.ask(store, "critic", "one?", epoch=1, now=T0)
        assert qs.ask(store, "critic", "two?", to="person", epoch=1, now=T0) == "q2"
        baton = store.load("critic")
        assert baton.meta.gate is not None and baton.meta.gate.target == "q1,q2"
        assert baton.blocked_on == "waiting on q1, q2 to a person, build"

    def test_the_default_is_a_person_without_exactly_one_upstream(self, store: MemoryStore) -> None:
        """A task with no upstream asks a person by default."""
        qs.ask(store, "build", "Which port?", epoch=1, now=T0)
        (q,) = store.load("build").questions
        assert (q.to, q.upstream) == (QuestionTo.PERSON, "")

    @pytest.mark.parametrize(("text", "to", "upstream", "says"), [
        ("", None, None, "empty"),
        ("   \n", None, None, "empty"),
        ("x" * 4001, None, None, "over 4000"),
        ("why\x1b[2J?", None, None, "control character"),
        ("nul\0", None, None, "control character"),
        ("ok?", "sideways", None, "use upstream or person"),
        ("ok?", "person", "build", "--upstream"),
        ("ok?", "upstream", "other", "not an upstream"),
    ])
    def test_bad_input_is_refused_and_nothing_written(self, store: MemoryStore, text: str, to: str | None,
                                                      upstream: str | None, says: str) -> None:
        """Empty, huge, control characters, an unknown addressee: one line, the baton unchanged."""
        before = dump_baton(store.load("critic"))
        with pytest.raises(BadInput, match=says):
            qs.ask(store, "critic", text, to=to, upstream=upstream, epoch=1, now=T0)
        assert dump_baton(store.load("critic")) == before

    def test_to_upstream_without_one_is_refused(self, store: MemoryStore) -> None:
        """`--to upstream` on a task with no upstream is refused in one line."""
        with pytest.raises(BadInput, match="no upstream"):
            qs.ask(store, "build", "why?", to="upstream", epoch=1, now=T0)

    def test_several_upstreams_need_one_named(self, store: MemoryStore) -> None:
        """With two upstreams, `--to upstream` names one; the default is a person."""
        tasks.new_task(store, "spec", task="Spec", step="s", now=T0)
        with store.edit("critic") as ed:
            ed.baton.after.append("spec")
        with pytest.raises(BadInput, match="name one"):
            qs.ask(store, "critic", "why?", to="upstream", epoch=1, now=T0)
        assert qs.ask(store, "critic", "why?", to="upstream", upstream="spec", epoch=1, now=T0) == "q1"
        assert store.load("critic").questions[0].upstream == "spec"

    def test_a_superseded_epoch_is_refused(self, store: MemoryStore) -> None:
        """The asker's write is fenced by its epoch like every write."""
        with pytest.raises(Conflict, match="superseded"):
            qs.ask(store, "critic", "why?", epoch=0, now=T0)
        assert store.load("critic").questions == []

    def test_a_task_blocked_on_something_else_does_not_ask(self, store: MemoryStore) -> None:
        """A task held on a person's gate is not re-gated by a question."""
        from heartbeat.model.baton import Gate

        tasks.block(store, "critic", "needs a key", Gate(GateKind.HUMAN))
        with pytest.raises(NotActive, match="blocked"):
            qs.ask(store, "critic", "why?", now=T0)


class TestAnswer:
    def test_a_persons_answer_lifts_the_gate(self, store: MemoryStore) -> None:
        """The answer lands in the baton, the gate clears, `answered` carries wait_s."""
        qs.ask(store, "critic", "Why sqlite?", to="person", epoch=1, now=T0)
        qs.answer(store, "critic", "q1", "One file, no server.", by="person:ana", now=T0 + timedelta(minutes=12))
        baton = store.load("critic")
        assert baton.meta.status is Status.ACTIVE and baton.meta.gate is None and baton.blocked_on == ""
        (q,) = baton.questions
        assert (q.answer, q.answered_by, q.answered_at) == ("One file, no server.", "person:ana",
                                                           T0 + timedelta(minutes=12))
        answered = store.ledger.events("critic", kinds=[EventKind.ANSWERED])[-1]
        assert answered.data["wait_s"] == 720.0 and answered.data["qid"] == "q1"
        assert store.ledger.events("critic")[-1].kind == EventKind.UNBLOCKED

    def test_the_gate_waits_for_every_question(self, store: MemoryStore) -> None:
        """With q1 and q2 open, answering q1 keeps the task held."""
        qs.ask(store, "critic", "one?", epoch=1, now=T0)
        qs.ask(store, "critic", "two?", to="person", epoch=1, now=T0)
        qs.answer(store, "critic", "q2", "yes", by="person", now=T0)
        assert store.load("critic").meta.status is Status.BLOCKED
        qs.answer(store, "critic", "q1", "because", by="upstream:build", now=T0)
        assert store.load("critic").meta.status is Status.ACTIVE

    def test_twice_and_unknown_are_refused(self, store: MemoryStore) -> None:
        """Answering twice is a conflict, an unknown qid bad input; nothing is written either way."""
        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        qs.answer(store, "critic", "q1", "because", by="person", now=T0)
        before = dump_baton(store.load("critic"))
        with pytest.raises(Conflict, match="answered already"):
            qs.answer(store, "critic", "q1", "again", by="person", now=T0)
        with pytest.raises(BadInput, match="no question 'q9'"):
            qs.answer(store, "critic", "q9", "huh", by="person", now=T0)
        assert dump_baton(store.load("critic")) == before

    def test_only_the_asked_upstream_answers(self, store: MemoryStore) -> None:
        """The upstream's agent, fenced by its own epoch, answers; another task's or a stale epoch does not."""
        tasks.new_task(store, "other", task="x", step="x", owner=Owner(pid=2), now=T0)
        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        with pytest.raises(BadInput, match="not of 'other'"):
            qs.answer(store, "critic", "q1", "me!", by="upstream:other", epoch=1, now=T0)
        with pytest.raises(Conflict, match="superseded"):
            qs.answer(store, "critic", "q1", "stale", by="upstream:build", epoch=0, now=T0)
        with pytest.raises(BadInput, match="fences an upstream"):
            qs.answer(store, "critic", "q1", "x", by="person", epoch=1, now=T0)
        qs.answer(store, "critic", "q1", "because", by="upstream:build", epoch=1, now=T0)
        assert store.load("critic").questions[0].answered_by == "upstream:build"

    @pytest.mark.parametrize("by", ["", "nobody", "person:", "upstream:Bad Id", "person:a\nb"])
    def test_bad_answerer_is_refused(self, store: MemoryStore, by: str) -> None:
        """`by` is person, person:NAME or upstream:ID."""
        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        with pytest.raises(BadInput, match="answered by"):
            qs.answer(store, "critic", "q1", "x", by=by, now=T0)


class TestDaemonSide:
    def test_pending_upstream_and_mark_sent(self, store: MemoryStore) -> None:
        """A question to an upstream is pending until sent; sending twice is a conflict."""
        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        qs.ask(store, "critic", "who?", to="person", epoch=1, now=T0)
        pending = qs.pending_upstream(store.load(i) for i in ("build", "critic"))
        assert [(a, q.id) for a, q in pending] == [("critic", "q1")]
        qs.mark_sent(store, "critic", "q1", now=T0 + timedelta(seconds=1))
        assert store.load("critic").questions[0].sent_at == T0 + timedelta(seconds=1)
        assert qs.pending_upstream([store.load("critic")]) == []
        with pytest.raises(Conflict, match="already"):
            qs.mark_sent(store, "critic", "q1", now=T0)

    def test_escalate_readdresses_to_a_person(self, store: MemoryStore) -> None:
        """An overdue question escalates once: to a person, its upstream kept, the event recorded."""
        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        assert qs.overdue([store.load("critic")], T0 + timedelta(minutes=29), 1800) == []
        (due,) = qs.overdue([store.load("critic")], T0 + timedelta(minutes=30), 1800)
        assert qs.escalate(store, "critic", due[1].id, now=T0 + timedelta(minutes=30))
        assert not qs.escalate(store, "critic", "q1", now=T0 + timedelta(minutes=31))
        baton = store.load("critic")
        (q,) = baton.questions
        assert (q.to, q.upstream, q.escalated_at) == (QuestionTo.PERSON, "build", T0 + timedelta(minutes=30))
        waiting = qs.waiting_on(baton)
        assert waiting is not None and waiting.describe(T0 + timedelta(minutes=42)) == \
            "waiting on q1 to build, 42m, escalated to a person"
        assert len(store.ledger.events("critic", kinds=[EventKind.QUESTION_ESCALATED])) == 1
        assert qs.overdue([baton], T0 + timedelta(hours=2), 1800) == []


class TestBatonShape:
    def test_questions_round_trip_on_a_file_store(self, tmp_path: Path) -> None:
        """The [[questions]] table reads back equal, unknown keys in a question kept."""
        s = FileStore(str(tmp_path))
        tasks.new_task(s, "solo", task="t", step="s", now=T0)
        qs.ask(s, "solo", "multi\nline\tquestion?", now=T0)
        with s.edit("solo") as ed:
            ed.baton.questions[0].extra["note"] = "kept"
        qs.answer(s, "solo", "q1", "yes", by="person", now=T0 + timedelta(seconds=5))
        text = (tmp_path / "batons" / "solo.toml").read_text()
        assert "[[questions]]" in text
        again = parse_baton(text, path="solo.toml")
        assert again.questions[0].extra == {"note": "kept"} and again.questions[0].text == "multi\nline\tquestion?"
        assert dump_baton(again) == text
        s.close()

    def test_a_baton_without_questions_writes_none(self, store: MemoryStore) -> None:
        """Older batons read and write as before: no questions key."""
        assert "questions" not in store.load("build").to_dict()

    @pytest.mark.parametrize(("table", "says"), [
        ('id = "x1"\nto = "person"\ntext = "t"\nasked_at = 2026-12-02T06:00:00Z', "bad question id"),
        ('id = "q1"\nto = "them"\ntext = "t"\nasked_at = 2026-12-02T06:00:00Z', "upstream or person"),
        ('id = "q1"\nto = "upstream"\ntext = "t"\nasked_at = 2026-12-02T06:00:00Z', "names it"),
        ('id = "q1"\nto = "person"\ntext = "t"', "asked_at"),
        ('id = "q1"\nto = "person"\ntext = "t"\nasked_at = 2026-12-02T06:00:00Z\nanswer = "a"', "come together"),
    ])
    def test_invalid_questions_name_the_field(self, table: str, says: str) -> None:
        """A hand-written bad question fails naming questions[0].FIELD."""
        from heartbeat.model.errors import InvalidBaton

        text = f'task = "t"\nstep = "s"\n[[questions]]\n{table}\n[meta]\nid = "x"\n'
        with pytest.raises(InvalidBaton, match=says) as info:
            parse_baton(text, path="x.toml")
        assert "questions[0]" in str(info.value)


@pytest.fixture
def hb(cli):  # type: ignore[no-untyped-def]
    """CLI behaviour runs in this process (tests/support/inprocess_cli.py)."""
    return cli


AGENT = {"HEARTBEAT_TASK": "critic", "HEARTBEAT_EPOCH": "1"}
UP_AGENT = {"HEARTBEAT_TASK": "build", "HEARTBEAT_EPOCH": "1"}


@pytest.fixture
def seam(state_dir: Path, hb) -> FileStore:  # type: ignore[no-untyped-def]
    """build (claimed, epoch 1) → critic, let go and held by its agent at epoch 1, through the real CLI."""
    assert hb("new", "build", "--task", "Build it", "--step", "build", "--claim").code == 0
    assert hb("new", "critic", "--task", "Review it", "--step", "review", "--after", "build").code == 0
    s = FileStore(str(state_dir))
    with s.edit("critic") as ed:  # what the daemon's dispatch leaves: active, epoch 1
        ed.baton.meta.status, ed.baton.meta.gate, ed.baton.blocked_on = Status.ACTIVE, None, ""
        ed.baton.meta.epoch = 1
    return s


def _one_line(result, code: int, says: str) -> None:  # type: ignore[no-untyped-def]
    assert result.code == code, result
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.err


class TestCli:
    def test_ask_prints_the_id_alone_and_answer_lifts_it(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """`ask` prints q1 alone on stdout, exit 0; `answer` by a person lands it and clears the gate."""
        asked = hb("ask", "critic", "Why sqlite?", env=AGENT)
        assert (asked.code, asked.out, asked.err) == (0, "q1\n", "")
        assert seam.load("critic").meta.gate.spec() == "question:q1"  # type: ignore[union-attr]
        done = hb("answer", "critic", "q1", "One file.", "--by", "ana")
        assert (done.code, done.err) == (0, "")
        baton = seam.load("critic")
        assert baton.meta.status is Status.ACTIVE and baton.questions[0].answered_by == "person:ana"

    def test_bad_input_is_one_line_and_writes_nothing(self, seam: FileStore, hb, state_dir: Path) -> None:  # type: ignore[no-untyped-def]
        """Empty, huge, control characters, an unknown task, --to upstream without one: one line, no write."""
        before = (state_dir / "batons" / "critic.toml").read_bytes()
        _one_line(hb("ask", "critic", "", env=AGENT), 2, "empty")
        _one_line(hb("ask", "critic", "x" * 5000, env=AGENT), 2, "over 4000")
        _one_line(hb("ask", "critic", "a\x07b", env=AGENT), 2, "control character")
        _one_line(hb("ask", "nope", "why?"), 1, "no such task")
        _one_line(hb("ask", "build", "why?", "--to", "upstream", env=UP_AGENT), 2, "no upstream")
        _one_line(hb("ask", "critic", "why?", "--to", "sideways", env=AGENT), 2, "invalid choice")
        assert (state_dir / "batons" / "critic.toml").read_bytes() == before

    def test_an_agent_asks_only_for_its_own_task(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """The upstream's agent cannot ask on the downstream's behalf; a superseded epoch is refused."""
        _one_line(hb("ask", "critic", "why?", env=UP_AGENT), 2, "launched for task 'build'")
        _one_line(hb("ask", "critic", "why?", env={**AGENT, "HEARTBEAT_EPOCH": "0"}), 5, "superseded")
        assert seam.load("critic").questions == []

    def test_the_upstreams_agent_answers_and_no_other(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """The agent of the upstream asked answers as upstream:build; the asker's own agent, another
        task's agent, a stale upstream epoch and a person posing as the upstream are refused."""
        assert hb("new", "other", "--task", "x", "--step", "x", "--claim").code == 0
        assert hb("ask", "critic", "Why sqlite?", env=AGENT).out == "q1\n"
        _one_line(hb("answer", "critic", "q1", "me", env=AGENT), 2, "asked of build, not of 'critic'")
        _one_line(hb("answer", "critic", "q1", "me", env={"HEARTBEAT_TASK": "other", "HEARTBEAT_EPOCH": "1"}), 2,
                  "not of 'other'")
        _one_line(hb("answer", "critic", "q1", "me", "--by", "upstream:build"), 2, "own agent")
        _one_line(hb("answer", "critic", "q1", "old", env={**UP_AGENT, "HEARTBEAT_EPOCH": "0"}), 5, "superseded")
        assert seam.load("critic").questions[0].open
        assert hb("answer", "critic", "q1", "One file, no server.", env=UP_AGENT).code == 0
        assert seam.load("critic").questions[0].answered_by == "upstream:build"

    def test_twice_and_unknown_qid(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """Answering twice and an unknown QID are one-line refusals."""
        hb("ask", "critic", "why?", env=AGENT)
        assert hb("answer", "critic", "q1", "because").code == 0
        _one_line(hb("answer", "critic", "q1", "again"), 5, "answered already")
        _one_line(hb("answer", "critic", "q7", "huh"), 2, "no question 'q7'")


class TestDaemon:
    """An in-process daemon ticked with an explicit `now`."""

    @pytest.fixture
    def daemon(self, tmp_path: Path):  # type: ignore[no-untyped-def]
        from daemon_harness import NULL_AGENT, in_process_config

        from heartbeat.daemon import Daemon

        notes = tmp_path / "notified"
        notify = (f'\n[notify.ops]\ncommand = ["sh", "-c", "printf \'%s|%s\\\\n\' \\"$0\\" \\"$1\\" >> {notes}", '
                  f'"{{id}}", "{{reason}}"]\n')
        state, config = in_process_config(tmp_path, daemon='question_wait = "30m"', launchers=NULL_AGENT + notify)
        # A dry run resumes no upstream session: the question stays with build, as one whose answering
        # run is slow (a real daemon gives a question build's null launcher cannot answer to a person
        # at once: tests/integration/test_answer_runs.py::TestToAPerson).
        d = Daemon(config, store=FileStore(str(state)), dry_run=True)
        d.notes = notes  # type: ignore[attr-defined]
        yield d
        d.shutdown(timeout=5)

    def _asked(self, d) -> None:  # type: ignore[no-untyped-def]
        """build done, critic dispatched after it (epoch 1) and asking build why."""
        tasks.new_task(d.store, "build", task="Build it", step="build", now=T0)
        tasks.finish(d.store, "build", checks={})
        tasks.new_task(d.store, "critic", task="Review it", step="review", after=["build"], now=T0)
        with d.store.edit("critic") as ed:
            ed.baton.meta.status, ed.baton.meta.gate, ed.baton.blocked_on = Status.ACTIVE, None, ""
            ed.baton.meta.epoch = 1
        qs.ask(d.store, "critic", "Why sqlite?", epoch=1, now=T0)

    def test_a_held_task_is_not_dispatched_until_answered(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """Blocked on its question the task waits; answered, the next tick dispatches it."""
        from conftest import wait_for

        self._asked(daemon)
        daemon.tick(now=T0 + timedelta(seconds=1))
        assert not daemon.store.ledger.events("critic", kinds=[EventKind.DISPATCHED])
        qs.answer(daemon.store, "critic", "q1", "One file.", by="person", now=T0 + timedelta(seconds=2))
        daemon.tick(now=T0 + timedelta(seconds=3))
        wait_for(lambda: daemon.store.ledger.events("critic", kinds=[EventKind.DISPATCHED]), message="dispatch")

    def test_an_answer_written_by_hand_opens_the_gate(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """The daemon's gate sees an answer that came without `answer` (a hand edit) and lifts the gate."""
        self._asked(daemon)
        with daemon.store.edit("critic") as ed:
            q = ed.baton.questions[0]
            q.answer, q.answered_by, q.answered_at = "by hand", "person", T0
        daemon.tick(now=T0 + timedelta(seconds=3))
        unblocked = daemon.store.ledger.events("critic", kinds=[EventKind.UNBLOCKED])
        assert unblocked and unblocked[-1].data["gate"] == "question:q1"

    def test_an_unanswered_question_escalates_once(self, daemon) -> None:  # type: ignore[no-untyped-def]
        """Past question_wait: question_escalated, re-addressed to a person, the notifier run once."""
        from conftest import wait_for

        self._asked(daemon)
        daemon.tick(now=T0 + timedelta(minutes=29))
        assert not daemon.store.ledger.events("critic", kinds=[EventKind.QUESTION_ESCALATED])
        daemon.tick(now=T0 + timedelta(minutes=30))
        daemon.tick(now=T0 + timedelta(minutes=31))
        (event,) = daemon.store.ledger.events("critic", kinds=[EventKind.QUESTION_ESCALATED])
        assert event.data["qid"] == "q1" and event.data["upstream"] == "build"
        q = daemon.store.load("critic").questions[0]
        assert q.to is QuestionTo.PERSON and q.escalated_at == T0 + timedelta(minutes=30)
        assert daemon.store.load("critic").meta.status is Status.BLOCKED
        notes = wait_for(lambda: daemon.notes.exists() and daemon.notes.read_text(), message="the notifier")
        assert notes == "critic|question q1 to build unanswered for 30m: Why sqlite?\n"

    def test_question_wait_zero_never_escalates(self, tmp_path: Path) -> None:
        """question_wait = "0s" turns escalation off."""
        from daemon_harness import in_process_config

        from heartbeat.daemon import Daemon

        state, config = in_process_config(tmp_path, daemon='question_wait = "0s"')
        d = Daemon(config, store=FileStore(str(state)), dry_run=True)  # (no upstream session resumed: as above)
        try:
            self._asked(d)
            d.tick(now=T0 + timedelta(days=3))
            assert not d.store.ledger.events("critic", kinds=[EventKind.QUESTION_ESCALATED])
        finally:
            d.shutdown(timeout=5)


class TestWherePeopleAndAgentsLook:
    def test_status_shows_the_wait_with_its_age(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """`status` says "waiting on q1 to build, Nm"; `--json` lists the open question."""
        with seam.edit("critic") as ed:
            ed.baton.after = ["build"]
        hb("ask", "critic", "Why sqlite?", env=AGENT)
        with seam.edit("critic") as ed:  # asked twelve minutes ago
            ed.baton.questions[0].asked_at -= timedelta(minutes=12)
        text = hb("status").out
        (line,) = [line for line in text.splitlines() if "critic" in line]
        assert "blocked" in line and "[waiting on q1 to build, 12m" in line, text
        import json

        rows = {r["id"]: r for r in json.loads(hb("status", "--json").out)["tasks"]}
        (q,) = rows["critic"]["questions"]
        assert (q["id"], q["upstream"], q["waiting"], q["escalated"]) == ("q1", "build", True, False)
        assert rows["critic"]["why"].startswith("waiting on q1 to build, 12m")

    def test_show_lists_the_questions(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """`show` (TOML and --json) holds every question with its answer."""
        import json

        hb("ask", "critic", "Why sqlite?", env=AGENT)
        hb("answer", "critic", "q1", "One file.")
        assert '[[questions]]\nid = "q1"' in hb("show", "critic").out
        (q,) = json.loads(hb("show", "critic", "--json").out)["questions"]
        assert (q["text"], q["answer"], q["answered_by"]) == ("Why sqlite?", "One file.", "person")

    def test_the_next_brief_carries_the_exchange(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """The asker's brief says what it asked and what came back, and offers `heartbeat ask`."""
        hb("ask", "critic", "Why sqlite and not postgres?", env=AGENT)
        hb("ask", "critic", "Who owns the schema?", "--to", "person", env=AGENT)
        hb("answer", "critic", "q1", "One file, no server to run.", env=UP_AGENT)
        brief = hb("brief", "critic").out
        assert "## Questions you asked across the seam" in brief
        assert "- You asked build (q1): Why sqlite and not postgres? - build answered: One file, no server to run." \
            in brief
        assert "- You asked a person (q2): Who owns the schema? - not answered yet (waiting on a person)" in brief
        assert '`heartbeat ask critic "..."`' in brief

    def test_the_hooks_context_carries_it_too(self, seam: FileStore) -> None:
        """SessionStart's (and compaction's) context holds the exchange and the `ask` command, even when cut short."""
        from heartbeat.integrations.hooks import session_context

        qs.ask(seam, "critic", "Why sqlite?", epoch=1)
        qs.answer(seam, "critic", "q1", "One file.", by="upstream:build")
        with seam.edit("critic") as ed:
            ed.baton.done = [f"step {i} " + "x" * 300 for i in range(40)]  # more than the hook's budget
        text = session_context(seam.load("critic"), "compact", {})
        assert "You asked build (q1): Why sqlite? - build answered: One file." in text
        assert '`heartbeat ask critic "..."`' in text


def _page(store: FileStore, state_dir: Path, path: str) -> tuple[int, str]:
    """GET ``path`` from the status page's ASGI app in this process (no server, no browser)."""
    import asyncio

    from heartbeat.web.app import build_app

    app = build_app(store, state_dir=str(state_dir))
    sent: list[dict] = []  # type: ignore[type-arg]

    async def receive() -> dict:  # type: ignore[type-arg]
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:  # type: ignore[type-arg]
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"localhost")], "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "",
             "http_version": "1.1", "client": ("127.0.0.1", 1)}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body.decode()


class TestPage:
    def test_the_list_shows_open_questions_with_the_answer_command(self, seam: FileStore, hb,  # type: ignore[no-untyped-def]
                                                                   state_dir: Path) -> None:
        """/ lists each open question (hostile text escaped) with `heartbeat answer ...`; the task row says it waits."""
        hb("ask", "critic", "<script>alert(1)</script> why?", env=AGENT)
        status, html = _page(seam, state_dir, "/")
        assert status == 200
        block = html.split('<table id="questions">', 1)[1].split("</table>", 1)[0]
        assert 'data-task="critic" data-qid="q1"' in block
        assert "&lt;script&gt;alert(1)&lt;/script&gt; why?" in block and "<script>alert" not in html
        assert 'heartbeat answer critic q1 &#34;...&#34;' in block or 'heartbeat answer critic q1 "..."' in block
        assert '<span class="asking">waiting on q1 to build, ' in html

    def test_escalated_and_answered_on_the_task_page(self, seam: FileStore, hb,  # type: ignore[no-untyped-def]
                                                     state_dir: Path) -> None:
        """/tasks/ID lists its questions: an escalated one badged, an answered one with its answer and who gave it."""
        hb("ask", "critic", "Why sqlite?", env=AGENT)
        hb("ask", "critic", "Who owns it?", "--to", "person", env=AGENT)
        qs.escalate(seam, "critic", "q1")
        hb("answer", "critic", "q2", "Ana does.", "--by", "ana")
        status, html = _page(seam, state_dir, "/tasks/critic")
        assert status == 200
        block = html.split('<table id="questions">', 1)[1].split("</table>", 1)[0]
        q1 = block.split('data-qid="q1"', 1)[1].split("</tr>", 1)[0]
        q2 = block.split('data-qid="q2"', 1)[1].split("</tr>", 1)[0]
        assert 'data-state="escalated"' in q1 and "heartbeat answer critic q1" in q1
        assert "Ana does." in q2 and "person:ana" in q2
        status, listing = _page(seam, state_dir, "/")
        assert 'data-state="escalated">escalated</span>' in listing.split('<table id="questions">', 1)[1]


class TestMeasured:
    def test_report_edges_counts_questions_and_time_to_answer(self, seam: FileStore, hb) -> None:  # type: ignore[no-untyped-def]
        """report --edges: asked, answered, escalated and the mean time to answer on the build -> critic edge."""
        import json

        with seam.edit("critic") as ed:
            ed.baton.after = ["build"]
        qs.ask(seam, "critic", "one?", epoch=1, now=T0)
        qs.ask(seam, "critic", "two?", epoch=1, now=T0)
        qs.ask(seam, "critic", "three?", epoch=1, now=T0)
        qs.answer(seam, "critic", "q1", "a", by="upstream:build", now=T0 + timedelta(seconds=60))
        qs.answer(seam, "critic", "q2", "b", by="person", now=T0 + timedelta(seconds=180))
        qs.escalate(seam, "critic", "q3", now=T0 + timedelta(minutes=30))
        r = hb("report", "--edges", "--json")
        assert r.code == 0, r.err
        (edge,) = json.loads(r.out)["edges"]
        assert (edge["asked"], edge["answered"], edge["escalated"], edge["time_to_answer_s"]) == (3, 2, 1, 120.0)
        text = hb("report", "--edges").out
        assert "ASKED" in text and "TO-ANSWER" in text and "120.0s" in text

    def test_the_metrics_count_questions(self, seam: FileStore, state_dir: Path) -> None:
        """/metrics: heartbeat_questions_{asked,answered,escalated}_total from the ledger."""
        from prometheus_client.parser import text_string_to_metric_families

        qs.ask(seam, "critic", "one?", epoch=1, now=T0)
        qs.ask(seam, "critic", "two?", epoch=1, now=T0)
        qs.answer(seam, "critic", "q1", "a", by="person", now=T0)
        qs.escalate(seam, "critic", "q2", now=T0)
        status, text = _page(seam, state_dir, "/metrics")
        assert status == 200
        found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert (found["heartbeat_questions_asked_total"], found["heartbeat_questions_answered_total"],
                found["heartbeat_questions_escalated_total"]) == (2, 1, 1)


class TestRaces:
    def test_a_block_over_an_open_question_is_refused(self, store: MemoryStore) -> None:
        """`block` would swap the question gate for another and the answer would lift nothing: refused."""
        from heartbeat.model.baton import Gate

        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        with pytest.raises(NotActive, match="waits on its question q1"):
            tasks.block(store, "critic", "stuck", Gate(GateKind.HUMAN), epoch=1)
        assert store.load("critic").meta.gate.spec() == "question:q1"  # type: ignore[union-attr]

    def test_a_person_unblocking_leaves_the_question_answerable(self, store: MemoryStore) -> None:
        """A person lifts the wait by hand; the question stays open and its later answer lands without re-gating."""
        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        tasks.unblock(store, "critic", by="ana")
        assert store.load("critic").meta.status is Status.ACTIVE
        qs.answer(store, "critic", "q1", "because", by="person", now=T0)
        baton = store.load("critic")
        assert baton.meta.status is Status.ACTIVE and baton.questions[0].answer == "because"

    def test_answer_and_escalation_racing(self, store: MemoryStore) -> None:
        """An escalation after the answer writes nothing; an answer after the escalation lands."""
        qs.ask(store, "critic", "one?", epoch=1, now=T0)
        qs.ask(store, "critic", "two?", epoch=1, now=T0)
        qs.answer(store, "critic", "q1", "a", by="person", now=T0)
        rev = store.load("critic").meta.revision
        assert not qs.escalate(store, "critic", "q1", now=T0)
        assert store.load("critic").meta.revision == rev
        assert qs.escalate(store, "critic", "q2", now=T0)
        qs.answer(store, "critic", "q2", "b", by="upstream:build", now=T0)  # the upstream may still answer
        assert store.load("critic").meta.status is Status.ACTIVE


class TestBriefBounds:
    def test_a_long_answer_is_capped_in_the_brief_with_a_pointer(self, store: MemoryStore) -> None:
        """A 10,000-character answer takes QUESTION_BRIEF_CHARS of the brief and points at `show` for the rest."""
        from heartbeat.model import defaults
        from heartbeat.reports.brief import render_brief

        qs.ask(store, "critic", "why?", epoch=1, now=T0)
        qs.answer(store, "critic", "q1", "y" * 10_000, by="person", now=T0)
        text = render_brief(store.load("critic")).text
        line = next(x for x in text.splitlines() if x.startswith("- You asked build (q1)"))
        assert line.count("y") == defaults.QUESTION_BRIEF_CHARS + line.count("y", 0, line.index("answered"))
        assert line.endswith("... (the rest: `heartbeat show critic`)")
