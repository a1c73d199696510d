"""Wiring: the shared node informer, the queue, and reconcile = observe → decide → apply.

A node is keyed by name. While a taint write of ours is not yet in the informer, the node's
cached copy is older than what we wrote: reconcile waits for it (the informer event that
shows the write re-enqueues the node) rather than deciding again from the past.
"""

from __future__ import annotations

from typing import Final

from pilotfish.kube import projections
from pilotfish.kube.informer import Obj
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODES
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, Result, WorkQueue, requeue_after
from pilotfish.operators.nodelifecycle.apply import CONTROLLER, apply
from pilotfish.operators.nodelifecycle.decide import decide
from pilotfish.operators.nodelifecycle.model import node_view

WORKERS: Final = 2
# A write not yet seen: look again after this, in case the event that shows it is lost
# (OwnWrites' own expiry bounds the wait).
UNSETTLED_RECHECK: Final = 5.0


class NodeLifecycleController:
    def __init__(self, rt: Runtime, workers: int = WORKERS) -> None:
        self.rt = rt
        self.workers = workers
        self.nodes = rt.factory.informer(NODES, projection=projections.node)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        self.writes = OwnWrites(CONTROLLER, rt.clock, on_settled=self.queue.add)
        self.writes.watch(self.nodes)
        self.nodes.add_handler(self._on_node)

    def _on_node(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        self.queue.add(str(obj["metadata"]["name"]))

    async def reconcile(self, name: str) -> Result:
        if not self.writes.settled(name):
            return requeue_after(UNSETTLED_RECHECK, "own taint write not yet observed")
        node = self.nodes.get(name)
        if node is None:
            return DONE
        view = node_view(node)
        plan = decide(view)
        if plan is None:
            return DONE
        return await apply(self.rt.rest, self.writes, plan, view.ready)

    async def run(self) -> None:
        await self.rt.factory.wait_synced()
        await self.queue.run(self.workers, self.reconcile)
