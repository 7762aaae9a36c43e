"""The file store under crashes, concurrency and hostile files: real processes, real SIGKILLs."""

from __future__ import annotations

import errno
import os
import resource
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from heartbeat.model import defaults
from heartbeat.model.baton import Baton, Meta
from heartbeat.model.errors import InvalidBaton, NotFound, StoreError, UnsafePath
from heartbeat.store.files import FileStore


def _new(store: FileStore, task_id: str, **extra: object) -> Baton:
    return store.create(Baton(task="Crash test", step="start", meta=Meta(id=task_id), extra=dict(extra)))


def _snapshot(path: Path) -> tuple[bytes, int]:
    st = os.lstat(path)
    return path.read_bytes() if stat.S_ISREG(st.st_mode) else b"", st.st_mtime_ns








class TestUnsafeFiles:
    def _refused_everywhere(self, store: FileStore, task_id: str, path: Path, error: type[Exception], message: str,
                            ) -> None:
        before = _snapshot(path)
        with pytest.raises(error, match=message):
            store.load(task_id)
        with pytest.raises(error, match=message):
            with store.edit(task_id) as ed:
                ed.baton.step = "overwrite"
        (entry,) = [e for e in store.scan() if e.id == task_id]
        assert entry.baton is None and entry.error is not None and message in str(entry.error)
        assert "\n" not in str(entry.error)
        assert _snapshot(path) == before, "a refused baton must be left exactly as it was"

    def test_symlinked_baton_is_refused(self, file_store: FileStore, state_dir: Path, tmp_path: Path) -> None:
        """A baton that is a symlink (even to a valid baton) is refused; neither link nor target changes."""
        _new(file_store, "real")
        target = tmp_path / "elsewhere.toml"
        target.write_bytes((state_dir / "batons" / "real.toml").read_bytes().replace(b'"real"', b'"link"'))
        link = state_dir / "batons" / "link.toml"
        link.symlink_to(target)
        target_before = _snapshot(target)
        self._refused_everywhere(file_store, "link", link, UnsafePath, "symbolic link")
        assert link.is_symlink() and _snapshot(target) == target_before

    def test_fifo_is_refused_without_blocking(self, file_store: FileStore, state_dir: Path) -> None:
        """A FIFO in place of a baton is refused at once: reading it must not wait for a writer."""
        fifo = state_dir / "batons" / "pipe.toml"
        os.mkfifo(fifo)
        done = threading.Event()

        def check() -> None:
            self._refused_everywhere(file_store, "pipe", fifo, UnsafePath, "not a regular file")
            done.set()

        thread = threading.Thread(target=check, daemon=True)
        thread.start()
        thread.join(10)
        assert done.is_set(), "reading a FIFO baton blocked (or failed)"

    def test_oversized_baton_is_refused(self, file_store: FileStore, state_dir: Path) -> None:
        """A baton over 1 MiB is refused naming its size, and left alone."""
        path = state_dir / "batons" / "big.toml"
        path.write_text('task = "t"\nstep = "s"\npad = "' + "x" * defaults.MAX_BATON_BYTES + '"\n')
        self._refused_everywhere(file_store, "big", path, InvalidBaton, "a baton may be at most 1048576 bytes")

    def test_unreadable_baton_is_refused(self, file_store: FileStore, state_dir: Path) -> None:
        """A baton this user cannot read (mode 000) is reported as unreadable, not skipped."""
        if os.geteuid() == 0:
            pytest.skip("running as root: chmod 000 does not stop root from reading the file")
        _new(file_store, "locked")
        path = state_dir / "batons" / "locked.toml"
        path.chmod(0)
        self._refused_everywhere(file_store, "locked", path, InvalidBaton, "unreadable: Permission denied")

    def test_directory_in_place_of_a_baton(self, file_store: FileStore, state_dir: Path) -> None:
        """A directory named like a baton is refused as not a regular file."""
        path = state_dir / "batons" / "dir.toml"
        path.mkdir()
        self._refused_everywhere(file_store, "dir", path, UnsafePath, "not a regular file")

    @pytest.mark.parametrize(("content", "message"), [
        ("task = \n", "not valid TOML"),
        ('task = "t"\nstep = 3\n', "step: expected a string, got 3"),
        ('task = "t"\nstep = "s"\n[meta]\nschema = 9\n', "meta.schema: written by a newer heartbeat"),
        ('task = "t"\nstep = "s"\n[meta]\nid = "other"\n', "meta.id: is 'other' but the file is named for 'bad'"),
    ])
    def test_invalid_baton_is_reported_and_kept(self, file_store: FileStore, state_dir: Path, content: str,
                                                message: str) -> None:
        """An invalid baton is listed with its error and never rewritten; the other tasks are still served."""
        _new(file_store, "good")
        path = state_dir / "batons" / "bad.toml"
        path.write_text(content)
        self._refused_everywhere(file_store, "bad", path, InvalidBaton, message)
        entries = {e.id: e for e in file_store.scan()}
        assert entries["good"].baton is not None
        with file_store.edit("good") as ed:
            ed.baton.step = "still served"
        assert file_store.load("good").step == "still served"

    def test_badly_named_file_is_listed_invalid(self, file_store: FileStore, state_dir: Path) -> None:
        """A *.toml whose name is not a task id shows up as invalid instead of being ignored or loaded."""
        (state_dir / "batons" / "Not An Id.toml").write_text('task = "t"\nstep = "s"\n')
        (entry,) = file_store.scan()
        assert entry.baton is None and "not a valid task id" in str(entry.error)

    def test_symlinked_lock_is_refused(self, file_store: FileStore, state_dir: Path, tmp_path: Path) -> None:
        """A lock file swapped for a symlink is refused, and what it points to is not touched."""
        _new(file_store, "a")
        victim = tmp_path / "victim"
        victim.write_text("precious")
        lock = state_dir / "locks" / "a.lock"
        if lock.exists():
            lock.unlink()
        lock.symlink_to(victim)
        with pytest.raises(StoreError, match="cannot open lock"):
            with file_store.edit("a") as ed:
                ed.baton.step = "x"
        assert victim.read_text() == "precious"

    def test_key_file_that_fails_to_read_is_fingerprinted_not_fatal(self, file_store: FileStore) -> None:
        """A key file whose read fails (EIO: /proc/self/mem, a failing disk) records `error:<errno>`;
        the write goes through instead of crashing."""
        if not os.path.exists("/proc/self/mem"):
            pytest.skip("needs Linux /proc")
        baton = file_store.create(Baton(task="t", step="s", workdir="/proc/self", key_files=["mem"],
                                        meta=Meta(id="proc")))
        assert baton.meta.world["mem"].startswith("error:")
        with file_store.edit("proc") as ed:
            ed.baton.step = "still writable"
        assert file_store.load("proc").step == "still writable"

    def test_missing_task_is_not_found(self, file_store: FileStore) -> None:
        """An id with no file is NotFound naming where it looked."""
        with pytest.raises(NotFound, match=r"looked for .*/batons/ghost\.toml"):
            file_store.load("ghost")


