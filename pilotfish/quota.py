"""Quota amounts on the pod's side: what a pod asks, which team and band it is charged to,
whether it holds quota, and the wire form of amounts. What a TeamQuota has handed out and
whether it may hand out more is the ledger's (`pilotfish.ledger`).

Quantities are exact (`Fraction`, read and written by `pilotfish.quantity`): a hundred 10m
CPU requests make exactly one core, and a quota is never exceeded by rounding. Resource names
are canonical: `cpu` (cores), `memory` (bytes), `gpus` (`nvidia.com/gpu`), `pods`, and any
other extended resource by its own name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from pilotfish import gates, names, quantity

GPU_RESOURCE: Final = "nvidia.com/gpu"
Resources = dict[str, Fraction]

# The one parser: exact, bounded in cost, saturating beyond any node (QuantityError if not
# a quantity at all).
parse_quantity = quantity.parse


def format_quantity(resource: str, value: Fraction) -> str:
    """The API server's form of the amount: cores as 2 or 500m, memory as 4Gi or 1536Mi."""
    return quantity.canonical(value, quantity.format_for(resource))


def canonical(name: str) -> str:
    return "gpus" if name == GPU_RESOURCE else name


# A batch pod placed on reclaimed capacity asks for it as batch.pilotfish.io/* (the webhook
# moves its cpu and memory there, `pilotfish.webhooks.reclaim`); it is still charged as the
# cpu (millicores there) and memory it asked for, so translating it changes no quota.
_BATCH_AS: Final = {
    names.BATCH_CPU: ("cpu", Fraction(1, 1000)),
    names.BATCH_MEMORY: ("memory", Fraction(1)),
}


def _charged(name: str, value: Any) -> tuple[str, Fraction]:
    """A request as the canonical resource it is charged as, and the amount."""
    as_plain = _BATCH_AS.get(name)
    if as_plain is not None:
        return as_plain[0], parse_quantity(value) * as_plain[1]
    return canonical(name), parse_quantity(value)


def raw(name: str, value: Any) -> tuple[str, Fraction]:
    """A request under its own resource name (what the scheduler counts)."""
    return name, parse_quantity(value)


def summed_requests(
    spec: Mapping[str, Any], charge: Callable[[str, Any], tuple[str, Fraction]] = raw
) -> Resources:
    """A pod spec's requests as the scheduler sums them: containers summed, init containers
    as their maximum, plus overhead; each entry named and valued by `charge`."""
    total: Resources = {}
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            name, value = charge(k, v)
            total[name] = total.get(name, Fraction(0)) + value
    for c in spec.get("initContainers") or []:
        each: Resources = {}
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            name, value = charge(k, v)
            each[name] = each.get(name, Fraction(0)) + value
        for k, v in each.items():
            total[k] = max(total.get(k, Fraction(0)), v)
    for k, v in (spec.get("overhead") or {}).items():
        name, value = charge(k, v)
        total[name] = total.get(name, Fraction(0)) + value
    return total


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """What a pod asks for: containers summed, init containers as their maximum, plus 1 pod
    (`batch.pilotfish.io/cpu` and `/memory` counted as the cpu and memory they stand for)."""
    total = summed_requests(pod.get("spec") or {}, _charged)
    total["pods"] = Fraction(1)
    return total


def add(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Fraction(0)) + v
    return out


@dataclass(frozen=True)
class Excess:
    """One limited resource and where it stands: `used` held, `ask` wanted, `limit`."""

    resource: str
    used: Fraction
    limit: Fraction
    ask: Fraction


def excess(
    limits: Mapping[str, Fraction], used: Mapping[str, Fraction], ask: Mapping[str, Fraction]
) -> list[Excess]:
    """Every limited resource that `used + ask` would exceed (unlimited ones never do)."""
    return [e for e in standing(limits, used, ask) if e.ask > 0 and e.used + e.ask > e.limit]


def standing(
    limits: Mapping[str, Fraction], used: Mapping[str, Fraction], ask: Mapping[str, Fraction]
) -> list[Excess]:
    """Every limited resource, exceeded or not, in name order."""
    return [
        Excess(r, used.get(r, Fraction(0)), limits[r], ask.get(r, Fraction(0)))
        for r in sorted(limits)
    ]


def describe(team: str, band: str, e: Excess) -> str:
    """ "team payments, production cpu: 96 of 100 used, pod asks 8" """
    f = format_quantity
    return (
        f"team {team}, {band} {e.resource}: {f(e.resource, e.used)} of "
        f"{f(e.resource, e.limit)} used, pod asks {f(e.resource, e.ask)}"
    )


def usage_text(e: Excess) -> str:
    """ "cpu 6/10 used, pod asks 2" """
    f = format_quantity
    return (
        f"{e.resource} {f(e.resource, e.used)}/{f(e.resource, e.limit)} used, "
        f"pod asks {f(e.resource, e.ask)}"
    )


def pod_band(pod: Mapping[str, Any], default: str = "batch") -> str:
    """The band the pod was admitted in: its Pilotfish priority class, else its band label,
    else `default`.

    The class comes first because the API server never lets it change after creation, and
    the webhook sets it from the band at admission: relabelling a running pod cannot move
    its charge to another band. The label covers pods admitted without the webhooks
    (namespaces that opt out).
    """
    pc = (pod.get("spec") or {}).get("priorityClassName")
    for band, cls in names.PRIORITY_CLASS.items():
        if pc == cls:
            return band
    meta = pod.get("metadata") or {}
    label = (meta.get("labels") or {}).get(names.LABEL_BAND)
    if label in names.BANDS:
        return str(label)
    return default


def pod_team(pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None) -> str | None:
    """The team a pod is charged to: its namespace's `pilotfish.io/team` label, or None.

    Never the pod's own label: anyone who may create a pod may write that, while only the
    platform may label a namespace (the built-in `edit` role cannot update namespaces). The
    webhook copies the namespace's team onto the pod at creation for readers that only see
    the pod; `pod` stays in the signature so callers read as "the team of this pod".
    """
    del pod
    team = (namespace_labels or {}).get(names.LABEL_TEAM)
    return team if isinstance(team, str) and team else None


def counts_against_quota(pod: Mapping[str, Any]) -> bool:
    """Pods that hold quota: admitted, not finished, not being deleted, not held by our gates."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return not any(gates.is_pilotfish_gate(g) for g in gates.scheduling_gates(pod))


def band_resources(amounts: Mapping[str, Fraction]) -> dict[str, Any]:
    """Canonical amounts as a TeamQuota BandResources object (wire form).

    Quantities as the API server's canonical strings, never JSON numbers (a number beyond
    float64 cannot be stored at all); counts as integers. Both saturate like parsed values,
    so a sum of absurd requests is still one that the API server accepts and reads back.
    """
    out: dict[str, Any] = {}
    extended: dict[str, Any] = {}
    for name, value in sorted(amounts.items()):
        if value == 0:
            continue
        if name in ("cpu", "memory"):
            out[name] = format_quantity(name, value)
        elif name in ("gpus", "pods"):
            out[name] = min(math.ceil(value), quantity.MAX)
        else:
            extended[name] = format_quantity(name, value)
    if extended:
        out["extended"] = extended
    return out


def parse_band_resources(obj: Mapping[str, Any] | None) -> Resources:
    obj = obj or {}
    out: Resources = {}
    for k in ("cpu", "memory", "gpus", "pods"):
        if obj.get(k) is not None:
            out[k] = parse_quantity(obj[k])
    for k, v in (obj.get("extended") or {}).items():
        out[k] = parse_quantity(v)
    return out
