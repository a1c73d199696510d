"""A ServiceWorkload's placement honoured by the real scheduler, as the namespace's tenant.

The kwok nodes are in zone-a, zone-b and zone-c (`pilotfish.devcluster.nodes`); the admin
labels two of them `disk=ssd`, one in zone-b and one in zone-a, so only one node satisfies
both `zones: [zone-b]` and `nodeSelector: {disk: ssd}`. A placement nothing satisfies leaves
the pods Pending with the scheduler's own reason on PodScheduled.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, Tenant, wait_until
from e2e.test_serviceworkload import pods_of, service_workload
from pilotfish import names
from pilotfish.devcluster.nodes import node_name

PLURAL = "serviceworkloads"
TEAM = "e2e"  # the `namespace` fixture's team, with an unlimited TeamQuota
SSD = {"disk": "ssd"}
SSD_NODES = (node_name("zone-b", 1), node_name("zone-a", 2))


@pytest.fixture
def ssd_nodes(env: Env) -> Iterator[tuple[str, ...]]:
    """Two nodes labelled disk=ssd by the admin (zone-b's first); unlabelled afterwards."""
    core = k8s.CoreV1Api(env.api)
    for node in SSD_NODES:
        core.patch_node(node, {"metadata": {"labels": SSD}})
    try:
        yield SSD_NODES
    finally:
        for node in SSD_NODES:
            core.patch_node(node, {"metadata": {"labels": {"disk": None}}})


def create(tenant: Tenant, name: str, replicas: int, placement: dict[str, Any]) -> None:
    body = service_workload(name, TEAM, replicas, placement=placement)
    k8s.CustomObjectsApi(tenant.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, tenant.namespace, PLURAL, body
    )


def scheduled(pod: k8s.V1Pod) -> dict[str, str]:
    """The pod's PodScheduled condition as {status, reason, message}; {} before it has one."""
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled":
            return {"status": c.status, "reason": c.reason or "", "message": c.message or ""}
    return {}


def unschedulable(env: Env, ns: str, name: str, replicas: int) -> list[k8s.V1Pod]:
    pods = pods_of(env, ns, name)
    if len(pods) != replicas:
        return []
    ok = all(scheduled(p).get("reason") == "Unschedulable" for p in pods)
    return pods if ok else []


def test_zones_and_node_selector_put_every_replica_on_the_zone_b_ssd_node(
    env: Env, namespace: str, tenant: Tenant, ssd_nodes: tuple[str, ...]
) -> None:
    create(tenant, "web", 3, {"zones": ["zone-b"], "nodeSelector": SSD})

    def placed() -> list[k8s.V1Pod]:
        pods = pods_of(env, namespace, "web")
        return pods if len(pods) == 3 and all(p.spec.node_name for p in pods) else []

    pods = wait_until("3 replicas of web scheduled", placed, timeout=120)
    assert {p.spec.node_name for p in pods} == {ssd_nodes[0]}, [
        (p.metadata.name, p.spec.node_name) for p in pods
    ]
    for pod in pods:
        assert pod.spec.node_selector == SSD
        spread = pod.spec.topology_spread_constraints or []
        assert [(c.topology_key, c.when_unsatisfiable) for c in spread] == [
            (names.LABEL_ZONE, "ScheduleAnyway")
        ]


def test_a_zone_that_does_not_exist_leaves_pods_pending_with_the_schedulers_reason(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    create(tenant, "nowhere", 2, {"zones": ["zone-x"]})
    pods = wait_until(
        "both replicas of nowhere reported Unschedulable",
        lambda: unschedulable(env, namespace, "nowhere", 2),
        timeout=120,
    )
    for pod in pods:
        cond = scheduled(pod)
        assert cond["status"] == "False"
        assert not pod.spec.node_name
        assert pod.status.phase == "Pending"
        assert "node affinity/selector" in cond["message"], cond
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        exprs = [
            (e.key, e.operator, e.values)
            for t in terms.node_selector_terms
            for e in t.match_expressions
        ]
        assert exprs == [(names.LABEL_ZONE, "In", ["zone-x"])]

    def workload_says_why() -> dict[str, Any] | None:
        sw = k8s.CustomObjectsApi(env.api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "serviceworkloads", "nowhere"
        )
        for cond in (sw.get("status") or {}).get("conditions") or []:
            if cond["type"] == "PodsUnschedulable" and cond["status"] == "True":
                return dict(cond)
        return None

    cond = wait_until("nowhere's PodsUnschedulable condition", workload_says_why, timeout=60)
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("2 of 2 pods cannot be placed; nowhere-"), cond
    assert "node affinity/selector" in cond["message"], cond


def test_gpus_become_the_first_containers_request_and_no_node_has_them(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    create(tenant, "trainer", 1, {"gpus": 2, "machineClass": "pf.standard-32", "spread": "node"})
    (pod,) = wait_until(
        "the trainer replica reported Unschedulable",
        lambda: unschedulable(env, namespace, "trainer", 1),
        timeout=120,
    )
    resources = pod.spec.containers[0].resources
    assert resources.requests["nvidia.com/gpu"] == "2"
    assert resources.limits["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" in scheduled(pod)["message"], scheduled(pod)
    spread = pod.spec.topology_spread_constraints or []
    assert [c.topology_key for c in spread] == ["kubernetes.io/hostname"]
