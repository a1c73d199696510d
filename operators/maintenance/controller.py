"""Wiring: kopf's NodeMaintenance events and the shared informers feed one queue keyed by
the NodeMaintenance's name; reconcile = read it → `model.observe` → `decide.decide` → apply.

The NodeMaintenance is read with a GET each round (a low-rate object; the round then decides
from the API's copy, whatever kopf's watch has delivered), its nodes, their pods (indexed by
`spec.nodeName` from the shared pod informer), the budgets of those pods' namespaces, and
the ServiceWorkloads of those pods with their pods (indexed by the workload label) from the
shared informers. A node, pod, budget or workload event enqueues the maintenances it can
change: those covering the node, those with a draining node (budgets), those waiting for
that workload's surge.

Level-triggered from the API's state (the nodes' annotations say what is cordoned and
draining and by whom), plus three things only this process knows, on its monotonic clock:
when it first saw each node draining (a BatchWorkload task's deadline), since when each node
has been blocked (the Blocked condition, Event and alert), and the last 429 each pod got
(with its retry paced by a per-pod backoff). A process killed between two writes restarts
from the annotations; its clocks restart (late, never early) and the refusals are learnt
again from the API server, which judges every eviction against the budgets, so no restart
can evict more than a budget allows.

While a write of ours (a cordon, an accepted eviction, an uncordon) is not yet in the
informers, the maintenance is not decided again (`OwnWrites`); the event that shows the
write re-enqueues it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pilotfish import metrics, names, tasks
from pilotfish.kube import projections
from pilotfish.kube.informer import Obj
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NODEMAINTENANCES, NODES, PODS, SERVICEWORKLOADS, ApiError
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import (
    DONE,
    ControllerRateLimiter,
    Result,
    WorkQueue,
    requeue_after,
    retry,
)
from pilotfish.operators.maintenance import apply
from pilotfish.operators.maintenance.decide import Plan, decide, release
from pilotfish.operators.maintenance.index import Index, Key
from pilotfish.operators.maintenance.model import (
    CONTROLLER,
    REPORTING_CONTROLLER,
    Observed,
    PodRef,
    Refusal,
    observe,
)
from pilotfish.operators.serviceworkload import pdb as pdbs
from pilotfish.timeutil import format_time
from pilotfish.workloads import LABEL_WORKLOAD

log = logging.getLogger("pilotfish.maintenance")

WORKERS: Final = 2
SETTLE_RECHECK_SECONDS: Final = 5.0
# A conflict or a failed eviction retries from here, doubling; capped, as nothing this
# controller watches announces that an eviction's error went away.
RETRY_BASE_SECONDS: Final = 0.5
RETRY_MAX_SECONDS: Final = 60.0
# A pod whose eviction got a 429 is asked again after this, doubling per refusal (a budget
# event or a node's change wakes the maintenance sooner, but not the refused pod's retry).
REFUSED_BASE_SECONDS: Final = 1.0
REFUSED_MAX_SECONDS: Final = 30.0
NODE_STATES: Final = ("Pending", "Cordoned", "Draining", "Drained", "Failed")


class MaintenanceController:
    def __init__(self, rt: Runtime, workers: int = WORKERS) -> None:
        self.rt = rt
        self.workers = workers
        factory = rt.factory
        self.nodes = factory.informer(NODES, projection=projections.node)
        self.pods = factory.informer(PODS, projection=projections.pod)
        self.pdbs = factory.informer(pdbs.PDBS)
        self.sws = factory.informer(SERVICEWORKLOADS)
        self.queue: WorkQueue[str] = WorkQueue(
            CONTROLLER,
            clock=rt.clock,
            limiter=ControllerRateLimiter(rt.clock, base=RETRY_BASE_SECONDS, cap=RETRY_MAX_SECONDS),
        )
        self.writes = OwnWrites(CONTROLLER, rt.clock, on_settled=self.queue.add)
        self.writes.watch(self.nodes)
        self.writes.watch(self.pods)
        self.events = rt.events.scoped(REPORTING_CONTROLLER)
        self.paced: ControllerRateLimiter[PodRef] = ControllerRateLimiter(
            rt.clock, base=REFUSED_BASE_SECONDS, cap=REFUSED_MAX_SECONDS
        )
        self.index = Index()
        self.active: set[str] = set()  # with a node cordoned or draining
        self.surging: defaultdict[Key, set[str]] = defaultdict(set)  # workload -> maintenances
        # This process's own memory (monotonic seconds).
        self.draining_since: dict[str, float] = {}
        self.blocked_since: dict[str, float] = {}
        self.refused: defaultdict[str, dict[PodRef, Refusal]] = defaultdict(dict)
        self.next_try: dict[PodRef, float] = {}
        self.states: dict[str, Counter[str]] = {}
        self.blocked: dict[str, int] = {}
        self._released: dict[str, asyncio.Event] = {}
        self.nodes.add_handler(self._on_node)
        self.pods.add_handler(self._on_pod)
        self.pdbs.add_handler(self._on_pdb)
        self.sws.add_handler(self._on_workload)

    # --- events: kopf's and the informers' ------------------------------------------------

    def saw(self, name: str, body: Mapping[str, Any] | None) -> None:
        """kopf saw NodeMaintenance `name` change (None: deleted)."""
        if body is None:
            self.forget(name)
            return
        self.index.cover(name, (body.get("spec") or {}).get("nodes") or [])
        self.queue.add(name)

    async def released(self, name: str, within: float) -> bool:
        """For kopf's deletion handler: True once every node `name` cordoned is uncordoned
        and its annotations are gone (kopf then removes the finalizer)."""
        done = self._released.setdefault(name, asyncio.Event())
        self.queue.add(name)
        try:
            await asyncio.wait_for(done.wait(), within)
        except TimeoutError:
            return False
        return True

    def forget(self, name: str) -> None:
        self.index.uncover(name)
        self.active.discard(name)
        for waiting in self.surging.values():
            waiting.discard(name)
        for ref in self.refused.pop(name, {}):
            self.next_try.pop(ref, None)
            self.paced.forget(ref)
        self.states.pop(name, None)
        self.blocked.pop(name, None)
        self._released.pop(name, None)
        self._report()

    def _on_node(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        name = str(obj["metadata"]["name"])
        before, marks = self.index.node(kind, obj)
        if names.ANNOTATION_DRAINING not in marks:
            self.draining_since.pop(name, None)
            self.blocked_since.pop(name, None)
        for nm in self.index.covering.get(name, set()) | {*before.values(), *marks.values()}:
            self.queue.add(nm)

    def _on_pod(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        nodes, workloads = self.index.pod(kind, obj)
        for n in nodes:
            for nm in self.index.covering.get(n, ()):
                self.queue.add(nm)
        for w in workloads:
            for nm in self.surging.get(w, ()):
                self.queue.add(nm)

    def _on_pdb(self, _kind: str, _obj: Obj, _old: Obj | None) -> None:
        for nm in self.active:
            self.queue.add(nm)

    def _on_workload(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        meta = obj.get("metadata") or {}
        for nm in self.surging.get((str(meta.get("namespace", "")), str(meta.get("name"))), ()):
            self.queue.add(nm)

    # --- observe --------------------------------------------------------------------------

    def _pods(self, keys: Iterable[str]) -> list[Obj]:
        return [p for k in sorted(keys) if (p := self.pods.get(k)) is not None]

    def pods_of(self, node: str) -> list[Obj]:
        found = self._pods(self.index.pods_on.get(node, ()))
        return [p for p in found if (p.get("spec") or {}).get("nodeName") == node]

    def observe(self, name: str, nm: Obj, now: float) -> Observed:
        nodes = self.index.spec_nodes.get(name, ())
        node_objs = {n: self.nodes.get(n) for n in nodes}
        pods_by_node = {n: self.pods_of(n) for n in nodes}
        namespaces = {
            str(p["metadata"].get("namespace", "")) for ps in pods_by_node.values() for p in ps
        }
        budgets = [
            b for b in self.pdbs.store.values() if b["metadata"].get("namespace") in namespaces
        ]
        wanted = {
            (str(p["metadata"].get("namespace", "")), str(w))
            for ps in pods_by_node.values()
            for p in ps
            if (w := ((p["metadata"].get("labels") or {}).get(LABEL_WORKLOAD)))
        }
        workloads = {k: sw for k in wanted if (sw := self.sws.get(f"{k[0]}/{k[1]}")) is not None}
        workload_pods = {k: self._pods(self.index.workload_pods.get(k, ())) for k in workloads}
        for n in nodes:
            if self.index.draining_for(n) == name:
                self.draining_since.setdefault(n, now)
        live = {
            PodRef(
                str(p["metadata"].get("namespace")),
                str(p["metadata"]["name"]),
                str(p["metadata"].get("uid")),
                n,
            )
            for n, ps in pods_by_node.items()
            for p in ps
        }
        refused = self.refused[name]
        for ref in [r for r in refused if r not in live]:
            del refused[ref]
            self.next_try.pop(ref, None)
            self.paced.forget(ref)
        return observe(
            nm,
            node_objs,
            pods_by_node,
            budgets,
            workloads,
            workload_pods,
            self.index.draining(),
            draining_for={
                n: now - self.draining_since[n] for n in nodes if n in self.draining_since
            },
            blocked_for={n: now - self.blocked_since[n] for n in nodes if n in self.blocked_since},
            refused=dict(refused),
            now=format_time(self.rt.clock.now()),
        )

    # --- reconcile ------------------------------------------------------------------------

    async def reconcile(self, name: str) -> Result:
        if not self.writes.settled(name):
            return requeue_after(SETTLE_RECHECK_SECONDS, "own write not yet observed")
        try:
            nm = await self.rt.rest.get(NODEMAINTENANCES.path(name=name))
        except ApiError as e:
            if not e.not_found:
                raise
            self.forget(name)
            return DONE
        nodes = set(self.index.cover(name, (nm.get("spec") or {}).get("nodes") or []))
        if nm["metadata"].get("deletionTimestamp"):
            return await self._release(name, nodes | self.index.marked_by(name))
        ev = self._released.get(name)
        if ev is not None and ev.is_set():
            self._released.pop(name)  # a new object of that name
        now = self.rt.clock.monotonic()
        obs = self.observe(name, nm, now)
        plan = decide(obs)
        done = await self._carry_out(name, nm, obs, plan, now)
        orphans = self.index.marked_by(name) - nodes
        if orphans:  # taken out of spec.nodes after we cordoned them: released at once
            freed = await self._release(name, orphans, final=False)
            done = done if not freed.retry else freed
        return done

    async def _carry_out(self, name: str, nm: Obj, obs: Observed, plan: Plan, now: float) -> Result:
        rest, r = self.rt.rest, apply.Round()
        uncordoned: set[str] = set()
        for c in plan.cordon:
            node = self.nodes.get(c.node)
            if node is None:
                continue
            ops = apply.cordon_patch(node, name, c.set_unschedulable)
            outcome = await apply.patch_node(rest, self.writes, name, c.node, ops)
            if outcome is apply.Outcome.OK:
                self.draining_since.setdefault(c.node, now)
                log.info("node cordoned", extra={"maintenance": name, "node": c.node})
            else:  # not cordoned: evicting its pods now could bring them straight back
                uncordoned.add(c.node)
                if outcome is apply.Outcome.STALE:
                    r.stale.append(f"node {c.node}")
        deferred: list[float] = []
        for pod in plan.evict:
            if pod.node in uncordoned:
                continue
            due = self.next_try.get(pod)
            if due is not None and due > now:
                deferred.append(due - now)
                continue
            result, detail = await apply.evict(rest, self.writes, name, pod)
            if result is apply.Evicted.REFUSED:
                self.refused[name][pod] = detail
                delay = self.paced.when(pod)
                self.next_try[pod] = now + delay
                deferred.append(delay)
            elif result is apply.Evicted.ERROR:
                r.errors.append(f"{pod.key}: {detail}")
            else:
                r.evicted[pod.node] = r.evicted.get(pod.node, 0) + 1
                self.refused[name].pop(pod, None)
                self.next_try.pop(pod, None)
                self.paced.forget(pod)
        # The round's Events go out even when its status write is refused: the next round
        # may find the transition past (a node drained in between) and never name it again;
        # one repeated once is harmless (the poster folds repeats into a series).
        apply.post_events(self.events, nm, plan.events)
        if plan.status and plan.status != nm.get("status"):
            outcome = await apply.write_status(rest, nm, plan.status)
            if outcome is apply.Outcome.GONE:
                return DONE
            if outcome is apply.Outcome.STALE:
                r.stale.append(f"NodeMaintenance {name} status")
        wake = self._account(name, obs, plan, r, now)
        if r.stale or r.errors:
            return retry((r.stale + r.errors)[0])
        delays = [d for d in (plan.requeue_after, wake, *deferred) if d is not None]
        return requeue_after(min(delays), "next deadline") if delays else DONE

    def _account(
        self, name: str, obs: Observed, plan: Plan, r: apply.Round, now: float
    ) -> float | None:
        """Blocked clocks, metrics and indexes after a round; returns when the next blocked
        node reaches blockedAfterSeconds, if one will."""
        threshold = obs.spec.blocked_after_seconds
        wake: float | None = None
        over = 0
        for n in obs.spec.nodes:
            if n in plan.blocked_nodes and not r.evicted.get(n):
                since = self.blocked_since.setdefault(n, now)
                left = threshold - (now - since)
                if left > 0:
                    wake = left if wake is None else min(wake, left)
                else:
                    over += 1
            else:
                self.blocked_since.pop(n, None)
        states: Counter[str] = Counter(
            str(n.get("state")) for n in (plan.status.get("nodes") or []) if isinstance(n, dict)
        )
        self.states[name] = states
        self.blocked[name] = over
        busy = states.get("Cordoned", 0) + states.get("Draining", 0)
        (self.active.add if busy else self.active.discard)(name)
        for waiting in self.surging.values():
            waiting.discard(name)
        for key in obs.surge:
            self.surging[key].add(name)
        self._report()
        return wake

    def _report(self) -> None:
        for state in NODE_STATES:
            metrics.MAINTENANCE_NODES.labels(state).set(
                sum(c.get(state, 0) for c in self.states.values())
            )
        metrics.MAINTENANCE_BLOCKED_NODES.set(sum(self.blocked.values()))

    async def _release(self, name: str, candidates: set[str], *, final: bool = True) -> Result:
        """Uncordon what `name` cordoned and drop its annotations from `candidates`; `final`
        (it is being deleted): tell kopf's deletion handler once nothing of it is left."""
        nodes = {n: self.nodes.get(n) for n in sorted(candidates)}
        stale = []
        for n in release(name, nodes):
            node = nodes.get(n)
            ops = apply.release_patch(node, name) if node is not None else None
            if ops is None:
                continue
            outcome = await apply.patch_node(self.rt.rest, self.writes, name, n, ops)
            if outcome is apply.Outcome.STALE:
                stale.append(n)
            elif outcome is apply.Outcome.OK:
                log.info("node released", extra={"maintenance": name, "node": n})
        if stale:
            return retry(f"node {stale[0]} changed; releasing it again")
        if not self.writes.settled(name):
            return requeue_after(SETTLE_RECHECK_SECONDS, "release not yet observed")
        if final and not self.index.marked_by(name) & candidates:
            self._released.setdefault(name, asyncio.Event()).set()
        return DONE

    async def run(self) -> None:
        # Imported here: a process started without this controller never loads kopf.
        from pilotfish.operators.maintenance import kopfwire

        await self.rt.factory.wait_synced()
        await tasks.run_guarded(
            {
                "maintenance queue": self.queue.run(self.workers, self.reconcile),
                "kopf nodemaintenances": kopfwire.run(self.rt.rest, self),
            }
        )
