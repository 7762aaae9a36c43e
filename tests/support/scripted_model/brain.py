"""The scripted model's mind: an agent that follows heartbeat's brief, whatever wire it speaks.

A wire module (``anthropic.py``; ``responses.py`` for codex goes beside it) turns one request
into a :class:`Conversation` (every text the CLI sent, the tool calls this model made earlier
and the results the CLI sent back) and turns the :class:`Reply` of :meth:`Brain.decide` into
its own framing. The brain keeps no state per session: what it has done in a session is read
back from the conversation itself, as a real model would, so a resumed session, a compacted
one and a fresh one behave as a real agent in that position would.

What it does, each request, from the conversation alone:

1. Orient (once per conversation): ``heartbeat show ID --json`` when the prompt names a
   task (the brief spells the id out), and ``ls -1 steps`` when it may look at its files
   (``sees_files``). The done steps are the baton's ``done`` list plus the step files present.
2. Work: for the first step of :attr:`Workload.steps` not done, any silent working turns
   (``sleep`` through the shell tool, no note), then the step's work with the edit tool
   (``Write``) to ``steps/NN.txt``, plus :attr:`Workload.touches` of that step unless a
   constraint it has seen says "Do not touch PATH" (any other wording it loses: a careless
   model), or a refusal of that write named PATH (then it leaves the file alone and goes on).
3. Keep the note with the brief's exact commands: ``heartbeat add ID done "STEP"`` and
   ``heartbeat set ID step="NEXT" next_step="AFTER"``; at the end ``heartbeat done ID
   --note "..."`` and a last text. A ``done`` refused for a downstream's need is answered as
   its line says: each ``heartbeat add ID PART "..."`` it names, then ``done`` again.

Its own record (:class:`Record`, a JSONL file) is written from the tool results the CLI sends
back, once per tool call (by its id): ``step_done`` when a step's write came back without an
error, ``touched`` for each extra file written, ``note`` for each heartbeat command and its
outcome, ``refused`` when the CLI refused a call, ``skipped_touch`` when a constraint held it
back. A step with two ``step_done`` lines was redone. The record is the model's, not the
CLI's and not heartbeat's: the independent witness of what the agent really did.

Controls (:class:`Controls`, a JSON file re-read on every request, so a test can change them
while an agent runs): ``delay`` seconds before answering; ``hang`` (answer nothing until it
is cleared); ``hold_after_step`` (hang the request that reports step N's write, before the
note: a deterministic "killed mid-step" point); ``rate_limit`` (``{"status": 429|529,
"retry_after": S, "times": N, "message": "..."}``: the next N requests get that error);
``work_turns``/``work_sleep`` (silent turns of ``sleep S`` before each step's write);
``hold_after_effect`` (hang the request that reports step N's effect, before its write and note:
killed between an external effect and its note).

A ralph-style loop's prompt (it names ``fix_plan.md``): the model first runs ``cat fix_plan.md
NOTES.md``; the plan's checked boxes (``- [x] STEP``) are done steps, the notes' "Do not
touch PATH" lines constraints, and a last ``BLOCKED``/``UNBLOCKED`` line that is ``BLOCKED``
ends the run at once; after each step's write it checks the step's box (rewriting
``fix_plan.md`` with ``Write``): the loop's note.

An effect (:attr:`Workload.effects`) is recorded as ``effect`` when its result comes back (a
command twice = a repeated effect) and ``effect_skipped`` when the model did not run it because
the conversation said the last run had.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Call",
    "Result",
    "Conversation",
    "Fault",
    "Reply",
    "Workload",
    "Controls",
    "Record",
    "Brain",
    "step_file",
    "shell_call",
]

CallKind = Literal["shell", "write"]


@dataclass(frozen=True)
class Call:
    """A tool call this model made: run a shell command, or write a file (absolute path)."""

    id: str
    kind: CallKind
    command: str = ""
    path: str = ""
    content: str = ""


@dataclass(frozen=True)
class Result:
    """What the CLI sent back for one call."""

    call_id: str
    text: str
    is_error: bool = False


@dataclass(frozen=True)
class Conversation:
    """One request, protocol-neutral."""

    texts: tuple[str, ...]
    """Every text the CLI sent (system prompt, user turns, hook context), in order."""
    calls: tuple[Call, ...]
    """The tool calls this model made earlier in the conversation, in order."""
    results: dict[str, Result]
    """The results the CLI sent back, by call id."""
    tools: frozenset[str] = frozenset()
    """The neutral tool kinds the CLI offers (``shell``, ``write``)."""
    session: str = ""
    """The CLI's session id, when its wire carries one (for the record only)."""

    @property
    def text(self) -> str:
        return "\n".join(self.texts)


