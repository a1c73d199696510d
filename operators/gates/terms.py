"""What releases each gate, re-derived from the GatePolicies, never taken from the pod.

The gate record on a pod (`gates.pilotfish.io/record`) is written by the mutating webhook at
creation and cannot be changed afterwards except by the operator (`pilotfish.podmeta`, held
by the chart's admission policy and the validating webhook). The controller still does not
take the record's word for what releases a gate: a record that named a `Gang` of one, or a
`GateSignal` the tenant raises itself, would otherwise release whatever it guards. So:

- A gate's *condition* and *owner* come from where the gate came from: the GatePolicy the
  record names, looked up in the controller's own GatePolicy view in the pod's namespace
  (the policy must still declare that gate, with that very condition), or the quota rule
  for the quota gate (`gates.QUOTA_POLICY`: only `gates.QUOTA_GATE`, condition Quota), or
  the batch gang rule for the batch gang gate (`gates.GANG_POLICY`: only `gates.GANG_GATE`,
  condition Gang of the BatchWorkload that is the pod's controller and names its gang
  label). Every such gate is released by the operator.
- A record that does not match is *untrusted*: the gate is held, never released on the
  record's terms, and the pod is flagged (State condition and Event `GateRecordUntrusted`,
  label `gates.pilotfish.io/review=required`) for a person to release or cancel it with
  `kubectl pilotfish gates`. That includes an honest record whose policy was edited since
  (its gate removed or its condition changed) or deleted: the controller cannot tell that
  from a forgery, and holding is the safe side. Change what releases a gate by giving the
  new condition a new gate name.
- The *creation-time contract* (deadline, timeout, onExpiry, retry backoff) is still read
  from the record. It was fixed at admission and can no longer be edited, and none of it can
  release a gate: expiry only fails, retries or flags the pod. Untrusted gates do not
  expire either: a person decides.
- A record whose owner is not the operator is neither ours nor untrusted: its gate is left
  to that owner, as before.

The gang size of a Gang gate is the policy's too, so a pod cannot make itself a gang of one;
a batch gang's is its BatchWorkload's `spec.gang` (`gangs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, get_args

from pilotfish import gates
from pilotfish.api.gatepolicy import GateConditionType
from pilotfish.gates import GateRecord
from pilotfish.operators.gates.model import OWNER, PodView

REASON_UNTRUSTED: Final = "GateRecordUntrusted"
QUOTA_CONDITION: Final[Mapping[str, Any]] = {"type": "Quota"}
CONDITION_TYPES: Final[tuple[str, ...]] = get_args(GateConditionType)
TEXT_MAX: Final = 200

Condition = Mapping[str, Any]


@dataclass(frozen=True)
class PolicyGates:
    """One GatePolicy as the controller trusts it: each gate's condition, in record form."""

    namespace: str
    name: str
    generation: int = 0
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    error: str = ""  # set when the policy cannot be read: none of its gates is trusted


PolicyIndex = Mapping[tuple[str, str], PolicyGates]


def wire(condition: Any) -> dict[str, Any]:
    """A condition as the webhook records it (camelCase, unset fields left out)."""
    if not isinstance(condition, Mapping):
        return {}
    return {str(k): v for k, v in condition.items() if v is not None}


def policy_gates(obj: Mapping[str, Any]) -> PolicyGates:
    """A raw GatePolicy (informer object) reduced to its gates' conditions."""
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    generation = meta.get("generation")
    gen = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
    declared = (obj.get("spec") or {}).get("gates")
    if not isinstance(declared, list):
        return PolicyGates(ns, name, gen, error="spec.gates is not a list")
    conditions: dict[str, Condition] = {}
    for i, g in enumerate(declared):
        if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
            return PolicyGates(ns, name, gen, error=f"spec.gates[{i}].name is missing")
        cond = wire(g.get("condition"))
        problem = _problem(cond)
        if problem:
            return PolicyGates(ns, name, gen, error=f"spec.gates[{i}].condition: {problem}")
        conditions.setdefault(g["name"], cond)
    return PolicyGates(ns, name, gen, conditions)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _problem(cond: Mapping[str, Any]) -> str:
    """What the CRD schema would have refused in a condition ("" if nothing): a policy the
    schema did not check (stored before a rule existed) must not release on a gang of 0."""
    kind = cond.get("type")
    if kind not in CONDITION_TYPES:
        return f"type {kind!r} is not one of {', '.join(CONDITION_TYPES)}"
    if kind == "Gang" and not _count(cond.get("size")):
        return f"Gang size {cond.get('size')!r} is not a positive integer"
    signal = cond.get("signalName")
    if kind == "GateSignal" and not (isinstance(signal, str) and signal):
        return "GateSignal without signalName"
    if kind == "Image" and "minNodes" in cond and not _count(cond["minNodes"]):
        return f"Image minNodes {cond['minNodes']!r} is not a positive integer"
    return ""


