"""The at-most-one steps as writes, in the release order, stopping at the first that fails.

Lease first (a conditional create or replace), then the deletes (uid preconditions; grace 0
only for pods that surely do not run), then the holder pod under its deterministic name. A
step that is refused ends the steps of the round: the next round reads the Lease and the
pods again and resumes from whichever step the API shows done, so a crash, a refusal or a
lost answer between any two steps never leaves two pods that may run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from pilotfish import metrics
from pilotfish.kube.events import ControllerEvents
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import LEASES, PODS, ApiError, Rest
from pilotfish.operators.serviceworkload.atmostone import (
    FencedCreate,
    FencedDelete,
    FencingPlan,
    LeaseWrite,
    fenced_pod,
)
from pilotfish.operators.serviceworkload.model import Event
from pilotfish.operators.serviceworkload.revisions import controlled_by
from pilotfish.podtemplate import pod_body

log = logging.getLogger("pilotfish.serviceworkload")

REFUSED: Final = frozenset({404, 409, 422})
EVENT_CREATED: Final = "SuccessfulCreate"
EVENT_CREATE_FAILED: Final = "FailedCreate"


@dataclass
class Outcome:
    """What the round reports back to the executor's own bookkeeping."""

    refusals: list[str] = field(default_factory=list)
    create_errors: list[str] = field(default_factory=list)
    created: bool = False
    refused_create: str | None = None  # the API server's message, for ReplicaFailure


class FencingWriter:
    def __init__(self, rest: Rest, pods: OwnWrites, events: ControllerEvents) -> None:
        self.rest = rest
        self.pods = pods
        self.events = events

    def _post(self, regarding: Mapping[str, Any], event: Event) -> None:
        self.events.post(
            regarding, event.reason, event.note, action=event.action, type_=event.type_
        )

    async def apply(
        self,
        key: str,
        sw: Mapping[str, Any],
        steps: FencingPlan,
        template: Mapping[str, Any] | None,
    ) -> Outcome:
        out = Outcome()
        for event in steps.events:
            self._post(sw, event)
        if steps.lease is not None and not await self._lease(sw, steps.lease, out):
            return out
        done = [await self._delete(key, sw, d, out) for d in steps.deletes]
        if steps.create is not None and all(done):
            await self._create(key, sw, steps.create, template, out)
        return out

    async def _lease(self, sw: Mapping[str, Any], write: LeaseWrite, out: Outcome) -> bool:
        meta = write.body["metadata"]
        try:
            if meta.get("resourceVersion"):
                await self.rest.replace(LEASES.path(meta["namespace"], meta["name"]), write.body)
            else:
                await self.rest.create(LEASES.path(meta["namespace"]), write.body)
        except ApiError as e:
            if e.status in REFUSED:  # someone moved it: decide again from what it says now
                out.refusals.append(f"write Lease {meta['name']}: {e.status} {e.reason}")
                return False
            raise
        if write.event is not None:
            self._post(sw, write.event)
        return True

    async def _delete(self, key: str, sw: Mapping[str, Any], d: FencedDelete, out: Outcome) -> bool:
        ns = sw["metadata"]["namespace"]
        body: dict[str, Any] = {"preconditions": {"uid": d.uid}}
        if d.grace_zero:
            body["gracePeriodSeconds"] = 0
        try:
            answer = await self.rest.delete(PODS.path(ns, d.name), body)
        except ApiError as e:
            if e.not_found:
                self.pods.deleted(f"{ns}/{d.name}", owner=key)
                return True
            if e.status in REFUSED:
                out.refusals.append(f"delete pod {d.name}: {e.status} {e.reason}")
                return False
            metrics.ROLLOUT_POD_ACTIONS.labels("delete", "failed").inc()
            raise
        metrics.ROLLOUT_POD_ACTIONS.labels("delete", "ok").inc()
        if answer.get("kind") == "Pod":
            self.pods.wrote(f"{ns}/{d.name}", answer, owner=key)
        else:
            self.pods.deleted(f"{ns}/{d.name}", owner=key)
        self._post(answer if answer.get("kind") == "Pod" else sw, d.event)
        return True

    async def _create(
        self,
        key: str,
        sw: Mapping[str, Any],
        c: FencedCreate,
        template: Mapping[str, Any] | None,
        out: Outcome,
    ) -> None:
        if template is None:
            out.create_errors.append(f"revision {c.revision} has no recorded template")
            return
        ns = sw["metadata"]["namespace"]
        body = fenced_pod(pod_body(sw, template, c.revision, c.name), c.epoch)
        try:
            created = await self.rest.create(PODS.path(ns), body)
        except ApiError as e:
            if e.status == 409:
                await self._adopt_existing(key, sw, c, out, e)
                return
            metrics.ROLLOUT_POD_ACTIONS.labels("create", "failed").inc()
            out.create_errors.append(f"{e.status} {e.reason}: {e.message}")
            out.refused_create = e.message
            note = f"creating pod {c.name}: {e.message}"
            self._post(sw, Event(EVENT_CREATE_FAILED, note, "CreatePod", "Warning"))
            return
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            # Outcome unknown: the name is the Lease's, so a retry is a 409, never a twin.
            log.warning("fenced pod create outcome unknown", extra={"pod": c.name, "error": str(e)})
            out.create_errors.append(f"create of {ns}/{c.name} did not answer: {e}")
            return
        self.pods.wrote(f"{ns}/{c.name}", created, owner=key)
        out.created = True
        metrics.ROLLOUT_POD_ACTIONS.labels("create", "ok").inc()
        note = f"created pod {c.name} (revision {c.revision}, epoch {c.epoch})"
        self._post(created, Event(EVENT_CREATED, note, "CreatePod"))

    async def _adopt_existing(
        self, key: str, sw: Mapping[str, Any], c: FencedCreate, out: Outcome, e: ApiError
    ) -> None:
        """The name exists: ours from a create whose answer was lost (wait for the informer
        to show it), or someone else's pod (refused: never run next to it)."""
        ns = sw["metadata"]["namespace"]
        try:
            found = await self.rest.get(PODS.path(ns, c.name))
        except ApiError as err:
            if not err.not_found:
                raise
            out.refusals.append(f"create pod {c.name}: {e.status} {e.reason}")
            return
        if controlled_by(found, str(sw["metadata"]["uid"])):
            self.pods.wrote(f"{ns}/{c.name}", found, owner=key)
            return
        out.create_errors.append(f"pod {c.name} exists and is not this workload's")
        note = f"pod {c.name} exists and is not this workload's: the identity cannot start"
        self._post(sw, Event(EVENT_CREATE_FAILED, note, "CreatePod", "Warning"))
