"""Wire objects for the drain planner's tests: nodes, pods, budgets, workloads, and one
`observed` that calls `observe` with everything defaulted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pilotfish import names
from pilotfish.operators.maintenance.model import Observed, PodRef, Refusal, observe
from pilotfish.workloads import LABEL_BATCH, LABEL_WORKLOAD

NM = "upgrade"
NOW = "2026-12-01T22:00:00Z"

Obj = dict[str, Any]


def node(
    name: str,
    *,
    zone: str | None = None,
    unschedulable: bool = False,
    draining: str | None = None,
    cordoned_by: str | None = None,
) -> Obj:
    annotations: dict[str, str] = {}
    if draining is not None:
        annotations[names.ANNOTATION_DRAINING] = draining
    if cordoned_by is not None:
        annotations[names.ANNOTATION_CORDONED_BY] = cordoned_by
    labels = {} if zone is None else {names.LABEL_ZONE: zone}
    spec = {"unschedulable": True} if unschedulable else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": {},
    }


def ours(name: str, *, zone: str | None = None) -> Obj:
    """A node this maintenance has cordoned and annotated."""
    return node(name, zone=zone, unschedulable=True, draining=NM, cordoned_by=NM)


def pod(
    name: str,
    on: str,
    *,
    namespace: str = "team-a",
    labels: Mapping[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    phase: str = "Running",
    ready: bool = True,
    terminating: bool = False,
    empty_dir: bool = False,
    mirror: bool = False,
    epoch: bool = False,
) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "labels": dict(labels or {}),
        "annotations": {},
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "x/v1", "kind": owner, "name": "o", "uid": "u", "controller": True}
        ]
    if terminating:
        meta["deletionTimestamp"] = "2026-12-01T21:59:00Z"
    if mirror:
        meta["annotations"]["kubernetes.io/config.mirror"] = "abc"
    if epoch:
        meta["annotations"][names.ANNOTATION_EPOCH] = "3"
    spec: Obj = {"nodeName": on, "containers": [{"name": "c", "image": "i"}]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    status: Obj = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def sw_pod(name: str, on: str, workload: str, **kw: Any) -> Obj:
    labels = {LABEL_WORKLOAD: workload, **kw.pop("labels", {})}
    return pod(name, on, labels=labels, owner="ServiceWorkload", **kw)


def batch_pod(name: str, on: str, job: str = "job", **kw: Any) -> Obj:
    return pod(name, on, labels={LABEL_BATCH: job}, owner=None, **kw)


def pdb(
    name: str,
    allowed: int | None,
    *,
    namespace: str = "team-a",
    match: Mapping[str, str] | None = None,
    selector: Mapping[str, Any] | None = None,
    stale: bool = False,
) -> Obj:
    sel = selector if selector is not None else {"matchLabels": dict(match or {})}
    status: Obj = {"observedGeneration": 1 if stale else 2}
    if allowed is not None:
        status["disruptionsAllowed"] = allowed
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "generation": 2},
        "spec": {"selector": sel},
        "status": status,
    }


def workload(
    name: str,
    replicas: int,
    *,
    namespace: str = "team-a",
    max_surge: int | str = 1,
    max_unavailable: int | str = 0,
    at_most_one: bool = False,
) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "atMostOne": at_most_one,
            "strategy": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
        },
    }


def nm(
    nodes: Sequence[str],
    *,
    status: Mapping[str, Any] | None = None,
    generation: int = 4,
    **spec: Any,
) -> Obj:
    obj: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": {"name": NM, "generation": generation},
        "spec": {"nodes": list(nodes), **spec},
    }
    if status is not None:
        obj["status"] = dict(status)
    return obj


def observed(
    maintenance: Mapping[str, Any],
    nodes: Sequence[Obj],
    pods: Sequence[Obj] = (),
    *,
    pdbs: Sequence[Obj] = (),
    workloads: Sequence[Obj] = (),
    extra_pods: Sequence[Obj] = (),
    draining_for: Mapping[str, float] | None = None,
    blocked_for: Mapping[str, float] | None = None,
    refused: Mapping[PodRef, Refusal] | None = None,
) -> Observed:
    """`observe` as the controller calls it: nodes by name (missing ones None), pods by node,
    workload pods fleet-wide (`extra_pods` are on nodes outside the maintenance), and the
    draining set from every node's annotation."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    wanted = maintenance["spec"]["nodes"]
    pods_by_node: dict[str, list[Obj]] = {}
    for p in pods:
        pods_by_node.setdefault(p["spec"]["nodeName"], []).append(p)
    by_workload: dict[tuple[str, str], list[Obj]] = {}
    for p in [*pods, *extra_pods]:
        label = p["metadata"]["labels"].get(LABEL_WORKLOAD)
        if label:
            by_workload.setdefault((p["metadata"]["namespace"], label), []).append(p)
    draining = frozenset(
        name
        for name, n in by_name.items()
        if names.ANNOTATION_DRAINING in n["metadata"]["annotations"]
    )
    return observe(
        maintenance,
        {n: by_name.get(n) for n in wanted},
        {n: pods_by_node.get(n, []) for n in wanted},
        list(pdbs),
        {(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in workloads},
        by_workload,
        draining,
        draining_for=draining_for or {},
        blocked_for=blocked_for or {},
        refused=refused or {},
        now=NOW,
    )


def ref(p: Obj) -> PodRef:
    meta = p["metadata"]
    return PodRef(meta["namespace"], meta["name"], meta["uid"], p["spec"]["nodeName"])
