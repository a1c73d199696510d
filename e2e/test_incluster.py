"""The chart in its in-cluster mode, for real: the operator, extender and webhooks as pods on
the real node, from the image built here, with no host process of Pilotfish (the README's
"Installing on kind or a real cluster", step by step: `incluster.install`).

Its own cluster (`pilotfish dev up --bare --real-node`), not the session's, whose Pilotfish
runs as host processes; one real node per host, so it runs alone, after the real node's
other tests (`make e2e`; marker `incluster`):

    PILOTFISH_E2E_PORT_OFFSET=3000 PILOTFISH_E2E_STATE=/tmp/e2e-3000 \
      .venv/bin/python -m pytest e2e -q -m incluster
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import (
    E2E_PORT_OFFSET,
    Env,
    dev_up_or_exit,
    pilotfish_cli,
    tenant_of,
    wait_until,
)
from e2e.test_serviceworkload import (  # noqa: F401 (ns is a fixture)
    ns,
    pods_of,
    service_workload,
    team_of,
)
from pilotfish import names
from pilotfish.devcluster import binaries, cluster, incluster, supervisor
from pilotfish.devcluster.components import Layout
from pilotfish.devcluster.hostprocs import HOST_PROCESSES

pytestmark = [pytest.mark.e2e, pytest.mark.incluster]

SYSTEM = names.SYSTEM_NAMESPACE
GATE_DENIAL = 'admission webhook "pods.validate.pilotfish.io" denied the request: '


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    """A bare cluster with the real node and the chart installed in-cluster on it."""
    if os.environ.get("PILOTFISH_E2E_KUBECONFIG") or os.environ.get("PILOTFISH_E2E_KIND"):
        pytest.skip("installs the chart onto the local cluster's real node")
    keep = bool(os.environ.get("PILOTFISH_E2E_KEEP"))
    state = Path(os.environ.get("PILOTFISH_E2E_STATE") or tempfile.mkdtemp(prefix="pilotfish-ic-"))
    spec = cluster.ClusterSpec(
        nodes=2, port_offset=E2E_PORT_OFFSET, pilotfish=False, real_node=True
    )
    dev_up_or_exit(
        state, "--bare", "--real-node", "--nodes", "2", "--port-offset", str(E2E_PORT_OFFSET)
    )
    layout = Layout(state)
    api = cluster.api_client(layout)
    try:
        incluster.install(layout, api, E2E_PORT_OFFSET, spec.ports.apiserver, cluster.chart_dir())
        yield Env(layout.admin_kubeconfig, api, binaries.bin_dir(), layout, spec)
    finally:
        if not keep:
            incluster.remove_api_route(E2E_PORT_OFFSET)
            pilotfish_cli("dev", "--state", str(state), "down", "--purge")


def component_pods(env: Env, component: str) -> list[k8s.V1Pod]:
    pods = k8s.CoreV1Api(env.api).list_namespaced_pod(
        SYSTEM, label_selector=f"app.kubernetes.io/component={component}"
    )
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def ready(pod: k8s.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def one_ready(env: Env, component: str) -> k8s.V1Pod | None:
    pods = component_pods(env, component)
    return pods[0] if len(pods) == 1 and ready(pods[0]) else None


def message(e: ApiException) -> str:
    import json

    return str(json.loads(e.body).get("message", "")) if e.body else str(e.reason)


def test_pilotfish_runs_only_as_pods_on_the_real_node(env: Env) -> None:
    assert env.layout is not None
    for name in HOST_PROCESSES:
        assert supervisor.running(env.layout, name) is None, f"host process {name} is running"
    for component in ("operator", "extender", "webhooks"):
        pod = wait_until(f"one {component} pod Ready", functools.partial(one_ready, env, component))
        assert pod.spec.node_name == names.REAL_NODE_NAME, (component, pod.spec.node_name)
        image = pod.status.container_statuses[0].image
        assert image.startswith("pilotfish.local/pilotfish:"), (component, image)
    assert component_pods(env, "scheduler") == []  # no cluster DNS for its extender URL


def test_the_operator_pod_leads(env: Env) -> None:
    pod = wait_until("the operator pod Ready", lambda: one_ready(env, "operator"))
    leases = k8s.CoordinationV1Api(env.api)

    def held() -> k8s.V1Lease | None:
        for lease in leases.list_namespaced_lease(SYSTEM).items:
            if lease.spec.holder_identity == pod.metadata.name:
                return lease
        return None

    lease = wait_until(f"a Lease in {SYSTEM} held by {pod.metadata.name}", held, timeout=60)
    assert lease.spec.renew_time is not None


def test_the_webhook_pod_refuses_a_tenants_undeclared_gate(env: Env, namespace: str) -> None:
    webhook = wait_until("the webhooks pod Ready", lambda: one_ready(env, "webhooks"))
    slices = k8s.DiscoveryV1Api(env.api).list_namespaced_endpoint_slice(
        SYSTEM, label_selector="kubernetes.io/service-name=pilotfish-webhooks"
    )
    addresses = {a for s in slices.items for e in s.endpoints or [] for a in e.addresses}
    assert addresses == {webhook.status.pod_ip}
    tenant = tenant_of(env, namespace)
    body = {
        "metadata": {"name": "sneaky"},
        "spec": {
            "schedulingGates": [{"name": "gates.pilotfish.io/sneaky"}],
            "containers": [{"name": "c", "image": "example/app:1"}],
        },
    }
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(tenant.api).create_namespaced_pod(namespace, body)
    assert err.value.status == 403, err.value.body
    assert message(err.value) == (
        f"{GATE_DENIAL}gate gates.pilotfish.io/sneaky is not declared by any GatePolicy in "
        f"namespace {namespace} that selects this pod (only GatePolicies may set "
        "gates.pilotfish.io/ gates)"
    )


def test_a_valid_workload_is_admitted_and_reconciled_by_the_operator_pod(
    env: Env,
    ns: str,  # noqa: F811
) -> None:
    tenant = tenant_of(env, ns)
    k8s.CustomObjectsApi(tenant.api).create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        ns,
        "serviceworkloads",
        service_workload("web", team_of(ns), 2),
    )
    pods = wait_until("2 pods of ServiceWorkload web", lambda: len(pods_of(env, ns, "web")) == 2)
    assert pods


def probe_pod(team: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "probe",
            "labels": {names.LABEL_TEAM: team, names.LABEL_BAND: "production"},
        },
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}]},
    }


def test_a_rolling_upgrade_fails_no_admission(env: Env, ns: str) -> None:  # noqa: F811
    assert env.layout is not None
    before = {p.metadata.name for p in component_pods(env, "webhooks")}
    core = k8s.CoreV1Api(tenant_of(env, ns).api)
    body = probe_pod(team_of(ns))
    admitted: list[int] = []
    failed: list[str] = []
    stop = threading.Event()

    def admit() -> None:
        while not stop.is_set():
            try:
                core.create_namespaced_pod(ns, body, dry_run="All")
            except ApiException as e:
                failed.append(f"{e.status}: {message(e)}")
            else:
                admitted.append(1)

    loop = threading.Thread(target=admit, daemon=True)
    loop.start()
    try:
        wait_until("admissions before the upgrade", lambda: len(admitted) >= 5)
        incluster.helm(
            env.layout,
            env.bins,
            "upgrade",
            incluster.RELEASE,
            str(cluster.chart_dir()),
            "--namespace",
            SYSTEM,
            "--reuse-values",
            "--set",
            "nodeLifecycle.evictionWaitSeconds=61",
            "--wait",
            "--timeout",
            "5m",
        )

        def replaced() -> k8s.V1Pod | None:
            pods = k8s.CoreV1Api(env.api).list_namespaced_pod(
                SYSTEM, label_selector="app.kubernetes.io/component=webhooks"
            )
            names_ = {p.metadata.name for p in pods.items}
            pod = one_ready(env, "webhooks")
            return pod if pod is not None and not names_ & before else None

        new = wait_until("the old webhooks pod gone, a new one Ready", replaced, timeout=120)
        during = len(admitted)
        wait_until("admissions after the upgrade", lambda: len(admitted) >= during + 5)
    finally:
        stop.set()
        loop.join(timeout=30)
    env_vars = {e.name: e.value for e in new.spec.containers[0].env or []}
    assert env_vars["PILOTFISH_EVICTION_WAIT_SECONDS"] == "61"
    print(f"admissions during the rolling upgrade: {len(admitted)} admitted, {len(failed)} failed")
    assert failed == [], f"{len(failed)} of {len(failed) + len(admitted)} failed: {failed[:5]}"
