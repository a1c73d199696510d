"""A cluster recorded while machines are silent, and the figures read from the recording.

Node failure is a matter of timing against a 40 s + 60 s schedule: a node unreachable at
40 s of lease silence, its pods' endpoints dropped with it, its pods evicted 60 s later and
replaced elsewhere, or, under a zone brake, none of that. Waiting for each of those in turn
would serialise the waits; instead the e2e tests and the benchmark sample the cluster every
half second into a recording (nodes with their Ready condition, taints and lease renewal;
pods with their node, readiness and deletion; EndpointSlice endpoints) and read every
figure from it afterwards, several scenarios from the same minutes.

Times are wall-clock seconds (`time.time()`), so that they compare with a lease's
`renewTime`, which kwok (on the same machine) writes from the wall clock. A state change
between two samples happened after the earlier sample's first read was sent (`at`) and
before the later sample's last read was answered (`done`): a figure is that interval.

Everything here is pure (dicts in, figures out), so the unit tests drive it with
hand-written samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish.timeutil import parse_time
from pilotfish.workloads import ENDPOINTSLICE_MANAGED_BY, LABEL_WORKLOAD

Obj = Mapping[str, Any]

TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
UNREACHABLE_TAINTS: Final = frozenset(
    {f"{TAINT_UNREACHABLE}:NoSchedule", f"{TAINT_UNREACHABLE}:NoExecute"}
)
LOST_NODE_TAINT_KEYS: Final = frozenset({TAINT_UNREACHABLE, "node.kubernetes.io/not-ready"})
LABEL_SERVICE_NAME: Final = "kubernetes.io/service-name"
LABEL_MANAGED_BY: Final = "endpointslice.kubernetes.io/managed-by"
WITHIN: Final = 2.0  # unreachable within 2 s of the configured silence
REPLACED_MARGIN: Final = 5.0  # replacements bound by unreachable + eviction wait + this


@dataclass(frozen=True)
class NodeState:
    ready: str  # the Ready condition's status: "True", "False", "Unknown", "" when absent
    taints: frozenset[str]  # "key:effect"
    renewed: float | None  # the node lease's renewTime (epoch seconds); None: no lease


@dataclass(frozen=True)
class PodState:
    node: str  # "" while unbound
    workload: str  # "namespace/name" of its ServiceWorkload, "" for none
    ready: bool
    terminating: bool
    phase: str
    disruption: str  # the DisruptionTarget condition's reason when True, else ""


@dataclass(frozen=True)
class Sample:
    at: float  # when the sample's first read was sent
    done: float  # when its last read was answered
    nodes: Mapping[str, NodeState]
    pods: Mapping[str, PodState]  # "namespace/name"
    endpoints: Mapping[str, Mapping[str, bool]]  # service "ns/name" -> pod "ns/name" -> ready


@dataclass(frozen=True)
class When:
    """A change seen in a recording: it happened in (after, by]."""

    after: float
    by: float

    def since(self, origin: float) -> dict[str, float]:
        return {"after_s": round(self.after - origin, 3), "by_s": round(self.by - origin, 3)}


def _condition(conditions: Iterable[Obj], type_: str) -> Obj | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def _time(raw: object) -> float | None:
    if not raw:
        return None
    return parse_time(str(raw)).timestamp()


def node_state(node: Obj, lease: Obj | None) -> NodeState:
    ready = _condition((node.get("status") or {}).get("conditions") or [], "Ready")
    taints = frozenset(
        f"{t.get('key')}:{t.get('effect')}" for t in (node.get("spec") or {}).get("taints") or []
    )
    renewed = _time(((lease or {}).get("spec") or {}).get("renewTime"))
    return NodeState(str((ready or {}).get("status") or ""), taints, renewed)


def pod_state(pod: Obj) -> PodState:
    meta = pod.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = _condition(conditions, "Ready")
    disruption = _condition(conditions, "DisruptionTarget")
    return PodState(
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        workload=f"{meta.get('namespace')}/{owner}" if owner else "",
        ready=bool(ready and ready.get("status") == "True"),
        terminating=bool(meta.get("deletionTimestamp")),
        phase=str(status.get("phase") or ""),
        disruption=str(disruption.get("reason") or "")
        if disruption and disruption.get("status") == "True"
        else "",
    )


def endpoints_of(slices: Iterable[Obj]) -> dict[str, dict[str, bool]]:
    """Service -> pod -> ready, over Pilotfish's EndpointSlices (the ones it promises for)."""
    out: dict[str, dict[str, bool]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(LABEL_MANAGED_BY) != ENDPOINTSLICE_MANAGED_BY:
            continue
        service = f"{meta.get('namespace')}/{labels.get(LABEL_SERVICE_NAME)}"
        shown = out.setdefault(service, {})
        for ep in s.get("endpoints") or []:
            ref = ep.get("targetRef") or {}
            if ref.get("kind", "Pod") != "Pod" or not ref.get("name"):
                continue
            pod = f"{ref.get('namespace') or meta.get('namespace')}/{ref['name']}"
            shown[pod] = (ep.get("conditions") or {}).get("ready") is not False
    return out


def sample(
    at: float,
    done: float,
    nodes: Iterable[Obj],
    leases: Iterable[Obj],
    pods: Iterable[Obj],
    slices: Iterable[Obj],
) -> Sample:
    by_lease = {str(lease["metadata"]["name"]): lease for lease in leases}
    return Sample(
        at=at,
        done=done,
        nodes={
            str(n["metadata"]["name"]): node_state(n, by_lease.get(str(n["metadata"]["name"])))
            for n in nodes
        },
        pods={f"{p['metadata']['namespace']}/{p['metadata']['name']}": pod_state(p) for p in pods},
        endpoints=endpoints_of(slices),
    )


# --- reading a recording ---------------------------------------------------------------


def first(samples: Sequence[Sample], holds: Callable[[Sample], bool], since: float) -> When | None:
    """When `holds` first became true among the samples taken from `since` on."""
    prev: Sample | None = None
    for s in samples:
        if s.at < since:
            prev = s
            continue
        if holds(s):
            return When(prev.at if prev else since, s.done)
        prev = s
    return None


def last_renewal(samples: Sequence[Sample], node: str, before: float = math.inf) -> float | None:
    """The node's last lease renewal the recording saw before `before` (when the node was
    let back: its silence started there)."""
    seen = [s.nodes[node].renewed for s in samples if node in s.nodes]
    known = [r for r in seen if r is not None and r < before]
    return max(known) if known else None


def unreachable(node: str) -> Callable[[Sample], bool]:
    def holds(s: Sample) -> bool:
        n = s.nodes.get(node)
        return n is not None and n.ready == "Unknown" and n.taints >= UNREACHABLE_TAINTS

    return holds


def returned(node: str) -> Callable[[Sample], bool]:
    """Ready again, and no lost-node taint (unreachable or not-ready) left."""

    def holds(s: Sample) -> bool:
        n = s.nodes.get(node)
        return (
            n is not None
            and n.ready == "True"
            and not any(t.split(":")[0] in LOST_NODE_TAINT_KEYS for t in n.taints)
        )

    return holds


def pods_on(s: Sample, nodes: Iterable[str]) -> set[str]:
    wanted = set(nodes)
    return {k for k, p in s.pods.items() if p.node in wanted}


def endpoints_dropped(pods: Iterable[str]) -> Callable[[Sample], bool]:
    """Every one of `pods` is out of every service's endpoints or shown not ready."""
    wanted = set(pods)

    def holds(s: Sample) -> bool:
        return all(not shown.get(p, False) for shown in s.endpoints.values() for p in wanted)

    return holds


def evicted(pods: Iterable[str]) -> Callable[[Sample], bool]:
    """Every one of `pods` is being deleted or gone."""
    wanted = set(pods)

    def holds(s: Sample) -> bool:
        return all(p not in s.pods or s.pods[p].terminating for p in wanted)

    return holds


def live_elsewhere(s: Sample, workload: str, away_from: Iterable[str]) -> list[str]:
    """The workload's ("namespace/name") bound, not-deleted pods on nodes other than `away_from`."""
    away = set(away_from)
    return [
        k
        for k, p in s.pods.items()
        if p.workload == workload
        and p.node
        and p.node not in away
        and not p.terminating
        and p.phase not in ("Failed", "Succeeded")
    ]


def replaced(wanted: Mapping[str, int], away_from: Iterable[str]) -> Callable[[Sample], bool]:
    """Each workload ("namespace/name", as its Service) has its full count bound on nodes
    other than `away_from`."""
    away = set(away_from)

    def holds(s: Sample) -> bool:
        return all(len(live_elsewhere(s, w, away)) >= n for w, n in wanted.items())

    return holds


def full_ready(wanted: Mapping[str, int]) -> Callable[[Sample], bool]:
    """Each service ("ns/name") shows at least its count of ready endpoints."""

    def holds(s: Sample) -> bool:
        return all(
            sum(1 for ready in s.endpoints.get(svc, {}).values() if ready) >= n
            for svc, n in wanted.items()
        )

    return holds


def ever_evicted(samples: Sequence[Sample], pods: Iterable[str], since: float) -> list[str]:
    """Those of `pods` that some sample from `since` on shows deleted or gone."""
    hit: set[str] = set()
    for s in samples:
        if s.at >= since:
            hit |= {p for p in pods if p not in s.pods or s.pods[p].terminating}
    return sorted(hit)


def ever_not_ready(samples: Sequence[Sample], pods: Iterable[str], since: float) -> list[str]:
    """Those of `pods` that some sample from `since` on shows not Ready."""
    hit: set[str] = set()
    for s in samples:
        if s.at >= since:
            hit |= {p for p in pods if p in s.pods and not s.pods[p].ready}
    return sorted(hit)


def ever_dropped(samples: Sequence[Sample], pods: Iterable[str], since: float) -> list[str]:
    """Those of `pods` that some sample from `since` on shows in no service's ready
    endpoints."""
    hit: set[str] = set()
    for s in samples:
        if s.at < since:
            continue
        shown = {p for eps in s.endpoints.values() for p, ready in eps.items() if ready}
        hit |= {p for p in pods if p not in shown}
    return sorted(hit)


def timeline(
    samples: Sequence[Sample],
    node: str,
    pods: Iterable[str],
    wanted_pods: Mapping[str, int],
    wanted_ready: Mapping[str, int],
    since: float,
    restored: float = math.inf,
) -> dict[str, Any]:
    """One lost node's figures, in seconds from its last lease renewal: unreachable,
    endpoints dropped, evicted, replacements bound elsewhere, services back at full ready
    count (None for what never happened within the recording)."""
    lost = set(pods)
    origin = last_renewal(samples, node, restored)
    if origin is None:
        return {"error": f"the recording never saw {node}'s lease"}
    marks: dict[str, When | None] = {
        "unreachable": first(samples, unreachable(node), since),
        "endpoints_dropped": first(samples, endpoints_dropped(lost), since),
        "evicted": first(samples, evicted(lost), since),
        "replacements_bound": first(samples, replaced(wanted_pods, [node]), since)
        if lost
        else None,
    }
    evicted_at = marks["evicted"]
    marks["full_ready"] = (
        first(samples, full_ready(wanted_ready), evicted_at.after) if evicted_at else None
    )
    reasons = sorted({s.pods[p].disruption for s in samples for p in lost if p in s.pods} - {""})
    return {
        "node": node,
        "pods": len(lost),
        "last_renewal": origin,
        **{k: (w.since(origin) if w else None) for k, w in marks.items()},
        "disruption_reasons": reasons,
    }


# --- verdicts -------------------------------------------------------------------------


def replaced_by(unreachable_after: float, eviction_wait: float) -> float:
    return unreachable_after + eviction_wait + REPLACED_MARGIN


def lone_verdict(
    t: Mapping[str, Any], unreachable_after: float, eviction_wait: float
) -> dict[str, Any]:
    """Pilotfish's targets on one lost node's timeline (`timeline`)."""
    mark = t.get("unreachable")
    bound = t.get("replacements_bound")
    on_time = bool(
        mark
        and mark["after_s"] >= unreachable_after - WITHIN
        and mark["by_s"] <= unreachable_after + WITHIN
    )
    limit = replaced_by(unreachable_after, eviction_wait)
    return {
        "not_ready_within_2s_of_configured": on_time,
        "replacements_bound_by_s": limit,
        "replacements_bound_in_time": bool(bound and bound["by_s"] <= limit),
        "met": on_time and bool(bound and bound["by_s"] <= limit),
    }


def brake_figures(
    samples: Sequence[Sample], silent: list[str], since: float, restored: float
) -> dict[str, Any]:
    """From silencing on, the heal included (a zone's nodes come back one at a time, and the
    last ones back are no lone failures either): the silent nodes' pods evicted, made not
    ready, or taken out of their services' ready endpoints (targets 0), and how many of the
    nodes were marked unreachable."""
    before = [s for s in samples if s.done <= since]
    window = [s for s in samples if since <= s.at]
    if not before or not [s for s in window if s.done <= restored]:
        return {"error": "no sample before silencing or none while silent"}
    pods = pods_on(before[-1], silent)
    marked = [n for n in silent if first(window, unreachable(n), since)]
    evicted = ever_evicted(window, pods, since)
    node_of = {p: before[-1].pods[p].node for p in pods}
    dropped = ever_dropped(window, pods, since)
    return {
        "silent_nodes": len(silent),
        "pods_on_silent_nodes": len(pods),
        "silent_s": round(restored - since, 1),
        "recorded_after_restore_s": round(window[-1].done - restored, 1),
        "samples": len(window),
        "nodes_marked_unreachable": len(marked),
        "evictions": len(evicted),
        "evicted_from": sorted({node_of[p] for p in evicted}),
        "pods_made_not_ready": len(ever_not_ready(window, pods, since)),
        "endpoints_removed": len(dropped),
        "met": bool(pods) and not evicted and not dropped,
    }


def brake_choice(nodes: list[str], fraction: float) -> list[str]:
    """`fraction` of the nodes, taken in fleet order (round-robin over the zones)."""
    return nodes[: max(1, round(fraction * len(nodes)))]
