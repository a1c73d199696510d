"""The foundation against the real control plane: CRDs, nodes, scheduling through the extender."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.devcluster import nodes, pki

CRDS = ("serviceworkloads", "batchworkloads", "gatepolicies", "teamquotas", "nodemaintenances")


def service_workload(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "team": "e2e",
        "replicas": 2,
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
        },
    }
    body.update(spec)
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": body,
    }


def test_crds_are_established(env: Env) -> None:
    ext = k8s.ApiextensionsV1Api(env.api)
    for plural in CRDS:
        crd = ext.read_custom_resource_definition(f"{plural}.{names.GROUP}")
        conditions = {c.type: c.status for c in crd.status.conditions}
        assert conditions.get("Established") == "True", (plural, conditions)
        assert names.CATEGORY in crd.spec.names.categories


def test_get_sw_shows_printer_columns(env: Env, namespace: str) -> None:
    env.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(service_workload("web")))
    out = env.kubectl("-n", namespace, "get", "sw").stdout
    header = out.splitlines()[0].split()
    for column in ("NAME", "TEAM", "BAND", "DESIRED", "AGE"):
        assert column in header, out
    row = out.splitlines()[1].split()
    assert row[0] == "web" and row[1] == "e2e" and row[2] == "production", out
    listed = env.kubectl("-n", namespace, "get", "pilotfish").stdout
    assert "serviceworkload.pilotfish.io/web" in listed


@pytest.mark.parametrize(
    ("spec", "field", "rule"),
    [
        ({"replicas": -1}, "spec.replicas", "greater than or equal to 0"),
        ({"band": "gold"}, "spec.band", "Unsupported value"),
        ({"strategy": {"maxSurge": 0, "maxUnavailable": 0}}, "spec.strategy", "maxSurge"),
    ],
)
def test_invalid_service_workload_is_rejected_naming_the_field(
    env: Env, namespace: str, spec: dict[str, Any], field: str, rule: str
) -> None:
    custom = k8s.CustomObjectsApi(env.api)
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            namespace,
            "serviceworkloads",
            service_workload("bad", **spec),
        )
    assert err.value.status == 422
    message = json.loads(err.value.body)["message"]
    assert field in message and rule in message, message
    listed = custom.list_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, "serviceworkloads"
    )
    assert listed["items"] == [], "nothing is half-written"


def test_kwok_nodes_are_ready_in_three_zones(env: Env) -> None:
    core = k8s.CoreV1Api(env.api)
    fake = core.list_node(label_selector=f"{names.LABEL_FAKE_NODE}=true").items
    ready = [
        n
        for n in fake
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    ]
    zones = {n.metadata.labels[names.LABEL_ZONE] for n in ready}
    assert zones == set(nodes.ZONES)
    assert len(ready) >= 12
    assert all(n.status.allocatable["cpu"] == nodes.CAPACITY["cpu"] for n in ready)


def _extender_filter_calls(env: Env) -> float:
    assert env.spec is not None
    url = f"https://127.0.0.1:{env.spec.ports.extender}/metrics"
    # The extender requires a client certificate from the cluster CA.
    context = pki.client_context(env.require_local().pki)
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("pilotfish_extender_requests_total{") and 'verb="filter"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_plain_pod_is_scheduled_through_the_extender_and_runs(env: Env, namespace: str) -> None:
    env.require_local()
    before = _extender_filter_calls(env)
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "plain"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "example/plain:1",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }
                ]
            },
        },
    )

    def running() -> k8s.V1Pod | None:
        pod = core.read_namespaced_pod("plain", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_until("pod plain Running", running, timeout=60)
    assert pod.spec.node_name and pod.spec.node_name.startswith("kwok-")
    assert _extender_filter_calls(env) > before, "kube-scheduler did not call the extender"
