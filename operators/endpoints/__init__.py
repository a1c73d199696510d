"""Endpoints: a stable Service and EndpointSlices of the pods of every ServiceWorkload.

Why Pilotfish writes its own slices rather than giving the Service a selector and letting
kube-controller-manager do it: the drain contract (`pilotfish.workloads`). A pod must leave
rotation (not ready, terminating) *before* its owner stops it, and the owner must learn when
the slice write that took it out has happened; the built-in controller has no such handshake
and does not know Pilotfish's drain annotation. So the Service has no selector (the built-in
EndpointSlice controller skips selector-less Services) and the slices carry our own
`endpointslice.kubernetes.io/managed-by` value (the built-in controller only touches slices
that carry its own), so the two never fight.

Layout, the shape of every controller: `model` (the wire model of endpoints and slices),
`planner` and `decide` (pure: observed → plan), `apply` (the one executor: conditional
writes, recorded as own writes), `controller` (informers, handlers, queue, reconcile).
"""

from pilotfish.operators.endpoints.controller import (
    ENV_MIN_WRITE_INTERVAL,
    MIN_WRITE_INTERVAL_SECONDS,
    EndpointsController,
)
from pilotfish.operators.endpoints.model import (
    CONTROLLER,
    ENDPOINTSLICES,
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    REASON_SERVICE_NOT_OWNED,
    REASON_SYNC_FAILED,
    SERVICES,
)

__all__ = [
    "CONTROLLER",
    "ENDPOINTSLICES",
    "ENV_MIN_WRITE_INTERVAL",
    "LABEL_MANAGED_BY",
    "LABEL_SERVICE_NAME",
    "MIN_WRITE_INTERVAL_SECONDS",
    "REASON_SERVICE_NOT_OWNED",
    "REASON_SYNC_FAILED",
    "SERVICES",
    "EndpointsController",
]
