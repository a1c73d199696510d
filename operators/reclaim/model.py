"""What the reclaim controller reads: each node's allocatable and current batch figure, the
pods bound to it split into reserved (production, system, untranslated) and batch (those
asking for `batch.pilotfish.io/*`), and the usage Prometheus reports. Parsed once into
views the pure phases see.

Amounts are exact (`Fraction`) in the units batch capacity is written in: millicores for
cpu, bytes for memory. Prometheus's values arrive as decimal strings; they are read back
from their shortest decimal form, so a p95 of 3.2 cores is 3200 millicores, not
3200.0000000000005, and 8 - 3.2 - 0.8 is 4 cores exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from pilotfish import names, quantity
from pilotfish.promql import Sample
from pilotfish.quota import pod_band, summed_requests
from pilotfish.timeutil import parse_time

CONTROLLER: Final = "reclaim"
REPORTING_CONTROLLER: Final = "pilotfish.io/reclaim"

CPU: Final = "cpu"
MEMORY: Final = "memory"
RESOURCES: Final = (CPU, MEMORY)
BATCH: Final = {CPU: names.BATCH_CPU, MEMORY: names.BATCH_MEMORY}
# Plain quantities in these units: cpu cores as millicores, memory bytes as bytes.
SCALE: Final = {CPU: Fraction(1000), MEMORY: Fraction(1)}
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})

# A pod's cpu p95 is a quantile of rate(...[1m]), and rate divides by the whole range even
# while the series is younger than it: for its first minute (plus discovery and a scrape) a
# new pod's rate reads low, so its cpu counts as its request until then, as an unsampled
# pod's does, instead of handing batch capacity that is withdrawn (by eviction) a minute
# later. Its memory working set is a gauge, right from its first sample.
YOUNG_CPU_SECONDS: Final = 90.0

Amounts = dict[str, Fraction]
PodKey = tuple[str, str, str]  # (node, namespace, pod), as Prometheus labels a series


def from_float(value: float, scale: Fraction = Fraction(1)) -> Fraction | None:
    """A Prometheus value as an exact amount; None for NaN, ±Inf or a negative number."""
    if not math.isfinite(value) or value < 0:
        return None
    return Fraction(repr(value)) * scale


@dataclass(frozen=True)
class Reserved:
    """A pod whose requests hold capacity batch may only borrow: p95 None = no sample."""

    key: str
    band: str
    requests: Amounts
    p95: dict[str, Fraction | None]


@dataclass(frozen=True)
class BatchPod:
    namespace: str
    name: str
    uid: str
    band: str
    started: float  # epoch seconds it was created (the projection keeps no startTime)
    requests: Amounts  # batch.pilotfish.io/* in millicores and bytes

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Usage:
    """One cycle's answers: p95 per (node, namespace, pod) and resource, and how old each
    node's newest sample is."""

    p95: dict[str, dict[PodKey, Fraction]] = field(default_factory=dict)
    age: dict[str, float] = field(default_factory=dict)
    at: float | None = None  # wall time (epoch seconds) of the answers


def usage_from(
    cpu: Iterable[Sample],
    memory: Iterable[Sample],
    ages: Iterable[Sample],
    at: float | None = None,
) -> Usage:
    p95: dict[str, dict[PodKey, Fraction]] = {CPU: {}, MEMORY: {}}
    for resource, samples in ((CPU, cpu), (MEMORY, memory)):
        for s in samples:
            key = (s.labels.get("node", ""), s.labels.get("namespace", ""), s.labels.get("pod", ""))
            amount = from_float(s.value, SCALE[resource])
            if all(key) and amount is not None:
                p95[resource][key] = amount
    age = {
        s.labels["node"]: s.value for s in ages if s.labels.get("node") and math.isfinite(s.value)
    }
    return Usage(p95, age, at)


