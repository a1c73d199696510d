"""The gate controller's wiring: the views it reads, the queue, and one round per reconcile.

Observe: the process's shared informers (`Runtime.factory`), never watches of its own:
- pods (the one pod informer, `projections.pod`): the handler keeps the keys of pods
  labelled `gates.pilotfish.io/gated=true`, the ones decided about;
- TeamQuotas, read as quota ledgers (`pilotfish.ledger`: used plus reservations, this
  process's own reservations included through its `Reserver`): what quota is free;
- namespaces (team label), nodes (Ready, images), GateSignals, GatePolicies (pacing, and
  the terms of every gate: `terms`), BatchWorkloads (the size of each batch gang: `gangs`).
Everything is rebuilt by listing on start; nothing but the pacing buckets lives only here.

Reconcile: one round is observe (`world`) -> `decide.decide` (pure: a plan) -> `apply`
(one executor, conditional writes). A single work queue key makes rounds serial, which is
what keeps quota and pacing exact: two rounds can never both spend the same quota. Bursts of
events collapse into one round (the queue de-duplicates). A round never decides from a
cache older than the previous round's writes (`OwnWrites`, owner `ROUND`): it waits for the
informer to show them, and the event that does re-enqueues it. The queue alone retries: a
conflict returns RETRY, the next deadline or pacing token `requeue_after`.
"""

from __future__ import annotations

import datetime
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final

from pilotfish import gates, ledger, metrics, names
from pilotfish.kube import projections
from pilotfish.kube.informer import Obj, object_key
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import (
    BATCHWORKLOADS,
    GATEPOLICIES,
    GATESIGNALS,
    NAMESPACES,
    NODES,
    PODS,
    TEAMQUOTAS,
)
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, Result, WorkQueue, requeue_after, retry
from pilotfish.operators.gates import terms
from pilotfish.operators.gates.apply import CONTROLLER, ROUND, Executor
from pilotfish.operators.gates.audit import AuditLog
from pilotfish.operators.gates.decide import decide
from pilotfish.operators.gates.model import (
    BatchView,
    NodeView,
    PodView,
    SignalView,
    batch_view,
    namespace_pacing,
    node_view,
    pod_view,
    quota_view,
    signal_view,
)
from pilotfish.operators.gates.pacing import Bucket
from pilotfish.operators.gates.plan import World
from pilotfish.reservations import Reserver
from pilotfish.timeutil import parse_time_or_none as parse_ts

log = logging.getLogger("pilotfish.gates")

REPORTING_CONTROLLER: Final = "pilotfish.io/gates"


