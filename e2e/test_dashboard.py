"""Every panel of the chart's Grafana dashboard evaluated against the real Prometheus.

First some activity, so the panels have data to show: a TeamQuota with limits and a
ServiceWorkload with a Service rolled out under it (admission, quota, extender, scheduling,
rollout and endpoint metrics), a pod held by a GatePolicy's gate and released by its
GateSignal, and one held (gate metrics). Then every query runs as Grafana runs it (a range
query, its variables given plain values): a query error fails, and so does an empty result
when every metric the query reads has data in Prometheus (two samples in the last minute,
what a rate needs), which is a panel that would show "No data" on a cluster that has the
data.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client as k8s

from e2e import prom
from e2e.conftest import Env, wait_until
from e2e.test_gates_admission import GATE, create, gate_policy, pod_body, wait_policy_seen
from e2e.test_serviceworkload import ns, ready_workload, team_of
from pilotfish import names, timeutil
from tests.test_dashboard_json import metric_names, substitute, targets

__all__ = ["ns"]  # the fixture: a namespace whose own TeamQuota grants production

pytestmark = [pytest.mark.e2e]

# Series the activity must have produced, or the check below would be vacuous.
PRODUCED = (
    "pilotfish_operator_leader",
    "pilotfish_webhooks_reviews_total",
    "pilotfish_extender_requests_total",
    "pilotfish_rollout_workloads",
    "pilotfish_rollout_pod_actions_total",
    "pilotfish_gates_releases_total",
    "pilotfish_gates_release_age_seconds_bucket",
    "pilotfish_endpoints_endpoints",
    "pilotfish_endpoints_slice_writes_total",
    "pilotfish_quota_held",
    "pilotfish_quota_limit",
    "pilotfish_gates_gated_pods",
    "pilotfish_gates_oldest_gated_age_seconds",
    "pilotfish_scheduling_latency_seconds_bucket",
    "node_cpu_usage_seconds_total",
)
HELD_GATE = "gates.pilotfish.io/held"
WINDOW = 180.0  # seconds of the range each query is evaluated over
STEP = 15.0


def release_a_gated_pod(env: Env, namespace: str) -> None:
    labels = {"app": "gated", names.LABEL_BAND: "production"}
    create(env, namespace, "gatepolicies", gate_policy("data", [GATE], {"matchLabels": labels}))
    wait_policy_seen(env, namespace, pod_body("probe", labels), GATE)
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(namespace, pod_body("gated", labels))
    signal = {
        "apiVersion": names.API_VERSION,
        "kind": "GateSignal",
        "metadata": {"name": "data-ready"},
        "spec": {},
    }
    custom = k8s.CustomObjectsApi(env.api)
    custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, "gatesignals", signal
    )
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Done",
        "message": "",
        "lastTransitionTime": timeutil.format_time(timeutil.SYSTEM_CLOCK.now()),
    }
    custom.patch_namespaced_custom_object_status(
        names.GROUP, names.VERSION, namespace, "gatesignals", "data-ready",
        {"status": {"conditions": [ready]}},
    )  # fmt: skip
    wait_until(
        "the gate released",
        lambda: not core.read_namespaced_pod("gated", namespace).spec.scheduling_gates,
        timeout=60,
    )


def rateable(name: str) -> str:
    """Series of `name` with two samples in the last minute: what a rate over
    $__rate_interval (1m here) needs to answer, and so what "data exists" means."""
    return f'count(count_over_time({{__name__="{name}"}}[1m]) >= 2)'


def hold_a_gated_pod(env: Env, namespace: str) -> None:
    """A pod whose gate waits for a signal nobody raises: the gated-pod gauges have series."""
    labels = {"app": "held", names.LABEL_BAND: "production"}
    policy = gate_policy("held", [HELD_GATE], {"matchLabels": labels})
    policy["spec"]["gates"][0]["condition"]["signalName"] = "never-raised"
    create(env, namespace, "gatepolicies", policy)
    wait_policy_seen(env, namespace, pod_body("probe", labels), HELD_GATE)
    k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, pod_body("held", labels))


def limit_the_quota(env: Env, namespace: str) -> None:
    """Give the test team's production band limits, so quota use has a denominator."""
    limits: dict[str, Any] = {"cpu": "20", "memory": "20Gi", "pods": 50}
    k8s.CustomObjectsApi(env.api).patch_cluster_custom_object(
        names.GROUP, names.VERSION, "teamquotas", team_of(namespace),
        {"spec": {"bands": {"production": limits}}},
    )  # fmt: skip


def has_data(env: Env, name: str, at: float) -> bool:
    return bool(prom.query(env, rateable(name), at=at))


def evaluate(env: Env, expr: str, end: float) -> list[dict[str, Any]]:
    return prom.query_range(env, substitute(expr), end - WINDOW, end, STEP)


def test_every_panel_query_answers_with_data_where_data_exists(env: Env, ns: str) -> None:
    assert prom.ready(env), "the cluster's Prometheus is not ready"
    limit_the_quota(env, ns)
    ready_workload(env, ns, "web", 2, service={"ports": [{"name": "http", "port": 80}]})
    release_a_gated_pod(env, ns)
    hold_a_gated_pod(env, ns)
    for name in PRODUCED:
        prom.wait_for_series(env, rateable(name), deadline=90)
    # The gate release must be in Prometheus, not just its counter's first sample.
    prom.wait_for_series(
        env, f'sum(pilotfish_gates_releases_total{{namespace="{ns}"}}) > 0', deadline=60
    )

    errors: list[str] = []
    empty: list[str] = []
    answered = 0
    for where, expr in targets():
        end = time.time()  # the data check below asks about the same instant
        try:
            result = evaluate(env, expr, end)
        except prom.PrometheusError as e:
            errors.append(f"{where}: {e}")
            continue
        if result:
            answered += 1
            continue
        names_ = sorted(metric_names(expr))
        # A histogram's family has series under its _bucket name.
        present = [n for n in names_ if has_data(env, n, end) or has_data(env, n + "_bucket", end)]
        if present == names_:
            empty.append(f"{where}: {expr!r} is empty though {names_} have data")
    assert errors == [], "\n".join(errors)
    assert empty == [], "\n".join(empty)
    assert answered >= len(PRODUCED), f"only {answered} queries had data"
