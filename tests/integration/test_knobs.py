"""A policy knob is one entry (``heartbeat/model/knobs.py``): the parse, the policy and the config
reference's check all derive from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import ROOT

from heartbeat.config.load import parse_config
from heartbeat.config.shape import DaemonConfig
from heartbeat.model import defaults
from heartbeat.model.errors import ConfigError
from heartbeat.model.knobs import KNOBS, Knob, KnobKind, PolicyKnobs, knob_values
from heartbeat.model.policy import Policy

_BAD = {KnobKind.DURATION: '"soon"', KnobKind.COUNT: '"many"', KnobKind.MONEY: '"5$"', KnobKind.CHOICE: '"maybe"'}
"""A value each kind refuses."""


class TestTheTable:
    def test_every_knob_takes_its_default_from_defaults_py(self) -> None:
        """Each knob's default is the constant of its name in upper case in ``defaults.py``, and
        both the config and the policy start from it."""
        for k in KNOBS:
            assert k.default == getattr(defaults, k.name.upper()), k.name
            assert getattr(DaemonConfig(), k.name) == getattr(Policy(), k.name) == k.default, k.name

    def test_every_knob_has_a_one_line_doc(self) -> None:
        """The doc is one sentence on one line (what a reference or an error can quote)."""
        for k in KNOBS:
            assert k.doc.strip() and "\n" not in k.doc and k.doc.endswith("."), k.name

    def test_the_config_and_the_policy_carry_every_knob(self) -> None:
        """DaemonConfig and Policy both have every knob as a field, and :func:`knob_values` carries a
        config's into a policy unchanged."""
        names = [k.name for k in KNOBS]
        assert names == [f.name for f in fields(PolicyKnobs)]
        assert set(names) <= {f.name for f in fields(DaemonConfig)} & {f.name for f in fields(Policy)}
        config = DaemonConfig(stall_after=7.0, max_attempts=9, on_spinning="report", max_cost_usd=2.5)
        policy = Policy(**knob_values(config))
        assert knob_values(policy) == knob_values(config)

    @pytest.mark.parametrize("k", KNOBS, ids=[k.name for k in KNOBS])
    def test_every_knob_is_parsed_with_a_one_line_error(self, k: Knob, tmp_path: Path) -> None:
        """A bad value of any knob is refused as ``file:line: daemon.NAME: what``, one line."""
        path = str(tmp_path / "heartbeat.toml")
        with pytest.raises(ConfigError) as caught:
            parse_config(f"[daemon]\n{k.name} = {_BAD[k.kind]}\n", path=path)
        message = str(caught.value)
        assert message.startswith(f"{path}:2: daemon.{k.name}: ") and "\n" not in message, message


_NEW_KNOB = '''
    probe_after: float = knob(defaults.PROBE_AFTER, KnobKind.DURATION, "How long a probe may take.")
'''
_PROBE = textwrap.dedent('''
    import json, sys, tomllib
    from pathlib import Path
    from heartbeat.config.load import parse_config
    from heartbeat.daemon import Daemon
    from heartbeat.model.errors import ConfigError
    from heartbeat.model.policy import Policy
    from heartbeat.reports.why import policy_for
    from config_reference import undocumented

    state, path, example = sys.argv[1:4]
    head = f"[daemon]\\nstate_dir = {json.dumps(state)}\\ndefault_launcher = \\"agent\\"\\n"
    config = parse_config(head + 'probe_after = "5m"\\n[launchers.agent]\\ntype = "null"\\n', path=path)
    d = Daemon(config, dry_run=True)
    try:
        made = d.loop._make_policy("agent")
    finally:
        d.store.close()
    errors = []
    for bad in ('"0s"', "true"):
        try:
            parse_config(f"[daemon]\\nprobe_after = {bad}\\n", path=path)
        except ConfigError as exc:
            errors.append(str(exc))
    try:
        parse_config("[daemon]\\nprobe_afterr = 1\\n", path=path)
    except ConfigError as exc:
        errors.append(str(exc))
    print(json.dumps({
        "parsed": config.daemon.probe_after,
        "default": parse_config("", path=path).daemon.probe_after,
        "policy_default": Policy().probe_after,
        "daemon_policy": made.probe_after,
        "why_policy": policy_for(config).probe_after,
        "errors": errors,
        "undocumented": undocumented(Path(example)),
    }))
''')


class TestANewKnob:
    def test_one_line_makes_a_knob_of_the_parse_the_policy_and_the_reference(self, tmp_path: Path) -> None:
        """A knob declared by one line in ``PolicyKnobs`` (and its default in ``defaults.py``), in a copy
        of the package, is parsed with its kind's errors, reaches the daemon's and ``why``'s policy, and
        the config reference's check names it until the example documents it."""
        import json

        package = tmp_path / "pkg" / "heartbeat"
        shutil.copytree(ROOT / "heartbeat", package, ignore=shutil.ignore_patterns("__pycache__"))
        knobs_py = package / "model" / "knobs.py"
        text = knobs_py.read_text()
        anchor = "\n\ndef _declared_in("
        assert anchor in text
        knobs_py.write_text(text.replace(anchor, _NEW_KNOB.rstrip("\n") + anchor, 1))
        with (package / "model" / "defaults.py").open("a") as handle:
            handle.write('\nPROBE_AFTER = 42.0\n"""Seconds a probe may take."""\n')
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        example = tmp_path / "example.toml"
        shutil.copyfile(ROOT / "config" / "heartbeat.example.toml", example)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent), str(ROOT / "tests" / "support")])}

        def probe() -> dict[str, object]:
            run = subprocess.run([sys.executable, "-c", _PROBE, str(state), str(tmp_path / "hb.toml"), str(example)],
                                 env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert run.returncode == 0, run.stderr
            found: dict[str, object] = json.loads(run.stdout)
            return found

        seen = probe()
        path = tmp_path / "hb.toml"
        assert seen["parsed"] == seen["daemon_policy"] == seen["why_policy"] == 300.0
        assert seen["default"] == seen["policy_default"] == 42.0
        errors = seen["errors"]
        assert isinstance(errors, list) and len(errors) == 3
        assert errors[0] == f"{path}:2: daemon.probe_after: must be more than zero"
        assert errors[1].startswith(f"{path}:2: daemon.probe_after: ")
        assert errors[2].startswith(f"{path}:2: daemon.probe_afterr: unknown key (known: ") and "probe_after," in errors[2]
        assert seen["undocumented"] == ["daemon.probe_after"]
        example.write_text(example.read_text().replace("[daemon]\n", "[daemon]\n# How long a probe may take.\n"
                                                                    "probe_after = \"42s\"\n", 1))
        assert probe()["undocumented"] == []
