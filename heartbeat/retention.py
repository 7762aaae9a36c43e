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

import errno
import fcntl
import gzip
import hashlib
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from heartbeat.baton import Baton, GateKind, Status
from heartbeat.config import RetentionConfig
from heartbeat.errors import HeartbeatError, StoreError
from heartbeat.layout import StateLayout
from heartbeat.ledger import Event, tally
from heartbeat.safefile import fsync_dir, write_file_atomic
from heartbeat.store.archive import RETENTION_KINDS, read_archive, read_archived

__all__ = [
    "RETENTION_KINDS",
    "GcResult",
    "run_gc",
    "read_archived",
    "EPOCH_FILE",
]

EPOCH_FILE = re.compile(r"(\d{1,18})\.(log|log\.1|brief\.md|exit|pid|pulse|lease)")
"""The names of an epoch's files under ``logs/<id>/``; nothing else there is ever removed."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def run_gc(store: Any, config: RetentionConfig, *, now: datetime, dry_run: bool = False) -> GcResult:
    """One gc pass over a file store (see the module doc). ``now`` decides every age.
    Another store is refused in one line, nothing changed: retention is the file store's only."""
    from heartbeat.store.files import FileStore

    if not isinstance(store, FileStore):
        raise StoreError("gc works on the file store only: retention on a database store is not built yet "
                         "(nothing was changed)")
    result = GcResult(dry_run=dry_run, now=now)
    state_dir: str = store.state_dir
    ledger: Any = store.ledger  # (the file store's SQLite ledger, which counts its rows)
    result.ledger_rows_before = ledger.count()
    with _gc_lock(state_dir, dry_run):
        entries = {e.id: e for e in store.scan()}
        cutoff = now - timedelta(seconds=config.finished_after)
        finished = {Status.DONE, Status.FAILED} if config.archive_failed else {Status.DONE}
        candidates = [e.baton for e in entries.values()
                      if e.baton is not None and e.error is None and _archivable(e.baton, cutoff, finished)]
        needed = _needed_upstreams(entries.values(), {b.meta.id for b in candidates})
        for baton in [b for b in candidates if b.meta.id in needed]:
            candidates.remove(baton)
            result.skipped.append((baton.meta.id, f"kept: task {needed[baton.meta.id]} depends on it"))
        archived = _archive(store, candidates, result, now=now, dry_run=dry_run)
        for task_id, entry in entries.items():
            if task_id in archived or entry.baton is None or entry.error is not None:
                continue
            _prune_epochs(store.logs_dir, task_id, entry.baton.meta.epoch, config.keep_epochs, result, dry_run)
            if entry.baton.meta.status in (Status.DONE, Status.FAILED):
                _fold_touches(store, entry.baton, result, now=now, dry_run=dry_run)
    result.ledger_rows_after = ledger.count() if not dry_run else (
        result.ledger_rows_before
        - sum(result.folded.values()) + len(result.folded)
        - result.archived_rows + len(result.archived))
    return result


@contextmanager
def _gc_lock(state_dir: str, dry_run: bool) -> Iterator[None]:
    """One gc at a time per state dir (the daemon's job and ``heartbeat gc``); a dry run takes none."""
    if dry_run:
        yield
        return
    path = StateLayout(state_dir).gc_lock
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot open the gc lock: {exc.strerror}", path=path) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError("another gc is running on this state dir", path=path) from None
        yield
    finally:
        os.close(fd)


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


def _prune_epochs(logs_dir: str, task_id: str, current: int, keep: int, result: GcResult, dry_run: bool) -> None:
    fd = _open_task_dir(logs_dir, task_id)
    if fd is None:
        return
    try:
        files = _epoch_files(fd)
        epochs = sorted({epoch for epoch, _, _ in files}, reverse=True)
        kept = set(epochs[:max(1, keep)])
        for epoch, name, size in files:
            if epoch in kept or epoch >= current:
                continue
            if dry_run or _unlink_at(fd, name):
                result.removed_files.append((os.path.join(logs_dir, task_id, name), size))
    finally:
        os.close(fd)


