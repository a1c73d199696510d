"""What the extender reads from a Pod or a Node: integer resources, band, workload, start.

Every quantity becomes an integer in the unit the scheduler itself compares in (CPU in
millicores, memory in bytes, GPUs and other extended resources in whole units), rounded up
as kube-scheduler rounds requests up. Integers keep the per-node arithmetic of a scheduling
call to additions and comparisons, with no `Fraction` or `Decimal` on the hot path: parsing
(`pilotfish.quantity`, cached, its cost bounded whatever the value) happens once per
informer event, or once per call for the pod being placed. A request beyond anything a node
holds saturates (2^63 units) and so fits no node, rather than costing a power of ten.

Pure: no I/O and no clock. Malformed quantities count as zero rather than raising: the
parser reads the API server's own language, so only a body that did not come from the API
server holds one, and it must not take the extender down.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

from pilotfish import names
from pilotfish import quantity as quantities
from pilotfish.timeutil import parse_time_or_none

CPU: Final = "cpu"
MEMORY: Final = "memory"
GPU: Final = "nvidia.com/gpu"
LABEL_WORKLOAD: Final = "pilotfish.io/workload"
LABEL_MACHINE_CLASS: Final = "pilotfish.io/machine-class"
LABEL_INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"

# The values of the chart's PriorityClasses (charts/pilotfish/templates/priorityclasses.yaml),
# used only for pods that carry neither a band label nor a Pilotfish priority class. Anything
# at or above production's value (system-cluster-critical, system-node-critical) counts as
# production, so the extender never offers a control-plane pod as a preemption victim.
PRODUCTION_PRIORITY: Final = 1_000_000
BATCH_PRIORITY: Final = 100_000

PRODUCTION: Final = "production"
BATCH: Final = "batch"
BEST_EFFORT: Final = "best-effort"
# Higher is more important; preemption compares bands by this rank.
BAND_RANK: Final = {BEST_EFFORT: 0, BATCH: 1, PRODUCTION: 2}
_BAND_OF_CLASS: Final = {cls: band for band, cls in names.PRIORITY_CLASS.items()}


def quantity(value: Any) -> Fraction:
    """A Kubernetes quantity ("500m", "4Gi", "1e3", 8) as an exact number; 0 if malformed."""
    try:
        return quantities.parse(value)
    except quantities.QuantityError:
        return Fraction(0)


def milli(value: Any) -> int:
    """A CPU quantity in millicores, rounded up (the scheduler's MilliValue); 0 if malformed."""
    try:
        return quantities.milli(value)
    except quantities.QuantityError:
        return 0


def whole(value: Any) -> int:
    """Memory in bytes, or a count of an extended resource, rounded up; 0 if malformed."""
    try:
        return quantities.whole(value)
    except quantities.QuantityError:
        return 0


# Per resource, how to turn its quantity into the integer unit the extender keeps.
# batch.pilotfish.io/cpu is an extended resource and so a whole number; the extender reads
# it as millicores, the unit the reclaim operator advertises it in, so that a node can offer
# batch 7.5 cores and a 500m batch pod is compared without rounding to whole cores.
_CONVERT: Final = {
    CPU: milli,
    MEMORY: whole,
    GPU: whole,
    names.BATCH_CPU: whole,
    names.BATCH_MEMORY: whole,
}
RESOURCES: Final = tuple(_CONVERT)

Requests = dict[str, int]


def _add(into: Requests, resources: Mapping[str, Any] | None) -> None:
    if not resources:
        return
    for name, convert in _CONVERT.items():
        value = resources.get(name)
        if value is not None:
            into[name] = into.get(name, 0) + convert(value)


def _maximum(into: Requests, other: Requests) -> None:
    for name, value in other.items():
        if value > into.get(name, 0):
            into[name] = value


def _requests(container: Mapping[str, Any]) -> Mapping[str, Any] | None:
    resources = container.get("resources") or {}
    requests: Mapping[str, Any] | None = resources.get("requests")
    if requests is None:
        # The API server defaults requests to limits; objects from older stores may lack it.
        requests = resources.get("limits")
    return requests


def pod_requests(spec: Mapping[str, Any]) -> Requests:
    """The pod's effective requests, computed the way kube-scheduler computes them.

    Regular containers add up; restartable init containers (sidecars) add to that and to
    every later init container; the pod needs the larger of the two, plus its overhead.
    Pod-level `spec.resources.requests` (PodLevelResources) replace CPU and memory.
    """
    total: Requests = {}
    for container in spec.get("containers") or []:
        _add(total, _requests(container))
    sidecars: Requests = {}
    init_peak: Requests = {}
    for container in spec.get("initContainers") or []:
        own: Requests = {}
        _add(own, _requests(container))
        if container.get("restartPolicy") == "Always":
            for name, value in own.items():
                total[name] = total.get(name, 0) + value
                sidecars[name] = sidecars.get(name, 0) + value
            _maximum(init_peak, sidecars)
        else:
            for name, value in sidecars.items():
                own[name] = own.get(name, 0) + value
            _maximum(init_peak, own)
    _maximum(total, init_peak)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name in (CPU, MEMORY):
        if name in pod_level:
            total[name] = _CONVERT[name](pod_level[name])
    overhead = spec.get("overhead")
    if overhead:
        _add(total, overhead)
    return {name: value for name, value in total.items() if value}


def node_allocatable(status: Mapping[str, Any]) -> Requests:
    """The node's allocatable resources (capacity when allocatable is absent)."""
    source = status.get("allocatable") or status.get("capacity") or {}
    out: Requests = {}
    _add(out, source)
    return out


def band(pod: Mapping[str, Any]) -> str:
    """The pod's band: its label, else its priority class, else its priority value.

    The label wins because it is what teams declare; the class and then the numeric priority
    cover pods created before the band webhook existed or from outside Pilotfish.
    """
    labels = (pod.get("metadata") or {}).get("labels") or {}
    label = labels.get(names.LABEL_BAND)
    if label in BAND_RANK:
        return str(label)
    spec = pod.get("spec") or {}
    by_class = _BAND_OF_CLASS.get(spec.get("priorityClassName") or "")
    if by_class is not None:
        return by_class
    return band_of_priority(spec.get("priority"))


def band_of_priority(priority: Any) -> str:
    if type(priority) is not int:
        priority = 0
    if priority >= PRODUCTION_PRIORITY:
        return PRODUCTION
    if priority >= BATCH_PRIORITY:
        return BATCH
    return BEST_EFFORT


def workload(pod: Mapping[str, Any]) -> str | None:
    """Which workload the pod is a replica of, as a key unique in the cluster, or None.

    The `pilotfish.io/workload` label names it; without the label the pod's controller
    (ReplicaSet, StatefulSet, Job) stands in, so plain Deployments spread too.
    """
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    label = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
    if label:
        return f"{namespace}/{label}"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller") and owner.get("uid"):
            return f"owner:{owner['uid']}"
    return None


def machine_class(pod: Mapping[str, Any]) -> str | None:
    """The machine class the pod asks for: annotation first, then label, else None."""
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(LABEL_MACHINE_CLASS) or (
        meta.get("labels") or {}
    ).get(LABEL_MACHINE_CLASS)
    return str(value) if value else None


def timestamp(value: Any) -> float:
    """An RFC 3339 time as seconds since the epoch; 0.0 when absent or malformed."""
    t = parse_time_or_none(value)
    return 0.0 if t is None else t.timestamp()


def start_time(pod: Mapping[str, Any]) -> float:
    """When the pod started (status.startTime), else when it was created."""
    started = timestamp((pod.get("status") or {}).get("startTime"))
    if started:
        return started
    return timestamp((pod.get("metadata") or {}).get("creationTimestamp"))
