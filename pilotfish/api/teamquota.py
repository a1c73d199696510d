"""TeamQuota: how much a team may use in each priority band."""

from typing import Literal

from pydantic import Field

from pilotfish.api.base import (
    AGE_COLUMN,
    ApiModel,
    Band,
    ConditionsStatus,
    CrdInfo,
    PrinterColumn,
    Quantity,
    Resource,
    TeamName,
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
        "Limits per priority band. As with a ResourceQuota, a band or a resource left "
        "out is not limited.",
    )


class TeamQuotaStatus(ConditionsStatus):
    """The observed state of a TeamQuota."""

    used: Bands = object_field(
        Bands,
        "Resources requested by the team's bound pods, per band; a resource left out is zero.",
    )
    reserved: Bands = object_field(
        Bands,
        "Resources admitted but not yet bound (pods created, not yet scheduled), per band; "
        "a resource left out is zero.",
    )


class TeamQuota(Resource):
    """A team's quota per priority band: CPU, memory, GPUs, pods and extended resources."""

    crd = CrdInfo(
        plural="teamquotas",
        short_names=("tq",),
        scope="Cluster",
        printer_columns=(
            PrinterColumn("Team", "string", ".spec.team", "Team the quota applies to."),
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
