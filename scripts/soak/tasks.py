"""The work and the humans: tasks and their git workdirs, gates opened, unblocks and retries, CLI calls in flight."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from soak.common import (
    GIT_SHARE,
    Pending,
)


class Workload:
    """The work and the humans (a part of :class:`soak.run.Soak`, which holds the state)."""

    def create_task(self, store: Any) -> str:
        from heartbeat.model.baton import Gate
        from heartbeat.tasks import verbs as tasks

        self._task_seq += 1
        task_id = f"t{self._task_seq:04d}"
        steps = [f"step {i + 1}" for i in range(self.rng.randint(3, 8))]
        blocked_on, gate = "", None
        roll = self.rng.random()
        if roll < 0.08:
            blocked_on = "the soak's file gate at creation"
            gate = Gate.parse(f"file:{self.root / 'gates' / f'{task_id}.created'}")
        elif roll < 0.12:
            blocked_on = "a human, at creation"
            gate = Gate.parse("human")
        workdir, key_files = str(self.root / "work"), []
        if self.rng.random() < GIT_SHARE:
            workdir, key_files = self.git_workdir(task_id), ["notes.md"]
            self.git_tasks.add(task_id)
        tasks.new_task(store, task_id, task=f"soak task {task_id}", step="start", intent="survive the soak",
                       workdir=workdir, key_files=key_files, plan=steps, blocked_on=blocked_on, gate=gate,
                       actor="soak")
        self.tasks.append(task_id)
        return task_id

    def git_workdir(self, task_id: str) -> str:
        """A workdir of its own that reads as a git checkout (HEAD, a branch ref) with a key file."""
        work = self.root / "work" / task_id
        (work / ".git" / "refs" / "heads").mkdir(parents=True, exist_ok=True)
        (work / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        (work / ".git" / "refs" / "heads" / "main").write_text(f"{self.rng.getrandbits(160):040x}\n")
        (work / "notes.md").write_text(f"notes of {task_id}\n")
        return str(work)

    def live_groups(self) -> list[Any]:
        return [g for groups in list(self.checker.live.values()) for g in groups]

    def pick_task(self, predicate: Any) -> str | None:
        candidates = [t for t, doc in list(self.checker.latest.items())
                      if t not in self.checker.garbage and t not in self.held and predicate(doc)]
        return self.rng.choice(candidates) if candidates else None

    def play_humans(self, now: float) -> None:
        for task, doc in list(self.checker.latest.items()):
            if task in self.checker.garbage or task in self.held:
                continue  # (a human waits for the lock someone holds; the soak's loop must not)
            meta = doc.get("meta", {})
            status = meta.get("status")
            gate = meta.get("gate") or {}
            if status == "blocked" and gate.get("kind") == "file":
                target = str(gate.get("target", ""))
                if target not in self.gate_plans:
                    self.gate_plans[target] = now + self.rng.uniform(0.3, 3.0) if (
                        self.calm or self.rng.random() < 0.85) else None
                if self.calm and self.gate_plans[target] is None:
                    self.gate_plans[target] = now
            elif status == "blocked" and gate.get("kind", "human") == "human" and not self.calm:
                key = (task, str(meta.get("blocked_at", "")))
                if key not in self.unblock_plans:
                    self.unblock_plans[key] = now + self.rng.uniform(0.5, 3.0) if self.rng.random() < 0.7 else None
                due = self.unblock_plans[key]
                if due is not None and now >= due:
                    self.unblock_plans[key] = None
                    r = self.cli("unblock", task, "--by", "soak", "--note", "the soak's human said go")
                    self.counts["human_unblocks" if r.returncode == 0 else "human_unblocks_raced"] += 1
                    if r.returncode not in (0, 4):
                        self.checker.violate("daemon", task, f"unblock exited {r.returncode}: {r.stderr.strip()[:300]}")
            elif status == "escalated" and not self.calm:
                key2 = (task, int(meta.get("revision", 0)))
                if key2 not in self.retry_plans:
                    self.retry_plans[key2] = now + self.rng.uniform(0.5, 2.0) if self.rng.random() < 0.35 else None
                due = self.retry_plans[key2]
                if due is not None and now >= due:
                    self.retry_plans[key2] = None
                    r = self.cli("retry", task, "--by", "soak")
                    self.counts["retries" if r.returncode == 0 else "retries_raced"] += 1
        for target, due in list(self.gate_plans.items()):
            if due is not None and now >= due:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                Path(target).write_text("open\n")
                self.gate_plans[target] = None
                self.counts["file_gates_opened"] += 1

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "heartbeat", "--state-dir", str(self.state), *argv],
                              capture_output=True, text=True, env=self.env, timeout=60, cwd=str(self.root))

    def start_cli(self, what: str, task: str, argv: list[str], *, expect: set[int] | None,
                  timeout: float = 20.0, env: dict[str, str] | None = None) -> None:
        """Run a CLI command in the background; :meth:`poll_pending` judges how it ended."""
        out = tempfile.TemporaryFile()  # noqa: SIM115  (closed by poll_pending)
        proc = subprocess.Popen([sys.executable, "-m", "heartbeat", "--state-dir", str(self.state), *argv],
                                stdout=out, stderr=subprocess.STDOUT, env=env or self.env, cwd=str(self.root))
        self.pending.append(Pending(what, task, proc, out, time.monotonic(), time.monotonic() + timeout, expect))

    def poll_pending(self, *, final: bool = False) -> None:
        now = time.monotonic()
        for job in list(self.pending):
            code = job.proc.poll()
            if code is None and not final and now < job.deadline:
                continue
            self.pending.remove(job)
            if code is None:
                job.proc.send_signal(signal.SIGTERM)  # a second daemon that ran: let it stop like one
                try:
                    job.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.proc.kill()
                    job.proc.wait()
            job.out.seek(0)
            text = job.out.read().decode(errors="replace")
            job.out.close()
            took = (job.ended_at if job.ended_at is not None else now) - job.started
            self.judge(job, code, text, took)

