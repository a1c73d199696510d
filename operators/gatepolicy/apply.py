"""The one executor of a status plan: a merge patch of the status subresource, conditional
on the resourceVersion the plan was computed from.

A refused write (409: the policy changed since it was read) returns RETRY: the queue backs
the key off, and the change that made it stale enqueues it again meanwhile.
"""

from __future__ import annotations

import logging

import aiohttp

from pilotfish.kube.rest import GATEPOLICIES, ApiError, Rest
from pilotfish.kube.workqueue import DONE, Result, retry
from pilotfish.operators.gatepolicy.decide import StatusPlan

log = logging.getLogger("pilotfish.gatepolicy")


async def apply(rest: Rest, plan: StatusPlan | None) -> Result:
    if plan is None:
        return DONE
    body = {"metadata": {"resourceVersion": plan.resource_version}, "status": dict(plan.status)}
    path = GATEPOLICIES.path(plan.namespace, plan.name, "status")
    try:
        await rest.patch(path, body)
    except ApiError as e:
        if e.not_found:
            return DONE  # deleted meanwhile: no status to keep
        if e.conflict:
            log.debug(
                "GatePolicy changed since it was read",
                extra={"policy": f"{plan.namespace}/{plan.name}"},
            )
            return retry("the policy changed since it was read")
        log.warning(
            "GatePolicy status write failed",
            extra={"policy": f"{plan.namespace}/{plan.name}", "error": str(e)},
        )
        return retry(f"status write failed: {e}")
    except (OSError, TimeoutError, aiohttp.ClientError) as e:
        log.warning(
            "GatePolicy status write failed",
            extra={"policy": f"{plan.namespace}/{plan.name}", "error": f"{type(e).__name__}: {e}"},
        )
        return retry(f"status write failed: {type(e).__name__}")
    return DONE
