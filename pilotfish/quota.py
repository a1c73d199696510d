"""Team quota arithmetic shared by admission, the quota gate and the usage reconciler.

Quantities are exact (`Fraction`): a hundred 10m CPU requests make exactly one core, and a
quota is never exceeded by rounding. Resource names are canonical: `cpu` (cores), `memory` (bytes),
`gpus` (`nvidia.com/gpu`), `pods`, and any other extended resource by its own name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from pilotfish import gates, names

GPU_RESOURCE: Final = "nvidia.com/gpu"
Resources = dict[str, Fraction]

_SUFFIX: Final[dict[str, Fraction]] = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity ("500m", "4Gi", "1e3", 2) as an exact number."""
    if isinstance(value, int | float):
        return Fraction(value)
    m = _QUANTITY.match(value.strip())
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, exponent, suffix = m.groups()
    out = Fraction(number) * _SUFFIX[suffix]
    if exponent:
        out *= Fraction(10) ** int(exponent)
    return out


def format_quantity(resource: str, value: Fraction) -> str:
    """A short human form: cores as 2 or 500m, memory in Gi/Mi, counts as integers."""
    if resource == "cpu":
        if value.denominator == 1:
            return str(value.numerator)
        return f"{round(value * 1000)}m"
    if resource == "memory":
        for unit in ("Ti", "Gi", "Mi", "Ki"):
            scaled = value / _SUFFIX[unit]
            if scaled >= 1:
                text = f"{float(scaled):.1f}".removesuffix(".0")
                return f"{text}{unit}"
        return str(int(value))
    return str(int(value)) if value.denominator == 1 else f"{float(value):g}"


def canonical(name: str) -> str:
    return "gpus" if name == GPU_RESOURCE else name


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """What a pod asks for: containers summed, init containers as their maximum, plus 1 pod."""
    spec = pod.get("spec") or {}
    total: Resources = {}
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[canonical(k)] = total.get(canonical(k), Fraction(0)) + parse_quantity(v)
    for c in spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[canonical(k)] = max(total.get(canonical(k), Fraction(0)), parse_quantity(v))
    for k, v in (spec.get("overhead") or {}).items():
        total[canonical(k)] = total.get(canonical(k), Fraction(0)) + parse_quantity(v)
    total["pods"] = Fraction(1)
    return total


def add(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Fraction(0)) + v
    return out


def band_limits(quota: Mapping[str, Any], band: str) -> Resources | None:
    """The limits a TeamQuota object sets for `band`; None when it does not declare the band."""
    spec_band = ((quota.get("spec") or {}).get("bands") or {}).get(band)
    if spec_band is None:
        return None
    out: Resources = {}
    for key in ("cpu", "memory", "gpus", "pods"):
        if spec_band.get(key) is not None:
            out[key] = parse_quantity(spec_band[key])
    for k, v in (spec_band.get("extended") or {}).items():
        out[canonical(k)] = parse_quantity(v)
    return out


@dataclass(frozen=True)
class Excess:
    resource: str
    used: Fraction
    limit: Fraction
    ask: Fraction


def excess(
    limits: Mapping[str, Fraction], used: Mapping[str, Fraction], ask: Mapping[str, Fraction]
) -> list[Excess]:
    """Every limited resource that `used + ask` would exceed (unlimited ones never do)."""
    out = []
    for resource in sorted(limits):
        want = ask.get(resource, Fraction(0))
        have = used.get(resource, Fraction(0))
        if want > 0 and have + want > limits[resource]:
            out.append(Excess(resource, have, limits[resource], want))
    return out


def describe(team: str, band: str, e: Excess) -> str:
    """ "team payments, production cpu: 96 of 100 used, pod asks 8" """
    f = format_quantity
    return (
        f"team {team}, {band} {e.resource}: {f(e.resource, e.used)} of "
        f"{f(e.resource, e.limit)} used, pod asks {f(e.resource, e.ask)}"
    )


def pod_band(pod: Mapping[str, Any], default: str = "batch") -> str:
    """The pod's band: its label, else its priority class, else `default`."""
    meta = pod.get("metadata") or {}
    label = (meta.get("labels") or {}).get(names.LABEL_BAND)
    if label in names.BANDS:
        return str(label)
    pc = (pod.get("spec") or {}).get("priorityClassName")
    for band, cls in names.PRIORITY_CLASS.items():
        if pc == cls:
            return band
    return default


def pod_team(
    pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None = None
) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(names.LABEL_TEAM) or (namespace_labels or {}).get(names.LABEL_TEAM)


def counts_against_quota(pod: Mapping[str, Any]) -> bool:
    """Pods that hold quota: admitted, not finished, not being deleted, not held by our gates."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return not any(gates.is_pilotfish_gate(g) for g in gates.scheduling_gates(pod))


def usage(pods: Iterable[Mapping[str, Any]]) -> Resources:
    total: Resources = {}
    for pod in pods:
        if counts_against_quota(pod):
            total = add(total, pod_requests(pod))
    return total


def quantity_string(value: Fraction) -> str | int:
    """An exact quantity for a status field: an integer when whole, else milli or nano units."""
    if value.denominator == 1:
        return value.numerator
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return f"{round(value * 10**9)}n"


def band_resources(amounts: Mapping[str, Fraction]) -> dict[str, Any]:
    """Canonical amounts as a TeamQuota BandResources object (wire form)."""
    out: dict[str, Any] = {}
    extended: dict[str, Any] = {}
    for name, value in sorted(amounts.items()):
        if value == 0:
            continue
        if name in ("cpu", "memory"):
            out[name] = quantity_string(value)
        elif name in ("gpus", "pods"):
            out[name] = int(value)
        else:
            extended[name] = quantity_string(value)
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
