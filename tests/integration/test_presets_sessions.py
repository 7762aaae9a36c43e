"""A session preset in an in-process daemon ticked by hand."""

from __future__ import annotations

from pathlib import Path

from heartbeat.config.load import parse_config
from tests.unit.test_presets import UUID1, UUID2


class TestCompactionHeavySessions:
    """The daemon counts the ledger's ``compacting`` events of the session it would resume."""

    def test_a_session_compacted_three_times_is_not_resumed(self, tmp_path: Path) -> None:
        """Two compactions of the session: resumed; a third (of that session, not another): a fresh one."""
        from datetime import datetime, timezone

        from heartbeat.daemon import Daemon
        from heartbeat.model.ledger import Event
        from heartbeat.store.files import FileStore
        from heartbeat.tasks import verbs as tasks

        tmp_path.chmod(0o700)
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        config = parse_config(f'[daemon]\nstate_dir = "{state}"\ndefault_launcher = "a"\n\n'
                              '[launchers.a]\ntype = "null"\nsession = "resume"\n', path=str(tmp_path / "hb.toml"))
        store = FileStore(str(state))
        d = Daemon(config, store=store)
        try:
            tasks.new_task(store, "c", task="t", step="s")
            with store.edit("c", actor="test") as ed:
                meta = ed.baton.meta
                meta.session, meta.attempt, meta.dispatches, meta.last_exit = UUID1, 1, 1, 1
            now = datetime.now(timezone.utc)

            def compacted(session: str) -> None:
                store.record([Event(task="c", kind="compacting", ts=now, data={"session_id": session})])

            compacted(UUID1)
            compacted(UUID1)
            compacted(UUID2)
            plan = d.actor.session_plan(store.load("c"), config.launchers["a"])
            assert plan.resume and plan.session == UUID1
            compacted(UUID1)
            plan = d.actor.session_plan(store.load("c"), config.launchers["a"])
            assert not plan.resume and plan.session != UUID1 and "compacted 3 times" in plan.why
        finally:
            d.shutdown()
            store.close()


