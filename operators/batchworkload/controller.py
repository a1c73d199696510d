"""The BatchWorkload controller's wiring: informers, handlers, pacing state, queue, and
`reconcile` = observe → `decide.decide` → `apply.Executor.apply`.

Observe: the shared informers on BatchWorkloads and pods (the process's one pod view).
The pod handler indexes task pods by the job controlling them, enqueues it, and counts
its binds (a pod that gained a nodeName) for the pacing limit. A job is never decided from
while one of this controller's own writes for it is not yet in the informers (`OwnWrites`).

Syncs of a busy job are coalesced: at most one every `sync_interval` seconds (pod events
arrive by the thousand), so status writes are shared by many tasks; only a job whose last
tasks may just have succeeded is synced at once, so its completion is not delayed. A job
that is gone or being deleted has the tracking finalizer taken off its pods, so the garbage
collector can remove them; so do pods left by an earlier job of the same name (another uid).

Production first: the same pod handler keeps the production pods waiting for placement
(`production.ProductionWaiting`); while one waits no job creates pods, and when the last
one binds every held job is synced at once. Before production comes, every job's creates
slow down while its pod creates take longer than at their quickest, or the pod informer
shows its own pod writes later (`apidelay`: the API server's queues growing). The pacing
state of every job (bind rates, delays, buckets, the production pods) is one
`pacer.Pacer`. A namespace being deleted (the namespace informer, or a create refused for
it) creates nothing more and lets go of every task pod.

The failure backoff's base comes from `PILOTFISH_BATCH_BACKOFF_SECONDS` when set (a test
cluster shortens it), else `BACKOFF_BASE_SECONDS`; an explicit `backoff_base` wins.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Final

from pydantic import ValidationError

from pilotfish import metrics
from pilotfish.api.batchworkload import BatchWorkload
from pilotfish.kube import projections
from pilotfish.kube.informer import Obj, object_key
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import BATCHWORKLOADS, NAMESPACES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import (
    DONE,
    ControllerRateLimiter,
    Result,
    WorkQueue,
    requeue_after,
)
from pilotfish.operators.batchworkload.apply import CONTROLLER, Executor, Trackers
from pilotfish.operators.batchworkload.decide import Plan, Removal, decide
from pilotfish.operators.batchworkload.model import (
    Memo,
    Observed,
    owner_key,
    owner_uid,
    retained,
    task_of,
)
from pilotfish.operators.batchworkload.pacer import Pacer
from pilotfish.operators.batchworkload.pacing import BACKOFF_BASE_SECONDS
from pilotfish.operators.batchworkload.production import fresh_sighting
from pilotfish.operators.batchworkload.status import End
from pilotfish.timeutil import format_time

log = logging.getLogger("pilotfish.batchworkload")

REPORTING_CONTROLLER: Final = "pilotfish.io/batchworkload"
WORKERS: Final = 4
RETRY_MAX_SECONDS: Final = 60.0
SETTLE_RECHECK_SECONDS: Final = 1.0
SYNC_INTERVAL_SECONDS: Final = 0.5
BACKOFF_ENV: Final = "PILOTFISH_BATCH_BACKOFF_SECONDS"


def backoff_from_env(environ: dict[str, str] | None = None) -> float:
    """The failure backoff's base: `PILOTFISH_BATCH_BACKOFF_SECONDS`, else the default."""
    raw = (os.environ if environ is None else environ).get(BACKOFF_ENV)
    if raw is None or raw == "":
        return BACKOFF_BASE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{BACKOFF_ENV}={raw!r}: must be a number of seconds, 0 or more")
    return value


