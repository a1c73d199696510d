"""What the maintenance planner reads, parsed once from the informers' dicts.

Everything the planner decides on is derived from API state (the nodes' annotations, the
pods, the budgets' status) plus three things only this process knows: how long it has seen
each node draining and blocked (a monotonic clock, so a wall-clock jump neither ends a batch
task's grace early nor raises an alert), and the last 429 each pod's eviction got. A restarted
process loses only those: it resumes from the annotations, restarts the clocks (late, never
early) and learns the refusals again from the API server.

The pod projection (`pilotfish.kube.projections.pod`) keeps what is read here: metadata
(labels, annotations, ownerReferences, deletionTimestamp), phase, the Ready condition and the
pod's emptyDir volumes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import names
from pilotfish.operators.maintenance.budgets import (
    BudgetView,
    Selector,
    budget_view,
    budgets_of,
    meta_of,
    selectors,
)
from pilotfish.operators.maintenance.surge import (
    Key,
    SurgeView,
    surge_first,
    surge_view,
    workload_of,
)
from pilotfish.operators.nodelifecycle.model import pod_view, zone_of
from pilotfish.workloads import LABEL_BATCH

CONTROLLER: Final = "maintenance"
REPORTING_CONTROLLER: Final = "pilotfish.io/maintenance"

ORDER_GIVEN: Final = "Given"
ORDER_FEWEST_PRODUCTION: Final = "FewestProductionFirst"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Refusal:
    """The last 429 an eviction of the pod got: the budget it named, when known."""

    budget: str | None
    message: str


@dataclass(frozen=True)
class Spec:
    """spec with the CRD's defaults, so an object written before a field existed reads the
    same as one written after."""

    nodes: tuple[str, ...]
    max_concurrent: int = 1
    one_per_zone: bool = False
    order: str = ORDER_GIVEN
    blocked_after_seconds: float = 300.0
    batch_task_deadline_seconds: float = 600.0
    allow_local_storage: bool = False
    reason: str = ""


@dataclass(frozen=True)
class PodView:
    """A pod the drain has to move (DaemonSet, mirror and terminal pods never get one)."""

    ref: PodRef
    terminating: bool
    ready: bool
    local_storage: bool
    batch: bool  # a BatchWorkload task
    at_most_one: bool
    workload: Key | None  # the ServiceWorkload controlling it
    budgets: tuple[str, ...]  # "ns/name" of every PodDisruptionBudget selecting it
    refusal: Refusal | None

    @property
    def key(self) -> str:
        return self.ref.key


@dataclass(frozen=True)
class NodeView:
    name: str
    found: bool
    zone: str = ""
    unschedulable: bool = False
    draining_by: str | None = None  # ANNOTATION_DRAINING
    cordoned_by: str | None = None  # ANNOTATION_CORDONED_BY
    pods: tuple[PodView, ...] = ()
    production_pods: int = 0
    draining_for: float | None = None
    blocked_for: float | None = None


@dataclass(frozen=True)
class Observed:
    """Everything `decide` needs; built only by `observe`."""

    name: str
    generation: int | None
    spec: Spec
    nodes: tuple[NodeView, ...]  # in spec order
    budgets: Mapping[str, BudgetView]
    surge: Mapping[Key, SurgeView]
    status: Mapping[str, Any]  # the status as read, to find transitions
    now: str


def parse_spec(raw: Mapping[str, Any]) -> Spec:
    """Tolerant of a missing field (defaults) and of a wrongly typed one (the default too:
    the CRD schema refuses those, so only a hand-made object gets here)."""

    def num(field: str, default: float, low: float) -> float:
        value = raw.get(field, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= low
        return float(value) if ok else default

    def flag(field: str) -> bool:
        return raw.get(field) is True

    order = raw.get("order")
    return Spec(
        nodes=tuple(dict.fromkeys(str(n) for n in raw.get("nodes") or [])),
        max_concurrent=int(num("maxConcurrent", 1, 1)),
        one_per_zone=flag("onePerZone"),
        order=order if order in (ORDER_GIVEN, ORDER_FEWEST_PRODUCTION) else ORDER_GIVEN,
        blocked_after_seconds=num("blockedAfterSeconds", 300.0, 1),
        batch_task_deadline_seconds=num("batchTaskDeadlineSeconds", 600.0, 0),
        allow_local_storage=flag("allowLocalStorage"),
        reason=str(raw.get("reason") or ""),
    )


def has_local_storage(pod: Mapping[str, Any]) -> bool:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any(isinstance(v, Mapping) and "emptyDir" in v for v in volumes)


def _pod_views(
    node: str,
    pods: Sequence[Mapping[str, Any]],
    selectors: Sequence[Selector],
    refused: Mapping[PodRef, Refusal],
) -> tuple[tuple[PodView, ...], int]:
    views: list[PodView] = []
    production = 0
    for pod in pods:
        view = pod_view(pod)
        if view.terminal or view.daemonset or view.mirror:
            continue  # left alone: not the drain's to move
        labels = meta_of(pod).get("labels") or {}
        production += labels.get(names.LABEL_BAND) == "production"
        ref = PodRef(view.namespace, view.name, view.uid, node)
        views.append(
            PodView(
                ref=ref,
                terminating=view.terminating,
                ready=view.ready == "True",
                local_storage=has_local_storage(pod),
                batch=LABEL_BATCH in labels,
                at_most_one=view.at_most_one,
                workload=workload_of(pod),
                budgets=budgets_of(pod, selectors),
                refusal=refused.get(ref),
            )
        )
    return tuple(views), production


def _node_view(
    name: str,
    node: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    selectors: Sequence[Selector],
    refused: Mapping[PodRef, Refusal],
    draining_for: Mapping[str, float],
    blocked_for: Mapping[str, float],
) -> NodeView:
    if node is None:
        return NodeView(name, found=False)
    annotations = meta_of(node).get("annotations") or {}
    views, production = _pod_views(name, pods, selectors, refused)
    return NodeView(
        name=name,
        found=True,
        zone=zone_of(node),
        unschedulable=(node.get("spec") or {}).get("unschedulable") is True,
        draining_by=annotations.get(names.ANNOTATION_DRAINING),
        cordoned_by=annotations.get(names.ANNOTATION_CORDONED_BY),
        pods=views,
        production_pods=production,
        draining_for=draining_for.get(name),
        blocked_for=blocked_for.get(name),
    )


def observe(
    nm: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any] | None],
    pods_by_node: Mapping[str, Sequence[Mapping[str, Any]]],
    pdbs: Sequence[Mapping[str, Any]],
    workloads: Mapping[tuple[str, str], Mapping[str, Any]],
    workload_pods: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]],
    draining_nodes: frozenset[str],
    *,
    draining_for: Mapping[str, float],
    blocked_for: Mapping[str, float],
    refused: Mapping[PodRef, Refusal],
    now: str,
) -> Observed:
    meta = meta_of(nm)
    spec = parse_spec(nm.get("spec") or {})
    by_selector = selectors(pdbs)
    views = tuple(
        _node_view(
            n,
            nodes.get(n),
            pods_by_node.get(n, ()),
            by_selector,
            refused,
            draining_for,
            blocked_for,
        )
        for n in spec.nodes
    )
    name = str(meta.get("name", ""))
    own = frozenset(v.name for v in views if v.draining_by == name)
    wanted = {p.workload for v in views for p in v.pods if p.workload is not None}
    surge = {
        key: surge_view(workloads[key], workload_pods.get(key, ()), draining_nodes - own)
        for key in sorted(wanted)
        if key in workloads and surge_first(workloads[key])
    }
    generation = meta.get("generation")
    status = nm.get("status")
    return Observed(
        name=name,
        generation=generation if isinstance(generation, int) else None,
        spec=spec,
        nodes=views,
        budgets={b.key: b for b in map(budget_view, pdbs)},
        surge=surge,
        status=status if isinstance(status, Mapping) else {},
        now=now,
    )
