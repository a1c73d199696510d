"""Endpoints: a stable Service and EndpointSlices of the pods of every ServiceWorkload.

Why Pilotfish writes its own slices rather than giving the Service a selector and letting
kube-controller-manager do it: the drain contract (`pilotfish.workloads`). A pod must leave
rotation (not ready, terminating) *before* its owner stops it, and the owner must learn when
the slice write that took it out has happened; the built-in controller has no such handshake
and does not know Pilotfish's drain annotation. So the Service has no selector (the built-in
EndpointSlice controller skips selector-less Services) and the slices carry our own
`endpointslice.kubernetes.io/managed-by` value (the built-in controller only touches slices
that carry its own), so the two never fight.

Observe: shared informers on ServiceWorkloads, the workloads' pods (label selector), Services,
our EndpointSlices (label selector) and nodes (for zones); every change enqueues the workload.
Decide (pure, no I/O, no clock): `decide_service` for the Service, `desired_endpoints` for what
the slices should say, `plan_slices` for the fewest slice writes that get there.
Act: conditional writes only: the Service is created once (its ClusterIP is allocated then and
never changes: it is patched, never re-created), its ports are patched under a `test` of the
resourceVersion; slices are created, replaced with the resourceVersion they were planned from
and deleted with a resourceVersion precondition. A conflict re-reads the service's slices from
the API and plans again. After a write that took a draining pod out of rotation has succeeded,
the pod gets `pilotfish.io/drained-at` (JSON patch guarded by its resourceVersion).

Write pacing: the first change after quiet goes out at once; further changes of the same
service within MIN_WRITE_INTERVAL_SECONDS are coalesced into one write at the end of the
interval (the seeds: slices written at most about once a second, which bounds the store's
write rate at 300,000 pods). The work queue already dedups a service's key.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from pydantic import ValidationError

from pilotfish import metrics, names
from pilotfish.api.serviceworkload import ServicePort, ServiceSpec
from pilotfish.kube.events import EventRecorder
from pilotfish.kube.informer import Informer, Obj, object_key, slim
from pilotfish.kube.rest import JSON_PATCH, NODES, PODS, SERVICEWORKLOADS, ApiError, Resource, Rest
from pilotfish.kube.workqueue import RateLimiter, WorkQueue
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    ENDPOINTSLICE_MANAGED_BY,
    LABEL_WORKLOAD,
    MAX_ENDPOINTS_PER_SLICE,
)

log = logging.getLogger("pilotfish.endpoints")

CONTROLLER: Final = "endpoints"
REPORTING_CONTROLLER: Final = "pilotfish.io/endpoints"

SERVICES: Final = Resource("", "v1", "services")
ENDPOINTSLICES: Final = Resource("discovery.k8s.io", "v1", "endpointslices")

LABEL_MANAGED_BY: Final = "endpointslice.kubernetes.io/managed-by"
LABEL_SERVICE_NAME: Final = "kubernetes.io/service-name"
LABEL_APP_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
ADDRESS_TYPE: Final = "IPv4"
SW_KIND: Final = "ServiceWorkload"

# Slices of one service are written at most this often under churn; the first change after a
# quiet period is written at once. The seeds ask for "about once a second"; measured here
# (benchmarks/endpoint_freshness), 1 s put the p99 change-to-slice lag at ~1.8x the built-in
# controller's, while 0.25 s matches it and still writes ~0.1 slices per change under 100
# flips/s. Overridable through ENV_MIN_WRITE_INTERVAL (the operator's command line is shared
# by every controller).
MIN_WRITE_INTERVAL_SECONDS: Final = 0.25
ENV_MIN_WRITE_INTERVAL: Final = "PILOTFISH_ENDPOINTS_MIN_WRITE_INTERVAL"
WORKERS: Final = 4
RESYNC_SECONDS: Final = 300.0
# Plan-and-write rounds within one sync when writes conflict, before backing off.
MAX_ATTEMPTS: Final = 3
# How long our own write results shadow a lagging informer before the informer is trusted.
WRITE_LOG_TTL_SECONDS: Final = 30.0
# Client-side write rate limit (no Python client has one): all of this controller's writes.
WRITE_QPS: Final = 200.0
WRITE_BURST: Final = 400
# How often a pod whose drained-at patch conflicted is retried (it changed under us).
DRAIN_RETRY_SECONDS: Final = 0.2

REASON_SERVICE_NOT_OWNED: Final = "ServiceNotOwned"
REASON_SYNC_FAILED: Final = "EndpointsSyncFailed"
ACTION_MANAGE_SERVICE: Final = "ManageService"
ACTION_MANAGE_ENDPOINTS: Final = "ManageEndpoints"

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


# --- Decide: the wire model of endpoints and slices ---------------------------------------


@dataclass(frozen=True, order=True)
class Port:
    """One port of a slice; `port` 0 stands for the API's nil (all ports), which we never write."""

    name: str
    port: int
    protocol: str

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "port": self.port, "protocol": self.protocol}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Port:
        return cls(
            str(raw.get("name") or ""), int(raw.get("port") or 0), raw.get("protocol", "TCP")
        )


