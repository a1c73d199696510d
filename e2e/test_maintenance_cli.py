"""`kubectl pilotfish drain NODE --wait` and `why nm/NAME` against the real control plane, run
as an operator of the cluster would: the plugin's entry point with the admin kubeconfig.

The drained node is a fresh kwok node of a zone of this test's own (`fault_zone`), running
the one pod of a single-replica ServiceWorkload pinned to that zone, so the drain has a
surge-first pod to move and nothing of the rest of the suite is touched.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from e2e import maintenance as nm
from e2e.conftest import Env, wait_until
from e2e.lostnodes import fault_zone
from e2e.test_kubectl_plugin import ok, plugin
from e2e.test_serviceworkload import (
    create_sw,
    ns,
    pods_of,
    ready_pods,
    template,
    wait_rolled_out,
    workload,
)
from pilotfish import names

__all__ = ["ns"]  # the fixture: a namespace whose team may run production pods

pytestmark = [pytest.mark.e2e]

ZONE = "e2e-maint-cli"
NAME = "cli-drain"


def evictable_on(env: Env, node: str) -> list[str]:
    """Pods a drain must move off `node`: not DaemonSet pods, not mirror pods, not finished."""
    pods = k8s.CoreV1Api(env.api).list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}"
    )
    left = []
    for p in pods.items:
        owners = p.metadata.owner_references or []
        if any(o.controller and o.kind == "DaemonSet" for o in owners):
            continue
        if "kubernetes.io/config.mirror" in (p.metadata.annotations or {}):
            continue
        if p.status.phase in ("Succeeded", "Failed"):
            continue
        left.append(f"{p.metadata.namespace}/{p.metadata.name}")
    return left


def test_drain_wait_exits_0_with_the_node_cordoned_and_its_pods_moved(env: Env, ns: str) -> None:
    with fault_zone(env, ZONE, 2) as nodes, nm.removed(env, NAME):
        pinned = template(nodeSelector={names.LABEL_ZONE: ZONE})
        create_sw(env, ns, workload("solo", ns, 1, template=pinned))
        wait_rolled_out(env, ns, "solo")
        (old,) = ready_pods(env, ns, "solo")
        node = old.spec.node_name
        other = next(n for n in nodes if n != node)

        res = plugin(
            env.kubeconfig, "drain", node, "--name", NAME, "--reason", "e2e kernel upgrade",
            "--wait", "--timeout", "4m",
        )  # fmt: skip
        out = ok(res)
        lines = out.splitlines()
        assert lines[0] == f"nodemaintenance.pilotfish.io/{NAME} created", out
        assert f"node {node}: Drained" in lines, out
        assert lines[-1] == f"nodemaintenance {NAME} done: 1/1 nodes drained", out

        assert nm.unschedulable(env, node), "the drained node stays cordoned"
        assert evictable_on(env, node) == [], "no evictable pod left on the drained node"
        placed = wait_until(
            "solo Ready on the other node",
            lambda: [p.spec.node_name for p in ready_pods(env, ns, "solo")] == [other] or None,
            timeout=60,
        )
        assert placed
        assert [p.metadata.name for p in pods_of(env, ns, "solo")] != [old.metadata.name]

        header, row = env.kubectl("get", "nm", NAME).stdout.splitlines()
        assert header.split() == ["NAME", "PHASE", "PROGRESS", "BLOCKED", "AGE"], header
        assert row.split()[:4] == [NAME, "Done", "1/1", "False"], row

        why = ok(plugin(env.kubeconfig, "why", f"nm/{NAME}"))
        assert "Phase Done: 1/1 nodes drained." in why, why
        assert f"Node {node}: Drained: no pod left to evict." in why, why
