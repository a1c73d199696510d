"""The node-side promises on a real node (`pilotfish dev up --real-node`): a kubelet, containerd
and runc on this host, beside the kwok fleet, with pods admitted by Pilotfish's webhooks.

What kwok cannot show is read from the host: the containers' cgroup files under
/sys/fs/cgroup (the v1 hierarchy of this host) and containerd's own view of its tasks
(`ctr`), which does not go through the API server and so still answers while it is down.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, wait_for_controllers_back, wait_until
from e2e.reclaim import enable
from pilotfish import names
from pilotfish.devcluster import components, oci, realnode, supervisor
from pilotfish.devcluster import realnodeconfig as rc
from pilotfish.operators.endpoints import LABEL_MANAGED_BY, LABEL_SERVICE_NAME
from pilotfish.workloads import ENDPOINTSLICE_MANAGED_BY, LABEL_WORKLOAD

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

CGROUP: Final = Path("/sys/fs/cgroup")
ON_REAL_NODE: Final[dict[str, Any]] = {
    "nodeSelector": {names.LABEL_REAL_NODE: "true"},
    "tolerations": [
        {"key": names.LABEL_REAL_NODE, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ],
}
SLEEP: Final = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
OUTAGE_SECONDS: Final = 60.0
START_TIMEOUT: Final = 120.0


@pytest.fixture(scope="module")
def node(env: Env) -> str:
    """The real node, Ready (the session's cluster is brought up with it for this marker)."""
    if env.layout is None or env.spec is None or not env.spec.real_node:
        pytest.skip("needs the local cluster with --real-node")
    wait_until("the real node Ready", lambda: realnode.node_ready(env.api), timeout=120)
    return names.REAL_NODE_NAME


def container(
    resources: dict[str, Any] | None = None, command: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "name": "app",
        "image": oci.BUSYBOX_REF,
        "imagePullPolicy": "Never",
        "command": command or SLEEP,
        "resources": resources or {},
        **extra,
    }


def pod(name: str, band: str, c: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {names.LABEL_BAND: band}},
        "spec": {**ON_REAL_NODE, "containers": [c], "terminationGracePeriodSeconds": 1, **spec},
    }


def running(env: Env, namespace: str, name: str) -> k8s.V1Pod | None:
    p = k8s.CoreV1Api(env.api).read_namespaced_pod(name, namespace)
    statuses = p.status.container_statuses or []
    if p.status.phase == "Running" and statuses and all(s.state.running for s in statuses):
        return p
    return None


def running_pod(env: Env, namespace: str, name: str) -> Callable[[], k8s.V1Pod | None]:
    return lambda: running(env, namespace, name)


def container_id(p: k8s.V1Pod) -> str:
    cid: str = p.status.container_statuses[0].container_id
    assert cid.startswith("containerd://"), cid
    return cid.removeprefix("containerd://")


def cgroup_file(controller: str, p: k8s.V1Pod, name: str) -> Path:
    """The container's cgroup file: kubelet's cgroupfs layout, kubepods[/qos]/pod<uid>/<id>."""
    cid = container_id(p)
    found = [
        d / name
        for d in (CGROUP / controller / "kubepods").glob(f"**/pod{p.metadata.uid}/{cid}")
        if (d / name).exists()
    ]
    assert len(found) == 1, f"cgroup of {cid} under {CGROUP / controller}: {found}"
    return found[0]


def tasks(env: Env) -> dict[str, tuple[str, str]]:
    """containerd's tasks: container id -> (pid, status), straight from the runtime."""
    assert env.layout is not None
    out = realnode.ctr(env.layout, "tasks", "ls").stdout.splitlines()[1:]
    return {f[0]: (f[1], f[2]) for f in (line.split() for line in out) if len(f) >= 3}


def test_production_memory_limit_is_its_request_in_the_cgroup(
    env: Env, node: str, namespace: str
) -> None:
    enable(env, namespace)  # reclaim on: production memory is held to its request
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(
        namespace,
        pod("prod", "production", container({"requests": {"cpu": "100m", "memory": "48Mi"}})),
    )
    p = wait_until("prod running", running_pod(env, namespace, "prod"), START_TIMEOUT)
    assert p.spec.node_name == node
    assert p.spec.containers[0].resources.limits["memory"] == "48Mi"
    limit = cgroup_file("memory", p, "memory.limit_in_bytes").read_text().strip()
    assert int(limit) == 48 * 2**20


