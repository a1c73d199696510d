"""Reclaim at admission, against the real API server, webhooks, scheduler and extender: a
tenant's batch pod is moved onto `batch.pilotfish.io/*` where the namespace has reclaim on,
charged to its TeamQuota what it asked, and placed only against a node's batch allocatable;
production memory is held to its request; forged batch requests are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from e2e.teams import own_team
from e2e.test_quota import make_quota
from pilotfish import names, quantity

MI = 2**20


def pod(
    name: str, band: str, requests: dict[str, str], limits: dict[str, str] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": requests}
    if limits is not None:
        resources["limits"] = limits
    return {
        "metadata": {"name": name, "labels": {names.LABEL_BAND: band}},
        "spec": {
            "containers": [{"name": "main", "image": "example/x:1", "resources": resources}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def resources(p: k8s.V1Pod) -> dict[str, Any]:
    """The first container's requests and limits as exact amounts (the API server writes
    200000 as 200k)."""
    r = p.spec.containers[0].resources
    return {
        kind: {k: quantity.parse(v) for k, v in (getattr(r, kind) or {}).items()}
        for kind in ("requests", "limits")
    }


def amounts(values: dict[str, str]) -> dict[str, Any]:
    return {k: quantity.parse(v) for k, v in values.items()}


def denial(e: ApiException) -> str:
    return str(json.loads(e.body).get("message", ""))


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    """A team of its own with room in batch and production, so admission reserves and the
    quota operator counts what each pod is charged."""
    with own_team(env, namespace) as name:
        limits = {"cpu": "1000", "memory": "1Ti", "pods": 20}
        make_quota(env, name, {"production": dict(limits), "batch": dict(limits)})
        yield name


def enable_reclaim(env: Env, namespace: str) -> None:
    """Label the namespace as the platform would, and wait until admission sees it (its
    namespace view is an informer): a dry-run batch pod comes back translated."""
    core = k8s.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {names.LABEL_RECLAIM: "enabled"}}})
    probe = pod("reclaim-probe", "batch", {"cpu": "1m"})

    def translated() -> bool:
        out = core.create_namespaced_pod(namespace, probe, dry_run="All")
        return names.BATCH_CPU in (out.spec.containers[0].resources.requests or {})

    wait_until("admission to see the namespace's reclaim label", translated, timeout=30)


def used(env: Env, team: str, band: str) -> dict[str, Any]:
    tq = k8s.CustomObjectsApi(env.api).get_cluster_custom_object(
        names.GROUP, names.VERSION, "teamquotas", team
    )
    return dict(((tq.get("status") or {}).get("used") or {}).get(band) or {})


def scheduled_message(core: k8s.CoreV1Api, namespace: str, name: str) -> str:
    p = core.read_namespaced_pod(name, namespace)
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return str(c.message or "")
    return ""


def set_batch_allocatable(env: Env, node: str, cpu_m: int | None, memory: int | None) -> None:
    """As the reclaim controller would: batch.pilotfish.io/* in capacity and allocatable."""
    core = k8s.CoreV1Api(env.api)
    current = core.read_node(node).status
    ops: list[dict[str, Any]] = []
    for field, held in (("capacity", current.capacity), ("allocatable", current.allocatable)):
        for resource, value in ((names.BATCH_CPU, cpu_m), (names.BATCH_MEMORY, memory)):
            path = f"/status/{field}/{resource.replace('/', '~1')}"
            if value is not None:
                ops.append({"op": "add", "path": path, "value": str(value)})
            elif resource in (held or {}):
                ops.append({"op": "remove", "path": path})
    if ops:
        env.kubectl(
            "patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(ops)
        )


def test_batch_pod_is_translated_charged_as_asked_and_placed_on_batch_allocatable(
    env: Env, namespace: str, team: str, tenant: Tenant
) -> None:
    enable_reclaim(env, namespace)
    core = k8s.CoreV1Api(env.api)
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    target = nodes[-1]
    # More batch cpu than any node could measure from its 32 cores, so it waits until the
    # test gives `target` the figure; pinned there so nothing else can take it.
    big = pod(
        "big",
        "batch",
        {"cpu": "200", "memory": "256Mi"},
        {"cpu": "250", "memory": "512Mi"},
    )
    big["spec"]["nodeSelector"] = {"kubernetes.io/hostname": target}
    created = k8s.CoreV1Api(tenant.api).create_namespaced_pod(namespace, big)

    batch = {names.BATCH_CPU: "200000", names.BATCH_MEMORY: str(256 * MI)}
    assert resources(created) == {"requests": amounts(batch), "limits": amounts(batch)}
    record = json.loads(created.metadata.annotations[names.ANNOTATION_ORIGINAL_RESOURCES])
    assert record == {
        "containers": {
            "main": {
                "requests": {"cpu": "200", "memory": "256Mi"},
                "limits": {"cpu": "250", "memory": "512Mi"},
            }
        },
        "initContainers": {},
    }
    assert created.status.qos_class == "BestEffort"

    # Charged to the team's batch quota what it asked, not a thousand times the cpu.
    wait_until(
        "the quota operator to count the pod as its original requests",
        lambda: (
            used(env, team, "batch").get("cpu") == "200"
            and used(env, team, "batch").get("memory") == "256Mi"
        ),
        timeout=60,
    )

    wait_until(
        "the scheduler to find no node with that much batch.pilotfish.io/cpu",
        lambda: f"Insufficient {names.BATCH_CPU}" in scheduled_message(core, namespace, "big"),
        timeout=60,
    )
    plugin = Path(sys.executable).parent / "kubectl-pilotfish"
    why = subprocess.run(
        [str(plugin), "--kubeconfig", str(env.kubeconfig), "why", "big", "-n", namespace],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "It waits for reclaimed batch capacity" in why.stdout, why.stdout + why.stderr
    assert "it asks batch.pilotfish.io/cpu 200 cores, batch.pilotfish.io/memory 256Mi" in (
        why.stdout
    )
    assert "container main requests cpu 200, memory 256Mi (limits cpu 250, memory 512Mi)" in (
        why.stdout
    )

    try:
        set_batch_allocatable(env, target, 400_000, 2**40)
        wait_until(
            f"the pod to bind to {target} against its batch allocatable",
            lambda: core.read_namespaced_pod("big", namespace).spec.node_name == target,
            timeout=60,
        )
    finally:
        core.delete_namespaced_pod("big", namespace, grace_period_seconds=0)
        set_batch_allocatable(env, target, None, None)


def test_production_memory_limit_is_its_request_and_forged_batch_is_refused(
    env: Env, namespace: str, team: str, tenant: Tenant
) -> None:
    enable_reclaim(env, namespace)
    api = k8s.CoreV1Api(tenant.api)
    web = api.create_namespaced_pod(
        namespace,
        pod("web", "production", {"cpu": "1", "memory": "128Mi"}, {"memory": "1Gi"}),
    )
    assert resources(web) == {
        "requests": amounts({"cpu": "1", "memory": "128Mi"}),
        "limits": amounts({"memory": "128Mi"}),
    }
    assert web.status.qos_class == "Burstable"

    forged = pod(
        "forged",
        "production",
        {"cpu": "1", names.BATCH_CPU: "4500"},
        {names.BATCH_CPU: "4500"},
    )
    with pytest.raises(ApiException) as err:
        api.create_namespaced_pod(namespace, forged)
    message = denial(err.value)
    assert (
        "spec.containers[0].resources.requests[batch.pilotfish.io/cpu]: 4500 is refused: "
        "production pods may not request batch.pilotfish.io/cpu"
    ) in message, message
    with pytest.raises(ApiException) as err:
        api.create_namespaced_pod(
            namespace,
            pod("mixed", "batch", {"cpu": "1", names.BATCH_CPU: "10"}, {names.BATCH_CPU: "10"}),
        )
    assert "requests[batch.pilotfish.io/cpu]: 10 is refused: the container also names cpu" in (
        denial(err.value)
    )


def test_nothing_changes_where_reclaim_is_off(
    env: Env, namespace: str, team: str, tenant: Tenant
) -> None:
    api = k8s.CoreV1Api(tenant.api)
    plain = {"cpu": "500m", "memory": "64Mi"}
    b = api.create_namespaced_pod(namespace, pod("b", "batch", dict(plain)))
    assert resources(b) == {"requests": amounts(plain), "limits": {}}
    assert names.ANNOTATION_ORIGINAL_RESOURCES not in (b.metadata.annotations or {})
    web = api.create_namespaced_pod(
        namespace, pod("web", "production", dict(plain), {"memory": "1Gi"})
    )
    assert resources(web) == {"requests": amounts(plain), "limits": amounts({"memory": "1Gi"})}
    with pytest.raises(ApiException) as err:
        api.create_namespaced_pod(
            namespace,
            pod("forged", "batch", {names.BATCH_CPU: "10"}, {names.BATCH_CPU: "10"}),
        )
    assert "reclaim is off in namespace" in denial(err.value)
