"""Apply: one maintenance round's writes, each conditional, in the order that keeps a
restarted process safe.

- Cordon: one JSON patch per node that opens with a `test` of the resourceVersion it was
  decided from and sets `spec.unschedulable` with both annotations (`draining`, and
  `cordoned-by` only when this maintenance is the one cordoning), so a node is never seen
  cordoned by Pilotfish without saying by whom, and a concurrent change refuses the patch.
- Evict: policy/v1 Eviction with the pod's uid as precondition, never a delete. A 429 is a
  budget saying "not now": a Refusal recorded for the pod, its retry paced, never an error.
  After an accepted eviction the pod is read once, so the round after waits for the
  informer to show it terminating (OwnWrites) instead of evicting it again from the past.
- Status: a JSON patch with a `test` of the NodeMaintenance's resourceVersion, last, and
  only when it changed (a refused one re-decides from the fresh object). The round's Events
  are posted whatever the status write's fate: a transition the next round finds already
  past would otherwise never be named.
- Release: the nodes this maintenance cordoned are uncordoned, and its annotations removed
  from every node, by the same kind of conditional patch.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from pilotfish import metrics, names
from pilotfish.kube.events import ControllerEvents, EventType
from pilotfish.kube.informer import Obj
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, NODEMAINTENANCES, NODES, PODS, ApiError, Rest
from pilotfish.operators.maintenance.model import CONTROLLER, PodRef, Refusal

log = logging.getLogger("pilotfish.maintenance")

ACTION_DRAIN: Final = "Drain"
_BUDGET_IN_CAUSE = re.compile(r"disruption budget (?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)")


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _test(obj: Mapping[str, Any]) -> dict[str, Any]:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return {"op": "test", "path": "/metadata/resourceVersion", "value": rv}


def cordon_patch(node: Mapping[str, Any], nm: str, set_unschedulable: bool) -> list[dict[str, Any]]:
    """Cordon `node` for `nm`, conditional on the version read: `set_unschedulable` False
    when someone else had cordoned it (they keep it; only the draining annotation is ours)."""
    add = {names.ANNOTATION_DRAINING: nm}
    if set_unschedulable:
        add[names.ANNOTATION_CORDONED_BY] = nm
    ops = [_test(node)]
    annotations = (node.get("metadata") or {}).get("annotations")
    if annotations is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": add})
    else:
        ops += [
            {"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v}
            for k, v in add.items()
        ]
    if set_unschedulable:
        ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
    return ops


def release_patch(node: Mapping[str, Any], nm: str) -> list[dict[str, Any]] | None:
    """Undo what `nm` did to `node`: uncordon if it cordoned it, drop its annotations. None
    when nothing of `nm`'s is left on the node."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    ours = [
        k
        for k in (names.ANNOTATION_DRAINING, names.ANNOTATION_CORDONED_BY)
        if annotations.get(k) == nm
    ]
    if not ours:
        return None
    ops = [_test(node)]
    ops += [{"op": "remove", "path": f"/metadata/annotations/{_pointer(k)}"} for k in ours]
    cordoned = annotations.get(names.ANNOTATION_CORDONED_BY) == nm
    if cordoned and "unschedulable" in (node.get("spec") or {}):
        ops.append({"op": "remove", "path": "/spec/unschedulable"})
    return ops


class Outcome(Enum):
    OK = "ok"
    GONE = "gone"  # the object is no longer there: nothing to do
    STALE = "stale"  # decided from an older copy: refused, decide again


async def _conditional_patch(
    rest: Rest, path: str, ops: list[dict[str, Any]]
) -> tuple[Outcome, Obj | None]:
    """A JSON patch that opens with a `test`: gone, stale (the test or a conflict refused
    it), or written with what the server returned."""
    try:
        returned = await rest.patch(path, ops, JSON_PATCH)
    except ApiError as e:
        if e.not_found:
            return Outcome.GONE, None
        if e.status in (409, 422):
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
            return Outcome.STALE, None
        raise
    return Outcome.OK, returned


async def patch_node(
    rest: Rest, writes: OwnWrites, nm: str, name: str, ops: list[dict[str, Any]]
) -> Outcome:
    outcome, returned = await _conditional_patch(rest, NODES.path(name=name), ops)
    if returned is not None:
        writes.wrote(name, returned, owner=nm)
    return outcome


class Evicted(Enum):
    EVICTED = "evicted"
    REFUSED = "refused"
    GONE = "gone"
    ERROR = "error"


def refusal_of(error: ApiError, namespace: str) -> Refusal:
    """The budget a 429 names ("The disruption budget web needs 5 healthy pods and has 5
    currently"), when it names one; the API server's own words as the message."""
    causes = (error.body.get("details") or {}).get("causes") or []
    texts = [str(c.get("message") or "") for c in causes if isinstance(c, Mapping)]
    budget = None
    for text in texts:
        found = _BUDGET_IN_CAUSE.search(text)
        if found:
            budget = f"{namespace}/{found.group('name')}"
            break
    message = "; ".join(t for t in texts if t) or error.message
    return Refusal(budget, f"eviction refused (429): {message}"[:1024])


def eviction(pod: PodRef) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": {"preconditions": {"uid": pod.uid}},
    }


async def evict(rest: Rest, writes: OwnWrites, nm: str, pod: PodRef) -> tuple[Evicted, Any]:
    """(result, Refusal on 429 | the error's text otherwise)."""
    try:
        await rest.create(PODS.path(pod.namespace, pod.name, "eviction"), eviction(pod))
    except ApiError as e:
        if e.status == 429:
            metrics.MAINTENANCE_EVICTIONS.labels("refused").inc()
            return Evicted.REFUSED, refusal_of(e, pod.namespace)
        if e.not_found or e.conflict:  # gone, or replaced by a pod of the same name
            return Evicted.GONE, None
        metrics.MAINTENANCE_EVICTIONS.labels("error").inc()
        log.warning("eviction failed", extra={"maintenance": nm, "pod": pod.key, "error": str(e)})
        return Evicted.ERROR, str(e)
    metrics.MAINTENANCE_EVICTIONS.labels("evicted").inc()
    try:
        got = await rest.get(PODS.path(pod.namespace, pod.name))
    except ApiError as e:
        if not e.not_found:
            raise
        writes.deleted(pod.key, owner=nm)
    else:
        if (got.get("metadata") or {}).get("uid") == pod.uid:
            writes.wrote(pod.key, got, owner=nm)
    return Evicted.EVICTED, None


async def write_status(rest: Rest, nm: Obj, status: Mapping[str, Any]) -> Outcome:
    name = str(nm["metadata"]["name"])
    ops = [_test(nm), {"op": "add", "path": "/status", "value": dict(status)}]
    path = NODEMAINTENANCES.path(name=name, sub="status")
    outcome, _ = await _conditional_patch(rest, path, ops)
    return outcome


@dataclass
class Round:
    """What one round's writes came to."""

    stale: list[str] = field(default_factory=list)
    evicted: dict[str, int] = field(default_factory=dict)  # node -> pods evicted
    refused: dict[PodRef, Refusal] = field(default_factory=dict)
    accepted: list[PodRef] = field(default_factory=list)  # evicted, or gone already
    errors: list[str] = field(default_factory=list)
    status_written: bool = False


def post_events(events: ControllerEvents, nm: Obj, intents: Iterable[Any]) -> None:
    """The round's Events, on the NodeMaintenance (its reference is the poster's to make)."""
    for e in intents:
        kind: EventType = "Warning" if e.type_ == "Warning" else "Normal"
        events.post(nm, e.reason, e.note, action=ACTION_DRAIN, type_=kind)
