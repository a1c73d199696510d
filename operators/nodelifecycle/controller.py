"""Wiring: the shared node and pod informers, the node-lease silence tracker, the queue, and
reconcile = observe → decide (pure, `silence.plan_node`) → apply.

A node is keyed by name. Its pods come from an index by `spec.nodeName` kept from the shared
pod informer, so a reconcile reads one node's pods, never the fleet's. Level-triggered: every
round re-derives the node's phase from the informers and this process's silence clock; the
only memory is the zone brakes (`zones`), which a restarted process re-derives, late. While a
write of ours is not yet in the informers, the node's copies are older than what we wrote:
reconcile waits for them (the informer event that shows the write re-enqueues the node)
rather than deciding again from the past.

A healthy node is looked at again when its silence would reach the unreachable timeout (a
renewal does not enqueue it: with thousands of nodes renewing every 10 s that would be most
of the work); a lost node on each renewal (it returns) and each change of its pods.

Mode upstream: upstream's node lifecycle controller marks, taints and evicts; this one
writes nothing to nodes or pods and only tracks silence and reports the brake.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Final

from pilotfish.kube import projections
from pilotfish.kube.informer import Obj, object_key
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, Result, WorkQueue, requeue_after
from pilotfish.nodesilence import MODE_UPSTREAM
from pilotfish.operators.nodelifecycle.apply import carry_out
from pilotfish.operators.nodelifecycle.brake import HOLD, INTERVAL, WINDOW, ZoneBrake, release
from pilotfish.operators.nodelifecycle.model import (
    CONTROLLER,
    REPORTING_CONTROLLER,
    NodeView,
    PodView,
    node_ref,
    node_view,
    pod_view,
    zone_of,
)
from pilotfish.operators.nodelifecycle.silence import plan_node
from pilotfish.operators.nodelifecycle.zones import Zones
from pilotfish.timeutil import format_time

log = logging.getLogger("pilotfish.nodelifecycle")

WORKERS: Final = 2
# A write not yet seen: look again after this, in case the event that shows it is lost
# (OwnWrites' own expiry bounds the wait).
UNSETTLED_RECHECK: Final = 5.0
EVENT_ZONE_BRAKE: Final = "ZoneBrake"


class NodeLifecycleController:
    def __init__(self, rt: Runtime, workers: int = WORKERS) -> None:
        self.rt = rt
        self.workers = workers
        self.settings = rt.silence.settings
        self.nodes = rt.factory.informer(NODES, projection=projections.node)
        self.pods = rt.factory.informer(PODS, projection=projections.pod)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        self.writes = OwnWrites(CONTROLLER, rt.clock, on_settled=self.queue.add)
        self.writes.watch(self.nodes)
        self.writes.watch(self.pods)
        self.events = rt.events.scoped(REPORTING_CONTROLLER)
        self.zones = Zones()
        self.pods_on: defaultdict[str, set[str]] = defaultdict(set)
        self.node_of: dict[str, str] = {}
        self.judged: set[str] = set()  # nodes decided at least once with their lease seen
        self.heard: set[str] = set()  # nodes whose lease this process saw at least once
        self.renewed: set[str] = set()  # ... and saw renew since
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(self._on_pod)
        rt.silence.watch(rt.factory)
        rt.silence.add_listener(self._on_renewal)

    # --- informer and silence events ------------------------------------------------------

    def _on_node(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        name = str(obj["metadata"]["name"])
        self.zones.place(name, None if kind == "DELETED" else zone_of(obj))
        if kind == "DELETED":
            for seen in (self.judged, self.heard, self.renewed):
                seen.discard(name)
        self.queue.add(name)

    def _on_pod(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        node = "" if kind == "DELETED" else str((obj.get("spec") or {}).get("nodeName") or "")
        was = self.node_of.get(key, "")
        if was != node:
            if was:
                self.pods_on[was].discard(key)
                if not self.pods_on[was]:
                    del self.pods_on[was]
                self.node_of.pop(key, None)
            if node:
                self.pods_on[node].add(key)
                self.node_of[key] = node
        for n in {was, node}:
            if n and self.zones.is_lost(n):
                self.queue.add(n)

    def _on_renewal(self, node: str) -> None:
        (self.renewed if node in self.heard else self.heard).add(node)
        if node not in self.judged:
            self.queue.add(node)  # its first lease seen: start its clock
        elif self.zones.is_lost(node):
            self.zones.forget_scan(node)
            self.queue.add(node)  # it returns; its zone's brake may lift for the others
            for peer in self.zones.lost_peers(node):
                self.queue.add(peer)

    # --- reconcile ------------------------------------------------------------------------

    def pods_of(self, node: str) -> tuple[PodView, ...]:
        found = (self.pods.get(k) for k in sorted(self.pods_on.get(node, ())))
        return tuple(
            pod_view(p)
            for p in found
            if p is not None and (p.get("spec") or {}).get("nodeName") == node
        )

    async def reconcile(self, name: str) -> Result:
        if not self.writes.settled(name):
            return requeue_after(UNSETTLED_RECHECK, "own write not yet observed")
        obj = self.nodes.get(name)
        if obj is None:
            self.zones.place(name, None)
            return DONE
        view = node_view(obj)
        silent = self.rt.silence.silent_for(name)
        now = self.rt.clock.monotonic()
        if silent is not None:
            self.judged.add(name)
        lost = silent is not None and silent >= self.settings.unreachable_after
        self.zones.set_lost(name, view.zone, lost)
        verdict, brake, _ = self.zones.verdict(
            name,
            view.zone,
            silent,
            self.rt.silence.silent_for,
            self.settings.unreachable_after,
            now,
        )
        if verdict.braked and lost:
            self._note_brake(view, brake, now)
        pods = self.pods_of(name) if lost else ()
        plan = plan_node(
            view,
            pods,
            silent,
            self.settings,
            verdict,
            now,
            format_time(self.rt.clock.now()),
            renewed=name in self.renewed,
        )
        if self.settings.mode == MODE_UPSTREAM:  # report only: upstream marks and evicts
            return requeue_after(plan.requeue_after) if plan.requeue_after else DONE
        if plan.evict and verdict.braked and release(brake, name, now):
            log.warning("zone brake lets a node go", extra={"node": name, "zone": view.zone})
        if not plan.writes:
            return requeue_after(plan.requeue_after) if plan.requeue_after else DONE
        return await carry_out(
            self.rt.rest,
            self.writes,
            self.events,
            view,
            pods,
            plan,
            silent,
            self.settings.unreachable_after,
        )

    def _note_brake(self, node: NodeView, brake: ZoneBrake, now: float) -> None:
        """One ZoneBrake Event on each lost node of a braked zone, per engagement."""
        if node.name in brake.noted:
            return
        brake.noted.add(node.name)
        zone = node.zone or "(no zone label)"
        size = len(self.zones.members.get(node.zone, ()))
        held = max(0.0, (brake.since or now) + HOLD - now)
        if self.zones.every_zone_braked():
            after = "every zone is braked: nothing is evicted until nodes return"
        else:
            after = f"no eviction for {held:.0f}s more, then at most one node per {INTERVAL:.0f}s"
        self.events.post(
            node_ref(node),
            EVENT_ZONE_BRAKE,
            f"zone {zone}: {brake.together} of {size} nodes went silent within {WINDOW:.0f}s "
            f"(a partition, not machine failures): its pods keep Ready; {after}",
            action="HoldEviction",
            type_="Warning",
        )

    async def run(self) -> None:
        await self.rt.factory.wait_synced()
        await self.queue.run(self.workers, self.reconcile)