@dataclass(frozen=True)
class Fault:
    """An answer that is not a message: an HTTP error, or no answer at all (``hang``)."""

    status: int = 0
    message: str = ""
    retry_after: float | None = None
    hang: bool = False
    until: Callable[[], bool] | None = None
    """For a hang: held while this answers True (the control that caused it is still set)."""


@dataclass(frozen=True)
class Reply:
    """One assistant turn: some text and tool calls (none = the turn ends), or a fault."""

    text: str = ""
    calls: tuple[Call, ...] = ()
    fault: Fault | None = None


@dataclass(frozen=True)
class Workload:
    """The scripted work: the steps in order, and extra files a step touches besides its own."""

    steps: tuple[str, ...]
    touches: dict[str, str] = field(default_factory=dict)
    """Step name -> a path (relative to the workdir) that step also writes, unless forbidden."""
    effects: dict[str, str] = field(default_factory=dict)
    """Step name -> a shell command with an effect no file in the workdir shows (an API call, a
    payment), run before the step's write, once: unless the conversation says it already ran (a
    brief's "Since the last note" section, or ``show --json``'s ``unnoted``)."""


def step_file(index: int) -> str:
    """The file step ``index`` (0-based) writes, relative to the workdir."""
    return f"steps/{index + 1:02d}.txt"


_STEP_PATH = re.compile(r"(?:^|/)steps/(\d{2})\.txt$")
_TASK = re.compile(r"heartbeat(?: --(?:state-dir|config) \S+)* (?:show|set|add|touch|done|verify|block) "
                   r"([A-Za-z0-9][A-Za-z0-9._-]*)")  # (hooks installed with a config print it in every command)
_CWD = re.compile(r"Primary working directory: ([^\n\\]+)")
_FORBID = re.compile(r"[Dd]o not (?:touch|write|edit|change) `?([\w./-]*\w)")
_SUMMARY = re.compile(r"create a detailed summary of the conversation", re.IGNORECASE)


