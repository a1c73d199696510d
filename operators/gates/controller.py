"""The gate controller: observe gated pods and what releases them, decide, act conditionally.

Observe: shared informers (never per-pod kopf handlers, see ARCHITECTURE section 3) on
- pods labelled `gates.pilotfish.io/gated=true`, full objects: what is decided about;
- every live pod, reduced on arrival to (team, band, requests, holds quota): quota usage;
- namespaces (team label), nodes (Ready, images), GateSignals, TeamQuotas, GatePolicies
  (pacing, and the terms of every gate: `terms`), each reduced to what a condition reads.
Everything is rebuilt by listing on start; nothing but the pacing buckets lives only here.

Decide: one round is `decide.decide(world, now)` over all gated pods at once. A single work
queue key makes rounds serial, which is what keeps quota and pacing exact: two rounds can
never both spend the same quota. Bursts of events collapse into one round (the queue
de-duplicates), and a round's own writes trigger at most one more.

Act: every write is conditional on the resourceVersion the round decided from (gate
removal: strategic-merge patch carrying metadata.resourceVersion; record and label: JSON
patch with a `test` op; status: patch carrying resourceVersion; delete: preconditions). A
409 means the view was stale: the pod's remaining writes are skipped and the next round
decides again from the informer's fresher copy. Successful writes are *assumed* (their
response replaces the cached pod until the watch catches up) so that a round right after
a release counts the released pod against quota and in-flight even before its watch event.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp

from pilotfish import gates, metrics, names, timeutil
from pilotfish import quota as q
from pilotfish.kube.events import EventRecorder, EventType
from pilotfish.kube.informer import Informer, Obj, object_key, slim
from pilotfish.kube.rest import (
    GATEPOLICIES,
    GATESIGNALS,
    JSON_PATCH,
    NAMESPACES,
    NODES,
    PODS,
    STRATEGIC_MERGE_PATCH,
    TEAMQUOTAS,
    ApiError,
    Rest,
)
from pilotfish.kube.workqueue import WorkQueue
from pilotfish.operators.gates import audit, terms
from pilotfish.operators.gates.audit import AuditLog
from pilotfish.operators.gates.decide import (
    Action,
    Expire,
    Flag,
    RemoveGate,
    SetCondition,
    UpdateRecord,
    World,
    decide,
)
from pilotfish.operators.gates.model import (
    ANNOTATION_RELEASED,
    NodeView,
    PodView,
    SignalView,
    namespace_pacing,
    node_view,
    pod_view,
    quota_view,
    signal_view,
)
from pilotfish.operators.gates.pacing import Bucket
from pilotfish.timeutil import parse_time_or_none as parse_ts
from pilotfish.timeutil import utcnow

log = logging.getLogger("pilotfish.gates")

CONTROLLER: Final = "gates"
REPORTING_CONTROLLER: Final = "pilotfish.io/gates"

# Event reasons (events.k8s.io/v1), regarding the pod.
REASON_RELEASED: Final = "GateReleased"
REASON_EXPIRED: Final = "GateExpired"
REASON_RETRY: Final = "GateRetry"
REASON_REVIEW: Final = "GateReview"
REASON_UNTRUSTED: Final = terms.REASON_UNTRUSTED


ROUND: Final = "round"
# How long a write's response stands in for the cached pod if the watch never shows that
# version (a relist that jumped past it); the watch normally catches up in milliseconds.
ASSUME_SECONDS: Final = 60.0
CONFLICT_RETRY_SECONDS: Final = 1.0

Clock = Callable[[], datetime.datetime]


def _escape(key: str) -> str:
    """A map key as a JSON-pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")


def _rv_reached(seen: str, target: str) -> bool:
    """Has the watch delivered `target` (or later)? Versions are compared as integers when
    both are (etcd revisions), else only equality counts (and the assumption's TTL)."""
    if seen == target:
        return True
    try:
        return int(seen) >= int(target)
    except ValueError:
        return False


# --- reduced views of the supporting informers -------------------------------------------


