"""Planned maintenance on the real control plane, in one pass: a NodeMaintenance on a kwok
node of this module's own zone cordons it and drains its pods through the Eviction API,
reports Done with `kubectl get nm` showing its progress, and, deleted, uncordons what it
cordoned (its finalizer holds the object until then) and leaves a cordon it did not set."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from e2e.lostnodes import fault_zone
from pilotfish import names

ZONE = "e2e-maint-smoke"
PODS = 3


def nm_api(env: Env) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(env.api)


def create_nm(env: Env, name: str, nodes: list[str], **spec: Any) -> None:
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodes": nodes, "reason": "e2e smoke", **spec},
    }
    nm_api(env).create_cluster_custom_object(names.GROUP, names.VERSION, "nodemaintenances", body)


def read_nm(env: Env, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = nm_api(env).get_cluster_custom_object(
            names.GROUP, names.VERSION, "nodemaintenances", name
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return found


def delete_nm(env: Env, name: str) -> None:
    try:
        nm_api(env).delete_cluster_custom_object(
            names.GROUP, names.VERSION, "nodemaintenances", name
        )
    except ApiException as e:
        if e.status != 404:
            raise


def phase(env: Env, name: str, want: str) -> dict[str, Any] | None:
    nm = read_nm(env, name) or {}
    return nm if (nm.get("status") or {}).get("phase") == want else None


def node_obj(env: Env, name: str) -> Any:
    return k8s.CoreV1Api(env.api).read_node(name)


def evictions_so_far(env: Env) -> float:
    """The operator's count of accepted evictions (each one an Eviction API call)."""
    assert env.spec is not None
    url = f"http://127.0.0.1:{env.spec.ports.operator_metrics}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:  # loopback, the dev cluster's
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("pilotfish_maintenance_evictions_total") and 'result="evicted"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "maint-smoke"}},
        "spec": {
            "nodeSelector": {names.LABEL_ZONE: ZONE},
            "containers": [
                {"name": "app", "image": "example/app:1", "resources": {"requests": {"cpu": "10m"}}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


@pytest.fixture
def zone_nodes(env: Env) -> Iterator[list[str]]:
    env.require_local()
    with fault_zone(env, ZONE, 2) as created:
        yield created


def test_a_maintenance_drains_its_node_through_evictions(
    env: Env, namespace: str, zone_nodes: list[str]
) -> None:
    core = k8s.CoreV1Api(env.api)
    target, spare = zone_nodes
    # Only the target takes the pods; then the spare is open for nothing else to land on.
    core.patch_node(spare, {"spec": {"unschedulable": True}})
    for i in range(PODS):
        core.create_namespaced_pod(namespace, pod(f"p{i}"))

    def running() -> bool:
        pods = core.list_namespaced_pod(namespace).items
        return len(pods) == PODS and all(
            p.spec.node_name == target and p.status.phase == "Running" for p in pods
        )

    wait_until("the pods running on the target node", running, timeout=90)
    before = evictions_so_far(env)
    create_nm(env, "smoke-drain", [target])
    try:
        done = wait_until("the maintenance Done", lambda: phase(env, "smoke-drain", "Done"), 90)
        assert done["status"]["progress"] == "1/1"
        (entry,) = done["status"]["nodes"]
        assert entry["name"] == target and entry["state"] == "Drained"
        assert names.FINALIZER_MAINTENANCE in done["metadata"]["finalizers"]
        node = node_obj(env, target)
        assert node.spec.unschedulable is True
        marks = node.metadata.annotations or {}
        assert marks.get(names.ANNOTATION_DRAINING) == "smoke-drain"
        assert marks.get(names.ANNOTATION_CORDONED_BY) == "smoke-drain"
        wait_until("the pods gone", lambda: not core.list_namespaced_pod(namespace).items, 60)
        assert evictions_so_far(env) - before == PODS

        out = env.kubectl("get", "nm", "smoke-drain")
        header, row = out.stdout.strip().splitlines()
        assert header.split() == ["NAME", "PHASE", "PROGRESS", "BLOCKED", "AGE"]
        assert row.split()[:4] == ["smoke-drain", "Done", "1/1", "False"]

        # A cluster-scoped object's Events live in `default`.
        events = json.loads(
            env.kubectl("get", "events.events.k8s.io", "-n", "default", "-o", "json").stdout
        )["items"]
        reasons = {
            e["reason"]
            for e in events
            if e["regarding"].get("kind") == "NodeMaintenance"
            and e["regarding"].get("name") == "smoke-drain"
        }
        assert {"DrainStarted", "NodeDrained", "MaintenanceComplete"} <= reasons
    finally:
        delete_nm(env, "smoke-drain")
        wait_until("the maintenance gone", lambda: read_nm(env, "smoke-drain") is None, 60)


def test_deleting_it_uncordons_only_what_it_cordoned(env: Env, zone_nodes: list[str]) -> None:
    core = k8s.CoreV1Api(env.api)
    mine, theirs = zone_nodes
    core.patch_node(theirs, {"spec": {"unschedulable": True}})  # someone else's cordon
    create_nm(env, "smoke-release", [mine, theirs], maxConcurrent=2)
    try:
        wait_until("the maintenance Done", lambda: phase(env, "smoke-release", "Done"), 90)
        assert node_obj(env, mine).spec.unschedulable is True
        theirs_marks = node_obj(env, theirs).metadata.annotations or {}
        assert theirs_marks.get(names.ANNOTATION_DRAINING) == "smoke-release"
        assert names.ANNOTATION_CORDONED_BY not in theirs_marks
    finally:
        delete_nm(env, "smoke-release")
    wait_until("the maintenance gone", lambda: read_nm(env, "smoke-release") is None, 60)
    released = node_obj(env, mine)
    assert not released.spec.unschedulable
    assert not {names.ANNOTATION_DRAINING, names.ANNOTATION_CORDONED_BY} & set(
        released.metadata.annotations or {}
    )
    kept = node_obj(env, theirs)
    assert kept.spec.unschedulable is True
    assert names.ANNOTATION_DRAINING not in (kept.metadata.annotations or {})
