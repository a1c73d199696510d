"""The gate controller's one executor: a round's plan becomes conditional writes.

Every write is conditional on the resourceVersion the round decided from, or on the version
the pod's previous write of this round returned (gate removal: strategic-merge patch
carrying metadata.resourceVersion; record and label: JSON patch with a `test` op; status:
patch carrying resourceVersion; delete: preconditions). A 409 (or a failed `test`, 422)
means the view was stale: that pod's remaining writes are skipped and the round reports a
conflict, which its queue retries with backoff, deciding again from a fresher view.

A release is one write per pod: the gate patch, carrying the release mark
(`ANNOTATION_RELEASED`) that the audit log is completed from after a kill -9. No State
condition follows it (`status`), and its Event is one per gate and namespace for the whole
round (`releases`), posted once the round's writes are done.

Quota is spent before a gate goes: every pod the round releases has its room reserved in its
team's quota ledger first (`pilotfish.reservations`), so admission and the gate controller
can never both hand out the room a finished pod freed.

What each write returned goes to the controller's `OwnWrites` (owner `ROUND`), so no round
decides from a cache older than the last one's writes: a released pod must count against
quota and in-flight at once. The one exception needs no record: when the informer already
holds something other than the versions this round's writes started from, it holds that
write or a later one (a conditional write's result is the direct successor of its
precondition, and a store only moves forward), so there is nothing left to wait for.

A write whose answer was lost (5xx, timeout, connection reset) may have committed. The pod
is then `unresolved` until `resolve` reads it back; until then no round decides at all,
because a committed release that the cache still shows gated would let its quota be
handed out twice.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from pilotfish import gates, metrics, timeutil
from pilotfish.kube.events import ControllerEvents, EventType
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, PODS, STRATEGIC_MERGE_PATCH, ApiError, Rest
from pilotfish.operators.gates import audit
from pilotfish.operators.gates.audit import AuditLog
from pilotfish.operators.gates.model import ANNOTATION_RELEASED, PodView
from pilotfish.operators.gates.plan import (
    Action,
    Expire,
    Flag,
    Plan,
    RemoveGate,
    SetCondition,
    UpdateRecord,
)
from pilotfish.operators.gates.releases import RoundReleases
from pilotfish.reservations import Refused, Release, Reserver
from pilotfish.timeutil import parse_time_or_none as parse_ts

log = logging.getLogger("pilotfish.gates")

CONTROLLER: Final = "gates"
ROUND: Final = "round"  # the work queue's one key, and the owner of every write

# Event reasons (events.k8s.io/v1), regarding the pod.
REASON_RELEASED: Final = "GateReleased"
REASON_EXPIRED: Final = "GateExpired"
REASON_RETRY: Final = "GateRetry"
REASON_REVIEW: Final = "GateReview"

UNKNOWN_OUTCOME: Final = (aiohttp.ClientError, OSError, TimeoutError)


def _escape(key: str) -> str:
    """A map key as a JSON-pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")


def _test_rv(rv: str) -> dict[str, Any]:
    return {"op": "test", "path": "/metadata/resourceVersion", "value": rv}


def pod_ref(p: PodView, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "resourceVersion": rv},
    }


@dataclass
class Outcome:
    pods: int = 0  # pods written to
    conflicts: int = 0  # pods whose view was stale
    refused: int = 0  # pods whose release the quota ledger refused (room taken meanwhile)


class _Chain:
    """One pod's writes in a round: the version each next write is conditional on, and every
    version the pod passed through since the round read it."""

    def __init__(self, pod: PodView, releases: RoundReleases) -> None:
        self.pod = pod
        self.rv = pod.resource_version
        self.seen = [self.rv]
        self.generation = pod.generation  # after the writes so far
        self.releases = releases


