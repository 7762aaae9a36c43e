"""The shipped alert rules, run by the real promtool (Debian's ``prometheus`` package; scripts/test
installs it): ``promtool check rules`` on config/alerts.yml, and ``promtool test rules`` on
config/alerts_test.yml, which holds a case for every alert (issue 19, item 6): each alert is
seen firing with its labels and rendered annotations, and seen not firing, over a two-host fleet
whose store-wide series both hosts export (one alert and one value, not one per host)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

CONFIG = ROOT / "config"
RULES = CONFIG / "alerts.yml"
CASES = CONFIG / "alerts_test.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus package (scripts/test does)")
    return found


def run(*args: str, cwd: Path = CONFIG) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=str(cwd), timeout=600)


def alerts() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    """`promtool check rules` accepts config/alerts.yml and counts every rule in it."""
    proc = run("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_promtool_passes_every_case() -> None:
    """`promtool test rules config/alerts_test.yml` passes: every expected alert fires with its labels
    and annotations at its time, and no other alert of that name does."""
    proc = run("test", "rules", CASES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    """Each alert of alerts.yml is expected firing at some evaluation and expected silent at another
    (an alert that always fires, or never, would pass a case that only ever expects one of them)."""
    doc = yaml.safe_load(CASES.read_text())
    assert doc["rule_files"] == [RULES.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alerts())
    assert names - fires == set(), "alerts never expected to fire"
    assert names - quiet == set(), "alerts never expected to stay quiet"
    assert fires | quiet <= names, "cases for alerts that do not exist"


def test_a_case_that_expects_the_wrong_thing_fails(tmp_path: Path) -> None:
    """The cases can fail: the takeover alert expected from the wrong host is reported as a failure."""
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / CASES.name).write_text(CASES.read_text().replace("exp_labels: {severity: warning, host: b, from_host: a}",
                                                                 "exp_labels: {severity: warning, host: a, from_host: b}"))
    proc = run("test", "rules", CASES.name, cwd=tmp_path)
    assert proc.returncode != 0 and "HeartbeatTakeover" in proc.stdout + proc.stderr
