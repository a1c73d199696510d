"""BatchWorkload: N tasks run to completion, paced, optionally released as gangs."""

from typing import Final, Literal

from pydantic import Field

from pilotfish.api.base import (
    AGE_COLUMN,
    ApiModel,
    Band,
    CelRule,
    ConditionsStatus,
    CrdInfo,
    PodTemplate,
    PrinterColumn,
    Resource,
    TeamName,
    Time,
    object_field,
)
from pilotfish.api.serviceworkload import Placement

# Condition types the batch operator maintains.
COMPLETE: Final = "Complete"
FAILED: Final = "Failed"


class BatchWorkloadSpec(ApiModel):
    """The desired state of a BatchWorkload."""

    cel_rules = (
        CelRule(
            rule="!has(self.gang) || self.gang <= self.completions",
            message="gang cannot exceed completions: a gang larger than the whole job could "
            "never be released",
            holds=lambda s: s.gang is None or s.gang <= s.completions,
            field_path=".gang",
        ),
        CelRule(
            rule="!has(self.gang) || self.gang <= self.parallelism",
            message="gang cannot exceed parallelism: no more than parallelism pods exist at "
            "once, so a larger gang could never form",
            holds=lambda s: s.gang is None or s.gang <= s.parallelism,
            field_path=".gang",
        ),
    )

    completions: int = Field(ge=1, description="Pods that must succeed for the job to complete.")
    parallelism: int = Field(default=1, ge=1, description="Pods that may run at once.")
    template: PodTemplate = Field(description="The pods to run.")
    band: Band = Field(
        default="batch",
        description="Priority band: production, batch or best-effort.",
    )
    team: TeamName = Field(description="Team that owns the workload and whose quota it uses.")
    placement: Placement = object_field(
        Placement, "Where the tasks may run and how they are spread (as for ServiceWorkload)."
    )
    backoff_limit: int = Field(
        default=6,
        ge=0,
        description="Pod failures tolerated before the job is marked Failed.",
    )
    creation_rate: float | None = Field(
        default=None,
        gt=0,
        description="Pods created per second at most, so that a large job does not flood "
        "the scheduler; unlimited when unset.",
    )
    gang: int | None = Field(
        default=None,
        ge=1,
        description="Pods released to the scheduler together, all or none; no gang when unset.",
    )


class BatchWorkloadStatus(ConditionsStatus):
    """The observed state of a BatchWorkload."""

    active: int = Field(default=0, ge=0, description="Pods pending or running.")
    succeeded: int = Field(default=0, ge=0, description="Pods that succeeded.")
    failed: int = Field(default=0, ge=0, description="Pods that failed.")
    start_time: Time | None = Field(
        default=None,
        description="When the operator first acted on the job.",
    )
    completion_time: Time | None = Field(
        default=None,
        description="When the job completed; unset until it does.",
    )


class BatchWorkload(Resource):
    """A batch job: pods run to completion, paced, on capacity production does not use."""

    crd = CrdInfo(
        plural="batchworkloads",
        short_names=("bw",),
        scope="Namespaced",
        printer_columns=(
            PrinterColumn("Team", "string", ".spec.team", "Owning team."),
            PrinterColumn("Band", "string", ".spec.band", "Priority band."),
            PrinterColumn("Completions", "integer", ".spec.completions", "Pods to complete."),
            PrinterColumn("Succeeded", "integer", ".status.succeeded", "Pods that succeeded."),
            PrinterColumn("Active", "integer", ".status.active", "Pods pending or running."),
            PrinterColumn("Failed", "integer", ".status.failed", "Pods that failed.", priority=1),
            AGE_COLUMN,
        ),
    )

    api_version: Literal["pilotfish.io/v1alpha1"] = "pilotfish.io/v1alpha1"
    kind: Literal["BatchWorkload"] = "BatchWorkload"
    spec: BatchWorkloadSpec = Field(description="Desired state, written by people.")
    status: BatchWorkloadStatus | None = Field(
        default=None,
        description="Observed state, written by the batch operator.",
    )
