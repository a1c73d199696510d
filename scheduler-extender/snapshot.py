"""The extender's view of the cluster: per-node aggregates kept current by informer events.

kube-scheduler calls the extender once or twice per pod and waits for the answer inside its
scheduling cycle, so nothing about a node may be computed per request. Every aggregate a
decision reads (requested CPU, memory and GPUs, non-production use of the batch resources,
replicas of each workload on each node) is updated here, on the informer event that changes
it, in O(1) per event. A scheduling call then costs one dict lookup and a few comparisons
per candidate node.

What is watched, and why:
- nodes, all of them: allocatable, zone (`topology.kubernetes.io/zone`) and machine class
  (`node.kubernetes.io/instance-type`);
- pods with `spec.nodeName!=` and `status.phase!=Succeeded,status.phase!=Failed`: only pods
  that hold resources on a node. Pending pods (possibly 100,000 queued batch tasks) never
  reach the extender's memory, and a finished pod leaves the selector, which the watch
  delivers as a delete.

Both informers keep only the fields read here (`slim_pod`, `slim_node`), so 30,000 pods cost
a few MB rather than the full objects.

Assumed placements: kube-scheduler binds a pod asynchronously and starts on the next pod at
once, while the binding reaches the extender only through the watch some milliseconds later.
Without care, a burst of six replicas would all be scored against the same stale counts and
land in one zone. So after scoring a pod the extender *assumes* it lands on the node it scored
highest (its scores are built to have one clear winner, see `decide`) and counts it there
for scoring until the watch reports the real binding (which replaces the assumption) or the
assumption expires. Assumptions feed scores only, never filters: a wrong guess can tilt a
preference for a moment but cannot make a node look full.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Final

from pilotfish import metrics
from pilotfish.extender.records import Assumed, NodeState, PodInfo, pod_info, set_node
from pilotfish.kube.informer import Obj, object_key

log = logging.getLogger("pilotfish.extender.snapshot")

# Bound pods that still hold resources. kube-scheduler's own pod informer uses the same
# phase selector; the API server combines comma-separated field requirements with AND.
POD_FIELD_SELECTOR: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# How long an assumed placement counts when the watch never confirms it (the pod failed to
# bind, or was deleted while pending). Bindings normally show up within a second.
ASSUME_TTL_SECONDS: Final = 15.0


class Snapshot:
    """Nodes, bound pods, workload replica counts and assumed placements, kept in step.

    Handlers (`on_node`, `on_pod`) are informer handlers: synchronous, called on the event
    loop, never concurrently with a scheduling call. `synced` turns true once both informers
    have listed everything; until then the extender refuses to judge.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodInfo] = {}  # by namespace/name, as the informer keys them
        self.by_uid: dict[str, PodInfo] = {}
        # workload -> node -> replicas there, bound and assumed; empty entries are removed
        # so `workload_nodes[w]` stays as small as the workload's footprint.
        self.workload_nodes: dict[str, dict[str, int]] = {}
        self.assumed: dict[str, Assumed] = {}  # by UID, oldest first
        self.batch_nodes = 0  # nodes that advertise batch.pilotfish.io/cpu or /memory
        self.synced = False

    # --- informer handlers -----------------------------------------------------------

    def on_node(self, kind: str, node: Obj, _old: Obj | None) -> None:
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name or kind == "SYNC":
            return
        state = self.nodes.get(name)
        if state is not None and (state.batch_cpu is not None or state.batch_memory is not None):
            self.batch_nodes -= 1
        if kind == "DELETED":
            if state is None:
                return
            state.present = False
            state.batch_cpu = state.batch_memory = None
            # A pod cannot land on a deleted node: its assumption is wrong, and it must not
            # outlive the state it was added to (a re-created node starts from zero).
            for uid in [a.uid for a in self.assumed.values() if a.node == name]:
                self.forget(uid)
            if not state.pods:
                del self.nodes[name]
            return
        if state is None:
            state = self.nodes[name] = NodeState(name)
        set_node(state, node)
        if state.batch_cpu is not None or state.batch_memory is not None:
            self.batch_nodes += 1
        metrics.EXTENDER_SNAPSHOT_NODES.set(len(self.nodes))

    def on_pod(self, kind: str, pod: Obj, _old: Obj | None) -> None:
        if kind == "SYNC":
            return
        key = object_key(pod)
        info = None if kind == "DELETED" else pod_info(pod)
        current = self.pods.get(key)
        if current is not None:
            if current == info:
                return  # a status change that moves nothing the extender counts
            self._remove(current)
        if info is not None:
            self._add(info)
        metrics.EXTENDER_SNAPSHOT_PODS.set(len(self.pods))

    def _add(self, info: PodInfo) -> None:
        self.forget(info.uid)
        self.pods[info.key] = info
        if info.uid:
            self.by_uid[info.uid] = info
        state = self.nodes.get(info.node)
        if state is None:
            state = self.nodes[info.node] = NodeState(info.node)
        state.pods[info.uid] = info
        state.used_cpu += info.cpu
        state.used_memory += info.memory
        state.used_gpu += info.gpu
        state.used_batch_cpu += info.batch_cpu
        state.used_batch_memory += info.batch_memory
        state.score_cpu += info.cpu
        state.score_memory += info.memory
        state.score_batch_cpu += info.batch_cpu
        state.score_batch_memory += info.batch_memory
        if info.workload is not None:
            self._count(info.workload, info.node, 1)

    def _remove(self, info: PodInfo) -> None:
        del self.pods[info.key]
        if self.by_uid.get(info.uid) is info:
            del self.by_uid[info.uid]
        state = self.nodes.get(info.node)
        if state is not None and state.pods.pop(info.uid, None) is not None:
            state.used_cpu -= info.cpu
            state.used_memory -= info.memory
            state.used_gpu -= info.gpu
            state.used_batch_cpu -= info.batch_cpu
            state.used_batch_memory -= info.batch_memory
            state.score_cpu -= info.cpu
            state.score_memory -= info.memory
            state.score_batch_cpu -= info.batch_cpu
            state.score_batch_memory -= info.batch_memory
            if not state.pods and not state.present:
                del self.nodes[info.node]
        if info.workload is not None:
            self._count(info.workload, info.node, -1)

    def _count(self, workload: str, node: str, delta: int) -> None:
        per_node = self.workload_nodes.get(workload)
        if per_node is None:
            per_node = self.workload_nodes[workload] = {}
        count = per_node.get(node, 0) + delta
        if count > 0:
            per_node[node] = count
        else:
            per_node.pop(node, None)
            if not per_node:
                del self.workload_nodes[workload]

    # --- assumed placements ---------------------------------------------------------

    def assume(
        self,
        uid: str,
        node: str,
        workload: str | None,
        cpu: int,
        memory: int,
        now: float,
        ttl: float = ASSUME_TTL_SECONDS,
        *,
        batch_cpu: int = 0,
        batch_memory: int = 0,
    ) -> None:
        """Count a pod on `node` for scoring until the watch reports where it really went.

        A pod already bound (a retry racing its own binding event) is not assumed again.
        """
        if not uid or uid in self.by_uid:
            return
        self.forget(uid)
        state = self.nodes.get(node)
        if state is None or not state.present:
            return
        self.assumed[uid] = Assumed(
            uid, node, workload, cpu, memory, now + ttl, batch_cpu, batch_memory
        )
        state.score_cpu += cpu
        state.score_memory += memory
        state.score_batch_cpu += batch_cpu
        state.score_batch_memory += batch_memory
        if workload is not None:
            self._count(workload, node, 1)
        metrics.EXTENDER_ASSUMED_PODS.set(len(self.assumed))

    def forget(self, uid: str) -> None:
        assumed = self.assumed.pop(uid, None)
        if assumed is None:
            return
        state = self.nodes.get(assumed.node)
        if state is not None:
            state.score_cpu -= assumed.cpu
            state.score_memory -= assumed.memory
            state.score_batch_cpu -= assumed.batch_cpu
            state.score_batch_memory -= assumed.batch_memory
        if assumed.workload is not None:
            self._count(assumed.workload, assumed.node, -1)
        metrics.EXTENDER_ASSUMED_PODS.set(len(self.assumed))

    def expire(self, now: float) -> int:
        """Drop assumptions whose time is up; they are kept oldest first, so this stops at
        the first one still valid and costs nothing when none expired."""
        expired = 0
        for uid, assumed in list(self.assumed.items()):
            if assumed.expires > now:
                break
            self.forget(uid)
            expired += 1
        return expired

    # --- reads ----------------------------------------------------------------------

    def zone_counts(self, per_node: Mapping[str, int]) -> dict[str, int]:
        """Replicas per zone from replicas per node (a workload's footprint, not the fleet)."""
        zones: dict[str, int] = {}
        nodes = self.nodes
        for node, count in per_node.items():
            state = nodes.get(node)
            zone = state.zone if state is not None else ""
            zones[zone] = zones.get(zone, 0) + count
        return zones

    def check(self) -> list[str]:
        """Recompute every aggregate from the pods and list the differences (tests, debug).

        The aggregates are maintained incrementally; this is the slow, obvious version that
        they must always equal.
        """
        problems: list[str] = []
        for name, state in self.nodes.items():
            pods = [p for p in self.pods.values() if p.node == name]
            assumed = [a for a in self.assumed.values() if a.node == name]
            want = {
                "used_cpu": sum(p.cpu for p in pods),
                "used_memory": sum(p.memory for p in pods),
                "used_gpu": sum(p.gpu for p in pods),
                "used_batch_cpu": sum(p.batch_cpu for p in pods),
                "used_batch_memory": sum(p.batch_memory for p in pods),
                "score_cpu": sum(p.cpu for p in pods) + sum(a.cpu for a in assumed),
                "score_memory": sum(p.memory for p in pods) + sum(a.memory for a in assumed),
                "score_batch_cpu": sum(p.batch_cpu for p in pods)
                + sum(a.batch_cpu for a in assumed),
                "score_batch_memory": sum(p.batch_memory for p in pods)
                + sum(a.batch_memory for a in assumed),
            }
            for attr, value in want.items():
                if getattr(state, attr) != value:
                    problems.append(f"{name}.{attr} = {getattr(state, attr)}, want {value}")
            if set(state.pods) != {p.uid for p in pods}:
                problems.append(f"{name}.pods differ")
        for pod in self.pods.values():
            if pod.node not in self.nodes:
                problems.append(f"pod {pod.key} on {pod.node} has no node state")
        counts: dict[str, dict[str, int]] = {}
        placed: Iterable[tuple[str | None, str]] = [
            *((p.workload, p.node) for p in self.pods.values()),
            *((a.workload, a.node) for a in self.assumed.values()),
        ]
        for workload, node in placed:
            if workload is not None:
                per_node = counts.setdefault(workload, {})
                per_node[node] = per_node.get(node, 0) + 1
        if counts != self.workload_nodes:
            problems.append(f"workload counts {self.workload_nodes} != {counts}")
        batch = sum(
            1 for s in self.nodes.values() if s.batch_cpu is not None or s.batch_memory is not None
        )
        if batch != self.batch_nodes:
            problems.append(f"batch_nodes = {self.batch_nodes}, want {batch}")
        return problems


# Re-exported: decisions and tests read these through the snapshot.
__all__ = [
    "ASSUME_TTL_SECONDS",
    "POD_FIELD_SELECTOR",
    "Assumed",
    "NodeState",
    "PodInfo",
    "Snapshot",
    "pod_info",
]
