"""The one executor of a ServiceWorkload plan: conditional writes, recorded as they return.

Every write carries what it was decided from (a JSON-patch `test` of the resourceVersion, a
uid or resourceVersion precondition on deletes, a pod name chosen before the create), and
every write that succeeded is recorded in the controller's `OwnWrites` with the version the
API returned, so the next round waits for the informers to show it instead of deciding
from a view older than its own writes. A refused write (409, 422, a 404 of what the view
still shows) is not an error: the round ends with RETRY and the queue backs the workload
off while refusals continue; the next round decides again from a fresher view.

Writes go in dependency order: revision, disruption budget, pods taken down, pods created
(slow start: batches of 1, 2, 4, ... stopping at the first failure, as ReplicaSets do, so a
template the API refuses costs one refused call, not `replicas`), or instead of those two an
at-most-one workload's fenced steps (`atmostone_apply`), status, history. Events are posted
(never awaited) once the write they report succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from pilotfish import metrics
from pilotfish.kube.events import ControllerEvents
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, PODS, SERVICEWORKLOADS, ApiError, Rest
from pilotfish.kube.workqueue import DONE, Result, requeue_after, round_refused
from pilotfish.operators.serviceworkload import pdb as pdbs
from pilotfish.operators.serviceworkload import revisions as revs
from pilotfish.operators.serviceworkload import rolling
from pilotfish.operators.serviceworkload.atmostone import FencingPlan
from pilotfish.operators.serviceworkload.atmostone_apply import FencingWriter
from pilotfish.operators.serviceworkload.decide import (
    CreatePods,
    DrainPod,
    Plan,
    PodWrite,
    StatusWrite,
)
from pilotfish.operators.serviceworkload.model import Event
from pilotfish.operators.serviceworkload.status import ReplicaFailure, replica_failure
from pilotfish.operators.serviceworkload.sync import PdbWrite, RecordRevision, collision_event
from pilotfish.podtemplate import pod_body, pod_name
from pilotfish.timeutil import Clock
from pilotfish.workloads import DRAIN_TIMEOUT_SECONDS, PROPAGATION_SECONDS

log = logging.getLogger("pilotfish.serviceworkload")

CONTROLLER: Final = "serviceworkload"
# Writes to the API in flight at once for one workload (deletes, drains, a create batch).
MAX_PARALLEL_WRITES: Final = 16
# Added to every timed wake-up so that, when it fires, the moment it waited for has passed
# on the wall clock too (timestamps from the API have whole-second precision).
WAKE_SLACK_SECONDS: Final = 0.05
SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LENGTH: Final = 5
# A create answered this way (the API server's own timeout) may still have happened.
AMBIGUOUS_STATUS: Final = frozenset({504})
# Refusals of a conditional write: the view it was decided from is not the API's any more.
REFUSED: Final = frozenset({404, 409, 422})

EVENT_CREATED: Final = "SuccessfulCreate"
EVENT_CREATE_FAILED: Final = "FailedCreate"
EVENT_DRAIN: Final = "DrainRequested"
# What each delete reason means, for the Event's note.
DELETE_NOTES: Final = {
    rolling.DELETE_FAILED: "it failed (or was evicted) and is replaced",
    rolling.DELETE_DRAINED: f"out of rotation for {PROPAGATION_SECONDS:g}s",
    rolling.DELETE_DRAIN_TIMEOUT: f"no drain answer within {DRAIN_TIMEOUT_SECONDS:g}s",
    rolling.DELETE_NOT_SERVING: "no Service routes to it, nothing to drain",
}


@dataclass
class Trackers:
    """One `OwnWrites` per kind (object keys of different kinds may coincide: the PDB is
    named like its workload), one question for all: is every write for this owner seen?"""

    workloads: OwnWrites
    pods: OwnWrites
    revisions: OwnWrites
    pdbs: OwnWrites

    def all(self) -> tuple[OwnWrites, ...]:
        return (self.workloads, self.pods, self.revisions, self.pdbs)

    def settled(self, owner: str) -> bool:
        return all(t.settled(owner) for t in self.all())

    def pending(self) -> int:
        return sum(t.pending() for t in self.all())


@dataclass
class _Round:
    refusals: list[str] = field(default_factory=list)
    create_errors: list[str] = field(default_factory=list)

    def refused(self, what: str, e: ApiError) -> None:
        self.refusals.append(f"{what}: {e.status} {e.reason}: {e.message}")


# Pods named in a round's `SuccessfulCreate` note; the count says how many more.
NAMED_IN_NOTE: Final = 5


def created_note(made: Sequence[str], revision: str) -> str:
    """The note of one round's creates, on the workload as the ReplicaSet controller's are on
    the ReplicaSet: an Event per created pod cost a write each, and in a rollout of
    thousands of pods they queued behind the one Event writer (6,661 waiting at 1,000
    nodes in `benchmarks/scale`)."""
    names_ = ", ".join(sorted(made)[:NAMED_IN_NOTE])
    more = len(made) - NAMED_IN_NOTE
    tail = f" and {more} more" if more > 0 else ""
    pods = "pod" if len(made) == 1 else "pods"
    return f"created {len(made)} {pods} of revision {revision}: {names_}{tail}"


def random_suffix(rng: random.Random) -> str:
    return "".join(rng.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))


def namespace_terminating(e: ApiError) -> bool:
    causes = (e.body.get("details") or {}).get("causes") or []
    return e.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes)


async def bounded(calls: Sequence[Callable[[], Awaitable[None]]]) -> None:
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


class Executor:
    def __init__(
        self,
        rest: Rest,
        writes: Trackers,
        events: ControllerEvents,
        clock: Clock,
        rng: random.Random,
        failures: dict[str, ReplicaFailure],
    ) -> None:
        """`failures`: the last refused pod create per workload, shared with the controller
        (it is observed state for the next round's status)."""
        self.rest = rest
        self.writes = writes
        self.events = events
        self.clock = clock
        self.rng = rng
        self.failures = failures
        self.fencing = FencingWriter(rest, writes.pods, events)

    async def apply(self, plan: Plan) -> Result:
        rnd = _Round()
        for event in plan.events:
            self._post(plan.sw, event)
        if plan.revision is not None and not await self._record_revision(plan, plan.revision, rnd):
            return self._result(plan, rnd)
        if plan.pdb is not None:
            await self._write_pdb(plan, plan.pdb, rnd)
        await bounded([_call(self._take_down, plan, w, rnd) for w in plan.takedowns])
        for create in plan.creates:
            if not await self._create_pods(plan, create, rnd):
                break
        if plan.fencing is not None:
            await self._fence(plan, plan.fencing, rnd)
        if plan.status is not None:
            await self._write_status(plan, plan.status, rnd)
        for old in plan.prune:
            await self._delete_revision(plan, old, rnd)
        return self._result(plan, rnd)

    def _result(self, plan: Plan, rnd: _Round) -> Result:
        refused = round_refused(CONTROLLER, plan.key, rnd.refusals, rnd.create_errors)
        if refused is not None:
            return refused
        if plan.wake_at is not None:
            wait = plan.wake_at - self.clock.now().timestamp()
            return requeue_after(wait + WAKE_SLACK_SECONDS, "timed wake-up")
        return DONE

    def _post(self, regarding: Mapping[str, Any], event: Event) -> None:
        self.events.post(
            regarding, event.reason, event.note, action=event.action, type_=event.type_
        )

    # sync phase -------------------------------------------------------------------------

    async def _record_revision(self, plan: Plan, step: RecordRevision, rnd: _Round) -> bool:
        ns = plan.sw["metadata"]["namespace"]
        if step.replaces is not None:
            old = step.replaces
            body = {"preconditions": {"resourceVersion": old.resource_version}}
            try:
                await self.rest.delete(revs.CONTROLLER_REVISIONS.path(ns, old.name), body)
            except ApiError as e:
                if not e.not_found:
                    if e.conflict:
                        rnd.refused(f"renumber ControllerRevision {old.name}", e)
                        return False
                    raise
            self.writes.revisions.deleted(f"{ns}/{old.name}", owner=plan.key)
        try:
            created = await self.rest.create(revs.CONTROLLER_REVISIONS.path(ns), step.body)
        except ApiError as e:
            if not e.conflict:
                raise
            # Recorded already (the view was behind), or someone else's object by that name.
            found = await self.rest.get(revs.CONTROLLER_REVISIONS.path(ns, step.name))
            same = revs.canonical_json(found.get("data")) == revs.canonical_json(step.body["data"])
            if not revs.controlled_by(found, plan.sw["metadata"]["uid"]) or not same:
                note = f"ControllerRevision {step.name} exists and is not this template's"
                self._post(plan.sw, collision_event(note))
                rnd.refused(f"create ControllerRevision {step.name}", e)
                return False
            self.writes.revisions.wrote(f"{ns}/{step.name}", found, owner=plan.key)
            return True
        self.writes.revisions.wrote(f"{ns}/{step.name}", created, owner=plan.key)
        self._post(plan.sw, step.event)
        return True

    async def _write_pdb(self, plan: Plan, write: PdbWrite, rnd: _Round) -> None:
        ns = plan.sw["metadata"]["namespace"]
        try:
            if write.create is not None:
                out = await self.rest.create(pdbs.PDBS.path(ns), write.create)
            else:
                out = await self.rest.patch(pdbs.PDBS.path(ns, write.name), write.patch, JSON_PATCH)
        except ApiError as e:
            if e.status in REFUSED:  # created meanwhile (ours or not): the view will show it
                rnd.refused(f"write PodDisruptionBudget {write.name}", e)
                return
            raise
        self.writes.pdbs.wrote(f"{ns}/{write.name}", out, owner=plan.key)

    async def _delete_revision(self, plan: Plan, rev: revs.RevisionInfo, rnd: _Round) -> None:
        ns = plan.sw["metadata"]["namespace"]
        body = {"preconditions": {"resourceVersion": rev.resource_version}}
        try:
            await self.rest.delete(revs.CONTROLLER_REVISIONS.path(ns, rev.name), body)
        except ApiError as e:
            if e.conflict:
                rnd.refused(f"delete ControllerRevision {rev.name}", e)
                return
            if not e.not_found:
                raise
        self.writes.revisions.deleted(f"{ns}/{rev.name}", owner=plan.key)

    # rolling phase ----------------------------------------------------------------------

    async def _take_down(self, plan: Plan, write: PodWrite, rnd: _Round) -> None:
        ns = plan.sw["metadata"]["namespace"]
        pod_key = f"{ns}/{write.name}"
        path = PODS.path(ns, write.name)
        verb = "drain" if isinstance(write, DrainPod) else "delete"
        try:
            if isinstance(write, DrainPod):
                out = await self.rest.patch(path, write.patch, JSON_PATCH)
            else:
                body = {"preconditions": {"uid": write.uid}} if write.uid else None
                out = await self.rest.delete(path, body)
        except ApiError as e:
            if e.not_found:  # gone already: wait for the informer to show it gone
                self.writes.pods.deleted(pod_key, owner=plan.key)
                return
            if e.status in REFUSED:  # a newer version, or another pod of that name
                rnd.refused(f"{verb} pod {write.name}", e)
                return
            metrics.ROLLOUT_POD_ACTIONS.labels(verb, "failed").inc()
            raise
        metrics.ROLLOUT_POD_ACTIONS.labels(verb, "ok").inc()
        if out.get("kind") == "Pod":
            # A graceful delete answers with the terminating pod; an immediate one with the
            # pod as deleted: either version, or the delete, is what the informer shows.
            self.writes.pods.wrote(pod_key, out, owner=plan.key)
        else:
            self.writes.pods.deleted(pod_key, owner=plan.key)
        regarding = out if out.get("kind") == "Pod" else plan.sw
        if isinstance(write, DrainPod):
            note = f"pod {write.name} asked to leave rotation"
            self._post(regarding, Event(EVENT_DRAIN, note, "DrainPod"))
        else:
            why = DELETE_NOTES.get(write.reason, write.reason)
            note = f"deleted pod {write.name}: {why}"
            self._post(regarding, Event(write.reason, note, "DeletePod"))

    async def _create_pods(self, plan: Plan, create: CreatePods, rnd: _Round) -> bool:
        """Slow start; False once a create failed (the rest wait for the next round)."""
        if create.template is None:
            rnd.create_errors.append(f"revision {create.revision} has no recorded template")
            return False
        remaining, batch = create.count, 1
        made: list[str] = []
        try:
            while remaining > 0:
                size = min(batch, remaining, MAX_PARALLEL_WRITES)
                template, revision = create.template, create.revision
                results = await asyncio.gather(
                    *(self._create_pod(plan, template, revision, rnd, made) for _ in range(size))
                )
                remaining -= size
                if not all(results):
                    return False
                batch *= 2
            return True
        finally:
            if made:
                self._post(
                    plan.sw, Event(EVENT_CREATED, created_note(made, create.revision), "CreatePod")
                )

    async def _create_pod(
        self,
        plan: Plan,
        template: Mapping[str, Any],
        revision: str,
        rnd: _Round,
        made: list[str],
    ) -> bool:
        sw = plan.sw
        ns = sw["metadata"]["namespace"]
        name = pod_name(sw["metadata"]["name"], revision, random_suffix(self.rng))
        pod_key = f"{ns}/{name}"
        try:
            created = await self.rest.create(PODS.path(ns), pod_body(sw, template, revision, name))
        except ApiError as e:
            if e.status in AMBIGUOUS_STATUS:
                await self._confirm_create(plan, pod_key, rnd, str(e))
                return False
            if namespace_terminating(e):
                return False  # the workload goes with its namespace: nothing to report
            metrics.ROLLOUT_POD_ACTIONS.labels("create", "failed").inc()
            rnd.create_errors.append(f"{e.status} {e.reason}: {e.message}")
            self.failures[plan.key] = replica_failure(sw["metadata"].get("generation"), e.message)
            note = f"creating pod {name}: {e.message}"
            self._post(sw, Event(EVENT_CREATE_FAILED, note, "CreatePod", "Warning"))
            return False
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            await self._confirm_create(plan, pod_key, rnd, str(e))
            return False
        self.writes.pods.wrote(pod_key, created, owner=plan.key)
        self.failures.pop(plan.key, None)
        metrics.ROLLOUT_POD_ACTIONS.labels("create", "ok").inc()
        made.append(name)
        return True

    async def _confirm_create(self, plan: Plan, pod_key: str, rnd: _Round, error: str) -> None:
        """A create whose answer was lost may have happened: ask the API, by the name chosen
        before sending it, so a pod that exists is waited for instead of created again."""
        log.warning("pod create outcome unknown", extra={"pod": pod_key, "error": error})
        rnd.create_errors.append(f"create of {pod_key} did not answer: {error}")
        ns, name = pod_key.split("/", 1)
        try:
            found = await self.rest.get(PODS.path(ns, name))
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError):
            return  # not there, or still unknown: the create is retried from the next view
        self.writes.pods.wrote(pod_key, found, owner=plan.key)

    async def _fence(self, plan: Plan, steps: FencingPlan, rnd: _Round) -> None:
        try:
            out = await self.fencing.apply(plan.key, plan.sw, steps, plan.fencing_template)
        except ApiError as e:
            if namespace_terminating(e):
                return  # the workload goes with its namespace: nothing to report
            raise
        rnd.refusals += out.refusals
        rnd.create_errors += out.create_errors
        if out.refused_create is not None:
            generation = plan.sw["metadata"].get("generation")
            self.failures[plan.key] = replica_failure(generation, out.refused_create)
        elif out.created:
            self.failures.pop(plan.key, None)

    # status phase -----------------------------------------------------------------------

    async def _write_status(self, plan: Plan, write: StatusWrite, rnd: _Round) -> None:
        meta = plan.sw["metadata"]
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": write.resource_version},
            {"op": "add", "path": "/status", "value": write.status},
        ]
        path = SERVICEWORKLOADS.path(meta["namespace"], meta["name"], "status")
        try:
            written = await self.rest.patch(path, ops, JSON_PATCH)
        except ApiError as e:
            if e.status in REFUSED:
                rnd.refused("status", e)
                return
            raise
        self.writes.workloads.wrote(plan.key, written, owner=plan.key)
        if write.announce is not None:
            self._post(written, write.announce)


def _call(
    fn: Callable[[Plan, PodWrite, _Round], Awaitable[None]], plan: Plan, w: PodWrite, rnd: _Round
) -> Callable[[], Awaitable[None]]:
    return lambda: fn(plan, w, rnd)
