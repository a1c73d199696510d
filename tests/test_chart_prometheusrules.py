"""The chart's PrometheusRules, checked from the rendered objects (promtool: test_prometheus_rules).

What a broken rule file usually gets wrong, checked from the rendered objects: a metric name
that Pilotfish does not export (the alert can then never fire), an annotation quoting a
`$labels.x` the expression aggregated away (it renders empty), an expression over the raw
per-pod series (which splits or duplicates alerts when leadership moves), unbalanced
parentheses, an alert without severity or words for on-call.
"""

from __future__ import annotations

import re
from typing import Any

import prometheus_client
import pytest
import yaml

from pilotfish import metrics
from tests.test_chart_values import CHART, helm, needs_helm

ENABLED = ("--set", "metrics.prometheusRules.enabled=true")
CAPABLE = ("--api-versions", "monitoring.coreos.com/v1")
MACHINE_ALERTS = {
    "PilotfishZoneBrake": ("pilotfish_nodelifecycle_zone_brake", "== 1", None),
    "PilotfishNodesUnreachable": ("pilotfish_nodelifecycle_unreachable_nodes", "> 0", "10m"),
    "PilotfishAtMostOneWaiting": ("pilotfish_serviceworkload_at_most_one_waiting", "> 0", "5m"),
}

MAINTENANCE_ALERTS = {
    "PilotfishDrainBlocked": ("pilotfish_maintenance_blocked_nodes", "> 0", None),
}

RECLAIM_ALERTS = {
    "PilotfishReclaimStale": ("pilotfish_reclaim_stale_nodes", "> 0", "5m"),
    "PilotfishReclaimEvicting": ("pilotfish_reclaim_evictions_total", "> 0", "30m"),
    "PilotfishProductionOverRequest": (
        "pilotfish_reclaim_production_over_request_pods",
        "> 0",
        "10m",
    ),
}

GATE_ALERTS = ("PilotfishGateOverdue", "PilotfishGatesStalled", "PilotfishGateControllerDown")


def render(*args: str) -> list[dict[str, Any]]:
    out = helm(
        "template", "t", str(CHART), "-n", "pilotfish-system", "-s",
        "templates/prometheusrules.yaml", *args, check=False,
    )  # fmt: skip
    if "could not find template" in out.stderr:
        return []
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if isinstance(d, dict)]


def alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        rule["alert"]: rule
        for doc in docs
        for group in doc["spec"]["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def exported() -> set[str]:
    """Every series name Pilotfish's metrics module defines (counters with `_total`)."""
    out: set[str] = set()
    for value in vars(metrics).values():
        if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
            for family in value.describe():
                out.add(family.name)
                out.add(family.name + "_total")
    return out


@needs_helm
def test_off_unless_asked_for_and_served() -> None:
    assert render() == []
    assert render(*ENABLED) == []  # the cluster lacks the Prometheus Operator's API
    assert render(*CAPABLE) == []


@needs_helm
def test_the_machine_failure_alerts() -> None:
    docs = render(*ENABLED, *CAPABLE)
    assert [d["metadata"]["name"] for d in docs] == [
        "pilotfish-gates",
        "pilotfish-machines",
        "pilotfish-maintenance",
        "pilotfish-reclaim",
    ]
    got = alerts(docs)
    assert set(got) == {*MACHINE_ALERTS, *MAINTENANCE_ALERTS, *RECLAIM_ALERTS, *GATE_ALERTS}
    checked = {**MACHINE_ALERTS, **MAINTENANCE_ALERTS, **RECLAIM_ALERTS}
    for name, (metric, comparison, wait) in checked.items():
        rule = got[name]
        assert metric in rule["expr"] and rule["expr"].strip().endswith(comparison)
        assert rule.get("for") == wait
    assert "by (zone)" in got["PilotfishZoneBrake"]["expr"]
    assert got["PilotfishZoneBrake"]["labels"]["severity"] == "critical"


@needs_helm
def test_alert_labels_and_rule_labels_reach_every_alert() -> None:
    docs = render(
        *ENABLED, *CAPABLE, "--set", "metrics.prometheusRules.alertLabels.team=platform",
        "--set", "metrics.prometheusRules.labels.release=prom",
    )  # fmt: skip
    assert all(d["metadata"]["labels"]["release"] == "prom" for d in docs)
    assert all(r["labels"]["team"] == "platform" for r in alerts(docs).values())


@needs_helm
@pytest.mark.parametrize(
    "name", [*sorted(MACHINE_ALERTS), *MAINTENANCE_ALERTS, *sorted(RECLAIM_ALERTS), *GATE_ALERTS]
)
def test_every_rule_is_well_formed(name: str) -> None:
    rule = alerts(render(*ENABLED, *CAPABLE))[name]
    expr = rule["expr"]
    depth = 0
    for ch in expr:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        assert depth >= 0, expr
    assert depth == 0, expr
    names = set(re.findall(r"\bpilotfish_[a-z_]+\b", expr))
    assert names and names <= exported(), names - exported()
    # Aggregated: never the raw per-pod series.
    assert re.match(r"^\(?\s*(max|sum)\b", expr.strip()), expr
    kept = set()
    for by in re.findall(r"\bby \(([^)]*)\)", expr):
        kept |= {label.strip() for label in by.split(",")}
    for text in rule["annotations"].values():
        for label in re.findall(r"\$labels\.([a-z_]+)", text):
            assert label in kept, f"{name} quotes $labels.{label}, aggregated away"
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80
