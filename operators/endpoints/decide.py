"""What the endpoints controller decides, from what it observed: pure, no I/O, no clock read.

`decide` is the one entry point: from a workload, its Service, its pods and the Service's
slices (all as the informers show them) and the pacing state, a `Plan`: what to do to the
Service (`decide_service`), the slice writes (`planner.plan_slices` over `desired_endpoints`),
the draining pods to mark drained once those writes have succeeded, and whether the slice
writes are held back to coalesce a burst.

Never re-create the Service: its ClusterIP is allocated at creation and must stay for life.
A pod must leave rotation (not ready, terminating) *before* its owner stops it, and the
owner only learns it from `pilotfish.io/drained-at`, written after the slice write.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from pilotfish import names
from pilotfish.api.serviceworkload import ServicePort, ServiceSpec
from pilotfish.kube.informer import Obj
from pilotfish.operators.endpoints.model import (
    ADDRESS_TYPE,
    LABEL_APP_MANAGED_BY,
    SW_KIND,
    TERMINAL_PHASES,
    Endpoint,
    Port,
    PortSet,
    controller_ref,
    has_condition,
    ipv4_address,
    is_drained,
    is_draining,
    owned_by,
    parse_slice,
    port_set,
    slice_labels,
    uid_of,
)
from pilotfish.operators.endpoints.planner import SlicePlan, plan_slices
from pilotfish.workloads import ANNOTATION_DRAINED, LABEL_WORKLOAD

# --- What the slices should say -----------------------------------------------------------


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
    ready = has_condition(pod, "Ready")
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


# --- The Service ----------------------------------------------------------------------


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
    uid = uid_of(sw)
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


# --- Write bodies -----------------------------------------------------------------------


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


# --- The whole decision -------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """One workload's world as the informers show it, and when its slices were last written."""

    workload: Obj | None
    service: Obj | None  # the Service named after the workload, whoever owns it
    pods: Sequence[Obj]  # the pods labelled as the workload's
    slices: Sequence[Obj]  # Pilotfish's slices labelled with the Service's name
    zone_of: Callable[[str], str | None]
    now: float  # monotonic seconds
    last_write: float | None  # monotonic seconds of the last slice write, None if none
    min_interval: float


@dataclass(frozen=True)
class Plan:
    service: ServiceDecision = field(default_factory=lambda: ServiceDecision("ok"))
    # The Service the slices belong to (their owner), when slices are to be written.
    owner: Obj | None = None
    slices: SlicePlan = field(default_factory=SlicePlan)
    current: Mapping[str, Obj] = field(default_factory=dict)  # the slices planned from
    # Draining pods to mark drained, only once every slice write has succeeded.
    drain: tuple[Obj, ...] = ()
    # > 0: the slice writes are deferred this long (another write went out just now).
    hold: float = 0.0
    # (ready, not ready) endpoints published; None when the workload publishes none.
    counts: tuple[int, int] | None = None
    # The workload is gone: forget what is kept about it (its objects go by garbage collection).
    gone: bool = False
    # spec.service is invalid (the CRD schema should have refused it): what is wrong.
    invalid: str | None = None


def service_spec(sw: Obj) -> ServiceSpec | None:
    """spec.service, validated; ValidationError names the field and the rule."""
    raw = (sw.get("spec") or {}).get("service")
    return None if raw is None else ServiceSpec.model_validate(raw)


def decide(seen: Observed) -> Plan:
    sw = seen.workload
    if sw is None or (sw.get("metadata") or {}).get("deletionTimestamp"):
        return Plan(gone=True)
    try:
        spec = service_spec(sw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(["spec", "service", *(str(p) for p in first["loc"])])
        return Plan(invalid=f"{where}: {first['msg']} (got {first.get('input')!r})")
    service = decide_service(sw, spec, seen.service)
    draining = tuple(p for p in seen.pods if is_draining(p) and not is_drained(p))
    if spec is None:
        return Plan(service=service, drain=draining)  # no Service: nothing routes to them
    if service.verb not in ("ok", "patch") or seen.service is None:
        # Created this round: its slices are planned once the informer shows it (they are
        # owned by its uid). Someone else's, or ours being deleted: nothing to write into.
        return Plan(service=service)
    svc = seen.service
    desired = desired_endpoints(seen.pods, spec.ports, seen.zone_of)
    name, uid = svc["metadata"]["name"], uid_of(svc)
    slices = plan_slices(desired, [parse_slice(o, name, uid) for o in seen.slices])
    ready = sum(1 for g in desired.values() for ep in g.values() if ep.ready)
    total = sum(len(g) for g in desired.values())
    current = {o["metadata"]["name"]: o for o in seen.slices}
    plan = Plan(service, svc, slices, current, draining, counts=(ready, total - ready))
    if slices.empty or seen.last_write is None:
        return plan
    wait = seen.last_write + seen.min_interval - seen.now
    if wait <= 0:
        return plan
    return Plan(service, svc, hold=wait, counts=plan.counts)