# A slice's ports, sorted: every endpoint of a slice serves exactly these ports, so endpoints
# whose named target ports resolve differently go into different slices.
PortSet = tuple[Port, ...]


def port_set(ports: Iterable[Port]) -> PortSet:
    return tuple(sorted(set(ports)))


@dataclass(frozen=True)
class Endpoint:
    """One pod's endpoint, in the canonical form used both to plan and to compare.

    `ready` may be None only when read from a slice someone else wrote (the API's "unknown");
    Pilotfish always writes all three conditions.
    """

    key: str  # the pod's uid; the address for endpoints without a targetRef
    address: str
    ready: bool | None
    serving: bool | None
    terminating: bool | None
    node_name: str | None = None
    zone: str | None = None
    pod: str | None = None
    namespace: str | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "addresses": [self.address],
            "conditions": {
                "ready": self.ready,
                "serving": self.serving,
                "terminating": self.terminating,
            },
        }
        if self.node_name:
            out["nodeName"] = self.node_name
        if self.zone:
            out["zone"] = self.zone
        if self.pod:
            out["targetRef"] = {
                "kind": "Pod",
                "name": self.pod,
                "namespace": self.namespace,
                "uid": self.key,
            }
        return out

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Endpoint | None:
        addresses = raw.get("addresses") or []
        if not addresses:
            return None
        cond = raw.get("conditions") or {}
        ref = raw.get("targetRef") or {}
        pod = ref.get("name") if ref.get("kind") == "Pod" and ref.get("uid") else None
        return cls(
            key=str(ref["uid"]) if pod else f"ip:{addresses[0]}",
            address=str(addresses[0]),
            ready=cond.get("ready"),
            serving=cond.get("serving"),
            terminating=cond.get("terminating"),
            node_name=raw.get("nodeName"),
            zone=raw.get("zone"),
            pod=pod,
            namespace=ref.get("namespace") if pod else None,
        )


@dataclass(frozen=True)
class Slice:
    """An existing slice as the planner sees it."""

    name: str
    resource_version: str
    ports: PortSet
    endpoints: tuple[Endpoint, ...]
    address_type: str = ADDRESS_TYPE
    # Labels and owner are as Pilotfish writes them (else the slice is rewritten once).
    meta_current: bool = True


@dataclass(frozen=True)
class SliceCreate:
    ports: PortSet
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class SliceUpdate:
    name: str
    resource_version: str  # the version this update was planned from
    ports: PortSet
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class SliceDelete:
    name: str
    resource_version: str


@dataclass(frozen=True)
class SlicePlan:
    creates: tuple[SliceCreate, ...] = ()
    updates: tuple[SliceUpdate, ...] = ()
    deletes: tuple[SliceDelete, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)

    @property
    def writes(self) -> int:
        return len(self.creates) + len(self.updates) + len(self.deletes)


# --- Decide: what the slices should say ---------------------------------------------------


def _condition(pod: Obj, kind: str) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return bool(cond.get("status") == "True")
    return False


def _annotations(pod: Obj) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def is_draining(pod: Obj) -> bool:
    return bool(_annotations(pod).get(ANNOTATION_DRAIN))


def is_drained(pod: Obj) -> bool:
    return bool(_annotations(pod).get(ANNOTATION_DRAINED))


def ipv4_address(pod: Obj) -> str | None:
    """The pod's IPv4 address (the slices are IPv4), or None while it has none."""
    status = pod.get("status") or {}
    candidates = [p.get("ip") for p in status.get("podIPs") or []] or [status.get("podIP")]
    for ip in candidates:
        if not ip:
            continue
        try:
            if ipaddress.ip_address(ip).version == 4:
                return str(ip)
        except ValueError:
            continue
    return None


def resolve_ports(service_ports: Sequence[ServicePort], pod: Obj) -> PortSet:
    """Each service port as the pod serves it: a named targetPort becomes the number of the
    pod's container port of that name and protocol; a port the pod lacks is left out (as
    kube-controller-manager does), so the pod is not sent traffic it cannot take."""
    containers = (pod.get("spec") or {}).get("containers") or []
    out: list[Port] = []
    for sp in service_ports:
        target = sp.target_port if sp.target_port is not None else sp.port
        if isinstance(target, str):
            number = next(
                (
                    int(cp["containerPort"])
                    for c in containers
                    for cp in c.get("ports") or []
                    if cp.get("name") == target and cp.get("protocol", "TCP") == sp.protocol
                ),
                None,
            )
            if number is None:
                continue
            target = number
        out.append(Port(sp.name, target, sp.protocol))
    return port_set(out)


def pod_endpoint(pod: Obj, zone: str | None) -> Endpoint | None:
    """The endpoint a pod contributes, or None if it has no IPv4 address or has finished.

    ready: the pod's Ready condition, unless it is draining or being deleted (it must leave
    rotation before it stops); serving: Ready regardless of termination, so proxies can still
    fall back to it; terminating: being deleted or asked to drain.
    """
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    address = ipv4_address(pod)
    if address is None:
        return None
    ready = _condition(pod, "Ready")
    terminating = bool(meta.get("deletionTimestamp")) or is_draining(pod)
    return Endpoint(
        key=str(meta["uid"]),
        address=address,
        ready=ready and not terminating,
        serving=ready,
        terminating=terminating,
        node_name=(pod.get("spec") or {}).get("nodeName") or None,
        zone=zone,
        pod=str(meta["name"]),
        namespace=meta.get("namespace"),
    )


