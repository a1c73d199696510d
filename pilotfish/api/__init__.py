"""The Pilotfish API (group pilotfish.io, version v1alpha1) as pydantic models.

These models are the single source of the CRDs (`python -m pilotfish.api.crdgen` writes
them) and the way every part reads and builds Pilotfish objects:
`ServiceWorkload.model_validate(obj)` on a dict from the API server, and
`obj.model_dump(by_alias=True, exclude_none=True)` for a request body.
"""

from pilotfish.api.base import Resource
from pilotfish.api.batchworkload import BatchWorkload
from pilotfish.api.gatepolicy import GatePolicy
from pilotfish.api.gatesignal import GateSignal
from pilotfish.api.nodemaintenance import NodeMaintenance
from pilotfish.api.serviceworkload import ServiceWorkload
from pilotfish.api.teamquota import TeamQuota

# Every kind with a CRD, in the order the CRD files are written and documented.
ALL_KINDS: tuple[type[Resource], ...] = (
    ServiceWorkload,
    BatchWorkload,
    GatePolicy,
    GateSignal,
    TeamQuota,
    NodeMaintenance,
)

__all__ = [
    "ALL_KINDS",
    "BatchWorkload",
    "GatePolicy",
    "GateSignal",
    "NodeMaintenance",
    "Resource",
    "ServiceWorkload",
    "TeamQuota",
]
