"""Node lifecycle: scheduling taints that follow each node's Ready condition.

Pilotfish replaces upstream's node lifecycle controller (it is switched off in the local
control plane), so it owns the taints that keep the scheduler off nodes that are not Ready:
`node.kubernetes.io/not-ready:NoSchedule` while Ready is False and
`node.kubernetes.io/unreachable:NoSchedule` while it is Unknown. The admission plugin
TaintNodesByCondition puts `not-ready` on every new node; this controller lifts it once the
node (kwok, or a kubelet) reports Ready.

Observe: a shared node informer. Decide: `desired_taints`, pure. Act: one JSON patch guarded
by a `test` of the resourceVersion it was decided from; a conflict re-queues the node and the
next attempt decides again from the fresher copy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from pilotfish import metrics
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.rest import JSON_PATCH, NODES, ApiError, Rest
from pilotfish.kube.workqueue import WorkQueue

log = logging.getLogger("pilotfish.nodelifecycle")

CONTROLLER: Final = "nodelifecycle"
TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
OWNED_KEYS: Final = frozenset({TAINT_NOT_READY, TAINT_UNREACHABLE})


def ready_status(node: Obj) -> str:
    """The node's Ready condition status: "True", "False" or "Unknown" (also when absent)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status", "Unknown"))
    return "Unknown"


def _owned(taint: dict[str, Any]) -> bool:
    return taint.get("key") in OWNED_KEYS and taint.get("effect") == "NoSchedule"


def desired_taints(node: Obj) -> list[dict[str, Any]] | None:
    """The node's full taint list as it should be, or None when it already is."""
    current: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
    status = ready_status(node)
    want: set[str] = set()
    if status == "False":
        want.add(TAINT_NOT_READY)
    elif status != "True":
        want.add(TAINT_UNREACHABLE)
    have = {
        t["key"] for t in current if t.get("key") in OWNED_KEYS and t.get("effect") == "NoSchedule"
    }
    if have == want:
        return None
    kept = [
        t for t in current if not (t.get("key") in OWNED_KEYS and t.get("effect") == "NoSchedule")
    ]
    return kept + [{"key": k, "effect": "NoSchedule"} for k in sorted(want)]


def taint_patch(node: Obj, taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON patch that applies only to the exact version `taints` was decided from."""
    rv = node["metadata"]["resourceVersion"]
    op = "replace" if "taints" in (node.get("spec") or {}) else "add"
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": op, "path": "/spec/taints", "value": taints},
    ]


class NodeLifecycleController:
    def __init__(self, rest: Rest, workers: int = 2) -> None:
        self.rest = rest
        self.workers = workers
        self.nodes = Informer(rest, NODES, resync_seconds=300)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER)
        self.nodes.add_handler(lambda _kind, obj, _old: self.queue.add(obj["metadata"]["name"]))

    async def sync(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        taints = desired_taints(node)
        if taints is None:
            return
        try:
            await self.rest.patch(NODES.path(name=name), taint_patch(node, taints), JSON_PATCH)
        except ApiError as e:
            if e.not_found:
                return
            if e.status in (409, 422):  # decided from a stale copy: decide again after the watch
                metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
                self.queue.add_rate_limited(name)
                return
            metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
            raise
        log.info(
            "node taints updated",
            extra={"node": name, "ready": ready_status(node), "taints": [t["key"] for t in taints]},
        )

    async def run(self) -> None:
        await asyncio.gather(self.nodes.run(), self.queue.run(self.workers, self.sync))