def desired_endpoints(
    pods: Iterable[Obj],
    service_ports: Sequence[ServicePort],
    zone_of: Callable[[str], str | None],
) -> dict[PortSet, dict[str, Endpoint]]:
    """Endpoints the slices should hold, grouped by the ports they serve."""
    out: dict[PortSet, dict[str, Endpoint]] = defaultdict(dict)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        ep = pod_endpoint(pod, zone_of(node) if node else None)
        if ep is None:
            continue
        ports = resolve_ports(service_ports, pod)
        if service_ports and not ports:
            continue  # serves none of the service's ports
        out[ports][ep.key] = ep
    return dict(out)


# --- Decide: the slice planner ------------------------------------------------------------


@dataclass
class _Working:
    slice: Slice
    kept: list[Endpoint]
    changed: bool


def plan_slices(
    desired: Mapping[PortSet, Mapping[str, Endpoint]],
    existing: Sequence[Slice],
    max_endpoints: int = MAX_ENDPOINTS_PER_SLICE,
) -> SlicePlan:
    """The fewest slice writes that make `existing` hold exactly `desired`.

    Rules:
    1. An endpoint stays in the slice it is in (its content updated in place); a slice is only
       written when one of its own endpoints changed, left, or new ones are put into it.
    2. An endpoint found in several slices stays in the first by name; an endpoint that is no
       longer desired is removed; a slice left empty is deleted.
    3. A slice over `max_endpoints` is split: its first `max_endpoints` stay, the rest move.
    4. Slices whose ports or address type no longer match anything desired are deleted (the
       writer creates replacements before it deletes, so rotation never drops to nothing).
    5. New endpoints fill slices that are being written anyway, then go into new full slices;
       a remainder smaller than a slice goes into the fullest untouched slice it fits in
       (one write either way, fewer slices), else into one new slice.
    """
    placed: set[str] = set()
    deletes: list[SliceDelete] = []
    work: dict[PortSet, list[_Working]] = defaultdict(list)
    moved: dict[PortSet, list[Endpoint]] = defaultdict(list)
    for s in sorted(existing, key=lambda s: s.name):
        group = desired.get(s.ports)
        if group is None or s.address_type != ADDRESS_TYPE:
            deletes.append(SliceDelete(s.name, s.resource_version))
            continue
        kept: list[Endpoint] = []
        for ep in s.endpoints:
            want = group.get(ep.key)
            if want is None or ep.key in placed:
                continue
            placed.add(ep.key)
            kept.append(want)
        if len(kept) > max_endpoints:
            moved[s.ports].extend(kept[max_endpoints:])
            kept = kept[:max_endpoints]
        changed = not s.meta_current or kept != list(s.endpoints)
        work[s.ports].append(_Working(s, kept, changed))

    creates: list[SliceCreate] = []
    for ports in sorted(desired):
        group = desired[ports]
        pending = moved[ports] + [group[k] for k in sorted(group) if k not in placed]
        slots = work[ports]
        for w in slots:  # slices written anyway (or to be deleted): fill them first
            if not pending:
                break
            room = max_endpoints - len(w.kept)
            if (w.changed or not w.kept) and room > 0:
                w.kept.extend(pending[:room])
                pending = pending[room:]
                w.changed = True
        while len(pending) >= max_endpoints:
            creates.append(SliceCreate(ports, tuple(pending[:max_endpoints])))
            pending = pending[max_endpoints:]
        if pending:
            fits = [w for w in slots if w.kept and len(w.kept) + len(pending) <= max_endpoints]
            if fits:
                w = max(fits, key=lambda w: (len(w.kept), w.slice.name))
                w.kept.extend(pending)
                w.changed = True
            else:
                creates.append(SliceCreate(ports, tuple(pending)))

    updates: list[SliceUpdate] = []
    for ports in sorted(work):
        for w in work[ports]:
            if not w.kept:
                deletes.append(SliceDelete(w.slice.name, w.slice.resource_version))
            elif w.changed:
                updates.append(
                    SliceUpdate(w.slice.name, w.slice.resource_version, ports, tuple(w.kept))
                )
    return SlicePlan(tuple(creates), tuple(updates), tuple(deletes))


# --- Decide: the Service ------------------------------------------------------------------


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def controller_ref(obj: Obj, api_version: str, kind: str) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def owned_by(obj: Obj, owner_uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == owner_uid and r.get("controller") for r in refs)


def service_ports_wire(spec: ServiceSpec) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "port": p.port,
            "targetPort": p.target_port if p.target_port is not None else p.port,
            "protocol": p.protocol,
        }
        for p in sorted(spec.ports, key=lambda p: p.name)
    ]


def _ports_of(svc: Obj) -> list[dict[str, Any]]:
    ports = (svc.get("spec") or {}).get("ports") or []
    return sorted(
        (
            {
                "name": p.get("name", ""),
                "port": p.get("port"),
                "targetPort": p.get("targetPort", p.get("port")),
                "protocol": p.get("protocol", "TCP"),
            }
            for p in ports
        ),
        key=lambda p: str(p["name"]),
    )


