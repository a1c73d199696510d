"""GatePolicy: which pods get which scheduling gates at creation, and what releases them."""

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from pilotfish.api.base import (
    AGE_COLUMN,
    DNS_SUBDOMAIN_PATTERN,
    NAME_PREFIX_PATTERN,
    PREFIXED_NAME_PATTERN,
    QUALIFIED_NAME_MAX,
    ApiModel,
    CelRule,
    ConditionsStatus,
    CrdInfo,
    LabelSelector,
    ListMap,
    ListSet,
    PrinterColumn,
    Resource,
)
from pilotfish.names import GATE_PREFIX

# The condition the operator keeps on every GatePolicy: True when its gates go on the pods it
# selects as written; False, with why, when the stored policy cannot be read or a gate it
# declares is governed by another policy's terms.
VALID: Final = "Valid"

GateConditionType = Literal["GateSignal", "Quota", "Image", "Gang"]
NamePrefix = Annotated[
    str, StringConstraints(pattern=NAME_PREFIX_PATTERN, min_length=2, max_length=254)
]


class GateCondition(ApiModel):
    """What must hold for a gate to be removed.

    One object with a type and the parameters of that type, rather than one field per type,
    so that `kubectl get -o yaml` reads the same for every gate.
    """

    cel_rules = (
        CelRule(
            rule="(self.type == 'GateSignal') == has(self.signalName)",
            message="signalName is required when type is GateSignal and not allowed otherwise",
            holds=lambda s: (s.type == "GateSignal") == (s.signal_name is not None),
        ),
        CelRule(
            rule="(self.type == 'Gang') == has(self.size)",
            message="size is required when type is Gang and not allowed otherwise",
            holds=lambda s: (s.type == "Gang") == (s.size is not None),
        ),
        CelRule(
            rule="!has(self.minNodes) || self.type == 'Image'",
            message="minNodes is only allowed when type is Image",
            holds=lambda s: s.min_nodes is None or s.type == "Image",
        ),
    )

    type: GateConditionType = Field(
        description="GateSignal: a named signal was raised. Quota: the team's quota admits "
        "the pod. Image: the pod's images are present on enough nodes. Gang: enough pods of "
        "the same gang are ready to be released together.",
    )
    signal_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="For GateSignal: the name of the signal that releases the gate.",
    )
    min_nodes: int | None = Field(
        default=None,
        ge=1,
        description="For Image: nodes that must hold the images; 1 when unset.",
    )
    size: int | None = Field(
        default=None,
        ge=1,
        description="For Gang: pods released together, all or none.",
    )


class RetryPolicy(ApiModel):
    """Backoff between attempts when an expired gate is retried."""

    cel_rules = (
        CelRule(
            rule="self.initialBackoffSeconds <= self.maxBackoffSeconds",
            message="initialBackoffSeconds cannot exceed maxBackoffSeconds",
            holds=lambda s: s.initial_backoff_seconds <= s.max_backoff_seconds,
        ),
    )

    initial_backoff_seconds: int = Field(
        default=10,
        ge=1,
        description="Wait before the first retry; doubles after every further expiry.",
    )
    max_backoff_seconds: int = Field(
        default=600,
        ge=1,
        description="Upper bound of the wait between retries.",
    )


class Gate(ApiModel):
    """A scheduling gate put on matching pods at creation, and how it is released."""

    cel_rules = (
        CelRule(
            rule="!has(self.retry) || self.onExpiry == 'Retry'",
            message="retry is only used when onExpiry is Retry",
            holds=lambda s: s.retry is None or s.on_expiry == "Retry",
            field_path=".retry",
        ),
    )

    name: str = Field(
        pattern=PREFIXED_NAME_PATTERN,
        max_length=QUALIFIED_NAME_MAX,
        description="Gate name, prefix/condition (such as gates.pilotfish.io/warehouse-ready): "
        "it names the unmet condition and never carries data. The prefix must be one of "
        "allowedPrefixes.",
    )
    condition: GateCondition = Field(description="What must hold for the gate to be removed.")
    timeout_seconds: int = Field(
        ge=1,
        description="Seconds a pod may hold the gate before onExpiry applies: no pod waits "
        "silently forever.",
    )
    on_expiry: Literal["Fail", "Retry", "Review"] = Field(
        default="Fail",
        description="On timeout: Fail the pod, Retry the condition with backoff, or keep the "
        "gate and flag the pod for Review by a person.",
    )
    retry: RetryPolicy | None = Field(
        default=None,
        description="Backoff for onExpiry Retry; defaults apply when unset.",
    )


class Pacing(ApiModel):
    """Limits on how fast gated pods are released, so a release does not flood the scheduler."""

    releases_per_second: float | None = Field(
        default=None,
        gt=0,
        description="Gate removals per second at most; unlimited when unset.",
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Released pods not yet running at most; unlimited when unset.",
    )


class GatePolicySpec(ApiModel):
    """The desired state of a GatePolicy."""

    cel_rules = (
        CelRule(
            rule="self.gates.all(g, self.allowedPrefixes.exists(p, g.name.startsWith(p)))",
            message="every gate name must start with one of allowedPrefixes",
            holds=lambda s: all(
                any(g.name.startswith(p) for p in s.allowed_prefixes) for g in s.gates
            ),
            field_path=".gates",
        ),
    )

    selector: LabelSelector = Field(
        description="Pods of this namespace that get the gates at creation; {} selects all.",
    )
    gates: Annotated[list[Gate], ListMap(keys=("name",))] = Field(
        min_length=1,
        max_length=16,
        description="Gates put on each selected pod; names are unique.",
    )
    allowed_prefixes: Annotated[list[NamePrefix], ListSet()] = Field(
        default=[GATE_PREFIX],
        min_length=1,
        max_length=16,
        description="Gate name prefixes (such as gates.pilotfish.io/) this policy may use.",
    )
    pacing: Pacing | None = Field(
        default=None,
        description="Limits on how fast gated pods are released; unlimited when unset.",
    )


class GatePolicyStatus(ConditionsStatus):
    """The observed state of a GatePolicy, written by the operator.

    Condition Valid: True when the policy's gates go on the pods it selects as written;
    False when the stored policy cannot be read (reason Unreadable) or a gate it declares is
    also declared, with other terms, by a policy of the namespace first by name (reason
    GateConflict), with the message saying where.
    """

    gated_pods: int = Field(
        default=0,
        ge=0,
        description="Pods that still hold at least one of this policy's gates.",
    )


class GatePolicy(Resource):
    """Scheduling gates for a namespace's pods: put on at creation, removed when they hold."""

    crd = CrdInfo(
        plural="gatepolicies",
        short_names=("gp",),
        scope="Namespaced",
        printer_columns=(
            PrinterColumn(
                "Gates",
                "string",
                ".spec.gates[*].name",
                "Gate names (kubectl shows the first).",
            ),
            PrinterColumn("Gated", "integer", ".status.gatedPods", "Pods still gated."),
            PrinterColumn(
                "Valid",
                "string",
                f'.status.conditions[?(@.type=="{VALID}")].status',
                "Whether the policy's gates go on pods as written (the message says why not).",
            ),
            AGE_COLUMN,
        ),
    )

    api_version: Literal["pilotfish.io/v1alpha1"] = "pilotfish.io/v1alpha1"
    kind: Literal["GatePolicy"] = "GatePolicy"
    spec: GatePolicySpec = Field(description="Desired state, written by people.")
    status: GatePolicyStatus | None = Field(
        default=None,
        description="Observed state, written by the operator.",
    )
