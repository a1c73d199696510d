"""The chart's PrometheusRules rendered as the plain rule files a bare Prometheus reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pilotfish.devcluster import promrules

EXPECTED = ("pilotfish-gates", "pilotfish-machines", "pilotfish-maintenance", "pilotfish-reclaim")


def groups(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    assert set(doc) == {"groups"}, f"{path.name}: a rule file holds groups only"
    out: list[dict[str, Any]] = doc["groups"]
    return out


def rule(paths: list[Path], alert: str) -> dict[str, Any]:
    for path in paths:
        for group in groups(path):
            for r in group["rules"]:
                if r.get("alert") == alert:
                    found: dict[str, Any] = r
                    return found
    raise AssertionError(f"no alert {alert}")


def test_one_file_per_prometheusrule_holding_its_spec(tmp_path: Path) -> None:
    paths = promrules.render_rule_files(tmp_path)
    assert [p.name for p in paths] == [f"{n}.rules.yaml" for n in EXPECTED]
    objects = {o["metadata"]["name"]: o for o in promrules.render_objects()}
    for path in paths:
        name = path.name.removesuffix(".rules.yaml")
        assert groups(path) == objects[name]["spec"]["groups"]
        assert [g["name"] for g in groups(path)] == [name]
    # The Kubernetes wrapping is gone: no apiVersion, kind or metadata in a rule file.
    assert "apiVersion" not in paths[0].read_text()


def test_set_values_reach_the_rules(tmp_path: Path) -> None:
    paths = promrules.render_rule_files(tmp_path, {"metrics.prometheusRules.stalledFor": "30s"})
    stalled = rule(paths, "PilotfishGatesStalled")
    assert stalled["for"] == "30s"
    assert "[30s]" in stalled["expr"]
    default = rule(promrules.render_rule_files(tmp_path / "d"), "PilotfishGatesStalled")
    assert default["for"] == "15m"


def test_a_rerender_removes_rule_files_the_chart_no_longer_has(tmp_path: Path) -> None:
    (tmp_path / "pilotfish-gone.rules.yaml").write_text("groups: []\n")
    keep = tmp_path / "prometheus.yml"
    keep.write_text("global: {}\n")
    paths = promrules.render_rule_files(tmp_path)
    assert sorted(tmp_path.glob("*.rules.yaml")) == sorted(paths)
    assert keep.exists(), "only rule files are pruned"


def test_a_bad_value_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(promrules.RenderError, match="stalledFor"):
        promrules.render_rule_files(tmp_path, {"metrics.prometheusRules.stalledFor": "soon"})
    assert list(tmp_path.glob("*.rules.yaml")) == []
