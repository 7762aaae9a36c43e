"""Bounded disk: ``heartbeat gc`` and the daemon's periodic gc job (``[retention]``).

Three things, each safe against a running daemon and running agents:

- **Old epochs' files.** ``logs/<id>/<epoch>.{log,log.1,brief.md,exit,pid,pulse,lease}`` of all but the
  ``keep_epochs`` latest epochs of a task are removed. The current epoch's files are never
  touched (nor any epoch at or above it: epochs only grow), and a task whose baton is not
  readable keeps everything. Entries are listed and removed through a directory descriptor
  opened with ``O_NOFOLLOW``, with ``lstat``/``unlink`` only: a symlink or FIFO planted in
  ``logs/`` is removed as a name, never followed or opened; anything not named like an
  epoch's file is left alone.
- **Archiving done tasks.** A task ``done`` (no owner) for ``finished_after`` goes into a new
  ``archive/<UTC time>.jsonl.gz``: one JSON line per task with the baton's text, its sha256
  and every ledger event. The file is written to a temp name, fsynced, renamed, its
  directory fsynced, then read back and checked record by record. Only then, per task and
  under the baton's lock, with the baton still byte-identical and no event recorded since,
  are its ledger rows replaced by one ``archived`` event (archive file, rows, sha256, kinds)
  and its baton and logs removed. A task revived meanwhile (retried, edited) is skipped
  and its record in the file is ignored, because no ``archived`` event names it.
  Failed tasks are archived only with ``archive_failed = true``: by default a failure waits
  for a human. A task another task in the store depends on (its ``after``, or an ``after:``/
  ``task:`` gate, at any distance) is kept until that task goes too: an upstream leaves with
  (or after) its last downstream, never before (``skipped``: "kept: task C depends on it").
- **Folding touches.** In a finished (done or failed) task, ``touched`` rows that no
  report metric reads (not an agent's first write after its start, before the finish)
  are removed and one ``compacted`` event records how many (``data.folded``), with their
  first and last times. Before folding a task, its metrics and incidents are computed
  with and without those rows; a task whose report would change is left as it is.

So the ledger only shrinks by what its own ``archived`` (``data.rows``) and ``compacted``
(``data.folded``) events say: rows before - rows after = sum of those - the number of
those events added. ``heartbeat report`` reads the archives back (events and baton of each
``archived`` task) and skips those two kinds, so its totals are the same before and after.

Why gzip'd JSON lines, one new file per run: the standard library writes and reads it
(no new dependency), ``zcat FILE | jq`` shows it, a record is self-contained, and an
archive once written is never rewritten, so a crash in a later run cannot damage it.
xz would compress ~20% better at several times the CPU; an SQLite archive would need
``VACUUM`` and its own durability care.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from heartbeat.config.shape import RetentionConfig
from heartbeat.model.baton import Baton, GateKind, Status
from heartbeat.model.errors import HeartbeatError, StoreError
from heartbeat.model.ledger import Event, EventKind, Ledger, tally
from heartbeat.store.archive import EPOCH_FILE, RETENTION_KINDS, archive_name, make_record, read_archived
from heartbeat.store.base import Archiving, Store

__all__ = [
    "RETENTION_KINDS",
    "GcResult",
    "run_gc",
    "remove_task",
    "read_archived",
    "EPOCH_FILE",
]


@dataclass
class GcResult:
    """What one gc run removed, archived and folded (or, with ``dry_run``, would have)."""

    dry_run: bool
    now: datetime
    removed_files: list[tuple[str, int]] = field(default_factory=list)
    """``(path, bytes)`` of epoch files removed."""
    archived: list[str] = field(default_factory=list)
    archived_bytes: int = 0
    """Bytes of the archived batons and logs freed from the state dir."""
    archive_file: str = ""
    archive_file_bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(task, why)`` of tasks that were candidates but were left alone."""
    folded: dict[str, int] = field(default_factory=dict)
    """Touch rows folded per task."""
    archived_rows: int = 0
    ledger_rows_before: int = 0
    ledger_rows_after: int = 0

    @property
    def removed_bytes(self) -> int:
        return sum(size for _, size in self.removed_files)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "now": self.now.isoformat(),
            "removed_files": [{"path": p, "bytes": b} for p, b in self.removed_files],
            "removed_bytes": self.removed_bytes,
            "archived": list(self.archived),
            "archived_bytes": self.archived_bytes,
            "archived_rows": self.archived_rows,
            "archive_file": self.archive_file,
            "archive_file_bytes": self.archive_file_bytes,
            "folded": dict(self.folded),
            "folded_rows": sum(self.folded.values()),
            "skipped": [{"task": t, "why": w} for t, w in self.skipped],
            "ledger_rows_before": self.ledger_rows_before,
            "ledger_rows_after": self.ledger_rows_after,
        }

    def render_text(self) -> str:
        would = "would " if self.dry_run else ""
        lines = []
        for path, size in self.removed_files:
            lines.append(f"{would}remove {path} ({size} bytes)")
        for task in self.archived:
            lines.append(f"{would}archive {task}")
        for task, n in sorted(self.folded.items()):
            lines.append(f"{would}fold {n} touch row(s) of {task}")
        for task, why in self.skipped:
            lines.append(f"skip {task}: {why}")
        where = f" into {self.archive_file} ({self.archive_file_bytes} bytes)" if self.archive_file else ""
        lines.append(
            f"gc{' (dry run: nothing changed)' if self.dry_run else ''}: {would}remove "
            f"{len(self.removed_files)} file(s), {self.removed_bytes} bytes; {would}archive "
            f"{len(self.archived)} task(s) ({self.archived_rows} ledger rows, {self.archived_bytes} bytes){where}; "
            f"{would}fold {sum(self.folded.values())} touch row(s) of {len(self.folded)} task(s); "
            f"ledger rows {self.ledger_rows_before} -> {self.ledger_rows_after}"
        )
        return "\n".join(lines)


