"""What the endpoints controller decides from pods, workloads and Services (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish.api.serviceworkload import ServicePort, ServiceSpec
from pilotfish.kube import projections
from pilotfish.kube.rest import ApiError
from pilotfish.operators.endpoints.apply import namespace_terminating
from pilotfish.operators.endpoints.decide import (
    Observed,
    decide,
    decide_service,
    desired_endpoints,
    drained_patch,
    pod_endpoint,
    resolve_ports,
    slice_body,
)
from pilotfish.operators.endpoints.model import (
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    Endpoint,
    Port,
    endpoint_facts,
    parse_slice,
)
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


def test_the_process_pod_projection_keeps_what_endpoints_need() -> None:
    """The shared pod view is the union of what every controller reads: dropping a field
    the endpoints are made of would publish wrong endpoints (or none)."""
    full = pod(
        annotations={ANNOTATION_DRAIN: "x", ANNOTATION_DRAINED: "y"},
        ports=[{"name": "web", "containerPort": 8080}],
        deleting=True,
    )
    full["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    full["spec"]["containers"][0]["env"] = [{"name": "BIG", "value": "y" * 1000}]
    view = projections.pod(full)
    assert "managedFields" not in view["metadata"]
    assert "env" not in view["spec"]["containers"][0]
    assert pod_endpoint(view, None) == pod_endpoint(full, None)
    assert endpoint_facts(view) == endpoint_facts(full)
    ports = [ServicePort(name="http", port=80, target_port="web")]
    assert resolve_ports(ports, view) == resolve_ports(ports, full) != ()


def test_only_endpoint_facts_make_a_pod_change_relevant() -> None:
    a = pod()
    b = pod()
    b["metadata"]["resourceVersion"] = "43"
    b["spec"]["schedulingGates"] = [{"name": "x"}]
    assert endpoint_facts(a) == endpoint_facts(b)
    for change in (
        pod(ready=False),
        pod(ip="10.1.0.6"),
        pod(deleting=True),
        pod(annotations={ANNOTATION_DRAIN: "x"}),
        pod(phase="Succeeded"),
        pod(ports=[{"name": "web", "containerPort": 1}]),
    ):
        assert endpoint_facts(change) != endpoint_facts(a)


def test_writes_into_a_terminating_namespace_are_recognised() -> None:
    body = {
        "reason": "Forbidden",
        "details": {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
    }
    assert namespace_terminating(ApiError(403, "Forbidden", "being terminated", body))
    assert not namespace_terminating(ApiError(403, "Forbidden", "RBAC says no", {"details": {}}))


# --- The whole decision -------------------------------------------------------------------

SVC_PORTS = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]


def observed(
    sw: dict[str, Any] | None,
    svc: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    *,
    slices: list[dict[str, Any]] | None = None,
    now: float = 100.0,
    last_write: float | None = None,
) -> Observed:
    return Observed(
        workload=sw,
        service=svc,
        pods=pods,
        slices=slices or [],
        zone_of=lambda _node: "zone-a",
        now=now,
        last_write=last_write,
        min_interval=1.0,
    )


def test_a_new_service_is_created_alone_its_slices_wait_for_its_uid() -> None:
    plan = decide(observed(workload({"ports": SVC_PORTS}), None, [pod()]))
    assert plan.service.verb == "create"
    assert plan.slices.empty and plan.owner is None and plan.drain == ()


def test_slices_are_planned_from_the_observed_service() -> None:
    svc = service(SVC_PORTS)
    draining = pod("web-2", ip="10.1.0.6", annotations={ANNOTATION_DRAIN: "t"})
    plan = decide(observed(workload({"ports": SVC_PORTS}), svc, [pod(), draining]))
    assert plan.service.verb == "ok" and plan.owner is svc
    (create,) = plan.slices.creates
    assert [e.pod for e in create.endpoints] == ["web-1", "web-2"]
    assert [p["metadata"]["name"] for p in plan.drain] == ["web-2"]
    assert plan.counts == (1, 1) and plan.hold == 0


def test_a_change_right_after_a_write_is_held_with_its_drains() -> None:
    svc = service(SVC_PORTS)
    draining = pod(annotations={ANNOTATION_DRAIN: "t"})
    sw = workload({"ports": SVC_PORTS})
    plan = decide(observed(sw, svc, [draining], now=100.0, last_write=99.75))
    assert plan.hold == pytest.approx(0.75)
    assert plan.slices.empty and plan.drain == (), "drained-at only after the slice write"
    later = decide(observed(sw, svc, [draining], now=101.0, last_write=99.75))
    assert later.hold == 0 and not later.slices.empty and len(later.drain) == 1


def test_nothing_to_write_is_never_held() -> None:
    svc = service(SVC_PORTS)
    sw = workload({"ports": SVC_PORTS})
    first = decide(observed(sw, svc, [pod()]))
    (create,) = first.slices.creates
    existing = slice_body(svc, create.ports, create.endpoints)
    existing["metadata"] |= {"name": "web-abcde", "resourceVersion": "3", "uid": "s1"}
    plan = decide(observed(sw, svc, [pod()], slices=[existing], now=100.0, last_write=99.9))
    assert plan.slices.empty and plan.hold == 0 and plan.counts == (1, 0)


def test_no_service_wanted_drains_at_once() -> None:
    draining = pod(annotations={ANNOTATION_DRAIN: "t"})
    plan = decide(observed(workload(), None, [draining]))
    assert plan.service.verb == "ok" and plan.slices.empty and len(plan.drain) == 1
    assert plan.counts is None


def test_a_gone_or_deleting_workload_is_forgotten() -> None:
    assert decide(observed(None, None, [])).gone
    sw = workload({"ports": SVC_PORTS})
    sw["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    assert decide(observed(sw, service(SVC_PORTS), [pod()])).gone


def test_an_invalid_service_spec_names_the_field() -> None:
    plan = decide(observed(workload({"ports": [{"name": "http", "port": 0}]}), None, []))
    assert plan.invalid is not None and plan.invalid.startswith("spec.service")
    assert plan.invalid.startswith("spec.service.ports.0.port:") and "got 0" in plan.invalid
    assert plan.service.verb == "ok"
