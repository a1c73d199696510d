"""The ServiceWorkload controller's wiring: informers, handlers, queue, and
`reconcile` = observe → `decide.decide` → `apply.Executor.apply`.

Observe: the process's shared informers on ServiceWorkloads, pods (one view of every pod,
the process projection), PodDisruptionBudgets, and the ControllerRevisions carrying the
`pilotfish.io/workload` label (only this controller reads revisions, and other owners'
revisions hold whole templates). Handlers index pods and revisions by the workload that
controls them and enqueue it. A workload is never decided from while one of this
controller's own writes for it is not yet in the informers (`OwnWrites`): the round waits
for the event that shows it, so a lagging watch never doubles a create or a drain, and a
restarted controller, whose informers listed everything first, starts from what the API has.

Why the shared informers and not kopf for the ServiceWorkloads themselves: the decision
needs one consistent view of a workload *and* its pods and revisions, fed by one
de-duplicating queue, with timed wake-ups (drains, minReadySeconds, the progress deadline)
on that same queue. kopf would be a second event loop with its own retries and would write
its change-tracking annotation onto every workload, bumping the resourceVersion our status
writes are conditional on. Pods are a hot path kopf must not carry.

Nodes come from the shared node informer, for planned maintenance: a node annotated
`pilotfish.io/draining` makes a surge-first workload keep replacements for its pods there
(`drain`), and a change of that annotation enqueues the workloads with pods on the node
(`nodeindex`).

Timed wake-ups are `requeue_after(t - now)`, never polled; refused writes are RETRY, and
the queue alone backs the workload off while they continue.

An `atMostOne` workload's identity Lease is read with a GET each round, not from an informer:
the release of a lost pod must be decided from the Lease as the API has it, and only those
workloads pay for it. Their pods' nodes' silence is the process's one tracker
(`rt.silence`); a workload waiting for a silent node is re-enqueued by that node's renewal.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import Counter
from typing import Final

from pydantic import ValidationError

from pilotfish import metrics
from pilotfish.api.serviceworkload import ServiceWorkload
from pilotfish.kube import projections
from pilotfish.kube.informer import Handler, Obj, object_key
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import LEASES, NODES, PODS, SERVICEWORKLOADS, ApiError
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import (
    DONE,
    ControllerRateLimiter,
    Result,
    WorkQueue,
    requeue_after,
)
from pilotfish.operators.serviceworkload import atmostone
from pilotfish.operators.serviceworkload import pdb as pdbs
from pilotfish.operators.serviceworkload import revisions as revs
from pilotfish.operators.serviceworkload.apply import CONTROLLER, Executor, Trackers
from pilotfish.operators.serviceworkload.decide import Plan, decide, invalid
from pilotfish.operators.serviceworkload.model import Observed, is_ours, owner_key
from pilotfish.operators.serviceworkload.nodeindex import NodeIndex
from pilotfish.operators.serviceworkload.status import ReplicaFailure
from pilotfish.workloads import LABEL_WORKLOAD

log = logging.getLogger("pilotfish.serviceworkload")

# The longest a refused key waits before it is tried again (the default is 1000 s). A refused
# pod create is the common retry here, and nothing this controller watches announces that
# its cause went away (the webhooks answering again, another team's quota freed), so the
# queue's per-key backoff is capped at a minute: a workload recovers within a minute of
# the cause, and a refusing admission still sees at most one create per workload a minute.
RETRY_MAX_SECONDS: Final = 60.0

REPORTING_CONTROLLER: Final = "pilotfish.io/serviceworkload"
WORKERS: Final = 4
# A round that found its own writes not yet in the informers comes back after this at the
# latest; the informer event that shows them brings it back sooner.
SETTLE_RECHECK_SECONDS: Final = 1.0
STATES: Final = ("complete", "progressing", "paused", "stalled")


class ServiceWorkloadController:
    def __init__(
        self, rt: Runtime, *, workers: int = WORKERS, rng: random.Random | None = None
    ) -> None:
        self.rt = rt
        self.workers = workers
        factory = rt.factory
        self.sws = factory.informer(SERVICEWORKLOADS)
        self.pods = factory.informer(PODS, projection=projections.pod)
        self.revisions = factory.informer(revs.CONTROLLER_REVISIONS, label_selector=LABEL_WORKLOAD)
        self.pdbs = factory.informer(pdbs.PDBS)
        self.queue: WorkQueue[str] = WorkQueue(
            CONTROLLER,
            clock=rt.clock,
            limiter=ControllerRateLimiter(rt.clock, cap=RETRY_MAX_SECONDS),
        )
        trackers = {
            kind: OwnWrites(f"{CONTROLLER}-{kind}", rt.clock, on_settled=self.queue.add)
            for kind in ("workloads", "pods", "revisions", "pdbs")
        }
        trackers["workloads"].watch(self.sws)
        trackers["pods"].watch(self.pods)
        trackers["revisions"].watch(self.revisions)
        trackers["pdbs"].watch(self.pdbs)
        self.writes = Trackers(**trackers)
        # The last refused pod create per workload, for its ReplicaFailure condition: reset
        # by a create that succeeds, ignored once the generation moves on, and re-learnt by
        # the next refused create after a restart.
        self.failures: dict[str, ReplicaFailure] = {}
        self.executor = Executor(
            rt.rest,
            self.writes,
            rt.events.scoped(REPORTING_CONTROLLER),
            rt.clock,
            rng or random.Random(),
            self.failures,
        )
        self.pods_of: dict[str, set[str]] = {}
        self.revisions_of: dict[str, set[str]] = {}
        self.states: dict[str, str] = {}
        self.sws.add_handler(self._on_workload)
        self.pods.add_handler(self._indexer(self.pods_of))
        self.revisions.add_handler(self._indexer(self.revisions_of))
        self.pdbs.add_handler(self._on_pdb)
        # At-most-one workloads waiting for a silent node, by the node: a renewal of it
        # brings them back at once (the node returned: nothing is released).
        self.waiting: dict[str, str] = {}
        rt.silence.watch(factory)
        rt.silence.add_listener(self._on_renewal)
        # Nodes being drained (planned maintenance), and which workloads run on each.
        self.by_node = NodeIndex(
            factory.informer(NODES, projection=projections.node), self.queue.add
        )
        self.pods.add_handler(self.by_node.on_pod)
        self.by_node.nodes.add_handler(self.by_node.on_node_event)

    # Observe ------------------------------------------------------------------------------

    def _on_workload(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        key = object_key(obj)
        if kind == "DELETED":
            self.failures.pop(key, None)
            self._set_state(key, None)
            self._set_waiting(key, None)
        self.queue.add(key)

    def _indexer(self, index: dict[str, set[str]]) -> Handler:
        """Index objects by the workload controlling them, and enqueue it (both workloads
        when an object changed hands)."""

        def handle(kind: str, obj: Obj, old: Obj | None) -> None:
            key = object_key(obj)
            before = owner_key(old) if old is not None else None
            after = None if kind == "DELETED" else owner_key(obj)
            if kind == "DELETED" and before is None:
                before = owner_key(obj)
            if before is not None and before != after:
                keys = index.get(before)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[before]
            if after is not None:
                index.setdefault(after, set()).add(key)
            for owner in (before, after):
                if owner is not None:
                    self.queue.add(owner)

        return handle

    def _on_renewal(self, node: str) -> None:
        for key, waiting_on in list(self.waiting.items()):
            if waiting_on == node:
                self.queue.add(key)

    def _set_waiting(self, key: str, node: str | None) -> None:
        if node is None:
            self.waiting.pop(key, None)
        else:
            self.waiting[key] = node
        metrics.SW_AT_MOST_ONE_WAITING.set(len(self.waiting))

    async def fencing(self, sw: Obj, pods: tuple[Obj, ...]) -> atmostone.Fencing:
        """The identity Lease as the API has it now, and the silence of the pods' nodes."""
        meta = sw["metadata"]
        path = LEASES.path(meta["namespace"], atmostone.lease_name(meta["name"]))
        try:
            lease: Obj | None = await self.rt.rest.get(path)
        except ApiError as e:
            if not e.not_found:
                raise
            lease = None
        silence = self.rt.silence
        nodes = {str(n) for p in pods if (n := (p.get("spec") or {}).get("nodeName"))}
        return atmostone.Fencing(
            lease=lease,
            silent={n: silence.silent_for(n) for n in nodes},
            release_after=silence.settings.at_most_one_release_after,
            lease_seconds=max(1, round(silence.settings.unreachable_after)),
        )

    def _on_pdb(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        key = object_key(obj)
        if self.sws.get(key) is not None:
            self.queue.add(key)

    def observe(self, key: str, sw: Obj, model: ServiceWorkload) -> Observed:
        uid = str(sw["metadata"]["uid"])
        pods = (self.pods.get(k) for k in sorted(self.pods_of.get(key, ())))
        revisions = (self.revisions.get(k) for k in sorted(self.revisions_of.get(key, ())))
        failure = self.failures.get(key)
        if failure is not None and failure.generation != sw["metadata"].get("generation"):
            del self.failures[key]  # refused for a spec that is no longer asked for
            failure = None
        mine = tuple(p for p in pods if p is not None and is_ours(p, uid))
        return Observed(
            key=key,
            sw=sw,
            model=model,
            pods=mine,
            revisions=tuple(revs.owned_revisions((r for r in revisions if r is not None), uid)),
            pdb=self.pdbs.get(key),
            at=self.rt.clock.now(),
            failure=failure,
            draining=self.by_node.draining(mine),
        )

    # Reconcile --------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        started = self.rt.clock.monotonic()
        try:
            return await self._reconcile(key)
        finally:
            metrics.ROLLOUT_SYNC_SECONDS.observe(self.rt.clock.monotonic() - started)
            metrics.ROLLOUT_EXPECTED_WRITES.set(self.writes.pending())

    async def _reconcile(self, key: str) -> Result:
        sw = self.sws.get(key)
        if sw is None:
            self.failures.pop(key, None)
            self._set_state(key, None)
            self._set_waiting(key, None)
            return DONE
        if sw["metadata"].get("deletionTimestamp"):
            return DONE  # the garbage collector removes pods, revisions and the PDB with it
        if not self.writes.settled(key):
            return requeue_after(SETTLE_RECHECK_SECONDS, "own writes not yet observed")
        try:
            model = ServiceWorkload.model_validate(sw)
        except ValidationError as e:
            return await self.executor.apply(invalid(key, sw, str(e)))
        obs = self.observe(key, sw, model)
        if model.spec.at_most_one:
            obs = dataclasses.replace(obs, fencing=await self.fencing(sw, obs.pods))
        plan = decide(obs)
        self._set_waiting(key, plan.fencing.waiting_on if plan.fencing else None)
        self._log(plan)
        result = await self.executor.apply(plan)
        if plan.state is not None:
            self._set_state(key, plan.state)
        return result

    def _log(self, plan: Plan) -> None:
        fenced = plan.fencing is not None and (
            plan.fencing.lease or plan.fencing.deletes or plan.fencing.create
        )
        if plan.takedowns or plan.creates or plan.revision is not None or fenced:
            log.info("rollout plan", extra={"workload": plan.key, **plan.summary})

    def _set_state(self, key: str, state: str | None) -> None:
        old = self.states.pop(key, None)
        if state is not None:
            self.states[key] = state
        if old != state:
            counts = Counter(self.states.values())
            for s in STATES:
                metrics.ROLLOUT_WORKLOADS.labels(s).set(counts.get(s, 0))

    # Run --------------------------------------------------------------------------------

    async def run(self) -> None:
        """List everything first, then decide: a restarted controller sees every pod the
        previous one created before it creates any (no double create beyond the surge)."""
        await self.rt.factory.wait_synced()
        log.info("serviceworkload controller synced", extra={"workloads": len(self.sws.store)})
        await self.queue.run(self.workers, self.reconcile)
