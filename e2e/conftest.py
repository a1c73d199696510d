"""The e2e harness: one real control plane per test session, one namespace per test.

Where the cluster comes from:
- default: `pilotfish dev up` in a fresh state directory, on ports shifted by 1000 so a
  developer's `make demo` cluster keeps running beside it; brought down at the end
  (PILOTFISH_E2E_KEEP=1 keeps it, and a later run reuses it);
- PILOTFISH_E2E_KUBECONFIG=path: an existing cluster with Pilotfish installed (kind, a real
  cluster); tests that need the local host processes are skipped;
- PILOTFISH_E2E_KIND=1: a kind cluster through pytest-kind, when it and Docker are available.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from pilotfish import names
from pilotfish.devcluster import binaries, cluster, supervisor
from pilotfish.devcluster.components import Component, Layout

T = TypeVar("T")
# Ports of the session's cluster are the defaults shifted by this much (several suites may
# run side by side, each with its own offset).
E2E_PORT_OFFSET = int(os.environ.get("PILOTFISH_E2E_PORT_OFFSET", "1000"))
# A nodeSelector no node matches: a pod that is admitted and stored, and never runs.
NO_NODE: dict[str, str] = {"e2e.pilotfish.io/no-such-node": "true"}


def unplaced_pod(name: str) -> dict[str, Any]:
    """A plain pod that is admitted and stored but never runs (`NO_NODE`)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "example/app:1"}],
            "nodeSelector": NO_NODE,
            "terminationGracePeriodSeconds": 0,
        },
    }


# Reclaim and Prometheus at test speed: a 2-minute window measured every 15 s from 5 s
# scrapes, and a node is stale after 30 s without a sample.
E2E_RECLAIM_ENV = {
    "PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL": "5s",
    "PILOTFISH_RECLAIM_INTERVAL_SECONDS": "15",
    "PILOTFISH_RECLAIM_WINDOW": "2m",
    "PILOTFISH_RECLAIM_STALE_AFTER_SECONDS": "30",
}


@dataclass
class Env:
    kubeconfig: Path
    api: k8s.ApiClient
    bins: Path
    layout: Layout | None  # set when the cluster is the local one this session controls
    spec: cluster.ClusterSpec | None

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [str(self.bins / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            check=check,
            input=input,
        )

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(
            [str(binaries.helm(self.bins)), "--kubeconfig", str(self.kubeconfig), *args],
            check=check,
        )

    def component_api(self, component: str) -> k8s.ApiClient:
        """A client with a Pilotfish component's own ServiceAccount token (local mode)."""
        if self.layout is None:
            pytest.skip("needs the local cluster's component kubeconfigs")
        return k8s_config.new_client_from_config(config_file=str(self.layout.kubeconfig(component)))

    @property
    def prometheus_url(self) -> str:
        """The cluster's Prometheus (`e2e.prom` asks it); PILOTFISH_E2E_PROMETHEUS_URL for an
        external cluster, which is skipped without it."""
        url = os.environ.get("PILOTFISH_E2E_PROMETHEUS_URL")
        if url:
            return url.rstrip("/")
        if self.spec is None:
            pytest.skip("needs a Prometheus: set PILOTFISH_E2E_PROMETHEUS_URL")
        return f"http://127.0.0.1:{self.spec.ports.prometheus}"

    def host_process(self, name: str) -> Component:
        """One of the local cluster's host processes: Pilotfish's (e.g. pilotfish-operator)
        or its Prometheus ("prometheus")."""
        layout = self.require_local()
        assert self.spec is not None
        comps = [*cluster.host_processes(layout, self.spec.ports), *cluster.monitoring(layout)]
        return next(c for c in comps if c.name == name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill a local host process the hard way (no cleanup), as a crash would.

        The whole supervised unit goes (its `pilotfish dev supervise` parent shares the
        process group), so nothing restarts it: it stays down until `restart`. To crash only
        the child and let the supervisor bring it back, kill `supervisor.child(...)`."""
        layout = self.require_local()
        proc = supervisor.running(layout, name)
        assert proc is not None, f"{name} is not running"
        os.killpg(proc.pid, sig)
        wait_until(f"{name} gone", lambda: supervisor.running(layout, name) is None, timeout=10)

    def restart(self, name: str) -> None:
        """Start a killed host process again, once the kernel has let go of its port."""
        component = self.host_process(name)
        wait_until(
            f"port {component.port} free",
            lambda: not supervisor.port_in_use(component.port),
            timeout=30,
        )
        supervisor.start(self.require_local(), component)

    def require_local(self) -> Layout:
        if self.layout is None:
            pytest.skip("needs the local control plane (host processes)")
        return self.layout


def run(
    cmd: list[str], check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, input=input)
    if check and res.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd[:4])} ... exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        )
    return res


def pilotfish_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `pilotfish` CLI as a user would, in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "pilotfish.cli.main", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


def dev_up_or_exit(state: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """`pilotfish dev up` in `state`, or end the session: a cluster that failed half-way is
    brought down first, since what it started holds ports the next cluster needs."""
    res = pilotfish_cli("dev", "--state", str(state), "up", *args, env=env)
    if res.returncode != 0:
        pilotfish_cli("dev", "--state", str(state), "down", "--purge")
        pytest.exit(f"pilotfish dev up failed:\n{res.stderr}", returncode=1)


def wait_until(
    what: str, check: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25
) -> T:
    """Poll `check` until it returns a truthy value; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except ApiException as e:
            last = e
            if e.status not in (404, 409, 429, 500, 503):
                raise
        else:
            if value:
                return value
            last = value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="session")
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    external = os.environ.get("PILOTFISH_E2E_KUBECONFIG")
    if external:
        path = Path(external)
        yield Env(
            path,
            k8s_config.new_client_from_config(config_file=str(path)),
            binaries.bin_dir(),
            None,
            None,
        )
        return
    if os.environ.get("PILOTFISH_E2E_KIND"):
        yield from _kind_env()
        return
    keep = bool(os.environ.get("PILOTFISH_E2E_KEEP"))
    state = Path(os.environ.get("PILOTFISH_E2E_STATE") or tempfile.mkdtemp(prefix="pilotfish-e2e-"))
    # The real node only when a test of this session needs it (root, and minutes to build).
    real_node = any(item.get_closest_marker("realnode") for item in request.session.items)
    spec = cluster.ClusterSpec(nodes=12, port_offset=E2E_PORT_OFFSET, real_node=real_node)
    dev_up_or_exit(
        state,
        "--nodes",
        str(spec.nodes),
        "--port-offset",
        str(spec.port_offset),
        *(["--real-node"] if real_node else []),
        env=E2E_RECLAIM_ENV,
    )
    layout = Layout(state)
    try:
        yield Env(
            layout.admin_kubeconfig, cluster.api_client(layout), binaries.bin_dir(), layout, spec
        )
    finally:
        if not keep:
            pilotfish_cli("dev", "--state", str(state), "down", "--purge")


def _kind_env() -> Iterator[Env]:
    kind = pytest.importorskip("pytest_kind")
    kc = kind.KindCluster("pilotfish-e2e")
    kc.create()
    try:
        bins = binaries.bin_dir()
        root = binaries.checkout_root()
        assert root is not None
        run(
            [
                str(binaries.helm(bins)),
                "--kubeconfig",
                str(kc.kubeconfig_path),
                "upgrade",
                "--install",
                "pilotfish",
                str(root / "charts" / "pilotfish"),
                "-n",
                names.SYSTEM_NAMESPACE,
                "--create-namespace",
                "--wait",
            ]
        )
        yield Env(
            Path(kc.kubeconfig_path),
            k8s_config.new_client_from_config(config_file=str(kc.kubeconfig_path)),
            bins,
            None,
            None,
        )
    finally:
        kc.delete()


def wait_for_controllers_back(env: Env, timeout: float = 240.0) -> None:
    """After the API server and etcd were down: wait until kube-controller-manager acts
    again (a new namespace gets its default ServiceAccount), so a test that took the control
    plane down leaves it working for the next one."""
    core = k8s.CoreV1Api(env.api)
    name = f"e2e-controllers-back-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        wait_until(
            "kube-controller-manager acting again (a default ServiceAccount)",
            lambda: core.read_namespaced_service_account("default", name),
            timeout=timeout,
        )
    finally:
        core.delete_namespace(name)


