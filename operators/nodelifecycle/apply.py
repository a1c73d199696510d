"""Apply: one JSON patch per plan, valid only on the node version it was decided from.

The patch opens with a `test` of that resourceVersion, so a plan decided from a stale copy
fails (409 or 422) instead of overwriting a taint another owner added meanwhile; the queue
then backs the node off and the next attempt decides again from the fresher copy. The
version the write returned is recorded in OwnWrites, so the next reconcile does not decide
from the informer until it shows this write.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from pilotfish import metrics
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, NODES, ApiError, Rest
from pilotfish.kube.workqueue import DONE, Result, retry
from pilotfish.operators.nodelifecycle.decide import TaintPlan

log = logging.getLogger("pilotfish.nodelifecycle")

CONTROLLER: Final = "nodelifecycle"


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
