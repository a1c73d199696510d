"""What the GatePolicy status handlers read: each policy as a view, and how many pods hold
each policy's gates, kept from the shared pod informer's events.

The counts are maintained per pod event (a pod's previous contribution out, its new one in),
so a handler's answer is a dictionary lookup however many pods the cluster has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pilotfish import gates
from pilotfish.api.gatepolicy import GatePolicySpec
from pilotfish.kube.informer import object_key

Obj = dict[str, Any]
# (namespace, GatePolicy name)
PolicyKey = tuple[str, str]


@dataclass(frozen=True)
class PolicyView:
    """One GatePolicy as the status decision reads it."""

    namespace: str
    name: str
    generation: int | None = None
    resource_version: str = ""
    # Gate name -> its terms (condition, timeout, expiry, retry) in wire form with defaults
    # filled in, so that two spellings of the same terms compare equal. Spec order.
    gates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    error: str = ""  # why the policy cannot be read by the model; "" when it can
    status: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> PolicyKey:
        return (self.namespace, self.name)


def _validation_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(("spec", *(str(p) for p in first["loc"])))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def policy_view(obj: Mapping[str, Any]) -> PolicyView:
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    status = obj.get("status")
    common: dict[str, Any] = {
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "generation": generation
        if isinstance(generation, int) and not isinstance(generation, bool)
        else None,
        "resource_version": str(meta.get("resourceVersion") or ""),
        "status": status if isinstance(status, Mapping) else {},
    }
    # Only the spec is the policy's author's; a status this model would not read (written by
    # a newer operator) must not make the policy itself look broken.
    try:
        spec = GatePolicySpec.model_validate(obj.get("spec"))
    except ValidationError as exc:
        return PolicyView(**common, error=_validation_error(exc))
    terms = {
        g.name: g.model_dump(by_alias=True, exclude_none=True, exclude={"name"}) for g in spec.gates
    }
    return PolicyView(**common, gates=terms)


def holds(pod: Mapping[str, Any]) -> frozenset[PolicyKey]:
    """The GatePolicies whose gates `pod` still holds: each scheduling gate on it whose
    creation record names the policy it came from. A finished pod, or one being deleted,
    holds nothing any more; a pod without a record (or a malformed one) holds no policy's."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
        "Succeeded",
        "Failed",
    ):
        return frozenset()
    record = gates.read_record(pod)
    if record is None:
        return frozenset()
    namespace = str(meta.get("namespace") or "")
    return frozenset(
        (namespace, rec.policy)
        for name in gates.scheduling_gates(pod)
        if (rec := record.gates.get(name)) is not None
    )


class GatedPods:
    """Pods holding each policy's gates, fed by the shared pod informer's handler."""

    def __init__(self, on_change: Callable[[PolicyKey], None] | None = None) -> None:
        """`on_change(policy)` runs when a policy's count changes."""
        self.on_change = on_change
        self._held: dict[str, frozenset[PolicyKey]] = {}
        self._counts: Counter[PolicyKey] = Counter()

    def observe(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        now = frozenset() if kind == "DELETED" else holds(obj)
        before = self._held.get(key, frozenset())
        if now == before:
            return
        self._counts.subtract(before - now)
        self._counts.update(now - before)
        for gone in before - now:
            if self._counts[gone] <= 0:
                del self._counts[gone]
        if now:
            self._held[key] = now
        else:
            self._held.pop(key, None)
        if self.on_change is not None:
            for policy in now ^ before:
                self.on_change(policy)

    def count(self, namespace: str, name: str) -> int:
        return self._counts.get((namespace, name), 0)
