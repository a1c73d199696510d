"""TeamQuota: how much a team may use in each priority band."""

from typing import Annotated, Final, Literal

from pydantic import Field

from pilotfish.api.base import (
    AGE_COLUMN,
    ApiModel,
    Band,
    ConditionsStatus,
    CrdInfo,
    ListMap,
    PrinterColumn,
    Quantity,
    Resource,
    TeamName,
    Time,
    list_field,
    object_field,
)


class BandResources(ApiModel):
    """Amounts of each resource; an unset amount means no limit (in a spec) or none (in a
    status)."""

    cpu: Quantity | None = Field(default=None, description="CPU, such as 100 or 500m.")
    memory: Quantity | None = Field(default=None, description="Memory, such as 400Gi.")
    gpus: int | None = Field(default=None, ge=0, description="GPUs.")
    pods: int | None = Field(default=None, ge=0, description="Pods.")
    extended: dict[str, Quantity] | None = Field(
        default=None,
        max_length=32,
        description="Other resources by their resource name, such as example.com/fpga.",
    )


class Bands(ApiModel):
    """One set of amounts per priority band, keyed by the band's name."""

    production: BandResources | None = Field(default=None, description="The production band.")
    batch: BandResources | None = Field(default=None, description="The batch band.")
    best_effort: BandResources | None = Field(
        default=None,
        alias="best-effort",
        description="The best-effort band.",
    )

    def for_band(self, band: Band) -> BandResources | None:
        """Band names are label values; this maps one to its field without string games."""
        if band == "production":
            return self.production
        if band == "batch":
            return self.batch
        return self.best_effort


class TeamQuotaSpec(ApiModel):
    """The desired state of a TeamQuota."""

    team: TeamName = Field(description="Team the quota applies to (label pilotfish.io/team).")
    bands: Bands = object_field(
        Bands,
        "Limits per priority band. A band left out admits nothing: no team runs in a band "
        "nobody granted it. Within a declared band, a resource left out is not limited.",
    )


class Reservation(ApiModel):
    """Quota taken by admission for one pod that the quota operator has not counted yet.

    Admission writes it with a resourceVersion-conditional update, so two pods admitted at
    once can never both take the last room; the operator drops it when the pod shows up in
    `used`, or when the pod was never created.
    """

    pod: str = Field(max_length=317, description="namespace/name of the pod.")
    uid: str = Field(max_length=64, description="UID of the pod admitted.")
    band: Band = Field(description="Band the pod was admitted in.")
    resources: BandResources = Field(description="What the pod requests.")
    time: Time = Field(description="When admission reserved it.")


# The longest band summary written; a band with dozens of extended resources is cut short
# (the full amounts stay in `used`, `reserved` and the spec).
SUMMARY_MAX_LENGTH: Final = 1024


class BandSummaries(ApiModel):
    """Per band, one line a person reads without decoding: what `kubectl get` shows."""

    production: str | None = Field(
        default=None, max_length=SUMMARY_MAX_LENGTH, description="The production band."
    )
    batch: str | None = Field(
        default=None, max_length=SUMMARY_MAX_LENGTH, description="The batch band."
    )
    best_effort: str | None = Field(
        default=None,
        alias="best-effort",
        max_length=SUMMARY_MAX_LENGTH,
        description="The best-effort band.",
    )


class TeamQuotaStatus(ConditionsStatus):
    """The observed state of a TeamQuota."""

    used: Bands = object_field(
        Bands,
        "Resources requested by the team's bound pods, per band; a resource left out is zero.",
    )
    reserved: Bands = object_field(
        Bands,
        "Sum of `reservations` per band; a resource left out is zero.",
    )
    reservations: Annotated[list[Reservation], ListMap(keys=("uid",))] = list_field(
        "Pods admitted whose usage the quota operator has not counted yet."
    )
    summary: BandSummaries = object_field(
        BandSummaries,
        "Per band, what the team holds (`used` plus `reserved`, as admission counts it) "
        "against the band's limit, such as `cpu 1/2, memory 1Gi/4Gi, pods 1/10`; "
        "`unlimited` for a resource the band does not limit, `not granted` for a band "
        "the spec leaves out.",
    )


class TeamQuota(Resource):
    """A team's quota per priority band: CPU, memory, GPUs, pods and extended resources."""

    crd = CrdInfo(
        plural="teamquotas",
        short_names=("tq",),
        scope="Cluster",
        printer_columns=(
            PrinterColumn("Team", "string", ".spec.team", "Team the quota applies to."),
            PrinterColumn(
                "Production",
                "string",
                ".status.summary.production",
                "Held against the limit in the production band (used/limit).",
            ),
            PrinterColumn(
                "Batch",
                "string",
                ".status.summary.batch",
                "Held against the limit in the batch band (used/limit).",
            ),
            PrinterColumn(
                "Best-Effort",
                "string",
                ".status.summary.best-effort",
                "Held against the limit in the best-effort band (used/limit).",
            ),
            AGE_COLUMN,
        ),
    )

    api_version: Literal["pilotfish.io/v1alpha1"] = "pilotfish.io/v1alpha1"
    kind: Literal["TeamQuota"] = "TeamQuota"
    spec: TeamQuotaSpec = Field(description="Desired state, written by people.")
    status: TeamQuotaStatus | None = Field(
        default=None,
        description="Observed state, written by the quota operator.",
    )
