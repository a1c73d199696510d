"""Checks of a pod at creation, after mutation, composed into one validating review (pure).

Each check looks at the final pod (gates included) and returns the rules it breaks, each as
one sentence that names the gate and the rule; the review denies with all of them, so a
user fixes everything in one round. New checks (bands, team quota) are appended to
`POD_CHECKS` without touching the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from pilotfish.gates import (
    GANG_GATE,
    GANG_POLICY,
    batch_gang_problem,
    is_pilotfish_gate,
    read_record,
    scheduling_gates,
)
from pilotfish.names import GATE_PREFIX
from pilotfish.webhooks.gateview import GateView, PolicyEntry, gate_prefix
from pilotfish.webhooks.quantities import beyond_bounds
from pilotfish.webhooks.quota import QUOTA_GATE


@dataclass(frozen=True)
class PodAdmission:
    """One pod being created, and everything a check may consult about it."""

    namespace: str
    pod: Mapping[str, Any]
    view: GateView

    @cached_property
    def labels(self) -> dict[str, str]:
        return dict((self.pod.get("metadata") or {}).get("labels") or {})

    @cached_property
    def gates(self) -> list[str]:
        return scheduling_gates(self.pod)

    @cached_property
    def selecting(self) -> tuple[PolicyEntry, ...]:
        return self.view.selecting(self.namespace, self.labels)


PodCheck = Callable[[PodAdmission], list[str]]


def _listing(noun: str, items: list[str]) -> str:
    return f"{noun} {items[0]}" if len(items) == 1 else f"{noun}s {', '.join(items)}"


def undeclared_pilotfish_gates(pod: PodAdmission) -> list[str]:
    """Gates under gates.pilotfish.io/ come only from GatePolicies that select the pod.

    Otherwise anyone could hold a pod with a gate the controller has no terms for (no
    condition, no deadline): a silent stall, the failure gated release must never have.
    """
    declared = {g.name for p in pod.selecting for g in p.spec.gates}
    record = read_record(pod.pod)
    if record is not None and QUOTA_GATE in record.gates:
        declared.add(QUOTA_GATE)  # put there by the quota rule of the mutating webhook
    if record is not None and _gang_entry_policy(pod) == GANG_POLICY:
        declared.add(GANG_GATE)  # recorded by the mutating webhook; `batch_gang` judges it
    undeclared = [g for g in pod.gates if is_pilotfish_gate(g) and g not in declared]
    if not undeclared:
        return []
    verb = "is" if len(undeclared) == 1 else "are"
    return [
        f"{_listing('gate', undeclared)} {verb} not declared by any GatePolicy in namespace "
        f"{pod.namespace} that selects this pod (only GatePolicies may set {GATE_PREFIX} gates)"
    ]


def _gang_entry_policy(pod: PodAdmission) -> str | None:
    record = read_record(pod.pod)
    entry = record.gates.get(GANG_GATE) if record is not None else None
    return None if entry is None else entry.policy


def batch_gang(pod: PodAdmission) -> list[str]:
    """The batch gang gate is only for a BatchWorkload's gang tasks (`batch_gang_problem`).

    Judged again on the final pod, after every mutating webhook, since an owner reference or
    label another webhook changed would leave the gate controller a gang it cannot size. A
    GatePolicy may declare a gate of the same name for the pods it gates; that one is the
    policy's, with the policy's terms, and is judged as every GatePolicy gate is.
    """
    entry_policy = _gang_entry_policy(pod)
    if entry_policy is not None and entry_policy != GANG_POLICY:
        return []
    problem = batch_gang_problem(pod.pod)
    return [problem] if problem else []


def foreign_prefixes(pod: PodAdmission) -> list[str]:
    """A gate prefix claimed by GatePolicies of other namespaces only belongs to them.

    That tenant's release controller removes gates under its prefix; a pod of another
    namespace carrying one would be released (or held) by a controller it does not own.
    gates.pilotfish.io/ is every namespace's and is judged by `undeclared_pilotfish_gates`.
    """
    by_prefix: dict[str, list[str]] = defaultdict(list)
    for gate in pod.gates:
        if not is_pilotfish_gate(gate):
            by_prefix[gate_prefix(gate)].append(gate)
    out = []
    for prefix, gates in by_prefix.items():
        owners = pod.view.claimants(gates[0])
        if not owners or pod.namespace in owners:
            continue
        out.append(
            f"namespace {pod.namespace} may not use gate prefix {prefix} "
            f"({_listing('gate', gates)}): it belongs to GatePolicies in "
            f"{_listing('namespace', sorted(owners))}"
        )
    return out


POD_CHECKS: Final[tuple[PodCheck, ...]] = (
    undeclared_pilotfish_gates,
    batch_gang,
    foreign_prefixes,
    beyond_bounds,
)


def violations(pod: PodAdmission, checks: tuple[PodCheck, ...] = POD_CHECKS) -> list[str]:
    return [v for check in checks for v in check(pod)]