class Executor:
    def __init__(
        self,
        rest: Rest,
        pods: Informer,
        own: OwnWrites,
        reserver: Reserver,
        events: ControllerEvents,
        audit_log: AuditLog,
        *,
        write_concurrency: int = 32,
    ) -> None:
        """`write_concurrency`: pods written at once. Each gate patch waits on the admission
        webhooks, so a release is latency-bound: 16 at once released 2,000 pods at 0.53-0.56
        of what the same API server took from a client patching 32 at once, 32 at 0.73
        (`benchmarks/gate_release`)."""
        self.rest = rest
        self.pods = pods
        self.own = own
        self.reserver = reserver
        self.events = events
        self.audit = audit_log
        self.actor = audit_log.actor
        self.write_concurrency = write_concurrency
        # pod key -> versions its writes started from, for writes whose answer was lost
        self.unresolved: dict[str, list[str]] = {}

    # --- own writes ---------------------------------------------------------------------

    def _cached_rv(self, key: str) -> str | None:
        obj = self.pods.get(key)
        return None if obj is None else str(obj["metadata"].get("resourceVersion") or "")

    def _wrote(self, c: _Chain, resp: Obj) -> None:
        meta = resp.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        if not rv:
            return
        generation = meta.get("generation")
        if isinstance(generation, int) and not isinstance(generation, bool):
            c.generation = generation
        if self._cached_rv(c.pod.key) in c.seen:
            self.own.wrote(c.pod.key, resp, owner=ROUND)
        c.rv = rv
        c.seen.append(rv)

    async def resolve(self) -> None:
        """Read back every pod whose last write's answer was lost, and wait for what the
        read shows. Raises while the API cannot answer: the round must not decide yet."""
        for key, seen in list(self.unresolved.items()):
            ns, name = key.split("/", 1)
            try:
                got = await self.rest.get(PODS.path(ns, name))
            except ApiError as e:
                if not e.not_found:
                    raise
                got = None
            cached = self._cached_rv(key)
            if got is not None and cached in seen:
                if str(got["metadata"].get("resourceVersion") or "") != cached:
                    self.own.wrote(key, got, owner=ROUND)
            elif got is None and cached is not None:
                self.own.deleted(key, owner=ROUND)
            del self.unresolved[key]

    # --- a plan -------------------------------------------------------------------------

    async def apply(self, plan: Plan, now: datetime.datetime) -> Outcome:
        """Apply the plan's actions, pods in parallel (bounded), each pod's in order. Other
        failures than conflicts are raised after every pod had its turn, so one bad pod
        does not hold the others back."""
        refused = await self._reserve(plan, now)
        by_pod: dict[str, list[Action]] = {}
        for a in plan.actions:
            if a.pod.key not in refused:
                by_pod.setdefault(a.pod.key, []).append(a)
        out = Outcome(pods=len(by_pod), refused=len(refused))
        if not by_pod:
            return out
        releases = RoundReleases.of(plan.actions)
        sem = asyncio.Semaphore(self.write_concurrency)
        pending = len(by_pod)
        metrics.GATES_PENDING_WRITES.set(pending)

        async def one(acts: list[Action]) -> bool:
            nonlocal pending
            async with sem:
                try:
                    return await self._pod(acts, now, releases)
                finally:
                    pending -= 1
                    metrics.GATES_PENDING_WRITES.set(pending)

        results = await asyncio.gather(*(one(a) for a in by_pod.values()), return_exceptions=True)
        for summary in releases.summaries():  # what committed, whatever failed besides
            ref = pod_ref(summary.pod, summary.rv)
            self.events.post(ref, REASON_RELEASED, summary.note, action="Release")
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors:
            if isinstance(e, asyncio.CancelledError):
                raise e
        if errors:
            raise errors[0]
        out.conflicts = sum(1 for r in results if r is True)
        return out

    async def _reserve(self, plan: Plan, now: datetime.datetime) -> set[str]:
        """Reserve the room of every pod released now in its team's quota ledger, before any
        of its gates goes: one conditional TeamQuota write per team (so a gang holds all
        its room or none). Returns the pods whose release the ledger refused: another
        spender took the room since the round read it; none of their writes is made."""
        by_team: dict[str, dict[str, PodView]] = {}
        for a in plan.actions:
            if isinstance(a, RemoveGate) and a.final and a.pod.key in plan.released:
                by_team.setdefault(plan.released[a.pod.key], {})[a.pod.key] = a.pod
        refused: set[str] = set()
        for team, pods in sorted(by_team.items()):
            ask = [Release(p.uid, p.key, p.band, p.requests) for p in pods.values()]
            result = await self.reserver.release(team, ask, now)
            if isinstance(result, Refused):
                log.info(
                    "quota taken since the round read it; deciding again",
                    extra={"team": team, "pods": sorted(pods), "why": result.message},
                )
                refused.update(pods)
        return refused

    async def _pod(
        self, acts: Sequence[Action], now: datetime.datetime, releases: RoundReleases
    ) -> bool:
        """One pod's writes in order: gates, record, review label, condition, delete.
        Returns True on a conflict (the pod changed since the round's view)."""
        c = _Chain(acts[0].pod, releases)
        try:
            await self._writes(c, acts, now)
        except ApiError as e:
            if e.not_found:
                return False  # deleted meanwhile: nothing left to decide about it
            if e.conflict or e.status == 422:
                metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
                log.info(
                    "pod changed since the round read it; deciding again",
                    extra={"pod": c.pod.key, "decided_from": c.seen[0], "error": str(e)},
                )
                return True
            if e.status >= 500:  # e.g. an etcd timeout: the write may have been committed
                self.unresolved[c.pod.key] = c.seen
            raise
        except UNKNOWN_OUTCOME:
            self.unresolved[c.pod.key] = c.seen
            raise
        return False

    async def _writes(self, c: _Chain, acts: Sequence[Action], now: datetime.datetime) -> None:
        pod = c.pod
        path = PODS.path(pod.namespace, pod.name)
        removes = [a for a in acts if isinstance(a, RemoveGate)]
        if removes:
            await self._remove_gates(c, removes, now)
        for rec in (a for a in acts if isinstance(a, UpdateRecord)):
            target = f"/metadata/annotations/{_escape(gates.ANNOTATION_RECORD)}"
            ops = [_test_rv(c.rv), {"op": "replace", "path": target, "value": rec.record}]
            self._wrote(c, await self.rest.patch(path, ops, JSON_PATCH))
        for e in (a for a in acts if isinstance(a, Expire) and a.action == "Retry"):
            self._expired(c, e, now, REASON_RETRY, "Warning")
        reviews = [a for a in acts if isinstance(a, Expire) and a.action == "Review"]
        flags = [a for a in acts if isinstance(a, Flag)]
        if (reviews or flags) and not pod.review_flagged:
            target = f"/metadata/labels/{_escape(gates.LABEL_REVIEW)}"
            ops = [_test_rv(c.rv), {"op": "add", "path": target, "value": "required"}]
            self._wrote(c, await self.rest.patch(path, ops, JSON_PATCH))
        for e in reviews:
            self._expired(c, e, now, REASON_REVIEW, "Warning")
        for f in flags:
            note = (
                f"{f.gate} is held: its record does not match its GatePolicy ({f.why}); it is "
                f"not released on the record's terms; flagged for review "
                f"({gates.LABEL_REVIEW}=required): release or cancel it with "
                "`kubectl pilotfish gates`"
            )
            self.events.post(
                pod_ref(pod, c.rv), "GateRecordUntrusted", note, action="Hold", type_="Warning"
            )
        for s in (a for a in acts if isinstance(a, SetCondition)):
            await self._condition(c, s)
        for e in (a for a in acts if isinstance(a, Expire) and a.action == "Fail"):
            await self._fail(c, e, now)

    async def _condition(self, c: _Chain, s: SetCondition) -> None:
        """The State condition of a still-gated pod; `observedGeneration` is the pod's
        generation after this round's gate removals, so once the release patch moves the
        generation on, the condition left from the gated phase reads as outdated."""
        cond: dict[str, Any] = {
            "type": gates.POD_CONDITION,
            "status": s.status,
            "reason": s.reason,
            "message": s.message,
            "lastTransitionTime": s.last_transition_time,
            "lastProbeTime": None,
        }
        if c.generation:
            cond["observedGeneration"] = c.generation
        body = {"metadata": {"resourceVersion": c.rv}, "status": {"conditions": [cond]}}
        path = PODS.path(c.pod.namespace, c.pod.name) + "/status"
        self._wrote(c, await self.rest.patch(path, body, STRATEGIC_MERGE_PATCH))

    async def _remove_gates(
        self, c: _Chain, removes: list[RemoveGate], now: datetime.datetime
    ) -> None:
        pod, decided_from = c.pod, c.rv
        entries: list[dict[str, Any]] = []
        released = {g: dict(e) for g, e in pod.released_log.items()}
        for r in removes:
            entries.extend(gates.remove_gate_patch(r.gate)["spec"]["schedulingGates"])
            released[r.gate] = {
                "at": timeutil.format_time(now),
                "evidence": r.evidence[:512],
                "decidedFrom": decided_from,
                "actor": self.actor,
            }
        body = {
            "metadata": {
                "resourceVersion": decided_from,
                "annotations": {ANNOTATION_RELEASED: json.dumps(released, sort_keys=True)},
            },
            "spec": {"schedulingGates": entries},
        }
        resp = await self.rest.patch(
            PODS.path(pod.namespace, pod.name), body, STRATEGIC_MERGE_PATCH
        )
        self._wrote(c, resp)
        since = parse_ts(pod.record_created) or pod.created
        age = max(0.0, (now - since).total_seconds())
        for r in removes:
            self._audit(c, now, r.gate, "released", r.evidence, decided_from)
            metrics.GATES_RELEASES.labels(r.gate, pod.namespace).inc()
            metrics.GATES_RELEASE_AGE.labels(r.gate).observe(age)
        c.releases.add(pod, c.rv, removes)

    def _audit(
        self,
        c: _Chain,
        now: datetime.datetime,
        gate: str,
        decision: audit.Decision,
        evidence: str,
        decided_from: str,
    ) -> None:
        pod = c.pod
        self.audit.record(
            ts=now,
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            gate=gate,
            decision=decision,
            evidence=evidence,
            resource_version=c.rv,
            decided_from=decided_from,
        )

    def _expired(
        self, c: _Chain, e: Expire, now: datetime.datetime, reason: str, type_: EventType
    ) -> None:
        pod = c.pod
        if e.action == "Retry":
            tail = f"retry {e.attempts}: new deadline {e.next_deadline}"
            decision: audit.Decision = "expired-retry"
        else:
            tail = f"flagged for review ({gates.LABEL_REVIEW}=required); the gate stays"
            decision = "expired-review"
        note = f"{e.gate} expired at {e.deadline} unmet ({e.evidence}); {tail}"
        self.events.post(pod_ref(pod, c.rv), reason, note, action=e.action, type_=type_)
        self._audit(c, now, e.gate, decision, f"{e.evidence}; {tail}", c.seen[0])
        metrics.GATES_EXPIRATIONS.labels(e.gate, e.action).inc()

    async def _fail(self, c: _Chain, e: Expire, now: datetime.datetime) -> None:
        """Expired with onExpiry Fail: the condition already says why; tell with an Event,
        delete the pod only if it is still the version decided from, then audit."""
        pod = c.pod
        note = f"{e.gate} expired at {e.deadline} unmet ({e.evidence}); onExpiry Fail: deleting"
        self.events.post(pod_ref(pod, c.rv), REASON_EXPIRED, note, action="Expire", type_="Warning")
        body = {"preconditions": {"uid": pod.uid, "resourceVersion": c.rv}}
        resp = await self.rest.delete(PODS.path(pod.namespace, pod.name), body)
        if resp.get("kind") != "Status":  # graceful: marked for deletion, a new version
            self._wrote(c, resp)
        elif self._cached_rv(pod.key) in c.seen:
            self.own.deleted(pod.key, owner=ROUND)
        self._audit(c, now, e.gate, "expired-fail", e.evidence, c.seen[0])
        metrics.GATES_EXPIRATIONS.labels(e.gate, "Fail").inc()
