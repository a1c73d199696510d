"""The endpoints controller against the real control plane: a Service whose ClusterIP never
changes, EndpointSlices that follow readiness through kwok, splits past 100 endpoints, the
drain handshake, garbage collection, and no fight with kube-controller-manager's own
EndpointSlice controller.

The pods come from the ServiceWorkload rollout controller when it is registered in the
operator; otherwise the test creates them itself, labelled and owned like the rollout
controller's (it checks at run time and never does both, so the two never fight over pods).
Readiness is flipped the way a readiness gate works: kwok keeps pods Ready, so the pods carry
a readinessGate whose condition the test sets through pods/status, together with the Ready
condition a kubelet would derive from it (kwok does not).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.operators.endpoints import (
    LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME,
    REASON_SERVICE_NOT_OWNED,
)
from pilotfish.operators.runner import CONTROLLERS
from pilotfish.timeutil import parse_time
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    ENDPOINTSLICE_MANAGED_BY,
    LABEL_WORKLOAD,
    MAX_ENDPOINTS_PER_SLICE,
)

pytestmark = pytest.mark.e2e

# Names under which a controller that creates a ServiceWorkload's pods may be registered.
ROLLOUT_CONTROLLERS: Final = ("serviceworkload", "rollout")
BUILTIN_MANAGED_BY: Final = "endpointslice-controller.k8s.io"
GATE: Final = "pilotfish.io/e2e-ready"
# The workloads' team, with a TeamQuota of its own: production pods of a team without one
# are refused at admission.
TEAM: Final = "e2e-endpoints"
PODS_TIMEOUT: Final = 240.0
SLICES_TIMEOUT: Final = 60.0

State = tuple[bool, bool, bool]  # ready, serving, terminating


def rollout_controller_registered() -> bool:
    return any(name in CONTROLLERS for name in ROLLOUT_CONTROLLERS)


@dataclass
class Workload:
    env: Env
    namespace: str
    name: str

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.env.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.env.api)

    def get(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.namespace, "serviceworkloads", self.name
        )
        return obj

    def patch_spec(self, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            self.namespace,
            "serviceworkloads",
            self.name,
            {"spec": spec},
        )

    def pods(self) -> list[k8s.V1Pod]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_WORKLOAD}={self.name}"
            ).items
        )

    def running(self, count: int) -> list[k8s.V1Pod] | None:
        pods = [
            p
            for p in self.pods()
            if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp
        ]
        return pods if len(pods) >= count else None

    def service(self) -> k8s.V1Service | None:
        try:
            return self.core.read_namespaced_service(self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def slices(self, managed_by: str | None = ENDPOINTSLICE_MANAGED_BY) -> list[dict[str, Any]]:
        selector = f"{LABEL_SERVICE_NAME}={self.name}"
        if managed_by:
            selector += f",{LABEL_MANAGED_BY}={managed_by}"
        found = k8s.DiscoveryV1Api(self.env.api).list_namespaced_endpoint_slice(
            self.namespace, label_selector=selector
        )
        items: list[dict[str, Any]] = self.env.api.sanitize_for_serialization(found.items)
        return items

    def shown(self) -> dict[str, State]:
        """Pod name -> (ready, serving, terminating) over Pilotfish's slices of the service."""
        out: dict[str, State] = {}
        for s in self.slices():
            for ep in s.get("endpoints") or []:
                c = ep["conditions"]
                name = ep["targetRef"]["name"]
                assert name not in out, f"{name} is in two slices"
                out[name] = (c.get("ready"), c.get("serving"), c.get("terminating"))
        return out


def service_workload(name: str, replicas: int, ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": TEAM,
            "replicas": replicas,
            "strategy": {"maxSurge": 3, "maxUnavailable": 0},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "readinessGates": [{"conditionType": GATE}],
                    "containers": [
                        {
                            "name": "app",
                            "image": "example/web:1",
                            "ports": [{"name": "web", "containerPort": 8080}],
                        }
                    ],
                },
            },
            "service": {"ports": ports},
        },
    }


