"""Placement through the real kube-scheduler and the Pilotfish extender on the local cluster.

The local cluster has 12 kwok nodes of 32 CPUs, four in each of zone-a, zone-b and zone-c.
Tests that fill the cluster need it to themselves: each waits until no other test's pods are
bound, and deletes its own pods (and waits for them to go) when it ends.

Every pod sets `priorityClassName` itself (the band-to-priority webhook is another issue).
"Legacy production" pods below carry the production band label but no priority class, so
their priority is 0: exactly the pods kube-scheduler's priority-only preemption would evict
for anyone, and that only the extender protects. Such pods exist wherever the admission
webhooks did not run (created before them, while they were down, or in a namespace that
opts out), so the test namespaces opt out (`pilotfish.io/webhooks: disabled`): what is
tested here is placement, and each pod is admitted exactly as written.

Run: PILOTFISH_E2E_PORT_OFFSET=10000 .venv/bin/python -m pytest e2e/test_extender.py -q
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.devcluster import nodes, pki

PRODUCTION = names.PRIORITY_CLASS["production"]
BATCH = names.PRIORITY_CLASS["batch"]
GPU = "nvidia.com/gpu"
LABEL_WORKLOAD = "pilotfish.io/workload"
WEBHOOKS_LABEL = "pilotfish.io/webhooks"  # "disabled": the chart's webhooks skip the namespace
NODE_CPU = int(nodes.CAPACITY["cpu"])
ALL_NODES = [nodes.node_name(zone, i) for zone in nodes.ZONES for i in range(4)]

pytestmark = pytest.mark.e2e


def pod_body(
    name: str,
    *,
    band: str,
    cpu: float,
    priority_class: str | None,
    workload: str | None = None,
    node: str | None = None,
    gpu: int | None = None,
    machine_class: str | None = None,
    grace: int | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{int(cpu * 1000)}m", "memory": "256Mi"}
    if gpu is not None:
        requests[GPU] = str(gpu)
    labels = {names.LABEL_BAND: band, "app": name}
    if workload is not None:
        labels[LABEL_WORKLOAD] = workload
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": "example/app:1",
                "resources": {"requests": requests, "limits": requests},
            }
        ],
    }
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if node is not None:
        spec["nodeName"] = node  # placed directly, as a kubelet-restored pod would be
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    annotations = {}
    if machine_class is not None:
        annotations["pilotfish.io/machine-class"] = machine_class
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def create(env: Env, namespace: str, body: dict[str, Any]) -> k8s.V1Pod:
    return k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, body)


def bound(env: Env, namespace: str) -> dict[str, str]:
    """name -> node of the namespace's pods that are bound and not being deleted."""
    pods = k8s.CoreV1Api(env.api).list_namespaced_pod(namespace).items
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.spec.node_name and p.metadata.deletion_timestamp is None
    }


def wait_bound(env: Env, namespace: str, count: int, timeout: float = 90) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        placed = bound(env, namespace)
        return placed if len(placed) == count else None

    return wait_until(f"{count} pods of {namespace} bound", check, timeout=timeout)


def zone_of(node: str) -> str:
    return node.rsplit("-", 1)[0].removeprefix("kwok-")


def extender_url(env: Env, path: str) -> str:
    assert env.spec is not None
    return f"https://127.0.0.1:{env.spec.ports.extender}{path}"


def extender_tls(env: Env) -> ssl.SSLContext:
    """The extender requires a client certificate from the cluster CA (the probe's here)."""
    return pki.client_context(env.require_local().pki)


def metric(env: Env, name: str, **labels: str) -> float:
    """Sum of a metric's samples on the extender's /metrics that carry `labels`."""
    with urllib.request.urlopen(
        extender_url(env, "/metrics"), timeout=5, context=extender_tls(env)
    ) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith((name + "{", name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def extender_ready(env: Env) -> bool:
    try:
        with urllib.request.urlopen(
            extender_url(env, "/readyz"), timeout=2, context=extender_tls(env)
        ) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def foreign_pods(env: Env, namespace: str) -> list[str]:
    """Pods of other tests still bound to the kwok nodes (namespaces being deleted, say)."""
    pods = k8s.CoreV1Api(env.api).list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in pods.items
        if p.metadata.namespace not in ("kube-system", names.SYSTEM_NAMESPACE, namespace)
        and p.spec.node_name in ALL_NODES
    ]


def admitted_as_written(env: Env, namespace: str) -> bool:
    """A dry-run create of a band-labelled pod without a class comes back without one: no
    webhook mutated it (the API server's view of the namespace label has caught up)."""
    body = pod_body("probe", band="production", cpu=1, priority_class=None)
    created = k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, body, dry_run="All")
    return created.spec.priority_class_name is None


