"""GatePolicy status on the in-memory API, with the real factory and shared informers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pilotfish import gates
from pilotfish.kube import projections
from pilotfish.kube.rest import GATEPOLICIES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, Result
from pilotfish.operators.gatepolicy import GatePolicyStatusController
from pilotfish.operators.gatepolicy.controller import INTERVAL
from pilotfish.timeutil import FakeClock
from tests.builders import gate, gate_policy_spec
from tests.fakeapi import FakeApi

NS = "team-a"
GATE = "gates.pilotfish.io/data-ready"
POLICY = GATEPOLICIES.path(NS, "p")


def policy_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "GatePolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": gate_policy_spec(**spec),
    }


def gated_pod(name: str, held: bool = True) -> dict[str, Any]:
    record = gates.PodGates(
        "2026-01-01T00:00:00Z",
        {GATE: gates.GateRecord("p", 1, {"type": "GateSignal"}, 60, "2026-01-01T00:01:00Z")},
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {gates.LABEL_GATED: "true"},
            "annotations": {gates.ANNOTATION_RECORD: record.encode()},
        },
        "spec": {"schedulingGates": [{"name": GATE}] if held else [], "containers": []},
        "status": {"phase": "Pending"},
    }


def status(api: FakeApi) -> dict[str, Any]:
    current = api.obj(POLICY)
    assert current is not None
    return dict(current.get("status") or {})


def status_writes(api: FakeApi) -> int:
    return len(api.writes(POLICY + "/status"))


@pytest.fixture
async def handlers() -> AsyncIterator[tuple[FakeApi, GatePolicyStatusController]]:
    api = FakeApi()
    api.put(POLICY, policy_body())
    for i in range(3):
        api.put(PODS.path(NS, f"pod-{i}"), gated_pod(f"pod-{i}"))
    api.put(PODS.path(NS, "plain"), {"metadata": {"name": "plain"}, "spec": {}})
    controller = GatePolicyStatusController(Runtime.build(api, clock=FakeClock()))
    factory = asyncio.create_task(controller.rt.factory.run())
    await asyncio.wait_for(controller.rt.factory.wait_synced(), 5)
    yield api, controller
    factory.cancel()
    await asyncio.gather(factory, return_exceptions=True)


async def sync(api: FakeApi, controller: GatePolicyStatusController) -> Result:
    await api.settle()
    return await controller.reconcile(f"{NS}/p")


async def test_gated_pods_follow_the_pod_informer_and_unchanged_status_is_not_written(
    handlers: tuple[FakeApi, GatePolicyStatusController],
) -> None:
    api, controller = handlers
    assert not (await sync(api, controller)).retry
    assert status(api)["gatedPods"] == 3
    assert status(api)["observedGeneration"] == 1
    [valid] = status(api)["conditions"]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "True", "Valid")
    assert status_writes(api) == 1
    await sync(api, controller)
    assert status_writes(api) == 1, "nothing changed, nothing written"
    api.put(PODS.path(NS, "pod-0"), gated_pod("pod-0", held=False))  # released
    api.remove(PODS.path(NS, "pod-1"))
    await api.settle()
    due = controller.queue.scheduled(f"{NS}/p")
    assert due is not None and due <= INTERVAL, "a count change schedules one visit"
    await sync(api, controller)
    assert status(api)["gatedPods"] == 1
    assert status_writes(api) == 2
    pod_reads = [c for c in api.calls if c.method == "GET" and c.path.endswith("/pods")]
    assert len(pod_reads) == 1, "pods are listed once, by the informer, never by a reconcile"


async def test_the_write_is_conditional_on_the_version_decided_from(
    handlers: tuple[FakeApi, GatePolicyStatusController],
) -> None:
    api, controller = handlers
    await api.settle()
    # Someone edits the policy after the informer's copy was taken: the write must not land.
    api.before(
        "PATCH",
        "/status",
        lambda: api.put(POLICY, policy_body(gates=[gate(GATE, timeoutSeconds=5)])),
    )
    result = await controller.reconcile(f"{NS}/p")
    assert result.retry
    assert "gatedPods" not in status(api)
    assert not (await sync(api, controller)).retry  # decided again from the new version
    assert status(api)["observedGeneration"] == 2


async def test_an_invalid_policy_says_why(
    handlers: tuple[FakeApi, GatePolicyStatusController],
) -> None:
    api, controller = handlers
    rival = policy_body(gates=[gate(GATE, timeoutSeconds=5)])
    rival["metadata"]["name"] = "a-first"
    api.put(GATEPOLICIES.path(NS, "a-first"), rival)
    await sync(api, controller)
    [valid] = status(api)["conditions"]
    assert (valid["status"], valid["reason"]) == ("False", "GateConflict")
    assert f"gate {GATE} is also declared by GatePolicy a-first" in valid["message"]
    assert "timeoutSeconds 600 here, 5 in a-first" in valid["message"]


async def test_a_deleted_or_deleting_policy_gets_no_status(
    handlers: tuple[FakeApi, GatePolicyStatusController],
) -> None:
    api, controller = handlers
    body = policy_body()
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    body["metadata"]["finalizers"] = ["example.com/keep"]
    api.put(POLICY, body)
    await sync(api, controller)
    gone = policy_body()
    gone["metadata"]["name"] = "gone"
    api.put(GATEPOLICIES.path(NS, "gone"), gone)
    api.remove(GATEPOLICIES.path(NS, "gone"))
    await api.settle()
    assert (await controller.reconcile(f"{NS}/gone")) == DONE
    assert status_writes(api) == 0


def test_it_shares_the_process_informers() -> None:
    api = FakeApi()
    rt = Runtime.build(api)
    pods = rt.factory.informer(PODS, projection=projections.pod)  # another controller's
    policies = rt.factory.informer(GATEPOLICIES)
    controller = GatePolicyStatusController(rt)
    assert sorted(rt.factory.informers) == ["gatepolicies", "pods"]
    assert controller.pods is pods and controller.policies is policies
    assert pods.handlers, "the gated-pod counts are fed by the shared informer"
