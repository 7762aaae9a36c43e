"""``python -m heartbeat`` is the CLI."""

from heartbeat.cli import main

raise SystemExit(main())
