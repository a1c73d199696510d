"""What the endpoints controller decides from pods, workloads and Services (no I/O)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pilotfish.api.serviceworkload import ServicePort, ServiceSpec
from pilotfish.kube.rest import ApiError
from pilotfish.operators.endpoints import (
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    Endpoint,
    Port,
    WriteLog,
    decide_service,
    desired_endpoints,
    drained_patch,
    namespace_terminating,
    parse_slice,
    pod_endpoint,
    resolve_ports,
    rfc3339,
    slice_body,
    slim_pod,
)
from pilotfish.timeutil import parse_time
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    ENDPOINTSLICE_MANAGED_BY,
    LABEL_WORKLOAD,
)

SW_UID = "sw-uid"
SVC_UID = "svc-uid"


def pod(
    name: str = "web-1",
    *,
    ip: str | None = "10.1.0.5",
    ready: bool = True,
    phase: str = "Running",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "resourceVersion": "42",
        "labels": {LABEL_WORKLOAD: "web"},
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "metadata": meta,
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "ports": ports or []}]},
        "status": status,
    }


def workload(service: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"team": "t", "template": {}}
    if service is not None:
        spec["service"] = service
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": "web", "namespace": "ns", "uid": SW_UID},
        "spec": spec,
    }


def service(
    ports: list[dict[str, Any]], *, owner: str | None = SW_UID, selector: Any = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "web",
        "namespace": "ns",
        "uid": SVC_UID,
        "resourceVersion": "9",
    }
    if owner:
        meta["ownerReferences"] = [
            {"kind": "ServiceWorkload", "name": "web", "uid": owner, "controller": True}
        ]
    spec: dict[str, Any] = {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": ports}
    if selector:
        spec["selector"] = selector
    return {"metadata": meta, "spec": spec}


HTTP = ServiceSpec.model_validate({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]})


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, (True, True, False)),
        ({"ready": False}, (False, False, False)),
        ({"deleting": True}, (False, True, True)),
        ({"annotations": {ANNOTATION_DRAIN: "2030-01-01T00:00:00Z"}}, (False, True, True)),
        ({"ready": False, "deleting": True}, (False, False, True)),
    ],
)
def test_conditions(kwargs: dict[str, Any], want: tuple[bool, bool, bool]) -> None:
    ep = pod_endpoint(pod(**kwargs), "zone-a")
    assert ep is not None
    assert (ep.ready, ep.serving, ep.terminating) == want


@pytest.mark.parametrize(
    "kwargs", [{"ip": None}, {"phase": "Succeeded"}, {"phase": "Failed"}, {"ip": "fd00::5"}]
)
def test_pods_without_an_ipv4_address_or_finished_have_no_endpoint(
    kwargs: dict[str, Any],
) -> None:
    assert pod_endpoint(pod(**kwargs), None) is None


def test_endpoint_wire_form() -> None:
    ep = pod_endpoint(pod(), "zone-a")
    assert ep is not None
    assert ep.wire() == {
        "addresses": ["10.1.0.5"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "nodeName": "node-1",
        "zone": "zone-a",
        "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "ns", "uid": "uid-web-1"},
    }
    assert Endpoint.from_wire(ep.wire()) == ep


def test_named_target_ports_resolve_per_pod() -> None:
    ports = [
        ServicePort(name="http", port=80, target_port="web"),
        ServicePort(name="dns", port=53, protocol="UDP", target_port="dns"),
        ServicePort(name="admin", port=9000),
    ]
    p = pod(
        ports=[
            {"name": "web", "containerPort": 8080},
            {"name": "dns", "containerPort": 5353, "protocol": "TCP"},  # wrong protocol
        ]
    )
    assert resolve_ports(ports, p) == (
        Port("admin", 9000, "TCP"),
        Port("http", 8080, "TCP"),
    )


def test_pods_resolving_ports_differently_are_grouped_apart() -> None:
    ports = [ServicePort(name="http", port=80, target_port="web")]
    a = pod("a", ip="10.1.0.1", ports=[{"name": "web", "containerPort": 8080}])
    b = pod("b", ip="10.1.0.2", ports=[{"name": "web", "containerPort": 9090}])
    none = pod("c", ip="10.1.0.3", ports=[])
    groups = desired_endpoints([a, b, none], ports, lambda node: "zone-a")
    assert sorted(groups) == [(Port("http", 8080, "TCP"),), (Port("http", 9090, "TCP"),)]
    assert all(e.zone == "zone-a" for g in groups.values() for e in g.values())


def test_new_service_has_no_selector_and_is_owned_by_the_workload() -> None:
    d = decide_service(workload({"ports": [{"name": "http", "port": 80}]}), HTTP, None)
    assert d.verb == "create"
    body = d.body
    assert "selector" not in body["spec"] and body["spec"]["type"] == "ClusterIP"
    assert body["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}
    ]
    (ref,) = body["metadata"]["ownerReferences"]
    assert ref["uid"] == SW_UID and ref["controller"] is True and ref["kind"] == "ServiceWorkload"


def test_target_port_defaults_to_port() -> None:
    spec = ServiceSpec.model_validate({"ports": [{"name": "http", "port": 80}]})
    body = decide_service(workload(), spec, None).body
    assert body["spec"]["ports"][0]["targetPort"] == 80


def test_matching_service_is_left_alone() -> None:
    svc = service([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}])
    assert decide_service(workload(), HTTP, svc).verb == "ok"


def test_changed_ports_are_patched_in_place_under_a_version_test() -> None:
    svc = service([{"name": "http", "port": 81, "targetPort": 8080, "protocol": "TCP"}])
    d = decide_service(workload(), HTTP, svc)
    assert d.verb == "patch"
    assert d.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "9"}
    assert d.body[1]["path"] == "/spec/ports" and d.body[1]["value"][0]["port"] == 80
    assert all("clusterIP" not in op["path"] for op in d.body)


def test_a_selector_added_to_our_service_is_removed() -> None:
    svc = service(
        [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        selector={"app": "web"},
    )
    d = decide_service(workload(), HTTP, svc)
    assert d.verb == "patch" and d.body[1] == {"op": "remove", "path": "/spec/selector"}


@pytest.mark.parametrize("owner", [None, "someone-else"])
def test_someone_elses_service_is_not_touched(owner: str | None) -> None:
    svc = service([{"name": "other", "port": 1}], owner=owner)
    assert decide_service(workload(), HTTP, svc).verb == "foreign"
    assert decide_service(workload(), None, svc).verb == "ok", "never delete what is not ours"


def test_unset_service_deletes_ours() -> None:
    svc = service([{"name": "http", "port": 80}])
    d = decide_service(workload(), None, svc)
    assert d.verb == "delete" and d.body is svc


def test_slice_round_trip_and_ownership() -> None:
    svc = service([])
    ep = pod_endpoint(pod(), "zone-a")
    assert ep is not None
    body = slice_body(svc, (Port("http", 8080, "TCP"),), [ep])
    assert body["metadata"]["generateName"] == "web-"
    assert body["metadata"]["labels"] == {
        LABEL_MANAGED_BY: ENDPOINTSLICE_MANAGED_BY,
        LABEL_SERVICE_NAME: "web",
    }
    assert body["metadata"]["ownerReferences"][0]["uid"] == SVC_UID
    assert body["addressType"] == "IPv4"
    body["metadata"] |= {"name": "web-abcde", "resourceVersion": "3"}
    parsed = parse_slice(body, "web", SVC_UID)
    assert parsed.meta_current and parsed.endpoints == (ep,)
    assert parsed.ports == (Port("http", 8080, "TCP"),)
    assert not parse_slice(body, "web", "a-new-service-uid").meta_current


def test_replace_keeps_others_metadata_and_fixes_ours() -> None:
    base = {
        "metadata": {
            "name": "web-abcde",
            "namespace": "ns",
            "resourceVersion": "3",
            "labels": {"team": "a", LABEL_SERVICE_NAME: "wrong"},
            "annotations": {"note": "kept"},
            "ownerReferences": [
                {"uid": "old", "controller": True},
                {"uid": "other", "controller": False},
            ],
        }
    }
    body = slice_body(service([]), (), [], base=base)
    meta = body["metadata"]
    assert meta["annotations"] == {"note": "kept"} and meta["resourceVersion"] == "3"
    assert meta["labels"]["team"] == "a" and meta["labels"][LABEL_SERVICE_NAME] == "web"
    assert [r["uid"] for r in meta["ownerReferences"]] == ["other", SVC_UID]


def test_drained_patch_is_conditional_and_escapes_the_key() -> None:
    ops = drained_patch(pod(), "2030-01-01T00:00:00.000000Z")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert ops[1] == {
        "op": "add",
        "path": "/metadata/annotations/pilotfish.io~1drained-at",
        "value": "2030-01-01T00:00:00.000000Z",
    }
    assert ANNOTATION_DRAINED == "pilotfish.io/drained-at"


def test_timestamps_are_rfc3339_utc_and_parse_back() -> None:
    t = datetime.datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    assert rfc3339(t) == "2030-05-06T07:08:09.123456Z"
    assert parse_time(rfc3339(t)) == t


def test_slim_pod_keeps_what_endpoints_need() -> None:
    full = pod(annotations={ANNOTATION_DRAIN: "x", "big": "y" * 1000})
    full["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    full["status"]["conditions"].append({"type": "PodScheduled", "status": "True"})
    slim = slim_pod(full)
    assert slim["metadata"]["annotations"] == {ANNOTATION_DRAIN: "x"}
    assert "managedFields" not in slim["metadata"]
    assert [c["type"] for c in slim["status"]["conditions"]] == ["Ready"]
    assert pod_endpoint(slim, None) == pod_endpoint(full, None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _slice(name: str, uid: str, generation: int, rv: str = "1") -> dict[str, Any]:
    meta = {"name": name, "uid": uid, "generation": generation, "resourceVersion": rv}
    return {"metadata": meta}


def test_write_log_shadows_a_lagging_informer_until_it_catches_up() -> None:
    clock = Clock()
    log = WriteLog(clock, ttl=30)
    created = _slice("a", "u1", 1, rv="5")
    log.record("ns/web", "a", created, "u1", 1)
    assert log.view("ns/web", {}) == {"a": created}, "a create the watch has not shown yet"
    updated = _slice("a", "u1", 2, rv="8")
    log.record("ns/web", "a", updated, "u1", 2)
    assert log.view("ns/web", {"a": created}) == {"a": updated}, "older informer copy"
    assert log.view("ns/web", {"a": updated}) == {"a": updated}
    assert log.view("ns/web", {}) == {}, "caught up: the informer is trusted again"


def test_write_log_keeps_a_fresh_read_over_a_copy_of_the_same_generation() -> None:
    """A metadata-only change leaves the generation alone: only the exact version counts."""
    log = WriteLog(Clock())
    stale, fresh = _slice("a", "u1", 3, rv="10"), _slice("a", "u1", 3, rv="12")
    log.record("ns/web", "a", fresh, "u1", 3)
    assert log.view("ns/web", {"a": stale}) == {"a": fresh}
    newer_spec = _slice("a", "u1", 4, rv="15")
    assert log.view("ns/web", {"a": newer_spec}) == {"a": newer_spec}


def test_write_log_hides_deleted_slices_and_expires() -> None:
    clock = Clock()
    log = WriteLog(clock, ttl=30)
    stale = _slice("a", "u1", 3)
    log.record("ns/web", "a", None, "u1", 3)
    assert log.view("ns/web", {"a": stale}) == {}
    clock.now = 31
    assert log.view("ns/web", {"a": stale}) == {"a": stale}, "expired: trust the informer"


def test_write_log_adopts_a_fresh_list() -> None:
    log = WriteLog(Clock())
    seen = {"a": _slice("a", "u1", 1), "b": _slice("b", "u2", 1)}
    fresh_b = _slice("b", "u2", 5, rv="9")
    log.replace("ns/web", [fresh_b], seen)
    assert log.view("ns/web", seen) == {"b": fresh_b}


def test_writes_into_a_terminating_namespace_are_recognised() -> None:
    body = {
        "reason": "Forbidden",
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
    }
    assert namespace_terminating(ApiError(403, "Forbidden", "being terminated", body))
    assert not namespace_terminating(ApiError(403, "Forbidden", "RBAC says no", {"details": {}}))
