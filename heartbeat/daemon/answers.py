"""Questions across the seam, the daemon's side: an upstream's recorded session answers a downstream.

A task that asks its upstream (``heartbeat ask DOWN "..." --to upstream``) waits on a ``question:``
gate. Each pass, for every question addressed to an upstream, not answered and not sent
(:func:`heartbeat.tasks.questions.pending_upstream`), the daemon resumes the upstream's recorded
session (its baton's ``meta.session``) through the upstream's launcher, with the question as the
prompt: claude ``--resume ID``, codex ``exec resume ID -``. The run is of its own kind:

- **not a dispatch**: the upstream's status, epoch, attempt, owner and done state are not
  written; its ledger gets ``answer_started`` and, at the end, ``answer_run`` with the outcome.
  The run's files are ``logs/<UP>/answer.<DOWN>.<QID>.*``.
- **once**: the question is marked sent (:func:`heartbeat.tasks.questions.mark_sent`, under the
  asker's baton lock, refused when sent already) before anything starts, so two ticks or two
  daemons on a shared store start one run. On a shared store only the host whose daemon
  dispatched the upstream last starts it: the session's files live on that host.
- **bounded**: stopped past ``min(ANSWER_MAX_RUNTIME, the launcher's max_runtime)`` or when its
  output is silent for ``ANSWER_HANG``; admitted within ``max_concurrent``.
- **its outcome**: a session that ran ``heartbeat answer DOWN QID "..."`` answered already;
  otherwise its final text (claude's ``result``, codex's last agent message) becomes the answer,
  ``answered_by = "upstream:UP"``. A run that fails, is stopped, is lost, or has no session to
  resume re-addresses the question to a person at once (escalated, a ``question_readdressed`` event
  with the one-line reason, the ``[notify.*]`` commands run).

The resumed session is bound to its done task (``HEARTBEAT_TASK``, its epoch): the rail refuses
every tool call but heartbeat's own commands, and ``heartbeat answer`` for this question is the
one cross-task write its fence lets through.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from heartbeat.daemon.act import Actor
from heartbeat.daemon.leased import LeasePart
from heartbeat.daemon.shared import Shared
from heartbeat.launchers.base import ExitStatus, read_exit_file
from heartbeat.model import defaults
from heartbeat.model.baton import QID_PATTERN, Baton, GateKind, Owner, Question, QuestionTo, Status
from heartbeat.model.errors import BadInput, Conflict, HeartbeatError, NotFound
from heartbeat.model.ledger import Event, EventKind
from heartbeat.store.base import Entry
from heartbeat.tasks import questions as qs

__all__ = ["AnswerPart", "AnswerRun", "RESUMABLE_PRESETS", "answer_prompt", "answer_allow_rules"]

RESUMABLE_PRESETS = frozenset({"claude-code", "codex"})
"""The presets whose recorded session the daemon resumes to answer a question."""


def answer_prompt(upstream: str, asker: str, question: Question, *, prefix: str = "heartbeat") -> str:
    """The prompt of the upstream's resumed session: who asks what, and how to answer."""
    quoted = "\n".join(f"> {line}" for line in question.text.splitlines() or [""])
    return (
        f"heartbeat: task {asker!r}, which comes after your task {upstream!r}, asks you a question "
        f"({question.id}):\n\n{quoted}\n\n"
        f"Your task {upstream!r} is done: answer from what you did and decided in this session; do not redo "
        "or change any work (heartbeat refuses every other tool call of a done task). Answer with\n\n"
        f"    {prefix} answer {asker} {question.id} \"YOUR ANSWER\"\n\n"
        "(one plain command: the rail refuses one holding ; & | $ ` ( ) { } < > or a newline, even in quotes), "
        f"or end your turn with the answer as your last message: heartbeat hands it to {asker!r}.\n"
    )


def answer_allow_rules(asker: str, qid: str, *, prefix: str = "heartbeat") -> tuple[str, ...]:
    """The one permission rule claude's run adds: ``heartbeat answer ASKER QID``, nothing else."""
    return (f"Bash({prefix} answer {asker} {qid}:*)",)


