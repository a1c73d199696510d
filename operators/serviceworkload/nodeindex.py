"""Which workloads run on which node, so a node starting or ending a drain wakes only them.

Fed by the shared pod and node informers: pods are indexed by `spec.nodeName` to the
ServiceWorkload controlling them; a node whose `pilotfish.io/draining` annotation appears,
changes or goes enqueues the workloads with pods on it (a few keys, not every workload).
Any other change to a node (its status heartbeats, its conditions) enqueues nothing.

Whether a node drains is read from the node informer at observe time, never remembered
here: the round decides from the informer's view, like everything else it decides from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pilotfish.kube.informer import Informer, Obj, object_key
from pilotfish.names import ANNOTATION_DRAINING
from pilotfish.operators.serviceworkload.drain import node_of
from pilotfish.operators.serviceworkload.model import owner_key


def draining_mark(node: Obj | None) -> str | None:
    """The NodeMaintenance draining the node, if one is."""
    if node is None:
        return None
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DRAINING)
    return str(value) if value else None


class NodeIndex:
    def __init__(self, nodes: Informer, enqueue: Callable[[str], None]) -> None:
        self.nodes = nodes
        self.enqueue = enqueue
        # node name -> {pod key: workload key}
        self.on_node: dict[str, dict[str, str]] = {}

    def on_pod(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        before = node_of(old) if old is not None else None
        after = None if kind == "DELETED" else node_of(obj)
        owner = owner_key(obj)
        if kind == "DELETED" and before is None:
            before = node_of(obj)
        if before is not None and (before != after or owner is None):
            pods = self.on_node.get(before)
            if pods is not None:
                pods.pop(key, None)
                if not pods:
                    del self.on_node[before]
        if after is not None and owner is not None:
            self.on_node.setdefault(after, {})[key] = owner

    def on_node_event(self, kind: str, obj: Obj, old: Obj | None) -> None:
        after = None if kind == "DELETED" else draining_mark(obj)
        before = draining_mark(obj if kind == "DELETED" and old is None else old)
        if before == after:
            return
        for workload in set(self.on_node.get(object_key(obj), {}).values()):
            self.enqueue(workload)

    def draining(self, pods: Iterable[Obj]) -> frozenset[str]:
        """The nodes among the pods' that are being drained now."""
        nodes = {n for p in pods if (n := node_of(p)) is not None}
        return frozenset(n for n in nodes if draining_mark(self.nodes.get(n)) is not None)
