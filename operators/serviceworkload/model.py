"""What the controller reads of a ServiceWorkload and its objects: one snapshot per round.

Every decision of a round is taken from one `Observed`: the workload as the informer has
it, the pods, ControllerRevisions and PodDisruptionBudget it controls (by ownerReference
uid, never by label alone), and the wall time of the round. Nothing in it is what the
controller *meant* to write: a round only starts once the informers show every write of
the previous one (`pilotfish.kube.ownwrites`), so the snapshot is the API's, not ours.

Pods are read through the process-wide pod projection (`pilotfish.kube.projections.pod`):
metadata, `spec.nodeName`, phase, IP and conditions are all `pod_state` reads.

Only pods whose controlling ownerReference is the workload's uid are its pods: a pod with
the workload's label but another owner (say, of a deleted workload of the same name that the
garbage collector has not finished) is never counted, adopted or touched.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from pilotfish.api.serviceworkload import ServiceWorkload
from pilotfish.operators.serviceworkload.revisions import RevisionInfo, controlled_by
from pilotfish.operators.serviceworkload.rolling import PodState
from pilotfish.operators.serviceworkload.status import ReplicaFailure
from pilotfish.timeutil import parse_time_or_none
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    DISRUPTION_NODE_LOST,
    LABEL_REVISION,
)

if TYPE_CHECKING:
    from pilotfish.operators.serviceworkload.atmostone import Fencing

Obj = dict[str, Any]

KIND: Final = "ServiceWorkload"
DISRUPTION_TARGET: Final = "DisruptionTarget"
# DisruptionTarget reasons of a pod evicted from a lost node: Pilotfish's node lifecycle
# controller's, and upstream's taint-eviction controller's (managed clusters).
NODE_LOST_REASONS: Final = frozenset({DISRUPTION_NODE_LOST, "DeletionByTaintManager"})

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """An Event about the workload, decided with the write it reports (posted once that
    write succeeded) or on its own (a spec the controller cannot act on)."""

    reason: str
    note: str
    action: str
    type_: EventType = "Normal"


@dataclass(frozen=True)
class Observed:
    """One workload and what it controls, as the informers show them at `now`."""

    key: str
    sw: Obj  # the raw object: status, resourceVersion, the template as written
    model: ServiceWorkload  # the validated spec
    pods: tuple[Obj, ...]
    revisions: tuple[RevisionInfo, ...]  # oldest number first
    pdb: Obj | None  # the PodDisruptionBudget named like the workload, whoever owns it
    at: datetime.datetime  # wall time of the round: the timestamps compared are wall time
    # The last refused pod create of this generation (in-process memory: re-learnt by the
    # next refused create after a restart).
    failure: ReplicaFailure | None = None
    # For an `atMostOne` workload: its identity Lease and its pods' nodes' silence.
    fencing: Fencing | None = None
    # The nodes its pods run on that are being drained (`pilotfish.io/draining`).
    draining: frozenset[str] = frozenset()

    @property
    def now(self) -> float:
        """`at` in seconds since the epoch, the planner's unit."""
        return self.at.timestamp()

    @property
    def uid(self) -> str:
        return str(self.sw["metadata"]["uid"])

    @property
    def namespace(self) -> str:
        return str(self.sw["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.sw["metadata"]["name"])

    @property
    def generation(self) -> int | None:
        generation = self.sw["metadata"].get("generation")
        return int(generation) if generation is not None else None

    @property
    def template(self) -> Mapping[str, Any]:
        """The template as written (not the model's dump): its hash names the revision."""
        template: Mapping[str, Any] = (self.sw.get("spec") or {}).get("template") or {}
        return template

    @property
    def previous_status(self) -> Mapping[str, Any]:
        status: Mapping[str, Any] = self.sw.get("status") or {}
        return status


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time; None if absent or unreadable."""
    t = parse_time_or_none(value)
    return None if t is None else t.timestamp()


def owner_key(obj: Mapping[str, Any]) -> str | None:
    """`namespace/name` of the ServiceWorkload controlling the object, if one does."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND:
            return f"{meta.get('namespace')}/{ref.get('name')}"
    return None


def is_ours(obj: Mapping[str, Any], uid: str) -> bool:
    return controlled_by(obj, uid)


def _ready_since(pod: Mapping[str, Any], created: float) -> float | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") != "True":
                return None
            return parse_time(cond.get("lastTransitionTime")) or created
    return None


def _unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message while it has tried and cannot place the pod (a gated pod
    was never tried: its reason is SchedulingGated, not Unschedulable)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                return str(cond.get("message") or "no reason given by the scheduler")
            return None
    return None


def evicted_from_lost_node(pod: Mapping[str, Any]) -> bool:
    """Being deleted after an eviction from a lost node: Terminating until the node
    returns, and never counted (see `rolling`)."""
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == DISRUPTION_TARGET
        and c.get("status") == "True"
        and c.get("reason") in NODE_LOST_REASONS
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def pod_state(pod: Mapping[str, Any], now: float) -> PodState:
    """The planner's view of a pod. An unreadable drain-request time counts as long ago
    (the request is there; waiting forever on an unreadable time would wedge the pod)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    created = parse_time(meta.get("creationTimestamp")) or now
    phase = status.get("phase")
    drain = annotations.get(ANNOTATION_DRAIN)
    return PodState(
        name=str(meta.get("name")),
        revision=str((meta.get("labels") or {}).get(LABEL_REVISION, "")),
        created_at=created,
        scheduled=bool((pod.get("spec") or {}).get("nodeName")),
        running=phase == "Running",
        ready_since=_ready_since(pod, created),
        terminated=phase in ("Failed", "Succeeded"),
        terminating=bool(meta.get("deletionTimestamp")),
        drain_requested_at=None if not drain else (parse_time(drain) or 0.0),
        drained_at=parse_time(annotations.get(ANNOTATION_DRAINED)),
        has_address=bool(status.get("podIP")),
        unschedulable=_unschedulable(pod),
        lost=evicted_from_lost_node(pod),
    )