@dataclass(slots=True)
class AnswerRun:
    """One answering run under way on this host (under the look lock)."""

    asker: str
    qid: str
    upstream: str
    launcher: str
    session: str
    started: datetime
    owner: Owner | None
    log: str
    exit: str
    quiet_since: datetime
    log_size: int = -1
    stopping: bool = False
    stop_reason: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.asker, self.qid


class AnswerPart:
    """Starts, watches and settles the upstreams' answering runs (see the module docstring)."""

    def __init__(self, shared: Shared, lease: LeasePart | None, actor: Actor) -> None:
        self.shared = shared
        self.lease = lease
        self.actor = actor
        """Whose ``notify`` tells a person of a question given to them."""
        self.runs: dict[tuple[str, str], AnswerRun] = {}
        """Per (asker, qid): the run this daemon started and has not settled (under the look lock)."""
        self.askers: set[str] = set()
        """Tasks seen waiting on a question: looked at every pass until none of theirs is open."""
        self.deferred: dict[tuple[str, str], str] = {}
        """Per (asker, qid): why it was not sent yet (logged once)."""
        self._scanned = False
        """A pass has read the scan's batons: while the store says the scan is unchanged, no new
        asker can be in it, so a quiet pass walks no list of every task."""

    # -- the pass --------------------------------------------------------------------------

    def look(self, entries: Iterable[Entry], now: datetime) -> None:
        """One pass: the runs under way watched and settled, the questions waiting sent (or given to a person)."""
        if not (self._scanned and self.shared.store.scan_unchanged):
            self._scanned = True
            for entry in entries:
                gate = entry.baton.meta.gate if entry.baton is not None else None
                if gate is not None and gate.kind is GateKind.QUESTION:
                    self.askers.add(entry.id)
        for run in list(self.runs.values()):
            try:
                self.watch(run, now)
            except HeartbeatError as exc:  # the store out of reach: the next pass settles it
                self.shared.log.warning("answer_settle_deferred", task=run.asker, qid=run.qid, error=str(exc))
        for asker in sorted(self.askers):
            try:
                baton = self.shared.store.load(asker)
            except NotFound:
                self.askers.discard(asker)
                continue
            except HeartbeatError:
                continue
            if not qs.open_questions(baton):
                self.askers.discard(asker)
                continue
            for question in baton.questions:
                try:
                    self.consider(baton, question, now)
                except HeartbeatError as exc:
                    self.shared.log.warning("answer_deferred", task=asker, qid=question.id, error=str(exc))

    def consider(self, baton: Baton, question: Question, now: datetime) -> None:
        """One question of a waiting task: send it, or check on a sent one no run of ours watches."""
        if not question.open or question.to is not QuestionTo.UPSTREAM or baton.meta.status is Status.DONE:
            return
        if (baton.id, question.id) in self.runs:
            return
        if question.sent_at is None:
            self.send(baton, question, now)
        else:
            self.unwatched(baton, question, now)

    # -- sending -----------------------------------------------------------------------------

    def send(self, baton: Baton, question: Question, now: datetime) -> None:
        """Start the upstream's answering run for ``question`` (marked sent first), or give the
        question to a person when no session can answer it; nothing yet while the upstream runs."""
        sh = self.shared
        asker, qid, up_id = baton.id, question.id, question.upstream
        if sh.dry_run or not QID_PATTERN.fullmatch(qid):
            return
        try:
            up = sh.store.load(up_id)
        except NotFound:
            self.readdress(asker, qid, f"its upstream {up_id!r} is not in the store", now)
            return
        if up.meta.owner is not None or up.meta.status is Status.ACTIVE:
            self.defer(asker, qid, f"{up_id}'s own agent runs or is about to (its session is in use)")
            return
        name = up.launcher or sh.config.daemon.default_launcher
        lc = sh.config.launchers.get(name)
        launcher = sh.launchers.get(name)
        if lc is None or launcher is None or lc.preset not in RESUMABLE_PRESETS:
            self.readdress(asker, qid, f"{up_id}'s launcher {name!r} cannot resume a session "
                                       "(the claude-code and codex presets can)", now)
            return
        from heartbeat.presets.common import valid_session_id

        session = valid_session_id(up.meta.session)
        if not session:
            self.readdress(asker, qid, f"{up_id} recorded no session to resume", now)
            return
        if self.lease is not None:
            host = self._session_host(up_id)
            if host and host != sh.host:
                self.defer(asker, qid, f"{up_id}'s session lives on host {host}")
                return
        if len(sh.running) + len(self.runs) >= sh.config.daemon.max_concurrent:
            self.defer(asker, qid, "max_concurrent agents run already")
            return
        try:
            qs.mark_sent(sh.store, asker, qid, now=now)
        except Conflict:  # another look (a second daemon) sent it first: theirs is the run
            return
        self.deferred.pop((asker, qid), None)
        self.start(baton, question, up, lc, launcher, session, now)

    def start(self, baton: Baton, question: Question, up: Baton, lc: Any, launcher: Any, session: str,
              now: datetime) -> None:
        from heartbeat.launchers.base import LaunchRequest, write_private_file

        sh = self.shared
        asker, qid, up_id = baton.id, question.id, up.id
        layout = sh.layout
        prompt = answer_prompt(up_id, asker, question)
        req = LaunchRequest(
            task_id=up_id, epoch=up.meta.epoch, attempt=up.meta.attempt,
            workdir=up.workdir or sh.config.state_dir, brief_text=prompt,
            brief_file=layout.answer(up_id, asker, qid, "prompt.md"),
            log_file=layout.answer(up_id, asker, qid, "log"), exit_file=layout.answer(up_id, asker, qid, "exit"),
            state_dir=sh.config.state_dir, config_path=sh.config.path, session=session, resume=True,
            allow=answer_allow_rules(asker, qid) if lc.preset == "claude-code" else (),
        )
        try:
            write_private_file(req.brief_file, prompt, state_dir=sh.config.state_dir, task=up_id)
            owner: Owner = launcher.launch(req)
        except (HeartbeatError, OSError) as exc:
            why = str(exc) if isinstance(exc, HeartbeatError) else (exc.strerror or str(exc))
            self._ended(up_id, asker, qid, session, "failed", now, reason=f"could not start: {why}")
            self.readdress(asker, qid, f"{up_id}'s answering run could not start: {why}", now)
            return
        self.runs[(asker, qid)] = AnswerRun(asker=asker, qid=qid, upstream=up_id, launcher=lc.name, session=session,
                                            started=now, owner=owner, log=req.log_file, exit=req.exit_file,
                                            quiet_since=now)
        sh.record(Event(task=up_id, kind=EventKind.ANSWER_STARTED, ts=now, epoch=up.meta.epoch, actor="daemon",
                        data={"asker": asker, "qid": qid, "session": session, "launcher": lc.name,
                              "host": sh.host, "pid": owner.pid}))
        sh.log.info("answer_started", task=up_id, asker=asker, qid=qid, session=session, pid=owner.pid)

    def defer(self, asker: str, qid: str, why: str) -> None:
        if self.deferred.get((asker, qid)) != why:
            self.deferred[(asker, qid)] = why
            self.shared.log.info("answer_waiting", task=asker, qid=qid, reason=why)

    def _session_host(self, up_id: str) -> str:
        """The host whose daemon dispatched ``up_id`` last (where its session's files are)."""
        events = self.shared.store.ledger.events(up_id, kinds=[EventKind.DISPATCHED])
        return str(events[-1].data.get("host") or "") if events else ""

    # -- watching and settling -----------------------------------------------------------------

    def limit(self, run: AnswerRun) -> float:
        lc = self.shared.config.launchers.get(run.launcher)
        own = lc.max_runtime if lc is not None and lc.max_runtime else None
        return min(defaults.ANSWER_MAX_RUNTIME, own) if own else defaults.ANSWER_MAX_RUNTIME

    def watch(self, run: AnswerRun, now: datetime) -> None:
        """A run under way: settled once it ended; stopped past its runtime or silent too long."""
        launcher = self.shared.launchers.get(run.launcher)
        status = launcher.exit_status(run.owner, run.exit) if launcher is not None and run.owner else \
            read_exit_file(run.exit)
        if status is not None:
            self.settle(run, status, now)
            return
        if run.stopping:
            return
        in_use = self._session_in_use(run.upstream)
        if in_use:
            self.stop(run, in_use)
            return
        from heartbeat.model.timeparse import format_duration

        ran = (now - run.started).total_seconds()
        if ran > self.limit(run):
            self.stop(run, f"it ran past its max runtime ({format_duration(self.limit(run))})")
            return
        try:
            size = os.stat(run.log).st_size
        except OSError:
            size = -1
        if size != run.log_size:
            run.log_size, run.quiet_since = size, now
        elif (now - run.quiet_since).total_seconds() > defaults.ANSWER_HANG:
            self.stop(run, f"its output was silent for {format_duration(defaults.ANSWER_HANG)}")

    def _session_in_use(self, up_id: str) -> str:
        """Why the upstream's own agent needs its session now (reopened, retried: active or owned), or ""."""
        try:
            up = self.shared.store.load(up_id)
        except HeartbeatError:
            return ""
        if up.meta.owner is not None or up.meta.status is Status.ACTIVE:
            return f"{up_id} is {up.meta.status.value} again: its own agent needs the session"
        return ""

    def stop(self, run: AnswerRun, reason: str) -> None:
        """Stop a run in the worker pool (grace, then SIGKILL); its exit is settled by a later pass."""
        sh = self.shared
        run.stopping, run.stop_reason = True, reason
        launcher = sh.launchers.get(run.launcher)
        lc = sh.config.launchers.get(run.launcher)
        grace = lc.stop_grace if lc is not None else defaults.STOP_GRACE
        owner = run.owner
        sh.log.warning("answer_stopping", task=run.upstream, asker=run.asker, qid=run.qid, reason=reason)

        def go() -> None:
            try:
                if launcher is not None and owner is not None:
                    launcher.stop(owner, grace=grace)
            except Exception as exc:  # a stop must never kill the worker thread
                sh.log.error("answer_stop_failed", task=run.upstream, error=repr(exc))

        sh.pool.submit(go)

    def settle(self, run: AnswerRun, status: ExitStatus, now: datetime) -> None:
        """The run ended: its answer stands, its final text becomes the answer, or a person is asked."""
        sh = self.shared
        info = self._result(run)
        try:  # (the store out of reach: raised, the run kept, settled by a later pass)
            baton = sh.store.load(run.asker)
            question = next((q for q in baton.questions if q.id == run.qid), None)
        except NotFound:
            question = None
        self.runs.pop(run.key, None)
        outcome, reason = self._outcome(run, question, info, status, now)
        self._ended(run.upstream, run.asker, run.qid, run.session, outcome, now, reason=reason,
                    code=status.code, signal=status.signal, ran_s=round((now - run.started).total_seconds(), 3),
                    cost_usd=info.cost_usd if info is not None else None)
        if outcome in ("stopped", "failed"):
            self.readdress(run.asker, run.qid, f"{run.upstream}'s resumed session gave no answer ({reason})", now)

    def _outcome(self, run: AnswerRun, question: Question | None, info: Any, status: ExitStatus,
                 now: datetime) -> tuple[str, str]:
        """How an ended run went (``answer_run``'s outcome and reason); its final text written as the
        answer when it is one and the question is still open."""
        if question is None:
            return "asker_gone", f"{run.asker} or its {run.qid} is no longer in the store"
        if not question.open:
            return "answered", ""
        if run.stop_reason:
            return "stopped", f"stopped: {run.stop_reason}"
        if info is not None and info.text and not info.is_error and status.code == 0:
            try:
                qs.answer(self.shared.store, run.asker, run.qid, info.text, by=f"{qs.UPSTREAM_BY}{run.upstream}",
                          now=now)
            except Conflict:  # answered meanwhile (a person)
                return "answered", ""
            except BadInput as exc:  # a final text no answer may hold
                return "failed", f"its last message is no answer: {exc}"
            return "answered_from_result", ""
        how = f"exit {status.code}" if status.code is not None else f"killed by signal {status.signal}" \
            if status.signal is not None else "an unknown end"
        said = status.launch_error or (info.reason if info is not None and info.is_error else "")
        if info is not None and info.resume_failed:
            said = f"its session {run.session} could not be resumed" + (f" ({said})" if said else "")
        return "failed", f"{how}: {said}" if said else f"{how}, with no answer"

    def unwatched(self, baton: Baton, question: Question, now: datetime) -> None:
        """A sent, open question no run of this daemon watches (a restart, or another host's run): an
        ended run's files are settled here; one never heard of past its bound goes to a person."""
        sh = self.shared
        up_id, qid = question.upstream, question.id
        if not QID_PATTERN.fullmatch(qid):
            return
        exit_file = sh.layout.answer(up_id, baton.id, qid, "exit")
        status = read_exit_file(exit_file)
        name = ""
        try:
            up = sh.store.load(up_id)
            name = up.launcher or sh.config.daemon.default_launcher
            session = up.meta.session
        except HeartbeatError:
            session = ""
        sent = question.sent_at or now
        run = AnswerRun(asker=baton.id, qid=qid, upstream=up_id, launcher=name, session=session, started=sent,
                        owner=None, log=sh.layout.answer(up_id, baton.id, qid, "log"), exit=exit_file,
                        quiet_since=sent)
        if status is not None:
            self.settle(run, status, now)
            return
        lc = sh.config.launchers.get(name)
        grace = lc.stop_grace if lc is not None else defaults.STOP_GRACE
        bound = self.limit(run) + grace + 2 * sh.config.daemon.tick
        if (now - sent).total_seconds() > bound:
            self._ended(up_id, baton.id, qid, session, "lost", now,
                        reason="no daemon watched its run to an end (the daemon that started it stopped)")
            self.readdress(baton.id, qid, f"{up_id}'s answering run was lost: no answer came within its bound", now)

    # -- writes ----------------------------------------------------------------------------

    def readdress(self, asker: str, qid: str, reason: str, now: datetime) -> None:
        """Give the question to a person now: escalated (:func:`heartbeat.tasks.questions.escalate`:
        ``to = "person"``, ``question_escalated``), ``question_readdressed`` with the one-line reason,
        and the ``[notify.*]`` commands run once, as :mod:`.overdue` does past ``question_wait``."""
        sh = self.shared
        self.deferred.pop((asker, qid), None)
        try:
            if not qs.escalate(sh.store, asker, qid, now=now):
                return
            baton = sh.store.load(asker)
        except HeartbeatError as exc:
            sh.log.warning("readdress_failed", task=asker, qid=qid, error=str(exc))
            return
        sh.record(Event(task=asker, kind=EventKind.QUESTION_READDRESSED, ts=now, actor="daemon",
                        data={"qid": qid, "to": QuestionTo.PERSON.value, "reason": reason}))
        sh.log.warning("question_readdressed", task=asker, qid=qid, reason=reason)
        self.actor.notify(baton, f"question {qid}: {reason}")

    def _ended(self, up_id: str, asker: str, qid: str, session: str, outcome: str, now: datetime, *,
               reason: str = "", **data: Any) -> None:
        self.shared.record(Event(task=up_id, kind=EventKind.ANSWER_RUN, ts=now, actor="daemon",
                                 data={"asker": asker, "qid": qid, "session": session, "outcome": outcome,
                                       **({"reason": reason} if reason else {}),
                                       **{k: v for k, v in data.items() if v is not None}}))
        self.shared.log.info("answer_run", task=up_id, asker=asker, qid=qid, outcome=outcome, reason=reason)

    def _result(self, run: AnswerRun) -> Any:
        """What the run's output says (the preset's parser), or None."""
        lc = self.shared.config.launchers.get(run.launcher)
        if lc is None or not lc.preset:
            return None
        from heartbeat.presets.registry import parse_result
        from heartbeat.system.safefile import read_log_ends

        return parse_result(lc.preset, read_log_ends(run.log))
