"""The embedded store: a directory of TOML batons and an SQLite ledger.

Layout under the state dir (created 0700; refused when others can write to it)::

    batons/<id>.toml     one baton per task (0600)
    locks/<id>.lock      flock(2) target per baton, so writers of one task serialize
    logs/<id>/           agents' output, written by launchers; ``<epoch>.pulse``: agents' touches (heartbeat.hotpath.pulse)
    ledger.sqlite3       the ledger (WAL)
    format.toml          the state dir's format: ``version`` and ``min_reader`` (see :func:`check_format`)

A write is: temp file in ``batons/`` (named ``.<id>.toml.<pid>.<rand>.tmp``, which no
reader looks at), fsync, ledger append, rename over the baton, fsync of the
directory. A crash at any instant leaves the old baton or the new one. Temp files
orphaned by a killed writer are removed by :meth:`FileStore.scan` once their writer
is gone.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import stat
import time
import tomllib
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

from heartbeat.hotpath.pulse import apply_pulse
from heartbeat.hotpath.pulse import arm as _arm_pulse
from heartbeat.hotpath.pulse import fast_touch as _fast_touch
from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Status, check_id, dump_baton, parse_baton
from heartbeat.model.errors import (
    AlreadyExists,
    BadInput,
    Busy,
    HeartbeatError,
    InvalidBaton,
    NotFound,
    StoreError,
    UnreadableBaton,
    UnsafePath,
)
from heartbeat.model.ledger import Event, EventKind, Ledger, PendingWrite
from heartbeat.store import archive as _archive
from heartbeat.store.base import (
    Edit,
    Entry,
    Unwatch,
    Watching,
    check_fence,
    continue_above,
    created_data,
    finish_edit,
    now_or,
    start_create,
    write_identity,
)
from heartbeat.store.ledger import SqliteLedger
from heartbeat.system.layout import StateLayout
from heartbeat.system.safefile import (
    check_not_special,
    fsync_dir,
    open_parent,
    open_regular,
    read_fd,
    read_regular,
    replace_temp,
    write_file_atomic,
    write_temp,
)

__all__ = ["FileStore", "check_format", "ensure_private_dir", "format_text"]

def ensure_private_dir(path: str, *, what: str = "state dir") -> None:
    """Create ``path`` 0700 if missing; refuse it if others can write to it or it is not ours.

    Like sshd's StrictModes: a directory another user can write to would let them plant
    batons that make the daemon launch agents, so it is refused rather than used.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except PermissionError as exc:
        if _reachable(path):  # it is missing and its parent will not take it
            raise StoreError(f"cannot create {what}: {exc.strerror}: create it as its owner-to-be "
                             f"(mkdir -m 700 {path}) or point --state-dir elsewhere", path=path) from None
        raise StoreError(f"cannot reach {what}: {exc.strerror} (a directory on its path is closed to this user: "
                         f"run heartbeat as the state dir's owner, or see: namei -l {path})", path=path) from None
    except OSError as exc:
        raise StoreError(f"cannot create {what}: {exc.strerror}", path=path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{what} is not a directory", path=path)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = "group- and world-writable" if mode & 0o022 == 0o022 else (
            "group-writable" if mode & 0o020 else "world-writable")
        raise UnsafePath(f"{what} is {who} (mode {mode:04o}); fix it with: chmod go-w {path}", path=path)
    if st.st_uid not in (os.geteuid(), 0):
        import pwd

        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        raise UnsafePath(
            f"{what} belongs to {owner}, not to this user (uid {os.geteuid()}): run heartbeat as its owner "
            f"(e.g. sudo -u {owner} heartbeat ...), or if this user should own it: chown {os.geteuid()} {path}",
            path=path,
        )
    if not os.access(path, os.R_OK | os.X_OK):  # ours (or root's), yet closed to us: every read would fail later
        fix = f"chmod u+rwx {path}" if st.st_uid == os.geteuid() else "run heartbeat as root (sudo heartbeat ...)"
        raise UnsafePath(f"{what} is not readable by this user (mode {mode:04o}); fix it with: {fix}", path=path)


