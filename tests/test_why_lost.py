"""`kubectl pilotfish why` for a pod on a lost node and for an at-most-one pod: when its node
was marked unreachable, when it was evicted and why, and what its identity waits on."""

from __future__ import annotations

import copy
import datetime
import io
from typing import Any

from pilotfish import names, timeutil, workloads
from pilotfish.cli import why
from pilotfish.cli.whylost import explain_lost
from pilotfish.kube.rest import NODES, PODS, SERVICEWORKLOADS
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
NODE = "kwok-a-1"


def at(seconds: float) -> str:
    return timeutil.format_time(NOW + datetime.timedelta(seconds=seconds))


def cond(kind: str, status: str, reason: str, seconds: float, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at(seconds),
    }


def pod(
    *, epoch: str | None = None, owner: str | None = "web", conditions: list[Any] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web-1", "namespace": "shop", "uid": "u1", "labels": {}}
    if owner:
        meta["ownerReferences"] = [
            {"kind": "ServiceWorkload", "name": owner, "uid": "sw", "controller": True}
        ]
        meta["labels"][workloads.LABEL_WORKLOAD] = owner
    if epoch is not None:
        meta["annotations"] = {names.ANNOTATION_EPOCH: epoch}
    return {
        "metadata": meta,
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "conditions": conditions or []},
    }


UNREACHABLE = cond("Ready", "False", "NodeUnreachable", -90)
EVICTED = cond("DisruptionTarget", "True", workloads.DISRUPTION_NODE_LOST, -30, "node lost")


def node(silent: bool = True) -> dict[str, Any]:
    taints = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": at(-90)},
    ]
    ready = (
        cond("Ready", "Unknown", "NodeStatusUnknown", -90, "lease silent for 40s.")
        if silent
        else cond("Ready", "True", "KubeletReady", -900)
    )
    return {
        "metadata": {"name": NODE},
        "spec": {"taints": taints if silent else []},
        "status": {"conditions": [ready]},
    }


def sw(condition: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "shop", "uid": "sw"},
        "status": {"conditions": [condition] if condition else []},
    }


def test_a_pod_on_a_lost_node_says_since_when_and_that_it_was_replaced() -> None:
    lines = explain_lost(pod(conditions=[UNREACHABLE, EVICTED]), node(), None, NOW)
    assert lines == [
        f"Node {NODE} unreachable since {at(-90)} (90s ago) (lease silent): lease silent for 40s.",
        f"Evicted at {at(-30)} (30s ago) (PilotfishNodeLost): its controller replaced it; this "
        f"copy stays Terminating until {NODE} returns and its kubelet removes it, and no "
        "controller counts it.",
    ]


def test_a_tenant_who_cannot_read_the_node_gets_the_pod_s_own_evidence() -> None:
    line, _ = explain_lost(pod(conditions=[UNREACHABLE]), None, None, NOW)
    assert line == (
        f"Node {NODE} unreachable since {at(-90)} (90s ago) (lease silent; from the pod's "
        "Ready condition, NodeUnreachable, as the node cannot be read)."
    )


def test_an_unowned_pod_evicted_by_upstream_is_not_replaced() -> None:
    evicted = cond("DisruptionTarget", "True", "DeletionByTaintManager", -5)
    [line] = explain_lost(pod(owner=None, conditions=[evicted]), None, None, NOW)
    assert line == (
        f"Evicted at {at(-5)} (5s ago) (DeletionByTaintManager): no controller owns it, so "
        "nothing replaces it."
    )


def test_a_pod_of_a_lost_node_not_evicted_yet_says_what_comes_next() -> None:
    lines = explain_lost(pod(conditions=[UNREACHABLE]), node(), None, NOW)
    assert lines[1] == (
        "It is evicted once the node has been unreachable for the eviction wait (60 s by "
        "default; not while a zone brake holds the zone), and its controller then replaces it."
    )
    braked = explain_lost(pod(conditions=[cond("Ready", "True", "", -600)]), node(), None, NOW)
    assert braked[1].startswith("It still reports Ready, so its endpoints keep it")
    assert f"ZoneBrake Events on node {NODE}" in braked[1]
    # An at-most-one pod is never evicted: no such line.
    assert not any("evicted once" in s for s in explain_lost(pod(epoch="2"), node(), None, NOW))