@dataclass
class Controls:
    """The knobs a test turns (see the module docstring); read from a JSON file per request."""

    delay: float = 0.0
    hang: bool = False
    hold_after_step: int | None = None
    rate_limit: dict[str, Any] | None = None
    work_turns: int = 0
    work_sleep: float = 0.0
    stop_after_step: int | None = None
    """End the turn once step N (1-based) is done and noted, as a session a person ends."""
    hold_after_effect: int | None = None
    probes: tuple[str, ...] | list[str] = ()
    """Shell commands tried once per conversation after orienting (e.g. ones the CLI must refuse)."""
    ask: dict[str, str] | None = None
    """``{"task": ID, "text": QUESTION}``: task ID's session asks its upstream QUESTION (``heartbeat ask``)
    after orienting, unless its conversation already holds the question (its brief carries the
    exchange), then ends its turn."""
    answer_by_command: bool = False
    """An upstream's session asked a question answers with ``heartbeat answer``, not with its last text."""

    @classmethod
    def read(cls, path: Path | None) -> Controls:
        if path is None:
            return cls()
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(doc, dict):
            return cls()
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class Record:
    """The model's own JSONL log of what it did, one object per line, appended under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        for entry in self.entries():
            if entry.get("call"):
                self._seen.add(str(entry["call"]))

    def entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:  # a line still being appended by the server's thread
                continue
        return out

    def write(self, event: str, *, call: str = "", **data: Any) -> None:
        with self._lock:
            if call:
                if call in self._seen:
                    return
                self._seen.add(call)
            entry = {"t": round(time.time(), 3), "event": event, **({"call": call} if call else {}), **data}
            with open(self.path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def seen(self, call: str) -> bool:
        with self._lock:
            return call in self._seen

    # what a test asks of it
    def steps_done(self) -> list[str]:
        """Every ``step_done`` in order (a name twice = that step was redone)."""
        return [e["step"] for e in self.entries() if e["event"] == "step_done"]

    def redone(self) -> list[str]:
        done = self.steps_done()
        return sorted({s for s in done if done.count(s) > 1})


_SHELL_WRITE = re.compile(r"> '([^']+)'$")


def shell_call(call_id: str, command: str) -> Call:
    """A shell call as a wire reads it back (a write through the shell keeps its path)."""
    m = _SHELL_WRITE.search(command)
    return Call(id=call_id, kind="shell", command=command, path=m.group(1) if m else "")


def _new_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


class Brain:
    """Decides each turn from the conversation (see the module docstring)."""

    def __init__(self, workload: Workload, record: Record, *, controls: Path | None = None,
                 sees_files: bool = True) -> None:
        self.workload = workload
        self.record = record
        self.controls_path = controls
        self.sees_files = sees_files
        self._lock = threading.Lock()
        self._faults_sent = 0

    def controls(self) -> Controls:
        return Controls.read(self.controls_path)

    def fault(self) -> Fault | None:
        """A rate limit to answer with instead of a turn, or None (counted across requests)."""
        limit = self.controls().rate_limit
        if not limit:
            return None
        with self._lock:
            if self._faults_sent >= int(limit.get("times", 1)):
                return None
            self._faults_sent += 1
        status = int(limit.get("status", 429))
        default = "Overloaded" if status == 529 else "Number of requests has exceeded your rate limit"
        retry = limit.get("retry_after")
        self.record.write("rate_limited", status=status, retry_after=retry)
        return Fault(status=status, message=str(limit.get("message") or default),
                     retry_after=float(retry) if retry is not None else None)

    def answer(self, conv: Conversation) -> Reply:
        """What the wire sends: a rate limit or a hang when the controls say so, else :meth:`decide`."""
        fault = self.fault()
        if fault is not None:
            self._witness(conv)
            return Reply(fault=fault)
        controls = self.controls()
        if controls.hang:
            self._witness(conv)
            return Reply(fault=Fault(hang=True, until=lambda: self.controls().hang))
        if controls.delay:
            time.sleep(controls.delay)
        return self.decide(conv)

    def decide(self, conv: Conversation) -> Reply:
        self._witness(conv)
        if conv.texts and _SUMMARY.search(conv.texts[-1]):
            return Reply(text=self._summary(conv))  # /compact asks for a summary (tools still offered)
        if not conv.tools:
            return Reply(text="OK")  # a side request (a title, a quota probe): plain text
        return self._next(conv)

    # -- reading the conversation ------------------------------------------------------------

    def _witness(self, conv: Conversation) -> None:
        """Write the record from the results the CLI sent back (each call once), and once per session
        the downstreams' needs the brief it was given names (``brief_needs``)."""
        task = self._task(conv)
        needs = _NEEDS.search(conv.text)
        if needs and not self.record.seen(f"needs-{conv.session}"):
            self.record.write("brief_needs", call=f"needs-{conv.session}", lines=needs.group(1).strip().splitlines(),
                              session=conv.session, task=task)
        for call in conv.calls:
            result = conv.results.get(call.id)
            if result is None or self.record.seen(call.id):
                continue
            if _refused(result):
                self.record.write("refused", call=call.id, kind=call.kind, command=call.command, path=call.path,
                                  reason=result.text[:300], session=conv.session)
            elif call.path:
                index = _step_index(call.path)
                if index is not None and index < len(self.workload.steps):
                    self.record.write("step_done", call=call.id, step=self.workload.steps[index],
                                      path=call.path, error=result.is_error, session=conv.session, task=task)
                else:
                    self.record.write("touched", call=call.id, path=call.path, error=result.is_error,
                                      session=conv.session, task=task)
            elif call.command in self.workload.effects.values():
                self.record.write("effect", call=call.id, command=call.command, error=result.is_error,
                                  session=conv.session, task=task)
            elif call.command.startswith("heartbeat "):
                self.record.write("note", call=call.id, command=call.command, error=result.is_error,
                                  output=result.text[:300], session=conv.session)
            else:
                self.record.write("shell", call=call.id, command=call.command, error=result.is_error,
                                  session=conv.session)

    def _task(self, conv: Conversation) -> str:
        for text in conv.texts:
            m = _TASK.search(text)
            if m:
                return m.group(1)
        return ""

    def _cwd(self, conv: Conversation) -> str:
        for text in conv.texts:
            m = _CWD.search(text)
            if m:
                return m.group(1).strip()
        return os.getcwd()

    def _baton(self, conv: Conversation, task: str) -> dict[str, Any] | None:
        """The last ``heartbeat show TASK --json`` result of this conversation, parsed."""
        for call in reversed(conv.calls):
            if call.command == _show(task) and call.id in conv.results:
                result = conv.results[call.id]
                if result.is_error:
                    return {}
                try:
                    doc = json.loads(result.text)
                except ValueError:
                    return {}
                return doc if isinstance(doc, dict) else {}
        return None

    def _listing(self, conv: Conversation) -> set[str] | None:
        for call in reversed(conv.calls):
            if call.command == _LS and call.id in conv.results:
                result = conv.results[call.id]
                return set() if result.is_error else {line.strip() for line in result.text.splitlines()}
        return None

    # -- deciding -----------------------------------------------------------------------------

    def _answering(self, conv: Conversation) -> Reply | None:
        """A resumed session asked a question by heartbeat (its last prompt): answer from its own
        conversation (the step files it wrote there), recorded as ``question_seen``."""
        m = next((_QUESTION.search(t) for t in reversed(conv.texts) if _QUESTION.search(t)), None)
        if m is None:
            return None
        asker, upstream, qid = m.group(1), m.group(2), m.group(3)
        written = sorted({os.path.basename(c.path) for c in conv.calls  # (codex writes through its shell)
                          if c.path and _step_index(c.path) is not None and c.id in conv.results})
        answer = f"In {upstream} I wrote {', '.join(written) or 'nothing'}, and the retry loop stays for the flaky API."
        self.record.write("question_seen", call=f"question-{conv.session}-{qid}-{len(conv.calls)}", asker=asker,
                          upstream=upstream, qid=qid, session=conv.session, calls_in_context=len(conv.calls),
                          steps_in_context=written, question=conv.texts[-1][:500])
        command = f'heartbeat answer {asker} {qid} "{answer}"'
        issued = {c.command for c in conv.calls}
        if self.controls().answer_by_command and command not in issued:
            return _shell("Answer the question", command)
        for probe in self.controls().probes:
            if probe not in issued:
                return _shell("Probe", probe)
        return Reply(text=answer)

    def _next(self, conv: Conversation) -> Reply:
        answering = self._answering(conv)
        if answering is not None:
            return answering
        task = self._task(conv)
        if task and self._baton(conv, task) is None:
            return _shell("Read the task's baton", _show(task))
        if self.sees_files and self._listing(conv) is None:
            return _shell("List the step files", _LS)
        notes = self._loop_notes(conv)
        if notes is None:
            return _shell("Read the plan and the notes", _LOOP_READ)
        if notes and _blocked(notes):
            return Reply(text="NOTES.md says BLOCKED: stopping here.")
        baton = self._baton(conv, task) or {}
        steps = self.workload.steps
        done = {s for s in baton.get("done", []) if isinstance(s, str)}
        for name in self._listing(conv) or ():
            m = re.fullmatch(r"(\d{2})\.txt", name)
            if m and 0 < int(m.group(1)) <= len(steps):
                done.add(steps[int(m.group(1)) - 1])
        written: dict[int, Call] = {}
        for call in conv.calls:
            index = _step_index(call.path) if call.path else None
            result = conv.results.get(call.id)
            if index is not None and result is not None and not result.is_error:
                done.add(steps[index])
                written[index] = call
        done.update(re.findall(r"^- \[x\] (.+)$", notes, re.MULTILINE) if notes else ())
        forbidden = set(_FORBID.findall(conv.text + (notes or "")))
        for c in baton.get("constraints", []):
            if isinstance(c, str):
                forbidden.update(_FORBID.findall(c))
        controls = self.controls()
        cwd = self._cwd(conv)
        issued = {c.command for c in conv.calls} | {c.path for c in conv.calls}
        asking = controls.ask or {}
        if task and asking.get("task") == task:
            ask = f'heartbeat ask {task} "{asking.get("text", "")}" --to upstream'
            if ask in issued:
                return Reply(text="I asked my upstream; ending my turn until the answer comes.")
            if asking.get("text", "") not in conv.text:
                return _shell("Ask the upstream", ask)
        for probe in controls.probes:
            if probe not in issued:
                return _shell("Probe", probe)
        extras = {os.path.join(cwd, x): x for x in self.workload.touches.values()}
        # A refusal that names an extra file's path reminds the model of the constraint it lost: it
        # leaves the file alone and goes on (a real model reads "protected by ..." the same way).
        guarded = {extras[c.path] for c in conv.calls if c.kind == "write" and c.path in extras
                   and _refused_or_none(conv.results.get(c.id)) and extras[c.path] in conv.results[c.id].text}
        forbidden |= guarded
        refused = [c for c in conv.calls if c.kind == "write" and _refused_or_none(conv.results.get(c.id))
                   and not (c.path in extras and extras[c.path] in guarded)]
        if refused:
            # A real agent stuck on something outside its control says so, with the brief's command.
            why = f"the CLI refused to write {os.path.relpath(refused[0].path, cwd)}"
            block = f'heartbeat block {task} --on "{why}"'
            if task and block not in issued:
                return _shell("Record the block", block)
            return Reply(text=f"Stopping: {why}.")

        # The note for steps finished in this conversation, with the brief's exact commands.
        if notes:
            plan = "".join(f"- [{'x' if s in done else ' '}] {s}\n" for s in steps)
            plan_path = os.path.join(cwd, "fix_plan.md")
            if any(s in done for s in steps) and not any(c.path == plan_path and c.content == plan for c in conv.calls):
                held = [i for i in sorted(written) if controls.hold_after_step == i + 1
                        and not any(c.path == plan_path and f"[x] {steps[i]}" in c.content for c in conv.calls)]
                if held:
                    self.record.write("held", call=f"held-{written[held[0]].id}", step=steps[held[0]])
                    return Reply(fault=Fault(hang=True, until=self._holding(held[0] + 1)))
                if written:
                    return _write(plan_path, plan, conv, text="Check the step off in the plan.")
        for index in sorted(written):
            if controls.hold_after_step == index + 1 and not self._noted(conv, task, steps[index]):
                self.record.write("held", call=f"held-{written[index].id}", step=steps[index])
                return Reply(fault=Fault(hang=True, until=self._holding(index + 1)))
            if task:
                add = f'heartbeat add {task} done "{steps[index]}"'
                if add not in issued:
                    return _shell("Record the finished step", add)
                nxt = steps[index + 1] if index + 1 < len(steps) else ""
                after = steps[index + 2] if index + 2 < len(steps) else ""
                if nxt:
                    set_ = f'heartbeat set {task} step="{nxt}" next_step="{after}"'
                    if set_ not in issued:
                        return _shell("Move the note to the next step", set_)

        stop = controls.stop_after_step
        if stop and 0 < stop <= len(steps) and stop - 1 in written:
            return Reply(text=f"Step {stop} is done and noted; ending this session here.")
        for index, step in enumerate(steps):
            if step in done:
                continue
            path = os.path.join(cwd, step_file(index))
            sleeps = [c for c in conv.calls if c.command == _sleep(controls.work_sleep, index)]
            if len(sleeps) < controls.work_turns:
                return _shell("Work on the step", _sleep(controls.work_sleep, index), text=f"Working on {step}.")
            effect = self.workload.effects.get(step)
            if effect:
                ran = [c for c in conv.calls if c.command == effect and c.id in conv.results]
                if ran and controls.hold_after_effect == index + 1 and not (set(written) & {index}):
                    self.record.write("held", call=f"held-{ran[0].id}", step=step)
                    return Reply(fault=Fault(hang=True, until=self._holding_effect(index + 1)))
                if not ran and effect not in issued:
                    if _already_ran(conv, baton, effect):
                        self.record.write("effect_skipped", call=f"skip-effect-{index}-{conv.session}", step=step,
                                          command=effect)
                    else:
                        return _shell("Make the step's external call", effect, text=f"Calling out for {step}.")
            extra = self.workload.touches.get(step)
            if extra and (os.path.join(cwd, extra) not in issued or extra in guarded):
                if extra in forbidden:
                    self.record.write("skipped_touch", call=f"skip-{index}-{conv.session}", step=step, path=extra)
                else:
                    return _write(os.path.join(cwd, extra), f"touched by {step}\n", conv)
            return _write(path, f"{step}: done\n", conv, text=f"Doing step {index + 1}: {step}.")
        if task:
            finish = f'heartbeat done {task} --note "all {len(steps)} steps done"'
            if finish not in issued:
                return _shell("Mark the task done", finish)
            # done refused for a downstream's need: package each part the refusal names, then done again
            refusals = [conv.results[c.id].text for c in conv.calls if c.command == finish and c.id in conv.results
                        and conv.results[c.id].is_error]
            for command in (_FILL.findall(refusals[-1]) if refusals else []):
                fill = command.replace('"..."', '"packaged after the refusal"')
                if fill not in issued:
                    return _shell("Package what the downstream needs", fill)
            again = f'heartbeat done {task} --note "all {len(steps)} steps done, needs packaged"'
            if refusals and again not in issued:
                return _shell("Mark the task done again", again)
        return Reply(text=f"All {len(steps)} steps are done.")

    def _loop_notes(self, conv: Conversation) -> str | None:
        """For a loop's prompt (it names fix_plan.md): the output of ``cat fix_plan.md NOTES.md``, or
        None when not read yet in this conversation; "" for any other prompt."""
        if "fix_plan.md" not in conv.text:
            return ""
        for call in reversed(conv.calls):
            if call.command == _LOOP_READ and call.id in conv.results:
                return conv.results[call.id].text or " "
        return None

    def _holding_effect(self, step: int) -> Callable[[], bool]:
        return lambda: self.controls().hold_after_effect == step

    def _holding(self, step: int) -> Callable[[], bool]:
        return lambda: self.controls().hold_after_step == step

    def _noted(self, conv: Conversation, task: str, step: str) -> bool:
        add = f'heartbeat add {task} done "{step}"'
        return any(c.command == add for c in conv.calls)

    def _summary(self, conv: Conversation) -> str:
        # Deliberately thin: what survives a compaction must come from the hooks, not from here.
        return ("<analysis>The conversation so far.</analysis>\n"
                "<summary>I was working through the task's steps with the tools.</summary>")


