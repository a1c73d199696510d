"""Admission refuses quantities beyond every sane bound, naming the field, value and bound.

Pods through the validating pod review (the check is one of POD_CHECKS); TeamQuotas through
their own review, `/validate/teamquotas`, also over the webhook server's HTTP face.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from pilotfish import quantity
from pilotfish.webhooks import pods, quantities, server
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.podchecks import POD_CHECKS, PodAdmission

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {
        "containers": [
            {"name": "a", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "b", "image": "x"},
        ],
    },
}


def pod_with(**resources: Any) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][1]["resources"] = resources
    return pod


def pod_request(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": obj,
    }


def teamquota(bands: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "TeamQuota",
        "metadata": {"name": "payments"},
        "spec": {"team": "payments", "bands": bands},
    }
    if status is not None:
        obj["status"] = status
    return obj


def tq_request(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "uid": "u",
        "kind": {"group": "pilotfish.io", "version": "v1alpha1", "kind": "TeamQuota"},
        "resource": {"group": "pilotfish.io", "version": "v1alpha1", "resource": "teamquotas"},
        "name": "payments",
        "operation": operation,
        "object": obj,
    }


def test_the_check_is_one_of_the_pod_checks() -> None:
    assert quantities.beyond_bounds in POD_CHECKS


def test_a_pod_asking_beyond_the_bound_is_refused_naming_the_field() -> None:
    # The API server stores `1e10000000` as `10e9999999`; that is what the review sees.
    decision = pods.validate(pod_request(pod_with(requests={"cpu": "10e9999999"})), GateView())
    assert not decision.allowed
    assert decision.message == (
        "spec.containers[1].resources.requests.cpu: 10e9999999 is beyond the largest quantity "
        "Pilotfish accepts (9223372036854775807, the most a 64-bit integer holds in whole "
        "units; more than any node or quota holds)"
    )


def test_every_quantity_of_a_pod_is_checked() -> None:
    pod = pod_with(limits={"nvidia.com/gpu": "1e400", "memory": "8Ei"})
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "1e19"}}}]
    pod["spec"]["overhead"] = {"cpu": "1e30"}
    pod["spec"]["resources"] = {"requests": {"memory": "1e25"}}
    found = quantities.beyond_bounds(PodAdmission("team-a", pod, GateView()))
    assert [f.split(":")[0] for f in found] == [
        "spec.initContainers[0].resources.requests.cpu",
        "spec.containers[1].resources.limits[nvidia.com/gpu]",
        "spec.containers[1].resources.limits.memory",
        "spec.resources.requests.memory",
        "spec.overhead.cpu",
    ]


def test_sane_and_largest_quantities_are_admitted() -> None:
    largest = pod_with(requests={"cpu": str(quantity.MAX), "memory": "1e-99999"})
    assert pods.validate(pod_request(largest), GateView()).allowed
    assert pods.validate(pod_request(copy.deepcopy(POD)), GateView()).allowed


def test_a_long_value_is_shown_cut_short() -> None:
    found = quantities.problem("spec.x", "9" * 5000)
    assert found is not None
    assert found.startswith("spec.x: " + "9" * 40 + "... (5000 characters) is beyond")


def test_a_pod_quantity_pilotfish_cannot_read_is_refused_naming_the_rule() -> None:
    found = quantities.problem("spec.containers[0].resources.requests.cpu", "1e1.5")
    assert found is not None
    assert found.startswith("spec.containers[0].resources.requests.cpu: 1e1.5 is not a quantity")


def test_a_teamquota_granting_beyond_the_bound_is_refused_naming_every_field() -> None:
    tq = teamquota(
        {
            "production": {"cpu": "1e100000", "memory": "64Gi", "pods": 10},
            "batch": {"extended": {"example.com/fpga": 10**30}},
        }
    )
    decision = quantities.validate_teamquota(tq_request(tq))
    assert not decision.allowed
    assert decision.code == 422
    assert decision.message.startswith(
        "TeamQuota payments: spec.bands.production.cpu: 1e100000 is beyond the largest "
        "quantity Pilotfish accepts (9223372036854775807"
    )
    assert "; spec.bands.batch.extended[example.com/fpga]: " + str(10**30) in decision.message
    assert not quantities.validate_teamquota(tq_request(tq, "UPDATE")).allowed


def test_a_sane_teamquota_is_admitted_whatever_its_status_says() -> None:
    saturated = {"used": {"batch": {"cpu": str(quantity.SATURATED)}}}
    tq = teamquota({"production": {"cpu": "100", "memory": "400Gi"}, "batch": {}}, saturated)
    assert quantities.validate_teamquota(tq_request(tq)).allowed
    assert quantities.validate_teamquota(tq_request(teamquota({}), "DELETE")).allowed


async def test_the_teamquota_review_is_served() -> None:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": tq_request(teamquota({"production": {"cpu": "1e100000"}})),
    }
    async with TestClient(TestServer(server.make_app())) as client:
        response = await client.post("/validate/teamquotas", json=body)
        assert response.status == 200
        answer = (await response.json())["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith(
        "TeamQuota payments: spec.bands.production.cpu: 1e100000 is beyond"
    )


def test_the_mutating_review_names_the_quantity_beside_the_other_rules_broken() -> None:
    """A tenant's bomb that also names its node hears of both in one denial."""
    bomb = pod_with(requests={"cpu": "1e400"})
    bomb["spec"]["nodeName"] = "node-1"
    decision = pods.mutate(pod_request(bomb), GateView(), datetime.datetime.now(datetime.UTC))
    assert not decision.allowed
    assert "spec.nodeName 'node-1' may not be set" in decision.message
    assert "spec.containers[1].resources.requests.cpu: 1e400 is beyond" in decision.message
