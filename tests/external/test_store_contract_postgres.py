"""The store contract (tests/integration/test_store_contract.py) on the PostgreSQL store, against a
throwaway cluster (tests/support/pg.py): the same classes, their ``store`` fixture made here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from heartbeat.store.base import Store
from tests.integration import test_store_contract as contract


@pytest.fixture(params=["postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    from heartbeat.store.postgres.store import PostgresStore

    s = PostgresStore(request.getfixturevalue("pg_url"))
    yield s
    s.close()


class TestStoreContract(contract.TestStoreContract):
    pass


class TestChangeFeed(contract.TestChangeFeed):
    pass
