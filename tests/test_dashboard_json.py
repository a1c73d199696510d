"""The chart's Grafana dashboard, checked without Grafana: every panel's PromQL parses (the
real promtool), names only metrics Pilotfish exports, aggregates away the scraped pod and
instance labels, and every exported metric has a panel; the chart ships it in a ConfigMap
Grafana's sidecar loads. e2e/test_dashboard.py evaluates the same queries against a real
Prometheus with data.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pilotfish.devcluster import binaries, promrules
from tests.test_chart_prometheusrules import exported

DASHBOARD = promrules.chart_dir() / "dashboards" / "pilotfish.json"
# Metrics a panel may name that are not Pilotfish's: the kubelet resource metrics reclaim's
# usage comes from.
KUBELET = {"node_cpu_usage_seconds_total", "node_memory_working_set_bytes"}
# Grafana's variables and what stands for them when a query is evaluated outside Grafana.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$namespace": ".*",
    "$team": ".*",
    "$node": ".*",
}
AGGREGATIONS = ("sum", "max", "min", "avg", "count", "histogram_quantile")


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


def targets(doc: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(panel title / refId, expr) of every query of the dashboard."""
    return [
        (f"{p['title']} / {t['refId']}", t["expr"])
        for p in panels(doc or load())
        for t in p.get("targets", [])
    ]


def substitute(expr: str) -> str:
    """`expr` with Grafana's variables replaced by what a plain Prometheus query can use."""
    for var in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(var, VARIABLES[var])
    if "$" in expr:
        raise AssertionError(f"{expr!r}: a variable without a stand-in")
    return expr


def metric_names(expr: str) -> set[str]:
    """The series names an expression reads (histograms by their family name)."""
    names = set(re.findall(r"\b((?:pilotfish|node|pod)_[a-z_]+)\b", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_the_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    doc = load()
    assert doc["uid"] == "pilotfish" and doc["title"] == "Pilotfish"
    assert isinstance(doc["schemaVersion"], int) and doc["schemaVersion"] >= 36
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels(doc):
        if p["type"] == "row":
            continue
        assert p["datasource"] == source, p["title"]
        assert p["targets"] and all(t["datasource"] == source for t in p["targets"]), p["title"]
        assert p.get("description"), f"{p['title']}: a panel says what it shows"
    for name in ("namespace", "team", "node"):
        assert variables[name]["datasource"] == source
        assert variables[name]["allValue"] == ".*"
    used = {v for _, e in targets(doc) for v in re.findall(r"\$(\w+)", e)}
    assert used - {"__rate_interval"} <= set(variables), used


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    doc = load()
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels(doc):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def test_every_query_names_exported_metrics_and_aggregates() -> None:
    known = exported() | KUBELET
    for where, expr in targets():
        names = metric_names(expr)
        assert names, where
        assert names <= known, f"{where}: {sorted(names - known)} not exported"
        outer = re.match(r"\s*([a-z_]+)", expr)
        assert outer and outer.group(1) in AGGREGATIONS, f"{where}: {expr} not aggregated"
        if "histogram_quantile" in expr:
            assert "_bucket" in expr and re.search(r"by \([^)]*\ble\b", expr), where


def test_every_pilotfish_metric_has_a_panel() -> None:
    shown = {n for _, e in targets() for n in metric_names(e)}
    families = {n.removesuffix("_total") for n in exported()}
    missing = {f for f in families if f not in shown and f + "_total" not in shown}
    assert missing == set(), f"metrics without a panel: {sorted(missing)}"


def check_rules(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(binaries.bin_dir() / "promtool"), "check", "rules", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_every_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule: a typo is a failure here, not an
    empty panel in production."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(expr)}
        for i, (_, expr) in enumerate(targets())
    ]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = check_rules(path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout


def test_a_bad_query_fails_the_parse_check(tmp_path: Path) -> None:
    path = tmp_path / "bad.rules.yaml"
    bad = "sum by (gate (rate(pilotfish_gates_releases_total[1m]))"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "r", "expr": bad}]}]})
    )
    res = check_rules(path)
    assert res.returncode != 0


def render_configmap(*sets: str) -> list[dict[str, Any]]:
    helm = binaries.helm(binaries.bin_dir())
    args = [str(helm), "template", "t", str(promrules.chart_dir()), "-s",
            "templates/grafana-dashboard.yaml"]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if "could not find template" in res.stderr:
        return []
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if isinstance(d, dict)]


def test_the_chart_ships_the_dashboard_only_when_asked() -> None:
    assert render_configmap() == []
    (cm,) = render_configmap(
        "metrics.grafanaDashboard.enabled=true", "metrics.grafanaDashboard.labels.team=platform"
    )
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["team"] == "platform"
    assert json.loads(cm["data"]["pilotfish.json"]) == load()


@pytest.mark.parametrize(
    "bad", ["metrics.grafanaDashboard.enabled=maybe", "metrics.grafanaDashboard.folder=x"]
)
def test_bad_dashboard_values_are_refused(bad: str) -> None:
    helm = binaries.helm(binaries.bin_dir())
    res = subprocess.run(
        [str(helm), "template", "t", str(promrules.chart_dir()), "--set", bad],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode != 0
    assert "grafanaDashboard" in res.stderr, res.stderr
