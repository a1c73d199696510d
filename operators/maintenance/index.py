"""The maintenance controller's indexes over the shared informers: pods by node and by
ServiceWorkload, the nodes carrying a maintenance's annotations, and which maintenances
cover which node. Kept from the informers' events, so a round reads a few nodes' pods and
never scans the fleet's."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

from pilotfish import names
from pilotfish.kube.informer import Obj, object_key
from pilotfish.workloads import LABEL_WORKLOAD

Key = tuple[str, str]
K = TypeVar("K", bound=Hashable)
MARKS = (names.ANNOTATION_DRAINING, names.ANNOTATION_CORDONED_BY)


def _move(index: defaultdict[K, set[str]], key: str, was: K | None, now: K | None) -> None:
    if was == now:
        return
    if was is not None:
        found = index.get(was)
        if found is not None:
            found.discard(key)
            if not found:
                del index[was]
    if now is not None:
        index[now].add(key)


class Index:
    def __init__(self) -> None:
        self.pods_on: defaultdict[str, set[str]] = defaultdict(set)
        self.node_of: dict[str, str] = {}
        self.workload_pods: defaultdict[Key, set[str]] = defaultdict(set)
        self.workload_of: dict[str, Key] = {}
        self.marks: dict[str, dict[str, str]] = {}  # node -> annotation -> maintenance
        self.covering: defaultdict[str, set[str]] = defaultdict(set)  # node -> maintenances
        self.spec_nodes: dict[str, tuple[str, ...]] = {}

    # maintenances ------------------------------------------------------------------------

    def cover(self, name: str, nodes: Iterable[Any]) -> tuple[str, ...]:
        wanted = tuple(dict.fromkeys(str(n) for n in nodes if isinstance(n, str)))
        for n in set(self.spec_nodes.get(name, ())) - set(wanted):
            self._uncover(n, name)
        for n in wanted:
            self.covering[n].add(name)
        self.spec_nodes[name] = wanted
        return wanted

    def uncover(self, name: str) -> None:
        for n in self.spec_nodes.pop(name, ()):
            self._uncover(n, name)

    def _uncover(self, node: str, name: str) -> None:
        found = self.covering.get(node)
        if found is not None:
            found.discard(name)
            if not found:
                del self.covering[node]

    # nodes and pods ----------------------------------------------------------------------

    def node(self, kind: str, obj: Obj) -> tuple[dict[str, str], dict[str, str]]:
        """Index a node event; returns its maintenance annotations (before, after)."""
        name = str(obj["metadata"]["name"])
        annotations = (obj["metadata"].get("annotations") or {}) if kind != "DELETED" else {}
        marks = {k: str(annotations[k]) for k in MARKS if k in annotations}
        before = self.marks.pop(name, {})
        if marks:
            self.marks[name] = marks
        return before, marks

    def pod(self, kind: str, obj: Obj) -> tuple[set[str], set[Key]]:
        """Index a pod event; returns the nodes and workloads it was and is on."""
        key = object_key(obj)
        meta = obj.get("metadata") or {}
        alive = kind != "DELETED"
        node = str((obj.get("spec") or {}).get("nodeName") or "") if alive else ""
        was = self.node_of.pop(key, None)
        if node:
            self.node_of[key] = node
        _move(self.pods_on, key, was, node or None)
        workload = (meta.get("labels") or {}).get(LABEL_WORKLOAD) if alive else None
        wkey = (str(meta.get("namespace", "")), str(workload)) if workload else None
        had = self.workload_of.pop(key, None)
        if wkey is not None:
            self.workload_of[key] = wkey
        _move(self.workload_pods, key, had, wkey)
        return {n for n in (was, node) if n}, {w for w in (had, wkey) if w is not None}

    def marked_by(self, name: str) -> set[str]:
        """Nodes carrying an annotation of maintenance `name`."""
        return {n for n, marks in self.marks.items() if name in marks.values()}

    def draining(self) -> frozenset[str]:
        """Nodes draining for any maintenance."""
        return frozenset(n for n, m in self.marks.items() if names.ANNOTATION_DRAINING in m)

    def draining_for(self, node: str) -> str | None:
        return self.marks.get(node, {}).get(names.ANNOTATION_DRAINING)
