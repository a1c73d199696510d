"""Apply: one node's figure in one conditional write, then the evictions that give back.

The figure, the BatchCapacity condition and the `batch.pilotfish.io/reclaim` annotation go
in ONE strategic-merge patch of nodes/status carrying the resourceVersion decided from: the
node status strategy resets only spec, so metadata written through /status is kept (checked
on kube-apiserver, and kwok's heartbeats leave extended resources, conditions and
annotations alone). One write means the figure and the numbers behind it are never seen
apart, and a node changed meanwhile answers 409 and is decided again from its fresh copy.
The condition merges by type, so the kubelet's own conditions stay.

Evictions go through policy/v1 Eviction with the pod's uid as precondition (a pod recreated
under the same name is never the one evicted), so every disruption budget is honoured; a 429
is "not now": the pod is passed over this cycle and tried again the next.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from pilotfish import metrics, names
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODES, PODS, STRATEGIC_MERGE_PATCH, ApiError, Rest
from pilotfish.operators.reclaim import reasons
from pilotfish.operators.reclaim.decide import Decision
from pilotfish.operators.reclaim.model import BATCH, CONTROLLER, RESOURCES, BatchPod

log = logging.getLogger("pilotfish.reclaim")


class Outcome(enum.Enum):
    OK = "ok"
    GONE = "gone"  # the node is gone: nothing to write
    STALE = "stale"  # decided from an older copy: decide again


def status_patch(d: Decision, resource_version: str) -> dict[str, Any]:
    figure = {BATCH[r]: str(d.figures[r].batch) for r in RESOURCES}
    return {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {names.ANNOTATION_RECLAIM: d.annotation},
        },
        "status": {
            "capacity": dict(figure),
            "allocatable": dict(figure),
            "conditions": [d.condition],
        },
    }


async def write_figure(
    rest: Rest, writes: OwnWrites, d: Decision, resource_version: str
) -> Outcome:
    try:
        returned = await rest.patch(
            NODES.path(name=d.node, sub="status"),
            status_patch(d, resource_version),
            STRATEGIC_MERGE_PATCH,
        )
    except ApiError as e:
        if e.not_found:
            return Outcome.GONE
        if e.status in (409, 422):
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
            return Outcome.STALE
        metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
        raise
    writes.wrote(d.node, returned)
    log.info(
        "batch capacity written",
        extra={"node": d.node, "state": d.state, **{r: d.figures[r].batch for r in RESOURCES}},
    )
    return Outcome.OK


def eviction(pod: BatchPod) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": {"preconditions": {"uid": pod.uid}},
    }


async def evict(rest: Rest, node: str, pod: BatchPod) -> str:
    """One of reasons.EVICTED, REFUSED, GONE, ERROR; counted."""
    try:
        await rest.create(PODS.path(pod.namespace, pod.name, "eviction"), eviction(pod))
    except ApiError as e:
        if e.status == 429:
            result = reasons.REFUSED
            log.info("eviction refused; next cycle", extra={"node": node, "pod": pod.key})
        elif e.not_found or e.conflict:
            result = reasons.GONE
        else:
            result = reasons.ERROR
            log.warning("eviction failed", extra={"node": node, "pod": pod.key, "error": str(e)})
    else:
        result = reasons.EVICTED
    metrics.RECLAIM_EVICTIONS.labels(result).inc()
    return result
