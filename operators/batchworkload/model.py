"""What the batch controller reads of a BatchWorkload and its task pods: one snapshot a sync.

A task pod is read through the process-wide pod projection: its index (label), attempt and
counted failures of its index before it (annotations), phase, node, gates, finalizers and
the DisruptionTarget condition (an eviction or a preemption, recreated without counting).

What survives a restart is only what the API holds: the status (`Durable`: completed and
failed indexes, counters, and `recordedPods`, the uids of failed pods already counted while
they still carry the tracking finalizer) and the pods themselves. A failed pod keeps its
finalizer until its replacement exists, so the failure count the replacement carries
(`ANNOTATION_TASK_FAILURES`, like the Job controller's `job-index-failure-count`) is always
derived from a pod the API still has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pilotfish.api.batchworkload import BatchWorkload
from pilotfish.gates import GANG_GATE
from pilotfish.indexranges import IndexRangeError, IndexSet
from pilotfish.workloads import (
    ANNOTATION_TASK_ATTEMPT,
    ANNOTATION_TASK_FAILURES,
    FINALIZER_TASK,
    LABEL_TASK_INDEX,
)

Obj = dict[str, Any]

KIND: Final = "BatchWorkload"
DISRUPTION_TARGET: Final = "DisruptionTarget"
# Set with the tracking finalizer's removal on a pod whose outcome the written status
# holds: the job's pods carrying it are deleted with one deletecollection a sync. Not one of
# `pilotfish.podmeta.KEYS`: it says nothing a tenant could abuse (the pod is going).
LABEL_TASK_RECORDED: Final = "pilotfish.io/task-recorded"

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    reason: str
    note: str
    action: str
    type_: EventType = "Normal"


@dataclass(frozen=True)
class Task:
    """One pod of one task index."""

    name: str
    uid: str
    index: int
    attempt: int
    failures: int  # counted failures of the index before this pod
    phase: str
    bound: bool
    gang_gated: bool
    finalizers: tuple[str, ...]
    terminating: bool
    disrupted: bool
    collectable: bool = False  # labelled `LABEL_TASK_RECORDED`: the deletecollection's

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def live(self) -> bool:
        """May still run: the one thing an index may have at most one of."""
        return not self.terminal

    @property
    def tracked(self) -> bool:
        return FINALIZER_TASK in self.finalizers

    @property
    def unbound(self) -> bool:
        return self.live and not self.bound and not self.terminating


def _int(value: Any) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def retained(pod: Mapping[str, Any]) -> bool:
    """A recorded pod kept until its deletecollection: checked before `task_of`, cheaply,
    because a large job keeps thousands of them."""
    meta = pod.get("metadata") or {}
    return (
        (meta.get("labels") or {}).get(LABEL_TASK_RECORDED) == "true"
        and FINALIZER_TASK not in (meta.get("finalizers") or ())
        and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        and not meta.get("deletionTimestamp")
    )


def task_of(pod: Mapping[str, Any]) -> Task | None:
    """The task a pod is, or None for a pod without a readable index (not one of ours)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    index = _int(labels.get(LABEL_TASK_INDEX))
    if index is None:
        return None
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or [] if isinstance(g, dict)]
    disrupted = any(
        isinstance(c, dict) and c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return Task(
        name=str(meta.get("name")),
        uid=str(meta.get("uid")),
        index=index,
        attempt=_int(annotations.get(ANNOTATION_TASK_ATTEMPT)) or 0,
        failures=_int(annotations.get(ANNOTATION_TASK_FAILURES)) or 0,
        phase=str(status.get("phase") or "Pending"),
        bound=bool(spec.get("nodeName")),
        gang_gated=GANG_GATE in gates,
        finalizers=tuple(str(f) for f in meta.get("finalizers") or []),
        terminating=bool(meta.get("deletionTimestamp")),
        disrupted=disrupted,
        collectable=labels.get(LABEL_TASK_RECORDED) == "true",
    )


def owner_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND:
            found: Mapping[str, Any] = ref
            return found
    return None


def owner_key(obj: Mapping[str, Any]) -> str | None:
    """`namespace/name` of the BatchWorkload controlling the object, if one does."""
    ref = owner_ref(obj)
    if ref is None:
        return None
    return f"{(obj.get('metadata') or {}).get('namespace')}/{ref.get('name')}"


def owner_uid(obj: Mapping[str, Any]) -> str | None:
    ref = owner_ref(obj)
    return None if ref is None else str(ref.get("uid"))


def task_name(job: str, index: int, attempt: int) -> str:
    return f"{job}-{index}-{attempt}"


@dataclass(frozen=True)
class Durable:
    """What the written status says happened: the only memory that survives a restart."""

    completed: IndexSet = field(default_factory=IndexSet)
    failed_indexes: IndexSet = field(default_factory=IndexSet)
    failed: int = 0
    disrupted: int = 0
    recorded: frozenset[str] = frozenset()
    start_time: str | None = None
    completion_time: str | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()

    def condition(self, type_: str) -> Mapping[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == type_), None)

    def is_true(self, type_: str) -> bool:
        c = self.condition(type_)
        return c is not None and c.get("status") == "True"