def _reachable(path: str) -> bool:
    """Whether this user can look ``path`` up (it may be missing): every directory above it is open."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


_FORMAT_LIMIT = 4096  # bytes of format.toml read: a few lines, whatever was put there


def format_text(version: int = defaults.STATE_FORMAT, min_reader: int = defaults.STATE_FORMAT_MIN_READER) -> str:
    """The text of ``format.toml`` for a state dir of ``version`` that code of ``min_reader`` may still use."""
    return (
        "# The format of this state dir (batons, ledger), written by heartbeat. A heartbeat whose\n"
        "# format is older than min_reader refuses the dir instead of misreading it.\n"
        f"version = {version}\nmin_reader = {min_reader}\n"
    )


_OUR_FORMAT = format_text().encode()


def check_format(layout: StateLayout) -> tuple[int, int]:
    """The state dir's format (version, min_reader), from ``format.toml``; written when missing.

    Code of format V uses a dir of format S when S <= V (an older one is this code's to read),
    or when S > V and min_reader <= V (an older heartbeat beside a newer one during an upgrade);
    otherwise it refuses the dir in one line, before reading or writing anything in it. A dir
    without the file predates it and is format 1; the file is then created exclusively (a newer
    heartbeat's marker written meanwhile is never replaced).
    """
    path = layout.format_file
    try:
        st = os.lstat(path)  # before the read: a file replaced meanwhile only makes the next open read again
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    seen = _seen_formats.get(path)
    if key is not None and seen is not None and seen[0] == key:
        return seen[1]
    found = _read_format(path)
    if key is not None:
        _seen_formats[path] = (key, found)
    return found


_seen_formats: dict[str, tuple[tuple[int, int, int, int], tuple[int, int]]] = {}
"""Per process: ``format.toml`` path -> (its lstat identity, the format it allowed). A store opened again
(the daemon's relay opens one per agent write) costs one ``lstat``, not a read; a changed file is read again."""


def _read_format(path: str) -> tuple[int, int]:
    """:func:`check_format` without the per-process memory."""
    try:
        try:
            raw = read_regular(path, _FORMAT_LIMIT)
        except FileNotFoundError:
            if _create_format(path):
                return defaults.STATE_FORMAT, defaults.STATE_FORMAT_MIN_READER
            raw = read_regular(path, _FORMAT_LIMIT)  # another process wrote it first
    except FileNotFoundError:
        return defaults.STATE_FORMAT, defaults.STATE_FORMAT_MIN_READER  # a read-only dir without one
    except OSError as exc:
        raise StoreError(f"cannot read the state dir's format: {exc.strerror}", path=path) from None
    if raw == _OUR_FORMAT:  # the usual case, without parsing
        return defaults.STATE_FORMAT, defaults.STATE_FORMAT_MIN_READER
    version, floor = _parse_format(raw, path)
    ours = defaults.STATE_FORMAT
    if version > ours and floor > ours:
        raise StoreError(
            f"the state dir's format is version {version}, newer than this heartbeat knows ({ours}), and needs "
            f"a heartbeat of format {floor} or newer (its min_reader): upgrade heartbeat on this host",
            path=path,
        )
    return version, floor


def _parse_format(raw: bytes, path: str) -> tuple[int, int]:
    fix = f"it should read: version = {defaults.STATE_FORMAT}, min_reader = {defaults.STATE_FORMAT_MIN_READER}"
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise StoreError(f"the state dir's format file is not TOML ({exc}); {fix}", path=path) from None
    version = _whole(doc.get("version"), "version", path, fix)
    return version, _whole(doc.get("min_reader", version), "min_reader", path, fix)


def _whole(value: object, name: str, path: str, fix: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise StoreError(f"the state dir's format file has no whole {name} >= 1; {fix}", path=path)
    return value


def _create_format(path: str) -> bool:
    """Write ``format.toml`` unless it exists by then; True when this process wrote it. A temp file is
    linked into place (``link(2)`` fails on an existing name), so no reader sees it half-written and
    no marker written meanwhile (a newer heartbeat's) is replaced. False too where nothing can be
    written (a read-only state dir)."""
    try:
        dir_fd = open_parent(path, follow=False)
    except OSError:
        return False
    try:
        name = os.path.basename(path)
        tmp = write_temp(dir_fd, name, format_text().encode())
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            return False
        finally:
            _unlink_quietly(tmp, dir_fd)
        os.fsync(dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FileStore:
    """Batons as files in ``<state_dir>/batons``; see the module docstring."""

    def __init__(self, state_dir: str, *, scan_view: Callable[[Baton], Baton] | None = None) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.scan_view = scan_view
        """What :meth:`scan` keeps and lists of each baton (the daemon's: :func:`heartbeat.model.baton.decision_view`);
        None: the whole baton. :meth:`load` and :meth:`edit` always read the whole baton."""
        ensure_private_dir(self.state_dir)
        self.layout = StateLayout(self.state_dir)
        self.format = check_format(self.layout)
        """The state dir's format (version, min_reader); a dir this code may not use was refused."""
        self.batons_dir = self.layout.batons_dir
        self.locks_dir = self.layout.locks_dir
        self.logs_dir = self.layout.logs_dir
        for sub, what in ((self.batons_dir, "batons dir"), (self.locks_dir, "locks dir")):
            ensure_private_dir(sub, what=what)
        _refuse_special_ledger(self.layout.ledger_file)
        self.ledger: Ledger = SqliteLedger(self.layout.ledger_file)
        self.lock_wait = defaults.LOCK_TIMEOUT
        """Seconds a write waits for a baton's lock before :class:`~heartbeat.model.errors.Busy` (the daemon shortens it)."""
        self._cache: dict[str, tuple[tuple[int, ...], Entry]] = {}
        self._sorted: list[Entry] = []
        self._listed: list[Entry] | None = None
        """What :meth:`_scan_only` last returned (see there); None after a full scan."""
        self._owned: set[str] = set()
        self._dirty: set[str] = set()
        """Tasks this process wrote since the last scan: a trusted scan (``only``) re-reads them
        whether or not the change feed has reported the write yet (it may lag far behind)."""
        """Scanned tasks whose baton names an owner: the ones whose pulses a trusted scan reads."""
        self.scan_unchanged = False
        """Whether the last :meth:`scan` found exactly the entries of the one before it."""
        self.reads = 0
        """Batons read by scans so far (see :attr:`heartbeat.store.base.Store.reads`)."""
        self._scanned = False
        """A full scan has filled the cache (a scan with ``only`` before it looks at everything)."""
        self._written: dict[str, tuple[bytes, Baton]] = {}
        """The last bytes this process wrote per baton, and the baton they came from: an
        agent's next update under the lock skips the parse when the file is still exactly that."""
        self._last_write: tuple[str, bytes, Baton] | None = None
        """The id, bytes and baton of this process's last baton write, for :meth:`arm_pulse`."""

    def path_of(self, task_id: str) -> str:
        return self.layout.baton(task_id)

    # -- reading ---------------------------------------------------------------------

    def load(self, task_id: str) -> Baton:
        check_id(task_id)
        baton = self._read(task_id)[0]
        apply_pulse(baton, self.logs_dir)  # an agent's fast touches count as touches (heartbeat.hotpath.pulse)
        return baton

    def _read(self, task_id: str) -> tuple[Baton, os.stat_result]:
        path = self.path_of(task_id)
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            raise NotFound(f"no such task (looked for {path})", task=task_id) from None
        except UnsafePath as exc:
            if "symbolic link" in exc.message:
                raise UnsafePath("is a symbolic link; heartbeat does not follow links in its state dir",
                                 path=path) from None
            raise UnsafePath("is not a regular file (a FIFO, device or directory)", path=path) from None
        except OSError as exc:
            raise UnreadableBaton(f"unreadable: {exc.strerror}", path=path) from None
        try:
            st = os.fstat(fd)
            if st.st_size > defaults.MAX_BATON_BYTES:
                raise InvalidBaton(
                    f"is {st.st_size} bytes; a baton may be at most {defaults.MAX_BATON_BYTES} bytes", path=path
                )
            data = read_fd(fd, defaults.MAX_BATON_BYTES + 1)
        except OSError as exc:
            raise UnreadableBaton(f"unreadable: {exc.strerror}", path=path) from None
        finally:
            os.close(fd)
        if len(data) > defaults.MAX_BATON_BYTES:
            raise InvalidBaton(f"grew past {defaults.MAX_BATON_BYTES} bytes while being read", path=path)
        mine = self._written.get(task_id)
        if mine is not None and mine[0] == data:
            # Exactly the bytes this process wrote last: parsing them would give this baton back.
            return mine[1].copy(), st
        return parse_baton(data, path=path, expected_id=task_id), st

    def scan(self, only: Collection[str] | None = None) -> list[Entry]:
        """Every baton in the directory; re-parses only files whose stat changed since the last scan.

        A quiet directory (every file unchanged, none added or removed) costs one ``stat`` per
        baton and gives back the previous pass's sorted list. With ``only`` (the tasks a watcher
        reported since the last scan) just those files are stat'ed, and every other entry is
        the last scan's: a quiet directory then costs nothing per baton, and the list returned is
        the last such scan's own object (the caller reads it, never changes it).
        """
        if only is not None and self._scanned:
            return self._scan_only(only)
        self._dirty = set()  # a full scan stats every file
        self._listed = None
        entries: list[Entry] = []
        changed = False
        cache = self._cache
        try:
            listing = os.scandir(self.batons_dir)
        except OSError as exc:
            raise StoreError(f"cannot list batons: {exc.strerror}", path=self.batons_dir) from None
        with listing:
            for de in listing:
                name = de.name
                if name[0] == ".":
                    if name.endswith(".tmp"):
                        self._reap_temp(de.path, name)
                    continue
                if not name.endswith(".toml"):
                    continue
                task_id = name[:-5]
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode)
                cached = cache.get(task_id)
                if cached is not None and cached[0] == key:
                    if cached[1].baton is not None:  # a pulse moves on without the baton changing
                        apply_pulse(cached[1].baton, self.logs_dir)
                    entries.append(cached[1])
                    continue
                changed = True
                entry = self._entry(task_id, de.path)
                if entry is None:
                    continue
                if _remembered(entry):
                    cache[task_id] = (key, entry)
                entries.append(entry)
        self.scan_unchanged = not changed and len(entries) == len(self._sorted)
        self._scanned = True
        if self.scan_unchanged:
            return list(self._sorted)  # the same entries as last time, hence the same order
        if len(cache) != len(entries):
            present = {e.id for e in entries}
            for gone in [task_id for task_id in cache if task_id not in present]:
                del cache[gone]
                self._owned.discard(gone)
        entries.sort(key=lambda e: e.id)
        self._sorted = entries
        return list(entries)

    def _scan_only(self, only: Collection[str]) -> list[Entry]:
        """:meth:`scan` trusting that no file but those of ``only`` changed since the last scan."""
        changed = False
        ordered = self._sorted
        dirty, self._dirty = self._dirty, set()
        for task_id in dirty.union(only):
            cached = self._cache.get(task_id)
            entry = self._look_again(task_id)
            at = bisect.bisect_left(ordered, task_id, key=_entry_id)
            present = at < len(ordered) and ordered[at].id == task_id
            if entry is None:
                if present:
                    del ordered[at]
                    changed = True
                self._cache.pop(task_id, None)
                self._owned.discard(task_id)
                continue
            if cached is not None and entry is cached[1]:
                continue
            changed = True
            if present:
                ordered[at] = entry
            else:
                ordered.insert(at, entry)
        for task_id in self._owned:
            # An owned task's agent may have pulsed (heartbeat.hotpath.pulse) without its baton changing:
            # the feed reports no pulse, so every owned entry looks at its pulse here.
            cached = self._cache.get(task_id)
            if cached is not None and cached[1].baton is not None:
                apply_pulse(cached[1].baton, self.logs_dir)
        self.scan_unchanged = not changed
        if changed or self._listed is None:
            self._listed = list(ordered)
        # A quiet pass gets the same list as the last (a copy would touch every entry: at 10,000
        # batons most of an idle daemon's CPU, cache misses all, once a second).
        return self._listed

    def _look_again(self, task_id: str) -> Entry | None:
        """The entry of ``<task_id>.toml`` now: the cached one while its stat is unchanged, a
        fresh one (re-read) otherwise, None when there is no such file (or a name no scan lists)."""
        if not task_id or task_id[0] == ".":
            return None
        path = self.path_of(task_id)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError:
            return self._cache[task_id][1] if task_id in self._cache else None
        key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode)
        cached = self._cache.get(task_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        entry = self._entry(task_id, path)
        if entry is not None and _remembered(entry):
            self._cache[task_id] = (key, entry)
        return entry

    def _entry(self, task_id: str, path: str) -> Entry | None:
        """A fresh entry for the baton file at ``path``: its baton, or the error that makes it invalid."""
        entry = Entry(id=task_id, path=path)
        self.reads += 1
        try:
            check_id(task_id)
            baton, _ = self._read(task_id)
            entry.baton = baton if self.scan_view is None else self.scan_view(baton)
            apply_pulse(entry.baton, self.logs_dir)
        except NotFound:
            self._owned.discard(task_id)
            return None
        except HeartbeatError as exc:
            if isinstance(exc, BadInput) and not exc.path:
                exc = InvalidBaton("file name is not a valid task id", path=path)
            entry.error = exc
            if isinstance(exc, UnreadableBaton):
                self._dirty.add(task_id)  # read again at the next scan, a trusted one too
        if entry.baton is not None and entry.baton.meta.owner is not None:
            self._owned.add(task_id)
        else:
            self._owned.discard(task_id)
        return entry

    def _reap_temp(self, path: str, name: str) -> None:
        # ".<id>.toml.<pid>.<rand>.tmp": the writer's pid tells whether it may still rename it.
        parts = name.rsplit(".", 3)
        try:
            pid = int(parts[1])
        except (IndexError, ValueError):
            return
        if not _pid_alive(pid):
            try:
                os.unlink(path)
            except OSError:
                pass

    # -- writing ---------------------------------------------------------------------

    @contextmanager
    def _locked(self, task_id: str, lock_path: str = "") -> Iterator[None]:
        lock_path = lock_path or self.layout.lock(task_id)
        try:
            fd = open_regular(lock_path, os.O_RDWR | os.O_CREAT, 0o600)  # a FIFO, a link: refused
        except UnsafePath as exc:
            raise StoreError(f"cannot open lock: {exc.message}", path=lock_path) from None
        except OSError as exc:
            raise StoreError(f"cannot open lock: {exc.strerror}", path=lock_path) from None
        try:
            wait = self.lock_wait
            deadline = time.monotonic() + wait
            delay = 0.0005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        what = "this baton's lock" if lock_path == self.layout.lock(task_id) else "the links lock"
                        raise Busy(
                            f"another writer has held {what} ({lock_path}) for {wait:g}s",
                            task=task_id,
                        ) from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def create(self, baton: Baton, *, actor: str = "", now: datetime | None = None) -> Baton:
        task_id = check_id(baton.meta.id)
        now = now_or(now)
        with self._locked(task_id):
            if os.path.lexists(self.path_of(task_id)):
                raise AlreadyExists("a task with this id exists already", task=task_id)
            new = start_create(baton, now)
            meta = new.meta
            # A task id used before (its baton deleted) continues above its history's revisions.
            meta.revision = self._highest_revision(task_id, "") + 1
            events = [Event(task=task_id, kind=EventKind.CREATED, ts=now, actor=actor, epoch=meta.epoch,
                            revision=meta.revision, data=created_data(new))]
            self._write(task_id, new, events, base="")
        return new

    @contextmanager
    def edit(
        self,
        task_id: str,
        *,
        expect_revision: int | None = None,
        epoch: int | None = None,
        actor: str = "",
        touch: bool = False,
        now: datetime | None = None,
        links: bool = False,
    ) -> Iterator[Edit]:
        check_id(task_id)
        # The links lock is always taken before a baton's, never while holding one.
        with self._locked(task_id, self.layout.links_lock) if links else nullcontext(), self._locked(task_id):
            old, _ = self._read(task_id)
            check_fence(old, expect_revision=expect_revision, epoch=epoch)
            base = write_identity(old)
            highest = self._highest_revision(task_id, base)
            ed = Edit(old=old, baton=old.copy(), now=now_or(now), actor=actor, touch=touch, reader=self.load)
            yield ed
            if ed.cancelled:
                return
            events = finish_edit(ed)
            continue_above(ed, events, highest)
            self._write(task_id, ed.baton, events, base=base)

    def _highest_revision(self, task_id: str, base: str) -> int:
        try:
            return self.ledger.highest_revision(task_id, base)
        except StoreError:
            # The ledger cannot be opened (a full disk cannot create its WAL): the write fails
            # at its own first step with the real reason, or at the ledger append.
            return 0

    def _write(self, task_id: str, baton: Baton, events: list[Event], *, base: str) -> None:
        path = self.path_of(task_id)
        data = dump_baton(baton).encode("utf-8")
        if len(data) > defaults.MAX_BATON_BYTES:
            raise BadInput(
                f"the baton would be {len(data)} bytes; a baton may be at most {defaults.MAX_BATON_BYTES}",
                task=task_id,
            )
        name = os.path.basename(path)
        try:
            dir_fd = open_parent(path)
        except OSError as exc:
            raise StoreError(f"cannot write the baton: {exc.strerror}; the previous baton is kept", path=path) from None
        tmp = ""
        try:
            tmp = write_temp(dir_fd, name, data)  # ".<id>.toml.<pid>.<rand>.tmp": no reader looks at it
            # The event goes in before the rename: a baton on disk always has its event.
            write = PendingWrite(task_id, base, write_identity(baton))
            self.ledger.append(events, write=write)
            replace_temp(dir_fd, tmp, name)
            tmp = ""
            self._dirty.add(task_id)
            try:
                self.ledger.landed(write)
            except StoreError:
                pass  # still pending: the next write finds this baton, the write's ``new``, and keeps its events
            self._last_write = (task_id, data, baton)
            if _plain(baton.extra) and _plain(baton.meta.extra):
                self._written[task_id] = (data, baton.copy())
            else:
                self._written.pop(task_id, None)
            try:
                os.fsync(dir_fd)
            except OSError as exc:
                raise StoreError(f"wrote the baton but could not fsync its directory: {exc.strerror}",
                                 path=path) from None
        except OSError as exc:
            raise StoreError(f"cannot write the baton: {exc.strerror}; the previous baton is kept", path=path) from None
        finally:
            if tmp:
                _unlink_quietly(tmp, dir_fd)
            os.close(dir_fd)

    def arm_pulse(self, task_id: str, epoch: int) -> bool:
        """Just after this process wrote ``task_id`` for the agent of ``epoch``: let that agent's
        next touches be pulses (:mod:`heartbeat.hotpath.pulse`) while the baton stays exactly as written.
        Only for an active task with an owner, at the baton's epoch; True when armed."""
        last = self._last_write
        if last is None or last[0] != task_id:
            return False
        _, data, baton = last
        meta = baton.meta
        if meta.epoch != epoch or meta.status is not Status.ACTIVE or meta.owner is None or meta.touched_at is None:
            return False
        touched = meta.touched_at.timestamp()
        return _arm_pulse(self.state_dir, task_id, epoch, data, touched, touched + defaults.TOUCH_COALESCE)

    def unlanded_ids(self, task_id: str) -> set[int]:
        """Event ids of the pending write of ``task_id`` whose rename never happened: the baton on disk is
        still the one it replaced (the ledger's check at the next write, asked now)."""
        ledger = self.ledger
        if not isinstance(ledger, SqliteLedger):
            return set()
        try:
            current, _ = self._read(task_id)
        except HeartbeatError:
            return set()
        return ledger.unlanded_ids(task_id, write_identity(current))

    def pulse(self, task_id: str, epoch: int) -> bool:
        """An agent's touch as a pulse (:func:`heartbeat.hotpath.pulse.fast_touch`, what its CLI
        ``touch`` does): no baton write, no ledger row, no wake-up of the daemon's watcher."""
        return _fast_touch(self.state_dir, task_id, epoch)

    def put_text(self, task_id: str, text: str) -> bool:
        """Write a baton's text verbatim (import, migrate) unless the id is taken; True when written."""
        check_id(task_id)
        path = self.path_of(task_id)
        parse_baton(text, path=path, expected_id=task_id)
        data = text.encode("utf-8")
        with self._locked(task_id):
            if os.path.lexists(path):
                return False
            try:
                write_file_atomic(path, data, fsync_dir=True)
            except OSError as exc:
                raise StoreError(f"cannot write the baton: {exc.strerror}", path=path) from None
        return True

    # -- archiving (heartbeat.store.base.Archiving: heartbeat gc) --------------------------

    def gc_lock(self, *, dry_run: bool = False) -> AbstractContextManager[None]:
        """A flock on ``<state_dir>/gc.lock`` for the whole gc; a dry run takes none."""
        return nullcontext() if dry_run else _archive.file_gc_lock(self.layout.gc_lock)

    def archive_text(self, task_id: str) -> bytes | None:
        return _archive.read_baton_bytes(self.path_of(task_id))

    def task_files(self, task_id: str) -> list[tuple[int, str, int]]:
        return _archive.epoch_files(self.logs_dir, task_id)

    def prune_files(self, task_id: str, paths: list[str]) -> list[tuple[str, int]]:
        return _archive.remove_epoch_files(self.logs_dir, task_id, paths)

    def write_archive(self, name: str, records: list[dict[str, Any]]) -> tuple[str, int]:
        """``<state_dir>/archive/<name>``, 0600, durably (:func:`heartbeat.store.archive.write_archive_file`)."""
        archive_dir = self.layout.archive_dir
        ensure_private_dir(archive_dir, what="archive dir")
        return _archive.write_archive_file(archive_dir, name, records)

    def retire(self, task_id: str, raw: bytes, events: list[Event], summary: Event) -> tuple[str, int]:
        """Under the baton's lock: the ledger's fold (one SQLite transaction), then the baton's
        unlink and its directory's fsync, then its logs. A crash between the fold and the unlink
        leaves a baton whose rows are archived: the next gc archives it again (a new record)."""
        try:
            with self._locked(task_id):
                if _archive.read_baton_bytes(self.path_of(task_id)) != raw:
                    return "the baton changed while it was being archived (revived?)", 0
                now = [e for e in self.ledger.events(task_id) if e.kind != EventKind.ARCHIVED]
                if not _archive.same_history(now, events):
                    return "new ledger events while it was being archived", 0
                self.ledger.fold(task_id, [e.id for e in events], [summary])
                os.unlink(self.path_of(task_id))
                fsync_dir(self.batons_dir, follow=False)
        except HeartbeatError as exc:
            return str(exc), 0
        return "", sum(size for _, size in _archive.remove_epoch_files(self.logs_dir, task_id, None))

    def archive_names(self) -> list[str]:
        """The files of ``<state_dir>/archive/`` named as gc names archives (temp files aside)."""
        try:
            names = os.listdir(self.layout.archive_dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list the archives: {exc.strerror}", path=self.layout.archive_dir) from None
        return sorted(n for n in names if _archive.ARCHIVE_NAME.fullmatch(n))

    def archive_records(self, name: str) -> list[dict[str, Any]]:
        path = os.path.join(self.layout.archive_dir, name)
        if not _archive.ARCHIVE_NAME.fullmatch(name):
            raise StoreError("not an archive file name", path=path)
        return list(_archive.read_archive(path))

    def archived_tasks(self) -> dict[str, tuple[Baton | None, list[Event]]]:
        marks = self.ledger.events(kinds=[EventKind.ARCHIVED])
        archive_dir = self.layout.archive_dir
        return _archive.resolve_marks(marks, lambda name: _archive.read_archive(os.path.join(archive_dir, name)))

    def record(self, events: list[Event]) -> None:
        self.ledger.append(events)

    def watch(self, callback: Callable[[str | None], None]) -> Unwatch:
        """Call ``callback(task_id)`` when a baton file is written, replaced or removed (inotify,
        through watchdog, from its thread), by anyone: a hand edit too. Returns ``stop``."""
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        batons_dir = self.batons_dir

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type not in ("created", "modified", "moved", "closed", "deleted"):
                    return
                for raw in (event.src_path, getattr(event, "dest_path", "")):
                    path = os.fsdecode(raw) if raw else ""
                    directory, name = os.path.split(path)
                    # Temp files (".<id>.toml.<pid>.<rand>.tmp") are no baton: their rename is.
                    if directory == batons_dir and not name.startswith(".") and name.endswith(".toml"):
                        callback(name[:-5])

        attach_alarm, detach_alarm = _overflow_alarm(callback)
        attach_alarm()
        observer = Observer()
        observer.schedule(Handler(), batons_dir, recursive=False)
        observer.start()

        def stop_watching(timeout: float = 5.0) -> None:
            observer.stop()
            observer.join(timeout=timeout)
            detach_alarm()

        def alive() -> bool:  # the observer's thread dispatches, its emitter's reads inotify: either may die
            return observer.is_alive() and all(emitter.is_alive() for emitter in list(observer.emitters))

        return Watching(stop_watching, alive)

    def close(self) -> None:
        self.ledger.close()


def _overflow_alarm(callback: Callable[[str | None], None]) -> tuple[Callable[[], None], Callable[[], None]]:
    """watchdog says that the kernel's inotify queue overflowed (events were lost) only by logging
    it: that record becomes ``callback(None)``, "writes may have been missed", so the daemon
    sweeps. Returns (attach, detach). (``logging`` is imported here: not on a CLI write's path.)"""
    import logging

    logger = logging.getLogger("watchdog.observers.inotify_c")

    class Alarm(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                overflowed = "overflow" in record.getMessage().lower()
            except Exception:  # a malformed record is not ours to fail on
                return
            if overflowed:
                callback(None)

    alarm = Alarm(logging.WARNING)

    def attach() -> None:
        if not logger.isEnabledFor(logging.WARNING):
            logger.setLevel(logging.WARNING)  # the warning must reach the alarm whatever the root says
        logger.addHandler(alarm)

    def detach() -> None:
        logger.removeHandler(alarm)

    return attach, detach


def _remembered(entry: Entry) -> bool:
    """Whether a scan may reuse ``entry`` while its file's stat is unchanged: a baton, or one that
    parsed and failed validation, yes; a read that failed (EMFILE, EACCES, EIO) may succeed next
    time, and is never latched as invalid."""
    return not isinstance(entry.error, UnreadableBaton)


def _entry_id(entry: Entry) -> str:
    return entry.id


def _refuse_special_ledger(path: str) -> None:
    """A FIFO (or device, link, directory) planted as the ledger or its WAL files is refused: SQLite
    would open it and wait on it for ever."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            check_not_special(path + suffix)
        except UnsafePath as exc:
            raise StoreError(f"cannot open the ledger: {exc.message}", path=exc.path) from None


def _plain(value: object) -> bool:
    """Only TOML's own types: what parsing the dumped text gives back unchanged."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, float):
        return value == value  # NaN never compares equal to itself
    return isinstance(value, (str, int, bool, datetime))


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
