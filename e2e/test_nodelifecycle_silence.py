"""One machine goes quiet on the real control plane: at 40 s of lease silence (on the
operator's clock) the node lifecycle controller marks it Ready=Unknown with both unreachable
taints and takes its pods out of rotation; once its lease renews again the taints are
lifted. The full failure scenario (endpoints, eviction, replacements, the zone brake) is
`test_node_failure.py`; this module checks the silence clock alone, with a short wait.

kwok plays the kubelet (`e2e.lostnodes`). The nodes are this module's own, in zone
`e2e-lost-h1`: one is silenced, the other keeps the zone from being all silent. Silence is
timed from the moment this test saw the lease's last renewal (it polls the lease and the
node together), so both ends of the measured span carry the same polling error.
"""

from __future__ import annotations

import time
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, wait_until
from e2e.lostnodes import fault_zone, restore, silence
from pilotfish import names

pytestmark = [pytest.mark.e2e, pytest.mark.lostnodes]

ZONE: Final = "e2e-lost-h1"
UNREACHABLE_AFTER: Final = 40.0
WITHIN: Final = 2.0
POLL: Final = 0.2
UNREACHABLE: Final = "node.kubernetes.io/unreachable"


def taints(node: k8s.V1Node) -> set[tuple[str, str]]:
    return {(t.key, t.effect) for t in node.spec.taints or []}


def condition(obj: Any, type_: str) -> tuple[str, str] | None:
    for c in obj.status.conditions or []:
        if c.type == type_:
            return str(c.status), str(c.reason or "")
    return None


def status(obj: Any, type_: str) -> str | None:
    """The condition's status alone (kwok's reasons are its own)."""
    found = condition(obj, type_)
    return None if found is None else found[0]


def pinned_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {names.LABEL_BAND: "production", "app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},  # exactly this node
            "containers": [{"name": "c", "image": "example/app:1"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def test_a_silent_node_is_unreachable_at_the_timeout_and_returns_untainted(
    env: Env, namespace: str
) -> None:
    core = k8s.CoreV1Api(env.api)
    leases = k8s.CoordinationV1Api(env.api)
    with fault_zone(env, ZONE, 2) as (lost, peer):
        wait_until("kwok's not-ready taint lifted", lambda: not taints(core.read_node(lost)))
        core.create_namespaced_pod(namespace, pinned_pod("on-lost", lost))
        wait_until(
            "the pod Ready",
            lambda: status(core.read_namespaced_pod("on-lost", namespace), "Ready") == "True",
            timeout=60,
        )

        def lease_rv() -> str:
            return str(
                leases.read_namespaced_lease(lost, "kube-node-lease").metadata.resource_version
            )

        # Silence right after a renewal seen, so the span is timed from a known renewal.
        before = lease_rv()
        last_rv = wait_until(
            "a lease renewal", lambda: (rv := lease_rv()) != before and rv, 30, POLL
        )
        last_seen = time.monotonic()
        silence(env, lost)
        try:
            deadline = last_seen + UNREACHABLE_AFTER + 15
            marked: float | None = None
            while marked is None and time.monotonic() < deadline:
                polled = time.monotonic()
                rv = lease_rv()
                if rv != last_rv:  # kwok renewed once more before it saw the label
                    last_rv, last_seen = rv, polled
                node = core.read_node(lost)
                if condition(node, "Ready") == ("Unknown", "NodeStatusUnknown") and taints(
                    node
                ) >= {(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")}:
                    marked = polled
                else:
                    time.sleep(POLL)
            assert marked is not None, f"{lost} never marked unreachable: {node.status}"
            silent = marked - last_seen
            assert UNREACHABLE_AFTER - POLL - 0.3 <= silent <= UNREACHABLE_AFTER + WITHIN, (
                f"marked unreachable after {silent:.1f}s of silence"
            )
            pod = core.read_namespaced_pod("on-lost", namespace)
            assert condition(pod, "Ready") == ("False", "NodeUnreachable")
            assert status(core.read_node(peer), "Ready") == "True", "only the silent node"
        finally:
            restore(env, lost)

        def returned() -> bool:
            node = core.read_node(lost)
            return status(node, "Ready") == "True" and not taints(node)

        wait_until(f"{lost} Ready and untainted", returned, timeout=60)
        # The pod is kwok's again, still Running and bound there. kwok does not re-report
        # the Ready of a Running pod it takes back (its ready stage ran once, at start), so
        # unlike a kubelet's status sync it leaves the NodeUnreachable mark in place; the
        # failure scenario evicts such pods, and the node comes back empty.
        pod = core.read_namespaced_pod("on-lost", namespace)
        assert pod.spec.node_name == lost and pod.status.phase == "Running"
