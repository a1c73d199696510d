"""Reclaim read back from the API's own objects, for the reclaim benchmark and e2e tests.

- A node's batch figure: `batch.pilotfish.io/cpu` / `memory` in its status, the JSON
  annotation behind it and its BatchCapacity condition (`node_figure`).
- Cluster CPU used: kwok's usage annotations (`kwok.x-k8s.io/usage-cpu`) of the pods bound
  and running, the same numbers kwok serves to Prometheus. kwok evaluates the annotation per
  container and counts 1m for a container of a pod without one (its ClusterResourceUsage
  `usage-from-annotation`), so this does the same.
- A spike's give-back from a recording: when each spiked node's figure first went down,
  when its first batch pod was evicted, when what batch holds there fit again, and whether
  any production pod was touched.

Pure: the recordings are plain API objects (dicts), so the figures are tested on objects
written by hand (tests/test_bench_reclaim.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from pilotfish import names, quantity
from pilotfish.devcluster.kwokusage import ANNOTATION_USAGE_CPU
from pilotfish.quota import pod_band

# What kwok's usage-from-annotation counts for a container of a pod without the annotation.
KWOK_DEFAULT_CPU_MILLI: Final = 1
TERMINAL: Final = ("Succeeded", "Failed")
DISRUPTION_TARGET: Final = "DisruptionTarget"
# The reclaim controller rewrites a measured figure only when it moves by more than this
# share of allocatable: a figure within it of the target has arrived.
THRESHOLD: Final = 0.02


def _milli(value: Any) -> int | None:
    try:
        return quantity.milli(str(value))
    except quantity.QuantityError:
        return None


def _whole(value: Any) -> int | None:
    try:
        return quantity.whole(str(value))
    except quantity.QuantityError:
        return None


@dataclass(frozen=True)
class NodeFigure:
    """One node's batch capacity as the API shows it: millicores and bytes (None: absent)."""

    name: str
    cpu: int | None
    memory: int | None
    capacity_cpu: int | None  # batch.pilotfish.io/cpu in status.capacity: must equal cpu
    allocatable_cpu: int  # the node's own cpu allocatable, millicores
    allocatable_memory: int  # bytes
    condition_status: str | None
    reason: str | None
    message: str
    detail: dict[str, Any] = field(default_factory=dict)  # the annotation, parsed

    @property
    def measured(self) -> bool:
        return self.condition_status == "True" and self.reason == "Measured"

    def shown(self, resource: str, key: str) -> Fraction | None:
        """A figure of the annotation (`p95`, `margin`, ...) in millicores or bytes."""
        raw = (self.detail.get(resource) or {}).get(key)
        if raw is None:
            return None
        try:
            amount = quantity.parse(str(raw))
        except quantity.QuantityError:
            return None
        return amount * 1000 if resource == "cpu" else amount


def node_figure(node: Mapping[str, Any]) -> NodeFigure:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    alloc = status.get("allocatable") or {}
    cap = status.get("capacity") or {}
    cond: Mapping[str, Any] = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == names.CONDITION_BATCH_CAPACITY
        ),
        {},
    )
    raw = (meta.get("annotations") or {}).get(names.ANNOTATION_RECLAIM)
    try:
        detail = json.loads(raw) if raw else {}
    except ValueError:
        detail = {"unreadable": raw}
    return NodeFigure(
        name=str(meta.get("name", "")),
        cpu=_whole(alloc[names.BATCH_CPU]) if names.BATCH_CPU in alloc else None,
        memory=_whole(alloc[names.BATCH_MEMORY]) if names.BATCH_MEMORY in alloc else None,
        capacity_cpu=_whole(cap[names.BATCH_CPU]) if names.BATCH_CPU in cap else None,
        allocatable_cpu=_milli(alloc.get("cpu", "0")) or 0,
        allocatable_memory=_whole(alloc.get("memory", "0")) or 0,
        condition_status=cond.get("status"),
        reason=cond.get("reason"),
        message=str(cond.get("message") or ""),
        detail=detail if isinstance(detail, dict) else {},
    )


