"""A drain recorded every half second, and the figures read from the recording.

A maintenance drain is judged by what a service's users see while it runs, not by what the
drain reports: each sample lists the pods (Ready, terminating, on which node, which epoch),
the nodes (cordoned, and by which NodeMaintenance) and the NodeMaintenance's own per-node
states. From a recording come the budget check (no ServiceWorkload below its floor of Ready
pods in any sample), the concurrency check (no more nodes cordoned by the maintenance and
still holding pods than `maxConcurrent`), the at-most-one check (never two live copies), and
the benchmark's figures: refused evictions from the operator's metrics and `kubectl drain`'s
output.

A pod counts as Ready only while it is not terminating: an evicted pod no longer counts
toward a PodDisruptionBudget, so it must not count here either. A pod is live until it is
terminal (Succeeded or Failed) or gone, terminating included: a stopping copy of an
at-most-one pod may still be writing.

Everything here is pure (API dicts in, figures out), so the unit tests drive it with
hand-written samples; the e2e tests and the benchmark share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish import names
from pilotfish.workloads import LABEL_WORKLOAD

Obj = Mapping[str, Any]

IN_FLIGHT: Final = frozenset({"Cordoned", "Draining"})
TERMINAL: Final = frozenset({"Succeeded", "Failed"})
REFUSED_METRIC: Final = "pilotfish_maintenance_evictions_total"
# What `kubectl drain` prints for each eviction a PodDisruptionBudget refused (a 429).
KUBECTL_REFUSED: Final = "Cannot evict pod as it would violate the pod's disruption budget"


@dataclass(frozen=True)
class PodView:
    key: str  # "namespace/name"
    workload: str  # "namespace/name" of its ServiceWorkload, "" for none
    node: str  # "" while unbound
    phase: str
    ready: bool  # Ready and not terminating
    terminating: bool
    epoch: int | None  # the fencing epoch of an at-most-one pod

    @property
    def live(self) -> bool:
        return self.phase not in TERMINAL


@dataclass(frozen=True)
class NodeView:
    unschedulable: bool
    cordoned_by: str  # the NodeMaintenance that cordoned it, "" for none
    draining: str  # the NodeMaintenance draining it, "" for none


@dataclass(frozen=True)
class Sample:
    at: float  # when the sample's first read was sent
    pods: tuple[PodView, ...]
    nodes: Mapping[str, NodeView]
    phase: str | None = None  # the NodeMaintenance's status.phase, None when not read
    states: Mapping[str, str] = field(default_factory=dict)  # its node -> state

    def ready(self, workload: str) -> int:
        return sum(1 for p in self.pods if p.workload == workload and p.ready)

    def live(self, workload: str) -> list[PodView]:
        return [p for p in self.pods if p.workload == workload and p.live]


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_view(pod: Obj) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ns = str(meta.get("namespace") or "")
    workload = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
    epoch = (meta.get("annotations") or {}).get(names.ANNOTATION_EPOCH)
    terminating = bool(meta.get("deletionTimestamp"))
    phase = str(status.get("phase") or "Pending")
    return PodView(
        key=f"{ns}/{meta.get('name')}",
        workload=f"{ns}/{workload}" if workload else "",
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        phase=phase,
        ready=_ready(pod) and not terminating and phase not in TERMINAL,
        terminating=terminating,
        epoch=int(epoch) if epoch is not None and str(epoch).isdigit() else None,
    )


def node_view(node: Obj) -> NodeView:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return NodeView(
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by=str(annotations.get(names.ANNOTATION_CORDONED_BY) or ""),
        draining=str(annotations.get(names.ANNOTATION_DRAINING) or ""),
    )


def sample(
    at: float, pods: Iterable[Obj], nodes: Iterable[Obj], maintenance: Obj | None = None
) -> Sample:
    status = (maintenance or {}).get("status") or {}
    return Sample(
        at=at,
        pods=tuple(pod_view(p) for p in pods),
        nodes={str(n["metadata"]["name"]): node_view(n) for n in nodes},
        phase=status.get("phase") if maintenance is not None else None,
        states={str(n.get("name")): str(n.get("state")) for n in status.get("nodes") or []},
    )


def budget_violations(samples: Sequence[Sample], floors: Mapping[str, int]) -> list[str]:
    """Every (sample, workload) with fewer Ready pods than its floor, for the report."""
    found = []
    for s in samples:
        for workload, floor in floors.items():
            ready = s.ready(workload)
            if ready < floor:
                found.append(f"t={s.at:.1f} {workload}: {ready} Ready < {floor}")
    return found


def fewest_ready(samples: Sequence[Sample], workload: str) -> int | None:
    return min((s.ready(workload) for s in samples), default=None)


def most_live(samples: Sequence[Sample], workload: str) -> int:
    """The most live (not terminal, terminating included) pods of `workload` in a sample."""
    return max((len(s.live(workload)) for s in samples), default=0)


def holding_nodes(s: Sample, maintenance: str) -> set[str]:
    """Nodes the maintenance cordoned that still hold live pods: those it is draining."""
    mine = {n for n, v in s.nodes.items() if v.unschedulable and v.cordoned_by == maintenance}
    return {p.node for p in s.pods if p.live and p.node in mine}


def most_holding(samples: Sequence[Sample], maintenance: str) -> int:
    return max((len(holding_nodes(s, maintenance)) for s in samples), default=0)


def most_in_flight(samples: Sequence[Sample]) -> int:
    """The most nodes the NodeMaintenance itself reported Cordoned or Draining at once."""
    return max((sum(1 for v in s.states.values() if v in IN_FLIGHT) for s in samples), default=0)


def first(samples: Sequence[Sample], holds: Any) -> Sample | None:
    return next((s for s in samples if holds(s)), None)


def surge_before_eviction(samples: Sequence[Sample], workload: str, old: str) -> str | None:
    """None when, in the first sample where `old` is terminating or gone, another pod of
    `workload` was already Ready; otherwise what was seen instead."""
    for s in samples:
        mine = {p.key: p for p in s.live(workload)}
        if old in mine and not mine[old].terminating:
            continue
        others = [k for k, p in mine.items() if k != old and p.ready]
        if others:
            return None
        return f"t={s.at:.1f}: {old} {'terminating' if old in mine else 'gone'}, none Ready"
    return f"{old} was never seen leaving"


def metric_value(text: str, name: str, labels: Mapping[str, str]) -> float:
    """The sum of a metric's samples carrying `labels` in a Prometheus text exposition
    (0 when absent: a counter never incremented is not exported with that label yet)."""
    total = 0.0
    line_re = re.compile(rf"^{re.escape(name)}(?:\{{(?P<labels>[^}}]*)\}})?\s+(?P<value>\S+)")
    for line in text.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("labels") or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group("value"))
    return total


def refused_evictions(metrics_text: str) -> int | None:
    """Evictions the operator counted refused (429); None when it exports no such counter
    at all (an operator without the maintenance controller), which is not the same as 0."""
    family = REFUSED_METRIC.removesuffix("_total")
    if not re.search(rf"^(# TYPE )?{family}(_total)?[ {{]", metrics_text, re.MULTILINE):
        return None
    return int(metric_value(metrics_text, REFUSED_METRIC, {"result": "refused"}))


def kubectl_refusals(output: str) -> int:
    """Evictions `kubectl drain` reported refused by a budget (it retries each every 5 s)."""
    return output.count(KUBECTL_REFUSED)


def budget_allows(pdb: Obj, disruptions: int) -> bool:
    """The PodDisruptionBudget's status is of its current spec and allows `disruptions`."""
    status = pdb.get("status") or {}
    current = status.get("observedGeneration") == (pdb.get("metadata") or {}).get("generation")
    return current and int(status.get("disruptionsAllowed") or 0) >= disruptions


