"""Replicas: pods made from the template, and what the planner needs to know about each.

Pods are named `<workload>-<revision hash>-<5 random characters>` by the controller itself,
not by `generateName`, so that the name of a pod is known *before* the create is sent: the
controller records it as expected first, and if the answer is lost (timeout, connection
reset) the pod still counts toward the surge bound until the watch shows it or the
expectation expires. With generateName a lost answer would leave a pod nobody counts.

Only pods whose controlling ownerReference is the workload's uid are its pods: a pod with
the workload's label but another owner (say, of a deleted workload of the same name that the
garbage collector has not finished) is never counted, adopted or touched.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Mapping
from typing import Any, Final

from pilotfish.operators.serviceworkload.revisions import controlled_by
from pilotfish.operators.serviceworkload.rolling import PodState
from pilotfish.timeutil import parse_time_or_none
from pilotfish.workloads import ANNOTATION_DRAIN, ANNOTATION_DRAINED, LABEL_REVISION

Obj = dict[str, Any]

SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LENGTH: Final = 5
KIND: Final = "ServiceWorkload"


def format_time(t: float) -> str:
    """RFC 3339 with microseconds, UTC: the drain annotations' format."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (with or without fraction); None if
    absent or unreadable."""
    t = parse_time_or_none(value)
    return None if t is None else t.timestamp()


def random_suffix(rng: random.Random) -> str:
    return "".join(rng.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))


def owner_key(pod: Mapping[str, Any]) -> str | None:
    """`namespace/name` of the ServiceWorkload controlling the pod, if one does."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND:
            return f"{meta.get('namespace')}/{ref.get('name')}"
    return None


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
    )


def is_ours(pod: Mapping[str, Any], uid: str) -> bool:
    return controlled_by(pod, uid)


def drain_patch(pod: Mapping[str, Any], now: str) -> list[dict[str, Any]]:
    """Ask for the pod to leave rotation, only on the version decided from (JSON patch)."""
    meta = pod["metadata"]
    annotations = dict(meta.get("annotations") or {})
    annotations[ANNOTATION_DRAIN] = now
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]


def slim_pod(pod: Obj) -> Obj:
    """What the controller keeps of a pod: metadata, node, phase, IP and conditions.

    At tens of thousands of pods the specs (containers, volumes, env) are most of the
    memory and the controller never reads them.
    """
    meta = dict(pod.get("metadata") or {})
    meta.pop("managedFields", None)
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    return {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": meta,
        "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
        "status": {k: status[k] for k in ("phase", "podIP", "reason", "conditions") if k in status},
    }
