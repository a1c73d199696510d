"""Builders for the extender's tests: Nodes and Pods shaped like the API server's, a snapshot.

Kept in a test module of their own (imported by the other `test_extender_*` modules) so a
table row reads as the facts it varies, e.g. `pod("web-1", node="n1", band="production")`.
The few tests at the bottom pin the builders themselves: a builder that silently dropped a
field would make every table that uses it vacuous.
"""

from __future__ import annotations

from typing import Any

from pilotfish import names
from pilotfish.extender import resources
from pilotfish.extender.snapshot import Snapshot, pod_info

Obj = dict[str, Any]


def node(
    name: str,
    zone: str = "zone-a",
    *,
    cpu: str = "32",
    memory: str = "128Gi",
    gpu: int | None = None,
    instance_type: str | None = "pf.standard-32",
    batch_cpu: int | None = None,
    batch_memory: int | None = None,
    resource_version: str = "1",
) -> Obj:
    allocatable: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu is not None:
        allocatable[resources.GPU] = str(gpu)
    if batch_cpu is not None:
        allocatable[names.BATCH_CPU] = str(batch_cpu)
    if batch_memory is not None:
        allocatable[names.BATCH_MEMORY] = str(batch_memory)
    labels = {"kubernetes.io/hostname": name, names.LABEL_ZONE: zone}
    if instance_type is not None:
        labels[resources.LABEL_INSTANCE_TYPE] = instance_type
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": resource_version,
            "labels": labels,
            "managedFields": [{"manager": "kubelet"}],
        },
        "status": {"capacity": dict(allocatable), "allocatable": allocatable},
    }


def pod(
    name: str,
    *,
    node: str | None = None,
    namespace: str = "team-a",
    uid: str | None = None,
    cpu: str | None = "1",
    memory: str | None = "1Gi",
    gpu: int | None = None,
    requests: dict[str, str] | None = None,
    band: str | None = None,
    priority_class: str | None = None,
    priority: int | None = None,
    workload: str | None = None,
    machine_class: str | None = None,
    start: str | None = "2026-01-01T00:00:00Z",
    phase: str = "Running",
    resource_version: str = "1",
) -> Obj:
    reqs: dict[str, str] = {}
    if cpu is not None:
        reqs["cpu"] = cpu
    if memory is not None:
        reqs["memory"] = memory
    if gpu is not None:
        reqs[resources.GPU] = str(gpu)
    reqs.update(requests or {})
    labels: dict[str, str] = {"app": name}
    if band is not None:
        labels[names.LABEL_BAND] = band
    if workload is not None:
        labels[resources.LABEL_WORKLOAD] = workload
    annotations: dict[str, str] = {"unrelated": "x" * 100}
    if machine_class is not None:
        annotations[resources.LABEL_MACHINE_CLASS] = machine_class
    spec: Obj = {
        "containers": [{"name": "app", "image": "example/app:1", "resources": {"requests": reqs}}]
    }
    if node is not None:
        spec["nodeName"] = node
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if priority is not None:
        spec["priority"] = priority
    status: Obj = {"phase": phase}
    if start is not None:
        status["startTime"] = start
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "resourceVersion": resource_version,
            "creationTimestamp": "2025-12-31T00:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": status,
    }


def snapshot(nodes: list[Obj], pods: list[Obj] | None = None, *, synced: bool = True) -> Snapshot:
    """A snapshot fed the way the informers feed it: every object as an ADDED event."""
    snap = Snapshot()
    for n in nodes:
        snap.on_node("ADDED", n, None)
    for p in pods or []:
        snap.on_pod("ADDED", p, None)
    snap.synced = synced
    assert snap.check() == []
    return snap


def fleet(zones: int = 3, per_zone: int = 4, **kw: Any) -> list[Obj]:
    """`kwok-zone-X-i` nodes like the local cluster's: `per_zone` in each of `zones`."""
    return [
        node(f"kwok-zone-{chr(ord('a') + z)}-{i}", f"zone-{chr(ord('a') + z)}", **kw)
        for z in range(zones)
        for i in range(per_zone)
    ]


# --- the builders' own contract ------------------------------------------------------------


def test_pod_builder_produces_what_it_was_asked_for() -> None:
    p = pod("web", node="n1", cpu="500m", memory="2Gi", gpu=2, band="batch", workload="w")
    info = pod_info(p)
    assert info is not None
    assert (info.node, info.cpu, info.memory, info.gpu) == ("n1", 500, 2 * 2**30, 2)
    assert (info.band, info.workload) == ("batch", "team-a/w")


def test_node_builder_advertises_what_it_was_asked_for() -> None:
    snap = snapshot([node("n1", "zone-b", gpu=4, batch_cpu=8000)])
    state = snap.nodes["n1"]
    assert (state.zone, state.alloc_cpu, state.alloc_gpu, state.batch_cpu) == (
        "zone-b",
        32000,
        4,
        8000,
    )
    assert state.batch_memory is None
