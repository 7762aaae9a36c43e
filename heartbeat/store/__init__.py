"""Stores: where batons and the ledger live. Pick one with :func:`open_store`."""

from __future__ import annotations

from heartbeat.store.base import Edit, Entry, Store, update

__all__ = ["Edit", "Entry", "Store", "open_store", "update"]


def open_store(state_dir: str) -> Store:
    """The embedded file store for ``state_dir`` (created 0700 when missing)."""
    from heartbeat.store.files import FileStore

    return FileStore(state_dir)
