"""Screenshots of the status page for docs/: a real daemon, real tasks, headless Chromium.

    .venv/bin/python scripts/web_screenshots.py [OUT_DIR]    # default: docs/

Writes web-tasks.png, web-blocked.png, web-task.png, web-task-escalated.png and
web-report.png (1280x900), from the same scenario the tests use (tests/support/web_scenario.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.web_scenario import chromium, start_scenario, start_web  # noqa: E402

PAGES = {
    "web-tasks.png": "",
    "web-blocked.png": "?status=blocked",
    "web-task.png": "tasks/alpha",
    "web-task-escalated.png": "tasks/crashy",
    "web-report.png": "report",
}


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hb-shots-") as tmp:
        scenario = start_scenario(Path(tmp))
        try:
            web = start_web(scenario.h)
            try:
                for name, path in PAGES.items():
                    chromium(web.at(path), screenshot=str(out / name))  # the token, as a browser carries it
                    print(out / name)
            finally:
                web.stop()
        finally:
            scenario.h.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
