"""The chart's alerts in the real Prometheus: it loaded every PrometheusRule group the chart
renders, rule for rule, and an alert fires when its condition is made true on the cluster
and resolves when it is undone.

The alert made to fire is PilotfishDrainBlocked: the cheapest condition to cause for real (a
NodeMaintenance on a node whose pods a zero disruption budget protects, blocked after 3 s)
and one without a `for`, so the wait is the NodeMaintenance's own blockedAfterSeconds, a
scrape and a rule evaluation.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from e2e import maintenance as nm
from e2e import prom
from e2e.conftest import Env, wait_until
from e2e.lostnodes import fault_zone
from e2e.test_maintenance import guarded_pod, pdb_allows
from pilotfish.devcluster import promrules

pytestmark = [pytest.mark.e2e]

ALERT = "PilotfishDrainBlocked"


def chart_rules() -> dict[str, dict[str, dict[str, Any]]]:
    """{group: {alert: rule}} as the chart renders them."""
    return {
        group["name"]: {r["alert"]: r for r in group["rules"] if "alert" in r}
        for obj in promrules.render_objects()
        for group in obj["spec"]["groups"]
    }


def firing(env: Env, alertname: str) -> list[dict[str, Any]]:
    return [
        a
        for a in prom.alerts(env)
        if a["labels"].get("alertname") == alertname and a["state"] == "firing"
    ]


def test_prometheus_loaded_every_rule_of_the_chart(env: Env) -> None:
    want = chart_rules()

    def loaded() -> dict[str, dict[str, dict[str, Any]]] | None:
        got = {
            g["name"]: {r["name"]: r for r in g["rules"] if r.get("type") == "alerting"}
            for g in prom.rule_groups(env)
        }
        return got if set(want) <= set(got) else None

    got = wait_until("Prometheus to list the chart's rule groups", loaded, timeout=60)
    for group, alerts in want.items():
        assert set(got[group]) == set(alerts), group
        for name, rule in alerts.items():
            live = got[group][name]
            # Prometheus reports the parsed expression; compare modulo whitespace.
            assert " ".join(live["query"].split()) == " ".join(rule["expr"].split()), name
            assert live["labels"].get("severity") == rule["labels"]["severity"], name
            assert live["health"] in ("ok", "unknown"), (name, live.get("lastError"))


def test_a_blocked_drain_fires_its_alert_and_resolves(env: Env, namespace: str) -> None:
    env.require_local()
    # An earlier test's blocked drain must have resolved first: this one is the cause.
    wait_until(f"{ALERT} not firing before", lambda: not firing(env, ALERT), timeout=60)
    zone = "e2e-alert-a"
    core, policy = k8s.CoreV1Api(env.api), k8s.PolicyV1Api(env.api)
    with fault_zone(env, zone, 1) as (node,), nm.removed(env, "alerted"):
        for name in ("guarded-0", "guarded-1"):
            core.create_namespaced_pod(namespace, guarded_pod(name, zone))
        pdb = {
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
        }
        policy.create_namespaced_pod_disruption_budget(namespace, pdb)
        wait_until("the budget at 0", lambda: pdb_allows(env, namespace, "guard", 0, 2), 60)
        nm.create(env, nm.body("alerted", [node], blockedAfterSeconds=3))

        (alert,) = wait_until(f"{ALERT} firing", lambda: firing(env, ALERT), timeout=90)
        assert alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["summary"] == (
            "1 node(s) of a NodeMaintenance blocked longer than its blockedAfterSeconds"
        )
        assert float(alert["value"]) == 1

        policy.patch_namespaced_pod_disruption_budget(
            "guard", namespace, {"spec": {"minAvailable": 0}}
        )
        nm.wait_phase(env, "alerted", "Done", timeout=90)
        wait_until(f"{ALERT} resolved", lambda: not firing(env, ALERT), timeout=60)
