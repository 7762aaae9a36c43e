"""The faults done to agents and batons: kills, hand edits, garbage, stale writes, races, restored backups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from datetime import timedelta

import tomli_w

from soak.common import (
    TICKS,
    _loads,
    _restorable,
)


class Faults:
    """The faults done to agents and batons (a part of :class:`soak.run.Soak`, which holds the state)."""

    def fault(self, name: str) -> bool:
        """Inject one fault; False when it found nothing to act on (the soak tries again soon)."""
        rng = self.rng
        if name in ("daemon_kill", "daemon_term") and any(j.what.startswith("second daemon") for j in self.pending):
            # A second daemon is on its way to the lock (its start takes seconds on a loaded machine):
            # it must meet the daemon it is to be refused by, so the stop waits for its answer.
            self.next_fault[name] = time.monotonic() + 0.3
            self.counts[f"held for a second daemon: {name}"] += 1
            return True
        if name == "daemon_kill" and self.daemon_alive():
            self.stop_daemon(signal.SIGKILL)
            self.counts["daemon_sigkills"] += 1
            self.restart_at = time.monotonic() + rng.uniform(0.0, 1.5)
        elif name == "daemon_term" and self.daemon_alive():
            self.stop_daemon(signal.SIGTERM)
            self.counts["daemon_sigterms"] += 1
            self.restart_at = time.monotonic() + rng.uniform(0.0, 1.0)
        elif name == "hup_good":
            self.tick = rng.choice(TICKS)
            self.ticks_used.add(self.tick)
            self.hup(broken=False)
        elif name == "hup_broken" and not self.config_broken:
            if not self.hup(broken=True):
                return False  # no daemon up, or a SIGHUP not answered yet: tried again soon (RETRY_SOON)
            self.next_fault["hup_repair"] = time.monotonic() + rng.uniform(0.3, 1.5)
        elif name == "hup_repair":
            if not self.config_broken:
                del self.next_fault["hup_repair"]
            elif not self.daemon_alive():
                self.write_config()  # it will start with the good one
                del self.next_fault["hup_repair"]
            elif self.hup(broken=False):
                del self.next_fault["hup_repair"]
            else:
                self.next_fault["hup_repair"] = time.monotonic() + 0.2  # the broken one is not answered yet
        elif name in ("agent_kill", "shim_kill", "agent_only_kill"):
            self.kill_agent(name)
        elif name == "drop_block":
            self.drop_block()
        elif name == "benign_edit":
            self.benign_edit()
        elif name == "garbage":
            self.write_garbage()
        elif name == "stale_write":
            self.stale_write()
        elif name == "new_task":
            from heartbeat.store.files import FileStore

            store = FileStore(str(self.state))
            try:
                self.create_task(store)
                self.counts["tasks_added_midway"] += 1
            finally:
                store.close()
        elif name == "fifo_logs":
            return self.plant_in_logs(symlink=False)
        elif name == "symlink_logs":
            return self.plant_in_logs(symlink=True)
        elif name == "fifo_workdir":
            return self.plant_in_workdir()
        elif name == "race":
            return self.race()
        elif name == "restore_baton":
            return self.restore_baton()
        elif name == "corrupt_ledger":
            return self.corrupt_ledger()
        elif name == "second_daemon":
            return self.second_daemon()
        elif name == "hold_lock":
            return self.hold_lock()
        elif name == "live_migrate":
            return self.live_migrate()
        elif name == "clock_step":
            return self.step_clock()
        return True

    def kill_agent(self, how: str) -> None:
        groups = self.live_groups()
        if not groups:
            return
        g = self.rng.choice(groups)
        try:
            if how == "agent_kill":
                self.checker.shim_killed.add(g.pgid)  # its setsid grandchildren can no longer be stopped
                os.killpg(g.pgid, signal.SIGKILL)
            elif how == "shim_kill":
                self.checker.shim_killed.add(g.pgid)
                os.kill(g.pgid, signal.SIGKILL)  # the shim leads the group: the agent is orphaned
            else:
                others = sorted(p for p in g.pids if p != g.pgid)
                if not others:
                    return
                os.kill(others[-1], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        self.counts[how + "s"] += 1

    def drop_block(self) -> None:
        task = self.pick_task(lambda d: d.get("meta", {}).get("status") == "blocked")
        if task is None:
            return

        def change(data: bytes) -> bytes | None:
            doc = tomllib.loads(data.decode())
            meta = doc["meta"]
            if meta.get("status") != "blocked":
                return None
            meta["status"] = "active"
            meta.pop("gate", None)
            meta.pop("blocked_at", None)
            doc["blocked_on"] = ""
            return tomli_w.dumps(doc).encode()

        new = self.checker.hand_edit(task, change)
        if new is not None:
            revision = int(tomllib.loads(new.decode())["meta"]["revision"])
            self.checker.drops.setdefault(task, []).append(revision)
            self.checker.drops_found.setdefault(task, []).append(revision)
            self.counts["hand_edits"] += 1
            self.counts["blocks_dropped_by_hand"] += 1

    def benign_edit(self) -> None:
        task = self.pick_task(lambda d: True)
        if task is None:
            return
        self._edit_seq += 1
        key, value = f"soak_note_{self._edit_seq}", f"kept across rewrites {self._edit_seq}"

        def change(data: bytes) -> bytes | None:
            doc = tomllib.loads(data.decode())
            doc[key] = value
            return tomli_w.dumps(doc).encode()

        if self.checker.hand_edit(task, change) is not None:
            self.checker.expected_keys.setdefault(task, {})[key] = value
            self.counts["hand_edits"] += 1
            self.counts["unknown_keys_added"] += 1

    def write_garbage(self) -> None:
        task = self.pick_task(lambda d: True)
        if task is None:
            return
        kind = self.rng.choice(["binary", "torn", "wrong-type"])

        def change(data: bytes) -> bytes | None:
            if kind == "torn":
                return data[: max(1, len(data) // 2)] + b"\n[meta\n"
            if kind == "wrong-type":
                lines = data.split(b"\n")
                out = [b"step = 3" if line.startswith(b"step = ") else line for line in lines]
                if out != lines:
                    return b"\n".join(out)
            return b"\x00\xff garbage \xfe" + bytes(self.rng.randrange(256) for _ in range(64))

        if self.checker.hand_edit(task, change, garbage=True) is not None:
            self.counts["hand_edits"] += 1
            self.counts["garbage_batons"] += 1
            self.garbage_restore[task] = time.monotonic() + self.rng.uniform(1.5, 4.0)

    def restore_garbage(self, task: str, *, force: bool = False) -> bool:
        record = self.checker.garbage.get(task)
        if record is None:
            self.garbage_restore.pop(task, None)
            return True
        if not force:
            waited = time.time() - record.written_at
            if waited < 10 and not (self.daemon_alive() and self.ledger_has(task, "invalid", record.written_at - 2.0)):
                return False  # let the daemon see it first
        self.checker.hand_edit(task, lambda _data: record.original, restore=True)
        self.garbage_restore.pop(task, None)
        self.counts["garbage_repaired"] += 1
        return True

    def stale_write(self) -> None:
        task = self.pick_task(lambda d: d.get("meta", {}).get("epoch", 0) >= 2)
        if task is None:
            return
        epoch = int(self.checker.latest[task]["meta"]["epoch"]) - 1
        marker = f"stale write {len(self.stale_markers) + 1}"
        if task in self.checker.garbage:
            return
        if self.stale_rng.random() < 0.5:
            r = self.cli("set", task, f"step={marker}", "--epoch", str(epoch))
        else:  # as a superseded agent types it: relayed to the daemon when it runs (heartbeat.hotpath.relay)
            env = {**self.env, "HEARTBEAT_STATE_DIR": str(self.state), "HEARTBEAT_TASK": task,
                   "HEARTBEAT_EPOCH": str(epoch), "SOAK_OUTSIDER": "1"}  # (not an agent the checker counts)
            r = subprocess.run([sys.executable, "-m", "heartbeat", "set", task, f"step={marker}"],
                               capture_output=True, text=True, env=env, timeout=60, cwd=str(self.root))
            self.counts["stale_writes_by_agent_env"] += 1
        self.counts["stale_writes"] += 1
        self.stale_markers.append((task, marker, r.returncode))
        if r.returncode != 5:
            self.checker.violate("fencing", task, f"a write with superseded epoch {epoch} exited {r.returncode}, "
                                                  f"not 5: {r.stderr.strip()[:300]}")
        else:
            self.counts["stale_writes_refused"] += 1

    def race(self) -> bool:
        """Make a task dispatchable (create, unblock, re-arm), then write block/done/snooze 0-200 ms later."""
        from heartbeat.model.errors import HeartbeatError
        from heartbeat.store.files import FileStore
        from heartbeat.tasks import verbs as tasks

        how = self.rng.choice(["new", "unblock", "retry"])
        store = FileStore(str(self.state))
        try:
            if how == "new":
                task = self.create_task(store)
                self.counts["tasks_added_midway"] += 1
            else:
                want = "blocked" if how == "unblock" else "escalated"
                picked = self.pick_task(lambda d: d.get("meta", {}).get("status") == want and (
                    want != "blocked" or (d["meta"].get("gate") or {}).get("kind", "human") == "human"))
                if picked is not None:
                    task = picked
                else:
                    if self.rng.random() < 0.5:
                        return False
                    task = self.create_task(store)
                    self.counts["tasks_added_midway"] += 1
                    how = "new"
                try:
                    if how == "new":
                        pass
                    elif how == "unblock":
                        tasks.unblock(store, task, by="soak-race", note="made dispatchable to race it")
                    else:
                        tasks.retry(store, task, by="soak-race")
                except HeartbeatError:
                    return False
        finally:
            store.close()
        verb = self.rng.choice(["block", "done", "snooze"])
        delay = self.rng.uniform(0.0, 0.2)
        self.counts["races"] += 1
        self.note(f"  race: {how} {task}, then {verb} after {delay * 1000:.0f} ms")
        thread = threading.Timer(delay, self.race_write, args=(task, verb))
        thread.daemon = True
        thread.start()
        self.race_threads.append(thread)
        return True

    def race_write(self, task: str, verb: str) -> None:
        from heartbeat.model.baton import Gate
        from heartbeat.model.errors import HeartbeatError
        from heartbeat.model.timeparse import utcnow
        from heartbeat.store.files import FileStore
        from heartbeat.tasks import verbs as tasks

        try:
            store = FileStore(str(self.state))
        except HeartbeatError:
            return
        try:
            if verb == "block":
                tasks.block(store, task, "the soak's human, racing the dispatch", Gate.parse("human"), actor="soak")
            elif verb == "done":
                tasks.finish(store, task, note="the soak's human, racing the dispatch", actor="soak")
            else:
                tasks.snooze(store, task, utcnow() + timedelta(seconds=self.rng.uniform(1.0, 3.0)), actor="soak")
            outcome = "landed"
        except HeartbeatError:
            outcome = "refused"
        finally:
            store.close()
        with self.count_lock:
            self.counts[f"race_{verb}s_{outcome}"] += 1

    def restore_baton(self) -> bool:
        """Keep copies of batons; copy an older one back over a live baton, as a human restoring a backup.

        Only over a task with no live agent, from a copy of the same epoch with a lower revision,
        and never to revive or bury a finished task, nor to turn snoozed into active (or back) by
        hand: those are other acts, with no event a checker could hold them to (see docs/development.md)."""
        for task in self.rng.sample(sorted(self.checker.latest), min(3, len(self.checker.latest))):
            if task in self.checker.garbage:
                continue
            try:
                data = (self.state / "batons" / f"{task}.toml").read_bytes()
            except OSError:
                continue
            doc = _loads(data)
            if doc is not None and isinstance(doc.get("meta"), dict):
                kept = self.copies.setdefault(task, [])
                kept.append((data, doc))
                del kept[:-4]
                (self.root / "copies" / f"{task}.{doc['meta'].get('revision')}.toml").write_bytes(data)
                self.counts["baton_copies_kept"] += 1
        pairs = []
        for task, kept in self.copies.items():
            live = self.checker.latest.get(task)
            if live is None or task in self.checker.garbage or task in self.held or self.checker.live.get(task):
                continue
            for copy, parsed in kept:
                if _restorable(live["meta"], parsed["meta"]):
                    pairs.append((task, copy, parsed))
        if not pairs:
            return False
        task, copy, old = self.rng.choice(pairs)
        dropped: list[int] = []

        def change(data: bytes) -> bytes | None:
            live = _loads(data)
            if live is None or "meta" not in live or not _restorable(live["meta"], old["meta"]):
                return None
            if live["meta"].get("status") == "blocked" and old["meta"].get("status") != "blocked":
                dropped.append(int(live["meta"]["revision"]))  # a restore that drops a block: a bypass is due
            return copy

        if self.checker.hand_edit(task, change) is None:
            return False
        self.note(f"  restored {task} to revision {old['meta'].get('revision')}")
        self.restored_tasks.add(task)
        if dropped:
            self.checker.drops.setdefault(task, []).extend(dropped)
            self.checker.drops_found.setdefault(task, []).append(int(old["meta"]["revision"]))
            self.counts["restores_dropping_a_block"] += 1
        expected = self.checker.expected_keys.get(task, {})
        for key in [k for k, v in expected.items() if old.get(k) != v]:
            del expected[key]  # the human restored a copy from before this key was added
        self.counts["batons_restored"] += 1
        self.counts["hand_edits"] += 1
        return True

