"""A GatePolicy's status from what was observed (pure): the plan, or None when it is current.

`Valid` says whether the policy's gates go on pods as written:
- `Unreadable`: the stored object does not parse (stored before a schema rule existed, or
  written against a newer CRD); admission then refuses every new pod of the namespace, as
  it cannot decide their gates, so the message says where the policy is wrong;
- `GateConflict`: a gate it declares is also declared, with other terms, by a policy of the
  namespace that sorts before it; for pods both select, admission applies the first one's
  terms (the first by name wins), so this policy's terms for that gate are not in force.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish.api.gatepolicy import VALID
from pilotfish.conditions import set_condition
from pilotfish.operators.gatepolicy.model import PolicyView
from pilotfish.timeutil import format_time

CONDITION_VALID: Final = VALID
REASON_VALID: Final = "Valid"
REASON_UNREADABLE: Final = "Unreadable"
REASON_GATE_CONFLICT: Final = "GateConflict"
# The fields of status this decision owns; anything else there is left alone.
OWNED: Final = ("observedGeneration", "gatedPods", "conditions")


@dataclass(frozen=True)
class StatusPlan:
    """The status to write, conditional on the version it was computed from."""

    namespace: str
    name: str
    resource_version: str
    status: Mapping[str, Any]


@dataclass(frozen=True)
class Validity:
    valid: bool
    reason: str
    message: str


def _value(value: Any) -> str:
    return "unset" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _differences(mine: Mapping[str, Any], theirs: Mapping[str, Any], where: str) -> str:
    """`timeoutSeconds 60 here, 30 in a`: each term the two declarations disagree on."""
    return ", ".join(
        f"{k} {_value(mine.get(k))} here, {_value(theirs.get(k))} in {where}"
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    )


def validity(policy: PolicyView, namespace_policies: Sequence[PolicyView]) -> Validity:
    """Whether `policy`'s gates go on pods as written; `namespace_policies` are the other
    GatePolicies of its namespace (itself, if present, is ignored)."""
    if policy.error:
        return Validity(
            False,
            REASON_UNREADABLE,
            f"cannot be read ({policy.error}); admission refuses new pods in namespace "
            f"{policy.namespace} until this policy is fixed or deleted",
        )
    earlier = sorted(
        (p for p in namespace_policies if p.name < policy.name and not p.error),
        key=lambda p: p.name,
    )
    conflicts: list[str] = []
    for gate, mine in policy.gates.items():
        first = next((p for p in earlier if gate in p.gates), None)
        if first is None or first.gates[gate] == mine:
            continue
        differ = _differences(mine, first.gates[gate], first.name)
        conflicts.append(
            f"gate {gate} is also declared by GatePolicy {first.name} with other terms "
            f"({differ}); for pods both select, the terms of {first.name} apply (the first "
            "by name wins)"
        )
    if conflicts:
        return Validity(False, REASON_GATE_CONFLICT, "; ".join(conflicts))
    return Validity(True, REASON_VALID, "the policy's gates go on the pods it selects as written")


def condition(
    previous: Sequence[Any], validity: Validity, generation: int | None, now: datetime.datetime
) -> dict[str, Any]:
    """The Valid condition, keeping its lastTransitionTime while its status is unchanged."""
    status = "True" if validity.valid else "False"
    return set_condition(
        previous,
        CONDITION_VALID,
        status,
        validity.reason,
        validity.message,
        generation,
        format_time(now),
    )


def desired(
    policy: PolicyView,
    namespace_policies: Sequence[PolicyView],
    gated_pods: int,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The owned fields of status as they should be now."""
    previous = policy.status.get("conditions")
    previous = previous if isinstance(previous, list) else []
    valid = condition(previous, validity(policy, namespace_policies), policy.generation, now)
    others = [c for c in previous if isinstance(c, Mapping) and c.get("type") != CONDITION_VALID]
    out: dict[str, Any] = {"gatedPods": gated_pods, "conditions": [*others, valid]}
    if policy.generation is not None:
        out["observedGeneration"] = policy.generation
    return out


def decide(
    policy: PolicyView,
    namespace_policies: Sequence[PolicyView],
    gated_pods: int,
    now: datetime.datetime,
) -> StatusPlan | None:
    """The status write `policy` needs, or None when its status already says all this."""
    want = desired(policy, namespace_policies, gated_pods, now)
    have = {k: policy.status[k] for k in OWNED if k in policy.status}
    if have == want:
        return None
    return StatusPlan(policy.namespace, policy.name, policy.resource_version, want)
