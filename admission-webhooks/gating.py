"""Which gates a new pod gets, and the creation-time record of each (pure).

Gates can only be put on a pod when it is created, so every gate of every GatePolicy that
selects the pod goes on now, together with the terms the gate controller will release it
by (`pilotfish.gates.GateRecord`). The terms are copied from the policy as it is at this
moment, with the deadline computed from `now`: editing the policy later does not change
the deal of pods already waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pilotfish.api.gatepolicy import Gate, RetryPolicy
from pilotfish.gates import (
    ANNOTATION_CREATED,
    ANNOTATION_RECORD,
    LABEL_GATED,
    GateRecord,
    PodGates,
    scheduling_gates,
)
from pilotfish.names import SA_OPERATOR
from pilotfish.timeutil import format_time
from pilotfish.webhooks.gateview import PolicyEntry
from pilotfish.webhooks.patches import Op, append_items, remove_entries, set_entries


def record(policy: PolicyEntry, gate: Gate, now: datetime) -> GateRecord:
    """One gate's terms, fixed at creation."""
    retry = gate.retry or RetryPolicy()
    return GateRecord(
        policy=policy.name,
        generation=policy.generation,
        condition=gate.condition.model_dump(by_alias=True, exclude_none=True),
        timeout_seconds=gate.timeout_seconds,
        deadline=format_time(now + timedelta(seconds=gate.timeout_seconds)),
        on_expiry=gate.on_expiry,
        initial_backoff_seconds=retry.initial_backoff_seconds,
        max_backoff_seconds=retry.max_backoff_seconds,
        owner=SA_OPERATOR,
    )


@dataclass(frozen=True)
class GatePlan:
    """What the webhook does to one pod: gates to append, the record, and warnings."""

    add: tuple[str, ...] = ()
    records: Mapping[str, GateRecord] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def gated(self) -> bool:
        return bool(self.records)


def plan(
    pod: Mapping[str, Any],
    policies: Sequence[PolicyEntry],
    now: datetime,
    extra: Mapping[str, GateRecord] | None = None,
) -> GatePlan:
    """The gates of `policies` (already filtered to those selecting the pod, by name).

    Gates the client already set are kept and not added twice. When two policies declare
    the same gate, the first by name wins and the pod's creator is warned, because only one
    set of terms can govern one gate. `extra` are gates Pilotfish itself puts on the pod
    (the quota gate, the batch gang gate), with their terms; they win over a GatePolicy
    declaring the same name, whose creator is warned.
    """
    present = scheduling_gates(pod)
    records: dict[str, GateRecord] = dict(extra or {})
    declared_by: dict[str, str] = {}
    add: list[str] = [name for name in records if name not in present]
    warnings: list[str] = []
    for policy in policies:
        for gate in policy.spec.gates:
            own = (extra or {}).get(gate.name)
            if own is not None:
                warnings.append(
                    f"gate {gate.name} is put on this pod by Pilotfish ({own.policy}); the "
                    f"declaration of GatePolicy {policy.name} does not apply to it"
                )
                continue
            first = declared_by.get(gate.name)
            if first is not None:
                warnings.append(
                    f"gate {gate.name} is declared by GatePolicies {first} and {policy.name}; "
                    f"the terms of {first} apply (the first by name wins)"
                )
                continue
            declared_by[gate.name] = policy.name
            records[gate.name] = record(policy, gate, now)
            if gate.name not in present:
                add.append(gate.name)
    return GatePlan(add=tuple(add), records=records, warnings=tuple(warnings))


def gate_patch(pod: Mapping[str, Any], gate_plan: GatePlan, now: datetime) -> list[Op]:
    """JSON patch putting the plan on the pod: gates, the gated label, the record."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    created = format_time(now)
    return [
        *append_items(
            spec.get("schedulingGates"),
            ("spec", "schedulingGates"),
            [{"name": name} for name in gate_plan.add],
        ),
        *set_entries(meta.get("labels"), ("metadata", "labels"), {LABEL_GATED: "true"}),
        *set_entries(
            meta.get("annotations"),
            ("metadata", "annotations"),
            {
                ANNOTATION_CREATED: created,
                ANNOTATION_RECORD: PodGates(created, dict(gate_plan.records)).encode(),
            },
        ),
    ]


def strip_patch(pod: Mapping[str, Any]) -> list[Op]:
    """JSON patch removing a gate record the webhook did not write.

    The record is the gate controller's contract, so only the webhook may write it: a
    record copied from another pod's YAML, or forged to get easier terms, is dropped from
    pods no policy gates (and overwritten on pods one does).
    """
    meta = pod.get("metadata") or {}
    return [
        *remove_entries(meta.get("labels"), ("metadata", "labels"), [LABEL_GATED]),
        *remove_entries(
            meta.get("annotations"),
            ("metadata", "annotations"),
            [ANNOTATION_CREATED, ANNOTATION_RECORD],
        ),
    ]
