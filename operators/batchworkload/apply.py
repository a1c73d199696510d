"""The one executor of a BatchWorkload plan, in the order that keeps outcomes safe.

1. the status, conditional on the resourceVersion it was decided from (a JSON-patch
   `test`): it records every outcome the removals below rely on, so nothing else happens
   in a sync whose status write was refused;
2. removals: the tracking finalizer off (a patch testing the uid and the finalizers seen);
   a pod to be deleted gets `LABEL_TASK_RECORDED` in the same patch (an untracked one is
   deleted with a uid precondition);
3. creates under deterministic names (`NAME-<index>-<attempt>`): the gang as one batch,
   then slow start (1, 2, 4, ...) stopping at the first refusal; a 409 AlreadyExists is
   the pod existing, never a reason for a second one. A replacement's predecessor is
   removed once the replacement exists. A create refused because the namespace is being
   deleted stops the creates and is reported to the controller (`Applied`);
4. one deletecollection of the job's labelled pods, when the plan says it is due (live
   pods to stop, the job's end, or `decide.RETAIN_RECORDED_PODS` recorded pods kept). Only
   a pod whose outcome is in the written status is ever labelled, so no unrecorded result
   is deleted (kwok strips the finalizers of deleted pods: an unrecorded pod deleted is a
   lost result).

Every write is made with the batch account's client and recorded in `OwnWrites`, so the
next sync waits for the informers to show it. Per task: one create, one finalizer patch;
the deletecollection and the status writes are shared by every task of a sync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from pilotfish import metrics
from pilotfish.kube.events import ControllerEvents
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import BATCHWORKLOADS, JSON_PATCH, PODS, ApiError, Rest
from pilotfish.kube.workqueue import DONE, Result, requeue_after, round_refused
from pilotfish.operators.batchworkload.decide import Create, Plan, Removal
from pilotfish.operators.batchworkload.model import LABEL_TASK_RECORDED, Event
from pilotfish.operators.batchworkload.pacing import slow_start
from pilotfish.operators.batchworkload.taskpod import task_pod
from pilotfish.timeutil import Clock
from pilotfish.workloads import FINALIZER_TASK, LABEL_BATCH

log = logging.getLogger("pilotfish.batchworkload")

CONTROLLER: Final = "batchworkload"
MAX_PARALLEL_WRITES: Final = 32
REFUSED: Final = frozenset({404, 409, 422})
AMBIGUOUS_STATUS: Final = frozenset({504})
EVENT_CREATE_FAILED: Final = "FailedCreate"
# Added to timed wake-ups so the moment waited for has passed when they fire.
WAKE_SLACK_SECONDS: Final = 0.05
TERMINAL_PHASES: Final = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown"
LIVE_PHASES: Final = "status.phase!=Succeeded,status.phase!=Failed"
# The NamespaceLifecycle admission plugin's refusal of a create in a namespace being deleted.
NAMESPACE_TERMINATING: Final = "NamespaceTerminating"
_LABEL_PATH: Final = "/metadata/labels/" + LABEL_TASK_RECORDED.replace("~", "~0").replace("/", "~1")


@dataclass
class Trackers:
    workloads: OwnWrites
    pods: OwnWrites

    def settled(self, owner: str) -> bool:
        return self.workloads.settled(owner) and self.pods.settled(owner)

    def pending(self) -> int:
        return self.workloads.pending() + self.pods.pending()


@dataclass
class _Round:
    refusals: list[str] = field(default_factory=list)
    create_errors: list[str] = field(default_factory=list)
    created: int = 0
    labelled: list[Removal] = field(default_factory=list)  # for the deletecollection
    namespace_terminating: bool = False

    def refused(self, what: str, e: ApiError) -> None:
        self.refusals.append(f"{what}: {e.status} {e.reason}: {e.message}")


async def bounded(calls: Sequence[Callable[[], Awaitable[bool]]]) -> list[bool]:
    sem = asyncio.Semaphore(MAX_PARALLEL_WRITES)

    async def one(call: Callable[[], Awaitable[bool]]) -> bool:
        async with sem:
            return await call()

    results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
    for res in results:
        if isinstance(res, BaseException):
            raise res
    return [bool(res) for res in results]


class Executor:
    def __init__(
        self,
        rest: Rest,
        writes: Trackers,
        events: ControllerEvents,
        *,
        clock: Clock,
        on_answered: Callable[[float, float], None],
    ) -> None:
        """`on_answered(now, seconds)`: a create came back after `seconds` (the pacing's
        write delay, `apidelay`)."""
        self.rest = rest
        self.writes = writes
        self.events = events
        self.clock = clock
        self.on_answered = on_answered
        # Per job, the slow-start batch size its next sync starts at: doubled while every
        # create succeeds, back to 1 at the first refusal.
        self.next_batch: dict[str, int] = {}

    async def apply(self, plan: Plan) -> Applied:
        rnd = _Round()
        if plan.status is not None and not await self._write_status(plan, rnd):
            return Applied(self._result(plan, rnd), 0, False)
        await bounded([_bind(self._remove, plan, r, rnd) for r in plan.removals])
        if plan.creates:
            await self._create_all(plan, rnd)
        if plan.collect or (rnd.labelled and plan.collect_labelled):
            await self._collect(plan, rnd)
        if rnd.namespace_terminating:
            return Applied(requeue_after(0.0, "namespace being deleted"), rnd.created, True)
        return Applied(self._result(plan, rnd), rnd.created, False)

    def _result(self, plan: Plan, rnd: _Round) -> Result:
        refused = round_refused(CONTROLLER, plan.key, rnd.refusals, rnd.create_errors)
        if refused is not None:
            return refused
        if plan.wake_after is not None:
            return requeue_after(plan.wake_after + WAKE_SLACK_SECONDS, "timed wake-up")
        return DONE

    def _post(self, regarding: Mapping[str, Any], event: Event) -> None:
        self.events.post(
            regarding, event.reason, event.note, action=event.action, type_=event.type_
        )

    async def _write_status(self, plan: Plan, rnd: _Round) -> bool:
        assert plan.status is not None
        meta = plan.bw["metadata"]
        rv = plan.status.resource_version
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/status", "value": plan.status.status},
        ]
        path = BATCHWORKLOADS.path(meta["namespace"], meta["name"], "status")
        try:
            written = await self.rest.patch(path, ops, JSON_PATCH)
        except ApiError as e:
            if e.status in REFUSED:
                rnd.refused("status", e)
                return False
            raise
        self.writes.workloads.wrote(plan.key, written, owner=plan.key)
        for event in plan.status.events:
            self._post(written, event)
        return True

    async def _remove(self, plan: Plan, r: Removal, rnd: _Round) -> bool:
        ns = plan.bw["metadata"]["namespace"]
        key, path = f"{ns}/{r.name}", PODS.path(ns, r.name)
        out: Mapping[str, Any] | None = None
        try:
            if FINALIZER_TASK in r.finalizers:
                kept = [f for f in r.finalizers if f != FINALIZER_TASK]
                ops = [
                    {"op": "test", "path": "/metadata/uid", "value": r.uid},
                    {"op": "test", "path": "/metadata/finalizers", "value": list(r.finalizers)},
                    {"op": "replace", "path": "/metadata/finalizers", "value": kept},
                ]
                if r.delete:
                    ops.append({"op": "add", "path": _LABEL_PATH, "value": "true"})
                out = await self.rest.patch(path, ops, JSON_PATCH)
                metrics.BATCH_POD_WRITES.labels("unfinalize").inc()
                if r.delete and not out.get("metadata", {}).get("deletionTimestamp"):
                    rnd.labelled.append(r)
            elif r.delete:
                out = await self.rest.delete(path, {"preconditions": {"uid": r.uid}})
                metrics.BATCH_POD_WRITES.labels("delete").inc()
        except ApiError as e:
            if e.not_found:
                self.writes.pods.deleted(key, owner=plan.key)
                return True
            if e.status in REFUSED:
                rnd.refused(f"remove pod {r.name}", e)
                return False
            raise
        if out is not None and out.get("kind") == "Pod":
            self.writes.pods.wrote(key, dict(out), owner=plan.key)
        elif out is not None:
            self.writes.pods.deleted(key, owner=plan.key)
        return True

    async def _create_all(self, plan: Plan, rnd: _Round) -> None:
        gang, rest = plan.creates[: plan.gang_size], plan.creates[plan.gang_size :]
        if gang and not all(await bounded([_bind(self._create, plan, c, rnd) for c in gang])):
            return
        start = 0
        cap = MAX_PARALLEL_WRITES * 4
        for size in slow_start(len(rest), cap, self.next_batch.get(plan.key, 1)):
            batch = rest[start : start + size]
            start += size
            if not all(await bounded([_bind(self._create, plan, c, rnd) for c in batch])):
                self.next_batch.pop(plan.key, None)
                return
            self.next_batch[plan.key] = min(cap, size * 2)

    async def _create(self, plan: Plan, c: Create, rnd: _Round) -> bool:
        bw = plan.bw
        ns = bw["metadata"]["namespace"]
        body = task_pod(bw, c.index, c.attempt, c.failures, gang=c.gang)
        name = body["metadata"]["name"]
        key = f"{ns}/{name}"
        sent = self.clock.monotonic()
        try:
            created = await self.rest.create(PODS.path(ns), body)
        except ApiError as e:
            if e.conflict:  # exists already: wait for it in the informer, never a second pod
                return await self._confirm(plan, key, rnd, c, None)
            if e.status in AMBIGUOUS_STATUS:
                await self._confirm(plan, key, rnd, c, str(e))
                return False
            metrics.BATCH_PODS_CREATED.labels("refused").inc()
            if _namespace_terminating(e):
                rnd.namespace_terminating = True
                return False
            rnd.create_errors.append(f"{e.status} {e.reason}: {e.message}")
            note = f"creating pod {name}: {e.message}"
            self._post(bw, Event(EVENT_CREATE_FAILED, note, "CreatePod", "Warning"))
            return False
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            await self._confirm(plan, key, rnd, c, str(e))
            return False
        now = self.clock.monotonic()
        self.on_answered(now, now - sent)
        self.writes.pods.wrote(key, created, owner=plan.key)
        metrics.BATCH_PODS_CREATED.labels("ok").inc()
        rnd.created += 1
        if c.replaces is not None:
            await self._remove(plan, c.replaces, rnd)
        return True

    async def _collect(self, plan: Plan, rnd: _Round) -> None:
        """Delete the job's pods labelled recorded, in one request. The answer lists what
        it deleted: a pod it only marked for deletion (grace period, other finalizers) is a
        write to wait for; the others are deletes to wait for."""
        meta = plan.bw["metadata"]
        ns = meta["namespace"]
        selector = f"{LABEL_BATCH}={meta['name']},{LABEL_TASK_RECORDED}=true"
        chosen = (*plan.collect, *rnd.labelled)
        try:
            # Terminal pods go at once (grace 0, as kube-controller-manager's PodGC deletes
            # them): their containers have stopped, and the kubelet's own final delete of
            # each would be one more write per task. Live ones (a suspended or ended job's)
            # get their grace period, so their node stops them first.
            out = await self.rest.request(
                "DELETE",
                PODS.path(ns),
                params={"labelSelector": selector, "fieldSelector": TERMINAL_PHASES},
                body={"gracePeriodSeconds": 0},
            )
            if any(not r.terminal for r in chosen):
                live = await self.rest.request(
                    "DELETE",
                    PODS.path(ns),
                    params={"labelSelector": selector, "fieldSelector": LIVE_PHASES},
                )
                out = {"items": [*(out.get("items") or []), *(live.get("items") or [])]}
        except ApiError as e:
            if e.status in REFUSED:
                rnd.refused("deletecollection", e)
                return
            if e.status not in (403, 405):
                raise
            # Not granted (an identity without deletecollection on pods): one by one.
            log.warning(
                "deletecollection of recorded pods refused; deleting them one by one",
                extra={"workload": plan.key, "error": str(e)},
            )
            one_by_one = [
                Removal(r.name, r.uid, (), True, r.why) for r in (*plan.collect, *rnd.labelled)
            ]
            await bounded([_bind(self._remove, plan, r, rnd) for r in one_by_one])
            return
        metrics.BATCH_POD_WRITES.labels("deletecollection").inc()
        items = out.get("items")
        if not isinstance(items, list):
            for r in (*plan.collect, *rnd.labelled):
                self.writes.pods.deleted(f"{ns}/{r.name}", owner=plan.key)
            return
        for item in items:
            item_meta = item.get("metadata") or {}
            key = f"{ns}/{item_meta.get('name')}"
            if item_meta.get("finalizers") or (item_meta.get("deletionGracePeriodSeconds") or 0):
                self.writes.pods.wrote(key, item, owner=plan.key)
            else:
                self.writes.pods.deleted(key, owner=plan.key)

    async def _confirm(
        self, plan: Plan, key: str, rnd: _Round, c: Create, error: str | None
    ) -> bool:
        """A create that met an existing pod, or whose answer was lost: read the pod by its
        name, so the next sync waits for it instead of deciding again without it."""
        if error is not None:
            log.warning("pod create outcome unknown", extra={"pod": key, "error": error})
            rnd.create_errors.append(f"create of {key} did not answer: {error}")
        ns, name = key.split("/", 1)
        try:
            found = await self.rest.get(PODS.path(ns, name))
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError):
            return False
        self.writes.pods.wrote(key, found, owner=plan.key)
        return error is None


@dataclass(frozen=True)
class Applied:
    """The queue's result, how many pods were created (for `creationRate`), and whether a
    create was refused because the namespace is being deleted."""

    result: Result
    created: int
    namespace_terminating: bool


def _namespace_terminating(e: ApiError) -> bool:
    causes = (e.body.get("details") or {}).get("causes") or []
    return e.status == 403 and (
        any(isinstance(c, dict) and c.get("reason") == NAMESPACE_TERMINATING for c in causes)
        or "because it is being terminated" in e.message
    )


def _bind(
    fn: Callable[[Plan, Any, _Round], Awaitable[bool]], plan: Plan, item: Any, rnd: _Round
) -> Callable[[], Awaitable[bool]]:
    return lambda: fn(plan, item, rnd)