@pytest.fixture
def placement(env: Env, namespace: str) -> Iterator[str]:
    """The namespace, on a cluster with no other test's pods and a synced extender; the
    test's pods are deleted and gone when it ends, so the next test finds empty nodes."""
    env.require_local()
    core = k8s.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {WEBHOOKS_LABEL: "disabled"}}})
    wait_until("the webhooks to skip the namespace", lambda: admitted_as_written(env, namespace))
    wait_until("other tests' pods gone", lambda: not foreign_pods(env, namespace), timeout=180)
    wait_until("the extender's snapshot synced", lambda: extender_ready(env), timeout=60)
    try:
        yield namespace
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        wait_until(
            f"pods of {namespace} gone",
            lambda: not core.list_namespaced_pod(namespace).items,
            timeout=120,
        )


def test_production_replicas_spread_two_per_zone(env: Env, placement: str) -> None:
    """zone-b and zone-c are half full of batch work, so kube-scheduler's own scoring
    (least allocated first) would put every replica on zone-a's four empty nodes."""
    for node in ALL_NODES:
        if zone_of(node) != "zone-a":
            create(
                env,
                placement,
                pod_body(f"fill-{node}", band="batch", cpu=16, priority_class=BATCH, node=node),
            )
    wait_bound(env, placement, 8)
    calls = metric(env, "pilotfish_extender_requests_total", verb="prioritize", outcome="ok")
    for i in range(6):
        create(
            env,
            placement,
            pod_body(
                f"web-{i}", band="production", cpu=1, priority_class=PRODUCTION, workload="web"
            ),
        )
    placed = {n: node for n, node in wait_bound(env, placement, 14).items() if n.startswith("web-")}
    zones = Counter(zone_of(node) for node in placed.values())
    assert zones == {"zone-a": 2, "zone-b": 2, "zone-c": 2}, placed
    assert len(set(placed.values())) == 6, f"two replicas share a node: {placed}"
    after = metric(env, "pilotfish_extender_requests_total", verb="prioritize", outcome="ok")
    assert after >= calls + 6, "kube-scheduler did not ask the extender to score"