def own_pod(sw: dict[str, Any], index: int) -> dict[str, Any]:
    """A pod as the rollout controller would make it: labelled, owned by the workload."""
    meta = sw["metadata"]
    template = sw["spec"]["template"]
    return {
        "metadata": {
            "name": f"{meta['name']}-{index}",
            "labels": {**template["metadata"]["labels"], LABEL_WORKLOAD: meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": "ServiceWorkload",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": template["spec"],
    }


HTTP_NAMED = [{"name": "http", "port": 80, "targetPort": "web"}]


@pytest.fixture(scope="module")
def team_quota(env: Env) -> Iterator[None]:
    """Room for every pod of this module in the production band."""
    custom = k8s.CustomObjectsApi(env.api)
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": TEAM},
        "spec": {
            "team": TEAM,
            "bands": {"production": {"cpu": "10000", "memory": "100000Gi", "pods": 5000}},
        },
    }
    try:
        custom.create_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", body)
    except ApiException as e:
        if e.status != 409:
            raise
    yield
    custom.delete_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", TEAM)


@pytest.fixture
def team_namespace(env: Env, namespace: str, team_quota: None) -> str:
    """The test namespace, owned by the workloads' team (a pod's team is its namespace's)."""
    k8s.CoreV1Api(env.api).patch_namespace(
        namespace, {"metadata": {"labels": {names.LABEL_TEAM: TEAM}}}
    )
    return namespace


@pytest.fixture
def make(env: Env, team_namespace: str) -> Iterator[Any]:
    namespace = team_namespace

    def make(name: str, replicas: int, ports: list[dict[str, Any]] = HTTP_NAMED) -> Workload:
        w = Workload(env, namespace, name)
        w.custom.create_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            namespace,
            "serviceworkloads",
            service_workload(name, replicas, ports),
        )
        if not rollout_controller_registered():
            sw = w.get()
            for i in range(replicas):
                w.core.create_namespaced_pod(namespace, own_pod(sw, i))
        wait_until(f"{replicas} pods of {name} running", lambda: w.running(replicas), PODS_TIMEOUT)
        return w

    yield make


def set_ready(w: Workload, pod: str, ready: bool) -> None:
    """Flip the readiness gate, and Ready with it as a kubelet would; conditional on the
    version read, retried when kwok or a controller wrote the pod in between."""
    status = "True" if ready else "False"

    def attempt() -> bool:
        current = w.core.read_namespaced_pod(pod, w.namespace)
        raw = w.env.api.sanitize_for_serialization(current)
        conditions = [
            c for c in raw["status"].get("conditions") or [] if c["type"] not in (GATE, "Ready")
        ]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions += [
            {"type": GATE, "status": status, "lastTransitionTime": now},
            {"type": "Ready", "status": status, "lastTransitionTime": now},
        ]
        ops = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": raw["metadata"]["resourceVersion"],
            },
            {"op": "replace", "path": "/status/conditions", "value": conditions},
        ]
        try:
            w.core.patch_namespaced_pod_status(pod, w.namespace, ops)
        except ApiException as e:
            if e.status in (409, 422):
                return False
            raise
        return True

    wait_until(f"pod {pod} readiness set to {ready}", attempt, timeout=30, interval=0.1)


def ready_pods_shown(w: Workload, count: int) -> dict[str, State] | None:
    shown = w.shown()
    ready = {k: v for k, v in shown.items() if v == (True, True, False)}
    return shown if len(ready) >= count else None


def test_service_keeps_its_cluster_ip_and_slices_show_ready_pods(make: Any) -> None:
    w: Workload = make("web", 3)
    svc = wait_until("the Service", w.service, SLICES_TIMEOUT)
    assert svc.spec.selector is None, "a selector would hand the slices to the built-in controller"
    assert svc.spec.type == "ClusterIP" and svc.spec.cluster_ip
    (owner,) = svc.metadata.owner_references
    assert owner.kind == "ServiceWorkload" and owner.uid == w.get()["metadata"]["uid"]
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("http", 80, "web")]

    wait_until("3 ready endpoints", lambda: ready_pods_shown(w, 3), SLICES_TIMEOUT)
    pods = {p.metadata.name: p for p in w.running(3) or []}
    nodes = {n.metadata.name: n for n in w.core.list_node().items}
    (slice_,) = w.slices()
    assert slice_["addressType"] == "IPv4"
    assert slice_["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == svc.metadata.uid
    for ep in slice_["endpoints"]:
        pod = pods[ep["targetRef"]["name"]]
        assert ep["addresses"] == [pod.status.pod_ip]
        assert ep["nodeName"] == pod.spec.node_name
        assert ep["zone"] == nodes[pod.spec.node_name].metadata.labels[names.LABEL_ZONE]
        assert ep["targetRef"]["uid"] == pod.metadata.uid

    # A spec change moves the ports; the address stays: patched, never re-created.
    w.patch_spec(
        {
            "service": {
                "ports": [
                    {"name": "http", "port": 81, "targetPort": "web"},
                    {"name": "admin", "port": 9000},
                ]
            }
        }
    )

    def new_ports() -> bool:
        s = w.service()
        return s is not None and sorted(p.port for p in s.spec.ports) == [81, 9000]

    wait_until("the Service's new ports", new_ports, SLICES_TIMEOUT)
    after = w.service()
    assert after is not None
    assert after.spec.cluster_ip == svc.spec.cluster_ip
    assert after.metadata.uid == svc.metadata.uid

    def slices_on_new_ports() -> bool:
        slices = w.slices()
        return bool(slices) and all(
            sorted((p["name"], p["port"]) for p in s["ports"]) == [("admin", 9000), ("http", 8080)]
            for s in slices
        )

    wait_until("slices on the new ports", slices_on_new_ports, SLICES_TIMEOUT)
    assert len(w.shown()) == 3


def test_the_builtin_controller_never_fights(make: Any) -> None:
    """kube-controller-manager's EndpointSlice controller demonstrably works through the same
    pods (for a selector Service beside ours) and still leaves the selector-less Service alone:
    it writes no slice for it and never rewrites ours."""
    w: Workload = make("calm", 3)
    wait_until("3 ready endpoints", lambda: ready_pods_shown(w, 3), SLICES_TIMEOUT)
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in w.slices()}
    w.core.create_namespaced_service(
        w.namespace,
        {
            "metadata": {"name": "calm-builtin"},
            "spec": {"selector": {"app": "calm"}, "ports": [{"name": "http", "port": 80}]},
        },
    )
    builtin = Workload(w.env, w.namespace, "calm-builtin")

    def builtin_done() -> bool:
        slices = builtin.slices(managed_by=BUILTIN_MANAGED_BY)
        return sum(len(s.get("endpoints") or []) for s in slices) == 3

    wait_until("the built-in controller's slice for the selector Service", builtin_done, 60)
    assert w.slices(managed_by=BUILTIN_MANAGED_BY) == [], "the built-in controller wrote slices"
    everyone = w.slices(managed_by=None)
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in everyone} == before


