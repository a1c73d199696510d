"""Least privilege at run time, against the real API server and the running host processes.

RBAC lets the operator create and patch pods in every namespace (it runs tenants' workloads
through a ClusterRole), so only the chart's ValidatingAdmissionPolicy
pilotfish-system-namespaces stands between a stolen operator token and a pod in kube-system
that mounts that namespace's Secrets. These tests use the operator's own ServiceAccount
token, the one the host process runs with. Creates into system namespaces are dry runs:
admission, policies included, runs in full, and a regression leaves nothing behind there.

And every listener of every Pilotfish host process is bound to loopback only, read from the
kernel's socket table for the processes' own sockets.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import NO_NODE, Env, wait_until
from pilotfish import names
from pilotfish.devcluster import cluster, components, supervisor

POLICY = "pilotfish-system-namespaces"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", names.SYSTEM_NAMESPACE)
OPERATOR = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_OPERATOR}"
RULE = "Pilotfish's service accounts may not create or change pods"

pytestmark = pytest.mark.e2e


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "example/app:1"}],
            "nodeSelector": NO_NODE,  # never runs, wherever it lands
            "terminationGracePeriodSeconds": 0,
        },
    }


def refused(call: Callable[[], Any]) -> ApiException:
    with pytest.raises(ApiException) as err:
        call()
    return err.value


def message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])


def operator_core(env: Env) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(env.component_api("operator"))


def operator_may(env: Env, verb: str, namespace: str) -> bool:
    authz = k8s.AuthorizationV1Api(env.component_api("operator"))
    attrs = {"verb": verb, "resource": "pods", "namespace": namespace}
    review = authz.create_self_subject_access_review({"spec": {"resourceAttributes": attrs}})
    return bool(review.status.allowed)


# --- pods in system namespaces ----------------------------------------------------------------


@pytest.mark.parametrize("system_ns", SYSTEM_NAMESPACES)
def test_the_operator_may_not_create_pods_in_a_system_namespace(env: Env, system_ns: str) -> None:
    assert operator_may(env, "create", system_ns), "RBAC allows it: the policy must refuse"
    err = refused(
        lambda: operator_core(env).create_namespaced_pod(system_ns, pod("pf-escape"), dry_run="All")
    )
    assert err.status == 403, err.body
    text = message(err)
    assert POLICY in text, text
    assert f"{OPERATOR} may not create pods in namespace {system_ns}: {RULE}" in text, text


@pytest.fixture
def system_pod(env: Env) -> Iterator[str]:
    """A pod in kube-system made by the admin, as a platform add-on's would be."""
    core = k8s.CoreV1Api(env.api)
    name = f"pf-victim-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("kube-system", pod(name))
    try:
        yield name
    finally:
        core.delete_namespaced_pod(name, "kube-system", grace_period_seconds=0)


def test_the_operator_may_not_change_a_pod_in_kube_system(env: Env, system_pod: str) -> None:
    """A pod's image is mutable: patching it would run the attacker's code with the pod's
    ServiceAccount, as good as creating one."""
    assert operator_may(env, "patch", "kube-system")
    evil = {"spec": {"containers": [{"name": "c", "image": "example/steal-secrets:1"}]}}
    err = refused(lambda: operator_core(env).patch_namespaced_pod(system_pod, "kube-system", evil))
    assert err.status == 403, err.body
    assert f"{OPERATOR} may not update pods in namespace kube-system: {RULE}" in message(err)
    current = k8s.CoreV1Api(env.api).read_namespaced_pod(system_pod, "kube-system")
    assert current.spec.containers[0].image == "example/app:1"


def test_the_operator_still_creates_pods_in_a_tenant_namespace(env: Env, namespace: str) -> None:
    made = operator_core(env).create_namespaced_pod(namespace, pod("made-by-the-operator"))
    assert made.metadata.namespace == namespace
    assert k8s.CoreV1Api(env.api).read_namespaced_pod("made-by-the-operator", namespace)


def test_the_admin_is_not_bound_by_the_policy(env: Env) -> None:
    """The policy targets Pilotfish's accounts only; the platform team still runs kube-system."""
    created = k8s.CoreV1Api(env.api).create_namespaced_pod(
        "kube-system", pod("pf-admin-probe"), dry_run="All"
    )
    assert created.metadata.name == "pf-admin-probe"


# --- listeners ----------------------------------------------------------------------------------


def _address(hex_addr: str) -> str:
    """/proc/net/tcp{,6} local address (kernel byte order, 32-bit words) to text."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # TCP_LISTEN
                host, port = local.rsplit(":", 1)
                out.add((_address(host), int(port, 16)))
    return out


@pytest.mark.parametrize("name", cluster.HOST_PROCESSES)
def test_every_listener_is_bound_to_loopback(env: Env, name: str) -> None:
    layout = env.require_local()
    component = env.host_process(name)
    child = wait_until(f"{name} running", lambda: supervisor.child(layout, name), timeout=30)
    wait_until(f"{name} healthy", lambda: supervisor.healthy(component.health), timeout=60)
    sockets = listening(child.pid)
    assert (("127.0.0.1", component.port)) in sockets, sockets
    assert {host for host, _ in sockets} == {"127.0.0.1"}, f"{name} listens on {sockets}"
    supervising = supervisor.running(layout, name)
    assert supervising is not None and not listening(supervising.pid)


def test_the_operator_metrics_port_refuses_other_addresses_of_this_host(env: Env) -> None:
    port = env.host_process("pilotfish-operator").port
    other = components.advertise_address()
    if other is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((other, port), timeout=5).close()
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