def test_batch_tasks_pack_onto_the_fewest_nodes(env: Env, placement: str) -> None:
    tasks, cpu = 12, 4.0  # 48 CPUs: one full node and half of another
    for i in range(tasks):
        create(env, placement, pod_body(f"task-{i}", band="batch", cpu=cpu, priority_class=BATCH))
    placed = wait_bound(env, placement, tasks)
    per_node = Counter(placed.values())
    fewest = -(-int(tasks * cpu) // NODE_CPU)
    assert len(per_node) == fewest, f"spread over {len(per_node)} nodes, not {fewest}: {per_node}"


def test_production_preempts_batch_on_one_node_and_never_production(
    env: Env, placement: str
) -> None:
    """Every node is full. On eleven, a legacy production pod (priority 0) is the cheapest
    victim by priority, and kube-scheduler alone would pick it; on one, only batch pods are.
    The production pod must land there, evicting batch pods only."""
    target, *others = ALL_NODES
    for i in range(4):
        create(
            env,
            placement,
            pod_body(
                f"batch-{target}-{i}",
                band="batch",
                cpu=8,
                priority_class=BATCH,
                node=target,
                grace=10,
            ),
        )
    for node in others:
        create(
            env,
            placement,
            pod_body(f"legacy-{node}", band="production", cpu=24, priority_class=None, node=node),
        )
        for i in range(2):
            create(
                env,
                placement,
                pod_body(
                    f"batch-{node}-{i}",
                    band="batch",
                    cpu=4,
                    priority_class=BATCH,
                    node=node,
                    grace=10,
                ),
            )
    wait_bound(env, placement, 4 + 3 * len(others))
    wait_until(
        "the extender to see the fill",
        lambda: metric(env, "pilotfish_extender_snapshot_pods") >= 4 + 3 * len(others),
    )
    legacy = {
        p.metadata.name: p.metadata.uid
        for p in k8s.CoreV1Api(env.api).list_namespaced_pod(placement).items
        if p.metadata.name.startswith("legacy-")
    }

    create(env, placement, pod_body("db", band="production", cpu=16, priority_class=PRODUCTION))
    placed = wait_until("db bound", lambda: bound(env, placement).get("db"), timeout=120)
    assert placed == target
    survivors = bound(env, placement)
    evicted = {f"batch-{target}-{i}" for i in range(4)} - set(survivors)
    assert len(evicted) == 2, f"expected two 8-CPU batch victims, survivors: {survivors}"
    current = {
        p.metadata.name: p.metadata.uid
        for p in k8s.CoreV1Api(env.api).list_namespaced_pod(placement).items
        if p.metadata.name.startswith("legacy-") and p.metadata.deletion_timestamp is None
    }
    assert current == legacy, "a production pod was preempted"
    assert all(f"batch-{n}-{i}" in survivors for n in others for i in range(2))


def test_batch_never_preempts_production(env: Env, placement: str) -> None:
    """The cluster is full of production pods, some of them legacy (priority 0, below
    batch). kube-scheduler proposes evicting those; the extender vetoes every candidate."""
    for node in ALL_NODES:
        create(
            env,
            placement,
            pod_body(f"legacy-{node}", band="production", cpu=24, priority_class=None, node=node),
        )
        create(
            env,
            placement,
            pod_body(
                f"prod-{node}", band="production", cpu=8, priority_class=PRODUCTION, node=node
            ),
        )
    wait_bound(env, placement, 2 * len(ALL_NODES))
    wait_until(
        "the extender to see the fill",
        lambda: metric(env, "pilotfish_extender_snapshot_pods") >= 2 * len(ALL_NODES),
    )
    before = set(bound(env, placement))
    vetoes = metric(env, "pilotfish_extender_preemption_vetoes_total", cause="production_victim")

    create(env, placement, pod_body("etl", band="batch", cpu=16, priority_class=BATCH))
    wait_until(
        "the extender to veto the batch pod's preemption",
        lambda: (
            metric(env, "pilotfish_extender_preemption_vetoes_total", cause="production_victim")
            > vetoes
        ),
        timeout=120,
    )
    core = k8s.CoreV1Api(env.api)
    pod = wait_until(
        "etl marked unschedulable",
        lambda: (p := core.read_namespaced_pod("etl", placement)).status.conditions and p,
    )
    assert pod.spec.node_name is None
    assert not pod.status.nominated_node_name, "a node was nominated: someone would be evicted"
    assert set(bound(env, placement)) == before, "a production pod was evicted"


def pod_scheduled_message(env: Env, namespace: str, name: str) -> str | None:
    pod = k8s.CoreV1Api(env.api).read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.message)
    return None


@pytest.fixture
def gpu_nodes(env: Env) -> Iterator[list[str]]:
    """zone-b's nodes advertise 4 GPUs each (the admin patches node status, as a device
    plugin would); the resource is removed again afterwards."""
    core = k8s.CoreV1Api(env.api)
    chosen = [n for n in ALL_NODES if zone_of(n) == "zone-b"]
    path = GPU.replace("/", "~1")
    for n in chosen:
        core.patch_node_status(n, {"status": {"capacity": {GPU: "4"}, "allocatable": {GPU: "4"}}})
    try:
        yield chosen
    finally:
        for n in chosen:
            try:
                # A list body goes out as a JSON patch: removes only the GPU entries.
                core.patch_node_status(
                    n,
                    [
                        {"op": "remove", "path": f"/status/capacity/{path}"},
                        {"op": "remove", "path": f"/status/allocatable/{path}"},
                    ],
                )
            except ApiException as e:
                if e.status not in (404, 422):
                    raise


GPU_SUMMARY = (
    "no node in zone-a, zone-b or zone-c has 8 free GPUs (nvidia.com/gpu): "
    "zone-a: 4 have none; zone-b: 4 have 4; zone-c: 4 have none"
)