def test_batch_cpu_weight_is_below_production(env: Env, node: str, namespace: str) -> None:
    """With reclaim on, a batch pod's cpu and memory become `batch.pilotfish.io/*`: it has no
    cpu request left, so the kubelet runs it BestEffort, cpu.shares 2, against the shares a
    production pod's request buys (1024 per core). With reclaim off a batch pod keeps its cpu
    request and its shares follow that request alone: the band shows in the weight only
    where reclaim moves batch onto reclaimed capacity, which is what this test turns on.

    The node's batch allocatable is the reclaim controller's figure, measured from usage the
    local Prometheus scrapes off kwok's nodes only; it is set here as that controller writes
    it (the controller decays an unmeasured node's figure by halves, long enough for this)."""
    enable(env, namespace)
    core = k8s.CoreV1Api(env.api)
    core.patch_node_status(
        node,
        {"status": {"capacity": {names.BATCH_CPU: "4000", names.BATCH_MEMORY: str(4 * 2**30)}}},
    )
    wait_until(
        "batch allocatable on the real node",
        lambda: names.BATCH_CPU in (core.read_node(node).status.allocatable or {}),
        timeout=30,
    )
    same = {"requests": {"cpu": "500m", "memory": "32Mi"}}
    core.create_namespaced_pod(namespace, pod("prod", "production", container(same)))
    core.create_namespaced_pod(namespace, pod("batch", "batch", container(same)))
    prod = wait_until("prod running", running_pod(env, namespace, "prod"), START_TIMEOUT)
    batch = wait_until("batch running", running_pod(env, namespace, "batch"), START_TIMEOUT)
    assert batch.status.qos_class == "BestEffort", batch.status.qos_class
    prod_shares = int(cgroup_file("cpu", prod, "cpu.shares").read_text())
    batch_shares = int(cgroup_file("cpu", batch, "cpu.shares").read_text())
    assert prod_shares == 512, prod_shares  # 500m
    assert batch_shares == 2, batch_shares  # the kernel's floor, BestEffort's weight
    assert batch_shares < prod_shares


def service_workload(name: str, container_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": "e2e",
            "replicas": 1,
            "strategy": {"maxSurge": 1, "maxUnavailable": 0},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    **ON_REAL_NODE,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [container_spec],
                    "volumes": [{"name": "flags", "emptyDir": {}}],
                },
            },
            "service": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        },
    }


@pytest.fixture
def workload(env: Env, node: str, namespace: str) -> Iterator[Any]:
    custom = k8s.CustomObjectsApi(env.api)
    core = k8s.CoreV1Api(env.api)

    def make(name: str, c: dict[str, Any]) -> k8s.V1Pod:
        c = {**c, "volumeMounts": [{"name": "flags", "mountPath": "/flags"}]}
        custom.create_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "serviceworkloads", service_workload(name, c)
        )

        def one_running() -> k8s.V1Pod | None:
            pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_WORKLOAD}={name}")
            up = [p for p in pods.items if running(env, namespace, p.metadata.name)]
            return up[0] if len(pods.items) == 1 and up else None

        return wait_until(f"the pod of {name} running", one_running, START_TIMEOUT)

    yield make


def flags_dir(env: Env, p: k8s.V1Pod) -> Path:
    """The pod's `flags` emptyDir as the kubelet keeps it on this host."""
    nl = rc.node_layout(env.require_local())
    uid: str = p.metadata.uid
    return nl.kubelet_root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "flags"


def test_crashed_container_restarts_in_place(env: Env, workload: Any, namespace: str) -> None:
    p = workload("crashy", container())
    before = container_id(p)
    layout = env.require_local()
    realnode.ctr(layout, "tasks", "kill", "--signal", "SIGKILL", before)
    core = k8s.CoreV1Api(env.api)

    def restarted() -> k8s.V1Pod | None:
        now = running(env, namespace, p.metadata.name)
        ok = now and now.status.container_statuses[0].restart_count >= 1
        return now if ok else None

    after = wait_until("the container restarted by the kubelet", restarted, START_TIMEOUT)
    assert after.metadata.uid == p.metadata.uid
    assert container_id(after) != before
    pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_WORKLOAD}=crashy").items
    assert [q.metadata.uid for q in pods] == [p.metadata.uid], "the workload replaced its pod"


