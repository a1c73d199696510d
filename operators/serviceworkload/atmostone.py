"""The at-most-one phase: one pod per identity, fenced by an epoch, even across lost machines.

A ServiceWorkload with `atMostOne: true` (replicas 0 or 1) runs its pod under an identity
Lease, `<workload>-at-most-one` in the workload's namespace: `holderIdentity` names the pod
that may run, annotation `pilotfish.io/epoch` its epoch N, and the pod carries the same
annotation (and env PILOTFISH_EPOCH from it), so whatever it writes can be fenced by N.
`spec.acquireTime` is set once the holder pod is seen created: a holder that then goes away
is replaced under a new epoch, never recreated under its old one.

The rule the design gives: the holder's agent stops it 30 s after the last node-lease renewal
it *sent*; the controller replaces it only once the old pod is gone, or terminal, or its node
has been silent `at_most_one_release_after` (unreachable_after + a clock-drift margin) since
the last renewal *this process saw* (never seen: never released). A restarted controller
has seen nothing yet, so it waits the whole period again: it errs late, never early.

Every replacement goes the same way, each step conditional and each resumable on its own
after a crash between any two, because the Lease says where the release stands:

1. bump the Lease (resourceVersion-conditional): epoch N+1, holder the new pod's name,
   which is deterministic (`<workload>-e<N+1>`), so a repeated create is a 409, never a
   second pod;
2. delete the old pod (uid precondition): with grace 0 when it is terminal or its node is
   lost (nothing will confirm a graceful stop), gracefully otherwise (a rollout, a scale
   down, a pod from before `atMostOne` was set) and then wait until it is gone;
3. create the holder pod with epoch N+1, only while no other pod may still run.

So a rollout replaces (delete, wait gone, create) and never surges. Pure: the Lease as read,
the pods and their nodes' silence in; writes, the `AtMostOne` condition and Events out.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish import names
from pilotfish.operators.serviceworkload.model import Event
from pilotfish.podtemplate import owner_reference
from pilotfish.timeutil import format_micro_time, format_time
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

Obj = dict[str, Any]

LEASE_SUFFIX: Final = "-at-most-one"
ENV_EPOCH: Final = "PILOTFISH_EPOCH"
CONDITION: Final = "AtMostOne"
# Reasons of the AtMostOne condition.
REASON_HELD: Final = "Held"  # True: the holder runs (or is being created)
REASON_NO_REPLICAS: Final = "NoReplicas"  # True: replicas 0, nothing holds the identity
REASON_WAITING: Final = "WaitingForLeaseExpiry"  # False: a pod on a silent node may still run
REASON_REPLACING: Final = "Replacing"  # False: waiting for a pod to stop before the next
REASON_NOT_OWNED: Final = "LeaseNotOwned"  # False: someone else's Lease has the name
EVENT_WAITING: Final = "AtMostOneWaiting"
EVENT_RELEASED: Final = "AtMostOneReleased"
EVENT_REPLACED: Final = "AtMostOneReplaced"
# Why a fenced pod is deleted (event reasons): surely stopped (grace 0), or to be replaced.
EVENT_POD_RELEASED: Final = "PodReleased"
EVENT_POD_REPLACED: Final = "PodReplaced"
TERMINAL: Final = frozenset({"Failed", "Succeeded"})


@dataclass(frozen=True)
class Fencing:
    """What the phase reads besides the pods: the Lease as the API has it now (a GET each
    round: the release must not be decided from a lagging watch) and the silence of the
    nodes the pods are on, on this process's clock."""

    lease: Obj | None
    silent: Mapping[str, float | None]
    release_after: float
    lease_seconds: int


@dataclass(frozen=True)
class LeaseWrite:
    body: Obj  # create when it has no resourceVersion, else a conditional replace
    event: Event | None = None  # posted once written


@dataclass(frozen=True)
class FencedDelete:
    name: str
    uid: str
    grace_zero: bool
    event: Event


@dataclass(frozen=True)
class FencedCreate:
    name: str
    epoch: int
    revision: str


@dataclass(frozen=True)
class FencingPlan:
    lease: LeaseWrite | None = None
    deletes: tuple[FencedDelete, ...] = ()
    create: FencedCreate | None = None
    condition: tuple[str, str, str] = ("True", REASON_HELD, "")
    events: tuple[Event, ...] = ()
    wake_in: float | None = None  # seconds until the decision changes with no event
    waiting_on: str | None = None  # the silent node a release waits for


def lease_name(workload: str) -> str:
    return f"{workload}{LEASE_SUFFIX}"


def holder_name(workload: str, epoch: int) -> str:
    return f"{workload}-e{epoch}"


