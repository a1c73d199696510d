"""The gated-release contract between the mutating webhook and the gate controller.

At pod creation the webhook puts every gate of every matching GatePolicy on the pod and
records, in one annotation, each gate's creation-time contract: the policy and generation it
came from, the condition that releases it, its deadline and what expiry does. The controller
reads only that record, never the current policy, so editing a policy later does not change
the terms of pods already waiting (gates can be removed but never added after creation).

Names here are the only place these keys are spelled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from pilotfish.names import GATE_PREFIX

# On every pod the webhook gated: lets controllers watch only gated pods (label selector).
LABEL_GATED: Final = "gates.pilotfish.io/gated"
# Pods of one gang carry the same value; a Gang gate releases them all together or none.
LABEL_GANG: Final = "pilotfish.io/gang"
# Set to "required" when a gate expired with onExpiry Review.
LABEL_REVIEW: Final = "gates.pilotfish.io/review"

ANNOTATION_RECORD: Final = "gates.pilotfish.io/record"
ANNOTATION_CREATED: Final = "gates.pilotfish.io/created-at"

# The pod condition that shows where a gated pod stands in the design's state machine.
POD_CONDITION: Final = "gates.pilotfish.io/State"
STATE_GATED: Final = "SchedulingGated"
STATE_READY: Final = "ReadyToSchedule"
STATE_UNSCHEDULABLE: Final = "Unschedulable"
STATE_RUNNING: Final = "Running"
STATE_EXPIRED: Final = "Expired"

OnExpiry = Literal["Fail", "Retry", "Review"]


@dataclass(frozen=True)
class GateRecord:
    """One gate's terms as fixed at the pod's creation."""

    policy: str
    generation: int
    condition: dict[str, Any]  # the GatePolicy gate's `condition`, wire form (camelCase)
    timeout_seconds: int
    deadline: str  # RFC 3339, UTC
    on_expiry: OnExpiry = "Fail"
    initial_backoff_seconds: int = 10
    max_backoff_seconds: int = 600
    attempts: int = 0  # expiries retried so far
    owner: str = "pilotfish-operator"  # the controller allowed to remove the gate


@dataclass
class PodGates:
    """Every Pilotfish gate on one pod, keyed by gate name."""

    created: str
    gates: dict[str, GateRecord] = field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps(
            {name: asdict(rec) for name, rec in sorted(self.gates.items())}, sort_keys=True
        )


def read_record(pod: Mapping[str, Any]) -> PodGates | None:
    """The gate record the webhook wrote on `pod`, or None if it carries none (or a bad one)."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(ANNOTATION_RECORD)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        gates = {name: GateRecord(**rec) for name, rec in data.items()}
    except (ValueError, TypeError):
        return None
    return PodGates(created=ann.get(ANNOTATION_CREATED, ""), gates=gates)


def scheduling_gates(pod: Mapping[str, Any]) -> list[str]:
    return [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def is_pilotfish_gate(name: str) -> bool:
    return name.startswith(GATE_PREFIX)


def remove_gate_patch(gate: str) -> dict[str, Any]:
    """Strategic-merge patch deleting one gate by name: idempotent, other gates untouched."""
    return {"spec": {"schedulingGates": [{"name": gate, "$patch": "delete"}]}}
