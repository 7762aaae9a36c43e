"""Moving a state between stores: ``heartbeat export``, ``import`` and ``migrate``.

The portable form is JSON Lines: a header line, one line per baton holding its TOML text
exactly as stored (unknown keys, comments and layout survive), one line per record of each
archive ``heartbeat gc`` wrote (format 2; the records exactly as the archive holds them), then
one line per ledger event::

    {"heartbeat_export": 2}
    {"baton": "fix-auth", "text": "task = \\"...\\"\\n..."}
    {"archive": "20260301T000000000000Z.jsonl.gz", "record": {"task": "old", "baton": "...", ...}}
    {"event": {"ts": "...", "task": "fix-auth", "kind": "created", ...}}

A store that holds no archive exports format 1 (no archive lines), which older heartbeats
read; import reads both. The archives travel whole, through the stores'
:class:`~heartbeat.store.base.Archiving` capability (files into ``<state_dir>/archive/``, rows
into ``heartbeat_archive``), rewritten record for record (:func:`heartbeat.store.archive.pack`
is deterministic, so the target's archive is byte for byte the source's), so ``heartbeat
report`` on the target reads the history gc archived. Every ``archived`` event copied must
name an archive the export (or the target) holds, with a record of that task whose baton, sha256,
row count and kinds are the event's; an export where one does not is refused in one line,
nothing written. An archive the target already holds under the same name is kept when its
records are the same, and refused (nothing written) when they differ.

Importing is idempotent: a baton whose id the target already has is kept as it is (and
counted), and a task's events are copied only when the target has no events for that
task yet. Running the same import twice copies nothing twice.

``migrate`` (:func:`migrate`) is stricter, because its target is meant to replace its source:
a task the target already has must be the same there (the same baton text, and a ledger that is
the start of the source's, whose missing end is then copied); a target that contradicts the
source (a baton changed on either side since an earlier copy) is refused, nothing written,
rather than reported as copied. The command line also refuses to migrate beside a daemon
running on either state dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from heartbeat.model import defaults
from heartbeat.model.baton import check_id, dump_baton
from heartbeat.model.errors import BadInput, Conflict, HeartbeatError, InvalidBaton
from heartbeat.model.ledger import Event, EventKind
from heartbeat.store.archive import ARCHIVE_NAME
from heartbeat.store.base import Archiving, FileBacked, SharedStore, Store, TextImport
from heartbeat.system.safefile import read_regular

__all__ = ["FORMAT", "Counts", "export_lines", "import_lines", "migrate", "open_exact"]

FORMAT = 2
"""The export format's version (the header's ``heartbeat_export``): 2 adds archive lines."""

READS = (1, 2)
"""The formats import reads."""

Archives = dict[str, list[dict[str, Any]]]
"""Archives by name: their records, in order."""


@dataclass
class Counts:
    """What an export or import did."""

    batons: int = 0
    events: int = 0
    kept: int = 0
    """Batons the target already had, left as they were."""
    archives: int = 0
    """Archives (gc's) exported or written."""
    archives_kept: int = 0
    """Archives the target already held, the same."""
    skipped: list[str] = field(default_factory=list)
    """One line per baton left out (invalid in the source)."""

    def summary(self, verb: str) -> str:
        text = f"{verb} {self.batons} baton(s) and {self.events} event(s)"
        if self.archives:
            text = f"{verb} {self.batons} baton(s), {self.events} event(s) and {self.archives} archive(s)"
        if self.kept:
            text += f"; kept {self.kept} baton(s) the target already had"
        if self.archives_kept:
            text += f"; kept {self.archives_kept} archive(s) the target already held"
        if self.skipped:
            text += f"; left out {len(self.skipped)} invalid baton(s)"
        return text


def open_exact(where: str, *, must_exist: bool = False) -> Store:
    """A store named exactly: a ``postgresql://`` URL, else a state dir (no environment applies)."""
    from heartbeat.store import _open_url

    if where.startswith(("postgresql://", "postgres://")):
        return _open_url(where)
    if must_exist and not os.path.isdir(where):
        raise BadInput(f"{where}: no such state dir")
    from heartbeat.store.files import FileStore

    return FileStore(where)


def baton_text(store: Store, task_id: str) -> str:
    """A baton's text as the store keeps it: the file's bytes, the row's body."""
    if isinstance(store, SharedStore):
        return store.baton_text(task_id)
    if isinstance(store, FileBacked):
        path = store.path_of(task_id)
        data = read_regular(path, defaults.MAX_BATON_BYTES + 1)
        if len(data) > defaults.MAX_BATON_BYTES:  # never a cut baton in an export
            raise InvalidBaton(f"is larger than {defaults.MAX_BATON_BYTES} bytes", path=path)
        return data.decode("utf-8")
    return dump_baton(store.load(task_id))


def export_lines(store: Store, counts: Counts) -> Iterator[str]:
    """The export of ``store``, line by line (each ends in a newline). A damaged archive is a
    :class:`~heartbeat.model.errors.StoreError`: history is never left out of an export."""
    archives = store.archive_names() if isinstance(store, Archiving) else []
    yield json.dumps({"heartbeat_export": FORMAT if archives else 1}) + "\n"
    for entry in store.scan():
        if entry.error is not None or entry.baton is None:
            counts.skipped.append(f"{entry.id}: {entry.error}")
            continue
        try:
            text = baton_text(store, entry.id)
        except (OSError, UnicodeDecodeError, HeartbeatError) as exc:
            counts.skipped.append(f"{entry.id}: {exc}")
            continue
        counts.batons += 1
        yield json.dumps({"baton": entry.id, "text": text}, ensure_ascii=False) + "\n"
    if isinstance(store, Archiving):
        for name in archives:
            for record in store.archive_records(name):
                yield json.dumps({"archive": name, "record": record}, ensure_ascii=False, sort_keys=True) + "\n"
            counts.archives += 1
    for event in store.ledger.events():
        counts.events += 1
        record = event.to_json()
        del record["id"]
        yield json.dumps({"event": record}, ensure_ascii=False, default=str) + "\n"


@dataclass
class Parsed:
    """An export read whole: batons ``(id, text)``, events, archives."""

    batons: list[tuple[str, str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    archives: Archives = field(default_factory=dict)
    first_line: dict[str, int] = field(default_factory=dict)
    """Task id -> the line of its first event (for a one-line refusal)."""


MAX_EVENT_NUMBER = 2**53
"""The largest epoch or revision an imported event may carry (a ledger's columns hold 2**63 - 1;
no real task comes near either)."""


_KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""An event kind as the ledger writes them (a newer heartbeat's words too): a short word."""


def _kind(value: object) -> str:
    if not isinstance(value, str) or not _KIND.fullmatch(value):
        raise BadInput(f"kind {str(value)[:40]!r}, not a word of a-z 0-9 _ (at most 64)")
    return value


def _whole(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EVENT_NUMBER:
        raise BadInput(f"{name} {str(value)[:40]!r} is not a whole number from 0 to 2**53")
    return value


def _parse(lines: Iterable[str], where: str) -> Parsed:
    parsed = Parsed()
    batons, events, archives = parsed.batons, parsed.events, parsed.archives
    header = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc: Any = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{where}:{number}: not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise BadInput(f"{where}:{number}: not a JSON object")
        if not header:
            if doc.get("heartbeat_export") not in READS or isinstance(doc.get("heartbeat_export"), bool):
                raise BadInput(f"{where}:{number}: not a heartbeat export (format 1 or 2) header")
            header = True
        elif "baton" in doc:
            task_id, text = doc.get("baton"), doc.get("text")
            if not isinstance(task_id, str) or not isinstance(text, str):
                raise BadInput(f"{where}:{number}: a baton line needs a string id and text")
            batons.append((check_id(task_id), text))
        elif "archive" in doc:
            name, record = doc.get("archive"), doc.get("record")
            if not isinstance(name, str) or not ARCHIVE_NAME.fullmatch(name):
                raise BadInput(f"{where}:{number}: an archive line needs an archive name as gc makes them "
                               f"(like 20260301T000000000000Z.jsonl.gz), not {name!r}")
            if not isinstance(record, dict):
                raise BadInput(f"{where}:{number}: an archive line needs a record (a JSON object)")
            archives.setdefault(name, []).append(record)
        elif "event" in doc and isinstance(doc["event"], dict):
            e = doc["event"]
            try:
                events.append(Event(task=check_id(e["task"]), kind=_kind(e["kind"]),
                                    ts=datetime.fromisoformat(e["ts"]), epoch=_whole(e.get("epoch", 0), "epoch"),
                                    revision=_whole(e.get("revision", 0), "revision"),
                                    actor=str(e.get("actor", "")), data=dict(e.get("data") or {})))
            except (KeyError, TypeError, ValueError) as exc:
                raise BadInput(f"{where}:{number}: a malformed event: {exc}") from None
            except BadInput as exc:
                raise BadInput(f"{where}:{number}: an event with {exc.message}; nothing was written") from None
            if events[-1].ts.tzinfo is None:
                raise BadInput(f"{where}:{number}: an event time without a time zone")
            parsed.first_line.setdefault(events[-1].task, number)
        else:
            raise BadInput(f"{where}:{number}: neither a baton, an archive record nor an event")
    if not header:
        raise BadInput(f"{where}: empty: not a heartbeat export")
    return parsed


def _shown(text: str) -> str:
    """``text`` for a one-line message: as it is when printable, else quoted (a newline shows as \\n)."""
    return text if text.isprintable() else repr(text)


def _record_mismatch(mark: Event, records: list[dict[str, Any]]) -> str:
    """Why the archive's ``records`` do not hold what the ``archived`` event ``mark`` says; "" when they do."""
    task = _shown(mark.task)
    sha = mark.data.get("baton_sha256")
    found = [r for r in records if r.get("task") == mark.task and r.get("baton_sha256") == sha]
    if not found:
        return f"has no record of task {task} with the baton its archived event names"
    record = found[-1]
    baton = record.get("baton")
    if not isinstance(baton, str) or hashlib.sha256(baton.encode("utf-8")).hexdigest() != sha:
        return f"holds a baton of task {task} whose sha256 is not its archived event's"
    events = record.get("events")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        return f"holds task {task}'s events in no list of events"
    if "rows" in mark.data and len(events) != mark.data["rows"]:
        return f"holds {len(events)} event(s) of task {task}, its archived event says {mark.data['rows']!r}"
    if "kinds" in mark.data and dict(Counter(str(e.get("kind")) for e in events)) != mark.data["kinds"]:
        return f"holds task {task}'s events of other kinds than its archived event counts"
    return ""


def _plan_archives(target: Store, archives: Archives, events: list[Event], where: str) -> tuple[Archives, int]:
    """The archives to write into ``target`` and how many it holds already (the same); checks,
    before anything is written, that every ``archived`` event in ``events`` names an archive the
    export or the target holds, whose record matches it. BadInput when one does not; Conflict
    when the target holds an archive of the same name with other records."""
    marks = [e for e in events if e.kind == EventKind.ARCHIVED]
    if not archives and not marks:
        return {}, 0
    if not isinstance(target, Archiving):
        raise BadInput("this store cannot hold archives")
    held = set(target.archive_names())
    new: Archives = {}
    kept = 0
    for name, records in archives.items():
        if name not in held:
            new[name] = records
        elif target.archive_records(name) == records:
            kept += 1
        else:
            raise Conflict(f"the target holds an archive {name} with other records; nothing was written")
    for mark in marks:
        task, named = _shown(mark.task), mark.data.get("archive")
        if not isinstance(named, str) or not ARCHIVE_NAME.fullmatch(named):
            raise BadInput(f"{where}: task {task}'s archived event names no archive ({named!r}); "
                           "nothing was written")
        if named in archives:
            records = archives[named]
        elif named in held:
            records = target.archive_records(named)
        else:
            raise BadInput(f"{where}: task {task}'s archived event names the archive {named}, which neither "
                           "the export nor the target holds; nothing was written")
        why = _record_mismatch(mark, records)
        if why:
            raise BadInput(f"{where}: the archive {named} {why}; nothing was written")
    return new, kept


def _write_archives(target: Store, archives: Archives) -> None:
    """Write the planned archives (before any event that names them: a write cut short leaves an
    archive no event names yet, which the report ignores and the next run keeps)."""
    if isinstance(target, Archiving):
        for name, records in archives.items():
            target.write_archive(name, records)


def import_lines(store: Store, lines: Iterable[str], *, where: str = "import") -> Counts:
    """Import an export into ``store``; see the module docstring for what is kept."""
    from heartbeat.model.baton import parse_baton

    parsed = _parse(lines, where)
    batons = parsed.batons
    for task_id, text in batons:  # all valid before anything is written
        parse_baton(text, path=f"{where}:{task_id}", expected_id=task_id)
    if not isinstance(store, TextImport):
        raise BadInput("this store cannot import batons")
    counts = Counts()
    had_events = {e.task for e in store.ledger.events()}
    new_events = [e for e in parsed.events if e.task not in had_events]
    _refuse_orphans(store, parsed, new_events, where)
    new_archives, counts.archives_kept = _plan_archives(store, parsed.archives, new_events, where)
    _write_archives(store, new_archives)
    counts.archives = len(new_archives)
    if new_events:
        store.ledger.append(new_events)
    counts.events = len(new_events)
    for task_id, text in batons:
        if store.put_text(task_id, text):
            counts.batons += 1
        else:
            counts.kept += 1
    return counts


def _refuse_orphans(store: Store, parsed: Parsed, events: list[Event], where: str) -> None:
    """Refuse events of a task with no baton in the export or the target and no ``archived`` mark
    (gc's summary of a task whose baton it archived): rows no ``status`` shows, whose revisions a
    later ``new`` of that id would continue. BadInput naming the first such line; nothing written."""
    have = {task_id for task_id, _ in parsed.batons} | {e.task for e in events if e.kind == EventKind.ARCHIVED}
    orphans = {e.task for e in events} - have
    if orphans:
        orphans -= {entry.id for entry in store.scan()}
    if orphans:
        task = min(orphans, key=lambda t: parsed.first_line.get(t, 0))
        more = f" (and {len(orphans) - 1} more task(s))" if len(orphans) > 1 else ""
        raise BadInput(f"{where}:{parsed.first_line.get(task, 0)}: events of task {task}, which has no baton in the "
                       f"export or the store{more}; nothing was written")


def _same_event(a: Event, b: Event) -> bool:
    """The same ledger row on both sides. A touch row is rewritten in place while its minute lasts
    (coalescing), so a copy of it is the same row whatever its time and data."""
    if a.kind == EventKind.TOUCHED and b.kind == EventKind.TOUCHED:
        return a.epoch == b.epoch
    return (a.kind, a.ts, a.epoch, a.revision, a.actor, a.data) == (b.kind, b.ts, b.epoch, b.revision, b.actor, b.data)


def _by_task(events: Iterable[Event]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = {}
    for event in events:
        out.setdefault(event.task, []).append(event)
    return out


def migrate(source: Store, target: Store, *, where: str = "migrate") -> tuple[Counts, list[str]]:
    """Copy ``source`` into ``target``, which is to replace it; the counts, and the invalid
    batons left out. Raises :class:`Conflict` (nothing written) when the target contradicts the
    source: a baton whose text differs on the two sides, or a task whose ledger in the target is
    not the start of the source's. A task the target has the same gets the source's later events."""
    from heartbeat.model.baton import parse_baton

    exported = Counts()
    parsed = _parse(export_lines(source, exported), where)
    batons, events = parsed.batons, parsed.events
    for task_id, text in batons:
        parse_baton(text, path=f"{where}:{task_id}", expected_id=task_id)
    put = getattr(target, "put_text", None)
    if put is None:
        raise BadInput("this store cannot import batons")
    theirs = _by_task(target.ledger.events())
    contradictions: list[str] = []
    new_batons: list[tuple[str, str]] = []
    kept = 0
    for task_id, text in batons:
        try:
            there = baton_text(target, task_id)
        except (HeartbeatError, OSError):  # (NotFound: not copied yet)
            new_batons.append((task_id, text))
            continue
        if there != text:
            contradictions.append(f"{task_id} (its baton differs: changed on one side since an earlier copy)")
        else:
            kept += 1
    new_events: list[Event] = []
    for task_id, ours in _by_task(events).items():
        had = theirs.get(task_id, [])
        if len(had) > len(ours) or not all(_same_event(a, b) for a, b in zip(had, ours, strict=False)):
            contradictions.append(f"{task_id} (the target's ledger is not the start of the source's)")
            continue
        new_events.extend(ours[len(had):])
    if contradictions:
        first = sorted(set(contradictions))
        more = f" and {len(first) - 3} more" if len(first) > 3 else ""
        raise Conflict(f"the target contradicts the source for {', '.join(first[:3])}{more}; nothing was written: "
                       "migrate into an empty store, or stop whatever writes to the target")
    new_archives, archives_kept = _plan_archives(target, parsed.archives, new_events, where)
    _write_archives(target, new_archives)
    if new_events:
        target.ledger.append(new_events)
    counts = Counts(events=len(new_events), kept=kept, archives=len(new_archives), archives_kept=archives_kept)
    for task_id, text in new_batons:
        if put(task_id, text):
            counts.batons += 1
        else:  # written meanwhile: the target is not this migration's alone
            raise Conflict(f"{task_id}: written in the target during the migration; stop whatever writes to it")
    return counts, exported.skipped


def write_export(store: Store, out: IO[str]) -> Counts:
    counts = Counts()
    for line in export_lines(store, counts):
        out.write(line)
    return counts
