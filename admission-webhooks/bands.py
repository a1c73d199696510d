"""Priority bands at pod creation: every pod of a tenant namespace runs in exactly one band,
at that band's PriorityClass, and is charged to that band's quota.

Where the band comes from, the first that is set:

1. the pod's `pilotfish.io/band` label (the ServiceWorkload and BatchWorkload controllers
   write it from the workload's `spec.band`);
2. the namespace's `pilotfish.io/band` label, the namespace default (only the platform
   labels namespaces);
3. the pod's `spec.priorityClassName`, when it is one of the three Pilotfish classes;
4. batch (`DEFAULT_BAND`). A pod that names no band is charged to its team's batch quota
   like any batch pod: admitted within it, held behind the quota gate beyond it, refused
   when the team has no batch quota. Refusing it instead would break every plain
   `kubectl run` for no gain: it escapes no quota either way.

Every priorityClassName maps to a band: only the three Pilotfish classes are accepted, and
one that contradicts the band is refused. System classes (`system-cluster-critical`,
`system-node-critical`) and any other class would let a tenant pick its own priority, up
to preempting the control plane's pods, outside every quota.

The band is fixed at admission: the webhook writes the label and the class, and the API
server never lets the class change afterwards (`pilotfish.quota.pod_band` reads the class
first, so a relabelled pod keeps its charge).

The built-in Priority admission plugin runs before webhooks and has already written
`spec.priority` (from no class: 0). Setting `priorityClassName` alone would leave that 0 in
place, so the patch also removes `spec.priority` and `spec.preemptionPolicy`; the API server
re-runs its built-in mutating plugins after a webhook mutates, and Priority then fills both
from the band's class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import names
from pilotfish.webhooks.patches import Op, pointer, set_entries

DEFAULT_BAND: Final = "batch"
CLASSES: Final = tuple(names.PRIORITY_CLASS[b] for b in names.BANDS)
BAND_OF_CLASS: Final = {cls: band for band, cls in names.PRIORITY_CLASS.items()}
WORKLOAD_KINDS: Final = frozenset({"ServiceWorkload", "BatchWorkload"})

Patch = list[Op]


@dataclass(frozen=True)
class BandChoice:
    band: str
    source: str  # where it came from, as "from the <source>" in messages


def _labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = (pod.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _workload(pod: Mapping[str, Any]) -> str | None:
    """ "ServiceWorkload web" when a Pilotfish workload controls the pod (for messages)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") in WORKLOAD_KINDS:
            return f"{ref['kind']} {ref.get('name', '')}"
    return None


def resolve(
    pod: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, str]
) -> BandChoice:
    """The pod's band and where it came from (see the module docstring for the order)."""
    label = _labels(pod).get(names.LABEL_BAND)
    if label:
        workload = _workload(pod)
        written = f", written by its {workload}" if workload else ""
        return BandChoice(str(label), f"pod label {names.LABEL_BAND}{written}")
    default = namespace_labels.get(names.LABEL_BAND)
    if default:
        return BandChoice(
            str(default), f"namespace default (label {names.LABEL_BAND} of namespace {namespace})"
        )
    by_class = BAND_OF_CLASS.get(str((pod.get("spec") or {}).get("priorityClassName") or ""))
    if by_class is not None:
        return BandChoice(by_class, "spec.priorityClassName")
    return BandChoice(DEFAULT_BAND, "default for pods that name no band")


def class_problem(pod: Mapping[str, Any], namespace: str) -> str | None:
    """A priorityClassName that is not a Pilotfish band's, or None."""
    explicit = (pod.get("spec") or {}).get("priorityClassName")
    if not explicit or explicit in BAND_OF_CLASS:
        return None
    return (
        f"spec.priorityClassName {explicit!r} is not allowed in namespace {namespace}: pods of "
        f"tenant namespaces run in a Pilotfish band, at {', '.join(CLASSES)}, which sets the "
        "team quota they are charged to (system and other classes are for system namespaces)"
    )


def problem(pod: Mapping[str, Any], choice: BandChoice) -> str | None:
    """Why the pod cannot be admitted in its band, or None."""
    if choice.band not in names.BANDS:
        return (
            f"band {choice.band!r} (from the {choice.source}) is not one of "
            f"{', '.join(names.BANDS)}"
        )
    explicit = (pod.get("spec") or {}).get("priorityClassName")
    want = names.PRIORITY_CLASS[choice.band]
    if explicit in BAND_OF_CLASS and explicit != want:
        return (
            f"spec.priorityClassName {explicit!r} contradicts the pod's band "
            f"{choice.band!r} (from the {choice.source}): {choice.band} pods run at {want!r}"
        )
    return None


def patch(pod: Mapping[str, Any], choice: BandChoice) -> Patch:
    """JSON patch fixing the band on the pod: its label and its band's class."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    ops: Patch = []
    if _labels(pod).get(names.LABEL_BAND) != choice.band:
        ops += set_entries(
            meta.get("labels"), ("metadata", "labels"), {names.LABEL_BAND: choice.band}
        )
    want = names.PRIORITY_CLASS[choice.band]
    if spec.get("priorityClassName") != want:
        ops.append({"op": "add", "path": pointer("spec", "priorityClassName"), "value": want})
        for field in ("priority", "preemptionPolicy"):
            if field in spec:
                ops.append({"op": "remove", "path": pointer("spec", field)})
    return ops
