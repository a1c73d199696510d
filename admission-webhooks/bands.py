"""Priority bands at pod creation: every Pilotfish pod runs at its band's PriorityClass.

The band comes from the pod's `pilotfish.io/band` label (its workload's controller sets it),
else the namespace's `pilotfish.io/band` label (the namespace default). A pod whose explicit
priorityClassName contradicts its band is refused: production is never claimed for free.

The built-in Priority admission plugin runs before webhooks and has already written
`spec.priority` (from no class: 0). Setting `priorityClassName` alone would leave that 0 in
place, so the patch also removes `spec.priority` and `spec.preemptionPolicy`; the API server
re-runs its built-in mutating plugins after a webhook mutates, and Priority then fills both
from the band's class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pilotfish import names

Patch = list[dict[str, Any]]


@dataclass(frozen=True)
class BandChoice:
    band: str
    source: str  # "pod label" | "namespace default"


def resolve(pod: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> BandChoice | None:
    """The pod's band and where it came from; None for pods outside Pilotfish's bands."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(names.LABEL_BAND):
        return BandChoice(str(labels[names.LABEL_BAND]), "pod label")
    if namespace_labels.get(names.LABEL_BAND):
        return BandChoice(str(namespace_labels[names.LABEL_BAND]), "namespace default")
    return None


def problem(pod: Mapping[str, Any], choice: BandChoice) -> str | None:
    """Why the pod cannot be admitted in its band, or None."""
    if choice.band not in names.BANDS:
        return (
            f"band {choice.band!r} (from the {choice.source} {names.LABEL_BAND}) is not "
            f"one of {', '.join(names.BANDS)}"
        )
    explicit = (pod.get("spec") or {}).get("priorityClassName")
    want = names.PRIORITY_CLASS[choice.band]
    if explicit and explicit != want:
        return (
            f"spec.priorityClassName {explicit!r} contradicts the pod's band "
            f"{choice.band!r} (from the {choice.source} {names.LABEL_BAND}): "
            f"{choice.band} pods run at {want!r}"
        )
    return None


def patch(pod: Mapping[str, Any], choice: BandChoice, scheduler_name: str | None) -> Patch:
    """JSON patch giving the pod its band's class (and scheduler, when one is configured)."""
    spec = pod.get("spec") or {}
    labels = (pod.get("metadata") or {}).get("labels")
    ops: Patch = []
    if labels is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    if (labels or {}).get(names.LABEL_BAND) != choice.band:
        ops.append(
            {"op": "add", "path": "/metadata/labels/pilotfish.io~1band", "value": choice.band}
        )
    want = names.PRIORITY_CLASS[choice.band]
    if spec.get("priorityClassName") != want:
        ops.append({"op": "add", "path": "/spec/priorityClassName", "value": want})
        for field in ("priority", "preemptionPolicy"):
            if field in spec:
                ops.append({"op": "remove", "path": f"/spec/{field}"})
    if scheduler_name and spec.get("schedulerName") in (None, "default-scheduler"):
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    return ops