def live(pod: Mapping[str, Any]) -> bool:
    """Bound, not ended, not on its way out: a pod that holds (and uses) capacity."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return (
        bool((pod.get("spec") or {}).get("nodeName"))
        and status.get("phase") not in TERMINAL
        and not meta.get("deletionTimestamp")
    )


def running(pod: Mapping[str, Any]) -> bool:
    return live(pod) and (pod.get("status") or {}).get("phase") == "Running"


def cpu_usage_milli(pod: Mapping[str, Any]) -> int:
    """What kwok reports the pod uses: its annotation per container (1m each without one)."""
    containers = len((pod.get("spec") or {}).get("containers") or [])
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_USAGE_CPU)
    each = _milli(raw) if raw is not None else KWOK_DEFAULT_CPU_MILLI
    return containers * (each or 0)


def batch_requests(pod: Mapping[str, Any], resource: str = names.BATCH_CPU) -> int:
    """The pod's summed `batch.pilotfish.io/*` requests (0: an untranslated pod)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        raw = ((c.get("resources") or {}).get("requests") or {}).get(resource)
        if raw is not None:
            total += _whole(raw) or 0
    return total


def allocated(pods: Iterable[Mapping[str, Any]], node: str) -> int:
    """Batch cpu (millicores) the node's live pods hold, as the reclaim controller sums it."""
    return sum(batch_requests(p) for p in pods if live(p) and p["spec"]["nodeName"] == node)


@dataclass(frozen=True)
class Utilisation:
    capacity_cores: float
    used_cores: float
    production_cores: float
    batch_cores: float
    batch_pods: int
    pending_batch_pods: int

    @property
    def ratio(self) -> float:
        return self.used_cores / self.capacity_cores if self.capacity_cores else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "used_over_capacity": round(self.ratio, 4),
            "used_cores": round(self.used_cores, 3),
            "capacity_cores": round(self.capacity_cores, 3),
            "production_cores": round(self.production_cores, 3),
            "batch_cores": round(self.batch_cores, 3),
            "batch_pods_running": self.batch_pods,
            "batch_pods_pending": self.pending_batch_pods,
        }


