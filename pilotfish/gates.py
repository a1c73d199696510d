"""The gated-release contract between the mutating webhook and the gate controller.

At pod creation the webhook puts every gate of every matching GatePolicy on the pod and
records, in one annotation, each gate's creation-time contract: the policy and generation it
came from, the condition that releases it, its deadline and what expiry does. The deadline
and expiry terms are read from that record, so editing a policy later does not move the
deadlines of pods already waiting (gates can be removed but never added after creation).
The condition is not taken on the record's word: the controller releases a gate only on the
condition its GatePolicy (or, for the quota gate, the quota rule) declares, and holds a gate
whose record says otherwise (pilotfish.operators.gates.terms). The record, like every
Pilotfish label and annotation on a pod, cannot be changed after creation except by the
operator (pilotfish.podmeta).

Names here are the only place these keys are spelled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from pilotfish.names import API_VERSION, GATE_PREFIX

# On every pod the webhook gated: lets controllers watch only gated pods (label selector).
LABEL_GATED: Final = "gates.pilotfish.io/gated"
# Pods of one gang carry the same value; a Gang gate releases them all together or none.
LABEL_GANG: Final = "pilotfish.io/gang"
# Set to "required" when a gate expired with onExpiry Review.
LABEL_REVIEW: Final = "gates.pilotfish.io/review"

ANNOTATION_RECORD: Final = "gates.pilotfish.io/record"
ANNOTATION_CREATED: Final = "gates.pilotfish.io/created-at"
# Left by `kubectl pilotfish gates release` in the write that removes a gate by hand.
ANNOTATION_MANUAL_RELEASE: Final = "gates.pilotfish.io/manual-release"

# The gate admission puts on a batch pod over its team's quota, and the name its record
# carries in place of a GatePolicy's: its terms are the quota rule's, not a policy's.
QUOTA_GATE: Final = "gates.pilotfish.io/quota-available"
QUOTA_POLICY: Final = "(team quota)"

# The gate the batch operator puts on the first `spec.gang` tasks of a BatchWorkload (with
# LABEL_GANG set to the workload's name), and the name its record carries in place of a
# GatePolicy's: the gang's size is the BatchWorkload's `spec.gang`, never the pod's word.
GANG_GATE: Final = "gates.pilotfish.io/gang"
GANG_POLICY: Final = "(batch gang)"
GANG_KIND: Final = "BatchWorkload"
# A gang waits for its members to be created and for room in its team's quota, both of
# which may take long on a busy cluster; it never fails on its own. After a day a person is
# asked to look (onExpiry Review: the gate stays, the pod is flagged), as for the quota gate.
GANG_TIMEOUT_SECONDS: Final = 24 * 3600

# The pod condition that shows where a gated pod stands while it holds a Pilotfish gate:
# waiting (STATE_GATED), expired, or held on an untrusted record. A release writes none (it
# is one write, the gate patch): a pod is released when its spec holds no Pilotfish gate, and
# the release mark that patch sets (annotation gates.pilotfish.io/released) says when and
# why. The condition a released pod still carries is from its gated phase; its
# observedGeneration is older than the pod's generation.
POD_CONDITION: Final = "gates.pilotfish.io/State"
STATE_GATED: Final = "SchedulingGated"
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


# The JSON type of each GateRecord field: a record with any other is not one the webhook wrote.
_FIELD_TYPES: Final[Mapping[str, type]] = {
    "policy": str,
    "generation": int,
    "condition": dict,
    "timeout_seconds": int,
    "deadline": str,
    "on_expiry": str,
    "initial_backoff_seconds": int,
    "max_backoff_seconds": int,
    "attempts": int,
    "owner": str,
}
ON_EXPIRY: Final = ("Fail", "Retry", "Review")


def _gate_record(entry: Any) -> GateRecord | None:
    if not isinstance(entry, dict) or not set(entry) <= set(_FIELD_TYPES):
        return None
    for key, value in entry.items():
        kind = _FIELD_TYPES[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return None
    if entry.get("on_expiry", "Fail") not in ON_EXPIRY:
        return None
    try:
        return GateRecord(**entry)
    except TypeError:  # a required field is missing
        return None


def read_record(pod: Mapping[str, Any]) -> PodGates | None:
    """The gate record the webhook wrote on `pod`, or None if it carries none (or a bad one:
    not JSON, or any entry not of the record's shape and types)."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(ANNOTATION_RECORD)
    if not raw or not isinstance(raw, str):
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    gates: dict[str, GateRecord] = {}
    for name, entry in data.items():
        rec = _gate_record(entry)
        if rec is None:
            return None
        gates[name] = rec
    created = ann.get(ANNOTATION_CREATED, "")
    return PodGates(created=created if isinstance(created, str) else "", gates=gates)


def scheduling_gates(pod: Mapping[str, Any]) -> list[str]:
    return [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def is_pilotfish_gate(name: str) -> bool:
    return name.startswith(GATE_PREFIX)


def batch_owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the BatchWorkload that is `obj`'s controller, or None.

    Owner references name objects of the owner's own namespace only (the garbage collector
    resolves them there), so this names a BatchWorkload next to the pod, never another
    namespace's.
    """
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        if ref.get("kind") == GANG_KIND and ref.get("apiVersion") == API_VERSION:
            return str(ref.get("name") or ""), str(ref.get("uid") or "")
        return None  # one controller at most; it is not a BatchWorkload
    return None


def gang_condition(workload: str) -> dict[str, Any]:
    """The record's condition of a batch gang gate: the gang of BatchWorkload `workload`
    (its size is the workload's `spec.gang`, read by the gate controller, never recorded)."""
    return {"type": "Gang", "workload": workload}


def batch_gang_problem(obj: Mapping[str, Any]) -> str | None:
    """Why `obj` may not carry GANG_GATE (None: it may, or it does not carry it).

    Only a BatchWorkload's gang tasks carry it: its controller ownerReference names the
    workload and its LABEL_GANG label is that workload's name. The gate controller sizes the
    gang from that very workload, so a pod outside that shape would wait for a gang nothing
    forms (or claim membership it has no owner for).
    """
    if GANG_GATE not in scheduling_gates(obj):
        return None
    rule = (
        f"gate {GANG_GATE} is the batch gang gate: only task pods of a BatchWorkload carry it "
        f"(a controller ownerReference of kind {GANG_KIND}, apiVersion {API_VERSION}, and label "
        f"{LABEL_GANG} set to that BatchWorkload's name)"
    )
    owner = batch_owner(obj)
    label = str(((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_GANG) or "")
    if owner is None or not owner[0]:
        return f"{rule}; this pod has no controller ownerReference to a {GANG_KIND}"
    if not label:
        return f"{rule}; this pod has no {LABEL_GANG} label"
    if label != owner[0]:
        return (
            f"{rule}; this pod's {LABEL_GANG} is {label[:64]!r} but its controller is "
            f"{GANG_KIND} {owner[0][:64]!r}"
        )
    return None


def remove_gate_patch(gate: str) -> dict[str, Any]:
    """Strategic-merge patch deleting one gate by name: idempotent, other gates untouched."""
    return {"spec": {"schedulingGates": [{"name": gate, "$patch": "delete"}]}}