# -- the entry point ----------------------------------------------------------------------


def run_gc(store: Store, config: RetentionConfig, *, now: datetime, dry_run: bool = False) -> GcResult:
    """One gc pass over a store that archives (see the module doc). ``now`` decides every age.
    Another store is refused in one line, nothing changed; so is a second gc while one runs
    (:class:`~heartbeat.model.errors.GcBusy`: on a shared store, while another host's runs)."""
    if not isinstance(store, Archiving):
        raise StoreError("gc works on a store that archives (the file store, PostgreSQL): this one does not "
                         "(nothing was changed)")
    result = GcResult(dry_run=dry_run, now=now)
    ledger = store.ledger
    with store.gc_lock(dry_run=dry_run):
        result.ledger_rows_before = ledger.count()
        entries = {e.id: e for e in store.scan()}
        cutoff = now - timedelta(seconds=config.finished_after)
        finished = {Status.DONE, Status.FAILED} if config.archive_failed else {Status.DONE}
        candidates = [e.baton for e in entries.values()
                      if e.baton is not None and e.error is None and _archivable(e.baton, cutoff, finished)]
        needed = _needed_upstreams(entries.values(), {b.meta.id for b in candidates})
        for baton in [b for b in candidates if b.meta.id in needed]:
            candidates.remove(baton)
            result.skipped.append((baton.meta.id, f"kept: task {needed[baton.meta.id]} depends on it"))
        archived = _archive(store, ledger, candidates, result, now=now, dry_run=dry_run)
        for task_id, entry in entries.items():
            if task_id in archived or entry.baton is None or entry.error is not None:
                continue
            _prune_epochs(store, task_id, entry.baton.meta.epoch, config.keep_epochs, result, dry_run)
            if entry.baton.meta.status in (Status.DONE, Status.FAILED):
                _fold_touches(store, entry.baton, result, now=now, dry_run=dry_run)
        result.ledger_rows_after = ledger.count() if not dry_run else (
            result.ledger_rows_before
            - sum(result.folded.values()) + len(result.folded)
            - result.archived_rows + len(result.archived))
    return result


def _upstreams_of(baton: Baton) -> list[str]:
    """The tasks ``baton`` depends on: its ``after``, and the target of an ``after:``/``task:`` gate."""
    out = list(baton.after)
    gate = baton.meta.gate
    if gate is not None and gate.kind in (GateKind.AFTER, GateKind.TASK):
        out += [t for t in gate.target.split(",") if t and t not in out]
    return out


def _needed_upstreams(entries: Iterable[Any], candidates: set[str]) -> dict[str, str]:
    """Which candidates a task staying in the store depends on, at any distance, each with one such task.

    A task is archived only with (or after) every task that depends on it: a downstream waiting
    on an ``after``/``task:`` gate would never open without its upstream's baton, its brief would
    lose the upstream's package and inherited constraints, a done upstream of a live chain can
    still be reopened by its downstream's ``verify``, and ``report --edges`` reads both ends. The
    walk keeps its own stack (no recursion along a chain); an unreadable baton names nothing."""
    batons = {e.id: e.baton for e in entries if e.baton is not None and e.error is None}
    needed: dict[str, str] = {}
    stack = [(task_id, task_id) for task_id in batons if task_id not in candidates]
    seen: set[str] = set()
    while stack:
        task_id, waiting = stack.pop()
        if task_id in seen:
            continue
        seen.add(task_id)
        baton = batons.get(task_id)
        if baton is None:
            continue
        for upstream in _upstreams_of(baton):
            if upstream in candidates:
                needed.setdefault(upstream, waiting)
            stack.append((upstream, waiting))
    return needed