def utilisation(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> Utilisation:
    """CPU used ÷ capacity over `nodes`: the usage of their running pods, by band."""
    names_ = set()
    capacity = 0
    for n in nodes:
        names_.add((n.get("metadata") or {}).get("name"))
        capacity += _milli(((n.get("status") or {}).get("capacity") or {}).get("cpu", "0")) or 0
    production = batch = 0
    running_batch = pending_batch = 0
    for p in pods:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        if status.get("phase") in TERMINAL or meta.get("deletionTimestamp"):
            continue
        band = pod_band(p, default="batch")
        if not (p.get("spec") or {}).get("nodeName"):
            pending_batch += band != "production"
            continue
        if not running(p) or p["spec"]["nodeName"] not in names_:
            continue
        used = cpu_usage_milli(p)
        if band == "production":
            production += used
        else:
            batch += used
            running_batch += 1
    return Utilisation(
        capacity / 1000,
        (production + batch) / 1000,
        production / 1000,
        batch / 1000,
        running_batch,
        pending_batch,
    )


@dataclass(frozen=True)
class Sample:
    """One look at the cluster during the spike: each node's figure, the batch cpu its
    pods hold, the batch pods bound to it and the production pods alive or leaving."""

    at: float
    figures: dict[str, NodeFigure]
    allocated: dict[str, int]
    batch_on: dict[str, frozenset[str]]  # node -> uids of its live batch pods
    production: frozenset[str]  # uids of production pods alive and not leaving
    production_disrupted: frozenset[str]  # uids leaving, or marked DisruptionTarget


def disrupted(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return any(
        c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def sample(
    at: float,
    nodes: Iterable[Mapping[str, Any]],
    batch_pods: Iterable[Mapping[str, Any]],
    production_pods: Iterable[Mapping[str, Any]],
) -> Sample:
    batch = list(batch_pods)
    figures = {f.name: f for f in map(node_figure, nodes)}
    on: dict[str, set[str]] = {n: set() for n in figures}
    for p in batch:
        if live(p) and p["spec"]["nodeName"] in on:
            on[p["spec"]["nodeName"]].add(p["metadata"]["uid"])
    prod = list(production_pods)
    return Sample(
        at,
        figures,
        {n: allocated(batch, n) for n in figures},
        {n: frozenset(u) for n, u in on.items()},
        frozenset(p["metadata"]["uid"] for p in prod if live(p) and not disrupted(p)),
        frozenset(p["metadata"]["uid"] for p in prod if disrupted(p)),
    )


def _first(samples: list[Sample], since: float, holds: Any) -> float | None:
    return next((s.at - since for s in samples if s.at >= since and holds(s)), None)


def give_back(samples: list[Sample], spiked: Mapping[str, int], spike_at: float) -> dict[str, Any]:
    """Seconds from the spike until, on every spiked node: its figure went down, its first
    batch pod was evicted, and the figure came down to what the spike leaves (within
    THRESHOLD of allocatable of `spiked[node]`, millicores) with its batch pods fitting it
    (None: never seen); and which pods went where they should not: batch on other nodes,
    production anywhere.

    The baseline is the last sample before the spike."""
    before = [s for s in samples if s.at < spike_at]
    after = [s for s in samples if s.at >= spike_at]
    if not before or not after:
        return {"error": "no samples on both sides of the spike"}
    base = before[-1]
    start_cpu = {n: base.figures[n].cpu for n in spiked if n in base.figures}
    start_pods = {n: base.batch_on.get(n, frozenset()) for n in spiked}

    def reduced(n: str) -> Any:
        def holds(s: Sample) -> bool:
            was, now = start_cpu.get(n), s.figures[n].cpu if n in s.figures else None
            return was is not None and now is not None and now < was

        return holds

    def evicted(n: str) -> Any:
        return lambda s: bool(start_pods[n] - s.batch_on.get(n, frozenset()))

    def fits(n: str) -> Any:
        def holds(s: Sample) -> bool:
            fig = s.figures.get(n)
            if fig is None or fig.cpu is None:
                return False
            down = fig.cpu <= spiked[n] + THRESHOLD * fig.allocatable_cpu
            return down and s.allocated.get(n, 0) <= fig.cpu

        return holds

    def worst(make: Any) -> float | None:
        times = [_first(after, spike_at, make(n)) for n in spiked]
        return None if any(t is None for t in times) else max(t for t in times if t is not None)

    last = after[-1]
    others = [n for n in base.batch_on if n not in spiked]
    moved_elsewhere = sum(len(base.batch_on[n] - last.batch_on.get(n, frozenset())) for n in others)
    lost = base.production - last.production
    touched = set(lost).union(*(s.production_disrupted for s in after))
    return {
        "spiked_nodes": len(spiked),
        "to_reduced_s": _round(worst(reduced)),
        "to_first_eviction_s": _round(worst(evicted)),
        "to_fits_s": _round(worst(fits)),
        "batch_evicted_on_spiked": sum(
            len(start_pods[n] - last.batch_on.get(n, frozenset())) for n in spiked
        ),
        "batch_left_other_nodes": moved_elsewhere,
        "figure_before_cores": {n: _cores(v) for n, v in sorted(start_cpu.items())},
        "figure_after_cores": {n: _cores(last.figures[n].cpu) for n in spiked if n in last.figures},
        "production_evictions": len(touched),
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _cores(milli: int | None) -> float | None:
    return None if milli is None else milli / 1000


def verdict(
    ratio: float | None,
    spike: Mapping[str, Any],
    interval: float,
    target_ratio: float,
    production_lost: int = 0,
) -> dict[str, Any]:
    """The figures the targets are judged on (the spike's in cycles of the reclaim
    controller) and whether each is met. `production_lost`: production pods gone over the
    whole run, spike or not."""

    def cycles(key: str) -> float | None:
        v = spike.get(key)
        return None if v is None else round(float(v) / interval, 2)

    reduced, evicted = cycles("to_reduced_s"), cycles("to_first_eviction_s")
    prod = spike.get("production_evictions")
    checks = {
        "used_over_capacity_on": ratio is not None and ratio >= target_ratio,
        "spike_to_reduced_cycles": reduced is not None and reduced <= 1.0,
        "spike_to_first_eviction_cycles": evicted is not None and evicted <= 1.0,
        "production_evictions": prod == 0 and production_lost == 0,
    }
    return {
        "figures": {
            "used_over_capacity_on": None if ratio is None else round(ratio, 4),
            "spike_to_reduced_cycles": reduced,
            "spike_to_first_eviction_cycles": evicted,
            "spike_to_fits_cycles": cycles("to_fits_s"),
            "production_evictions": prod,
            "production_pods_lost_whole_run": production_lost,
        },
        "checks": checks,
        "met": all(checks.values()),
    }
