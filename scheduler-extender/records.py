"""What the extender's snapshot keeps of each bound pod and each node.

Reduced once per informer event to integers in the scheduler's own units (`resources`), so
a scheduling call reads plain attributes. The aggregates over them live in `snapshot`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pilotfish import names
from pilotfish.extender import resources
from pilotfish.extender.resources import BAND_RANK, CPU, GPU, MEMORY
from pilotfish.kube.informer import Obj, object_key


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One bound pod, reduced to what placement and preemption read."""

    uid: str
    key: str
    node: str
    band: str
    priority: int
    start: float
    workload: str | None
    cpu: int
    memory: int
    gpu: int
    # What the pod takes from the node's batch allocatable: its batch.pilotfish.io/*
    # requests only, as kube-scheduler's own fit counts them. A batch pod left untranslated
    # (reclaim off in its namespace) runs on normal allocatable and takes none of it.
    batch_cpu: int
    batch_memory: int

    @property
    def rank(self) -> int:
        return BAND_RANK[self.band]


def pod_info(pod: Obj) -> PodInfo | None:
    """The PodInfo of a bound, running-or-pending pod; None when it holds no resources."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    if not node or phase in ("Succeeded", "Failed"):
        return None
    requests = resources.pod_requests(spec)
    priority = spec.get("priority")
    return PodInfo(
        uid=str(meta.get("uid") or ""),
        key=object_key(pod),
        node=str(node),
        band=resources.band(pod),
        priority=priority if type(priority) is int else 0,
        start=resources.start_time(pod),
        workload=resources.workload(pod),
        cpu=requests.get(CPU, 0),
        memory=requests.get(MEMORY, 0),
        gpu=requests.get(GPU, 0),
        batch_cpu=requests.get(names.BATCH_CPU, 0),
        batch_memory=requests.get(names.BATCH_MEMORY, 0),
    )


@dataclass(slots=True, eq=False)
class NodeState:
    """One node: what it offers and what its bound pods (and assumed ones) take from it.

    A state can exist before its Node object arrives (pods and nodes come from two
    informers) or after the Node is deleted while pods still point at it; `present` says
    whether the Node itself is known. Decisions treat a node that is not present as
    unknown: they neither reject it nor prefer it.
    """

    name: str
    present: bool = False
    zone: str = ""
    where: str = ""  # "node NAME in ZONE", the start of every reason about this node
    machine_class: str = ""
    alloc_cpu: int = 0
    alloc_memory: int = 0
    alloc_gpu: int = 0
    # None when the node does not advertise batch.pilotfish.io/* (no reclaim on it yet).
    batch_cpu: int | None = None
    batch_memory: int | None = None
    # Reciprocals of allocatable (plain and batch), so a fullness score is two multiplications.
    inv_cpu: float = 0.0
    inv_memory: float = 0.0
    inv_batch_cpu: float = 0.0
    inv_batch_memory: float = 0.0
    # Sums over bound pods: what filters compare against.
    used_cpu: int = 0
    used_memory: int = 0
    used_gpu: int = 0
    used_batch_cpu: int = 0
    used_batch_memory: int = 0
    # Bound plus assumed: what scores read.
    score_cpu: int = 0
    score_memory: int = 0
    score_batch_cpu: int = 0
    score_batch_memory: int = 0
    pods: dict[str, PodInfo] = field(default_factory=dict)  # by UID

    @property
    def free_gpu(self) -> int:
        return self.alloc_gpu - self.used_gpu

    def fullness(self, extra_cpu: int = 0, extra_memory: int = 0) -> float:
        """Mean of the CPU and memory fractions allocated, with `extra` added, capped at 1."""
        full = (
            (self.score_cpu + extra_cpu) * self.inv_cpu
            + (self.score_memory + extra_memory) * self.inv_memory
        ) * 0.5
        return 1.0 if full > 1.0 else full


@dataclass(frozen=True, slots=True)
class Assumed:
    uid: str
    node: str
    workload: str | None
    cpu: int
    memory: int
    expires: float
    batch_cpu: int = 0
    batch_memory: int = 0


def set_node(state: NodeState, node: Obj) -> None:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    alloc = resources.node_allocatable(node.get("status") or {})
    state.present = True
    state.zone = str(labels.get(names.LABEL_ZONE) or "")
    state.where = f"node {state.name} in {state.zone or '(no zone)'}"
    state.machine_class = str(labels.get(resources.LABEL_INSTANCE_TYPE) or "")
    state.alloc_cpu = alloc.get(CPU, 0)
    state.alloc_memory = alloc.get(MEMORY, 0)
    state.alloc_gpu = alloc.get(GPU, 0)
    state.batch_cpu = alloc.get(names.BATCH_CPU)
    state.batch_memory = alloc.get(names.BATCH_MEMORY)
    state.inv_cpu = 1.0 / state.alloc_cpu if state.alloc_cpu > 0 else 0.0
    state.inv_memory = 1.0 / state.alloc_memory if state.alloc_memory > 0 else 0.0
    state.inv_batch_cpu = 1.0 / state.batch_cpu if state.batch_cpu else 0.0
    state.inv_batch_memory = 1.0 / state.batch_memory if state.batch_memory else 0.0