class TestStateDir:
    @pytest.mark.parametrize(("mode", "who"), [(0o777, "group- and world-writable"), (0o770, "group-writable"),
                                               (0o703, "world-writable")])
    def test_writable_by_others_is_refused_with_the_fix(self, tmp_path: Path, mode: int, who: str) -> None:
        """A state dir others can write to is refused, and the message says how to fix it."""
        path = tmp_path / "state"
        path.mkdir()
        path.chmod(mode)
        with pytest.raises(UnsafePath) as info:
            FileStore(str(path))
        assert f"state dir is {who}" in str(info.value)
        assert f"fix it with: chmod go-w {path}" in str(info.value)
        assert info.value.exit_code == 2

    def test_readable_by_group_is_fine(self, tmp_path: Path) -> None:
        """Only write access for others is refused: a 0750 state dir is used."""
        path = tmp_path / "state"
        path.mkdir()
        path.chmod(0o750)
        FileStore(str(path)).close()

    def test_created_private(self, tmp_path: Path) -> None:
        """A missing state dir is created 0700, with its batons and locks dirs, and batons are 0600."""
        path = tmp_path / "new" / "state"
        store = FileStore(str(path))
        _new(store, "a")
        store.close()
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert stat.S_IMODE((path / "batons").stat().st_mode) == 0o700
        assert stat.S_IMODE((path / "batons" / "a.toml").stat().st_mode) == 0o600
        assert stat.S_IMODE((path / "ledger.sqlite3").stat().st_mode) == 0o600

    def test_owned_by_another_user_is_refused(self, tmp_path: Path) -> None:
        """A state dir that belongs to another (non-root) user is refused with the chown fix."""
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        path = tmp_path / "state"
        path.mkdir(mode=0o700)
        os.chown(path, 54321, -1)
        with pytest.raises(UnsafePath, match=r"belongs to 54321, not to this user.*chown 0 "):
            FileStore(str(path))

    def test_writable_batons_dir_is_refused(self, state_dir: Path) -> None:
        """The check covers the batons dir too, not just the top."""
        (state_dir / "batons").mkdir(mode=0o777)
        (state_dir / "batons").chmod(0o777)
        with pytest.raises(UnsafePath, match="batons dir is group- and world-writable"):
            FileStore(str(state_dir))