def test_a_healthy_ordinary_pod_gets_no_lost_node_lines() -> None:
    not_target = cond("DisruptionTarget", "False", "Whatever", -5)
    assert explain_lost(pod(conditions=[not_target]), node(silent=False), None, NOW) == []
    assert explain_lost(pod(), None, None, NOW) == []


def test_an_at_most_one_pod_waiting_for_its_lease_to_expire_says_until_when() -> None:
    waiting = cond(
        "AtMostOne",
        "False",
        "WaitingForLeaseExpiry",
        -20,
        f"pod web-1 on silent node {NODE}: its lease expires for sure at {at(35)}; then epoch 4.",
    )
    lines = explain_lost(pod(epoch="3", conditions=[UNREACHABLE]), node(), sw(waiting), NOW)
    assert lines[0].startswith(f"Node {NODE} unreachable since {at(-90)}")
    assert lines[1].startswith(
        "It is an at-most-one pod (epoch 3, ServiceWorkload web): it is never evicted"
    )
    assert lines[2] == (
        "ServiceWorkload web waits for the old holder's lease to expire (WaitingForLeaseExpiry, "
        f"20s ago): pod web-1 on silent node {NODE}: its lease expires for sure at {at(35)}; "
        "then epoch 4."
    )


def test_an_at_most_one_pod_whose_identity_is_held() -> None:
    held = cond("AtMostOne", "True", "Held", -600, "web-1 holds epoch 3")
    lines = explain_lost(pod(epoch="3"), node(silent=False), sw(held), NOW)
    assert (
        lines[-1]
        == "ServiceWorkload web: the identity is held (Held, 10m ago): web-1 holds epoch 3."
    )
    other = cond("AtMostOne", "False", "Releasing", -1)
    assert explain_lost(pod(epoch="3"), None, sw(other), NOW)[-1] == (
        "ServiceWorkload web: AtMostOne False (Releasing, 1s ago)."
    )
    assert explain_lost(pod(epoch="3"), None, sw(None), NOW)[-1] == (
        "ServiceWorkload web reports no AtMostOne condition yet."
    )
    assert explain_lost(pod(epoch="3"), None, None, NOW)[-1] == (
        "ServiceWorkload web was not found (or cannot be read)."
    )


def test_explain_lost_does_not_modify_its_inputs() -> None:
    p, n, w = pod(epoch="1", conditions=[UNREACHABLE, EVICTED]), node(), sw(None)
    before = copy.deepcopy((p, n, w))
    explain_lost(p, n, w, NOW)
    assert (p, n, w) == before


async def test_why_reads_the_node_and_the_workload() -> None:
    api = FakeApi()
    waiting = cond("AtMostOne", "False", "WaitingForLeaseExpiry", -20, f"until {at(35)}")
    api.put(PODS.path("shop", "web-1"), pod(epoch="3", conditions=[UNREACHABLE]))
    api.put(NODES.path(None, NODE), node())
    api.put(SERVICEWORKLOADS.path("shop", "web"), sw(waiting))
    out, err = io.StringIO(), io.StringIO()
    assert await why.run(api, "shop", "web-1", FakeClock(NOW), out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert f"Node {NODE} unreachable since {at(-90)} (90s ago) (lease silent)" in text
    assert f"(WaitingForLeaseExpiry, 20s ago): until {at(35)}." in text
    assert "node" not in err.getvalue() and "ServiceWorkload" not in err.getvalue()

    # As a tenant: the node is forbidden, and that is no warning.
    api.fail_next("GET", NODES.path(None, NODE), 403)
    out, err = io.StringIO(), io.StringIO()
    assert await why.run(api, "shop", "web-1", FakeClock(NOW), out, err) == 0
    assert "as the node cannot be read" in out.getvalue()
    assert "node" not in err.getvalue()
