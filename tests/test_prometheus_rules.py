"""Every alert of the chart, evaluated by the real promtool over input series.

The rules are rendered from the chart (`promrules.render_rule_files`) next to a copy of each
`tests/rules/<PrometheusRule>.test.yaml`, so what is tested is what the chart ships. The test
files live beside this module, not in the chart: they are fixtures of this suite, and
`helm package` would otherwise ship them. Only the summary annotation is compared (the one
on-call reads first); a description is long prose whose templates `promtool check rules`
parses, and `test_chart_prometheusrules` checks the labels it quotes survive aggregation.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pilotfish.devcluster import binaries, promrules

TESTS = Path(__file__).parent / "rules"
CASES = sorted(TESTS.glob("*.test.yaml"))


def promtool() -> Path:
    return binaries.bin_dir() / "promtool"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return promrules.render_rule_files(tmp_path_factory.mktemp("rules"))


def summaries_only(rule_file: Path, out_dir: Path) -> Path:
    doc = yaml.safe_load(rule_file.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "annotations" in rule:
                rule["annotations"] = {"summary": rule["annotations"]["summary"]}
    out = out_dir / rule_file.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def prepared(case: Path, rendered: list[Path], out_dir: Path) -> Path:
    """The test file beside the summaries-only rule file it names."""
    for rule_file in rendered:
        summaries_only(rule_file, out_dir)
    shutil.copy(case, out_dir / case.name)
    return out_dir / case.name


def alerts_of(paths: list[Path]) -> set[str]:
    return {
        rule["alert"]
        for path in paths
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_promtool_checks_every_rendered_rule_file(rendered: list[Path]) -> None:
    res = run("check", "rules", *rendered)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(rendered), res.stdout


def test_every_prometheusrule_has_a_test_file(rendered: list[Path]) -> None:
    assert {c.name.removesuffix(".test.yaml") for c in CASES} == {
        r.name.removesuffix(".rules.yaml") for r in rendered
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_promtool_unit_tests(case: Path, rendered: list[Path], tmp_path: Path) -> None:
    res = run("test", "rules", prepared(case, rendered, tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


def test_every_alert_is_tested_firing_and_not_firing(rendered: list[Path]) -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for case in CASES:
        for test in yaml.safe_load(case.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = alerts_of(rendered)
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - silent == set(), "alerts never tested not firing"
    assert (firing | silent) <= alerts, "tests name alerts the chart does not have"


def test_promtool_fails_a_wrong_expectation(rendered: list[Path], tmp_path: Path) -> None:
    """The harness can fail: an expected label the rule does not set is a promtool failure."""
    case = prepared(TESTS / "pilotfish-maintenance.test.yaml", rendered, tmp_path)
    doc: dict[str, Any] = yaml.safe_load(case.read_text())
    firing = next(c for t in doc["tests"] for c in t["alert_rule_test"] if c.get("exp_alerts"))
    firing["exp_alerts"][0]["exp_labels"]["severity"] = "critical"
    case.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run("test", "rules", case)
    assert res.returncode != 0, res.stdout
    assert "PilotfishDrainBlocked" in res.stdout + res.stderr
