"""What a process keeps of the objects it watches most: one projection per kind.

The shared informer holds one copy of each pod for every controller of the process, so its
projection is the union of what those controllers read, and nothing else: a full pod is
~18 KB (managedFields, env, volumes, probes, container statuses), this view about a tenth
of it, which is what lets one operator watch 30,000 pods. A controller that starts reading
another pod field adds it here; reading a field the projection drops finds it absent
(`tests/test_projections.py` pins what is kept).

What is left is mostly small dicts and lists, and most repeat across pods: the containers,
owner references and finalizers of one workload's pods, the labels of one revision in one
zone, conditions set in the same second. Each is kept once per process (`shared`: looked up
by its JSON text in a bounded LRU), which takes a projected pod from ~3.3 KB of Python
objects to ~1.6 KB, the cache included; strings are interned (keys, label and annotation
values, phases, node names, timestamps to the second), but not those one object's own
(name, uid, resourceVersion, IPs): sharing them would only cost a table entry. A shared
sub-tree is read by every pod holding it, so nothing may change a projected object in place.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import orjson

from pilotfish import gates

Obj = dict[str, Any]

# Annotations that can be large and that no Pilotfish component reads.
_DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
_UNIQUE_META = frozenset({"name", "uid", "resourceVersion"})
_SHORT = 96  # longer strings (a gate record, a message) are rarely shared
# Sub-trees whose JSON is longer are rarely repeated whole (a gate record, a node's images):
# only their parts are shared, so no cache entry holds a large key.
_SHARED_KEY_MAX = 512
# Sub-trees remembered, the least recently seen forgotten first: a value one pod's own (a
# batch task's labels carry its index) passes through. At 30,000 pods, 1,024 entries keep
# them within 2 % of the bytes an unbounded cache does; 4,096 leave room for more workloads
# and take ~2 MB.
SHARED_MAX = 4096

_POD_SPEC = ("nodeName", "schedulingGates", "priority", "priorityClassName", "overhead")
_POD_STATUS = ("phase", "reason", "podIP")
# The pod conditions controllers read: Ready (serving, availability), PodScheduled (why a
# pod waits), DisruptionTarget (an evicted or preempted batch task is recreated, not counted
# as failed) and the gate controller's own; the other kubelet conditions are a third of a
# pod's status.
_CONDITIONS = frozenset({"Ready", "PodScheduled", "DisruptionTarget", gates.POD_CONDITION})
_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime", "observedGeneration")


def shared(value: Any) -> Any:
    """`value` (JSON as decoded: no tuples, no NaN) as the process's one copy of it: an equal
    dict or list seen recently is that object, short strings are interned. Never to be
    changed in place."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _SHORT else value
    if type(value) is int:
        return _one_int(value)
    if not isinstance(value, (dict, list)):
        return value
    try:
        key = orjson.dumps(value).decode()  # a str of its size: orjson's bytes keep 4 KB
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return _parts_shared(value)
    if len(key) > _SHARED_KEY_MAX:
        return _parts_shared(value)
    return _canonical(key)


@functools.lru_cache(maxsize=SHARED_MAX)
def _canonical(key: str) -> Any:
    """The value of one JSON text, built from the text: what every equal value stands for."""
    return _parts_shared(orjson.loads(key))


@functools.lru_cache(maxsize=1024)
def _one_int(n: int) -> int:
    """The first `n` seen: priorities are beyond the small integers Python keeps one of."""
    return n


def _parts_shared(value: Obj | list[Any]) -> Any:
    if isinstance(value, dict):
        return {sys.intern(k): shared(v) for k, v in value.items()}
    return [shared(v) for v in value]


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
    out: Obj = {k: c[k] for k in ("name", "image", "ports") if k in c}
    requests = (c.get("resources") or {}).get("requests")
    if requests:
        out["resources"] = {"requests": requests}
    return out


def _containers(items: Any) -> Any:
    return shared([_container(c) for c in items or [] if isinstance(c, dict)])


def pod(obj: Obj) -> Obj:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out_spec: Obj = {k: shared(spec[k]) for k in _POD_SPEC if k in spec}
    out_spec["containers"] = _containers(spec.get("containers"))
    if spec.get("initContainers"):
        out_spec["initContainers"] = _containers(spec.get("initContainers"))
    # Only whether a volume is an emptyDir (a drain loses its data: the maintenance
    # controller asks for an opt-in), not its size limit or medium, nor the other volumes.
    local: list[Obj] = [
        {"name": v.get("name"), "emptyDir": {}}
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and "emptyDir" in v
    ]
    if local:
        out_spec["volumes"] = shared(local)
    out_status: Obj = {k: status[k] for k in _POD_STATUS if k in status}
    if "phase" in out_status:
        out_status["phase"] = shared(out_status["phase"])
    if "reason" in out_status:
        out_status["reason"] = shared(out_status["reason"])
    if "podIPs" in status:  # the pod's own, not shared; its first address is podIP's string
        ips, ip = status["podIPs"], out_status.get("podIP")
        if isinstance(ips, list) and ips and isinstance(ips[0], dict) and ips[0].get("ip") == ip:
            ips = [{**ips[0], "ip": ip}, *ips[1:]]
        out_status["podIPs"] = ips
    conditions = [
        {k: c[k] for k in _CONDITION if c.get(k) is not None}
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") in _CONDITIONS
    ]
    if conditions:
        out_status["conditions"] = shared(conditions)
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
        {"names": list(i.get("names") or [])}
        for i in status.get("images") or []
        if isinstance(i, dict)
    ]
    if images:
        out_status["images"] = shared(images)
    out_spec = {k: spec[k] for k in ("taints", "unschedulable", "providerID") if k in spec}
    if "taints" in out_spec:
        out_spec["taints"] = shared(out_spec["taints"])
    return {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Node"),
        "metadata": metadata(obj),
        "spec": out_spec,
        "status": out_status,
    }


def slim(obj: Obj) -> Obj:
    """Any other kind: everything but managedFields."""
    meta = obj.get("metadata")
    if meta:
        meta.pop("managedFields", None)
    return obj
