"""At-most-one ServiceWorkloads: the identity Lease, fencing epochs, the release of a pod on
a lost machine only after its lease surely expired, resumable after a crash at any step,
rollouts that replace, and (for ordinary workloads) pods evicted from a lost node not counted.
"""

from __future__ import annotations

import datetime

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from pilotfish import names
from pilotfish.api import ServiceWorkload, crdgen
from pilotfish.api.serviceworkload import ServiceWorkloadSpec
from pilotfish.kube.rest import PODS
from pilotfish.operators.serviceworkload import atmostone
from pilotfish.timeutil import FakeClock, format_time
from pilotfish.workloads import DISRUPTION_NODE_LOST
from tests.amo_harness import RELEASE, SETTINGS, Crash, Machines, amo_workload, create, start
from tests.rollout_harness import SW, condition, status, template

NS = "ns"


def amo_condition(api: Machines) -> dict[str, str]:
    for c in status(api).get("conditions") or []:
        if c["type"] == atmostone.CONDITION:
            return dict(c)
    raise AssertionError(f"no AtMostOne condition in {status(api)}")


def waiting_gauge() -> float | None:
    return REGISTRY.get_sample_value("pilotfish_serviceworkload_at_most_one_waiting")


def names_of(pods: list[dict[str, object]]) -> list[str]:
    return sorted(str(p["metadata"]["name"]) for p in pods)  # type: ignore[index]


# --- the identity and its first holder ---------------------------------------------------