def _open_task_dir(logs_dir: str, task_id: str) -> int | None:
    """A descriptor on ``logs/<id>``, a real directory reached through no symlink, or None."""
    try:
        parent = os.open(logs_dir, _DIR_FLAGS)
    except OSError:
        return None  # missing, a symlink (ELOOP), not a directory: nothing of ours to prune
    try:
        return os.open(task_id, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)


def _epoch_files(fd: int) -> list[tuple[int, str, int]]:
    """``(epoch, name, bytes)`` of the entries named like an epoch's files; sizes from lstat."""
    found = []
    for name in os.listdir(fd):
        match = EPOCH_FILE.fullmatch(name)
        if match is None:
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        found.append((int(match.group(1)), name, st.st_size if stat.S_ISREG(st.st_mode) else 0))
    return found


def _unlink_at(fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EISDIR, errno.EPERM, errno.EACCES):
            return False
        raise StoreError(f"cannot remove {name}: {exc.strerror}") from None
    return True


def _remove_task_logs(logs_dir: str, task_id: str) -> int:
    """Remove an archived task's epoch files (and its directory when that leaves it empty)."""
    fd = _open_task_dir(logs_dir, task_id)
    if fd is None:
        return 0
    freed = 0
    try:
        for _, name, size in _epoch_files(fd):
            if _unlink_at(fd, name):
                freed += size
        empty = not os.listdir(fd)
    finally:
        os.close(fd)
    if empty:
        try:
            parent = os.open(logs_dir, _DIR_FLAGS)
        except OSError:
            return freed
        try:
            os.rmdir(task_id, dir_fd=parent)
        except OSError:
            pass
        finally:
            os.close(parent)
    return freed


# -- archiving -----------------------------------------------------------------------------


@dataclass
class _Candidate:
    task: str
    raw: bytes
    events: list[Event]
    record: dict[str, Any]


