"""The plain data and rules everything stands on: the baton, ledger events, the policy, errors, defaults, time."""
