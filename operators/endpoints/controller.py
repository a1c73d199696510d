"""The endpoints controller's wiring: shared informers, handlers that enqueue workloads, and
`reconcile` = observe → `decide` → `Executor.finalize`.

Observe: the process's shared informers on ServiceWorkloads, pods (one view of every pod,
the process projection; handlers keep only the workloads' pods), Services, Pilotfish's
EndpointSlices (label selector) and nodes (for zones); a change that can move an endpoint
enqueues the workload. The cache is never decided from while one of this controller's own
writes for that workload is not visible in it yet (`OwnWrites`): the round waits for the
informer instead, so a lagging watch never makes a second slice or a stale replace.

Write pacing: the first change after quiet goes out at once; further changes of the same
service within the minimum interval are coalesced into one write at its end (the seeds:
slices written at most about once a second, which bounds the store's write rate at 300,000
pods). The work queue already dedups a service's key.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from typing import Final

from pilotfish import metrics, names
from pilotfish.kube import projections
from pilotfish.kube.informer import Obj, object_key
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODES, PODS, SERVICEWORKLOADS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, RateLimiter, Result, WorkQueue, requeue_after
from pilotfish.operators.endpoints.apply import (
    WRITE_BURST,
    WRITE_QPS,
    Executor,
    Trackers,
    namespace_terminating,
    sync_failed_note,
)
from pilotfish.operators.endpoints.decide import Observed, Plan, decide
from pilotfish.operators.endpoints.model import (
    ACTION_MANAGE_ENDPOINTS,
    CONTROLLER,
    ENDPOINTSLICES,
    LABEL_MANAGED_BY,
    REASON_SYNC_FAILED,
    SERVICES,
    endpoint_facts,
    service_of_slice,
    workload_of,
)
from pilotfish.workloads import ENDPOINTSLICE_MANAGED_BY

log = logging.getLogger("pilotfish.endpoints")

REPORTING_CONTROLLER: Final = "pilotfish.io/endpoints"

# Slices of one service are written at most this often under churn; the first change after a
# quiet period is written at once. The seeds ask for "about once a second"; measured here
# (benchmarks/endpoint_freshness), 1 s put the p99 change-to-slice lag at ~1.8x the built-in
# controller's, while 0.25 s matches it and still writes ~0.1 slices per change under 100
# flips/s. Overridable through ENV_MIN_WRITE_INTERVAL (the operator's command line is shared
# by every controller).
MIN_WRITE_INTERVAL_SECONDS: Final = 0.25
ENV_MIN_WRITE_INTERVAL: Final = "PILOTFISH_ENDPOINTS_MIN_WRITE_INTERVAL"
WORKERS: Final = 4
# A round that found its own writes not yet in the informers comes back after this at the
# latest; the informer event that shows them brings it back sooner.
SETTLE_RECHECK_SECONDS: Final = 1.0


def min_interval_from_env() -> float:
    raw = os.environ.get(ENV_MIN_WRITE_INTERVAL)
    if raw is None:
        return MIN_WRITE_INTERVAL_SECONDS
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.warning(
            "ignoring a bad write interval",
            extra={"variable": ENV_MIN_WRITE_INTERVAL, "value": raw, "rule": "seconds >= 0"},
        )
        return MIN_WRITE_INTERVAL_SECONDS


class EndpointsController:
    def __init__(self, rt: Runtime, *, min_interval: float | None = None) -> None:
        self.rt = rt
        self.clock = rt.clock
        self.min_interval = min_interval_from_env() if min_interval is None else min_interval
        factory = rt.factory
        self.workloads = factory.informer(SERVICEWORKLOADS)
        self.pods = factory.informer(PODS, projection=projections.pod)
        self.services = factory.informer(SERVICES)
        self.slices = factory.informer(
            ENDPOINTSLICES, label_selector=f"{LABEL_MANAGED_BY}={ENDPOINTSLICE_MANAGED_BY}"
        )
        self.nodes = factory.informer(NODES, projection=projections.node)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        self.held_until: dict[str, float] = {}  # workload key -> end of its coalescing hold
        trackers = {
            kind: OwnWrites(f"{CONTROLLER}-{kind}", rt.clock, on_settled=self.enqueue)
            for kind in ("services", "slices", "pods")
        }
        trackers["services"].watch(self.services)
        trackers["slices"].watch(self.slices)
        trackers["pods"].watch(self.pods)
        self.own = Trackers(**trackers)
        self.executor = Executor(
            rt.rest,
            rt.events.scoped(REPORTING_CONTROLLER),
            rt.clock,
            self.own,
            RateLimiter(WRITE_QPS, WRITE_BURST, clock=rt.clock),
        )
        self.pods_of: dict[str, set[str]] = defaultdict(set)  # workload key -> pod keys
        self.slices_of: dict[str, set[str]] = defaultdict(set)  # service key -> slice keys
        self.first_change: dict[str, float] = {}  # workload key -> first unwritten change
        self.counts: dict[str, tuple[int, int]] = {}  # key -> (ready, not ready) endpoints
        self.workloads.add_handler(lambda _kind, obj, _old: self.enqueue(object_key(obj)))
        self.pods.add_handler(self._on_pod)
        self.services.add_handler(self._on_service)
        self.slices.add_handler(self._on_slice)
        self.nodes.add_handler(self._on_node)

    # Observe ------------------------------------------------------------------------------

    def enqueue(self, key: str) -> None:
        """Queue a workload, unless a coalescing hold for it is pending (its timer fires)."""
        if self.held_until.get(key, 0.0) > self.clock.monotonic():
            return
        self.queue.add(key)

    def _on_pod(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        before, after = workload_of(old), workload_of(obj)
        if kind == "DELETED":
            after = None
            before = before or workload_of(obj)
        if not (before or after):
            return  # not a workload's pod
        if before and before != after:
            self.pods_of[before].discard(key)
            if not self.pods_of[before]:
                del self.pods_of[before]
        if after:
            self.pods_of[after].add(key)
        if kind == "MODIFIED" and old is not None and endpoint_facts(old) == endpoint_facts(obj):
            return
        for wkey in {before, after} - {None}:
            assert wkey is not None
            self.first_change.setdefault(wkey, self.clock.monotonic())
            self.enqueue(wkey)

    def _on_service(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        key = object_key(obj)
        if self.workloads.get(key) is not None:
            self.enqueue(key)

    def _on_slice(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        before, after = service_of_slice(old), service_of_slice(obj)
        if kind == "DELETED":
            before, after = before or after, None
        if before and before != after:
            self.slices_of[before].discard(key)
            if not self.slices_of[before]:
                del self.slices_of[before]
        if after:
            self.slices_of[after].add(key)
        for skey in {before, after} - {None}:
            assert skey is not None
            if self.workloads.get(skey) is not None:
                self.enqueue(skey)

    def _on_node(self, kind: str, obj: Obj, old: Obj | None) -> None:
        if kind == "SYNC":
            return
        zone = (obj["metadata"].get("labels") or {}).get(names.LABEL_ZONE)
        was = ((old or {}).get("metadata", {}).get("labels") or {}).get(names.LABEL_ZONE)
        if old is not None and zone == was:
            return
        node = obj["metadata"]["name"]
        for wkey, pod_keys in list(self.pods_of.items()):
            for pkey in pod_keys:
                pod = self.pods.get(pkey)
                if pod is not None and (pod.get("spec") or {}).get("nodeName") == node:
                    self.enqueue(wkey)
                    break

    def zone_of(self, node: str) -> str | None:
        obj = self.nodes.get(node)
        return None if obj is None else (obj["metadata"].get("labels") or {}).get(names.LABEL_ZONE)

    def observe(self, key: str) -> Observed:
        pods = (self.pods.get(k) for k in sorted(self.pods_of.get(key, ())))
        slices = (self.slices.get(k) for k in sorted(self.slices_of.get(key, ())))
        return Observed(
            workload=self.workloads.get(key),
            service=self.services.get(key),
            pods=[p for p in pods if p is not None],
            slices=[s for s in slices if s is not None],
            zone_of=self.zone_of,
            now=self.clock.monotonic(),
            last_write=self.executor.last_write.get(key),
            min_interval=self.min_interval,
        )

    # Reconcile ----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        """One workload, end to end; the one place its failures are reported (the queue
        logs them and backs the key off)."""
        self.held_until.pop(key, None)
        if not self.own.settled(key):
            # Our last writes are not in the informers yet: deciding now would decide from
            # the past. The event that shows them re-enqueues the key.
            return requeue_after(SETTLE_RECHECK_SECONDS, "waiting for own writes")
        seen = self.observe(key)
        plan = decide(seen)
        try:
            result = await self.executor.finalize(key, seen.workload, plan)
        except Exception as e:
            if namespace_terminating(e):
                # Everything in the namespace is going, the workload with it: nothing to do.
                self._forget(key)
                return DONE
            if seen.workload is not None:
                self.executor.events.post(
                    seen.workload,
                    REASON_SYNC_FAILED,
                    sync_failed_note(e),
                    action=ACTION_MANAGE_ENDPOINTS,
                    type_="Warning",
                )
            raise
        self._account(key, plan, result)
        return result

    def _account(self, key: str, plan: Plan, result: Result) -> None:
        if plan.gone:
            self._forget(key)
            return
        if plan.hold > 0:
            self.held_until[key] = self.clock.monotonic() + plan.hold
        if result.retry or plan.hold > 0 or plan.invalid is not None:
            return
        if not plan.slices.empty:
            first = self.first_change.pop(key, None)
            if first is not None:
                metrics.ENDPOINTS_SYNC_SECONDS.observe(self.clock.monotonic() - first)
        elif plan.service.verb != "create":
            # Nothing to write (the slices say it already, or there are none to write):
            # a Service created this round has its slices written in the next.
            self.first_change.pop(key, None)
        self._count(key, plan.counts)

    def _count(self, key: str, counts: tuple[int, int] | None) -> None:
        if counts is None:
            if self.counts.pop(key, None) is None:
                return
        else:
            self.counts[key] = counts
        metrics.ENDPOINTS.labels("true").set(sum(c[0] for c in self.counts.values()))
        metrics.ENDPOINTS.labels("false").set(sum(c[1] for c in self.counts.values()))

    def _forget(self, key: str) -> None:
        self.executor.last_write.pop(key, None)
        self.first_change.pop(key, None)
        self.held_until.pop(key, None)
        self._count(key, None)

    async def run(self) -> None:
        # Plan only from a full view: a round before the slices are listed would create
        # every slice again. wait_synced raises if an informer died instead of syncing.
        await self.rt.factory.wait_synced()
        await self.queue.run(WORKERS, self.reconcile)
