"""The one executor of the endpoints controller: applies a `Plan` with conditional writes.

Every write is conditional on the version it was decided from: the Service is created once
(its ClusterIP is allocated then and never changes), patched under a `test` of its
resourceVersion and deleted with uid and resourceVersion preconditions; slices are created,
replaced with the resourceVersion they were planned from and deleted with a precondition;
drained-at is a JSON patch guarded by the pod's resourceVersion. Each write's returned
version is recorded in the controller's `OwnWrites`, so nothing is decided again from a
cache older than these writes.

A refused write (conflict, gone, failed `test`) is not re-read here: the result is RETRY,
the queue backs the key off, and the next round decides from the informers, which by then
show whatever changed under us.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish import metrics
from pilotfish.kube.events import ControllerEvents
from pilotfish.kube.informer import Obj, object_key
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, PODS, ApiError, Rest
from pilotfish.kube.workqueue import DONE, RETRY, RateLimiter, Result, requeue_after
from pilotfish.operators.endpoints.decide import (
    Plan,
    ServiceDecision,
    drained_patch,
    slice_body,
)
from pilotfish.operators.endpoints.model import (
    ACTION_MANAGE_ENDPOINTS,
    ACTION_MANAGE_SERVICE,
    CONTROLLER,
    ENDPOINTSLICES,
    REASON_SERVICE_NOT_OWNED,
    REASON_SYNC_FAILED,
    SERVICES,
    uid_of,
)
from pilotfish.operators.endpoints.planner import SliceCreate, SliceDelete, SliceUpdate
from pilotfish.timeutil import Clock, format_micro_time

log = logging.getLogger("pilotfish.endpoints")

# Client-side write rate limit (no Python client has one): all of this controller's writes.
WRITE_QPS: Final = 200.0
WRITE_BURST: Final = 400


@dataclass
class Trackers:
    """This controller's own writes, one tracker per kind (their keys are namespace/name)."""

    services: OwnWrites
    slices: OwnWrites
    pods: OwnWrites

    def settled(self, owner: str) -> bool:
        return all(t.settled(owner) for t in (self.services, self.slices, self.pods))


def _refused(e: object) -> bool:
    """A conditional write that lost: the object changed, went, or failed a `test` op."""
    return isinstance(e, ApiError) and (e.conflict or e.not_found or e.status == 422)


