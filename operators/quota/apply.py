"""Apply: one status update per plan, valid only on the TeamQuota version it was decided from.

The body carries that resourceVersion, so a plan decided before a reservation landed fails
with 409 instead of erasing it; the queue backs the TeamQuota off and the next attempt
decides again with the reservation counted. The version the write returned is recorded in
OwnWrites, so the next reconcile does not decide from the informer until it shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from pilotfish import metrics
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import TEAMQUOTAS, ApiError, Rest
from pilotfish.kube.workqueue import DONE, Result, retry
from pilotfish.operators.quota.decide import StatusPlan

log = logging.getLogger("pilotfish.quota")

CONTROLLER: Final = "quota"


async def apply(rest: Rest, writes: OwnWrites, tq: Mapping[str, Any], plan: StatusPlan) -> Result:
    body = {
        **tq,
        "metadata": {**(tq.get("metadata") or {}), "resourceVersion": plan.from_version},
        "status": plan.status,
    }
    try:
        returned = await rest.replace(TEAMQUOTAS.path(name=plan.name, sub="status"), body)
    except ApiError as e:
        if e.not_found:  # deleted meanwhile: nothing to count for
            return DONE
        if e.conflict:  # a spend landed meanwhile: decide again from the newer copy
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
            return retry(f"TeamQuota {plan.name} changed since version {plan.from_version}")
        metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
        raise
    writes.wrote(plan.name, returned)
    log.debug("TeamQuota status updated", extra={"quota": plan.name})
    return DONE
