#!/usr/bin/env python3
"""The chaos soak's entry: ``.venv/bin/python scripts/soak.py --short`` (see the package
``scripts/soak/``, whose docstring says what the soak does and where each job lives)."""

import sys

from soak.run import main  # scripts/ is sys.path[0]: the package scripts/soak/, not this file

if __name__ == "__main__":
    sys.exit(main())