def epoch_of(obj: Mapping[str, Any]) -> int:
    """The epoch annotation; 0 when absent or unreadable (a pod from before atMostOne)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_EPOCH)
    try:
        return max(0, int(str(raw)))
    except ValueError:
        return 0


@dataclass(frozen=True)
class _Pod:
    name: str
    uid: str
    node: str | None
    epoch: int
    revision: str
    terminal: bool
    terminating: bool
    silent: float | None  # of its node

    def released(self, after: float) -> bool:
        """Surely not running: terminal, or its node silent for the whole release period."""
        return self.terminal or (self.silent is not None and self.silent >= after)


def _pod(p: Mapping[str, Any], silent: Mapping[str, float | None]) -> _Pod:
    meta = p.get("metadata") or {}
    node = (p.get("spec") or {}).get("nodeName") or None
    return _Pod(
        name=str(meta.get("name")),
        uid=str(meta.get("uid", "")),
        node=node,
        epoch=epoch_of(p),
        revision=str((meta.get("labels") or {}).get(LABEL_REVISION, "")),
        terminal=(p.get("status") or {}).get("phase") in TERMINAL,
        terminating=bool(meta.get("deletionTimestamp")),
        silent=silent.get(node) if node else None,
    )


def lease_body(
    sw: Mapping[str, Any], epoch: int, seconds: int, transitions: int, rv: str | None
) -> Obj:
    meta = sw["metadata"]
    out: Obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {LABEL_WORKLOAD: meta["name"]},
            "annotations": {names.ANNOTATION_EPOCH: str(epoch)},
            "ownerReferences": [owner_reference(sw)],
        },
        "spec": {
            "holderIdentity": holder_name(meta["name"], epoch),
            "leaseDurationSeconds": seconds,
            "leaseTransitions": transitions,
        },
    }
    if rv is not None:
        out["metadata"]["resourceVersion"] = rv
    return out


def acquired(lease: Mapping[str, Any], at: datetime.datetime) -> Obj:
    """The Lease with its holder recorded as created (acquireTime, renewTime)."""
    out = copy.deepcopy(dict(lease))
    stamp = format_micro_time(at)
    out["spec"] = {**(out.get("spec") or {}), "acquireTime": stamp, "renewTime": stamp}
    return out


def fenced_pod(pod: Obj, epoch: int) -> Obj:
    """`pod` carrying its epoch: the annotation, and PILOTFISH_EPOCH in every container from
    it (the downward API, so the value is the annotation's, whatever the template says)."""
    out = copy.deepcopy(pod)
    out["metadata"].setdefault("annotations", {})[names.ANNOTATION_EPOCH] = str(epoch)
    ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{names.ANNOTATION_EPOCH}']"}}
    spec = out.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            env = [e for e in c.get("env") or [] if e.get("name") != ENV_EPOCH]
            c["env"] = [*env, {"name": ENV_EPOCH, "valueFrom": ref}]
    return out


def _owned(lease: Mapping[str, Any], uid: str) -> bool:
    refs = (lease.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


@dataclass
class _Decision:
    lease: LeaseWrite | None = None
    deletes: list[FencedDelete] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def decide_fencing(
    *,
    sw: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    fencing: Fencing,
    replicas: int,
    revision: str,
    at: datetime.datetime,
    previous_reason: str | None,
) -> FencingPlan:
    """The next steps for one at-most-one identity; `revision`: what its pod should run."""
    meta = sw["metadata"]
    workload, uid = str(meta["name"]), str(meta["uid"])
    after = fencing.release_after
    views = [_pod(p, fencing.silent) for p in pods]
    lease = fencing.lease
    if lease is not None and not _owned(lease, uid):
        note = f"Lease {lease_name(workload)} exists and is not this workload's: no pod is run"
        return FencingPlan(condition=("False", REASON_NOT_OWNED, note))
    d = _Decision()
    top = max([epoch_of(lease) if lease else 0, *(p.epoch for p in views)])

    def bump(event: Event | None) -> int:
        spec = (lease or {}).get("spec") or {}
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        rv = lease["metadata"]["resourceVersion"] if lease else None
        d.lease = LeaseWrite(lease_body(sw, top + 1, fencing.lease_seconds, transitions, rv), event)
        return top + 1

    # 1. The Lease names the pod that may run next (bumped for every replacement).
    if lease is None:
        if replicas == 0 and not views:
            return FencingPlan(condition=("True", REASON_NO_REPLICAS, "replicas 0: no pod runs"))
        epoch = bump(None)
    else:
        epoch = epoch_of(lease)
        holder = next((p for p in views if p.name == holder_name(workload, epoch)), None)
        was_created = bool((lease.get("spec") or {}).get("acquireTime"))
        if holder is None and was_created:
            epoch = bump(None)
        elif holder is not None and holder.released(after):
            why = "terminated" if holder.terminal else f"node {holder.node} silent"
            note = (
                f"pod {holder.name} (epoch {holder.epoch}) released: {why}"
                + (f" for {holder.silent:.0f}s" if not holder.terminal and holder.silent else "")
                + f"; pod {holder_name(workload, top + 1)} takes epoch {top + 1}"
            )
            epoch = bump(Event(EVENT_RELEASED, note, "ReleaseIdentity"))
        elif (
            holder is not None
            and not holder.terminating
            and (replicas == 0 or holder.revision != revision or holder.epoch != epoch)
        ):
            note = (
                f"pod {holder.name} (epoch {holder.epoch}) is replaced: stopped before pod "
                f"{holder_name(workload, top + 1)} (epoch {top + 1}) starts"
            )
            epoch = bump(Event(EVENT_REPLACED, note, "ReplaceIdentity"))
        elif holder is not None and not was_created:
            d.lease = LeaseWrite(acquired(lease, at))
    name = holder_name(workload, epoch)

    # 2. Every other pod goes: at once when it surely does not run, else gracefully.
    blocking: list[_Pod] = []
    for p in views:
        if p.name == name:
            continue
        if p.released(after):
            why = "terminated" if p.terminal else f"node {p.node} silent for {p.silent:.0f}s"
            note = f"deleted pod {p.name} (epoch {p.epoch}) with grace 0: {why}"
            d.deletes.append(
                FencedDelete(p.name, p.uid, True, Event(EVENT_POD_RELEASED, note, "DeletePod"))
            )
            continue
        blocking.append(p)
        if not p.terminating:
            note = f"deleted pod {p.name} (epoch {p.epoch}): pod {name} replaces it"
            d.deletes.append(
                FencedDelete(p.name, p.uid, False, Event(EVENT_POD_REPLACED, note, "DeletePod"))
            )

    # 3. The holder pod, once nothing else may run.
    holder_exists = any(p.name == name for p in views)
    create = None
    if replicas >= 1 and not holder_exists and not blocking:
        create = FencedCreate(name, epoch, revision)

    cond, wake_in, waiting_on = _report(views, blocking, name, epoch, replicas, fencing, at)
    if cond[1] == REASON_WAITING and previous_reason != REASON_WAITING:
        d.events.append(Event(EVENT_WAITING, cond[2], "WaitForLeaseExpiry"))
    return FencingPlan(
        d.lease, tuple(d.deletes), create, cond, tuple(d.events), wake_in, waiting_on
    )


def _report(
    views: Sequence[_Pod],
    blocking: Sequence[_Pod],
    name: str,
    epoch: int,
    replicas: int,
    fencing: Fencing,
    at: datetime.datetime,
) -> tuple[tuple[str, str, str], float | None, str | None]:
    """The AtMostOne condition, when to look again, and the silent node waited for.

    A round comes back when the silence of a node that holds a pod that may still run
    would reach the release period, so the release is on time even when nothing else
    about the pod changes. The wait is reported once that node is unreachable (silent for
    the lease's duration); before that a gap between renewals is not a lost machine.
    """
    after = fencing.release_after
    holder = next((p for p in views if p.name == name), None)
    suspect = [p for p in blocking if p.silent is not None and not p.released(after)]
    if holder is not None and holder.silent is not None and not holder.released(after):
        suspect.insert(0, holder)
    wake_in = min((after - (p.silent or 0.0) for p in suspect), default=None)
    lost = next((p for p in suspect if (p.silent or 0.0) >= fencing.lease_seconds), None)
    if lost is not None:
        silent = lost.silent or 0.0
        release_at = format_time(at + datetime.timedelta(seconds=after - silent))
        message = (
            f"pod {lost.name} (epoch {lost.epoch}) on node {lost.node}, silent for "
            f"{silent:.0f}s: no replacement until its lease surely expired "
            f"({after:g}s of silence); releases at about {release_at}"
        )
        return ("False", REASON_WAITING, message), wake_in, lost.node
    if blocking:
        p = blocking[0]
        message = (
            f"waiting for pod {p.name} (epoch {p.epoch}) to stop before pod {name} "
            f"(epoch {epoch}) starts"
        )
        return ("False", REASON_REPLACING, message), wake_in, None
    if replicas == 0:
        message = f"replicas 0: no pod runs; next is {name} (epoch {epoch})"
        return ("True", REASON_NO_REPLICAS, message), wake_in, None
    message = f"pod {name} holds the identity at epoch {epoch}"
    return ("True", REASON_HELD, message), wake_in, None