def usage_projection(obj: Obj) -> Obj:
    """Keep only what quota usage needs from a pod: ~200 bytes instead of kilobytes."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    gated = labels.get(gates.LABEL_GATED) == "true"
    counted = not gated and q.counts_against_quota(obj)
    try:
        requests = q.pod_requests(obj) if counted else {}
    except ValueError:
        requests = {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "usage": (
            (meta.get("namespace") or "", labels.get(names.LABEL_TEAM) or "", q.pod_band(obj))
            if counted
            else None
        ),
        "requests": requests,
    }


UsageKey = tuple[str, str, str]


class UsageIndex:
    """Requests of quota-holding pods without the gated label, summed per (namespace, team
    label, band), kept incrementally so a round does not walk every pod of the cluster."""

    def __init__(self) -> None:
        self.totals: dict[UsageKey, q.Resources] = {}
        self._by_pod: dict[str, tuple[UsageKey, q.Resources]] = {}

    def apply(self, kind: str, obj: Obj) -> bool:
        """Account for one informer event; True when the totals changed."""
        key = object_key(obj)
        after: tuple[UsageKey, q.Resources] | None = None
        usage = obj.get("usage")
        if kind != "DELETED" and usage is not None:
            ns, team, band = usage
            after = ((str(ns), str(team), str(band)), dict(obj.get("requests") or {}))
        before = self._by_pod.pop(key, None)
        if before is not None:
            self._add(*before, sign=-1)
        if after is not None:
            self._by_pod[key] = after
            self._add(*after, sign=1)
        return before != after

    def _add(self, k: UsageKey, res: q.Resources, *, sign: int) -> None:
        cur = dict(self.totals.get(k, {}))
        for r, v in res.items():
            cur[r] = cur.get(r, Fraction(0)) + sign * v
        cur = {r: v for r, v in cur.items() if v != 0}
        if cur:
            self.totals[k] = cur
        else:
            self.totals.pop(k, None)


def _node_projection(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")},
        "view": node_view(obj),
    }


def _namespace_projection(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
        }
    }


def _pod_ref(p: PodView, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "resourceVersion": rv},
    }


class Options(Protocol):
    """What the operator process tells its controllers (operators.runner.Options)."""

    @property
    def identity(self) -> str: ...
    @property
    def audit_log(self) -> Path | None: ...


@dataclass
class _Assumed:
    obj: Obj
    until_rv: str  # cleared once the watch shows this version (or later)
    expires: float


class GateController:
    def __init__(
        self,
        rest: Rest,
        *,
        identity: str = "gates",
        audit_log: Path | None = None,
        clock: Clock = utcnow,
        write_concurrency: int = 16,
        resync_seconds: float = 300.0,
    ) -> None:
        self.rest = rest
        self.clock = clock
        self.configure_identity(identity, audit_log)
        self.write_concurrency = write_concurrency
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER)
        self.pods = Informer(
            rest,
            PODS,
            label_selector=f"{gates.LABEL_GATED}=true",
            resync_seconds=resync_seconds,
        )
        self.usage_pods = Informer(
            rest,
            PODS,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            transform=usage_projection,
        )
        self.namespaces = Informer(rest, NAMESPACES, transform=_namespace_projection)
        self.nodes = Informer(rest, NODES, transform=_node_projection)
        self.signals = Informer(rest, GATESIGNALS)
        self.quotas = Informer(rest, TEAMQUOTAS)
        self.policies = Informer(rest, GATEPOLICIES)
        # Without these a round could release against a partial view (quota!), so rounds
        # wait for them. GateSignals are optional: until their CRD exists, GateSignal
        # conditions are simply not met.
        self.required = (
            self.pods,
            self.usage_pods,
            self.namespaces,
            self.nodes,
            self.quotas,
            self.policies,
        )
        self.usage = UsageIndex()
        self.buckets: dict[str, Bucket] = {}
        self._assumed: dict[str, _Assumed] = {}
        self._views: dict[str, tuple[Obj, PodView]] = {}
        self._policy_terms: dict[str, tuple[Obj, terms.PolicyGates]] = {}
        self._gauge_labels: dict[str, set[tuple[str, ...]]] = {}
        self.rounds = 0
        self._wire()

    def configure(self, options: Options) -> None:
        """Take the process's identity and audit-log path (called before `run`)."""
        self.configure_identity(options.identity, options.audit_log)

    def configure_identity(self, identity: str, audit_log: Path | None) -> None:
        self.actor = f"{names.SA_OPERATOR}/{CONTROLLER}/{identity}"
        self.audit = AuditLog(audit_log, self.actor)
        self._audited: set[tuple[str, str]] | None = None  # released (uid, gate) in the file
        self.events = EventRecorder(self.rest, REPORTING_CONTROLLER, identity, clock=self.clock)

    # observe

    def _kick(self) -> None:
        self.queue.add(ROUND)
        metrics.GATES_QUEUE_DEPTH.set(len(self.queue))

    def _wire(self) -> None:
        self.pods.add_handler(self._on_pod)
        self.usage_pods.add_handler(self._on_usage)
        self.namespaces.add_handler(
            self._when_changed(lambda o: (o.get("metadata") or {}).get("labels"))
        )
        self.nodes.add_handler(self._when_changed(lambda o: o.get("view")))
        self.signals.add_handler(self._when_changed(signal_view))
        self.quotas.add_handler(self._when_changed(lambda o: o.get("spec")))
        self.policies.add_handler(self._when_changed(lambda o: o.get("spec")))

    def _when_changed(self, part: Callable[[Obj], Any]) -> Callable[[str, Obj, Obj | None], None]:
        """A handler that starts a round only when the part a decision reads changed (node
        heartbeats and quota status updates would otherwise start one each)."""

        def handler(kind: str, obj: Obj, old: Obj | None) -> None:
            if kind in ("ADDED", "DELETED") or old is None or part(obj) != part(old):
                self._kick()

        return handler

    def _on_pod(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        key = object_key(obj)
        a = self._assumed.get(key)
        if a is not None:
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if kind == "DELETED" or _rv_reached(rv, a.until_rv):
                del self._assumed[key]
        if kind == "DELETED":
            self._views.pop(key, None)
        self._kick()

    def _on_usage(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        if kind != "SYNC" and self.usage.apply(kind, obj):
            self._kick()

    def _assume(self, key: str, obj: Obj, until_rv: str) -> None:
        self._assumed[key] = _Assumed(slim(obj), until_rv, time.monotonic() + ASSUME_SECONDS)

    def _pod_objects(self) -> Iterable[Obj]:
        """The informer's pods, each replaced by our own write's result until the watch
        shows that version. The watch may run ahead of a write's response (the scheduler
        updates a released pod within milliseconds), so an assumption is dropped as soon as
        the informer's copy has reached it, not only when an event arrives after it."""
        now = time.monotonic()
        for key in [k for k, a in self._assumed.items() if a.expires < now]:
            del self._assumed[key]
        for key, obj in self.pods.store.items():
            a = self._assumed.get(key)
            if a is not None:
                seen = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if _rv_reached(seen, a.until_rv):
                    del self._assumed[key]
                    a = None
            yield a.obj if a is not None else obj

    def _view(self, obj: Obj) -> PodView:
        """Parse once per object: the informer replaces the dict on every change, and an
        assumed copy is a dict of its own, so identity says exactly when to re-parse (a
        resourceVersion would not: an unanswered write is assumed at the old version)."""
        key = object_key(obj)
        cached = self._views.get(key)
        if cached is not None and cached[0] is obj:
            return cached[1]
        view = pod_view(obj)
        self._views[key] = (obj, view)
        return view

    def _policies(self) -> dict[tuple[str, str], terms.PolicyGates]:
        """Every GatePolicy's gates, parsed once per version (identity, as `_view`)."""
        out: dict[tuple[str, str], terms.PolicyGates] = {}
        seen: dict[str, tuple[Obj, terms.PolicyGates]] = {}
        for key, obj in self.policies.store.items():
            cached = self._policy_terms.get(key)
            if cached is not None and cached[0] is obj:
                parsed = cached[1]
            else:
                parsed = terms.policy_gates(obj)
            seen[key] = (obj, parsed)
            out[(parsed.namespace, parsed.name)] = parsed
        self._policy_terms = seen
        return out

    def world(self) -> World:
        signals: dict[tuple[str, str], SignalView] | None = None
        if self.signals.synced.is_set():
            views = (signal_view(o) for o in self.signals.store.values())
            signals = {(s.namespace, s.name): s for s in views}
        nodes: list[NodeView] = [o["view"] for o in self.nodes.store.values()]
        return World(
            pods=[self._view(o) for o in self._pod_objects()],
            usage=dict(self.usage.totals),
            namespace_labels={
                str(o["metadata"]["name"]): o["metadata"]["labels"]
                for o in self.namespaces.store.values()
            },
            signals=signals,
            quotas=[quota_view(o) for o in self.quotas.store.values()],
            nodes=nodes,
            pacing=namespace_pacing(list(self.policies.store.values())),
            buckets=dict(self.buckets),
            policies=self._policies(),
        )

    # decide and act

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.required)

    async def sync(self, key: str) -> None:
        """One decision round (the work queue's only key)."""
        del key
        if not self.synced():
            return
        started = time.monotonic()
        now = self.clock()
        world = self.world()
        self._complete_audit(world, now)
        decision = decide(world, now)
        self.buckets = dict(decision.buckets)
        conflicts = await self._act(decision.actions, now)
        self.rounds += 1
        self._update_metrics(world, now)
        if decision.wake_at is not None:
            self.queue.add_after(ROUND, max(0.0, (decision.wake_at - now).total_seconds()))
        if conflicts:
            self.queue.add_after(ROUND, CONFLICT_RETRY_SECONDS)
        metrics.GATES_ROUND_SECONDS.observe(time.monotonic() - started)
        metrics.GATES_QUEUE_DEPTH.set(len(self.queue))

    async def _act(self, actions: Iterable[Action], now: datetime.datetime) -> int:
        """Apply the round's actions, pods in parallel (bounded), each pod's in order.
        Returns how many pods hit a conflict. Other failures are raised after every pod had
        its turn, so one bad pod does not hold the others back."""
        by_pod: dict[str, list[Action]] = {}
        for a in actions:
            by_pod.setdefault(a.pod.key, []).append(a)
        if not by_pod:
            return 0
        sem = asyncio.Semaphore(self.write_concurrency)
        pending = len(by_pod)
        metrics.GATES_PENDING_WRITES.set(pending)

        async def one(acts: list[Action]) -> bool:
            nonlocal pending
            async with sem:
                try:
                    return await self._act_pod(acts, now)
                finally:
                    pending -= 1
                    metrics.GATES_PENDING_WRITES.set(pending)

        results = await asyncio.gather(*(one(a) for a in by_pod.values()), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors:
            if isinstance(e, asyncio.CancelledError):
                raise e
        if errors:
            metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
            raise errors[0]
        return sum(1 for r in results if r is True)

    async def _act_pod(self, acts: list[Action], now: datetime.datetime) -> bool:
        """One pod's writes in order: gates, record, review label, condition, delete.
        Each write is conditional on the version the previous one produced. Returns True on
        a conflict (the pod changed since the round's view)."""
        pod = acts[0].pod
        rv = pod.resource_version
        path = PODS.path(pod.namespace, pod.name)
        try:
            removes = [a for a in acts if isinstance(a, RemoveGate)]
            if removes:
                rv = await self._remove_gates(pod, removes, rv, now)
            records = [a for a in acts if isinstance(a, UpdateRecord)]
            retries = [a for a in acts if isinstance(a, Expire) and a.action == "Retry"]
            for rec in records:
                ops = [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                    {
                        "op": "replace",
                        "path": f"/metadata/annotations/{_escape(gates.ANNOTATION_RECORD)}",
                        "value": rec.record,
                    },
                ]
                resp = await self.rest.patch(path, ops, JSON_PATCH)
                rv = self._written(pod.key, resp, rv)
            for e in retries:
                await self._expired(pod, e, rv, now, REASON_RETRY, "Warning")
            reviews = [a for a in acts if isinstance(a, Expire) and a.action == "Review"]
            flags = [a for a in acts if isinstance(a, Flag)]
            if reviews or flags:
                if not pod.review_flagged:
                    ops = [
                        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                        {
                            "op": "add",
                            "path": f"/metadata/labels/{_escape(gates.LABEL_REVIEW)}",
                            "value": "required",
                        },
                    ]
                    resp = await self.rest.patch(path, ops, JSON_PATCH)
                    rv = self._written(pod.key, resp, rv)
                for e in reviews:
                    await self._expired(pod, e, rv, now, REASON_REVIEW, "Warning")
                for f in flags:
                    note = (
                        f"{f.gate} is held: its record does not match its GatePolicy ({f.why}); "
                        f"it is not released on the record's terms; flagged for review "
                        f"({gates.LABEL_REVIEW}=required): release or cancel it with "
                        "`kubectl pilotfish gates`"
                    )
                    await self.events.emit(
                        _pod_ref(pod, rv), REASON_UNTRUSTED, note, action="Hold", type_="Warning"
                    )
            for c in (a for a in acts if isinstance(a, SetCondition)):
                body = {
                    "metadata": {"resourceVersion": rv},
                    "status": {
                        "conditions": [
                            {
                                "type": gates.POD_CONDITION,
                                "status": c.status,
                                "reason": c.reason,
                                "message": c.message,
                                "lastTransitionTime": c.last_transition_time,
                                "lastProbeTime": None,
                            }
                        ]
                    },
                }
                resp = await self.rest.patch(path + "/status", body, STRATEGIC_MERGE_PATCH)
                rv = self._written(pod.key, resp, rv)
            for e in (a for a in acts if isinstance(a, Expire) and a.action == "Fail"):
                await self._fail(pod, e, rv, now)
        except ApiError as e:
            if e.not_found:
                return False  # deleted meanwhile: nothing left to decide about it
            if e.conflict or e.status == 422:
                metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
                log.info(
                    "pod changed since the round read it; deciding again",
                    extra={"pod": pod.key, "decided_from": pod.resource_version, "error": str(e)},
                )
                return True
            raise
        return False

    def _complete_audit(self, world: World, now: datetime.datetime) -> None:
        """Audit the releases that committed without their line (the process died between
        the write and the audit), as this process sees them now. Needs the audit file, read
        once per process; without one there is nothing to complete."""
        if self.audit.path is None:
            return
        if self._audited is None:
            self._audited = audit.released_keys(self.audit.path)
        prefix = f"{names.SA_OPERATOR}/{CONTROLLER}/"
        for p, g in audit.unaudited_releases(world.pods, self._audited, prefix):
            self.audit.record(
                ts=now,
                namespace=p.namespace,
                name=p.name,
                uid=p.uid,
                gate=g,
                decision="released",
                evidence=f"{g} was released by this controller, whose process stopped before "
                f"writing the line: audited by {self.actor} after a restart, when it saw the "
                "pod without the gate and with the controller's release mark",
                resource_version=p.resource_version,
            )
            self._audited.add((p.uid, g))

    def _written(self, key: str, resp: Obj, fallback_rv: str) -> str:
        rv = str((resp.get("metadata") or {}).get("resourceVersion") or "")
        if resp.get("kind") == "Pod" and rv:
            self._assume(key, resp, rv)
            return rv
        return fallback_rv

    async def _remove_gates(
        self, pod: PodView, removes: list[RemoveGate], rv: str, now: datetime.datetime
    ) -> str:
        entries: list[dict[str, Any]] = []
        released = {g: dict(e) for g, e in pod.released_log.items()}
        for r in removes:
            entries.extend(gates.remove_gate_patch(r.gate)["spec"]["schedulingGates"])
            released[r.gate] = {
                "at": timeutil.format_time(now),
                "evidence": r.evidence[:512],
                "decidedFrom": rv,
                "actor": self.actor,
            }
        body = {
            "metadata": {
                "resourceVersion": rv,
                "annotations": {ANNOTATION_RELEASED: json.dumps(released, sort_keys=True)},
            },
            "spec": {"schedulingGates": entries},
        }
        path = PODS.path(pod.namespace, pod.name)
        try:
            resp = await self.rest.patch(path, body, STRATEGIC_MERGE_PATCH)
        except ApiError as e:
            if e.status >= 500:  # e.g. an etcd timeout: the write may have been committed
                self._assume_released(pod, [r.gate for r in removes])
            raise
        except (aiohttp.ClientError, OSError, TimeoutError):
            # The write may or may not have happened. Until the watch shows a newer
            # version, count the pod as released (quota, in-flight), never as still gated:
            # a second round must not spend the same quota again.
            self._assume_released(pod, [r.gate for r in removes])
            raise
        new_rv = self._written(pod.key, resp, rv)
        since = parse_ts(pod.record_created) or pod.created
        age = max(0.0, (now - since).total_seconds())
        for r in removes:
            if self._audited is not None:
                self._audited.add((pod.uid, r.gate))
            self.audit.record(
                ts=now,
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                gate=r.gate,
                decision="released",
                evidence=r.evidence,
                resource_version=new_rv,
                decided_from=rv,
            )
            metrics.GATES_RELEASES.labels(r.gate, pod.namespace).inc()
            metrics.GATES_RELEASE_AGE.labels(r.gate).observe(age)
        note = "; ".join(f"released {r.gate}: {r.evidence}" for r in removes)
        if any(r.final for r in removes):
            note += "; no Pilotfish gate left, the pod goes to the scheduler"
        await self.events.emit(_pod_ref(pod, new_rv), REASON_RELEASED, note, action="Release")
        return new_rv

    def _assume_released(self, pod: PodView, removed: list[str]) -> None:
        obj = _pod_ref(pod, pod.resource_version)
        # Rebuild just enough of the pod for a view: the cached copy minus the gates.
        cached = self.pods.get(pod.key)
        if cached is not None:
            obj = {**cached, "spec": dict(cached.get("spec") or {})}
            obj["spec"]["schedulingGates"] = [
                g for g in obj["spec"].get("schedulingGates") or [] if g.get("name") not in removed
            ]
        # Cleared by any version other than the one decided from.
        until = str(int(pod.resource_version) + 1) if pod.resource_version.isdigit() else "?"
        self._assumed[pod.key] = _Assumed(obj, until, time.monotonic() + ASSUME_SECONDS)

    async def _expired(
        self,
        pod: PodView,
        e: Expire,
        rv: str,
        now: datetime.datetime,
        reason: str,
        type_: EventType,
    ) -> None:
        if e.action == "Retry":
            tail = f"retry {e.attempts}: new deadline {e.next_deadline}"
            decision: Any = "expired-retry"
        else:
            tail = f"flagged for review ({gates.LABEL_REVIEW}=required); the gate stays"
            decision = "expired-review"
        note = f"{e.gate} expired at {e.deadline} unmet ({e.evidence}); {tail}"
        await self.events.emit(_pod_ref(pod, rv), reason, note, action=e.action, type_=type_)
        self.audit.record(
            ts=now,
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            gate=e.gate,
            decision=decision,
            evidence=f"{e.evidence}; {tail}",
            resource_version=rv,
            decided_from=pod.resource_version,
        )
        metrics.GATES_EXPIRATIONS.labels(e.gate, e.action).inc()

    async def _fail(self, pod: PodView, e: Expire, rv: str, now: datetime.datetime) -> None:
        """Expired with onExpiry Fail: the condition already says why; tell with an Event,
        delete the pod only if it is still the version decided from, then audit."""
        note = f"{e.gate} expired at {e.deadline} unmet ({e.evidence}); onExpiry Fail: deleting"
        await self.events.emit(
            _pod_ref(pod, rv), REASON_EXPIRED, note, action="Expire", type_="Warning"
        )
        body = {"preconditions": {"uid": pod.uid, "resourceVersion": rv}}
        resp = await self.rest.delete(PODS.path(pod.namespace, pod.name), body)
        if resp.get("kind") == "Pod":
            self._written(pod.key, resp, rv)
        self.audit.record(
            ts=now,
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            gate=e.gate,
            decision="expired-fail",
            evidence=e.evidence,
            resource_version=rv,
            decided_from=pod.resource_version,
        )
        metrics.GATES_EXPIRATIONS.labels(e.gate, "Fail").inc()

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
                key = (g, p.namespace)
                gated[key] += 1
                oldest[key] = max(oldest.get(key, 0.0), age)
                rec = p.record.get(g)
                if rec is not None:
                    timeout[key] = max(timeout.get(key, 0.0), float(rec.timeout_seconds))
            if p.released and not p.node_name:
                in_flight[(p.namespace,)] += 1
        self._set_gauge("gated", metrics.GATES_GATED_PODS, gated)
        self._set_gauge("oldest", metrics.GATES_OLDEST_GATED_AGE, oldest)
        self._set_gauge("timeout", metrics.GATES_TIMEOUT, timeout)
        self._set_gauge("in_flight", metrics.GATES_IN_FLIGHT, in_flight)

    # run

    async def _first_round(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.required))
        log.info("gate controller synced; first round", extra={"pods": len(self.pods.store)})
        self._kick()

    async def run(self) -> None:
        try:
            await asyncio.gather(
                self.pods.run(),
                self.usage_pods.run(),
                self.namespaces.run(),
                self.nodes.run(),
                self.signals.run(),
                self.quotas.run(),
                self.policies.run(),
                self._first_round(),
                self.queue.run(1, self.sync),
            )
        finally:
            self.audit.close()
