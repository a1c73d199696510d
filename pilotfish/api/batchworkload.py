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
    list_field,
    object_field,
)
from pilotfish.api.serviceworkload import Placement

# Condition types the batch operator maintains.
COMPLETE: Final = "Complete"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
# Reasons of those conditions.
REASON_COMPLETED: Final = "Completed"
REASON_BACKOFF_LIMIT: Final = "BackoffLimitExceeded"
REASON_FAILED_INDEXES: Final = "FailedIndexes"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"

# A compact set of task indexes, as `pilotfish.indexranges` writes it: "0-4,7,9-12".
INDEX_RANGES_PATTERN: Final = r"^$|^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"


DEFAULT_BACKOFF_LIMIT: Final = 6


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

    # Upper bounds: a job ten times the design's largest (100,000 tasks), and a gang the
    # operator creates in one sync, so no spec makes a sync unbounded.
    completions: int = Field(
        ge=1, le=1_000_000, description="Pods that must succeed for the job to complete."
    )
    parallelism: int = Field(default=1, ge=1, le=100_000, description="Pods that may run at once.")
    template: PodTemplate = Field(description="The pods to run.")
    band: Band = Field(
        default="batch",
        description="Priority band: production, batch or best-effort.",
    )
    team: TeamName = Field(description="Team that owns the workload and whose quota it uses.")
    placement: Placement = object_field(
        Placement, "Where the tasks may run and how they are spread (as for ServiceWorkload)."
    )
    backoff_limit: int | None = Field(
        default=None,
        ge=0,
        description="Task failures tolerated in all before the job is marked Failed "
        "(evictions and preemptions do not count). Unset: 6, or no limit in all when "
        "backoffLimitPerIndex is set (as for a Job).",
    )
    backoff_limit_per_index: int | None = Field(
        default=None,
        ge=0,
        description="Failures tolerated per index: an index failing more often is failed "
        "(listed in status.failedIndexes) while the others go on; no per-index limit when unset.",
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
        le=1000,
        description="Pods released to the scheduler together, all or none; no gang when unset.",
    )
    suspend: bool = Field(
        default=False,
        description="Stop the job: no pods are created and running ones are deleted; setting "
        "it back to false resumes where the job was.",
    )

    @property
    def failures_tolerated(self) -> int | None:
        """The backoffLimit in force: None is no limit in all (only per index)."""
        if self.backoff_limit is not None:
            return self.backoff_limit
        return None if self.backoff_limit_per_index is not None else DEFAULT_BACKOFF_LIMIT


class Pacing(ApiModel):
    """How fast the operator puts the job's pods in front of the scheduler."""

    in_flight: int = Field(default=0, ge=0, description="Created pods not yet bound to a node.")
    limit: int = Field(default=0, ge=0, description="Unbound pods the job may have now.")
    binds_per_second: float = Field(
        default=0.0, ge=0, description="The job's pods bound per second, measured recently."
    )
    held_for_production: int = Field(
        default=0,
        ge=0,
        description="Production pods waiting for placement when the last sync held the job's "
        "creates back for them (0: not held).",
    )
    yield_rate: float = Field(
        default=0.0,
        ge=0,
        description="Creates per second the job is held to while production pods keep "
        "arriving, a share of its bind rate before they did (0: not yielding).",
    )
    create_rate: float = Field(
        default=0.0,
        ge=0,
        description="Creates per second the job may make now: the least of its creationRate, "
        "its yield and the rate the API server's queueing allows (batch slows down while the "
        "server shows the operator's own writes late; 0: no cap).",
    )
    api_queueing_seconds: float = Field(
        default=0.0,
        ge=0,
        description="How much later than at its quickest the operator's informer shows its "
        "own pod writes, measured recently: the API server's queueing delay.",
    )


class BatchWorkloadStatus(ConditionsStatus):
    """The observed state of a BatchWorkload."""

    active: int = Field(default=0, ge=0, description="Pods pending or running.")
    succeeded: int = Field(default=0, ge=0, description="Tasks that succeeded.")
    failed: int = Field(
        default=0, ge=0, description="Task failures, counted toward the backoff limits."
    )
    disrupted: int = Field(
        default=0,
        ge=0,
        description="Tasks evicted or preempted (DisruptionTarget): recreated, not counted "
        "as failures.",
    )
    completed_indexes: str = Field(
        default="",
        pattern=INDEX_RANGES_PATTERN,
        description='Indexes that succeeded, as ranges such as "0-4,7,9-12".',
    )
    failed_indexes: str = Field(
        default="",
        pattern=INDEX_RANGES_PATTERN,
        description="Indexes that exceeded backoffLimitPerIndex, as ranges.",
    )
    recorded_pods: list[str] = list_field(
        "UIDs of failed or disrupted pods whose outcome the counters include "
        "while they still carry the tracking finalizer: what keeps a restarted operator "
        "from counting one failure twice."
    )
    waiting: int = Field(default=0, ge=0, description="Tasks not yet created.")
    pacing: Pacing | None = Field(
        default=None, description="The pace of pod creation, while the job runs."
    )
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
            PrinterColumn(
                "Status",
                "string",
                '.status.conditions[?(@.status=="True")].type',
                "Complete, Failed or Suspended, once it is.",
            ),
            PrinterColumn("Succeeded", "integer", ".status.succeeded", "Tasks that succeeded."),
            PrinterColumn("Completions", "integer", ".spec.completions", "Tasks to complete."),
            PrinterColumn("Active", "integer", ".status.active", "Pods pending or running."),
            PrinterColumn("Waiting", "integer", ".status.waiting", "Tasks not yet created."),
            PrinterColumn("Failed", "integer", ".status.failed", "Task failures."),
            PrinterColumn(
                "In-flight",
                "integer",
                ".status.pacing.inFlight",
                "Created pods not yet bound.",
                priority=1,
            ),
            PrinterColumn(
                "Limit", "integer", ".status.pacing.limit", "Unbound pods allowed.", priority=1
            ),
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