def _archivable(baton: Baton, cutoff: datetime, statuses: set[Status]) -> bool:
    meta = baton.meta
    if meta.status not in statuses or meta.owner is not None:
        return False
    last = max((t for t in (meta.updated_at, meta.touched_at) if t is not None), default=None)
    return last is not None and last <= cutoff


# -- epochs' files -------------------------------------------------------------------------


def _prune_epochs(store: Archiving, task_id: str, current: int, keep: int, result: GcResult, dry_run: bool) -> None:
    """All but the ``keep`` latest epochs' files of a task, never the current epoch's (nor above)."""
    files = store.task_files(task_id)
    epochs = sorted({epoch for epoch, _, _ in files}, reverse=True)
    kept = set(epochs[:max(1, keep)])
    old = [(path, size) for epoch, path, size in files if epoch not in kept and epoch < current]
    if not old:
        return
    if dry_run:
        result.removed_files.extend(old)
        return
    result.removed_files.extend(store.prune_files(task_id, [path for path, _ in old]))


# -- archiving -----------------------------------------------------------------------------


@dataclass
class _Candidate:
    task: str
    raw: bytes
    events: list[Event]
    record: dict[str, Any]


def remove_task(store: Store, task_id: str, *, now: datetime, actor: str) -> GcResult:
    """``heartbeat rm ID``: one task archived now, whatever its status, as gc archives a done one
    (its baton and every ledger event into a new archive, read back before anything goes; one
    ``archived`` event by ``actor`` stays). Refused in one line, nothing changed, when an agent
    holds it or a task staying in the store depends on it."""
    from heartbeat.model.errors import BadInput, NotFound

    if not isinstance(store, Archiving):
        raise StoreError("rm works on a store that archives (the file store, PostgreSQL): this one does not "
                         "(nothing was changed)")
    result = GcResult(dry_run=False, now=now)
    with store.gc_lock():
        entries = {e.id: e for e in store.scan()}
        entry = entries.get(task_id)
        if entry is None:
            raise NotFound("no such task (nothing was removed)", task=task_id)
        if entry.baton is None or entry.error is not None:
            raise BadInput(f"{task_id}: the baton is unreadable ({entry.error}): fix or move it by hand; "
                           "nothing was removed")
        owner = entry.baton.meta.owner
        if owner is not None:
            raise BadInput(f"{task_id} is running (pid {owner.pid} on {owner.host or 'this host'}): "
                           f"`heartbeat pause {task_id}` or wait for it to end, then rm; nothing was removed")
        needed = _needed_upstreams(entries.values(), {task_id})
        if task_id in needed:
            raise BadInput(f"{task_id}: task {needed[task_id]} depends on it: rm that one first; "
                           "nothing was removed")
        result.ledger_rows_before = store.ledger.count()
        _archive(store, store.ledger, [entry.baton], result, now=now, dry_run=False, actor=actor)
        result.ledger_rows_after = store.ledger.count()
    if task_id not in result.archived:
        why = next((w for t, w in result.skipped if t == task_id), "not archived")
        raise StoreError(f"{task_id}: {why}; nothing was removed (run rm again)")
    return result