def test_readiness_flips_show_in_slices(make: Any) -> None:
    w: Workload = make("flip", 4)
    shown = wait_until("4 ready endpoints", lambda: ready_pods_shown(w, 4), SLICES_TIMEOUT)
    pod = sorted(shown)[1]
    set_ready(w, pod, False)
    wait_until(
        "not ready in the slice", lambda: w.shown()[pod] == (False, False, False), SLICES_TIMEOUT
    )
    others = {k: v for k, v in w.shown().items() if k != pod}
    assert all(v == (True, True, False) for v in others.values()), others
    set_ready(w, pod, True)
    wait_until("ready again", lambda: w.shown()[pod] == (True, True, False), SLICES_TIMEOUT)


def test_more_than_a_hundred_pods_are_split_over_slices(make: Any) -> None:
    w: Workload = make("wide", 150)
    wait_until("150 ready endpoints", lambda: ready_pods_shown(w, 150), 120)
    slices = w.slices()
    sizes = sorted(len(s["endpoints"]) for s in slices)
    assert len(slices) >= 2 and max(sizes) <= MAX_ENDPOINTS_PER_SLICE, sizes
    assert sum(sizes) == 150
    pods = {p.metadata.name for p in w.running(150) or []}
    assert set(w.shown()) == pods


def test_draining_pod_leaves_rotation_then_gets_drained_at(make: Any) -> None:
    w: Workload = make("drain", 3)
    shown = wait_until("3 ready endpoints", lambda: ready_pods_shown(w, 3), SLICES_TIMEOUT)
    pod = sorted(shown)[0]
    requested = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    w.core.patch_namespaced_pod(
        pod,
        w.namespace,
        {"metadata": {"annotations": {ANNOTATION_DRAIN: requested.strftime("%Y-%m-%dT%H:%M:%SZ")}}},
    )
    wait_until(
        "the draining pod not ready and terminating",
        lambda: w.shown().get(pod) == (False, True, True),
        SLICES_TIMEOUT,
    )

    def drained_at() -> str | None:
        p = w.core.read_namespaced_pod(pod, w.namespace)
        return (p.metadata.annotations or {}).get(ANNOTATION_DRAINED)

    stamp = wait_until("drained-at on the pod", drained_at, SLICES_TIMEOUT)
    assert parse_time(stamp) >= requested


def test_deleting_the_workload_takes_the_service_and_slices(make: Any) -> None:
    w: Workload = make("gone", 2)
    wait_until("2 ready endpoints", lambda: ready_pods_shown(w, 2), SLICES_TIMEOUT)
    assert w.service() is not None
    w.custom.delete_namespaced_custom_object(
        names.GROUP, names.VERSION, w.namespace, "serviceworkloads", w.name
    )
    wait_until("the Service garbage-collected", lambda: w.service() is None, 90)
    wait_until("the slices garbage-collected", lambda: w.slices() == [], 90)


def test_a_service_owned_by_someone_else_is_left_alone(env: Env, team_namespace: str) -> None:
    namespace = team_namespace
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_service(
        namespace,
        {"metadata": {"name": "taken"}, "spec": {"ports": [{"name": "x", "port": 7000}]}},
    )
    before = core.read_namespaced_service("taken", namespace)
    k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        namespace,
        "serviceworkloads",
        service_workload("taken", 0, HTTP_NAMED),
    )

    def reported() -> list[dict[str, Any]]:
        # Raw JSON: the generated client refuses core Events, whose eventTime is null here.
        out = env.kubectl("-n", namespace, "get", "events.v1.events.k8s.io", "-o", "json")
        return [
            e
            for e in json.loads(out.stdout)["items"]
            if e.get("reason") == REASON_SERVICE_NOT_OWNED and e["regarding"]["name"] == "taken"
        ]

    (event,) = wait_until("a ServiceNotOwned event", reported, SLICES_TIMEOUT)
    assert event["type"] == "Warning" and "not owned" in event["note"]
    after = core.read_namespaced_service("taken", namespace)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert Workload(env, namespace, "taken").slices() == []