def _read_baton_bytes(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _event_json(e: Event) -> dict[str, Any]:
    return e.to_json()


def _archive(store: Any, batons: list[Baton], result: GcResult, *, now: datetime, dry_run: bool) -> set[str]:
    if not batons:
        return set()
    candidates: list[_Candidate] = []
    for baton in batons:
        task = baton.meta.id
        raw = _read_baton_bytes(store.path_of(task))
        if raw is None:
            result.skipped.append((task, "baton unreadable"))
            continue
        # An earlier ``archived`` mark of this id (a task archived, then made again) stays in the ledger.
        events = [e for e in store.ledger.events(task) if e.kind != "archived"]
        record = {"task": task, "archived_at": now.isoformat(), "baton": raw.decode("utf-8"),
                  "baton_sha256": hashlib.sha256(raw).hexdigest(), "events": [_event_json(e) for e in events]}
        candidates.append(_Candidate(task, raw, events, record))
    if not candidates:
        return set()
    if dry_run:
        for c in candidates:
            result.archived.append(c.task)
            result.archived_rows += len(c.events)
            result.archived_bytes += len(c.raw) + _logs_bytes(store.logs_dir, c.task)
        return set(result.archived)
    archive_dir = StateLayout(store.state_dir).archive_dir
    from heartbeat.store.files import ensure_private_dir

    ensure_private_dir(archive_dir, what="archive dir")
    name = f"{now.strftime('%Y%m%dT%H%M%S%f')}Z.jsonl.gz"
    path = os.path.join(archive_dir, name)
    if os.path.lexists(path):
        raise StoreError("an archive of this instant exists already (run gc again)", path=path)
    lines = [json.dumps(c.record, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n" for c in candidates]
    _write_durably(path, gzip.compress(b"".join(lines), compresslevel=6, mtime=0))
    _verify_archive(path, [c.record for c in candidates])
    result.archive_file = path
    result.archive_file_bytes = os.stat(path, follow_symlinks=False).st_size
    done: set[str] = set()
    for c in candidates:
        why = _retire(store, c, name, now)
        if why:
            result.skipped.append((c.task, why))
            continue
        done.add(c.task)
        result.archived.append(c.task)
        result.archived_rows += len(c.events)
        result.archived_bytes += len(c.raw) + _remove_task_logs(store.logs_dir, c.task)
    return done


def _logs_bytes(logs_dir: str, task: str) -> int:
    fd = _open_task_dir(logs_dir, task)
    if fd is None:
        return 0
    try:
        return sum(size for _, _, size in _epoch_files(fd))
    finally:
        os.close(fd)


def _write_durably(path: str, data: bytes) -> None:
    try:
        write_file_atomic(path, data, fsync_dir=True, follow=False)
    except OSError as exc:
        raise StoreError(f"cannot write the archive: {exc.strerror}; nothing was archived", path=path) from None


def _verify_archive(path: str, expected: list[dict[str, Any]]) -> None:
    """Read the archive back from disk; every record must be exactly what was meant to go in."""
    got = list(read_archive(path))
    if got != expected:
        raise StoreError("the archive read back differs from what was written; nothing was archived", path=path)


def _retire(store: Any, c: _Candidate, archive_name: str, now: datetime) -> str:
    """Under the baton's lock: swap the task's rows for one ``archived`` event, remove the baton.
    Returns why not ("" when done)."""
    try:
        with store._locked(c.task):
            raw = _read_baton_bytes(store.path_of(c.task))
            if raw != c.raw:
                return "the baton changed while it was being archived (revived?)"
            events = [e for e in store.ledger.events(c.task) if e.kind != "archived"]
            if [e.id for e in events] != [e.id for e in c.events] or [e.ts for e in events] != [
                    e.ts for e in c.events]:
                return "new ledger events while it was being archived"
            summary = Event(task=c.task, kind="archived", ts=now, actor="gc", data={
                "archive": archive_name,
                "rows": len(c.events),
                "baton_sha256": c.record["baton_sha256"],
                "kinds": dict(Counter(e.kind for e in c.events)),
                "counted": tally(c.events),  # the metrics' counters keep counting these (heartbeat.metrics)
                "first_ts": c.events[0].ts.isoformat() if c.events else None,
                "last_ts": c.events[-1].ts.isoformat() if c.events else None,
            })
            store.ledger.fold(c.task, [e.id for e in c.events], [summary])
            os.unlink(store.path_of(c.task))
            fsync_dir(store.batons_dir, follow=False)
    except HeartbeatError as exc:
        return str(exc)
    return ""


# -- folding touches -----------------------------------------------------------------------

_STARTS = frozenset({"dispatched", "claimed", "created"})
_AGENT_WRITES = frozenset({"updated", "touched", "blocked", "snoozed", "released", "done", "failed"})


def foldable_touches(events: list[Event]) -> list[Event]:
    """``touched`` rows no report metric reads: before the task's last finish, carrying no
    world or change, and not the first agent write since the latest start."""
    finished = [e.ts for e in events if e.kind in ("done", "failed")]
    if not finished:
        return []
    end = finished[-1]
    out: list[Event] = []
    written: set[int] = set()  # epochs with an agent write since the latest start
    for e in events:
        if e.kind in _STARTS:
            written.clear()
        if e.kind == "touched" and e.ts < end and not (set(e.data) & {"world", "changed"}) \
                and e.epoch in written and e.actor != "daemon":
            out.append(e)
            continue
        if e.kind in _AGENT_WRITES and e.actor != "daemon":
            written.add(e.epoch)
    return out


def _fold_touches(store: Any, baton: Baton, result: GcResult, *, now: datetime, dry_run: bool) -> None:
    from heartbeat.report import task_incidents

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
        summary = Event(task=task, kind="compacted", ts=now, actor="gc", epoch=baton.meta.epoch, data={
            "folded": len(fold), "kinds": {"touched": len(fold)},
            "first_ts": fold[0].ts.isoformat(), "last_ts": fold[-1].ts.isoformat()})
        removed = store.ledger.fold(task, sorted(gone), [summary])
        if removed != len(fold):  # cannot happen under one transaction; say so rather than hide it
            raise StoreError(f"folded {removed} rows of {task}, expected {len(fold)}")
    result.folded[task] = len(fold)


# -- the daemon's job and the CLI ----------------------------------------------------------


def gc_from_cli(args: Any) -> int:
    """``heartbeat gc [--dry-run] [--json]``."""
    from heartbeat.config import Config, find_config, load_config
    from heartbeat.store import open_configured
    from heartbeat.timeparse import parse_instant, utcnow

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