class TestScanCache:
    def test_unchanged_files_are_not_reparsed(self, file_store: FileStore, state_dir: Path) -> None:
        """A second scan reuses the entries of files whose stat did not change, and re-reads changed ones."""
        for task_id in ("a", "b"):
            _new(file_store, task_id)
        first = {e.id: e for e in file_store.scan()}
        with file_store.edit("b") as ed:
            ed.baton.step = "moved"
        second = {e.id: e for e in file_store.scan()}
        assert second["a"] is first["a"]
        assert second["b"] is not first["b"]
        assert second["b"].baton is not None and second["b"].baton.step == "moved"

    def test_deleted_baton_leaves_the_listing(self, file_store: FileStore, state_dir: Path) -> None:
        """A baton removed by hand disappears from the next scan."""
        _new(file_store, "a")
        _new(file_store, "b")
        file_store.scan()
        (state_dir / "batons" / "a.toml").unlink()
        assert [e.id for e in file_store.scan()] == ["b"]

    def test_hand_edit_is_seen(self, file_store: FileStore, state_dir: Path) -> None:
        """A human's in-place edit (same inode) is picked up by the next scan."""
        _new(file_store, "a")
        file_store.scan()
        path = state_dir / "batons" / "a.toml"
        text = path.read_text().replace('step = "start"', 'step = "edited by hand, longer"')
        with open(path, "r+") as handle:
            handle.write(text)
            handle.truncate()
        assert _step_in_scan(file_store, "a") == "edited by hand, longer"


