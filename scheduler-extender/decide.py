"""Placement decisions: pure functions from a pod, the snapshot and candidate nodes to an answer.

Kept apart from HTTP and from the wire format so each rule is a unit test on plain values,
and so the handler stays within the scheduler's millisecond budget: nothing here does I/O
or reads the clock, and the per-node work is a dict lookup and a few integer comparisons
against aggregates the snapshot keeps current.

Filter: only what kube-scheduler's own plugins do not check, or check without saying where.
- machine class: the pod's `pilotfish.io/machine-class` (annotation, else label) must equal
  the node's `node.kubernetes.io/instance-type`; unresolvable (evicting pods cannot change a
  node's hardware);
- GPUs: `nvidia.com/gpu` requested vs free on the node; unresolvable when the node has fewer
  GPUs than asked even empty;
- batch capacity: a pod's `batch.pilotfish.io/*` requests (the webhook translated it onto
  reclaimed capacity) vs what the node still offers as `batch.pilotfish.io/cpu`
  (millicores) and `batch.pilotfish.io/memory` (bytes) after every other pod bound there
  that requests them, when the node advertises them (no reclaim on a node: no check). Only
  those requests count, as in kube-scheduler's own fit: a batch pod left untranslated (its
  namespace has reclaim off) runs on the node's normal allocatable, which kube-scheduler
  checks, and takes nothing from the batch figure. The extender's check adds the
  zone-grouped message ("waiting for reclaimed capacity").
Nodes the snapshot does not know yet pass: the scheduler's own filters still apply to them,
and a lagging snapshot must not make a new node unusable.

One reason per failed node ("node kwok-zone-b-3 in zone-b has 4 free GPUs, pod asks 8"; the
wording is in `reasons`). When every candidate fails, every failed node carries the same
summary instead, grouped by cause and zone ("no node in zone-b has 8 free GPUs
(nvidia.com/gpu): 3 have 4, 1 is full"): kube-scheduler counts identical reasons, so the
pod's PodScheduled message shows that one sentence once ("0/12 nodes are available: 12 no
node in zone-b has ...") instead of a line per node. The answer's `Error` stays empty: an
error would make kube-scheduler (ignorable) skip the extender and place the pod anyway.

Note: kube-scheduler runs its own filters first and calls the extender only with the nodes
that passed. Its NodeResourcesFit also counts `nvidia.com/gpu`, so with the shipped
configuration a GPU shortage is reported by it ("Insufficient nvidia.com/gpu", no zone)
before the extender is asked. For the zone-grouped GPU message the scheduler configuration
needs a second entry for this extender: `filterVerb: filter`, `ignorable: false`,
`managedResources: [{name: nvidia.com/gpu, ignoredByScheduler: true}]`. kube-scheduler then
drops GPUs from its own fit in every profile and asks that entry for GPU pods only, and
non-ignorably, so a down extender makes GPU pods wait instead of overcommitting GPUs
(e2e/test_extender.py runs a scheduler configured so). Machine class and batch capacity
have no in-tree twin: their summaries reach the pod with the shipped configuration.

Prioritize (scores 0..10, clamped by the wire encoder, multiplied by the extender weight):
- production: spread a workload's replicas over zones, then nodes: the fewest replicas of the
  same workload (`pilotfish.io/workload`, else the pod's controller) in the node's zone, then
  on the node, then the fuller node;
- batch and best-effort: pack, the node most allocated (mean of CPU and memory fractions
  with the pod added) first; a pod translated onto `batch.pilotfish.io/*` by the fractions
  of the node's batch allocatable its batch pods take.
Exactly one node (the best by those keys, ties by name) gets 10 and every other node at most
9. That single clear winner keeps kube-scheduler's own scores (LeastAllocated spreads, the
opposite of packing) from undoing the preference, and it is what lets the snapshot assume
the pod lands there before the binding arrives (see `snapshot`).

Preempt: kube-scheduler proposes candidate nodes, each with the victims it would evict.
- never evict production: a node whose victims include a production pod is dropped, and so
  is a node with a victim the snapshot does not know (it may be a production pod bound a
  moment ago; refusing costs a retry, guessing wrong costs a production pod);
- among the rest: fewest disruption-budget violations, then fewest victims, then the lowest
  bands (highest victim band first, then the sum), then the most recently started (the
  least work lost), then by name; only that one node is returned, with the scheduler's own
  victim list for it (which it computed to be the minimal set that makes the pod fit).
The 10 s grace of a batch victim is a property of the victim pod
(`terminationGracePeriodSeconds`, honoured by the scheduler's eviction): the extender
answers with UIDs only and cannot set it. The webhooks and the batch operator set it on
batch pods (their own issue).

Large pods and starvation: rely on kube-scheduler's nominated node, no aging term. A
score only ranks nodes the pod already fits on, so aging in prioritize cannot help a pod
that fits nowhere, which is what starving means. A large pod of a higher band preempts:
it gets `status.nominatedNodeName`, and from then on the scheduler counts it on that node
when filtering every pod of lower or equal priority, so small pods cannot take the room its
victims free. Within one band (no preemption between equal priorities) the queue orders by
priority, then by the time a pod entered it, and batch packing keeps whole nodes empty for
large pods instead of leaving every node a little used. An aging bonus would also make
scores depend on the clock and break the one-clear-winner property above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish import names
from pilotfish.extender import resources
from pilotfish.extender.reasons import (
    BATCH_CPU,
    BATCH_MEMORY,
    GPUS,
    MACHINE_CLASS,
    Failure,
    node_reason,
    summarize,
)
from pilotfish.extender.resources import BAND_RANK, CPU, GPU, MEMORY, PRODUCTION
from pilotfish.extender.snapshot import NodeState, Snapshot
from pilotfish.extender.wire import MAX_EXTENDER_PRIORITY, MetaVictims

# Preemption vetoes (the `cause` label of pilotfish_extender_preemption_vetoes_total).
VETO_PRODUCTION: Final = "production_victim"
VETO_UNKNOWN: Final = "unknown_victim"


# Below the single winner: 9 at best, 3 points per zone step and 1 per node step.
_RUNNER_UP: Final = MAX_EXTENDER_PRIORITY - 1


@dataclass(frozen=True, slots=True)
class Incoming:
    """The pod being placed, reduced once per call to what the rules read."""

    uid: str
    band: str
    workload: str | None
    machine_class: str | None
    cpu: int
    memory: int
    gpu: int
    # What the pod takes from a node's batch allocatable (as `snapshot.PodInfo` counts it):
    # its batch.pilotfish.io/* requests, nothing else.
    batch_cpu: int
    batch_memory: int
    # True when the pod itself requests batch.pilotfish.io/* (the webhook translated it):
    # it is packed by the batch figure, the only capacity it can take.
    asks_batch_cpu: bool
    asks_batch_memory: bool

    @property
    def production(self) -> bool:
        return self.band == PRODUCTION


def incoming(pod: Mapping[str, Any]) -> Incoming:
    requests = resources.pod_requests(pod.get("spec") or {})
    return Incoming(
        uid=str((pod.get("metadata") or {}).get("uid") or ""),
        band=resources.band(pod),
        workload=resources.workload(pod),
        machine_class=resources.machine_class(pod),
        cpu=requests.get(CPU, 0),
        memory=requests.get(MEMORY, 0),
        gpu=requests.get(GPU, 0),
        batch_cpu=requests.get(names.BATCH_CPU, 0),
        batch_memory=requests.get(names.BATCH_MEMORY, 0),
        asks_batch_cpu=names.BATCH_CPU in requests,
        asks_batch_memory=names.BATCH_MEMORY in requests,
    )


# --- filter ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Nodes that pass, and why the others do not.

    `unresolvable` is for failures preemption cannot fix (wrong machine class, too few GPUs
    even on an empty node), so the scheduler does not evict pods on those nodes in vain.
    """

    passing: Sequence[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    causes: dict[str, int] = field(default_factory=dict)  # rejected nodes per cause


def _check_batch(pod: Incoming, state: NodeState) -> Failure | None:
    if state.batch_cpu is not None and state.batch_cpu - state.used_batch_cpu < pod.batch_cpu:
        free = max(state.batch_cpu - state.used_batch_cpu, 0)
        return Failure(BATCH_CPU, state, free, state.batch_cpu < pod.batch_cpu)
    if (
        state.batch_memory is not None
        and state.batch_memory - state.used_batch_memory < pod.batch_memory
    ):
        free = max(state.batch_memory - state.used_batch_memory, 0)
        return Failure(BATCH_MEMORY, state, free, state.batch_memory < pod.batch_memory)
    return None


def filter_nodes(pod: Incoming, snap: Snapshot, node_names: Sequence[str]) -> FilterResult:
    """Split candidates into passing and failed, with a reason for every failed node.

    Most pods ask for no machine class, no GPU and no batch capacity; for them this returns
    the caller's sequence itself without looking at a node.
    """
    gpu = pod.gpu > 0
    batch = snap.batch_nodes > 0 and (pod.batch_cpu > 0 or pod.batch_memory > 0)
    if pod.machine_class is None and not gpu and not batch:
        return FilterResult(node_names)
    get = snap.nodes.get
    wanted_class = pod.machine_class
    gpus = pod.gpu
    passing: list[str] = []
    failures: list[Failure] = []
    # The checks are inlined (not a function per node): at 500 nodes a call per node is
    # a measurable share of the scheduler's budget.
    for name in node_names:
        state = get(name)
        if state is None or not state.present:
            passing.append(name)
        elif wanted_class is not None and state.machine_class != wanted_class:
            failures.append(Failure(MACHINE_CLASS, state, state.machine_class, True))
        elif gpu and state.alloc_gpu - state.used_gpu < gpus:
            free = state.alloc_gpu - state.used_gpu
            failures.append(Failure(GPUS, state, free if free > 0 else 0, state.alloc_gpu < gpus))
        elif batch and (failure := _check_batch(pod, state)) is not None:
            failures.append(failure)
        else:
            passing.append(name)
    if not failures:
        return FilterResult(node_names)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    causes: dict[str, int] = {}
    summary = summarize(pod, failures) if not passing else None
    for f in failures:
        (unresolvable if f.unresolvable else failed)[f.node.name] = summary or node_reason(pod, f)
        causes[f.cause] = causes.get(f.cause, 0) + 1
    return FilterResult(passing, failed, unresolvable, causes)


# --- prioritize -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scores:
    """One score per candidate, in order, and the single node that got the top score."""

    scores: list[int]
    best: str | None


def score_nodes(pod: Incoming, snap: Snapshot, node_names: Sequence[str]) -> Scores:
    if pod.production:
        return _spread(pod, snap, node_names)
    if pod.asks_batch_cpu or pod.asks_batch_memory:
        return _pack_batch(pod, snap, node_names)
    return _pack(pod, snap, node_names)


def _spread(pod: Incoming, snap: Snapshot, node_names: Sequence[str]) -> Scores:
    """Fewest replicas in the zone, then on the node, then fuller: 10 for the best node,
    then 9 minus 3 per extra replica in the zone and 1 per extra replica on the node.

    Written as one lean loop (no per-node tuples, calls or generator expressions): this is
    the production path and runs for every replica over up to every node.
    """
    get = snap.nodes.get
    per_node = snap.workload_nodes.get(pod.workload) if pod.workload is not None else None
    states = [get(name) for name in node_names]
    known = [s for s in states if s is not None and s.present]
    if not known:
        return Scores([0] * len(node_names), None)
    per_zone = snap.zone_counts(per_node) if per_node else {}
    if per_node:
        zmin = min(per_zone.get(zone, 0) for zone in {s.zone for s in known})
        # More candidates than nodes holding replicas: some candidate holds none.
        nmin = 0 if len(known) > len(per_node) else min(per_node.get(s.name, 0) for s in known)
    else:
        per_node = {}
        zmin = nmin = 0
    zget = per_zone.get
    nget = per_node.get
    scores = [0] * len(states)
    best = -1
    best_dz = best_dn = 1 << 62
    best_full = -1.0
    best_name = ""
    for i, s in enumerate(states):
        if s is None or not s.present:
            continue
        dz = zget(s.zone, 0) - zmin
        dn = nget(s.name, 0) - nmin
        scores[i] = _RUNNER_UP - 3 * (dz if dz < 2 else 2) - (dn if dn < 2 else 2)
        if dz > best_dz or (dz == best_dz and dn > best_dn):
            continue
        full = (s.score_cpu * s.inv_cpu + s.score_memory * s.inv_memory) * 0.5
        if (
            dz < best_dz
            or dn < best_dn
            or full > best_full
            or (full == best_full and s.name < best_name)
        ):
            best, best_dz, best_dn, best_full, best_name = i, dz, dn, full, s.name
    scores[best] = MAX_EXTENDER_PRIORITY
    return Scores(scores, node_names[best])


def _pack(pod: Incoming, snap: Snapshot, node_names: Sequence[str]) -> Scores:
    """Most allocated first (with the pod added): 10 for the fullest, 0..9 by fraction."""
    nodes = snap.nodes
    cpu, memory = pod.cpu, pod.memory
    scores: list[int] = []
    best = -1
    best_full = -1.0
    best_name = ""
    for i, name in enumerate(node_names):
        s = nodes.get(name)
        if s is None or not s.present:
            scores.append(0)
            continue
        # NodeState.fullness, inlined: this loop runs once per candidate per call.
        full = ((s.score_cpu + cpu) * s.inv_cpu + (s.score_memory + memory) * s.inv_memory) * 0.5
        full = min(full, 1.0)
        scores.append(int(full * _RUNNER_UP))
        if full > best_full or (full == best_full and name < best_name):
            best, best_full, best_name = i, full, name
    if best < 0:
        return Scores(scores, None)
    scores[best] = MAX_EXTENDER_PRIORITY
    return Scores(scores, node_names[best])


def _pack_batch(pod: Incoming, snap: Snapshot, node_names: Sequence[str]) -> Scores:
    """`_pack` for a pod on reclaimed capacity: by the fraction of the node's batch
    allocatable taken (batch pods bound and assumed, plus this one). Its plain cpu and
    memory are zero, and the node's plain figures count production, which it never uses."""
    nodes = snap.nodes
    cpu, memory = pod.batch_cpu, pod.batch_memory
    scores: list[int] = []
    best = -1
    best_full = -1.0
    best_name = ""
    for i, name in enumerate(node_names):
        s = nodes.get(name)
        if s is None or not s.present:
            scores.append(0)
            continue
        full = (
            (s.score_batch_cpu + cpu) * s.inv_batch_cpu
            + (s.score_batch_memory + memory) * s.inv_batch_memory
        ) * 0.5
        full = min(full, 1.0)
        scores.append(int(full * _RUNNER_UP))
        if full > best_full or (full == best_full and name < best_name):
            best, best_full, best_name = i, full, name
    if best < 0:
        return Scores(scores, None)
    scores[best] = MAX_EXTENDER_PRIORITY
    return Scores(scores, node_names[best])


# --- preempt ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Preemption:
    """The chosen node and its victims (at most one node), and every vetoed node's cause."""

    victims: dict[str, MetaVictims]
    vetoed: dict[str, str]


def choose_victims(snap: Snapshot, proposed: Mapping[str, MetaVictims]) -> Preemption:
    """Drop candidates that would evict production (or an unknown pod), keep the best one."""
    by_uid = snap.by_uid
    vetoed: dict[str, str] = {}
    best: str | None = None
    best_key: tuple[int, int, int, int, float, str] | None = None
    for node, victims in proposed.items():
        if not victims.pod_uids:
            continue  # the scheduler rejects a returned node without victims
        top = total = 0
        started = 0.0
        veto = None
        for uid in victims.pod_uids:
            info = by_uid.get(uid)
            if info is None:
                veto = VETO_UNKNOWN
                continue
            if info.band == PRODUCTION:
                veto = VETO_PRODUCTION
                break
            rank = BAND_RANK[info.band]
            top = max(top, rank)
            total += rank
            started += info.start
        if veto is not None:
            vetoed[node] = veto
            continue
        key = (victims.num_pdb_violations, len(victims.pod_uids), top, total, -started, node)
        if best_key is None or key < best_key:
            best, best_key = node, key
    chosen = {best: proposed[best]} if best is not None else {}
    return Preemption(chosen, vetoed)