async def test_first_pod_holds_the_lease_at_epoch_1() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        [pod] = api.pods()
        assert pod["metadata"]["name"] == "web-e1"
        assert api.epoch(pod) == 1
        env = pod["spec"]["containers"][0]["env"]
        assert {
            "name": "PILOTFISH_EPOCH",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{names.ANNOTATION_EPOCH}']"}
            },
        } in env
        lease = api.lease()
        assert lease["spec"]["holderIdentity"] == "web-e1"
        assert lease["spec"]["leaseDurationSeconds"] == SETTINGS.unreachable_after
        assert lease["metadata"]["annotations"][names.ANNOTATION_EPOCH] == "1"
        [owner] = lease["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("ServiceWorkload", api.sw()["metadata"]["uid"])
        assert "acquireTime" in lease["spec"]  # the holder was seen created
        c = amo_condition(api)
        assert (c["status"], c["reason"]) == ("True", atmostone.REASON_HELD)
        assert "web-e1" in c["message"] and "epoch 1" in c["message"]
    finally:
        await w.stop()


# --- a lost machine ------------------------------------------------------------------------


async def test_no_replacement_before_the_release_period_then_exactly_after() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.schedule()  # web-e1 on n1
        await w.converge()
        api.silence("n1")
        result = None
        for _ in range(54):
            api.tick(1.0)
            result = await w.converge()
            assert names_of(api.pods()) == ["web-e1"], "replaced before the lease expired"
        api.tick(0.9)  # 54.9 s of silence
        result = await w.converge()
        assert names_of(api.pods()) == ["web-e1"]
        c = amo_condition(api)
        assert (c["status"], c["reason"]) == ("False", atmostone.REASON_WAITING)
        release_at = format_time(api.clock.now() + datetime.timedelta(seconds=0.1))
        assert "web-e1" in c["message"] and "node n1" in c["message"]
        assert f"releases at about {release_at}" in c["message"]
        assert result is not None and result.after is not None
        assert 0.1 <= result.after <= 0.2  # the exact remaining time, plus slack
        assert waiting_gauge() == 1
        reasons = [e["reason"] for e in await w.events()]
        assert reasons.count(atmostone.EVENT_WAITING) == 1

        api.tick(0.1)  # 55 s: released
        await w.converge()
        [pod] = api.pods(live=False)
        assert pod["metadata"]["name"] == "web-e2" and api.epoch(pod) == 2
        lease = api.lease()
        assert lease["spec"]["holderIdentity"] == "web-e2"
        assert lease["metadata"]["annotations"][names.ANNOTATION_EPOCH] == "2"
        api.schedule()
        await w.converge()
        assert api.obj(PODS.path(NS, "web-e2"))["spec"]["nodeName"] != "n1"  # type: ignore[index]
        assert amo_condition(api)["reason"] == atmostone.REASON_HELD
        assert atmostone.EVENT_RELEASED in [e["reason"] for e in await w.events()]
        assert waiting_gauge() == 0
    finally:
        await w.stop()


async def test_a_node_that_returns_before_the_release_keeps_its_pod() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        api.silence("n1")
        api.tick(50)
        await w.converge()
        assert amo_condition(api)["reason"] == atmostone.REASON_WAITING
        added: list[str] = []
        w.ctrl.queue.add = added.append  # type: ignore[method-assign,assignment]
        api.restore("n1")
        await w.api.settle()
        assert added == ["ns/web"], "the node's renewal must bring the waiting workload back"
        api.tick(10)
        await w.converge()
        assert names_of(api.pods()) == ["web-e1"]
        assert api.lease()["spec"]["holderIdentity"] == "web-e1"
        assert amo_condition(api)["reason"] == atmostone.REASON_HELD
    finally:
        await w.stop()


async def test_a_node_never_seen_is_never_released() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.edit(PODS.path(NS, "web-e1"), lambda p: p["spec"].update(nodeName="ghost"))
        api.tick(600)
        await w.converge()
        assert names_of(api.pods()) == ["web-e1"]
    finally:
        await w.stop()


async def test_a_failed_holder_is_replaced_under_a_new_epoch() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        api.edit(PODS.path(NS, "web-e1"), lambda p: p["status"].update(phase="Failed"))
        await w.converge()
        assert names_of(api.pods(live=False)) == ["web-e2"]
        assert api.epoch(api.pods()[0]) == 2
    finally:
        await w.stop()


# --- crashes between the release steps -----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path_part"),
    [
        ("DELETE", "/pods/web-e1"),  # after the Lease bump, before the old pod's delete
        ("POST", "/pods"),  # after the delete, before the create
        ("PUT", "/leases/web-at-most-one"),  # after the create, before the Lease records it
    ],
)
async def test_a_crash_between_release_steps_resumes_without_two_live_pods(
    method: str, path_part: str
) -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        api.silence("n1")
        api.tick(RELEASE)
        if method == "PUT":  # the create's own round succeeds; the next one records it
            await w.step()
            api.crash_before(method, path_part)
        else:
            api.crash_before(method, path_part)
        with pytest.raises(Crash):
            for _ in range(3):
                await w.step()
        assert len(api.live()) <= 1
    finally:
        await w.stop()

    w = await start(api)  # a new process: it has seen no renewal yet
    try:
        for _ in range(int(RELEASE) + 2):
            await w.converge()
            assert len(api.live()) <= 1, api.live()
            api.tick(1)
        api.schedule()
        await w.converge()
        [pod] = api.pods(live=False)
        assert pod["metadata"]["name"] == "web-e2" and api.epoch(pod) == 2
        assert api.lease()["spec"]["holderIdentity"] == "web-e2"
        assert "acquireTime" in api.lease()["spec"]
    finally:
        await w.stop()


async def test_a_restarted_controller_waits_the_whole_period_again() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    await w.converge()
    api.schedule()
    await w.converge()
    api.silence("n1")
    api.tick(50)
    await w.converge()
    await w.stop()

    w = await start(api)
    try:
        for _ in range(54):  # 104 s of real silence, 54 s of it seen by this process
            api.tick(1)
            await w.converge()
            assert names_of(api.pods()) == ["web-e1"]
        api.tick(1)
        await w.converge()
        assert names_of(api.pods(live=False)) == ["web-e2"]
    finally:
        await w.stop()


# --- rollouts and scaling ------------------------------------------------------------------