@contextmanager
def _out_of_descriptors(spare: int) -> Iterator[None]:
    """This process out of descriptors but ``spare``: the soft RLIMIT_NOFILE lowered and filled (both undone after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 32, hard))
    held: list[int] = []
    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                assert exc.errno == errno.EMFILE, exc
                break
        for _ in range(spare):
            os.close(held.pop())
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class TestReadErrorsPass:
    @pytest.mark.parametrize("next_scan", ["full", "trusted"])
    def test_a_baton_read_while_out_of_descriptors_is_read_again(self, file_store: FileStore, state_dir: Path,
                                                                 next_scan: str) -> None:
        """A read that fails with EMFILE shows the baton as unreadable in that scan only: the next scan,
        full or trusted (the daemon's between sweeps, told of no change), reads it again. A passing
        error was cached as "invalid" until the baton was rewritten: a task created during a
        descriptor flood stayed undispatched after it (issue 17, item 3)."""
        _new(file_store, "a")
        file_store.scan()
        other = FileStore(str(state_dir))  # another process creates b: this store has never read it
        _new(other, "b")
        other.close()
        with _out_of_descriptors(spare=1):  # one for the scan's listing, none for b's open
            during = {e.id: e for e in file_store.scan()}
        assert during["a"].baton is not None
        assert during["b"].baton is None and "unreadable: Too many open files" in str(during["b"].error)
        after = {e.id: e for e in file_store.scan(only=[] if next_scan == "trusted" else None)}
        assert after["b"].baton is not None and after["b"].error is None
        assert file_store.load("b").meta.id == "b"

    def test_an_unreadable_baton_is_read_again_once_it_may_be(self, file_store: FileStore,
                                                              state_dir: Path) -> None:
        """EACCES (mode 000) is reported while it lasts, and the baton is read once the mode is back,
        its stat otherwise unchanged."""
        if os.geteuid() == 0:
            pytest.skip("running as root: chmod 000 does not stop root from reading the file "
                        "(test_a_baton_read_while_out_of_descriptors_is_read_again covers the cache as root)")
        _new(file_store, "locked")
        path = state_dir / "batons" / "locked.toml"
        path.chmod(0)
        assert "Permission denied" in str(file_store.scan()[0].error)
        path.chmod(0o600)
        assert file_store.scan(only=[])[0].baton is not None

    def test_a_baton_that_fails_validation_stays_cached(self, file_store: FileStore, state_dir: Path) -> None:
        """A baton that was read and refused is remembered while its file is unchanged (not re-read each scan)."""
        (state_dir / "batons" / "bad.toml").write_text("task = 'half a baton\n")
        first = file_store.scan()[0]
        reads = file_store.reads
        assert first.error is not None and file_store.scan()[0] is first and file_store.reads == reads


class TestScanOnly:
    def test_only_the_named_files_are_looked_at(self, file_store: FileStore, state_dir: Path) -> None:
        """A scan given the changed tasks re-reads those alone: a change to another file waits for a full scan."""
        for task_id in ("a", "b", "c"):
            _new(file_store, task_id)
        first = {e.id: e for e in file_store.scan()}
        other = FileStore(str(state_dir))  # another process's writes: only the feed tells of them
        for task_id in ("a", "b"):
            with other.edit(task_id) as ed:
                ed.baton.step = f"moved {task_id}"
        other.close()
        second = {e.id: e for e in file_store.scan(only=["a"])}
        assert second["a"].baton is not None and second["a"].baton.step == "moved a"
        assert second["b"] is first["b"] and second["c"] is first["c"]  # b's change is not looked for
        assert not file_store.scan_unchanged
        assert _step_in_scan(file_store, "b") == "moved b"  # the full scan finds it

    def test_this_processs_own_writes_are_seen_before_the_feed_reports_them(self, file_store: FileStore,
                                                                            state_dir: Path) -> None:
        """The daemon's own write (a dispatch) is in its next trusted scan even when the feed lags:
        a stale entry there read as "no agent yet" and freed a slot the agent still held (CI: six
        agents under max_concurrent 5 in tests/system/test_resources.py's flood)."""
        _new(file_store, "a")
        file_store.scan()
        with file_store.edit("a") as ed:
            ed.baton.step = "dispatched"
        entry = {e.id: e for e in file_store.scan(only=[])}["a"]
        assert entry.baton is not None and entry.baton.step == "dispatched"

    def test_new_and_removed_files_among_the_named(self, file_store: FileStore, state_dir: Path) -> None:
        """A named file that appeared is added in id order; one that is gone leaves the listing."""
        _new(file_store, "b")
        _new(file_store, "d")
        file_store.scan()
        _new(file_store, "a")
        _new(file_store, "c")
        (state_dir / "batons" / "d.toml").unlink()
        assert [e.id for e in file_store.scan(only=["c", "a", "d"])] == ["a", "b", "c"]
        assert [e.id for e in file_store.scan()] == ["a", "b", "c"]

    def test_unchanged_named_file_keeps_the_listing_unchanged(self, file_store: FileStore, state_dir: Path) -> None:
        """A named file whose stat did not change keeps its entry, and the scan says nothing changed."""
        _new(file_store, "a")
        first = file_store.scan()
        again = file_store.scan(only=["a", "no-such-task"])
        assert again == first and again[0] is first[0]
        assert file_store.scan_unchanged

    def test_invalid_named_file_is_listed_with_its_error(self, file_store: FileStore, state_dir: Path) -> None:
        """A named file that no longer parses is listed as invalid, as a full scan lists it."""
        _new(file_store, "a")
        file_store.scan()
        (state_dir / "batons" / "a.toml").write_text("not toml [")
        (entry,) = file_store.scan(only=["a"])
        assert entry.baton is None and isinstance(entry.error, InvalidBaton)

    def test_an_empty_directory_s_scan_counts_as_the_full_scan(self, file_store: FileStore, state_dir: Path) -> None:
        """A first full scan that found nothing is trusted like any other: a later unreported baton waits."""
        assert file_store.scan() == []
        other = FileStore(str(state_dir))  # another process's write: only the feed tells of it
        _new(other, "a")
        other.close()
        assert file_store.scan(only=[]) == []
        assert [e.id for e in file_store.scan()] == ["a"]

    def test_before_any_full_scan_everything_is_looked_at(self, file_store: FileStore, state_dir: Path) -> None:
        """The first scan looks at every file even when told only some changed (it has nothing to trust yet)."""
        _new(file_store, "a")
        _new(file_store, "b")
        assert [e.id for e in file_store.scan(only=[])] == ["a", "b"]


    def test_a_quiet_trusted_scan_hands_back_the_last_list_and_a_change_a_new_one(self, file_store: FileStore) -> None:
        """A trusted scan that found nothing changed returns the previous trusted scan's list itself (a
        copy touched every entry: most of an idle daemon's CPU at 10,000 batons); a change, a task
        added or removed, or a full scan in between gives a fresh list that shows it."""
        for task_id in ("a", "b"):
            _new(file_store, task_id)
        file_store.scan()
        first = file_store.scan(only=[])
        assert file_store.scan(only=[]) is first and file_store.scan(only=["a"]) is first
        _new(file_store, "c")
        added = file_store.scan(only=["c"])
        assert added is not first and [e.id for e in added] == ["a", "b", "c"] and [e.id for e in first] == ["a", "b"]
        with file_store.edit("a") as ed:
            ed.baton.step = "moved on"
        edited = file_store.scan(only=["a"])
        assert edited is not added and edited[0].baton is not None and edited[0].baton.step == "moved on"
        (Path(file_store.batons_dir) / "b.toml").unlink()
        assert [e.id for e in file_store.scan(only=["b"])] == ["a", "c"]
        listed = file_store.scan(only=[])
        assert file_store.scan() is not listed and file_store.scan(only=[]) is not listed


def _step_in_scan(store: FileStore, task_id: str) -> str | None:
    for entry in store.scan():
        if entry.id == task_id and entry.baton is not None:
            return entry.baton.step
    return None
