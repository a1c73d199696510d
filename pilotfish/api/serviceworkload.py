"""ServiceWorkload: a long-running service, kept at N replicas and rolled out safely."""

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints, Tag, WithJsonSchema

from pilotfish.api.base import (
    AGE_COLUMN,
    DNS_LABEL_PATTERN,
    IANA_SVC_NAME_PATTERN,
    ApiModel,
    Band,
    CelRule,
    ConditionsStatus,
    CrdInfo,
    IntOrPercent,
    LabelMap,
    ListMap,
    ListSet,
    PodTemplate,
    PrinterColumn,
    Resource,
    ScaleSubresource,
    TeamName,
    int_or_string,
    int_or_string_schema,
    is_zero_int_or_percent,
    object_field,
    zero_int_or_percent_cel,
)

# Condition types the rollout operator maintains.
AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
STALLED: Final = "Stalled"

# A node label value, as the API server validates the values of a node affinity: a zone or
# machine class it would refuse in a pod is refused in the workload instead.
LabelValue = Annotated[
    str,
    StringConstraints(
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", min_length=1, max_length=63
    ),
]
Zone = LabelValue
MachineClass = LabelValue
# A port number or the name of a container port (an IANA service name, at most 15 chars).
TargetPort = Annotated[
    Annotated[Annotated[int, Field(ge=1, le=65535)], Tag("int")]
    | Annotated[
        Annotated[str, StringConstraints(pattern=IANA_SVC_NAME_PATTERN, max_length=15)],
        Tag("string"),
    ],
    int_or_string("a port number or a container port name"),
    WithJsonSchema(
        int_or_string_schema(pattern=IANA_SVC_NAME_PATTERN, maxLength=15, minimum=1, maximum=65535)
    ),
]


class Placement(ApiModel):
    """Where the replicas may run and how they are spread.

    Turned into each pod's node affinity, nodeSelector, GPU resources and topology spread by
    `pilotfish.podtemplate`; the template's own constraints apply as well (both must hold).
    """

    zones: Annotated[list[Zone], ListSet()] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Zones (topology.kubernetes.io/zone) the replicas may run in; "
        "unset means any zone.",
    )
    node_selector: LabelMap | None = Field(
        default=None,
        description="Node labels that every node running a replica must carry.",
    )
    machine_class: MachineClass | None = Field(
        default=None,
        description="Machine class (the node label node.kubernetes.io/instance-type) every "
        "node running a replica must be; unset means any.",
    )
    gpus: int = Field(
        default=0,
        ge=0,
        description="GPUs each replica needs, requested and limited as nvidia.com/gpu on the "
        "template's first container unless that container sets nvidia.com/gpu itself.",
    )
    spread: Literal["zone", "node"] = Field(
        default="zone",
        description="Spread replicas evenly over zones (survives losing a zone) or only "
        "over nodes: a preference (maxSkew 1, ScheduleAnyway), never a reason to stay Pending.",
    )


class Strategy(ApiModel):
    """How a new template replaces the old one."""

    cel_rules = (
        CelRule(
            rule=f"!(has(self.maxSurge) && has(self.maxUnavailable) && "
            f"{zero_int_or_percent_cel('self.maxSurge')} && "
            f"{zero_int_or_percent_cel('self.maxUnavailable')})",
            message="maxSurge and maxUnavailable cannot both be 0: the rollout could never "
            "make progress",
            holds=lambda s: (
                not (
                    is_zero_int_or_percent(s.max_surge)
                    and is_zero_int_or_percent(s.max_unavailable)
                )
            ),
        ),
    )

    max_surge: IntOrPercent = Field(
        default=1,
        description="Pods that may exist above replicas during a rollout: a count or a "
        "percentage of replicas (rounded up).",
    )
    max_unavailable: IntOrPercent = Field(
        default=0,
        description="Replicas that may be unavailable during a rollout: a count or a "
        "percentage of replicas (rounded down).",
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=1,
        description="Seconds a rollout may go without progress before it is reported Stalled.",
    )
    min_ready_seconds: int = Field(
        default=0,
        ge=0,
        description="Seconds a new pod must be Ready, without crashing, to count as available.",
    )
    paused: bool = Field(
        default=False,
        description="Stop rolling out template changes until set back to false; scaling "
        "still applies.",
    )
    revision_history_limit: int = Field(
        default=10,
        ge=0,
        description="Old revisions kept for rollback.",
    )


class ServicePort(ApiModel):
    """A port of the workload's stable Service."""

    name: str = Field(
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Name of the port, unique within the service.",
    )
    port: int = Field(ge=1, le=65535, description="Port the Service listens on.")
    target_port: TargetPort | None = Field(
        default=None,
        description="Port number or named container port the traffic goes to; defaults to port.",
    )
    protocol: Literal["TCP", "UDP", "SCTP"] = Field(default="TCP", description="IP protocol.")


