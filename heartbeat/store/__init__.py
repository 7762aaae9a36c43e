"""Stores: where batons and the ledger live. Pick one with :func:`open_store`."""

from __future__ import annotations

import os
from collections.abc import Callable

from heartbeat.model.baton import Baton
from heartbeat.store.base import Edit, Entry, Store

__all__ = ["Edit", "Entry", "Store", "open_configured", "open_store", "store_url"]

URL_ENV = "HEARTBEAT_STORE_URL"
"""The environment variable naming a database store; it wins over ``[store] url``."""


def store_url(configured: str = "") -> str:
    """The store's URL: ``$HEARTBEAT_STORE_URL``, else ``[store] url``; empty for the file store."""
    return os.environ.get(URL_ENV, "").strip() or configured.strip()


def open_store(state_dir: str, url: str = "", *, scan_view: Callable[[Baton], Baton] | None = None,
               refused_wait: float | None = None, lease_ttl: float | None = None) -> Store:
    """The store named by ``url`` (see :func:`store_url`), else the file store in ``state_dir``.

    A ``postgresql://`` (or ``postgres://``) URL opens the PostgreSQL store, which needs
    the ``postgres`` extra; psycopg is imported only then. ``scan_view``: what the
    file store's scans keep of each baton (a database store keeps whole batons). ``refused_wait``:
    seconds a database store waits while the server refuses connections (see
    :class:`heartbeat.store.postgres.store.PostgresStore`; 0 for the daemon and the hooks, which answer at once).
    ``lease_ttl``: a leased daemon's, whose sessions end a transaction left idle within it
    (:func:`heartbeat.store.postgres.connection.idle_limit`).
    """
    url = store_url(url)
    if url:
        return _open_url(url, refused_wait, lease_ttl)
    from heartbeat.store.files import FileStore

    return FileStore(state_dir, scan_view=scan_view)


def open_configured(state_dir: str | None = None, config_path: str | None = None) -> tuple[Store, str]:
    """The store every command opens, and its state dir: ``--state-dir``/``--config`` as
    :func:`heartbeat.config.load.resolve_store` finds them, so ``$HEARTBEAT_STORE_URL`` and the
    config's ``[store] url`` mean the same for every command (``status``, ``web``, ``metrics``,
    ``gc``, ``mcp``, the hooks): one way to open the store."""
    from heartbeat.config.load import resolve_store

    found_dir, url = resolve_store(state_dir, config_path)
    return open_store(found_dir, url), found_dir


def _open_url(url: str, refused_wait: float | None = None, lease_ttl: float | None = None) -> Store:
    from heartbeat.model.errors import BadInput, ConfigError

    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"store url must start with postgresql:// (got {url.split(':', 1)[0]!r}:...)",
                          field="store.url")
    try:
        from heartbeat.store.postgres.connection import idle_limit
        from heartbeat.store.postgres.store import PostgresStore
    except ImportError as exc:
        from heartbeat.system.extras import Extra, install_hint

        raise BadInput(
            f"a PostgreSQL store needs the postgres extra ({exc.name or 'psycopg'} is missing): "
            f"{install_hint(Extra.POSTGRES)}"
        ) from None
    return PostgresStore(url, refused_wait=refused_wait,
                         idle_timeout=None if lease_ttl is None else idle_limit(lease_ttl))