_LS = "ls -1 steps"
_QUESTION = re.compile(r"task '([^']+)', which comes after your task '([^']+)', asks you a question \((q\d+)\)")
_LOOP_READ = "cat fix_plan.md NOTES.md"


_FILL = re.compile(r'`(heartbeat add \S+ \w+ "\.\.\.")`')
"""A refused ``done``'s command that fills a part a downstream needs (heartbeat/tasks/needs.py)."""

_NEEDS = re.compile(r"## What your downstreams need[^\n]*\n((?:- [^\n]*\n?)+)")
"""The brief's section on what the task's downstreams need, and its lines."""


def _blocked(notes: str) -> bool:
    marks = re.findall(r"^(BLOCKED|UNBLOCKED)\b", notes, re.MULTILINE)
    return bool(marks) and marks[-1] == "BLOCKED"


def _show(task: str) -> str:
    return f"heartbeat show {task} --json"


def _sleep(seconds: float, index: int) -> str:
    # the step number makes each step's working turns distinct commands
    return f"sleep {seconds:g} # step {index + 1}"


def _step_index(path: str) -> int | None:
    m = _STEP_PATH.search(path)
    return int(m.group(1)) - 1 if m else None


_UNNOTED = "Since the last note, the last run did"


def _already_ran(conv: Conversation, baton: dict[str, Any], command: str) -> bool:
    """Whether the conversation says the last run already made this call: the brief's section of
    what it did since its note, or ``show --json``'s ``unnoted`` (a careful reader of its brief)."""
    text = conv.text
    at = text.find(_UNNOTED)
    if at >= 0 and f"`{command}`" in text[at:]:
        return True
    unnoted = baton.get("unnoted")
    calls = unnoted.get("calls") if isinstance(unnoted, dict) else None
    return isinstance(calls, list) and any(isinstance(c, dict) and c.get("what") == command for c in calls)


def _refused_or_none(result: Result | None) -> bool:
    return result is not None and _refused(result)


# a hook's deny: claude's "PreToolUse:Write hook error: ...", codex's "Command blocked by PreToolUse hook: ..."
_REFUSAL = re.compile(r"requires approval|permission|not allowed|denied|haven't granted|was blocked|can't be checked"
                      r"|PreToolUse:\w+ hook|blocked by PreToolUse hook", re.IGNORECASE)


def _refused(result: Result) -> bool:
    return result.is_error and bool(_REFUSAL.search(result.text))


def _shell(description: str, command: str, *, text: str = "") -> Reply:
    return Reply(text=text, calls=(Call(id=_new_id(), kind="shell", command=command, content=description),))


def _write(path: str, content: str, conv: Conversation, *, text: str = "") -> Reply:
    if "write" in conv.tools:
        return Reply(text=text, calls=(Call(id=_new_id(), kind="write", path=path, content=content),))
    # no edit tool offered: write through the shell
    quoted = content.replace("'", "'\\''")
    return Reply(text=text, calls=(Call(id=_new_id(), kind="shell",
                                        command=f"mkdir -p \"$(dirname '{path}')\" && printf '%s' '{quoted}' > '{path}'",
                                        path=path),))
