"""The distribution's name is one nobody else holds, and every hint installs this project (issue 26, item 6).

PyPI's ``heartbeat`` is an unrelated project: ``pip install 'heartbeat[web]'`` installed it. The
distribution is ``heartbeat-agents``; the import package and the ``heartbeat`` command keep
their names; a missing extra's hint installs from the checkout into the interpreter running
heartbeat.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from heartbeat.system.extras import DISTRIBUTION, Extra, checkout, install_hint

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_names_the_distribution_and_spdx_license() -> None:
    """name = heartbeat-agents, the command `heartbeat`, the extras the hints name, an SPDX license
    string and a setuptools that reads it (77+: no deprecation warning for a table)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = doc["project"]
    assert project["name"] == DISTRIBUTION == "heartbeat-agents"
    assert doc["tool"]["setuptools"]["script-files"] == ["bin/heartbeat"]  # the command keeps its name
    assert {e.value for e in Extra} <= set(project["optional-dependencies"])
    assert project["license"] == "MIT"
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d)", r) for r in doc["build-system"]["requires"])


def test_no_document_or_hint_tells_to_install_the_other_project() -> None:
    """Nothing in the repository says `pip install heartbeat` or `'heartbeat[...]'`: that installs PyPI's
    unrelated project."""
    bad = re.compile(r"pip install\s+['\"]?heartbeat(\[|['\"]?\s|['\"]?$)|(?<![-\w/])heartbeat\[(web|postgres|mcp)")
    found = []
    files = [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("config/*"), *ROOT.glob("heartbeat/**/*.py"),
             *ROOT.glob("systemd/*"), ROOT / "pyproject.toml", ROOT / "scripts" / "test"]
    for path in (p for p in files if p.is_file()):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if bad.search(line) and "another project" not in line and "is another" not in line:
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_the_hint_installs_from_this_checkout_into_this_interpreter() -> None:
    """Installed editable from this tree (as the suite is): the hint is `<python> -m pip install -e <tree>[extra]`."""
    assert checkout() == (str(ROOT), True)
    assert install_hint(Extra.WEB) == f"{sys.executable} -m pip install -e '{ROOT}[web]'"


def test_installed_under_the_new_name_only() -> None:
    """pip knows this environment's heartbeat as heartbeat-agents; the import package is heartbeat."""
    from importlib.metadata import distribution

    dist = distribution(DISTRIBUTION)
    assert dist.metadata["Name"] == DISTRIBUTION
    r = subprocess.run([sys.executable, "-m", "pip", "show", "heartbeat"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, "the old distribution name is still installed beside the new one"
