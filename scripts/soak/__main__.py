"""``python scripts/soak ARGS``: the same as ``scripts/soak.py ARGS``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from soak.run import main

sys.exit(main())