class ServiceSpec(ApiModel):
    """The Service fronting the ready replicas."""

    ports: Annotated[list[ServicePort], ListMap(keys=("name",))] = Field(
        min_length=1,
        max_length=64,
        description="Ports the Service exposes.",
    )


class ServiceWorkloadSpec(ApiModel):
    """The desired state of a ServiceWorkload."""

    cel_rules = (
        CelRule(
            rule="!has(self.atMostOne) || !self.atMostOne || !has(self.replicas) "
            "|| self.replicas <= 1",
            message="replicas must be 0 or 1 when atMostOne is true: an at-most-one "
            "workload runs one pod at most (set replicas to 0 or 1, or atMostOne to false)",
            holds=lambda s: not s.at_most_one or s.replicas <= 1,
            field_path=".replicas",
        ),
    )

    replicas: int = Field(default=1, ge=0, description="Number of pods to keep running.")
    template: PodTemplate = Field(description="The pods to run.")
    band: Band = Field(
        default="production",
        description="Priority band: production, batch or best-effort.",
    )
    team: TeamName = Field(description="Team that owns the workload and whose quota it uses.")
    placement: Placement = object_field(
        Placement, "Where the replicas may run and how they are spread."
    )
    strategy: Strategy = object_field(Strategy, "How a new template replaces the old one.")
    at_most_one: bool = Field(
        default=False,
        description="Never run two copies of the pod at once, even when its node is "
        "unreachable: replicas must be 0 or 1; the pod holds an identity Lease "
        "(<name>-at-most-one) and carries a fencing epoch (annotation pilotfish.io/epoch, env "
        "PILOTFISH_EPOCH) that every replacement raises; a replacement waits until the old pod "
        "is gone, terminal, or its node has been silent past the lease plus a clock-drift "
        "margin; rollouts delete, wait until gone, then create (maxSurge is not used).",
    )
    service: ServiceSpec | None = Field(
        default=None,
        description="A stable Service backed by the ready replicas; none when unset.",
    )


class ServiceWorkloadStatus(ConditionsStatus):
    """The observed state of a ServiceWorkload."""

    replicas: int = Field(default=0, ge=0, description="Pods that exist, of any revision.")
    ready_replicas: int = Field(default=0, ge=0, description="Pods that are Ready.")
    available_replicas: int = Field(
        default=0,
        ge=0,
        description="Pods that have been Ready for at least minReadySeconds.",
    )
    updated_replicas: int = Field(
        default=0,
        ge=0,
        description="Pods of the current template (updateRevision).",
    )
    current_revision: str | None = Field(
        default=None,
        description="Revision the stable replicas run.",
    )
    update_revision: str | None = Field(
        default=None,
        description="Revision of the current template, which a rollout moves replicas to.",
    )
    selector: str | None = Field(
        default=None,
        description="Label selector of the pods, as a string, for the scale subresource.",
    )


class ServiceWorkload(Resource):
    """A service: N replicas of a pod template, rolled out safely, behind a stable address."""

    crd = CrdInfo(
        plural="serviceworkloads",
        short_names=("sw",),
        scope="Namespaced",
        printer_columns=(
            PrinterColumn("Team", "string", ".spec.team", "Owning team."),
            PrinterColumn("Band", "string", ".spec.band", "Priority band."),
            PrinterColumn("Desired", "integer", ".spec.replicas", "Desired replicas."),
            PrinterColumn("Ready", "integer", ".status.readyReplicas", "Ready replicas."),
            PrinterColumn(
                "Available", "integer", ".status.availableReplicas", "Available replicas."
            ),
            PrinterColumn(
                "Up-to-date",
                "integer",
                ".status.updatedReplicas",
                "Replicas running the current template.",
            ),
            PrinterColumn(
                "Failure",
                "string",
                '.status.conditions[?(@.type=="ReplicaFailure")].reason',
                "Why pods cannot be created (QuotaExceeded, FailedCreate), while they cannot.",
            ),
            AGE_COLUMN,
        ),
        scale=ScaleSubresource(
            spec_replicas_path=".spec.replicas",
            status_replicas_path=".status.replicas",
            label_selector_path=".status.selector",
        ),
    )

    api_version: Literal["pilotfish.io/v1alpha1"] = "pilotfish.io/v1alpha1"
    kind: Literal["ServiceWorkload"] = "ServiceWorkload"
    spec: ServiceWorkloadSpec = Field(description="Desired state, written by people.")
    status: ServiceWorkloadStatus | None = Field(
        default=None,
        description="Observed state, written by the rollout operator.",
    )