def policy_index(objs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], PolicyGates]:
    out: dict[tuple[str, str], PolicyGates] = {}
    for o in objs:
        p = policy_gates(o)
        out[(p.namespace, p.name)] = p
    return out


def _short(text: str) -> str:
    """Record text for a message; a forged one is cut short, it is not ours to repeat."""
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 3] + "..."


def _text(condition: Condition) -> str:
    return _short(json.dumps(dict(condition), sort_keys=True, separators=(",", ":"), default=str))


def derive(
    namespace: str, gate: str, rec: GateRecord, policies: PolicyIndex
) -> tuple[Condition | None, str]:
    """(the condition that releases `gate`, "") when its source confirms the record, else
    (None, why the record cannot be trusted). Pure: the index is the controller's view."""
    recorded = wire(rec.condition)
    if rec.policy == gates.QUOTA_POLICY:
        if gate != gates.QUOTA_GATE:
            return None, (
                f"the record says the quota rule put {gate} there, but the quota rule puts "
                f"only {gates.QUOTA_GATE}"
            )
        if recorded != QUOTA_CONDITION:
            return None, (
                f"recorded condition {_text(recorded)} is not the quota rule's "
                f"{_text(QUOTA_CONDITION)}"
            )
        return QUOTA_CONDITION, ""
    if rec.policy == gates.GANG_POLICY:
        return _batch_gang(gate, recorded)
    policy = policies.get((namespace, rec.policy))
    named = f"GatePolicy {namespace}/{_short(rec.policy)}"
    if policy is None:
        return None, f"{named} named by the record does not exist"
    where = f"{named} (generation {policy.generation})"
    if policy.error:
        return None, f"{where} cannot be read: {policy.error}"
    declared = policy.conditions.get(gate)
    if declared is None:
        return None, f"{where} declares no gate {gate}"
    if recorded != declared:
        return None, (
            f"recorded condition {_text(recorded)} differs from the {_text(declared)} that "
            f"{where} declares"
        )
    return declared, ""


def _batch_gang(gate: str, recorded: Condition) -> tuple[Condition | None, str]:
    if gate != gates.GANG_GATE:
        return None, (
            f"the record says the batch gang put {gate} there, but a batch gang puts only "
            f"{gates.GANG_GATE}"
        )
    workload = recorded.get("workload")
    expected = gates.gang_condition(workload) if isinstance(workload, str) and workload else None
    if recorded != expected:
        return None, (
            f"recorded condition {_text(recorded)} is not a batch gang's "
            f"{_text(gates.gang_condition('<BatchWorkload name>'))}"
        )
    return recorded, ""


def _member_problem(pod: PodView, condition: Condition) -> str:
    """Why `pod` is not the batch gang task its gang record says ("" if it is): the record
    names the workload the webhook saw as the pod's controller and gang label; an owner
    reference changed since (removed, or the pod orphaned) leaves a gate nobody sizes."""
    workload = str(condition.get("workload"))
    owner = pod.batch_owner
    if owner is None:
        return (
            f"the record says it is in the gang of BatchWorkload {_short(workload)}, but the "
            "pod has no controller ownerReference to a BatchWorkload"
        )
    if owner[0] != workload or pod.gang != workload:
        return (
            f"the record says it is in the gang of BatchWorkload {_short(workload)}, but its "
            f"controller is {_short(owner[0])} and its {gates.LABEL_GANG} label "
            f"{_short(pod.gang or '')!r}"
        )
    return ""


def verified(pod: PodView, policies: PolicyIndex) -> PodView:
    """`pod` with the terms of each Pilotfish gate it holds: the re-derived condition of
    every gate the operator owns and whose record its source confirms, and why not for the
    rest. Gates of other owners, or without a record, are in neither (not ours)."""
    terms: dict[str, Condition] = {}
    untrusted: dict[str, str] = {}
    for g in pod.pilotfish_gates:
        rec = pod.record.get(g)
        if rec is None or rec.owner != OWNER:
            continue
        condition, why = derive(pod.namespace, g, rec, policies)
        if condition is not None and rec.policy == gates.GANG_POLICY:
            why = _member_problem(pod, condition)
            condition = None if why else condition
        if condition is None:
            untrusted[g] = why
        else:
            terms[g] = condition
    if not terms and not untrusted and not pod.terms and not pod.untrusted:
        return pod
    return pod.with_terms(terms, untrusted)
