"""Surge-first ServiceWorkloads: those that may lose no Ready replica to a drain.

Their pods leave a draining node only while the workload keeps `replicas` Ready pods without
them; the ServiceWorkload controller creates the replacements (it reads the nodes'
`pilotfish.io/draining` annotation), and the planner waits (`WaitingForSurge`) until they
are Ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pilotfish.operators.maintenance.budgets import key_of, meta_of
from pilotfish.operators.nodelifecycle.model import condition
from pilotfish.operators.serviceworkload.rolling import resolve_budget
from pilotfish.workloads import LABEL_WORKLOAD

Key = tuple[str, str]


def workload_of(pod: Mapping[str, Any]) -> Key | None:
    """The ServiceWorkload controlling the pod: its label and a controller reference, so a
    label copied onto a pod of one's own does not make it one."""
    meta = meta_of(pod)
    name = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
    owned = any(
        isinstance(o, Mapping) and o.get("kind") == "ServiceWorkload" and o.get("controller")
        for o in meta.get("ownerReferences") or []
    )
    return (str(meta.get("namespace", "")), str(name)) if name and owned else None


@dataclass(frozen=True)
class SurgeView:
    """A surge-first ServiceWorkload: its pods leave a draining node only while enough
    Ready replicas remain (`decide` keeps the count at or above replicas).

    `ready` counts the Ready, not terminating pods that only this maintenance may take away:
    those on no draining node and those on this maintenance's own nodes (whose evictions the
    one plan counts). Pods on another maintenance's draining nodes do not count, as that
    maintenance may be evicting them in the same moment.
    """

    replicas: int
    ready: frozenset[str]  # "ns/name"


def surge_first(workload: Mapping[str, Any]) -> bool:
    """A workload that may lose no Ready replica to a drain: a single replica, or a rollout
    strategy whose resolved maxUnavailable is 0. At-most-one workloads are never surged
    (two copies must never run): they move through the fencing path instead."""
    spec = workload.get("spec") or {}
    if spec.get("atMostOne") is True:
        return False
    replicas = spec.get("replicas", 1)
    replicas = replicas if isinstance(replicas, int) and replicas >= 0 else 1
    if replicas == 1:
        return True
    strategy = spec.get("strategy") or {}
    surge = strategy.get("maxSurge", 1)
    unavailable = strategy.get("maxUnavailable", 0)
    if not isinstance(surge, int | str) or not isinstance(unavailable, int | str):
        return True
    try:
        return resolve_budget(replicas, surge, unavailable).max_unavailable == 0
    except ValueError:  # a malformed percentage: the CRD refuses it; be careful anyway
        return True


def surge_view(
    workload: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], others_draining: frozenset[str]
) -> SurgeView:
    replicas = (workload.get("spec") or {}).get("replicas", 1)
    ready: set[str] = set()
    for pod in pods:
        meta = meta_of(pod)
        if meta.get("deletionTimestamp") or workload_of(pod) is None:
            continue
        ready_cond = condition(pod, "Ready")
        if (pod.get("status") or {}).get("phase") != "Running" or (ready_cond or {}).get(
            "status"
        ) != "True":
            continue
        if (pod.get("spec") or {}).get("nodeName") not in others_draining:
            ready.add(key_of(pod))
    return SurgeView(
        replicas=replicas if isinstance(replicas, int) and replicas >= 0 else 1,
        ready=frozenset(ready),
    )
