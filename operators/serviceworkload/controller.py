"""The ServiceWorkload controller: replicas, rollouts, revisions, drains, PDB and status.

Observe: four informers from the shared informer layer, each narrowed on the server: the
ServiceWorkloads, and the pods, ControllerRevisions and PodDisruptionBudgets carrying the
`pilotfish.io/workload` label. Every change enqueues the owning workload's key.
Decide: pure functions of (workload, its pods and revisions, now): `rolling.plan` for pods,
`revisions.next_revision` and `revisions.to_prune` for history, `progress.assess` for the
deadline, `status.compute_status` for status, `pdb.pdb_patch` for the budget.
Act: conditional writes only (a `test` of the resourceVersion decided from, a uid
precondition on deletes, names chosen before creates), each remembered in a `WriteCache`
until the informer shows it; a refused write re-queues the key (backing off per workload
while refusals continue) and the next round decides again from a fresher view.

Why the shared informer and not kopf for the ServiceWorkloads themselves: the decision needs
one consistent view of a workload *and* its pods and revisions, fed by one de-duplicating
queue, with timed wake-ups (drains, minReadySeconds, the progress deadline) on that same
queue. kopf would be a second event loop with its own retries and would write its
change-tracking annotation onto every workload, bumping the resourceVersion our status
writes are conditional on. Pods are a hot path kopf must not carry (ARCHITECTURE section 3),
and a workload has few enough fields that kopf's handler layer buys nothing here.

Timed wake-ups are scheduled with `add_after(key, t - now)`, never polled: a pod becoming
available after minReadySeconds, a drained pod's propagation time or drain timeout, and the
progress deadline. A periodic resync of the workloads re-derives everything regardless.

Events go through `pilotfish.kube.events.EventRecorder` (events.k8s.io/v1, series and spam
filter), fire-and-forget: an Event never fails or slows a sync.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import aiohttp
from pydantic import ValidationError

from pilotfish import metrics
from pilotfish.api.serviceworkload import PROGRESSING, ServiceWorkload
from pilotfish.kube.events import EventRecorder, EventType
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.rest import JSON_PATCH, PODS, ApiError, Resource, Rest
from pilotfish.kube.workqueue import WorkQueue
from pilotfish.operators.serviceworkload import pdb as pdbs
from pilotfish.operators.serviceworkload import progress as prog
from pilotfish.operators.serviceworkload import revisions as revs
from pilotfish.operators.serviceworkload import rolling
from pilotfish.operators.serviceworkload.expectations import WriteCache
from pilotfish.operators.serviceworkload.status import (
    ReplicaFailure,
    compute_status,
    replica_failure,
    stable_revision,
    transition_time,
)
from pilotfish.operators.serviceworkload.sync import (
    drain_patch,
    format_time,
    is_ours,
    owner_key,
    parse_time,
    pod_state,
    random_suffix,
    slim_pod,
)
from pilotfish.podtemplate import pod_body, pod_name
from pilotfish.workloads import DRAIN_TIMEOUT_SECONDS, LABEL_WORKLOAD, PROPAGATION_SECONDS

log = logging.getLogger("pilotfish.serviceworkload")

CONTROLLER: Final = "serviceworkload"
REPORTING_CONTROLLER: Final = "pilotfish.io/serviceworkload"
SERVICEWORKLOADS: Final = Resource(
    "pilotfish.io", "v1alpha1", "serviceworkloads", subresources=("status", "scale")
)
RESYNC_SECONDS: Final = 300.0
# Added to every timed wake-up so that, when it fires, the moment it waited for has passed
# on the wall clock too (timestamps from the API have whole-second precision).
WAKE_SLACK_SECONDS: Final = 0.05
# Writes to the API in flight at once for one workload (deletes, drains, a create batch).
MAX_PARALLEL_WRITES: Final = 16
# A pod created this long ago and still not seen by the watch is looked up with a GET.
CREATE_CONFIRM_SECONDS: Final = 30.0
# Backoff after refused conditional writes, doubling per consecutive refused round.
REFUSAL_BACKOFF_SECONDS: Final = 0.05
MAX_REFUSAL_BACKOFF_SECONDS: Final = 30.0
# Spam-filter allowance of per-pod action Events for one workload (refilled one per second).
POD_EVENT_BURST: Final = 200
# A PDB name held by something else is not retried more often than this.
FOREIGN_PDB_RETRY_SECONDS: Final = 300.0

# Event reasons.
EVENT_CREATED: Final = "SuccessfulCreate"
EVENT_CREATE_FAILED: Final = "FailedCreate"
EVENT_DRAIN: Final = "DrainRequested"
EVENT_REVISION_CREATED: Final = "RevisionCreated"
EVENT_REVISION_REACTIVATED: Final = "RevisionReactivated"
EVENT_REVISION_COLLISION: Final = "RevisionHashCollision"
EVENT_INVALID_SPEC: Final = "InvalidSpec"
EVENT_PDB_NOT_OWNED: Final = "PodDisruptionBudgetNotOwned"
EVENT_ROLLOUT_COMPLETE: Final = prog.REASON_COMPLETE
EVENT_STALLED: Final = prog.REASON_DEADLINE_EXCEEDED

# What each delete reason means, for the Event's note.
DELETE_NOTES: Final = {
    rolling.DELETE_FAILED: "it failed (or was evicted) and is replaced",
    rolling.DELETE_DRAINED: f"out of rotation for {PROPAGATION_SECONDS:g}s",
    rolling.DELETE_DRAIN_TIMEOUT: f"no drain answer within {DRAIN_TIMEOUT_SECONDS:g}s",
    rolling.DELETE_NOT_SERVING: "no Service routes to it, nothing to drain",
}
# A create answered this way (the API server's own timeout) may still have happened: the pod
# stays expected. Other errors are definite refusals.
AMBIGUOUS_STATUS: Final = frozenset({504})


class CreateFailed(Exception):
    """Pods could not be created (admission, quota, a bad template): back off and retry."""


@dataclass
class _Round:
    """What one sync did, for the decisions after the pod actions."""

    conflicts: list[str] = field(default_factory=list)
    create_errors: list[str] = field(default_factory=list)

    def refused(self, what: str, e: ApiError) -> None:
        """A conditional write lost to a newer version: decide again from a fresher view."""
        self.conflicts.append(f"{what}: {e.status} {e.message}")

    @property
    def conflict(self) -> bool:
        return bool(self.conflicts)


def _owner_of(obj: Mapping[str, Any]) -> str | None:
    return owner_key(obj)


def _wall() -> float:
    return time.time()


class ServiceWorkloadController:
    def __init__(
        self,
        rest: Rest,
        workers: int = 4,
        *,
        clock: Callable[[], float] = _wall,
        rng: random.Random | None = None,
        recorder: EventRecorder | None = None,
        pod_recorder: EventRecorder | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rest = rest
        self.workers = workers
        self.clock = clock
        self.rng = rng or random.Random()
        instance = f"{socket.gethostname()}-{os.getpid()}"
        # Two recorders, so that a rollout of many pods (an Event per pod action, regarding
        # the workload) cannot use up the spam-filter allowance that the few Events people
        # wait for (stalled, complete, refused creates) need.
        self.recorder = recorder or EventRecorder(rest, REPORTING_CONTROLLER, instance)
        self.pod_recorder = pod_recorder or EventRecorder(
            rest, REPORTING_CONTROLLER, instance, burst=POD_EVENT_BURST, refill_seconds=1.0
        )
        self.sws = Informer(rest, SERVICEWORKLOADS, resync_seconds=RESYNC_SECONDS)
        self.pods = Informer(rest, PODS, label_selector=LABEL_WORKLOAD, transform=slim_pod)
        self.revisions = Informer(rest, revs.CONTROLLER_REVISIONS, label_selector=LABEL_WORKLOAD)
        self.pdbs = Informer(rest, pdbs.PDBS, label_selector=LABEL_WORKLOAD)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER)
        self.sw_writes = WriteCache(monotonic)
        self.pod_writes = WriteCache(monotonic)
        self.rev_writes = WriteCache(monotonic)
        self.pdb_writes = WriteCache(monotonic)
        self.pods_of: dict[str, set[str]] = {}
        self.revisions_of: dict[str, set[str]] = {}
        self.states: dict[str, str] = {}
        self.foreign_pdbs: dict[str, float] = {}
        self.refusals: dict[str, int] = {}
        # The last refused pod create per workload, for its ReplicaFailure condition: reset
        # by a create that succeeds, ignored once the generation moves on, and re-learnt by
        # the next refused create after a restart.
        self.create_failures: dict[str, ReplicaFailure] = {}
        self._events: set[asyncio.Task[Any]] = set()
        self.sws.add_handler(self._on_workload)
        self.pods.add_handler(self._indexer(self.pods_of, self.pod_writes))
        self.revisions.add_handler(self._indexer(self.revisions_of, self.rev_writes))
        self.pdbs.add_handler(self._on_pdb)

    def configure(self, options: object) -> None:
        """The operator process's identity names this instance in Events (runner.Options)."""
        identity = getattr(options, "identity", None)
        if isinstance(identity, str) and identity:
            self.recorder.instance = identity[:128]
            self.pod_recorder.instance = identity[:128]

    # Observe -----------------------------------------------------------------------------

    def _on_workload(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        if kind == "DELETED":
            self.sw_writes.forget(key)
            self.pod_writes.forget_owner(key)
            self.rev_writes.forget_owner(key)
            self.refusals.pop(key, None)
            self.create_failures.pop(key, None)
            self._set_state(key, None)
        self.queue.add(key)

    def _indexer(
        self, index: dict[str, set[str]], writes: WriteCache
    ) -> Callable[[str, Obj, Obj | None], None]:
        def handle(kind: str, obj: Obj, _old: Obj | None) -> None:
            meta = obj["metadata"]
            key = f"{meta.get('namespace')}/{meta['name']}"
            owner = _owner_of(obj)
            if owner is None:
                return
            if kind == "DELETED":
                writes.forget(key)
                keys = index.get(owner)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[owner]
            else:
                index.setdefault(owner, set()).add(key)
            self.queue.add(owner)

        return handle

    def _on_pdb(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        meta = obj["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        if kind == "DELETED":
            self.pdb_writes.forget(key)
        owner = _owner_of(obj)
        if owner is not None:
            self.queue.add(owner)

    def _objects(
        self, key: str, index: dict[str, set[str]], informer: Informer, writes: WriteCache
    ) -> list[Obj]:
        """The workload's objects: the informer's, overlaid with our own unseen writes."""
        keys = sorted(set(index.get(key, ())) | set(writes.keys(key)))
        out = []
        for k in keys:
            obj = writes.view(k, informer.get(k))
            if obj is not None:
                out.append(obj)
        return out

    def pods_for(self, key: str, uid: str) -> list[Obj]:
        objs = self._objects(key, self.pods_of, self.pods, self.pod_writes)
        return [o for o in objs if is_ours(o, uid)]

    def revisions_for(self, key: str, uid: str) -> list[revs.RevisionInfo]:
        objs = self._objects(key, self.revisions_of, self.revisions, self.rev_writes)
        return revs.owned_revisions(objs, uid)

    # Decide + act ------------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        started = time.monotonic()
        try:
            await self._sync(key)
        finally:
            metrics.ROLLOUT_SYNC_SECONDS.observe(time.monotonic() - started)
            metrics.ROLLOUT_QUEUE_DEPTH.set(len(self.queue))
            metrics.ROLLOUT_EXPECTED_WRITES.set(
                len(self.pod_writes) + len(self.rev_writes) + len(self.sw_writes)
            )

    async def _sync(self, key: str) -> None:
        sw = self.sw_writes.view(key, self.sws.get(key))
        if sw is None:
            self.pod_writes.forget_owner(key)
            self.rev_writes.forget_owner(key)
            self.create_failures.pop(key, None)
            self._set_state(key, None)
            return
        meta = sw["metadata"]
        if meta.get("deletionTimestamp"):
            return  # the garbage collector removes pods, revisions and the PDB with it
        try:
            model = ServiceWorkload.model_validate(sw)
        except ValidationError as e:
            self._event(sw, EVENT_INVALID_SPEC, f"cannot act on this spec: {e}", "Sync", "Warning")
            return
        uid = str(meta["uid"])
        spec = model.spec
        strategy = spec.strategy
        template: Mapping[str, Any] = (sw.get("spec") or {}).get("template") or {}
        now = self.clock()
        now_str = format_time(now)
        budget = rolling.resolve_budget(
            spec.replicas, strategy.max_surge, strategy.max_unavailable, strategy.min_ready_seconds
        )
        rnd = _Round()

        # Revisions: record the current template before any pod of it exists.
        history = self.revisions_for(key, uid)
        try:
            step = revs.next_revision(history, template)
        except revs.RevisionCollision as e:
            self._event(sw, EVENT_REVISION_COLLISION, str(e), "RecordRevision", "Warning")
            return
        if step is not None:
            await self._record_revision(key, sw, template, step, now_str, rnd)
            history = self.revisions_for(key, uid)
        update_hash = revs.template_hash(template)

        await self._ensure_pdb(key, sw, budget, uid, now, rnd)

        # Pods.
        await self._confirm_creates(key)
        previous = sw.get("status") or {}
        states = [pod_state(o, now) for o in self.pods_for(key, uid)]
        stable = stable_revision(states, previous.get("currentRevision"), update_hash, False)
        desired = rolling.Desired(
            budget=budget,
            update_revision=update_hash,
            stable_revision=stable,
            paused=strategy.paused,
            drain=spec.service is not None,
        )
        plan = rolling.plan(states, desired, now)
        if plan.actions:
            log.info(
                "rollout plan",
                extra={
                    "workload": key,
                    "creates": plan.creates,
                    "drains": len(plan.drains),
                    "deletes": len(plan.deletes),
                    "update": update_hash,
                },
            )
        templates = {r.hash: r.template for r in history}
        templates[update_hash] = template
        await self._act(key, sw, plan, templates, now_str, rnd)

        # Status, from what exists after acting (our writes included).
        objs = self.pods_for(key, uid)
        states = [pod_state(o, now) for o in objs]
        observed = [
            pod_state(o, now) for o in objs if (o.get("metadata") or {}).get("resourceVersion")
        ]
        complete = prog.is_complete(states, desired, now)
        current = stable_revision(states, previous.get("currentRevision"), update_hash, complete)
        update_rev = next((r for r in history if r.hash == update_hash), None)
        conditions = previous.get("conditions") or []
        last = prog.last_progress_at(
            states,
            desired,
            now,
            activated_at=parse_time(update_rev.activated_at) if update_rev else now,
            progressing_since=parse_time(transition_time(conditions, PROGRESSING, "True")),
        )
        verdict = prog.assess(
            complete=complete,
            paused=strategy.paused,
            last_progress=last,
            deadline_seconds=strategy.progress_deadline_seconds,
            now=now,
        )
        status = compute_status(
            name=meta["name"],
            generation=meta.get("generation"),
            pods=observed,
            desired=desired,
            progress=verdict,
            current_revision=current,
            previous=previous,
            deadline_seconds=strategy.progress_deadline_seconds,
            now=now,
            now_str=now_str,
            failure=self._create_failure(key, meta.get("generation")),
        )
        if status != previous:
            await self._write_status(key, sw, status, rnd)
        self._announce(sw, previous, verdict, status)
        self._set_state(key, verdict.state)

        # History beyond the limit.
        in_use = {p.revision for p in states} | {current, update_hash}
        for old in revs.to_prune(history, strategy.revision_history_limit, update_hash, in_use):
            await self._delete_revision(key, old, rnd)

        wakes = [t for t in (plan.wake_at, verdict.deadline_at) if t is not None]
        if wakes:
            self.queue.add_after(key, max(0.0, min(wakes) - now) + WAKE_SLACK_SECONDS)
        if rnd.conflict:
            # Backed off per workload across rounds: the queue forgets a key's failures on
            # every normal return, and a refusal that is not a race (a 422 the object keeps
            # earning) must not turn into a hot loop.
            streak = self.refusals.get(key, 0)
            self.refusals[key] = streak + 1
            delay = min(MAX_REFUSAL_BACKOFF_SECONDS, REFUSAL_BACKOFF_SECONDS * 2**streak)
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc(len(rnd.conflicts))
            log.info(
                "conditional writes refused; deciding again",
                extra={"workload": key, "refused": rnd.conflicts[:5], "retry_in": delay},
            )
            self.queue.add_after(key, delay)
        else:
            self.refusals.pop(key, None)
        if rnd.create_errors:
            raise CreateFailed(f"{key}: {rnd.create_errors[0]}")

    def _create_failure(self, key: str, generation: int | None) -> ReplicaFailure | None:
        failure = self.create_failures.get(key)
        if failure is not None and failure.generation != generation:
            del self.create_failures[key]  # refused for a spec that is no longer asked for
            return None
        return failure

    async def _confirm_creates(self, key: str) -> None:
        for pod_key in self.pod_writes.unseen_creates(key, CREATE_CONFIRM_SECONDS):
            if self.pods.get(pod_key) is not None:
                continue
            ns, name = pod_key.split("/", 1)
            try:
                found = await self.rest.get(PODS.path(ns, name))
            except ApiError as e:
                if not e.not_found:
                    raise
                log.info("expected pod never seen and not there", extra={"pod": pod_key})
                self.pod_writes.forget(pod_key)
                continue
            self.pod_writes.wrote(pod_key, key, None, slim_pod(found))

    async def _record_revision(
        self,
        key: str,
        sw: Obj,
        template: Mapping[str, Any],
        step: revs.CreateRevision | revs.ActivateRevision,
        now: str,
        rnd: _Round,
    ) -> None:
        ns = sw["metadata"]["namespace"]
        if isinstance(step, revs.ActivateRevision):
            # Renumbered by delete + create (see revisions' docstring for why not a patch).
            rev = step.revision
            rev_key = f"{ns}/{rev.name}"
            before = self.rev_writes.view(rev_key, self.revisions.get(rev_key))
            body = {"preconditions": {"resourceVersion": rev.resource_version}}
            try:
                await self.rest.delete(revs.CONTROLLER_REVISIONS.path(ns, rev.name), body)
            except ApiError as e:
                if e.conflict:
                    rnd.refused(f"renumber ControllerRevision {rev.name}", e)
                    return
                if not e.not_found:
                    raise
            self.rev_writes.wrote(rev_key, key, before, None)
            hash_, number = rev.hash, step.number
        else:
            hash_, number = step.hash, step.number
        body = revs.revision_body(sw, hash_, number, template, now)
        name = body["metadata"]["name"]
        try:
            created = await self.rest.create(revs.CONTROLLER_REVISIONS.path(ns), body)
        except ApiError as e:
            if e.status != 409:
                raise
            # Recorded already (by us before a restart, or the watch is behind).
            created = await self.rest.get(revs.CONTROLLER_REVISIONS.path(ns, name))
            same = revs.canonical_json(created.get("data")) == revs.canonical_json(template)
            if not revs.controlled_by(created, sw["metadata"]["uid"]) or not same:
                raise revs.RevisionCollision(
                    f"ControllerRevision {name} exists and is not this template's"
                ) from e
        self.rev_writes.wrote(f"{ns}/{name}", key, None, created)
        if isinstance(step, revs.ActivateRevision):
            note = f"template is revision {hash_} again; it is now revision {number}"
            self._event(sw, EVENT_REVISION_REACTIVATED, note, "RecordRevision")
        else:
            note = f"revision {number} ({hash_}) recorded as ControllerRevision {name}"
            self._event(sw, EVENT_REVISION_CREATED, note, "RecordRevision")

    async def _delete_revision(self, key: str, rev: revs.RevisionInfo, rnd: _Round) -> None:
        ns = key.split("/", 1)[0]
        body = {"preconditions": {"resourceVersion": rev.resource_version}}
        try:
            await self.rest.delete(revs.CONTROLLER_REVISIONS.path(ns, rev.name), body)
        except ApiError as e:
            if e.not_found:
                return
            if e.conflict:
                rnd.refused(f"delete ControllerRevision {rev.name}", e)
                return
            raise
        before = self.revisions.get(f"{ns}/{rev.name}")
        self.rev_writes.wrote(f"{ns}/{rev.name}", key, before, None)

    async def _ensure_pdb(
        self, key: str, sw: Obj, budget: rolling.Budget, uid: str, now: float, rnd: _Round
    ) -> None:
        ns = sw["metadata"]["namespace"]
        existing = self.pdb_writes.view(key, self.pdbs.get(key))
        if existing is None:
            if self.foreign_pdbs.get(key, 0.0) > now:
                return
            try:
                created = await self.rest.create(pdbs.PDBS.path(ns), pdbs.pdb_body(sw, budget))
            except ApiError as e:
                if e.status != 409:
                    raise
                self.foreign_pdbs[key] = now + FOREIGN_PDB_RETRY_SECONDS
                self._pdb_not_owned(sw)
                return
            self.pdb_writes.wrote(key, key, None, created)
            return
        if not pdbs.is_ours(existing, uid):
            self._pdb_not_owned(sw)
            return
        ops = pdbs.pdb_patch(existing, pdbs.desired_spec(sw["metadata"]["name"], budget))
        if ops is None:
            return
        try:
            patched = await self.rest.patch(
                pdbs.PDBS.path(ns, sw["metadata"]["name"]), ops, JSON_PATCH
            )
        except ApiError as e:
            if e.status in (404, 409, 422):
                rnd.refused("patch PodDisruptionBudget", e)
                return
            raise
        self.pdb_writes.wrote(key, key, existing, patched)

    def _pdb_not_owned(self, sw: Obj) -> None:
        self._event(
            sw,
            EVENT_PDB_NOT_OWNED,
            f"PodDisruptionBudget {sw['metadata']['name']} exists and is not this workload's; "
            "it is left alone, and node drains follow it instead of the workload's strategy",
            "EnsureDisruptionBudget",
            "Warning",
        )

    async def _act(
        self,
        key: str,
        sw: Obj,
        plan: rolling.Plan,
        templates: Mapping[str, Mapping[str, Any]],
        now: str,
        rnd: _Round,
    ) -> None:
        ns = sw["metadata"]["namespace"]
        current = {o["metadata"]["name"]: o for o in self.pods_for(key, str(sw["metadata"]["uid"]))}
        takedowns: list[Callable[[], Awaitable[None]]] = []
        for action in plan.actions:
            pod = current.get(action.pod) if not isinstance(action, rolling.Create) else None
            if pod is None:
                continue
            if isinstance(action, rolling.Delete):
                takedowns.append(partial(self._delete_pod, key, sw, pod, action.reason, now, rnd))
            else:
                takedowns.append(partial(self._drain_pod, key, sw, pod, now, rnd))
        await _bounded(takedowns)
        for action in plan.actions:
            if isinstance(action, rolling.Create):
                tpl = templates.get(action.revision)
                if tpl is None:
                    rnd.create_errors.append(f"revision {action.revision} has no recorded template")
                    continue
                await self._create_pods(key, sw, ns, tpl, action.revision, action.count, now, rnd)

    async def _create_pods(
        self,
        key: str,
        sw: Obj,
        ns: str,
        template: Mapping[str, Any],
        revision: str,
        count: int,
        now: str,
        rnd: _Round,
    ) -> None:
        """Slow start, as ReplicaSets do: batches of 1, 2, 4, ... stopping at the first
        failure, so a template the API refuses costs one refused call, not `count`."""
        remaining, batch = count, 1
        while remaining > 0:
            size = min(batch, remaining, MAX_PARALLEL_WRITES)
            results = await asyncio.gather(
                *(self._create_pod(key, sw, ns, template, revision, now, rnd) for _ in range(size))
            )
            remaining -= size
            if not all(results):
                return
            batch *= 2

    async def _create_pod(
        self,
        key: str,
        sw: Obj,
        ns: str,
        template: Mapping[str, Any],
        revision: str,
        now: str,
        rnd: _Round,
    ) -> bool:
        name = pod_name(sw["metadata"]["name"], revision, random_suffix(self.rng))
        body = pod_body(sw, template, revision, name)
        pod_key = f"{ns}/{name}"
        phantom = slim_pod({**body, "metadata": {**body["metadata"], "creationTimestamp": now}})
        self.pod_writes.expect_create(pod_key, key, phantom)
        try:
            created = await self.rest.create(PODS.path(ns), body)
        except ApiError as e:
            if e.status in AMBIGUOUS_STATUS:
                log.warning("pod create outcome unknown", extra={"pod": pod_key, "error": str(e)})
                return False
            self.pod_writes.forget(pod_key)
            if _namespace_terminating(e):
                return False  # the workload goes with its namespace: nothing to report
            metrics.ROLLOUT_POD_ACTIONS.labels("create", "failed").inc()
            rnd.create_errors.append(f"{e.status} {e.reason}: {e.message}")
            generation = sw["metadata"].get("generation")
            self.create_failures[key] = replica_failure(generation, e.message)
            self._event(
                sw, EVENT_CREATE_FAILED, f"creating pod {name}: {e.message}", "CreatePod", "Warning"
            )
            return False
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            # The pod may exist: it stays expected until the watch shows it or it expires.
            log.warning("pod create outcome unknown", extra={"pod": pod_key, "error": str(e)})
            rnd.create_errors.append(f"create of {name} did not answer: {e}")
            return False
        self.pod_writes.created(pod_key, slim_pod(created))
        self.create_failures.pop(key, None)
        metrics.ROLLOUT_POD_ACTIONS.labels("create", "ok").inc()
        self._event(
            sw,
            EVENT_CREATED,
            f"created pod {name} (revision {revision})",
            "CreatePod",
            per_pod=True,
        )
        return True

    async def _drain_pod(self, key: str, sw: Obj, pod: Obj, now: str, rnd: _Round) -> None:
        meta = pod["metadata"]
        pod_key = f"{meta['namespace']}/{meta['name']}"
        try:
            patched = await self.rest.patch(
                PODS.path(meta["namespace"], meta["name"]), drain_patch(pod, now), JSON_PATCH
            )
        except ApiError as e:
            if e.not_found:
                self.pod_writes.wrote(pod_key, key, pod, None)
                return
            if e.status in (409, 422):
                rnd.refused(f"drain pod {meta['name']}", e)
                return
            metrics.ROLLOUT_POD_ACTIONS.labels("drain", "failed").inc()
            raise
        self.pod_writes.wrote(pod_key, key, pod, slim_pod(patched))
        metrics.ROLLOUT_POD_ACTIONS.labels("drain", "ok").inc()
        self._event(
            sw, EVENT_DRAIN, f"pod {meta['name']} asked to leave rotation", "DrainPod", per_pod=True
        )

    async def _delete_pod(
        self, key: str, sw: Obj, pod: Obj, reason: str, now: str, rnd: _Round
    ) -> None:
        meta = pod["metadata"]
        pod_key = f"{meta['namespace']}/{meta['name']}"
        body = {"preconditions": {"uid": meta["uid"]}} if meta.get("uid") else None
        try:
            resp = await self.rest.delete(PODS.path(meta["namespace"], meta["name"]), body)
        except ApiError as e:
            if e.not_found:
                self.pod_writes.wrote(pod_key, key, pod, None)
                return
            if e.conflict:  # another pod by that name: not ours to delete
                rnd.refused(f"delete pod {meta['name']}", e)
                return
            metrics.ROLLOUT_POD_ACTIONS.labels("delete", "failed").inc()
            raise
        # Counted as terminating until the watch shows it gone, whatever the answer says.
        after = slim_pod(resp if resp.get("kind") == "Pod" else pod)
        if not after["metadata"].get("deletionTimestamp"):
            after["metadata"]["deletionTimestamp"] = now
        self.pod_writes.wrote(pod_key, key, pod, after)
        metrics.ROLLOUT_POD_ACTIONS.labels("delete", "ok").inc()
        why = DELETE_NOTES.get(reason, reason)
        self._event(sw, reason, f"deleted pod {meta['name']}: {why}", "DeletePod", per_pod=True)

    async def _write_status(self, key: str, sw: Obj, status: Obj, rnd: _Round) -> None:
        meta = sw["metadata"]
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {"op": "add", "path": "/status", "value": status},
        ]
        try:
            written = await self.rest.patch(
                SERVICEWORKLOADS.path(meta["namespace"], meta["name"], "status"), ops, JSON_PATCH
            )
        except ApiError as e:
            if e.status in (404, 409, 422):
                rnd.refused("status", e)
                return
            raise
        self.sw_writes.wrote(key, key, sw, written)

    # Events and metrics --------------------------------------------------------------------

    def _announce(
        self, sw: Obj, previous: Mapping[str, Any], verdict: prog.Progress, status: Obj
    ) -> None:
        """An Event when a rollout completes or stalls (the transitions people wait for)."""

        def reason(s: Mapping[str, Any]) -> str | None:
            for c in s.get("conditions") or []:
                if c.get("type") == PROGRESSING:
                    return str(c.get("reason"))
            return None

        before, after = reason(previous), reason(status)
        if before == after:
            return
        message = next(
            (c.get("message", "") for c in status["conditions"] if c.get("type") == PROGRESSING),
            "",
        )
        if verdict.state == "stalled":
            self._event(sw, EVENT_STALLED, message, "Rollout", "Warning")
        elif verdict.state == "complete":
            self._event(sw, EVENT_ROLLOUT_COMPLETE, message, "Rollout")

    def _event(
        self,
        obj: Obj,
        reason: str,
        note: str,
        action: str,
        type_: EventType = "Normal",
        *,
        per_pod: bool = False,
    ) -> None:
        regarding = {
            "apiVersion": obj.get("apiVersion", SERVICEWORKLOADS.group + "/v1alpha1"),
            "kind": obj.get("kind", "ServiceWorkload"),
            "metadata": obj.get("metadata") or {},
        }
        recorder = self.pod_recorder if per_pod else self.recorder
        task = asyncio.get_running_loop().create_task(
            recorder.emit(regarding, reason, note, action=action, type_=type_)
        )
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    def _set_state(self, key: str, state: str | None) -> None:
        old = self.states.pop(key, None)
        if state is not None:
            self.states[key] = state
        if old != state:
            counts = Counter(self.states.values())
            for s in ("complete", "progressing", "paused", "stalled"):
                metrics.ROLLOUT_WORKLOADS.labels(s).set(counts.get(s, 0))

    # Run ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """List everything first, then decide: a restarted controller sees every pod the
        previous one created before it creates any (no double create beyond the surge)."""
        informers = (self.sws, self.pods, self.revisions, self.pdbs)
        tasks: list[asyncio.Future[Any]] = [asyncio.create_task(i.run()) for i in informers]
        try:
            synced: asyncio.Future[Any] = asyncio.ensure_future(
                asyncio.gather(*(i.synced.wait() for i in informers))
            )
            done, _ = await asyncio.wait({synced, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            if synced not in done:
                synced.cancel()
                for t in done:
                    t.result()
                raise RuntimeError("an informer stopped before it synced")
            log.info("serviceworkload controller synced", extra={"workloads": len(self.sws.store)})
            await asyncio.gather(self.queue.run(self.workers, self.sync), *tasks)
        finally:
            for t in tasks:
                t.cancel()


def _namespace_terminating(e: ApiError) -> bool:
    causes = (e.body.get("details") or {}).get("causes") or []
    return e.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes)


async def _bounded(calls: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run the calls at most MAX_PARALLEL_WRITES at a time; the first error propagates
    after the others finished (no write is abandoned half-way)."""
    sem = asyncio.Semaphore(MAX_PARALLEL_WRITES)

    async def one(call: Callable[[], Awaitable[None]]) -> None:
        async with sem:
            await call()

    results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