def test_why_pending_names_the_zone_and_the_resource(
    env: Env, placement: str, gpu_nodes: list[str]
) -> None:
    """A pod asking 8 GPUs where zone-b's nodes have 4 each and the rest none.

    The shipped scheduler configuration lets the extender manage nvidia.com/gpu
    (kube-scheduler's resource fit ignores it), so the pod's message is the extender's
    summary, naming the zones, rather than "Insufficient nvidia.com/gpu".
    """
    wait_until(
        "the extender to see zone-b's GPUs",
        lambda: extender_filter(env, gpu_pod()) == GPU_SUMMARY,
    )
    create(env, placement, gpu_pod())
    message = wait_until(
        "train unschedulable", lambda: pod_scheduled_message(env, placement, "train")
    )
    assert GPU_SUMMARY in message, message
    assert f"Insufficient {GPU}" not in message, message


def gpu_pod(name: str = "train", scheduler: str | None = None) -> dict[str, Any]:
    body = pod_body(name, band="batch", cpu=1, priority_class=BATCH, gpu=8)
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    return body


def extender_filter(env: Env, pod: dict[str, Any]) -> str:
    """The extender's filter answer for `pod` over every node, as kube-scheduler asks it."""
    request = urllib.request.Request(
        extender_url(env, "/filter"),
        data=json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ALL_NODES}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5, context=extender_tls(env)) as resp:
        answer = json.loads(resp.read())
    reasons = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert answer["Error"] == ""
    return " | ".join(sorted(set(reasons.values())))


def test_why_pending_through_the_scheduler_for_a_machine_class(env: Env, placement: str) -> None:
    create(
        env,
        placement,
        pod_body("render", band="batch", cpu=1, priority_class=BATCH, machine_class="pf.gpu-8"),
    )
    message = wait_until(
        "render unschedulable", lambda: pod_scheduled_message(env, placement, "render")
    )
    assert (
        "no node in zone-a, zone-b or zone-c is machine class pf.gpu-8 "
        "(node.kubernetes.io/instance-type): zone-a: 4 are pf.standard-32; "
        "zone-b: 4 are pf.standard-32; zone-c: 4 are pf.standard-32"
    ) in message, message


def test_scheduling_goes_on_while_the_extender_is_down(env: Env, placement: str) -> None:
    """ignorable: true. Killed, the extender is skipped and a pod still binds; restarted, it
    lists what was bound meanwhile and places by it.

    The pod bound while it was down is a replica of workload `web` held to kwok-zone-a-0.
    The next three replicas are created one at a time. A restarted extender that knows that
    replica sends them to zone-b, then zone-c, then a zone-a node other than kwok-zone-a-0.
    One whose snapshot missed it (no relist on start, ready before synced) sees three empty
    zones and, ties going by name, puts the first of them beside it on kwok-zone-a-0; one
    kube-scheduler no longer asks leaves them to its own scoring, which ignores workloads.
    """
    pinned = ALL_NODES[0]
    env.kill("pilotfish-extender")
    try:
        down = pod_body("while-down", band="production", cpu=1, priority_class=PRODUCTION)
        down["metadata"]["labels"][LABEL_WORKLOAD] = "web"
        down["spec"]["nodeSelector"] = {"kubernetes.io/hostname": pinned}
        create(env, placement, down)
        wait_until(
            "while-down bound without the extender", lambda: bound(env, placement).get("while-down")
        )
    finally:
        env.restart("pilotfish-extender")
    wait_until("the restarted extender synced", lambda: extender_ready(env), timeout=60)
    calls = metric(env, "pilotfish_extender_requests_total", verb="prioritize", outcome="ok")
    for i in range(3):
        create(
            env,
            placement,
            pod_body(
                f"after-{i}", band="production", cpu=1, priority_class=PRODUCTION, workload="web"
            ),
        )
        wait_bound(env, placement, 2 + i)
    placed = bound(env, placement)
    assert placed["while-down"] == pinned, placed
    zones = [zone_of(placed[f"after-{i}"]) for i in range(3)]
    assert zones == ["zone-b", "zone-c", "zone-a"], f"placed as if zone-a were empty: {placed}"
    assert len(set(placed.values())) == 4, f"two replicas share a node: {placed}"
    after = metric(env, "pilotfish_extender_requests_total", verb="prioritize", outcome="ok")
    assert after >= calls + 3, "kube-scheduler did not ask the restarted extender to score"
