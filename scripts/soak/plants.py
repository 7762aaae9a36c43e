"""The files planted where the daemon, the shim or the CLI open: FIFOs and symlinks in logs/ and
workdirs, and their removal."""

from __future__ import annotations

import glob
import os
import stat
import time
from pathlib import Path

from soak.common import (
    FIFO_WAITS,
    Plant,
)


class Plants:
    """The files planted where the daemon, the shim or the CLI open (a part of :class:`soak.run.Soak`)."""

    def outside_file(self, name: str, data: bytes) -> Path:
        path = self.root / "outside" / name
        path.write_bytes(data)
        self.outside[str(path)] = data
        return path

    def plant_in_logs(self, *, symlink: bool) -> bool:
        """A FIFO or a link where the next dispatch (or the current agent's end) will open a file;
        or, for a link, the whole ``logs/<id>`` swapped for a link to a directory outside."""
        idle = {t for t, d in self.checker.latest.items() if not self.checker.live.get(t)}
        task = self.pick_task(lambda d: d.get("meta", {}).get("status") in ("active", "snoozed", "blocked"))
        if task is None:
            return False
        epoch = int(self.checker.latest[task]["meta"].get("epoch", 0))
        logs = self.state / "logs" / task
        self._plant_seq += 1
        if symlink and task in idle and self.rng.random() < 0.35:
            if any(p.task == task and p.kind in ("fifo", "link", "logs-dir-link") for p in self.plants):
                # A file planted inside would be moved aside with the directory, out of its own
                # cleanup's reach, and come back with it: a FIFO left behind for good.
                return False
            target = self.root / "outside" / f"logs-of-{task}-{self._plant_seq}"
            target.mkdir()
            moved = None
            if logs.is_dir() and not logs.is_symlink():
                moved = logs.with_name(f".{task}.soak-moved-{self._plant_seq}")
                os.rename(logs, moved)
            else:
                logs.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.symlink(target, logs)
            self.add_plant(Plant(str(logs), "logs-dir-link", task, moved=str(moved) if moved else None))
            self.counts["planted_logs_dir_links"] += 1
            return False
        live = self.checker.live.get(task)
        if not symlink and live and self.rng.random() < 0.25:
            name = f"{epoch}.exit"  # the running agent's own exit file: an agent could make it a FIFO
        else:
            name = f"{epoch + 1}.{self.rng.choice(['exit', 'log', 'pid', 'brief.md'])}"
        if logs.is_symlink():
            return False
        logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = logs / name
        try:
            if symlink:
                victim = self.outside_file(f"victim-{task}-{self._plant_seq}.txt", b"must stay as it is\n")
                os.symlink(victim, path)
            else:
                os.mkfifo(path, 0o600)
        except FileExistsError:
            return False
        self.add_plant(Plant(str(path), "link" if symlink else "fifo", task))
        self.counts["planted_logs_links" if symlink else "planted_logs_fifos"] += 1
        return True

    def plant_in_workdir(self) -> bool:
        """A FIFO at ``.git/HEAD``, the branch ref or the key file of a git workdir; then a human's
        ``heartbeat verify`` or ``set`` on the task, which must answer (not hang)."""
        candidates = [t for t in self.git_tasks if t in self.checker.latest and t not in self.checker.garbage
                      and t not in self.held and not any(p.task == t and p.kind == "workdir-fifo" for p in self.plants)]
        if not candidates:
            return False
        task = self.rng.choice(candidates)
        work = self.root / "work" / task
        rel = self.rng.choice([".git/HEAD", ".git/HEAD", ".git/refs/heads/main", "notes.md"])
        path = work / rel
        try:
            original = path.read_bytes()
            path.unlink()
            os.mkfifo(path, 0o600)
        except OSError:
            return False
        self.add_plant(Plant(str(path), "workdir-fifo", task, original=original))
        self.counts["planted_workdir_fifos"] += 1
        verb = self.rng.choice(["verify", "set"])
        argv = ["verify", task] if verb == "verify" else ["set", task, f"handoff=the soak's human, {self._plant_seq}"]
        self.start_cli(f"{verb} over a FIFO at {rel}", task, argv, expect=None)
        return True

    def add_plant(self, plant: Plant) -> None:
        self.note(f"  planted {plant.kind} {plant.path}")
        plant.planted_at = time.time()
        plant.until = time.monotonic() + self.rng.uniform(1.0, 4.0)
        self.plants.append(plant)

    def clean_plants(self, *, force: bool = False) -> None:
        now = time.monotonic()
        for plant in list(self.plants):
            if not force and now < plant.until:
                continue
            self.remove_plant(plant)
            self.plants.remove(plant)
            self.plant_windows.append((plant.task, plant.planted_at, time.time()))
            self.counts["plants_cleaned"] += 1

    def note_stuck_on_fifo(self, task: str) -> None:
        """Before a task's FIFO is removed (which frees whoever is stuck opening it): which of the
        task's running commands the kernel says wait opening a FIFO. The witness is the kernel's,
        not a command's duration: on a loaded machine a slow command may end just after a removal."""
        for job in self.pending:
            if job.task != task or job.proc.poll() is not None:
                continue
            for wchan in glob.glob(f"/proc/{job.proc.pid}/task/*/wchan"):
                try:
                    waiting = Path(wchan).read_text().strip()
                except OSError:
                    continue
                if waiting in FIFO_WAITS:
                    job.stuck_on_fifo = waiting

    def remove_plant(self, plant: Plant) -> None:
        """Undo a plant as a human would: whoever is stuck opening the FIFO gets it opened (then EOF)."""
        path = plant.path
        self.note_stuck_on_fifo(plant.task)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if plant.kind in ("fifo", "workdir-fifo") and st is not None and stat.S_ISFIFO(st.st_mode):
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
            try:
                os.unlink(path)
            finally:
                os.close(fd)
        elif plant.kind in ("link", "logs-dir-link") and st is not None and stat.S_ISLNK(st.st_mode):
            os.unlink(path)
        if plant.kind == "workdir-fifo" and plant.original is not None:
            tmp = f"{path}.soak-tmp"
            Path(tmp).write_bytes(plant.original)
            os.replace(tmp, path)
        if plant.kind == "logs-dir-link" and plant.moved:
            if not os.path.lexists(path):
                os.rename(plant.moved, path)
            else:
                self.counts["logs_dirs_recreated_meanwhile"] += 1