def desired_service(sw: Obj, spec: ServiceSpec) -> Obj:
    """The Service to create: named after the workload, no selector, owned by the workload."""
    meta = sw["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {LABEL_WORKLOAD: meta["name"], LABEL_APP_MANAGED_BY: "pilotfish"},
            "ownerReferences": [controller_ref(sw, names.API_VERSION, SW_KIND)],
        },
        "spec": {"type": "ClusterIP", "ports": service_ports_wire(spec)},
    }


ServiceVerb = Literal["ok", "create", "patch", "delete", "foreign", "wait"]


@dataclass(frozen=True)
class ServiceDecision:
    verb: ServiceVerb
    body: Any = None  # the Service to create, or the JSON patch


def decide_service(sw: Obj, spec: ServiceSpec | None, svc: Obj | None) -> ServiceDecision:
    """What to do to the workload's Service, given the one that exists (if any).

    Never re-create: the ClusterIP is allocated at creation and must stay for life, so a
    drifted Service is patched (ports, and any selector someone added, which would make the
    built-in controller start writing slices for it too). A Service of that name that this
    workload does not own is someone else's: it is left alone and reported.
    """
    uid = _uid(sw)
    if spec is None:
        if svc is not None and owned_by(svc, uid):
            return ServiceDecision("delete", svc)
        return ServiceDecision("ok")
    if svc is None:
        return ServiceDecision("create", desired_service(sw, spec))
    if not owned_by(svc, uid):
        return ServiceDecision("foreign", svc)
    if (svc.get("metadata") or {}).get("deletionTimestamp"):
        return ServiceDecision("wait")
    ops: list[dict[str, Any]] = []
    want = service_ports_wire(spec)
    if _ports_of(svc) != want:
        ops.append({"op": "replace", "path": "/spec/ports", "value": want})
    if (svc.get("spec") or {}).get("selector"):
        ops.append({"op": "remove", "path": "/spec/selector"})
    if not ops:
        return ServiceDecision("ok")
    rv = svc["metadata"]["resourceVersion"]
    return ServiceDecision(
        "patch", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *ops]
    )


# --- Decide: slices as read from the API --------------------------------------------------


def slice_labels(service_name: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: ENDPOINTSLICE_MANAGED_BY, LABEL_SERVICE_NAME: service_name}


def parse_slice(obj: Obj, service_name: str, service_uid: str) -> Slice:
    meta = obj["metadata"]
    endpoints = tuple(
        ep for ep in (Endpoint.from_wire(raw) for raw in obj.get("endpoints") or []) if ep
    )
    labels = meta.get("labels") or {}
    current = all(labels.get(k) == v for k, v in slice_labels(service_name).items()) and (
        owned_by(obj, service_uid)
    )
    return Slice(
        name=str(meta["name"]),
        resource_version=str(meta.get("resourceVersion", "")),
        ports=port_set(Port.from_wire(p) for p in obj.get("ports") or []),
        endpoints=endpoints,
        address_type=str(obj.get("addressType", "")),
        meta_current=current,
    )


def slice_body(
    service: Obj,
    ports: PortSet,
    endpoints: Sequence[Endpoint],
    base: Obj | None = None,
) -> Obj:
    """A whole slice for create (base None) or replace (base: the version planned from, whose
    resourceVersion makes the replace conditional; others' labels and annotations are kept)."""
    svc_meta = service["metadata"]
    owner = controller_ref(service, "v1", "Service")
    if base is None:
        meta: dict[str, Any] = {
            "generateName": f"{svc_meta['name']}-",
            "namespace": svc_meta["namespace"],
            "labels": slice_labels(svc_meta["name"]),
            "ownerReferences": [owner],
        }
    else:
        meta = dict(base["metadata"])
        meta["labels"] = {**(meta.get("labels") or {}), **slice_labels(svc_meta["name"])}
        others = [r for r in meta.get("ownerReferences") or [] if not r.get("controller")]
        meta["ownerReferences"] = [*others, owner]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": ADDRESS_TYPE,
        "endpoints": [ep.wire() for ep in endpoints],
        "ports": [p.wire() for p in ports],
    }


def drained_patch(pod: Obj, now: str) -> list[dict[str, Any]]:
    """Record drained-at, only on the exact version decided from (which did not have it)."""
    return [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": pod["metadata"]["resourceVersion"],
        },
        {
            "op": "add",
            "path": "/metadata/annotations/" + _pointer(ANNOTATION_DRAINED),
            "value": now,
        },
    ]


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def rfc3339(t: datetime.datetime) -> str:
    """Microseconds, so an owner waiting PROPAGATION_SECONDS after it never waits too little."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- Observe: slim copies of what the controller reads ------------------------------------


def slim_pod(pod: Obj) -> Obj:
    """The fields endpoints are made of; at 300,000 pods the rest is most of the memory."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ann = meta.get("annotations") or {}
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
            if k in meta
        }
        | {"annotations": {k: ann[k] for k in (ANNOTATION_DRAIN, ANNOTATION_DRAINED) if k in ann}},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {"name": c.get("name"), "ports": c.get("ports") or []}
                for c in spec.get("containers") or []
            ],
        },
        "status": {
            "phase": status.get("phase"),
            "podIP": status.get("podIP"),
            "podIPs": status.get("podIPs") or [],
            "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "Ready"],
        },
    }


