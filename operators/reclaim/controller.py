"""Wiring: every `PILOTFISH_RECLAIM_INTERVAL_SECONDS`, one cycle = three PromQL queries
(cluster-wide, so the cost does not grow with the nodes asked about), then per node
observe → decide (pure) → write the figure → give back.

Time-driven, not event-driven: usage lives in Prometheus, which sends no events, so the
cycle is one key on the shared work queue, requeued on the runtime's clock. Everything a
cycle decides from is on the node itself (its current figure, its BatchCapacity condition)
or in the cycle's answers, so a restarted operator carries on where the last one stopped:
a decaying figure keeps halving from what the node carries, and an Event is posted once per
transition because the previous state is the node's condition. A node whose last write is
not yet in the informer waits a cycle rather than halving twice from the past.

Without `PILOTFISH_PROMETHEUS_URL` reclaim is off: one log line, no informer, no write.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Final

from pilotfish import metrics
from pilotfish.kube import projections
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODES, PODS, ApiError
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import Result, WorkQueue, requeue_after
from pilotfish.operators.reclaim import reasons
from pilotfish.operators.reclaim.apply import Outcome, evict, write_figure
from pilotfish.operators.reclaim.decide import (
    Decision,
    allocated,
    amount,
    decide,
    give_back,
    reclaimed,
)
from pilotfish.operators.reclaim.model import (
    CONTROLLER,
    CPU,
    MEMORY,
    REPORTING_CONTROLLER,
    RESOURCES,
    SCALE,
    NodeInputs,
    Usage,
    node_inputs,
    node_ref,
    pod_ref,
    usage_from,
)
from pilotfish.operators.reclaim.settings import ReclaimSettings
from pilotfish.promql import PrometheusClient, PromQL, PromQLError
from pilotfish.timeutil import format_time

log = logging.getLogger("pilotfish.reclaim")

CYCLE: Final = "cycle"
FAILURE_MAX: Final = 300  # characters of Prometheus's error kept in a condition message


class ReclaimController:
    def __init__(
        self,
        rt: Runtime,
        settings: ReclaimSettings | None = None,
        prometheus: PromQL | None = None,
    ) -> None:
        self.rt = rt
        self.settings = settings or ReclaimSettings.from_env()
        if prometheus is None and self.settings.prometheus_url:
            prometheus = PrometheusClient(self.settings.prometheus_url)
        self.prometheus = prometheus
        self.events = rt.events.scoped(REPORTING_CONTROLLER)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        self.writes = OwnWrites(CONTROLLER, rt.clock)
        self.labelled: set[str] = set()  # nodes with per-node gauges
        if self.prometheus is None:
            return
        self.nodes = rt.factory.informer(NODES, projection=projections.node)
        self.pods = rt.factory.informer(PODS, projection=projections.pod)
        self.writes.watch(self.nodes)

    @property
    def enabled(self) -> bool:
        return self.prometheus is not None

    # --- one cycle ------------------------------------------------------------------------

    async def observe(self) -> tuple[Usage, str | None]:
        """The cycle's answers, or why there are none."""
        assert self.prometheus is not None
        s = self.settings
        try:
            cpu = await self.prometheus.query(s.cpu_p95())
            memory = await self.prometheus.query(s.memory_p95())
            ages = await self.prometheus.query(s.freshness())
        except PromQLError as e:
            metrics.RECLAIM_PROMETHEUS_ERRORS.inc()
            log.warning(
                "Prometheus query failed; batch allocatable decays",
                extra={"error_type": e.error_type, "error": e.error, "query": e.expr},
            )
            return Usage(), f"{e.error_type}: {e.error}"[:FAILURE_MAX]
        return usage_from(cpu, memory, ages, self.rt.clock.now().timestamp()), None

    def pods_by_node(self) -> Mapping[str, list[dict[str, Any]]]:
        out: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in self.pods.store.values():
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                out[str(node)].append(pod)
        return out

    async def cycle(self) -> None:
        started = self.rt.clock.monotonic()
        usage, failure = await self.observe()
        now = format_time(self.rt.clock.now())
        pods = self.pods_by_node()
        stale = over_request = 0
        names = sorted(self.nodes.store)
        for name in names:
            try:
                seen = await self.node_round(name, pods.get(name, []), usage, failure, now)
            except asyncio.CancelledError:
                raise
            except Exception:  # one node's failed write must not hold back the others
                metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
                log.exception("reclaim failed for a node; next cycle", extra={"node": name})
                continue
            if seen is None:
                continue
            inputs, d = seen
            stale += d.state != reasons.MEASURED
            if d.state == reasons.MEASURED and inputs.batch_pods:
                over_request += sum(
                    1
                    for p in inputs.reserved
                    if p.band == "production"
                    and any((u := p.p95[r]) is not None and u > p.requests[r] for r in RESOURCES)
                )
            self._gauges(inputs, d)
        for gone in self.labelled - set(names):
            for g in (
                metrics.RECLAIM_BATCH_CORES,
                metrics.RECLAIM_BATCH_BYTES,
                metrics.RECLAIM_RECLAIMED_CORES,
                metrics.RECLAIM_RECLAIMED_BYTES,
            ):
                g.remove(gone)
            self.labelled.discard(gone)
        metrics.RECLAIM_STALE_NODES.set(stale)
        metrics.RECLAIM_PRODUCTION_OVER_REQUEST.set(over_request)
        metrics.RECLAIM_CYCLE_SECONDS.observe(self.rt.clock.monotonic() - started)

    def _gauges(self, inputs: NodeInputs, d: Decision) -> None:
        got = {
            r: reclaimed(inputs.allocatable[r], d.figures[r].reserved, d.effective[r])
            for r in RESOURCES
        }
        name = inputs.name
        metrics.RECLAIM_BATCH_CORES.labels(name).set(d.effective[CPU] / float(SCALE[CPU]))
        metrics.RECLAIM_BATCH_BYTES.labels(name).set(d.effective[MEMORY])
        metrics.RECLAIM_RECLAIMED_CORES.labels(name).set(got[CPU] / float(SCALE[CPU]))
        metrics.RECLAIM_RECLAIMED_BYTES.labels(name).set(got[MEMORY])
        self.labelled.add(name)

    async def node_round(
        self,
        name: str,
        pods: list[dict[str, Any]],
        usage: Usage,
        failure: str | None,
        now: str,
    ) -> tuple[NodeInputs, Decision] | None:
        """Decide and write one node's figure, then give back; None when the node was
        not decided this cycle (gone, its last write not yet seen, or changed twice)."""
        if not self.writes.settled(name):
            log.info("own write not yet observed; next cycle", extra={"node": name})
            return None
        obj = self.nodes.get(name)
        for _ in range(2):  # a refused write is decided once more from a fresh copy
            if obj is None:
                return None
            inputs = node_inputs(obj, pods, usage)
            d = decide(inputs, failure, self.settings, now)
            if not d.write:
                break
            outcome = await write_figure(self.rt.rest, self.writes, d, inputs.resource_version)
            if outcome is Outcome.GONE:
                return None
            if outcome is Outcome.OK:
                self._post_transition(inputs, d)
                break
            try:
                obj = await self.rt.rest.get(NODES.path(name=name))
            except ApiError as e:
                if e.not_found:
                    return None
                raise
        else:
            log.info("node changed under two writes; next cycle", extra={"node": name})
            return None
        await self.give_back(inputs, d)
        return inputs, d

    def _post_transition(self, inputs: NodeInputs, d: Decision) -> None:
        if d.event is None:
            return
        reason, note = d.event
        warning = reason == reasons.EVENT_STALE
        self.events.post(
            node_ref(inputs),
            reason,
            note,
            action=reasons.ACTION_MEASURE,
            type_="Warning" if warning else "Normal",
        )
        (log.warning if warning else log.info)(
            "batch capacity " + ("decaying" if warning else "measured again"),
            extra={"node": inputs.name, "state": d.state},
        )

    async def give_back(self, inputs: NodeInputs, d: Decision) -> None:
        """Evict, in order, until the node's batch pods fit the figure it carries; a
        refused pod is passed over for the next in order, and tried again next cycle."""
        remaining = list(inputs.batch_pods)
        before = allocated(remaining)
        refused: set[str] = set()
        while plan := give_back(remaining, d.effective, inputs.allocatable, refused):
            pod = plan[0]
            result = await evict(self.rt.rest, inputs.name, pod)
            if result not in (reasons.EVICTED, reasons.GONE):
                refused.add(pod.uid)
                continue
            remaining.remove(pod)
            if result == reasons.EVICTED:
                figure = ", ".join(
                    f"{r} {amount(r, d.effective[r])} (its batch pods ask {amount(r, before[r])})"
                    for r in RESOURCES
                )
                self.events.post(
                    pod_ref(pod),
                    reasons.EVENT_EVICTED,
                    f"node {inputs.name} gives reclaimed capacity back to production: batch "
                    f"allocatable {figure}; evicted, lowest band and newest first",
                    action=reasons.ACTION_EVICT,
                    type_="Warning",
                )
                log.warning(
                    "batch pod evicted to give capacity back",
                    extra={"node": inputs.name, "pod": pod.key, "state": d.state},
                )

    # --- running --------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        """One cycle, then the next one interval after this one began. Never the queue's
        quick retry: each cycle is a decay step, so a cycle repeated at once would halve a
        stale node's figure again."""
        started = self.rt.clock.monotonic()
        try:
            await self.cycle()
        except asyncio.CancelledError:
            raise
        except Exception:
            metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
            log.exception("reclaim cycle failed; next cycle")
        spent = self.rt.clock.monotonic() - started
        return requeue_after(self.settings.interval - spent, "next reclaim cycle")

    async def run(self) -> None:
        if self.prometheus is None:
            log.info(
                "reclaim is off: PILOTFISH_PROMETHEUS_URL is not set; "
                "no batch.pilotfish.io capacity is written"
            )
            await asyncio.Event().wait()  # a guarded task must not end
            return
        log.info(
            "reclaim is on",
            extra={
                "prometheus": self.settings.prometheus_url,
                "interval": self.settings.interval,
                "window": self.settings.window,
                "margin": self.settings.margin,
                "stale_after": self.settings.stale_after,
            },
        )
        await self.rt.factory.wait_synced()
        self.queue.add(CYCLE)
        try:
            await self.queue.run(1, self.reconcile)
        finally:
            if isinstance(self.prometheus, PrometheusClient):
                await self.prometheus.close()
