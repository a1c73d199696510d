"""NodeMaintenance: drain nodes for planned work at the pace disruption budgets allow."""

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from pilotfish.api.base import (
    AGE_COLUMN,
    DNS_SUBDOMAIN_PATTERN,
    ApiModel,
    ConditionsStatus,
    CrdInfo,
    ListSet,
    PrinterColumn,
    Resource,
    list_field,
)

NodeName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
Phase = Literal["Pending", "Draining", "Done", "Failed"]


class NodeMaintenanceSpec(ApiModel):
    """The desired state of a NodeMaintenance."""

    nodes: Annotated[list[NodeName], ListSet()] = Field(
        min_length=1,
        max_length=5000,
        description="Nodes to drain.",
    )
    max_concurrent: int = Field(
        default=1,
        ge=1,
        description="Nodes drained at the same time at most.",
    )
    reason: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the nodes are drained; shown in events and on the nodes.",
    )


class NodeMaintenanceStatus(ConditionsStatus):
    """The observed state of a NodeMaintenance."""

    phase: Phase | None = Field(
        default=None,
        description="Pending: not started. Draining: nodes are being drained. Done: every "
        "node is drained. Failed: a node cannot be drained (see conditions).",
    )
    drained: Annotated[list[NodeName], ListSet()] = list_field("Nodes fully drained.")
    pending: Annotated[list[NodeName], ListSet()] = list_field(
        "Nodes not yet drained, including those being drained now."
    )


class NodeMaintenance(Resource):
    """Planned maintenance: nodes cordoned and drained a few at a time."""

    crd = CrdInfo(
        plural="nodemaintenances",
        short_names=("nm",),
        scope="Cluster",
        printer_columns=(
            PrinterColumn("Phase", "string", ".status.phase", "Progress of the maintenance."),
            PrinterColumn("Nodes", "string", ".spec.nodes", "Nodes to drain."),
            AGE_COLUMN,
        ),
    )

    api_version: Literal["pilotfish.io/v1alpha1"] = "pilotfish.io/v1alpha1"
    kind: Literal["NodeMaintenance"] = "NodeMaintenance"
    spec: NodeMaintenanceSpec = Field(description="Desired state, written by people.")
    status: NodeMaintenanceStatus | None = Field(
        default=None,
        description="Observed state, written by the maintenance operator.",
    )
