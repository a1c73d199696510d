"""`pilotfish dev` itself: idempotent up, clear start-up errors, stamped binaries, webhook scope."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import E2E_PORT_OFFSET, Env, pilotfish_cli, run, wait_until
from pilotfish import names
from pilotfish.devcluster import cluster, supervisor

VERSIONS = dict(
    line.split("=", 1)
    for line in (Path(__file__).parent.parent / "devcluster" / "versions.env")
    .read_text()
    .splitlines()
    if line and not line.startswith("#")
)


def test_binaries_report_their_pinned_versions(env: Env) -> None:
    out = run([str(env.bins / "kube-apiserver"), "--version"]).stdout
    assert out.strip() == f"Kubernetes {VERSIONS['KUBERNETES_VERSION']}"
    server = json.loads(env.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == VERSIONS["KUBERNETES_VERSION"]
    assert VERSIONS["ETCD_VERSION"].lstrip("v") in run([str(env.bins / "etcd"), "--version"]).stdout
    assert VERSIONS["HELM_VERSION"] in env.helm("version", "--short").stdout


def test_up_twice_is_a_no_op(env: Env) -> None:
    layout = env.require_local()
    before = {n: supervisor.running(layout, n) for n in cluster.status(layout.root)["components"]}
    res = pilotfish_cli("dev", "--state", str(layout.root), "up")
    assert res.returncode == 0, res.stderr
    after = {n: supervisor.running(layout, n) for n in before}
    assert before == after and all(after.values()), "a second up must not restart anything"
    status = pilotfish_cli("dev", "--state", str(layout.root), "status")
    assert status.returncode == 0, status.stdout
    assert json.loads(status.stdout)["readyNodes"] >= 12


def test_taken_port_names_the_component(tmp_path: Path) -> None:
    offset = E2E_PORT_OFFSET + 100
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", cluster.ClusterSpec(port_offset=offset).ports.etcd_client))
        blocker.listen()
        res = pilotfish_cli(
            "dev", "--state", str(tmp_path), "up", "--bare", "--port-offset", str(offset)
        )
    assert res.returncode == 1
    assert "etcd: port 127.0.0.1:" in res.stderr and "already in use" in res.stderr, res.stderr
    assert not cluster.down(tmp_path), "nothing was left running"


def test_missing_binary_names_it(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    res = pilotfish_cli(
        "dev", "--state", str(tmp_path / "s"), "up", "--bare", env={"PILOTFISH_BIN_DIR": str(empty)}
    )
    assert res.returncode == 1
    assert "missing etcd, kube-apiserver" in res.stderr, res.stderr


def test_component_dying_at_start_names_its_log(env: Env, tmp_path: Path) -> None:
    # A second cluster whose etcd data directory is a file: etcd exits at once.
    state = tmp_path / "s"
    (state / "etcd-data").parent.mkdir(parents=True)
    (state / "etcd-data").write_text("not a directory")
    res = pilotfish_cli(
        "dev", "--state", str(state), "up", "--bare", "--port-offset", str(E2E_PORT_OFFSET + 200)
    )
    assert res.returncode == 1
    assert "etcd: exited during start-up" in res.stderr and "etcd.log" in res.stderr, res.stderr
    cluster.down(state)


def _pod(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "example/x:1"}]},
    }


def test_webhooks_fail_closed_for_tenants_but_never_block_the_system(
    env: Env, namespace: str
) -> None:
    layout = env.require_local()
    assert env.spec is not None
    core = k8s.CoreV1Api(env.api)
    webhooks = env.host_process("pilotfish-webhooks")
    supervisor.stop(layout, webhooks.name)
    try:
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(namespace, _pod("denied"))
        assert err.value.status == 500 and "pilotfish" in err.value.body, err.value.body
        for system_ns in ("kube-system", names.SYSTEM_NAMESPACE):
            core.create_namespaced_pod(system_ns, _pod(f"allowed-{namespace[-6:]}"))
            core.delete_namespaced_pod(
                f"allowed-{namespace[-6:]}", system_ns, grace_period_seconds=0
            )
    finally:
        supervisor.start(layout, webhooks)
    wait_until(
        "tenant pod admitted once the webhooks are back",
        lambda: core.create_namespaced_pod(namespace, _pod("admitted")),
        timeout=30,
    )
