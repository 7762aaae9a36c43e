"""Operating a state: gc, export/import/migrate, leases across hosts, the demo, the starter config."""