class GateController:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.clock = rt.clock
        self.actor = f"{names.SA_OPERATOR}/{CONTROLLER}/{rt.identity}"
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        f = rt.factory
        self.pods = f.informer(PODS, projection=projections.pod)
        self.namespaces = f.informer(NAMESPACES)
        self.nodes = f.informer(NODES, projection=projections.node)
        self.signals = f.informer(GATESIGNALS)
        self.quotas = f.informer(TEAMQUOTAS)
        self.policies = f.informer(GATEPOLICIES)
        self.batches = f.informer(BATCHWORKLOADS)
        self.own = OwnWrites(CONTROLLER, rt.clock, on_settled=lambda _owner: self._kick())
        self.own.watch(self.pods)
        self.reserver = Reserver(
            rt.rest,
            self.quotas,
            CONTROLLER,
            rt.clock,
            on_conflict=metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc,
        )
        self.executor = Executor(
            rt.rest,
            self.pods,
            self.own,
            self.reserver,
            rt.events.scoped(REPORTING_CONTROLLER),
            AuditLog(rt.audit_log, self.actor),
        )
        self.audit = self.executor.audit
        self.gated: set[str] = set()  # keys of the pods the rounds decide about
        self.buckets: dict[str, Bucket] = {}
        self._views: dict[str, tuple[Obj, PodView]] = {}
        self._policy_terms: dict[str, tuple[Obj, terms.PolicyGates]] = {}
        self._nodes: dict[str, tuple[Obj, NodeView]] = {}
        self._gauge_labels: dict[str, set[tuple[str, ...]]] = {}
        self.rounds = 0
        self._wire()

    # observe

    def _kick(self) -> None:
        self.queue.add(ROUND)

    def _wire(self) -> None:
        self.pods.add_handler(self._on_pod)
        self.namespaces.add_handler(
            self._when_changed(lambda o: (o.get("metadata") or {}).get("labels"))
        )
        self.nodes.add_handler(self._when_changed(node_view))
        self.signals.add_handler(self._when_changed(signal_view))
        self.quotas.add_handler(self._when_changed(ledger.read_part))  # room freed or taken
        self.policies.add_handler(self._when_changed(lambda o: o.get("spec")))
        # A batch gang's size; its status (written often by the batch operator) is not read.
        self.batches.add_handler(self._when_changed(batch_view))

    def _when_changed(self, part: Callable[[Obj], Any]) -> Callable[[str, Obj, Obj | None], None]:
        """A handler that starts a round only when the part a decision reads changed (node
        heartbeats and quota status updates would otherwise start one each)."""

        def handler(kind: str, obj: Obj, old: Obj | None) -> None:
            if kind in ("ADDED", "DELETED") or old is None or part(obj) != part(old):
                self._kick()

        return handler

    def _on_pod(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        """Only gated pods matter here; every other pod event costs a label lookup."""
        key = object_key(obj)
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if kind != "DELETED" and labels.get(gates.LABEL_GATED) == "true":
            self.gated.add(key)
            self._kick()
        elif key in self.gated:
            self.gated.discard(key)
            self._views.pop(key, None)
            self._kick()

    def _view(self, obj: Obj) -> PodView:
        """Parse once per object: the informer replaces the dict on every change, so identity
        says exactly when to re-parse."""
        key = object_key(obj)
        cached = self._views.get(key)
        if cached is not None and cached[0] is obj:
            return cached[1]
        view = pod_view(obj)
        self._views[key] = (obj, view)
        return view

    def _node_views(self) -> list[NodeView]:
        seen: dict[str, tuple[Obj, NodeView]] = {}
        for key, obj in self.nodes.store.items():
            cached = self._nodes.get(key)
            seen[key] = cached if cached is not None and cached[0] is obj else (obj, node_view(obj))
        self._nodes = seen
        return [v for _, v in seen.values()]

    def _policies(self) -> dict[tuple[str, str], terms.PolicyGates]:
        """Every GatePolicy's gates, parsed once per version (identity, as `_view`)."""
        out: dict[tuple[str, str], terms.PolicyGates] = {}
        seen: dict[str, tuple[Obj, terms.PolicyGates]] = {}
        for key, obj in self.policies.store.items():
            cached = self._policy_terms.get(key)
            parsed = (
                cached[1] if cached is not None and cached[0] is obj else terms.policy_gates(obj)
            )
            seen[key] = (obj, parsed)
            out[(parsed.namespace, parsed.name)] = parsed
        self._policy_terms = seen
        return out

    def world(self) -> World:
        views = (signal_view(o) for o in self.signals.store.values())
        signals: dict[tuple[str, str], SignalView] = {(s.namespace, s.name): s for s in views}
        pods = [self._view(o) for k in sorted(self.gated) if (o := self.pods.get(k)) is not None]
        return World(
            pods=pods,
            namespace_labels={
                str(o["metadata"]["name"]): dict(o["metadata"].get("labels") or {})
                for o in self.namespaces.store.values()
            },
            signals=signals,
            quotas=[quota_view(tq) for n in self.quotas.store if (tq := self.reserver.current(n))],
            nodes=self._node_views(),
            pacing=namespace_pacing(list(self.policies.store.values())),
            buckets=dict(self.buckets),
            policies=self._policies(),
            batches=self._batches(),
        )

    def _batches(self) -> dict[tuple[str, str], BatchView]:
        views = (batch_view(o) for o in self.batches.store.values())
        return {(v.namespace, v.name): v for v in views}

    # reconcile

    async def reconcile(self, key: str) -> Result:
        """One decision round (the work queue's only key)."""
        del key
        await self.executor.resolve()
        if not self.own.settled(ROUND):
            # The event that shows the last write re-enqueues the round; this visit only
            # lets the tracker expire a write the informer never showed.
            return requeue_after(self.own.ttl, "own writes not yet observed")
        started = self.clock.monotonic()
        now = self.clock.now()
        world = self.world()
        self.audit.complete(world.pods, now, f"{names.SA_OPERATOR}/{CONTROLLER}/")
        plan = decide(world, now, started)
        self.buckets = dict(plan.buckets)
        outcome = await self.executor.apply(plan, now)
        self.rounds += 1
        self._update_metrics(world, now)
        metrics.GATES_ROUND_SECONDS.observe(self.clock.monotonic() - started)
        if outcome.conflicts or outcome.refused:
            return retry(
                f"{outcome.conflicts} pods changed and the quota of {outcome.refused} was "
                "taken since the round read them"
            )
        if plan.wake_after is not None:
            return requeue_after(plan.wake_after, "next deadline or pacing token")
        return DONE

    # metrics

    def _set_gauge(self, name: str, gauge: Any, values: Mapping[tuple[str, ...], float]) -> None:
        """Set a labelled gauge to exactly `values`: label sets no longer present are removed,
        so a namespace that emptied does not report its last count forever."""
        for labels, v in values.items():
            gauge.labels(*labels).set(v)
        for stale in self._gauge_labels.get(name, set()) - set(values):
            gauge.remove(*stale)
        self._gauge_labels[name] = set(values)

    def _update_metrics(self, world: World, now: datetime.datetime) -> None:
        gated: Counter[tuple[str, ...]] = Counter()
        oldest: dict[tuple[str, ...], float] = {}
        timeout: dict[tuple[str, ...], float] = {}
        in_flight: Counter[tuple[str, ...]] = Counter()
        for p in world.pods:
            if not p.alive:
                continue
            since = parse_ts(p.record_created) or p.created
            age = max(0.0, (now - since).total_seconds())
            for g in p.pilotfish_gates:
                k = (g, p.namespace)
                gated[k] += 1
                oldest[k] = max(oldest.get(k, 0.0), age)
                rec = p.record.get(g)
                if rec is not None:
                    timeout[k] = max(timeout.get(k, 0.0), float(rec.timeout_seconds))
            if p.released and not p.node_name:
                in_flight[(p.namespace,)] += 1
        self._set_gauge("gated", metrics.GATES_GATED_PODS, gated)
        self._set_gauge("oldest", metrics.GATES_OLDEST_GATED_AGE, oldest)
        self._set_gauge("timeout", metrics.GATES_TIMEOUT, timeout)
        self._set_gauge("in_flight", metrics.GATES_IN_FLIGHT, in_flight)

    # run

    async def run(self) -> None:
        try:
            await self.rt.factory.wait_synced()
            log.info("gate controller synced; first round", extra={"pods": len(self.gated)})
            self._kick()
            await self.queue.run(1, self.reconcile)
        finally:
            self.audit.close()