class BatchWorkloadController:
    def __init__(
        self,
        rt: Runtime,
        *,
        workers: int = WORKERS,
        backoff_base: float | None = None,
        sync_interval: float = SYNC_INTERVAL_SECONDS,
    ) -> None:
        """`backoff_base`: the first retry's wait of a failed index (doubling per failure;
        None: `backoff_from_env`); `sync_interval`: the least time between two syncs of
        one job."""
        self.rt = rt
        self.workers = workers
        self.backoff_base = backoff_from_env() if backoff_base is None else backoff_base
        self.sync_interval = sync_interval
        self.bws = rt.factory.informer(BATCHWORKLOADS)
        self.pods = rt.factory.informer(PODS, projection=projections.pod)
        self.namespaces = rt.factory.informer(NAMESPACES)
        self.queue: WorkQueue[str] = WorkQueue(
            CONTROLLER,
            clock=rt.clock,
            limiter=ControllerRateLimiter(rt.clock, cap=RETRY_MAX_SECONDS),
        )
        self.pacer = Pacer()
        workloads = OwnWrites(f"{CONTROLLER}-workloads", rt.clock, on_settled=self.queue.add)
        pods = OwnWrites(
            f"{CONTROLLER}-pods",
            rt.clock,
            on_settled=self.queue.add,
            on_visible=self.pacer.seen,
        )
        workloads.watch(self.bws)
        pods.watch(self.pods)
        self.writes = Trackers(workloads, pods)
        self.production = self.pacer.production
        self.executor = Executor(
            rt.batch_rest,
            self.writes,
            rt.events.scoped(REPORTING_CONTROLLER),
            clock=rt.clock,
            on_answered=self.pacer.answered,
        )
        self.pods_of: dict[str, set[str]] = {}
        self.failed_at: dict[str, float] = {}  # pod uid -> monotonic time first seen Failed
        # pod key -> monotonic time this process first saw the task unbound and ungated
        # (its created→bound time, for pacing)
        self.unbound_since: dict[str, float] = {}
        self.last_sync: dict[str, float] = {}
        self.sync_period: dict[str, float] = {}  # between the job's syncs, smoothed
        # Pods seen turning Succeeded since the job's last sync: enough of them may complete
        # the job, which is then synced at once instead of after the coalescing interval.
        self.succeeded_since_sync: dict[str, int] = {}
        self.unbound: dict[str, int] = {}
        self.memory: dict[str, dict[int, Memo]] = {}
        self.held: set[str] = set()  # jobs whose last sync held creates for production
        # Namespaces where a create was refused as being terminated (the informer may lag).
        self.doomed: set[str] = set()
        self.bws.add_handler(self._on_workload)
        self.pods.add_handler(self._on_pod)
        self.namespaces.add_handler(self._on_namespace)

    # Observe ------------------------------------------------------------------------------

    def _on_workload(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        key = object_key(obj)
        if kind == "DELETED":
            self.executor.next_batch.pop(key, None)
        self.queue.add(key)

    def _on_namespace(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        terminating = kind != "DELETED" and _terminating(obj)
        if not terminating:
            self.doomed.discard(name)  # gone, or a new namespace of that name
            return
        for key in list(self.bws.store):
            if key.startswith(f"{name}/"):
                self.queue.add(key)

    def _namespace_terminating(self, namespace: str) -> bool:
        ns = self.namespaces.get(namespace)
        return namespace in self.doomed or (ns is not None and _terminating(ns))

    def _on_pod(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        now = self.rt.clock.monotonic()
        seen = None if kind == "DELETED" else obj
        fresh = seen is not None and fresh_sighting(kind, obj, old)
        if self.production.observe(key, seen, now, fresh=fresh) and self.held:
            for job in self.held:  # the last waiting production pod is placed: go on, now
                self.last_sync.pop(job, None)
                self.queue.add(job)
            self.held.clear()
        before = owner_key(old) if old is not None else None
        after = None if kind == "DELETED" else owner_key(obj)
        if kind == "DELETED" and before is None:
            before = owner_key(obj)
        if before is not None and before != after:
            keys = self.pods_of.get(before)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.pods_of[before]
        if after is not None:
            self.pods_of.setdefault(after, set()).add(key)
            was_bound = bool(((old or {}).get("spec") or {}).get("nodeName"))
            spec = obj.get("spec") or {}
            if spec.get("schedulingGates"):  # held, not yet in front of the scheduler
                self.unbound_since.pop(key, None)
            elif not spec.get("nodeName"):
                self.unbound_since.setdefault(key, now)
            elif not was_bound:
                since = self.unbound_since.pop(key, None)
                self.pacer.bound(after, now, None if since is None else now - since)
            if _phase(obj) == "Succeeded" and _phase(old) != "Succeeded":
                self.succeeded_since_sync[after] = self.succeeded_since_sync.get(after, 0) + 1
        if kind == "DELETED":
            self.failed_at.pop(str((obj.get("metadata") or {}).get("uid")), None)
            self.unbound_since.pop(key, None)
        for owner in {before, after}:
            if owner is not None:
                self.queue.add(owner)

    def _pods(self, key: str) -> list[Obj]:
        found = (self.pods.get(k) for k in sorted(self.pods_of.get(key, ())))
        return [p for p in found if p is not None]

    def observe(self, key: str, bw: Obj, model: BatchWorkload) -> Observed:
        uid = str(bw["metadata"]["uid"])
        now = self.rt.clock.monotonic()
        tasks = []
        kept: list[tuple[str, str]] = []
        for pod in self._pods(key):
            if owner_uid(pod) != uid:
                continue
            if retained(pod):
                kept.append((str(pod["metadata"]["name"]), str(pod["metadata"]["uid"])))
                continue
            task = task_of(pod)
            if task is None:
                continue
            if task.phase == "Failed" or task.terminating:
                self.failed_at.setdefault(task.uid, now)
            tasks.append(task)
        return Observed(
            key=key,
            bw=bw,
            model=model,
            tasks=tuple(tasks),
            pace=self.pacer.pace(
                key,
                now,
                creation_rate=model.spec.creation_rate,
                sync_period=self.sync_period.get(key, 0.0),
            ),
            now=_now(self.rt),
            mono=now,
            failed_at=self.failed_at,
            memory=self.memory.get(key, {}),
            namespace_terminating=self._namespace_terminating(_namespace_of(bw)),
            retained=tuple(kept),
        )

    # Reconcile --------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        started = self.rt.clock.monotonic()
        try:
            return await self._reconcile(key)
        finally:
            metrics.BATCH_SYNC_SECONDS.observe(self.rt.clock.monotonic() - started)
            metrics.BATCH_UNBOUND_PODS.set(sum(self.unbound.values()))
            now = self.rt.clock.monotonic()
            metrics.BATCH_HELD_FOR_PRODUCTION.set(self.production.count(now) if self.held else 0)

    async def _reconcile(self, key: str) -> Result:
        bw = self.bws.get(key)
        if not self.writes.settled(key):
            return requeue_after(SETTLE_RECHECK_SECONDS, "own writes not yet observed")
        if bw is None or bw["metadata"].get("deletionTimestamp"):
            return await self._release(key, bw)
        now = self.rt.clock.monotonic()
        last = self.last_sync.get(key)
        if last is not None and now - last < self.sync_interval and not self._may_end(key, bw):
            return requeue_after(self.sync_interval - (now - last), "coalescing syncs")
        if last is not None:  # smoothed, and never below the coalescing interval
            seen = max(self.sync_interval, now - last)
            self.sync_period[key] = (self.sync_period.get(key, seen) + seen) / 2
        self.last_sync[key] = now
        self.succeeded_since_sync.pop(key, None)
        try:
            model = BatchWorkload.model_validate(bw)
        except ValidationError as e:
            self.executor.events.post(
                bw, "InvalidSpec", str(e)[:1000], action="Validate", type_="Warning"
            )
            return DONE
        plan = decide(self.observe(key, bw, model), backoff_base=self.backoff_base)
        orphans = self._orphans(key, str(bw["metadata"]["uid"]))
        if orphans:
            plan = dataclasses.replace(plan, removals=plan.removals + orphans)
        self._log(plan)
        if plan.held:
            self.held.add(key)
        else:
            self.held.discard(key)
        applied = await self.executor.apply(plan)
        result, created = applied.result, applied.created
        if applied.namespace_terminating:
            self.doomed.add(plan.bw["metadata"]["namespace"])
            self.last_sync.pop(key, None)  # let go of the pods at once
        if plan.memory:
            self.memory[key] = plan.memory
        else:
            self.memory.pop(key, None)
        self.pacer.created(key, created)
        self.unbound[key] = plan.unbound + created
        if plan.end.outcome != "running":
            self.unbound.pop(key, None)
        return result

    async def _release(self, key: str, bw: Obj | None) -> Result:
        """The job is gone or going: its pods' outcomes no longer matter, and the tracking
        finalizer would hold them against the garbage collector."""
        self.unbound.pop(key, None)
        self.pacer.forget(key)
        self.last_sync.pop(key, None)
        self.sync_period.pop(key, None)
        self.succeeded_since_sync.pop(key, None)
        self.memory.pop(key, None)
        self.held.discard(key)
        removals = self._orphans(key, None)
        if not removals:
            return DONE
        meta = (bw or {}).get("metadata") or {}
        namespace, name = key.split("/", 1)
        stub: Obj = {"metadata": {"namespace": meta.get("namespace", namespace), "name": name}}
        plan = _release_plan(key, stub, tuple(removals))
        return (await self.executor.apply(plan)).result

    def _may_end(self, key: str, bw: Obj) -> bool:
        completions = (bw.get("spec") or {}).get("completions")
        succeeded = (bw.get("status") or {}).get("succeeded") or 0
        if not isinstance(completions, int) or not isinstance(succeeded, int):
            return False
        return self.succeeded_since_sync.get(key, 0) >= completions - succeeded

    def _orphans(self, key: str, uid: str | None) -> tuple[Removal, ...]:
        """Tracked pods under the job's name that are not the job's (`uid`; None: the job
        is gone, so none is): the finalizer off, the garbage collector does the rest."""
        out = []
        for pod in self._pods(key):
            task = task_of(pod)
            if task is not None and task.tracked and owner_uid(pod) != uid:
                out.append(Removal(task.name, task.uid, task.finalizers, False, "orphaned"))
        return tuple(out)

    def _log(self, plan: Plan) -> None:
        if plan.creates or plan.removals:
            log.info("batch plan", extra={"workload": plan.key, **plan.summary})

    # Run --------------------------------------------------------------------------------

    async def run(self) -> None:
        """List everything first: a restarted controller sees every pod it created before
        it decides (the names would refuse a second pod anyway)."""
        await self.rt.factory.wait_synced()
        log.info("batchworkload controller synced", extra={"workloads": len(self.bws.store)})
        await self.queue.run(self.workers, self.reconcile)


def _phase(pod: Obj | None) -> str | None:
    phase = ((pod or {}).get("status") or {}).get("phase")
    return phase if isinstance(phase, str) else None


def _terminating(ns: Obj) -> bool:
    return bool((ns.get("metadata") or {}).get("deletionTimestamp")) or (
        (ns.get("status") or {}).get("phase") == "Terminating"
    )


def _namespace_of(bw: Obj) -> str:
    return str(bw["metadata"].get("namespace") or "")


def _now(rt: Runtime) -> str:
    return format_time(rt.clock.now())


def _release_plan(key: str, stub: Obj, removals: tuple[Removal, ...]) -> Plan:
    return Plan(
        key=key,
        bw=stub,
        status=None,
        removals=removals,
        creates=(),
        gang_size=0,
        wake_after=None,
        end=End("failed"),
        unbound=0,
    )
