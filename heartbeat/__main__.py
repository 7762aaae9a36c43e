"""``python -m heartbeat`` is the CLI (an agent's touch is answered from its pulse first)."""

from heartbeat.pulse import main

raise SystemExit(main())