def _ranges(text: Any) -> IndexSet:
    try:
        return IndexSet.parse(text) if isinstance(text, str) else IndexSet()
    except IndexRangeError:
        return IndexSet()  # the CRD's pattern keeps this from happening


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def durable_of(status: Mapping[str, Any] | None) -> Durable:
    s = status or {}
    conditions = tuple(c for c in s.get("conditions") or [] if isinstance(c, Mapping))
    return Durable(
        completed=_ranges(s.get("completedIndexes")),
        failed_indexes=_ranges(s.get("failedIndexes")),
        failed=_count(s.get("failed")),
        disrupted=_count(s.get("disrupted")),
        recorded=frozenset(str(u) for u in s.get("recordedPods") or []),
        start_time=s.get("startTime"),
        completion_time=s.get("completionTime"),
        conditions=conditions,
    )


@dataclass(frozen=True)
class Pace:
    """The pacing inputs of one sync, measured by the controller (`pacing`)."""

    limit: int  # unbound pods the job may have
    binds_per_second: float
    rate_room: int | None = None  # creates `creationRate` allows now; None: no rate set
    rate_wait: float | None = None  # seconds until the rate allows one more
    held: int = 0  # production pods waiting for placement: no creates while > 0
    held_wait: float | None = None  # seconds until the last of them stops counting
    yield_rate: float = 0.0  # creates/s the job is held to while production arrives (0: not)
    allowed: float = 0.0  # creates/s the job may make now, every rate in one (0: no cap)
    queueing: float = 0.0  # the API server's queueing delay, seen in own writes (`apidelay`)


@dataclass(frozen=True)
class Memo:
    """A retrying index's last pod, remembered in case it is gone before its replacement
    is created (a pod evicted on kwok, deleted by someone): the attempt it was, the failures
    the next attempt carries, and when its backoff began (None: no backoff, a disruption)."""

    attempt: int
    failures: int
    since: float | None


@dataclass(frozen=True)
class Observed:
    """One BatchWorkload and its task pods, as the informers show them."""

    key: str
    bw: Obj
    model: BatchWorkload
    tasks: tuple[Task, ...]
    pace: Pace
    now: str  # wall time, RFC 3339, for API timestamps
    mono: float  # monotonic time of the sync, for every duration
    # Monotonic time each failed pod (by uid) was first seen failed: the backoff's start.
    failed_at: Mapping[str, float] = field(default_factory=dict)
    # Per index, this process's memory of its last pod (lost on a restart: a pod that went
    # away meanwhile then starts its index again at attempt 0 with its failures forgotten).
    memory: Mapping[int, Memo] = field(default_factory=dict)
    # The namespace is being deleted: nothing can be created in it any more.
    namespace_terminating: bool = False
    # Recorded pods kept until they are collected (name, uid): ended, their outcome in the
    # status, untracked and labelled for the deletecollection. Not tasks any more.
    retained: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return str(self.bw["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.bw["metadata"]["namespace"])

    @property
    def generation(self) -> int | None:
        g = self.bw["metadata"].get("generation")
        return g if isinstance(g, int) else None

    @property
    def resource_version(self) -> str:
        return str(self.bw["metadata"].get("resourceVersion") or "")

    @property
    def previous_status(self) -> Mapping[str, Any]:
        status: Mapping[str, Any] = self.bw.get("status") or {}
        return status