def budget_sync_failed(pdb: Obj) -> bool:
    """The disruption controller could not compute the budget (its DisruptionAllowed
    condition's reason SyncFailed: say, the pods' controller kind not yet known to it)."""
    conditions = (pdb.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "DisruptionAllowed" and c.get("reason") == "SyncFailed" for c in conditions
    )


def pods_on(s: Sample, nodes: Iterable[str]) -> int:
    wanted = set(nodes)
    return sum(1 for p in s.pods if p.live and p.node in wanted)


def result(
    inputs: Mapping[str, Any],
    maintenance: Mapping[str, Any],
    kubectl: Mapping[str, Any],
    target_ratio: float,
) -> dict[str, Any]:
    """The benchmark's one JSON object: both phases, the ratio and the verdict."""
    nm_s, kc_s = maintenance.get("seconds"), kubectl.get("seconds")
    ratio = round(nm_s / kc_s, 3) if nm_s is not None and kc_s else None
    violations = int(maintenance.get("violations", 0)) + int(kubectl.get("violations", 0))
    met = {
        "ratio": ratio is not None and ratio <= target_ratio,
        "violations": violations == 0
        and maintenance.get("seconds") is not None
        and kubectl.get("seconds") is not None,
    }
    return {
        "benchmark": "maintenance",
        "inputs": dict(inputs),
        "maintenance": dict(maintenance),
        "kubectl_drain": dict(kubectl),
        "ratio": ratio,
        "violations": violations,
        "refused_evictions": maintenance.get("refused_evictions"),
        "targets": {"ratio": f"<= {target_ratio}", "violations": 0},
        "met_by_figure": met,
        "met": all(met.values()),
    }
