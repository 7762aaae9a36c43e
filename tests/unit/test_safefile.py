"""The one way heartbeat writes a file whole (``heartbeat.system.safefile.write_*``), its reads of planted files, and the
state dir's layout."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from heartbeat.launchers import shim
from heartbeat.model.errors import UnsafePath
from heartbeat.system.layout import StateLayout
from heartbeat.system.safefile import (
    open_atomic,
    open_parent,
    read_regular,
    read_tail_below,
    write_atomic,
    write_file_atomic,
    write_temp,
)


class TestAtomicWrites:
    """Temp file, exact mode, rename; nothing planted is followed or written into; nothing left behind."""

    def test_write_replaces_the_file_with_the_exact_mode_whatever_the_umask(self, tmp_path: Path) -> None:
        """A write lands whole, with the mode asked for even under a restrictive umask, and leaves no temp file."""
        target = tmp_path / "config.toml"
        target.write_text("old")
        old = os.umask(0o077)
        try:
            write_file_atomic(str(target), b"new", mode=0o644, fsync_dir=True)
        finally:
            os.umask(old)
        assert target.read_bytes() == b"new"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]

    def test_chunks_are_written_in_order(self, tmp_path: Path) -> None:
        """Data given as chunks (a log's tail copied piece by piece) is written whole, in order."""
        fd = open_parent(str(tmp_path / "x"))
        try:
            write_atomic(fd, "x", iter([b"a" * 70_000, b"b", b"c"]))
        finally:
            os.close(fd)
        assert (tmp_path / "x").read_bytes() == b"a" * 70_000 + b"bc"

    def test_a_symlink_at_the_name_is_replaced_not_followed(self, tmp_path: Path) -> None:
        """A symlink planted at the target's name is replaced by the file; what it pointed to is untouched."""
        victim = tmp_path / "victim"
        victim.write_text("keep")
        (tmp_path / "out").symlink_to(victim)
        write_file_atomic(str(tmp_path / "out"), b"data")
        assert victim.read_text() == "keep"
        assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"data"

    def test_a_failed_write_leaves_no_temp_file(self, tmp_path: Path) -> None:
        """A chunk source that fails midway raises, and the temp file is removed."""
        def failing() -> object:
            yield b"part"
            raise OSError(28, "No space left on device")

        fd = open_parent(str(tmp_path / "x"))
        try:
            with pytest.raises(OSError):
                write_temp(fd, "x", failing())  # type: ignore[arg-type]
        finally:
            os.close(fd)
        assert list(tmp_path.iterdir()) == []

    def test_a_streamed_write_lands_whole(self, tmp_path: Path) -> None:
        """open_atomic: what the block wrote replaces the file, 0600, and no temp file is left."""
        target = tmp_path / "export.jsonl"
        target.write_text("old")
        with open_atomic(str(target)) as out:
            out.write(b"line 1\n")
            assert target.read_text() == "old"  # nothing shows before the block ends
            out.write(b"line 2\n")
        assert target.read_bytes() == b"line 1\nline 2\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        assert sorted(p.name for p in tmp_path.iterdir()) == ["export.jsonl"]

    def test_a_streamed_write_that_raises_changes_nothing(self, tmp_path: Path) -> None:
        """open_atomic: a block that raises leaves the old file as it was and no temp file."""
        target = tmp_path / "export.jsonl"
        target.write_text("old")
        with pytest.raises(RuntimeError), open_atomic(str(target)) as out:
            out.write(b"half")
            raise RuntimeError("the source failed")
        assert target.read_text() == "old"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["export.jsonl"]

    def test_a_write_can_set_the_files_time(self, tmp_path: Path) -> None:
        """write_atomic(mtime=...) lands the file with that modification time (a pulse's touch time)."""
        fd = open_parent(str(tmp_path / "p"))
        try:
            write_atomic(fd, "p", b"x", fsync=False, mtime=1_700_000_000.25)
        finally:
            os.close(fd)
        assert (tmp_path / "p").stat().st_mtime == 1_700_000_000.25

    def test_no_follow_parent_refuses_a_symlinked_directory(self, tmp_path: Path) -> None:
        """With follow=False a directory that is a symlink is refused before anything is written."""
        real = tmp_path / "real"
        real.mkdir()
        (tmp_path / "link").symlink_to(real)
        with pytest.raises(OSError):
            write_file_atomic(str(tmp_path / "link" / "f"), b"x", follow=False)
        assert list(real.iterdir()) == []


class TestReads:
    def test_follow_reads_through_a_link_to_a_file_and_refuses_one_to_a_fifo(self, tmp_path: Path) -> None:
        """``follow=True`` (a path a human named) reads through a symlink to a regular file, and refuses
        a symlink to a FIFO at once instead of waiting for a writer; without it the link itself is refused."""
        (tmp_path / "real.toml").write_bytes(b"x = 1\n")
        (tmp_path / "link.toml").symlink_to(tmp_path / "real.toml")
        os.mkfifo(tmp_path / "fifo")
        (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
        assert read_regular(str(tmp_path / "link.toml"), 100, follow=True) == b"x = 1\n"
        with pytest.raises(UnsafePath, match="symbolic link"):
            read_regular(str(tmp_path / "link.toml"), 100)
        with pytest.raises(UnsafePath, match="a FIFO"):
            read_regular(str(tmp_path / "to-fifo"), 100, follow=True)

    def test_the_tail_below_a_root_follows_no_link_and_creates_nothing(self, tmp_path: Path) -> None:
        """The end of ``root/a/b/name``, bounded, with its size; a symlinked directory on the way is
        refused and a missing one is not created."""
        (tmp_path / "a" / "b").mkdir(parents=True)
        (tmp_path / "a" / "b" / "f.log").write_bytes(b"0123456789")
        assert read_tail_below(str(tmp_path), ("a", "b"), "f.log", 4) == (b"6789", 10)
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "f.log").write_bytes(b"secret")
        (tmp_path / "a" / "c").symlink_to(outside)
        with pytest.raises(OSError):
            read_tail_below(str(tmp_path), ("a", "c"), "f.log", 4)
        with pytest.raises(FileNotFoundError):
            read_tail_below(str(tmp_path), ("a", "missing"), "f.log", 4)
        assert not (tmp_path / "a" / "missing").exists()


class TestStateLayout:
    """Every path under the state dir comes from one place, and the shim's own copy agrees with it."""

    def test_epoch_files_sit_in_the_tasks_logs_dir(self, tmp_path: Path) -> None:
        """log, brief, pid and exit of an epoch are ``logs/<id>/<epoch>.*``."""
        layout = StateLayout(str(tmp_path))
        assert layout.log("t", 3) == str(tmp_path / "logs" / "t" / "3.log")
        assert layout.brief("t", 3) == str(tmp_path / "logs" / "t" / "3.brief.md")
        assert layout.pid("t", 3) == str(tmp_path / "logs" / "t" / "3.pid")
        assert layout.exit("t", 3) == str(tmp_path / "logs" / "t" / "3.exit")
        assert layout.baton("t") == str(tmp_path / "batons" / "t.toml")

    def test_the_shims_pid_file_is_the_layouts(self, tmp_path: Path) -> None:
        """The shim (which imports nothing from heartbeat) writes its pid file where the daemon looks for it."""
        layout = StateLayout(str(tmp_path))
        assert shim.pid_file_for(layout.exit("t", 7)) == layout.pid("t", 7)
