"""NodeMaintenance: drain nodes for planned work at the pace disruption budgets allow."""

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from pilotfish.api.base import (
    AGE_COLUMN,
    CONDITION_REASON_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    ApiModel,
    ConditionsStatus,
    CrdInfo,
    ListMap,
    ListSet,
    PrinterColumn,
    Resource,
    list_field,
)

# Condition types the maintenance operator maintains.
BLOCKED: Final = "Blocked"
COMPLETE: Final = "Complete"

NodeName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
Phase = Literal["Pending", "Draining", "Done", "Failed"]
NodeState = Literal["Pending", "Cordoned", "Draining", "Drained", "Failed"]
Order = Literal["Given", "FewestProductionFirst"]
BlockerReason = Annotated[
    str, StringConstraints(pattern=CONDITION_REASON_PATTERN, min_length=1, max_length=64)
]
# "namespace/name" of a pod or a PodDisruptionBudget.
ObjectKey = Annotated[str, StringConstraints(min_length=3, max_length=317)]


class NodeMaintenanceSpec(ApiModel):
    """The desired state of a NodeMaintenance."""

    nodes: Annotated[list[NodeName], ListSet()] = Field(
        min_length=1,
        max_length=5000,
        description="Nodes to drain, in the order given (see order).",
    )
    max_concurrent: int = Field(
        default=1,
        ge=1,
        le=5000,
        description="Nodes cordoned or draining at the same time at most.",
    )
    one_per_zone: bool = Field(
        default=False,
        description="At most one node per zone (topology.kubernetes.io/zone) draining at a "
        "time, whatever maxConcurrent allows; nodes without the label share one zone.",
    )
    order: Order = Field(
        default="Given",
        description="Given: drain nodes in the order of nodes. FewestProductionFirst: nodes "
        "running the fewest production-band pods first (ties in the order given).",
    )
    blocked_after_seconds: int = Field(
        default=300,
        ge=1,
        description="Seconds a node may go without any pod evicted while a budget, a surge, "
        "local storage or a refused eviction holds it, before the Blocked condition, an Event "
        "and the PilotfishDrainBlocked alert report it.",
    )
    batch_task_deadline_seconds: int = Field(
        default=600,
        ge=0,
        description="Seconds after its node began draining that a running BatchWorkload task "
        "may take to finish before it is evicted (with the grace period its job declares); "
        "the task is then recreated elsewhere without counting as a failure.",
    )
    allow_local_storage: bool = Field(
        default=False,
        description="Evict pods with emptyDir volumes, losing that data; while false such a "
        "pod blocks its node's drain (reason LocalStorage).",
    )
    reason: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the nodes are drained; shown in events and on the nodes.",
    )


class Blocker(ApiModel):
    """Why one pod is still on its node."""

    pod: ObjectKey = Field(description="The pod, as namespace/name.")
    reason: BlockerReason = Field(
        description="DisruptionBudget (a budget allows no disruption now), WaitingForSurge "
        "(the replacement is not Ready yet), BatchTaskRunning (a task within its deadline), "
        "LocalStorage (an emptyDir and allowLocalStorage false), EvictionRefused (the last "
        "eviction was refused with 429) or Terminating (evicted, still stopping).",
    )
    budget: ObjectKey | None = Field(
        default=None,
        description="The PodDisruptionBudget holding the pod, as namespace/name, when known.",
    )
    message: str = Field(default="", max_length=1024, description="Details, for people.")


class NodeProgress(ApiModel):
    """One node of the maintenance and how far its drain is."""

    name: NodeName = Field(description="The node.")
    state: NodeState = Field(
        description="Pending: not started (message says what it waits for). Cordoned: "
        "cordoned this round, with no pod to move. Draining: cordoned, pods being evicted. "
        "Drained: no pod left to move (the node stays cordoned until the NodeMaintenance is "
        "deleted). Failed: cannot be drained (see message).",
    )
    pods_left: int = Field(
        default=0,
        ge=0,
        description="Pods still to leave the node (DaemonSet, mirror and finished pods are "
        "not counted).",
    )
    blockers: Annotated[list[Blocker], ListMap(keys=("pod",))] = list_field(
        "What keeps each pod on the node, for the pods not evicted this round."
    )
    message: str | None = Field(default=None, max_length=1024, description="Details, for people.")


class NodeMaintenanceStatus(ConditionsStatus):
    """The observed state of a NodeMaintenance."""

    phase: Phase | None = Field(
        default=None,
        description="Pending: not started. Draining: nodes are being drained. Done: every "
        "node is drained. Failed: every node is drained or failed, and some failed.",
    )
    progress: str | None = Field(
        default=None,
        pattern=r"^[0-9]+/[0-9]+$",
        max_length=16,
        description="Nodes drained / nodes in the maintenance, such as 3/20.",
    )
    nodes: Annotated[list[NodeProgress], ListMap(keys=("name",))] = list_field(
        "Each node's state, in the order the nodes are given."
    )


class NodeMaintenance(Resource):
    """Planned maintenance: nodes cordoned and drained a few at a time."""

    crd = CrdInfo(
        plural="nodemaintenances",
        short_names=("nm",),
        scope="Cluster",
        printer_columns=(
            PrinterColumn("Phase", "string", ".status.phase", "Progress of the maintenance."),
            PrinterColumn(
                "Progress", "string", ".status.progress", "Nodes drained / nodes to drain."
            ),
            PrinterColumn(
                "Blocked",
                "string",
                f'.status.conditions[?(@.type=="{BLOCKED}")].status',
                "True while a node's drain has been held longer than blockedAfterSeconds.",
            ),
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
