"""What the node lifecycle controller reads of a node and of the pods bound to it, parsed once
from the informers' dicts.

The process-wide projections (`pilotfish.kube.projections.node` and `.pod`) keep at least
these fields: a node's labels, taints and conditions; a pod's metadata (annotations,
ownerReferences, deletionTimestamp), `spec.nodeName`, phase and its Ready and
DisruptionTarget conditions. These views are all the pure phases see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import names
from pilotfish.workloads import is_at_most_one

CONTROLLER: Final = "nodelifecycle"
# The reporting controller of the Events this controller posts.
REPORTING_CONTROLLER: Final = "pilotfish.io/nodelifecycle"

TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
OWNED_KEYS: Final = frozenset({TAINT_NOT_READY, TAINT_UNREACHABLE})
OWNED_EFFECT: Final = "NoSchedule"
EVICT_EFFECT: Final = "NoExecute"
# The kubelet's annotation on the API copy of a static pod: it is not the API's to delete.
ANNOTATION_MIRROR: Final = "kubernetes.io/config.mirror"
DISRUPTION_TARGET: Final = "DisruptionTarget"
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})

Taint = Mapping[str, Any]


@dataclass(frozen=True)
class NodeView:
    name: str
    resource_version: str
    ready: str  # "True", "False" or "Unknown" (also when the condition is absent)
    taints: tuple[Taint, ...]
    # Whether spec.taints exists at all: a JSON patch must `add` it, not `replace` it.
    has_taints: bool
    zone: str = ""  # topology.kubernetes.io/zone; "" is a zone of its own
    ready_reason: str = ""
    uid: str = ""


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    resource_version: str
    ready: str | None  # the Ready condition's status; None when the pod has none
    ready_reason: str
    disrupted: bool  # DisruptionTarget=True already set (by anyone)
    terminating: bool
    terminal: bool  # Succeeded or Failed: nothing runs, nothing to replace
    at_most_one: bool  # pilotfish.io/epoch: the ServiceWorkload controller releases it
    daemonset: bool
    mirror: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def evictable(self) -> bool:
        """An ordinary pod: at-most-one pods are released by their workload's controller,
        DaemonSet pods belong on every node, mirror pods are the kubelet's."""
        return not (self.at_most_one or self.daemonset or self.mirror)


def condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == type_:
            return cond
    return None


def ready_status(node: Mapping[str, Any]) -> str:
    """The node's Ready condition status: "True", "False" or "Unknown" (also when absent)."""
    cond = condition(node, "Ready")
    return "Unknown" if cond is None else str(cond.get("status", "Unknown"))


def owned(taint: Taint) -> bool:
    """A scheduling taint that follows the Ready condition; the NoExecute unreachable taint
    is the silence rule's (`decide.decide`, with `lost`)."""
    return taint.get("key") in OWNED_KEYS and taint.get("effect") == OWNED_EFFECT


def evicting(taint: Taint) -> bool:
    return taint.get("key") == TAINT_UNREACHABLE and taint.get("effect") == EVICT_EFFECT


def node_view(node: Mapping[str, Any]) -> NodeView:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    ready = condition(node, "Ready")
    return NodeView(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        ready=ready_status(node),
        taints=tuple(dict(t) for t in spec.get("taints") or []),
        has_taints="taints" in spec,
        zone=zone_of(node),
        ready_reason=str((ready or {}).get("reason") or ""),
        uid=str(meta.get("uid", "")),
    )


def zone_of(node: Mapping[str, Any]) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return str(labels.get(names.LABEL_ZONE) or "")


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    owners = meta.get("ownerReferences") or []
    ready = condition(pod, "Ready")
    disruption = condition(pod, DISRUPTION_TARGET)
    return PodView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        ready=None if ready is None else str(ready.get("status", "Unknown")),
        ready_reason=str((ready or {}).get("reason") or ""),
        disrupted=disruption is not None and disruption.get("status") == "True",
        terminating=bool(meta.get("deletionTimestamp")),
        terminal=(pod.get("status") or {}).get("phase") in TERMINAL_PHASES,
        at_most_one=is_at_most_one(pod),
        daemonset=any(
            isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller")
            for o in owners
        ),
        mirror=ANNOTATION_MIRROR in annotations,
    )


def node_ref(node: NodeView) -> dict[str, Any]:
    """The node as `EventPoster.post` takes it (an object's shape): Events about a node go
    to the `default` namespace, as the kubelet's do."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "uid": node.uid}}