def _endpoint_facts(pod: Obj) -> tuple[Any, ...]:
    """Everything of a slim pod but its resourceVersion: a change here may change a slice."""
    meta = pod["metadata"]
    return (
        meta.get("labels"),
        meta.get("annotations"),
        meta.get("deletionTimestamp"),
        pod["spec"],
        pod["status"]["phase"],
        pod["status"]["podIP"],
        pod["status"]["podIPs"],
        [c.get("status") for c in pod["status"]["conditions"]],
    )


def slim_node(node: Obj) -> Obj:
    meta = node.get("metadata") or {}
    zone = (meta.get("labels") or {}).get(names.LABEL_ZONE)
    return {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": {names.LABEL_ZONE: zone} if zone else {},
        }
    }


def _workload_of(pod: Obj | None) -> str | None:
    if pod is None:
        return None
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
    return f"{meta.get('namespace')}/{name}" if name else None


def _service_of_slice(obj: Obj | None) -> str | None:
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
    return f"{meta.get('namespace')}/{name}" if name else None


def _generation(obj: Obj) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


# --- Act ----------------------------------------------------------------------------------


@dataclass
class _Written:
    obj: Obj | None  # None: we deleted it
    uid: str
    generation: int
    at: float

    def caught_up(self, seen: Obj) -> bool:
        """The informer shows this version, or a newer spec (generation) of the same object.

        A resourceVersion is only compared for equality (the API calls its order opaque); a
        different one at the same generation keeps our copy until a conflict or the TTL.
        """
        meta = seen["metadata"]
        if _uid(seen) != self.uid or self.obj is None:
            return False
        same = meta.get("resourceVersion") == self.obj["metadata"].get("resourceVersion")
        return same or _generation(seen) > self.generation


@dataclass
class WriteLog:
    """Our own slice writes, shadowing the informer until its watch has caught up with them.

    Without it, a sync right after a create (before the watch delivers the new slice) would
    create the slice again, and one right after an update would replace from a stale
    resourceVersion and conflict for nothing. Entries expire after `ttl` so a slice removed
    behind our back is never believed to exist for long (a 404 also drops it at once).
    """

    clock: Callable[[], float]
    ttl: float = WRITE_LOG_TTL_SECONDS
    _by_service: dict[str, dict[str, _Written]] = field(default_factory=dict)

    def record(self, service: str, name: str, obj: Obj | None, uid: str, generation: int) -> None:
        self._by_service.setdefault(service, {})[name] = _Written(
            obj, uid, generation, self.clock()
        )

    def replace(self, service: str, fresh: Sequence[Obj], seen: Mapping[str, Obj]) -> None:
        """Adopt a fresh list read from the API: it wins over both the log and the informer."""
        entries: dict[str, _Written] = {}
        now = self.clock()
        for obj in fresh:
            entries[obj["metadata"]["name"]] = _Written(obj, _uid(obj), _generation(obj), now)
        for name, obj in seen.items():
            if name not in entries:
                entries[name] = _Written(None, _uid(obj), _generation(obj), now)
        self._by_service[service] = entries

    def forget(self, service: str) -> None:
        self._by_service.pop(service, None)

    def view(self, service: str, seen: Mapping[str, Obj]) -> dict[str, Obj]:
        """The slices of `service`: the informer's, overridden where our writes are newer."""
        entries = self._by_service.get(service, {})
        out = dict(seen)
        now = self.clock()
        for name, w in list(entries.items()):
            current = seen.get(name)
            if now - w.at > self.ttl:
                del entries[name]
            elif w.obj is None:
                if current is None or _uid(current) != w.uid:
                    del entries[name]  # the informer saw the delete (or a new object)
                else:
                    out.pop(name)
            elif current is not None and w.caught_up(current):
                del entries[name]
            else:
                out[name] = w.obj
        if not entries:
            self._by_service.pop(service, None)
        return out


class Conflict(Exception):
    """Writes kept conflicting within one sync; the key is retried with backoff."""


def _min_interval_from_env() -> float:
    raw = os.environ.get(ENV_MIN_WRITE_INTERVAL)
    if raw is None:
        return MIN_WRITE_INTERVAL_SECONDS
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.warning("ignoring a bad write interval", extra={"value": raw})
        return MIN_WRITE_INTERVAL_SECONDS


