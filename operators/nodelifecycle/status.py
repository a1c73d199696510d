"""The node lifecycle controller's writes other than taints: the node's Ready condition
(nodes/status), pod conditions (pods/status) and pod deletes. Each is conditional.

Status patches are strategic merges of one condition (merged by type, so the kubelet's other
conditions stay) carrying the resourceVersion decided from: a copy that changed meanwhile
answers 409 and the node is decided again, backed off. Deletes carry a uid precondition, so
a pod recreated under the same name is never the one deleted. What each write returned goes
into OwnWrites under the node's name, so the node is not decided again before every write
of the round is seen.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from pilotfish import metrics
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODES, PODS, STRATEGIC_MERGE_PATCH, ApiError, Rest
from pilotfish.operators.nodelifecycle.model import CONTROLLER, PodView
from pilotfish.operators.nodelifecycle.unreachable import NodeStatusPlan

log = logging.getLogger("pilotfish.nodelifecycle")


class Outcome(enum.Enum):
    OK = "ok"
    GONE = "gone"  # the object is gone: nothing to do
    CONFLICT = "conflict"  # decided from a stale copy: decide again


def _refused(e: ApiError, what: str) -> Outcome:
    if e.not_found:
        return Outcome.GONE
    if e.status in (409, 422):
        metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
        log.info("write refused as stale", extra={"object": what, "error": str(e)})
        return Outcome.CONFLICT
    metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
    raise e


def condition_patch(rv: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "status": {"conditions": list(conditions)}}


async def patch_node_status(rest: Rest, writes: OwnWrites, plan: NodeStatusPlan) -> Outcome:
    body = condition_patch(plan.from_version, plan.condition)
    try:
        returned = await rest.patch(
            NODES.path(name=plan.node, sub="status"), body, STRATEGIC_MERGE_PATCH
        )
    except ApiError as e:
        return _refused(e, f"node {plan.node}")
    writes.wrote(plan.node, returned)
    return Outcome.OK


async def patch_pod_status(
    rest: Rest, writes: OwnWrites, node: str, pod: PodView, condition: dict[str, Any]
) -> Outcome:
    body = condition_patch(pod.resource_version, condition)
    try:
        returned = await rest.patch(
            PODS.path(pod.namespace, pod.name, sub="status"), body, STRATEGIC_MERGE_PATCH
        )
    except ApiError as e:
        return _refused(e, f"pod {pod.key}")
    writes.wrote(pod.key, returned, owner=node)
    return Outcome.OK


async def delete_pod(rest: Rest, writes: OwnWrites, node: str, pod: PodView) -> Outcome:
    """Delete with the pod's own grace period: on a silent node it stays Terminating (and is
    not counted by its controller) until the node returns and its agent removes it."""
    try:
        returned = await rest.delete(
            PODS.path(pod.namespace, pod.name), {"preconditions": {"uid": pod.uid}}
        )
    except ApiError as e:
        return _refused(e, f"pod {pod.key}")
    if returned.get("kind") == "Status":  # removed at once (no finalizers, no grace)
        writes.deleted(pod.key, owner=node)
    else:
        writes.wrote(pod.key, returned, owner=node)
    return Outcome.OK
