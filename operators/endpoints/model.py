"""What the endpoints controller reads: the wire model of endpoints and slices, and the few
facts of pods, Services and slices it is made of.

Everything here is pure. Endpoints and slices are parsed into one canonical form, used both
to plan and to compare, so "does this slice already say that" is an equality test.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish.kube.informer import Obj
from pilotfish.kube.rest import Resource
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    ENDPOINTSLICE_MANAGED_BY,
    LABEL_WORKLOAD,
)

CONTROLLER: Final = "endpoints"

SERVICES: Final = Resource("", "v1", "services")
ENDPOINTSLICES: Final = Resource("discovery.k8s.io", "v1", "endpointslices")

LABEL_MANAGED_BY: Final = "endpointslice.kubernetes.io/managed-by"
LABEL_SERVICE_NAME: Final = "kubernetes.io/service-name"
LABEL_APP_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
ADDRESS_TYPE: Final = "IPv4"
SW_KIND: Final = "ServiceWorkload"

REASON_SERVICE_NOT_OWNED: Final = "ServiceNotOwned"
REASON_SYNC_FAILED: Final = "EndpointsSyncFailed"
ACTION_MANAGE_SERVICE: Final = "ManageService"
ACTION_MANAGE_ENDPOINTS: Final = "ManageEndpoints"

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


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


# --- Objects' metadata --------------------------------------------------------------------


def uid_of(obj: Obj) -> str:
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


# --- Pods ---------------------------------------------------------------------------------


def has_condition(pod: Obj, kind: str) -> bool:
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


def workload_of(pod: Obj | None) -> str | None:
    """The key of the ServiceWorkload a pod serves (its workload label), if any."""
    if pod is None:
        return None
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_WORKLOAD)
    return f"{meta.get('namespace')}/{name}" if name else None


def endpoint_facts(pod: Obj) -> tuple[Any, ...]:
    """What of a pod can change its endpoint: a change elsewhere (a field another controller
    reads from the shared pod view, or only the resourceVersion) is not worth a reconcile."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ann = meta.get("annotations") or {}
    return (
        (meta.get("labels") or {}).get(LABEL_WORKLOAD),
        ann.get(ANNOTATION_DRAIN),
        ann.get(ANNOTATION_DRAINED),
        bool(meta.get("deletionTimestamp")),
        spec.get("nodeName"),
        [(c.get("name"), c.get("ports")) for c in spec.get("containers") or []],
        status.get("phase"),
        ipv4_address(pod),
        has_condition(pod, "Ready"),
    )


# --- Slices -------------------------------------------------------------------------------


def slice_labels(service_name: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: ENDPOINTSLICE_MANAGED_BY, LABEL_SERVICE_NAME: service_name}


def service_of_slice(obj: Obj | None) -> str | None:
    """The key of the Service a slice belongs to (its service-name label), if any."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
    return f"{meta.get('namespace')}/{name}" if name else None


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
