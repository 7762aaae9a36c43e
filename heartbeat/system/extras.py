"""The distribution's name and how to install one of its extras, said the same way everywhere.

PyPI's ``heartbeat`` is an unrelated project, so installing the web extra under that name would install
somebody else's code. This package is distributed as :data:`DISTRIBUTION` (the import package
and the ``heartbeat`` command keep their name), and until that is published a missing extra is
installed from the checkout heartbeat runs from: :func:`install_hint` names it, with the
interpreter that runs heartbeat, so the command installs into the right environment.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from enum import StrEnum

__all__ = ["DISTRIBUTION", "Extra", "install_hint", "checkout"]

DISTRIBUTION = "heartbeat-agents"
"""The name on the package index (and in ``pip list``); the import package is ``heartbeat``."""

_PUBLISHED = False
"""Whether :data:`DISTRIBUTION` is on the package index yet (until then: install from a checkout)."""


class Extra(StrEnum):
    """The optional dependencies (``[project.optional-dependencies]`` in pyproject.toml)."""

    WEB = "web"  # the status page and Prometheus metrics
    POSTGRES = "postgres"  # the PostgreSQL store
    MCP = "mcp"  # heartbeat mcp


def checkout() -> tuple[str, bool]:
    """The source tree heartbeat was installed from and whether the install is editable, or
    ``("", False)`` when that is not known (installed from a wheel)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution(DISTRIBUTION).read_text("direct_url.json")
    except (ImportError, PackageNotFoundError, OSError):
        text = None
    try:
        doc = json.loads(text) if text else {}
        url, editable = doc.get("url", ""), bool(doc.get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):
        url, editable = "", False
    if isinstance(url, str) and url.startswith("file://"):
        root = url.removeprefix("file://")
        if os.path.isfile(os.path.join(root, "pyproject.toml")):
            return root, editable
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from the tree itself
    return (here, True) if os.path.isfile(os.path.join(here, "pyproject.toml")) else ("", False)


def install_hint(*extras: Extra) -> str:
    """The command that installs ``extras`` into the environment running heartbeat."""
    names = ",".join(e.value for e in extras)
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    root, editable = checkout()
    if root:
        return f"{pip} {'-e ' if editable else ''}{shlex.quote(f'{root}[{names}]')}"
    if _PUBLISHED:
        return f"{pip} {shlex.quote(f'{DISTRIBUTION}[{names}]')}"
    return (f"{pip} '/path/to/heartbeat-checkout[{names}]' ({DISTRIBUTION} is not on PyPI yet; "
            "`pip install heartbeat` is another project)")
