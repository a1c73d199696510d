"""What a process keeps of the objects it watches most: one projection per kind.

The shared informer holds one copy of each pod for every controller of the process, so its
projection is the union of what those controllers read, and nothing else: a full pod is
~18 KB (managedFields, env, volumes, probes, container statuses), this view about a tenth
of it, which is what lets one operator watch 30,000 pods. A controller that starts reading
another pod field adds it here; reading a field the projection drops finds it absent
(`tests/test_projections.py` pins what is kept).

Strings that repeat across objects (every key, label and annotation names, phases,
condition types, node and image names, timestamps to the second) are interned, so 30,000
pods share one copy of each; the strings unique to an object (name, uid, resourceVersion,
IPs) are left alone, as interning them would only cost a table entry.
"""

from __future__ import annotations

import sys
from typing import Any

from pilotfish import gates

Obj = dict[str, Any]

# Annotations that can be large and that no Pilotfish component reads.
_DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
_UNIQUE_META = frozenset({"name", "uid", "resourceVersion"})
_SHORT = 96  # longer strings (a gate record, a message) are rarely shared

_POD_SPEC = ("nodeName", "schedulingGates", "priority", "priorityClassName", "overhead")
_POD_STATUS = ("phase", "reason", "podIP", "podIPs")
# The pod conditions controllers read: Ready (serving, availability), PodScheduled (why a
# pod waits), DisruptionTarget (an evicted or preempted batch task is recreated, not counted
# as failed) and the gate controller's own; the other kubelet conditions are a third of a
# pod's status.
_CONDITIONS = frozenset({"Ready", "PodScheduled", "DisruptionTarget", gates.POD_CONDITION})
_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime", "observedGeneration")


def shared(value: Any) -> Any:
    """`value` with its keys and short strings interned, recursively."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _SHORT else value
    if isinstance(value, dict):
        return {sys.intern(k): shared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shared(v) for v in value]
    return value


def metadata(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    out: Obj = {}
    for k, v in meta.items():
        if k in ("managedFields", "generateName", "selfLink"):
            continue
        kept = v
        if k == "annotations" and not _DROPPED_ANNOTATIONS.isdisjoint(v or {}):
            kept = {a: b for a, b in v.items() if a not in _DROPPED_ANNOTATIONS}
        out[sys.intern(k)] = kept if k in _UNIQUE_META else shared(kept)
    return out


def _container(c: Obj) -> Obj:
    out: Obj = {k: shared(c[k]) for k in ("name", "image", "ports") if k in c}
    requests = (c.get("resources") or {}).get("requests")
    if requests:
        out["resources"] = {"requests": shared(requests)}
    return out


def _containers(items: Any) -> list[Obj]:
    return [_container(c) for c in items or [] if isinstance(c, dict)]


def pod(obj: Obj) -> Obj:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out_spec: Obj = {k: shared(spec[k]) for k in _POD_SPEC if k in spec}
    out_spec["containers"] = _containers(spec.get("containers"))
    if spec.get("initContainers"):
        out_spec["initContainers"] = _containers(spec.get("initContainers"))
    # Only whether a volume is an emptyDir (a drain loses its data: the maintenance
    # controller asks for an opt-in), not its size limit or medium, nor the other volumes.
    local = [
        {"name": shared(v.get("name")), "emptyDir": {}}
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and "emptyDir" in v
    ]
    if local:
        out_spec["volumes"] = local
    out_status: Obj = {k: status[k] for k in _POD_STATUS if k in status}
    if "phase" in out_status:
        out_status["phase"] = shared(out_status["phase"])
    conditions = [
        {sys.intern(k): shared(c[k]) for k in _CONDITION if c.get(k) is not None}
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") in _CONDITIONS
    ]
    if conditions:
        out_status["conditions"] = conditions
    return {
        "apiVersion": sys.intern(str(obj.get("apiVersion", "v1"))),
        "kind": sys.intern(str(obj.get("kind", "Pod"))),
        "metadata": metadata(obj),
        "spec": out_spec,
        "status": out_status,
    }


_NODE_STATUS = ("allocatable", "capacity", "conditions")


def node(obj: Obj) -> Obj:
    """Labels, taints, unschedulable, allocatable, conditions and the names of the images it
    holds (the gate controller's image condition; not their sizes and digests lists' other
    fields); no addresses, no daemon endpoints."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out_status = {k: shared(status[k]) for k in _NODE_STATUS if k in status}
    images = [
        {"names": shared(list(i.get("names") or []))}
        for i in status.get("images") or []
        if isinstance(i, dict)
    ]
    if images:
        out_status["images"] = images
    return {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Node"),
        "metadata": metadata(obj),
        "spec": {k: spec[k] for k in ("taints", "unschedulable", "providerID") if k in spec},
        "status": out_status,
    }


def slim(obj: Obj) -> Obj:
    """Any other kind: everything but managedFields."""
    meta = obj.get("metadata")
    if meta:
        meta.pop("managedFields", None)
    return obj