@contextlib.contextmanager
def team_namespace(env: Env, name: str, team: str = "e2e") -> Iterator[str]:
    """A tenant namespace labelled with `team`, whose TeamQuota grants every band without
    limits, ready for pods (its default ServiceAccount exists); deleted afterwards."""
    core = k8s.CoreV1Api(env.api)
    core.create_namespace({"metadata": {"name": name, "labels": {names.LABEL_TEAM: team}}})
    wait_until(
        f"the default ServiceAccount in {name}",
        lambda: core.read_namespaced_service_account("default", name),
        timeout=60,
    )
    from e2e.teams import open_quota  # it needs Env and wait_until from here

    open_quota(env, team, name)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture
def namespace(env: Env, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh tenant namespace for one test (`team_namespace`)."""
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"e2e-{base}-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]}"
    with team_namespace(env, name) as ns:
        yield ns


@dataclass(frozen=True)
class Tenant:
    """A tenant of one namespace holding only the built-in `edit` role there.

    `api` impersonates the tenant (the admin may impersonate), so every request it sends is
    authorized and admitted exactly as that tenant's own would be; `kubectl(...)` does the
    same through `kubectl --as`.
    """

    user: str
    namespace: str
    api: k8s.ApiClient
    env: Env

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.env.kubectl(
            "--as", self.user, "-n", self.namespace, *args, check=check, input=input
        )


def tenant_of(env: Env, namespace: str, user: str | None = None) -> Tenant:
    """Bind `edit` in `namespace` to a fresh user and return that user's client."""
    user = user or f"tenant-{namespace}"
    rbac = k8s.RbacAuthorizationV1Api(env.api)
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"edit-{user}"[:63]},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    api = k8s_config.new_client_from_config(config_file=str(env.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", "system:authenticated")
    authz = k8s.AuthorizationV1Api(api)

    def may_create(group: str, resource: str) -> bool:
        attrs = {"namespace": namespace, "verb": "create", "group": group, "resource": resource}
        review = authz.create_self_subject_access_review({"spec": {"resourceAttributes": attrs}})
        return bool(review.status.allowed)

    # Pods from `edit` itself; ServiceWorkloads through the chart's aggregation into `edit`.
    for group, resource in (("", "pods"), (names.GROUP, "serviceworkloads")):
        wait_until(
            f"{user} may create {resource} in {namespace}",
            functools.partial(may_create, group, resource),
            timeout=30,
        )
    return Tenant(user, namespace, api, env)


@pytest.fixture
def tenant(env: Env, namespace: str) -> Tenant:
    """The test namespace's tenant: only `edit` there, nothing cluster-wide."""
    return tenant_of(env, namespace)