async def test_a_rollout_replaces_and_never_surges() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        api.edit(SW, lambda sw: sw["spec"].update(template=template("app:2")))
        await w.converge()
        [old] = api.pods(live=False)
        assert old["metadata"]["name"] == "web-e1" and old["metadata"].get("deletionTimestamp")
        assert api.lease()["spec"]["holderIdentity"] == "web-e2"
        assert amo_condition(api)["reason"] == atmostone.REASON_REPLACING
        api.tick(30)
        await w.converge()
        assert names_of(api.pods(live=False)) == ["web-e1"], "created before the old one was gone"
        api.kubelets()  # the old pod's termination finishes
        await w.converge()
        [new] = api.pods(live=False)
        assert new["metadata"]["name"] == "web-e2" and api.epoch(new) == 2
        assert new["spec"]["containers"][0]["image"] == "app:2"
        assert status(api)["updateRevision"] == new["metadata"]["labels"]["pilotfish.io/revision"]
    finally:
        await w.stop()


async def test_scale_to_zero_and_back_raises_the_epoch() -> None:
    api = Machines(FakeClock())
    w = await create(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        api.edit(SW, lambda sw: sw["spec"].update(replicas=0))
        await w.converge()
        api.kubelets()
        await w.converge()
        assert api.pods(live=False) == []
        assert amo_condition(api)["reason"] == atmostone.REASON_NO_REPLICAS
        api.edit(SW, lambda sw: sw["spec"].update(replicas=1))
        await w.converge()
        [pod] = api.pods()
        assert api.epoch(pod) == 2
    finally:
        await w.stop()


async def test_pods_from_before_at_most_one_are_gone_before_the_holder_starts() -> None:
    api = Machines(FakeClock())
    api.put(SW, amo_workload() | {"spec": {**amo_workload()["spec"], "atMostOne": False}})
    w = await start(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        [ordinary] = api.pods()
        api.edit(SW, lambda sw: sw["spec"].update(atMostOne=True))
        await w.converge()
        assert names_of(api.pods(live=False)) == [ordinary["metadata"]["name"]]
        api.kubelets()
        await w.converge()
        assert names_of(api.pods(live=False)) == ["web-e1"]
    finally:
        await w.stop()


# --- ordinary workloads: pods evicted from a lost node ------------------------------------


def evict_node_lost(pod: dict[str, object]) -> None:
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"  # type: ignore[index]
    pod["status"]["conditions"].append(  # type: ignore[index]
        {"type": "DisruptionTarget", "status": "True", "reason": DISRUPTION_NODE_LOST}
    )


async def test_pods_evicted_from_a_lost_node_are_not_counted() -> None:
    api = Machines(FakeClock())
    api.put(SW, amo_workload(3) | {"spec": {**amo_workload(3)["spec"], "atMostOne": False}})
    w = await start(api)
    try:
        await w.converge()
        api.schedule()
        await w.converge()
        api.silence("n1")
        lost = api.pods()[:2]
        for p in lost:  # evicted (maxSurge 1: counting them would allow one replacement)
            api.edit(PODS.path(NS, p["metadata"]["name"]), evict_node_lost)
        await w.converge()
        assert len(api.pods()) == 3, "replacements wait for pods that are Terminating forever"
        api.schedule()  # the replacements run elsewhere: the workload is whole again
        await w.converge()
        assert status(api)["replicas"] == 3
        assert condition(api, "Available") == ("True", "MinimumReplicasAvailable")
    finally:
        await w.stop()


# --- the CRD -----------------------------------------------------------------------------


def test_at_most_one_refuses_more_than_one_replica() -> None:
    base = {"team": "payments", "template": {"spec": {"containers": [{"name": "a"}]}}}
    with pytest.raises(ValidationError, match="replicas must be 0 or 1 when atMostOne is true"):
        ServiceWorkloadSpec.model_validate({**base, "atMostOne": True, "replicas": 2})
    for replicas in (0, 1):
        ServiceWorkloadSpec.model_validate({**base, "atMostOne": True, "replicas": replicas})
    ServiceWorkloadSpec.model_validate({**base, "atMostOne": False, "replicas": 2})

    spec = crdgen.openapi_schema(ServiceWorkload)["properties"]["spec"]
    [rule] = spec["x-kubernetes-validations"]
    assert rule["fieldPath"] == ".replicas"
    assert "self.replicas <= 1" in rule["rule"] and "self.atMostOne" in rule["rule"]
    assert "replicas must be 0 or 1 when atMostOne is true" in rule["message"]