@dataclass(frozen=True)
class NodeInputs:
    name: str
    uid: str
    resource_version: str
    allocatable: Amounts  # A, per resource
    current: dict[str, int | None]  # the batch figure the node carries (None: absent)
    reserved: tuple[Reserved, ...]
    batch_pods: tuple[BatchPod, ...]  # running or pending, not terminating
    age: float | None  # seconds since its newest usage sample; None: none in the lookback
    conditions: tuple[Mapping[str, Any], ...] = ()
    annotation: str | None = None

    @property
    def condition(self) -> Mapping[str, Any] | None:
        return next(
            (c for c in self.conditions if c.get("type") == names.CONDITION_BATCH_CAPACITY),
            None,
        )

    def allocated(self) -> Amounts:
        return {
            r: sum((p.requests.get(r, Fraction(0)) for p in self.batch_pods), Fraction(0))
            for r in RESOURCES
        }


def _amount(values: Mapping[str, Any], name: str, scale: Fraction) -> Fraction | None:
    raw = values.get(name)
    if raw is None:
        return None
    try:
        return quantity.parse(raw) * scale
    except quantity.QuantityError:
        return None


def current_figure(status: Mapping[str, Any]) -> dict[str, int | None]:
    """The node's batch figure, when its capacity and allocatable agree on it (else None:
    written again)."""
    out: dict[str, int | None] = {}
    for r in RESOURCES:
        alloc = _amount(status.get("allocatable") or {}, BATCH[r], Fraction(1))
        cap = _amount(status.get("capacity") or {}, BATCH[r], Fraction(1))
        out[r] = int(alloc) if alloc is not None and alloc == cap and alloc >= 0 else None
    return out


def _started(meta: Mapping[str, Any], status: Mapping[str, Any]) -> float:
    for raw in (status.get("startTime"), meta.get("creationTimestamp")):
        if raw:
            try:
                return parse_time(str(raw)).timestamp()
            except ValueError:
                continue
    return 0.0


def split_pods(
    node: str, pods: Iterable[Mapping[str, Any]], usage: Usage
) -> tuple[tuple[Reserved, ...], tuple[BatchPod, ...]]:
    """The node's pods that hold capacity: reserved (no batch request) with their p95, and
    batch pods that are not already leaving."""
    reserved: list[Reserved] = []
    batch: list[BatchPod] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        if spec.get("nodeName") != node or status.get("phase") in TERMINAL_PHASES:
            continue
        try:
            asked = summed_requests(spec)
        except quantity.QuantityError:
            asked = {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        band = pod_band(pod, default="")
        if any(asked.get(BATCH[r], Fraction(0)) > 0 for r in RESOURCES):
            if meta.get("deletionTimestamp"):
                continue  # evicted already: leaving, and no longer the one to evict
            batch.append(
                BatchPod(
                    ns,
                    name,
                    str(meta.get("uid", "")),
                    band,
                    _started(meta, status),
                    {r: asked.get(BATCH[r], Fraction(0)) for r in RESOURCES},
                )
            )
            continue
        requests = {r: asked.get(r, Fraction(0)) * SCALE[r] for r in RESOURCES}
        p95 = {r: usage.p95.get(r, {}).get((node, ns, name)) for r in RESOURCES}
        if usage.at is not None and usage.at - _started(meta, status) < YOUNG_CPU_SECONDS:
            p95[CPU] = None  # its cpu rate is still an underestimate: unknown
        reserved.append(Reserved(f"{ns}/{name}", band, requests, p95))
    return tuple(reserved), tuple(batch)


def node_inputs(
    node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], usage: Usage
) -> NodeInputs:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    name = str(meta.get("name", ""))
    allocatable = {
        r: _amount(status.get("allocatable") or {}, r, SCALE[r]) or Fraction(0) for r in RESOURCES
    }
    reserved, batch = split_pods(name, pods, usage)
    return NodeInputs(
        name=name,
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        allocatable=allocatable,
        current=current_figure(status),
        reserved=reserved,
        batch_pods=batch,
        age=usage.age.get(name),
        conditions=tuple(c for c in status.get("conditions") or [] if isinstance(c, Mapping)),
        annotation=(meta.get("annotations") or {}).get(names.ANNOTATION_RECLAIM),
    )


def node_ref(node: NodeInputs) -> dict[str, Any]:
    """The node as `EventPoster.post` takes it (Events about nodes go to `default`)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "uid": node.uid}}


def pod_ref(pod: BatchPod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
    }
