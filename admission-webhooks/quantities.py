"""Quantities beyond every sane bound, refused at admission: in pods and in TeamQuotas.

The API server accepts `cpu: 1e10000000` in a pod (decimal exponents are not capped), and
any string the CRD pattern matches in a TeamQuota. Pilotfish reads such a value in bounded
time (`pilotfish.quantity` saturates it), but no node or quota holds more than
`quantity.MAX` of anything, so a pod asking for more can never run and a quota granting more
means nothing: both are refused here with the field, the value and the bound, instead of
sitting unschedulable or making every sum saturate.

Pods: `pod_problems`, judged with the tenancy rules by the mutating review (so a pod that
breaks both hears of both at once) and again on the final pod as `beyond_bounds`, one of
`podchecks.POD_CHECKS`. TeamQuotas are cluster-scoped and have a review of their own,
`validate_teamquota` (`/validate/teamquotas`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from pilotfish import quantity
from pilotfish.webhooks.admission import Decision

if TYPE_CHECKING:  # podchecks lists `beyond_bounds` among its checks
    from pilotfish.webhooks.podchecks import PodAdmission

BOUND: Final = (
    f"is beyond the largest quantity Pilotfish accepts ({quantity.MAX}, the most a "
    "64-bit integer holds in whole units; more than any node or quota holds)"
)
_CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")
_TEAMQUOTA_BANDS: Final = ("production", "batch", "best-effort")
_TEAMQUOTA_AMOUNTS: Final = ("cpu", "memory", "gpus", "pods")


def _key(name: str) -> str:
    """A resource name as a path element: `.cpu`, but `[nvidia.com/gpu]`."""
    return f".{name}" if name.replace("-", "").isalnum() else f"[{name}]"


def _amounts(path: str, amounts: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(amounts, Mapping):
        for name, value in amounts.items():
            yield f"{path}{_key(str(name))}", value


def _requirements(path: str, resources: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(resources, Mapping):
        for kind in ("requests", "limits"):
            yield from _amounts(f"{path}.{kind}", resources.get(kind))


def pod_quantities(pod: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field path, value) of every quantity in a pod's spec."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return
    for kind in _CONTAINER_LISTS:
        containers = spec.get(kind)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(container, Mapping):
                where = f"spec.{kind}[{i}].resources"
                yield from _requirements(where, container.get("resources"))
    yield from _requirements("spec.resources", spec.get("resources"))
    yield from _amounts("spec.overhead", spec.get("overhead"))


def teamquota_quantities(tq: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field path, value) of every amount in a TeamQuota's spec (its status is Pilotfish's,
    written saturated, and not reviewed)."""
    spec = tq.get("spec")
    bands = spec.get("bands") if isinstance(spec, Mapping) else None
    if not isinstance(bands, Mapping):
        return
    for band in _TEAMQUOTA_BANDS:
        amounts = bands.get(band)
        if not isinstance(amounts, Mapping):
            continue
        where = f"spec.bands.{band}"
        for name in _TEAMQUOTA_AMOUNTS:
            if amounts.get(name) is not None:
                yield f"{where}.{name}", amounts[name]
        yield from _amounts(f"{where}.extended", amounts.get("extended"))


def problem(path: str, value: Any) -> str | None:
    """Why the quantity at `path` is refused, or None."""
    try:
        amount = quantity.parse(value)
    except quantity.QuantityError as e:
        return f"{path}: {e}"
    if quantity.is_beyond(amount):
        return f"{path}: {quantity.shown(value)} {BOUND}"
    return None


def problems(found: Iterator[tuple[str, Any]]) -> list[str]:
    return [p for p in (problem(path, value) for path, value in found) if p]


def pod_problems(pod: Mapping[str, Any]) -> list[str]:
    """Every request, limit or overhead of the pod beyond the bound (or not a quantity)."""
    return problems(pod_quantities(pod))


def beyond_bounds(pod: PodAdmission) -> list[str]:
    """A pod check (`podchecks.POD_CHECKS`): the final pod, after every mutation."""
    return pod_problems(pod.pod)


def validate_teamquota(request: Mapping[str, Any]) -> Decision:
    """The review of a TeamQuota CREATE or UPDATE: deny amounts beyond the bound."""
    obj = request.get("object")
    if request.get("operation") not in ("CREATE", "UPDATE") or not isinstance(obj, Mapping):
        return Decision.allow()
    found = problems(teamquota_quantities(obj))
    if not found:
        return Decision.allow()
    name = (obj.get("metadata") or {}).get("name") or request.get("name") or ""
    return Decision.deny(f"TeamQuota {name}: " + "; ".join(found), code=422, reason="Invalid")