class _Options(Protocol):
    """What this controller reads of the runner's process-wide options."""

    @property
    def identity(self) -> str: ...


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class EndpointsController:
    def __init__(
        self,
        rest: Rest,
        *,
        workers: int = WORKERS,
        min_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.rest = rest
        self.workers = workers
        self.min_interval = _min_interval_from_env() if min_interval is None else min_interval
        self.clock = clock
        self.wall = wall
        self.events = EventRecorder(
            rest, REPORTING_CONTROLLER, f"{socket.gethostname()}-{os.getpid()}"
        )
        self.workloads = Informer(rest, SERVICEWORKLOADS, resync_seconds=RESYNC_SECONDS)
        self.pods = Informer(rest, PODS, label_selector=LABEL_WORKLOAD, transform=slim_pod)
        self.services = Informer(rest, SERVICES)
        self.slices = Informer(
            rest,
            ENDPOINTSLICES,
            label_selector=f"{LABEL_MANAGED_BY}={ENDPOINTSLICE_MANAGED_BY}",
        )
        self.nodes = Informer(rest, NODES, transform=slim_node)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=clock)
        self.limiter = RateLimiter(WRITE_QPS, WRITE_BURST, clock=clock)
        self.written = WriteLog(clock)
        self.pods_of: dict[str, set[str]] = defaultdict(set)  # workload key -> pod keys
        self.slices_of: dict[str, set[str]] = defaultdict(set)  # service key -> slice keys
        self.last_write: dict[str, float] = {}
        self.held_until: dict[str, float] = {}
        self.first_change: dict[str, float] = {}
        self.counts: dict[str, tuple[int, int]] = {}  # key -> (ready, not ready) endpoints
        self.reported: set[tuple[str, str]] = set()  # (workload uid, foreign Service uid)
        self.workloads.add_handler(self._on_workload)
        self.pods.add_handler(self._on_pod)
        self.services.add_handler(self._on_service)
        self.slices.add_handler(self._on_slice)
        self.nodes.add_handler(self._on_node)
        metrics.ENDPOINTS_QUEUE_DEPTH.set_function(lambda: len(self.queue))

    def configure(self, options: _Options) -> None:
        """The operator process's identity names this replica on the Events it writes."""
        self.events.instance = options.identity[:128]

    # Observe ------------------------------------------------------------------------------

    def enqueue(self, key: str) -> None:
        """Queue a workload, unless a coalescing timer for it is pending (it will fire)."""
        if self.held_until.get(key, 0.0) > self.clock():
            return
        self.queue.add(key)

    def _on_workload(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        self.enqueue(object_key(obj))

    def _on_pod(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        before, after = _workload_of(old), _workload_of(obj)
        if kind == "DELETED":
            after = None
            before = before or _workload_of(obj)
        if before and before != after:
            self.pods_of[before].discard(key)
            if not self.pods_of[before]:
                del self.pods_of[before]
        if after:
            self.pods_of[after].add(key)
        relevant = kind != "MODIFIED" or old is None or _endpoint_facts(old) != _endpoint_facts(obj)
        if not relevant:
            return
        for wkey in {before, after} - {None}:
            assert wkey is not None
            self.first_change.setdefault(wkey, self.clock())
            self.enqueue(wkey)

    def _on_service(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        key = object_key(obj)
        if self.workloads.get(key) is not None:
            self.enqueue(key)

    def _on_slice(self, kind: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        before, after = _service_of_slice(old), _service_of_slice(obj)
        if kind == "DELETED":
            before, after = before or after, None
        if before and before != after:
            self.slices_of[before].discard(key)
            if not self.slices_of[before]:
                del self.slices_of[before]
        if after:
            self.slices_of[after].add(key)
        for skey in {before, after} - {None}:
            assert skey is not None
            if self.workloads.get(skey) is not None:
                self.enqueue(skey)

    def _on_node(self, kind: str, obj: Obj, old: Obj | None) -> None:
        if kind == "SYNC":
            return
        zone = (obj["metadata"].get("labels") or {}).get(names.LABEL_ZONE)
        was = ((old or {}).get("metadata", {}).get("labels") or {}).get(names.LABEL_ZONE)
        if old is not None and zone == was:
            return
        node = obj["metadata"]["name"]
        for wkey, pod_keys in list(self.pods_of.items()):
            for pkey in pod_keys:
                pod = self.pods.get(pkey)
                if pod is not None and pod["spec"].get("nodeName") == node:
                    self.enqueue(wkey)
                    break

    def zone_of(self, node: str) -> str | None:
        obj = self.nodes.get(node)
        return None if obj is None else (obj["metadata"].get("labels") or {}).get(names.LABEL_ZONE)

    # Act ----------------------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        """One workload, end to end; the one place failures are counted and reported (the
        work queue logs them and retries the key with backoff)."""
        try:
            await self._sync(key)
        except ApiError as e:
            if namespace_terminating(e):
                # Everything in the namespace is going, the workload with it: nothing to do.
                log.debug("namespace terminating", extra={"workload": key})
                self._forget(key)
                return
            await self._failed(key, e)
            raise
        except Exception as e:
            await self._failed(key, e)
            raise

    async def _failed(self, key: str, error: Exception) -> None:
        metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
        sw = self.workloads.get(key)
        if sw is None or isinstance(error, Conflict):
            return  # a conflict streak is retried, not news; a gone workload has no events
        await self.events.emit(
            sw,
            REASON_SYNC_FAILED,
            f"Service or EndpointSlices could not be written: {error}",
            action=ACTION_MANAGE_ENDPOINTS,
            type_="Warning",
        )

    async def _sync(self, key: str) -> None:
        self.held_until.pop(key, None)
        sw = self.workloads.get(key)
        if sw is None or sw["metadata"].get("deletionTimestamp"):
            # Deleted: the Service and its slices go by garbage collection (ownerReferences).
            self._forget(key)
            return
        spec = self._service_spec(sw)
        svc = await self._ensure_service(key, sw, spec)
        pods = [p for p in (self.pods.get(k) for k in sorted(self.pods_of.get(key, ()))) if p]
        if spec is None:
            self._forget(key)
            await self._mark_drained(key, pods)  # no Service: nothing routes to them
            return
        if svc is None:
            return  # someone else's Service, or ours being deleted: nothing to write into
        desired = desired_endpoints(pods, spec.ports, self.zone_of)
        if not await self._write_slices(key, svc, desired):
            return  # coalesced: a timer brings the key back
        ready = sum(1 for g in desired.values() for ep in g.values() if ep.ready)
        total = sum(len(g) for g in desired.values())
        self._count(key, (ready, total - ready))
        await self._mark_drained(key, pods)

    def _service_spec(self, sw: Obj) -> ServiceSpec | None:
        raw = (sw.get("spec") or {}).get("service")
        if raw is None:
            return None
        try:
            return ServiceSpec.model_validate(raw)
        except ValidationError as e:  # the CRD schema should have refused it
            log.warning(
                "invalid spec.service; Service left as it is",
                extra={"workload": object_key(sw), "error": str(e)},
            )
            raise

    async def _ensure_service(self, key: str, sw: Obj, spec: ServiceSpec | None) -> Obj | None:
        """The workload's Service as it now is (created or patched as needed), or None when
        there is none to write slices for."""
        ns, name = key.split("/", 1)
        svc = self.services.get(key)
        for _ in range(MAX_ATTEMPTS):
            decision = decide_service(sw, spec, svc)
            try:
                if decision.verb == "ok":
                    return svc
                if decision.verb in ("wait", "foreign"):
                    if decision.verb == "foreign":
                        await self._report_foreign(sw, decision.body)
                    return None
                await self.limiter.acquire()
                if decision.verb == "create":
                    svc = await self.rest.create(SERVICES.path(ns), decision.body)
                    log.info(
                        "service created", extra={"service": key, "clusterIP": _cluster_ip(svc)}
                    )
                    return svc
                if decision.verb == "patch":
                    svc = await self.rest.patch(SERVICES.path(ns, name), decision.body, JSON_PATCH)
                    log.info("service ports updated", extra={"service": key})
                    return svc
                # delete: spec.service was removed; the slices follow by garbage collection
                body = decision.body["metadata"]
                await self.rest.delete(
                    SERVICES.path(ns, name),
                    {
                        "preconditions": {
                            "uid": body["uid"],
                            "resourceVersion": body["resourceVersion"],
                        }
                    },
                )
                log.info("service deleted: spec.service unset", extra={"service": key})
                return None
            except ApiError as e:
                if not (e.conflict or e.not_found or e.status == 422):
                    raise
                metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
                svc = await self._get(SERVICES.path(ns, name))
        raise Conflict(f"service {key} kept changing while it was being written")

    async def _get(self, path: str) -> Obj | None:
        try:
            return slim(await self.rest.get(path))
        except ApiError as e:
            if e.not_found:
                return None
            raise

    async def _report_foreign(self, sw: Obj, svc: Obj) -> None:
        """Say once per (workload, Service) that the name is taken, on the workload's events."""
        mark = (_uid(sw), _uid(svc))
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
        await self.events.emit(
            sw, REASON_SERVICE_NOT_OWNED, note, action=ACTION_MANAGE_SERVICE, type_="Warning"
        )

    def _seen_slices(self, key: str) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for skey in self.slices_of.get(key, ()):
            obj = self.slices.get(skey)
            if obj is not None:
                out[obj["metadata"]["name"]] = obj
        return out

    async def _write_slices(
        self, key: str, svc: Obj, desired: Mapping[PortSet, Mapping[str, Endpoint]]
    ) -> bool:
        """Plan and write until the slices hold `desired`; False when coalescing deferred it."""
        name = svc["metadata"]["name"]
        uid = _uid(svc)
        for attempt in range(MAX_ATTEMPTS):
            view = self.written.view(key, self._seen_slices(key))
            plan = plan_slices(desired, [parse_slice(o, name, uid) for o in view.values()])
            if plan.empty:
                self.first_change.pop(key, None)
                return True
            if attempt == 0 and self._hold(key):
                return False
            if await self._apply(key, svc, view, plan):
                now = self.clock()
                self.last_write[key] = now
                seen = self.first_change.pop(key, None)
                if seen is not None:
                    metrics.ENDPOINTS_SYNC_SECONDS.observe(now - seen)
                return True
            metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
            await self._relist(key, name)
        raise Conflict(f"slices of {key} kept changing while they were being written")

    def _hold(self, key: str) -> bool:
        """Coalesce: if this service was written less than min_interval ago, come back then."""
        last = self.last_write.get(key)
        if last is None:
            return False
        wait = last + self.min_interval - self.clock()
        if wait <= 0:
            return False
        self.held_until[key] = self.clock() + wait
        self.queue.add_after(key, wait)
        return True

    async def _relist(self, key: str, service_name: str) -> None:
        ns = key.split("/", 1)[0]
        selector = ",".join(f"{k}={v}" for k, v in slice_labels(service_name).items())
        items, _ = await self.rest.list_pages(ENDPOINTSLICES.path(ns), {"labelSelector": selector})
        self.written.replace(key, [slim(o) for o in items], self._seen_slices(key))

    async def _apply(self, key: str, svc: Obj, view: Mapping[str, Obj], plan: SlicePlan) -> bool:
        """Creates and updates (concurrently), then deletes; True when every write succeeded.

        Deletes wait for the rest so an endpoint moving out of a deleted slice is already in
        its new one; a failed write stops the round and the caller re-reads and re-plans.
        """
        ns = key.split("/", 1)[0]

        async def create(c: SliceCreate) -> None:
            await self.limiter.acquire()
            out = await self.rest.create(
                ENDPOINTSLICES.path(ns), slice_body(svc, c.ports, c.endpoints)
            )
            self._wrote(key, out, "create")

        async def update(u: SliceUpdate) -> None:
            body = slice_body(svc, u.ports, u.endpoints, base=view[u.name])
            body["metadata"]["resourceVersion"] = u.resource_version
            await self.limiter.acquire()
            out = await self.rest.replace(ENDPOINTSLICES.path(ns, u.name), body)
            self._wrote(key, out, "update")

        async def delete(d: SliceDelete) -> None:
            obj = view[d.name]
            await self.limiter.acquire()
            try:
                await self.rest.delete(
                    ENDPOINTSLICES.path(ns, d.name),
                    {"preconditions": {"uid": _uid(obj), "resourceVersion": d.resource_version}},
                )
            except ApiError as e:
                if not e.not_found:
                    raise
            self.written.record(key, d.name, None, _uid(obj), _generation(obj))
            metrics.ENDPOINTS_SLICE_WRITES.labels("delete").inc()

        first = [*(create(c) for c in plan.creates), *(update(u) for u in plan.updates)]
        if not await self._all_ok(first):
            return False
        return await self._all_ok([delete(d) for d in plan.deletes])

    def _wrote(self, key: str, obj: Obj, verb: str) -> None:
        obj = slim(obj)
        self.written.record(key, obj["metadata"]["name"], obj, _uid(obj), _generation(obj))
        metrics.ENDPOINTS_SLICE_WRITES.labels(verb).inc()

    async def _all_ok(self, writes: Sequence[Any]) -> bool:
        results = await asyncio.gather(*writes, return_exceptions=True)
        ok = True
        for r in results:
            if isinstance(r, ApiError) and (r.conflict or r.not_found or r.status == 422):
                ok = False
            elif isinstance(r, BaseException):
                raise r
        return ok

    async def _mark_drained(self, key: str, pods: Sequence[Obj]) -> None:
        """Tell owners that draining pods are out of rotation: the slices as written (or as
        they already were) show them not ready and terminating, or not at all."""
        todo = [p for p in pods if is_draining(p) and not is_drained(p)]
        if not todo:
            return
        now = rfc3339(self.wall())

        async def mark(pod: Obj) -> None:
            meta = pod["metadata"]
            await self.limiter.acquire()
            try:
                await self.rest.patch(
                    PODS.path(meta["namespace"], meta["name"]), drained_patch(pod, now), JSON_PATCH
                )
            except ApiError as e:
                if e.not_found:
                    return
                if e.conflict or e.status == 422:  # changed since read: decide again
                    metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
                    self.queue.add_after(key, DRAIN_RETRY_SECONDS)
                    return
                raise
            metrics.ENDPOINTS_DRAINED.inc()
            log.info("pod out of rotation", extra={"pod": object_key(pod), "drainedAt": now})

        results = await asyncio.gather(*(mark(p) for p in todo), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def _count(self, key: str, counts: tuple[int, int]) -> None:
        self.counts[key] = counts
        metrics.ENDPOINTS.labels("true").set(sum(c[0] for c in self.counts.values()))
        metrics.ENDPOINTS.labels("false").set(sum(c[1] for c in self.counts.values()))

    def _forget(self, key: str) -> None:
        self.written.forget(key)
        self.last_write.pop(key, None)
        self.first_change.pop(key, None)
        if key in self.counts:
            self._count(key, (0, 0))
            del self.counts[key]

    async def run(self) -> None:
        informers = (self.nodes, self.workloads, self.services, self.slices, self.pods)
        tasks = [asyncio.create_task(i.run()) for i in informers]
        try:
            # Plan only from a full view: a sync before the slices are listed would create
            # every slice again.
            await asyncio.gather(*(i.synced.wait() for i in informers))
            await asyncio.gather(*tasks, self.queue.run(self.workers, self.sync))
        finally:
            for t in tasks:
                t.cancel()


def namespace_terminating(e: ApiError) -> bool:
    """A write refused because its namespace is being deleted (403, NamespaceTerminating)."""
    causes = ((e.body.get("details") or {}).get("causes")) or []
    return e.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes)


def _cluster_ip(svc: Obj) -> str | None:
    return (svc.get("spec") or {}).get("clusterIP")
