"""`kubectl pilotfish why` for pods on a lost machine, against the real control plane.

One node of a zone of this module's own goes silent under an at-most-one ServiceWorkload's
pod and an ordinary one's; one wait covers both: `why` on the at-most-one pod says the node is
unreachable and that its identity waits for the old lease to expire, until when; on the
ordinary pod, once evicted, when and why, and that its controller replaced it. As a tenant
(who may not read nodes) the pod's own Ready condition dates the silence.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, tenant_of, wait_until
from e2e.lostnodes import fault_zone, restore, silence
from e2e.test_kubectl_plugin import ok, plugin
from e2e.test_serviceworkload import condition, create_sw, get_sw, ns, template, workload

__all__ = ["ns"]  # the fixture: a namespace whose team may run production pods

pytestmark = pytest.mark.lostnodes

ZONE = "e2e-lost-why"


def pod_on(env: Env, namespace: str, workload_name: str, node: str) -> dict[str, Any] | None:
    pods = k8s.CoreV1Api(env.api).list_namespaced_pod(
        namespace, label_selector=f"pilotfish.io/workload={workload_name}"
    )
    for p in pods.items:
        if p.spec.node_name == node and p.status.phase == "Running":
            return {"name": p.metadata.name, "pod": p}
    return None


def disrupted(env: Env, namespace: str, name: str) -> bool:
    p = k8s.CoreV1Api(env.api).read_namespaced_pod(name, namespace)
    return any(
        c.type == "DisruptionTarget" and c.status == "True" for c in p.status.conditions or []
    )


def test_why_explains_pods_on_a_lost_node(env: Env, ns: str) -> None:
    env.require_local()
    with fault_zone(env, ZONE, 2) as nodes:
        target = nodes[0]
        pinned = template(nodeSelector={"kubernetes.io/hostname": target})
        create_sw(env, ns, workload("solo", ns, 1, atMostOne=True, template=pinned))
        create_sw(env, ns, workload("web", ns, 1, template=pinned))
        solo = wait_until("solo running", lambda: pod_on(env, ns, "solo", target), 90)["name"]
        web = wait_until("web running", lambda: pod_on(env, ns, "web", target), 90)["name"]
        silence(env, target)
        try:
            wait_until(
                "solo waits for its lease to expire",
                lambda: (
                    condition(get_sw(env, ns, "solo"), "AtMostOne").get("reason")
                    == "WaitingForLeaseExpiry"
                ),
                timeout=120,
            )
            out = ok(plugin(env.kubeconfig, "why", solo, "-n", ns))
            assert f"Node {target} unreachable since " in out and "(lease silent)" in out, out
            assert "It is an at-most-one pod (epoch " in out, out
            assert "ServiceWorkload solo waits for the old holder's lease to expire" in out, out
            assert "releases at about" in out, out

            tenant = tenant_of(env, ns)
            out = ok(plugin(env.kubeconfig, "why", solo, "-n", ns, "--as", tenant.user))
            assert "from the pod's Ready condition, NodeUnreachable" in out, out

            wait_until("web's pod evicted", lambda: disrupted(env, ns, web), timeout=150)
            out = ok(plugin(env.kubeconfig, "why", web, "-n", ns))
            assert "(PilotfishNodeLost): its controller replaced it" in out, out
        finally:
            restore(env, target)
