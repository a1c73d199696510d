"""Apply: carry out one node's plan with conditional writes, then post what happened.

The taint patch opens with a JSON-patch `test` of the node's resourceVersion, so a plan
decided from a stale copy fails (409 or 422) instead of overwriting a taint another owner
added meanwhile; status patches carry the resourceVersion; deletes a uid precondition. A
refused write makes the round a retry: the queue backs the node off and the next attempt
decides again from the fresher copies. What every write returned is recorded in OwnWrites
under the node's name, so the next reconcile does not decide from informers that do not
show this round yet. Pod evictions are in order per pod: DisruptionTarget, then delete
(a pod is never deleted unmarked, so no controller counts it as an ordinary loss).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pilotfish import metrics
from pilotfish.kube.events import ControllerEvents
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, NODES, ApiError, Rest
from pilotfish.kube.workqueue import DONE, Result, requeue_after, retry
from pilotfish.operators.nodelifecycle.decide import TaintPlan
from pilotfish.operators.nodelifecycle.eviction import EVICTION_REASON, kept
from pilotfish.operators.nodelifecycle.model import CONTROLLER, NodeView, PodView, node_ref
from pilotfish.operators.nodelifecycle.silence import NodePlan
from pilotfish.operators.nodelifecycle.status import (
    Outcome,
    delete_pod,
    patch_node_status,
    patch_pod_status,
)
from pilotfish.operators.nodelifecycle.unreachable import silence_note

__all__ = ["CONTROLLER", "EVENT_NODE_UNREACHABLE", "EVENT_PODS_EVICTED", "apply", "carry_out"]

log = logging.getLogger("pilotfish.nodelifecycle")

EVENT_NODE_UNREACHABLE = "NodeUnreachable"
EVENT_PODS_EVICTED = "PodsEvicted"
NAMED_IN_NOTE = 10  # pods named in an Event's note; the rest are counted


def taint_patch(plan: TaintPlan) -> list[dict[str, Any]]:
    """JSON patch that applies only to the exact version `plan` was decided from."""
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": plan.from_version},
        {
            "op": "add" if plan.add_field else "replace",
            "path": "/spec/taints",
            "value": [dict(t) for t in plan.taints],
        },
    ]


async def apply(rest: Rest, writes: OwnWrites, plan: TaintPlan, ready: str) -> Result:
    try:
        returned = await rest.patch(NODES.path(name=plan.node), taint_patch(plan), JSON_PATCH)
    except ApiError as e:
        if e.not_found:  # the node is gone: nothing to taint
            return DONE
        if e.status in (409, 422):  # decided from a stale copy: decide again, backed off
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
            return retry(f"node {plan.node} changed since version {plan.from_version}")
        metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
        raise
    writes.wrote(plan.node, returned)
    log.info(
        "node taints updated",
        extra={"node": plan.node, "ready": ready, "taints": plan.owned_keys},
    )
    return DONE


def _names(pods: list[str]) -> str:
    shown = ", ".join(pods[:NAMED_IN_NOTE])
    more = len(pods) - NAMED_IN_NOTE
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass
class _Round:
    refused: list[str] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)


async def _pods(rest: Rest, writes: OwnWrites, plan: NodePlan, r: _Round) -> None:
    for c in plan.not_ready:
        outcome = await patch_pod_status(rest, writes, plan.node, c.pod, c.condition)
        if outcome is Outcome.CONFLICT:
            r.refused.append(c.pod.key)
        elif outcome is Outcome.OK:
            r.not_ready.append(c.pod.key)
    for e in plan.evict:
        if e.condition is not None:
            outcome = await patch_pod_status(rest, writes, plan.node, e.pod, e.condition)
            if outcome is not Outcome.OK:
                if outcome is Outcome.CONFLICT:
                    r.refused.append(e.pod.key)
                continue
        outcome = await delete_pod(rest, writes, plan.node, e.pod)
        if outcome is Outcome.CONFLICT:
            r.refused.append(e.pod.key)
        elif outcome is Outcome.OK:
            r.evicted.append(e.pod.key)
            metrics.NODELIFECYCLE_EVICTIONS.labels(EVICTION_REASON).inc()


async def carry_out(
    rest: Rest,
    writes: OwnWrites,
    events: ControllerEvents,
    node: NodeView,
    pods: tuple[PodView, ...],
    plan: NodePlan,
    silent_for: float | None,
    unreachable_after: float,
) -> Result:
    r = _Round()
    if plan.node_status is not None:
        outcome = await patch_node_status(rest, writes, plan.node_status)
        if outcome is Outcome.GONE:
            return DONE
        if outcome is Outcome.CONFLICT:
            r.refused.append(f"node {node.name}")
    if plan.taints is not None:
        taints = await apply(rest, writes, plan.taints, node.ready)
        if taints.retry:
            r.refused.append(f"node {node.name} taints")
    await _pods(rest, writes, plan, r)
    note = silence_note(silent_for or 0.0, unreachable_after)
    if plan.node_status is not None and f"node {node.name}" not in r.refused:
        marked = f"{len(r.not_ready)} pods marked not ready" if r.not_ready else ""
        held = "its zone is braked: its pods keep Ready" if plan.braked else ""
        extra = "; ".join(x for x in (marked, held) if x)
        events.post(
            node_ref(node),
            EVENT_NODE_UNREACHABLE,
            f"{note}{'; ' + extra if extra else ''}",
            action="MarkUnreachable",
            type_="Warning",
        )
        log.warning(
            "node unreachable",
            extra={"node": node.name, "silent_for": silent_for, "pods_not_ready": r.not_ready},
        )
    if r.evicted:
        left = kept(pods)
        events.post(
            node_ref(node),
            EVENT_PODS_EVICTED,
            f"{note}; evicted {len(r.evicted)} pods: {_names(r.evicted)}"
            + (f"; left for their own controllers: {_names(left)}" if left else ""),
            action="Evict",
            type_="Warning",
        )
        log.warning(
            "pods evicted from a lost node",
            extra={"node": node.name, "silent_for": silent_for, "pods": r.evicted, "kept": left},
        )
    if r.refused:
        return retry(f"stale copies of {', '.join(r.refused[:3])}")
    if plan.requeue_after is not None:
        return requeue_after(plan.requeue_after, "next silence threshold")
    return DONE