def _archive(store: Archiving, ledger: Ledger, batons: list[Baton], result: GcResult, *, now: datetime,
             dry_run: bool, actor: str = "gc") -> set[str]:
    if not batons:
        return set()
    candidates: list[_Candidate] = []
    for baton in batons:
        task = baton.meta.id
        raw = store.archive_text(task)
        if raw is None:
            result.skipped.append((task, "baton unreadable"))
            continue
        # An earlier ``archived`` mark of this id (a task archived, then made again) stays in the ledger.
        events = [e for e in ledger.events(task) if e.kind != EventKind.ARCHIVED]
        candidates.append(_Candidate(task, raw, events, make_record(task, raw, events, now)))
    if not candidates:
        return set()
    if dry_run:
        for c in candidates:
            result.archived.append(c.task)
            result.archived_rows += len(c.events)
            result.archived_bytes += len(c.raw) + sum(size for _, _, size in store.task_files(c.task))
        return set(result.archived)
    name = archive_name(now)
    result.archive_file, result.archive_file_bytes = store.write_archive(name, [c.record for c in candidates])
    done: set[str] = set()
    for c in candidates:
        summary = Event(task=c.task, kind=EventKind.ARCHIVED, ts=now, actor=actor, data={
            "archive": name,
            "rows": len(c.events),
            "baton_sha256": c.record["baton_sha256"],
            "kinds": dict(Counter(e.kind for e in c.events)),
            "counted": tally(c.events),  # the metrics' counters keep counting these (heartbeat.web.metrics)
            "first_ts": c.events[0].ts.isoformat() if c.events else None,
            "last_ts": c.events[-1].ts.isoformat() if c.events else None,
        })
        why, freed = store.retire(c.task, c.raw, c.events, summary)
        if why:
            result.skipped.append((c.task, why))
            continue
        done.add(c.task)
        result.archived.append(c.task)
        result.archived_rows += len(c.events)
        result.archived_bytes += len(c.raw) + freed
    return done


# -- folding touches -----------------------------------------------------------------------

_STARTS = frozenset({EventKind.DISPATCHED, EventKind.CLAIMED, EventKind.CREATED})
_AGENT_WRITES = frozenset({EventKind.UPDATED, EventKind.TOUCHED, EventKind.BLOCKED, EventKind.SNOOZED,
                           EventKind.RELEASED, EventKind.DONE, EventKind.FAILED})


def foldable_touches(events: list[Event]) -> list[Event]:
    """``touched`` rows no report metric reads: before the task's last finish, carrying no
    world or change, and not the first agent write since the latest start."""
    finished = [e.ts for e in events if e.kind in (EventKind.DONE, EventKind.FAILED)]
    if not finished:
        return []
    end = finished[-1]
    out: list[Event] = []
    written: set[int] = set()  # epochs with an agent write since the latest start
    for e in events:
        if e.kind in _STARTS:
            written.clear()
        if e.kind == EventKind.TOUCHED and e.ts < end and not (set(e.data) & {"world", "changed"}) \
                and e.epoch in written and e.actor != "daemon":
            out.append(e)
            continue
        if e.kind in _AGENT_WRITES and e.actor != "daemon":
            written.add(e.epoch)
    return out


def _fold_touches(store: Store, baton: Baton, result: GcResult, *, now: datetime, dry_run: bool) -> None:
    from heartbeat.reports.report import task_incidents

    task = baton.meta.id
    try:
        baton = store.load(task)  # the scan may be minutes old: fold only what is finished now
    except HeartbeatError:
        return
    if baton.meta.status not in (Status.DONE, Status.FAILED):
        return
    events = [e for e in store.ledger.events(task) if e.kind not in RETENTION_KINDS]
    fold = foldable_touches(events)
    if len(fold) < 2:  # folding one row into one summary row saves nothing
        return
    gone = {e.id for e in fold}
    kept = [e for e in events if e.id not in gone]
    if task_incidents(events, baton, now=now) != task_incidents(kept, baton, now=now):
        result.skipped.append((task, "folding its touches would change its report"))
        return
    if not dry_run:
        summary = Event(task=task, kind=EventKind.COMPACTED, ts=now, actor="gc", epoch=baton.meta.epoch, data={
            "folded": len(fold), "kinds": {"touched": len(fold)},
            "first_ts": fold[0].ts.isoformat(), "last_ts": fold[-1].ts.isoformat()})
        removed = store.ledger.fold(task, sorted(gone), [summary])
        if removed != len(fold):  # cannot happen under one transaction; say so rather than hide it
            raise StoreError(f"folded {removed} rows of {task}, expected {len(fold)}")
    result.folded[task] = len(fold)


# -- the daemon's job and the CLI ----------------------------------------------------------


def gc_from_cli(args: Any) -> int:
    """``heartbeat gc [--dry-run] [--json]``."""
    from heartbeat.config.load import find_config, load_config
    from heartbeat.config.shape import Config
    from heartbeat.model.timeparse import parse_instant, utcnow
    from heartbeat.store import open_configured

    path = find_config(args.config)
    config = load_config(path) if path else Config()
    store, _ = open_configured(args.state_dir, args.config)
    now = parse_instant(args.now, field="--now") if getattr(args, "now", None) else utcnow()
    try:
        result = run_gc(store, config.retention, now=now, dry_run=args.dry_run)
    finally:
        store.close()
    if args.json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        print(result.render_text())
    return 0