@dataclass
class Executor:
    rest: Rest
    events: ControllerEvents
    clock: Clock
    own: Trackers
    limiter: RateLimiter
    # When each service's slices were last written (monotonic), for coalescing.
    last_write: dict[str, float] = field(default_factory=dict)
    # (workload uid, foreign Service uid) pairs already reported.
    reported: set[tuple[str, str]] = field(default_factory=set)

    async def finalize(self, key: str, sw: Obj | None, plan: Plan) -> Result:
        """Apply `plan` for workload `key`: the Service first, then slice creates and updates
        (together), then slice deletes, then drained-at on the pods those writes took out
        of rotation. Any refused write ends the round with RETRY."""
        if plan.gone or sw is None:
            return DONE  # the Service and its slices go by garbage collection
        if plan.invalid is not None:
            self._warn(sw, REASON_SYNC_FAILED, plan.invalid, ACTION_MANAGE_ENDPOINTS)
            return DONE  # wait for a spec change (the workload's event brings it back)
        if not await self._service(key, sw, plan.service):
            return RETRY
        if plan.hold > 0:
            return requeue_after(plan.hold, "coalescing slice writes")
        if plan.owner is not None and not plan.slices.empty:
            if not await self._slices(key, plan):
                return RETRY
            self.last_write[key] = self.clock.monotonic()
        if not await self._drain(key, plan.drain):
            return RETRY
        return DONE

    def _warn(self, sw: Obj, reason: str, note: str, action: str) -> None:
        self.events.post(sw, reason, note, action=action, type_="Warning")

    async def _write(self, call: Coroutine[Any, Any, Obj]) -> Obj:
        """`call` once the write rate allows it."""
        try:
            await self.limiter.acquire()
        except BaseException:
            call.close()  # cancelled while waiting: the write never starts
            raise
        return await call

    async def _service(self, key: str, sw: Obj, decision: ServiceDecision) -> bool:
        """The Service decision, applied; False when the write was refused."""
        ns, name = key.split("/", 1)
        verb = decision.verb
        if verb in ("ok", "wait"):
            return True
        if verb == "foreign":
            self._report_foreign(sw, decision.body)
            return True
        try:
            if verb == "create":
                out = await self._write(self.rest.create(SERVICES.path(ns), decision.body))
                self.own.services.wrote(key, out, owner=key)
                log.info(
                    "service created",
                    extra={"service": key, "clusterIP": (out.get("spec") or {}).get("clusterIP")},
                )
            elif verb == "patch":
                path = SERVICES.path(ns, name)
                out = await self._write(self.rest.patch(path, decision.body, JSON_PATCH))
                self.own.services.wrote(key, out, owner=key)
                log.info("service ports updated", extra={"service": key})
            else:  # delete: spec.service was removed; the slices follow by garbage collection
                meta = decision.body["metadata"]
                pre = {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]}
                await self._write(self.rest.delete(SERVICES.path(ns, name), {"preconditions": pre}))
                self.own.services.deleted(key, owner=key)
                log.info("service deleted: spec.service unset", extra={"service": key})
        except ApiError as e:
            if not _refused(e):
                raise
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
            return False
        return True

    def _report_foreign(self, sw: Obj, svc: Obj) -> None:
        """Say once per (workload, Service) that the name is taken, on the workload's events."""
        mark = (uid_of(sw), uid_of(svc))
        if mark in self.reported:
            return
        self.reported.add(mark)
        meta = sw["metadata"]
        note = (
            f"Service {meta['namespace']}/{meta['name']} exists and is not owned by this "
            "ServiceWorkload; Pilotfish leaves it alone and publishes no endpoints for it. "
            "Delete or rename it to let Pilotfish manage the workload's Service."
        )
        log.warning(note, extra={"workload": object_key(sw), "reason": REASON_SERVICE_NOT_OWNED})
        self._warn(sw, REASON_SERVICE_NOT_OWNED, note, ACTION_MANAGE_SERVICE)

    async def _slices(self, key: str, plan: Plan) -> bool:
        """Creates and updates (concurrently), then deletes; True when every write succeeded.

        Deletes wait for the rest, so an endpoint moving out of a deleted slice is already in
        its new one and rotation never drops to nothing.
        """
        ns = key.split("/", 1)[0]
        svc = plan.owner
        assert svc is not None

        async def create(c: SliceCreate) -> None:
            body = slice_body(svc, c.ports, c.endpoints)
            out = await self._write(self.rest.create(ENDPOINTSLICES.path(ns), body))
            self.own.slices.wrote(object_key(out), out, owner=key)
            metrics.ENDPOINTS_SLICE_WRITES.labels("create").inc()

        async def update(u: SliceUpdate) -> None:
            body = slice_body(svc, u.ports, u.endpoints, base=plan.current[u.name])
            body["metadata"]["resourceVersion"] = u.resource_version
            out = await self._write(self.rest.replace(ENDPOINTSLICES.path(ns, u.name), body))
            self.own.slices.wrote(object_key(out), out, owner=key)
            metrics.ENDPOINTS_SLICE_WRITES.labels("update").inc()

        async def delete(d: SliceDelete) -> None:
            pre = {"uid": uid_of(plan.current[d.name]), "resourceVersion": d.resource_version}
            try:
                await self._write(
                    self.rest.delete(ENDPOINTSLICES.path(ns, d.name), {"preconditions": pre})
                )
            except ApiError as e:
                if not e.not_found:
                    raise
            self.own.slices.deleted(f"{ns}/{d.name}", owner=key)
            metrics.ENDPOINTS_SLICE_WRITES.labels("delete").inc()

        first = [
            *(create(c) for c in plan.slices.creates),
            *(update(u) for u in plan.slices.updates),
        ]
        if not await _all_ok(first):
            return False
        return await _all_ok([delete(d) for d in plan.slices.deletes])

    async def _drain(self, key: str, pods: Sequence[Obj]) -> bool:
        """Tell owners that draining pods are out of rotation: the slices as written (or as
        they already were) show them not ready and terminating, or not at all."""
        if not pods:
            return True
        stamp = format_micro_time(self.clock.now())

        async def mark(pod: Obj) -> None:
            meta = pod["metadata"]
            path = PODS.path(meta["namespace"], meta["name"])
            try:
                out = await self._write(
                    self.rest.patch(path, drained_patch(pod, stamp), JSON_PATCH)
                )
            except ApiError as e:
                if e.not_found:
                    return
                raise
            self.own.pods.wrote(object_key(out), out, owner=key)
            metrics.ENDPOINTS_DRAINED.inc()
            log.info("pod out of rotation", extra={"pod": object_key(pod), "drainedAt": stamp})

        return await _all_ok([mark(p) for p in pods])


async def _all_ok(writes: Sequence[Awaitable[None]]) -> bool:
    """Run the writes together; False if any was refused, the first other error raised."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    refused = [r for r in results if _refused(r)]
    for r in results:
        if isinstance(r, BaseException) and not _refused(r):
            raise r
    if refused:
        metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc(len(refused))
    return not refused


def sync_failed_note(error: Exception) -> str:
    return f"Service or EndpointSlices could not be written: {error}"


def namespace_terminating(e: BaseException) -> bool:
    """A write refused because its namespace is being deleted (403, NamespaceTerminating)."""
    if not isinstance(e, ApiError):
        return False
    causes = ((e.body.get("details") or {}).get("causes")) or []
    return e.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes)
