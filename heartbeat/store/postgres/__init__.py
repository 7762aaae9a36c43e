"""The PostgreSQL store, split by job: connection, schema, ledger, store, archive, leases."""