def test_readiness_probe_moves_the_pod_in_and_out_of_the_slice(
    env: Env, workload: Any, namespace: str
) -> None:
    probe = {
        "exec": {"command": ["cat", "/flags/ready"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
        "successThreshold": 1,
    }
    p = workload("probed", container(readinessProbe=probe, ports=[{"containerPort": 8080}]))
    flag = flags_dir(env, p) / "ready"
    discovery = k8s.DiscoveryV1Api(env.api)

    def shown_ready() -> bool | None:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace,
            label_selector=f"{LABEL_SERVICE_NAME}=probed,{LABEL_MANAGED_BY}={ENDPOINTSLICE_MANAGED_BY}",
        ).items
        eps = [e for s in slices for e in s.endpoints or [] if e.target_ref.name == p.metadata.name]
        return eps[0].conditions.ready if eps else None

    wait_until("the pod shown not ready (no flag yet)", lambda: shown_ready() is False, 60)
    flag.write_text("ok\n")
    wait_until("the pod ready in the slice", lambda: shown_ready() is True, 60)
    flag.unlink()
    wait_until("the pod out of rotation", lambda: shown_ready() is False, 60)
    flag.write_text("ok\n")
    wait_until("the pod back in the slice", lambda: shown_ready() is True, 60)


def test_pods_keep_running_through_a_control_plane_outage(
    env: Env, node: str, namespace: str
) -> None:
    layout = env.require_local()
    assert env.spec is not None
    core = k8s.CoreV1Api(env.api)
    for i in range(2):
        core.create_namespaced_pod(
            namespace, pod(f"steady-{i}", "production", container({"requests": {"cpu": "50m"}}))
        )
    pods = [
        wait_until(f"steady-{i} running", running_pod(env, namespace, f"steady-{i}"), START_TIMEOUT)
        for i in range(2)
    ]
    ids = {container_id(p) for p in pods}
    seen = tasks(env)
    before = {cid: seen[cid] for cid in ids}
    assert all(status == "RUNNING" for _, status in before.values()), before
    plane = {
        c.name: c
        for c in components.control_plane(layout, env.spec.ports, env.bins, env.spec.node_lifecycle)
    }
    for name in ("kube-apiserver", "etcd"):
        supervisor.stop(layout, name)
    try:
        deadline = time.monotonic() + OUTAGE_SECONDS
        while time.monotonic() < deadline:  # the outage itself lasts this long, by design
            during = tasks(env)
            assert {cid: during.get(cid) for cid in ids} == before, "a container stopped or moved"
            time.sleep(1)
    finally:
        for name in ("etcd", "kube-apiserver"):
            supervisor.start(layout, plane[name], ready_timeout=120)
    back = datetime.datetime.now(datetime.UTC)
    # kube-controller-manager's informers retry a minute's outage with client-go's backoff
    # and act again only a minute or more later (measured: 76 s): what is tested here is the
    # node, so it is restarted for the tests after this one, and shown acting.
    supervisor.restart(layout, plane["kube-controller-manager"])
    wait_for_controllers_back(env)
    coordination = k8s.CoordinationV1Api(env.api)

    def reporting() -> bool:
        lease = coordination.read_namespaced_lease(node, "kube-node-lease")
        return bool(lease.spec.renew_time > back) and realnode.node_ready(env.api)

    # Ready was stored before the outage: only a lease renewed since shows the kubelet back.
    wait_until("the real node reporting Ready again", reporting, timeout=120)
    for p in pods:
        now = wait_until(
            f"{p.metadata.name} reported running", running_pod(env, namespace, p.metadata.name), 60
        )
        assert now.metadata.uid == p.metadata.uid
        assert container_id(now) == container_id(p)
        assert now.status.container_statuses[0].restart_count == 0
    assert {cid: tasks(env).get(cid) for cid in ids} == before
