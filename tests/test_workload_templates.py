"""Workload templates checked at admission: the pod dry-run, the field re-rooting, the decision.

The dry run is a fake here that answers as kube-apiserver does (the Status bodies below are
the API server's own, captured from a v1.36 server), so every branch of the decision is a
unit test; e2e/test_template_admission.py runs the real one.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from pilotfish import names
from pilotfish.httpserver import BadRequest
from pilotfish.webhooks import server, templates, workloads
from pilotfish.webhooks.gatecache import StaticViews
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.quota import Admit
from pilotfish.webhooks.teamview import TeamSnapshot
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD
from tests.fakeapi import FakeApi

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WEBHOOKS_SA = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_WEBHOOKS}"

MISSING_IMAGE: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'Pod "web-dryrunxxxx-xxxxx" is invalid: spec.containers[0].image: Required value',
    "reason": "Invalid",
    "details": {
        "name": "web-dryrunxxxx-xxxxx",
        "kind": "Pod",
        "causes": [
            {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.containers[0].image",
            }
        ],
    },
    "code": 422,
}
CONTAINERS_A_STRING: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal string '
    "into Go struct field PodSpec.spec.containers of type []v1.Container",
    "reason": "BadRequest",
    "code": 400,
}


def workload(kind: str = "ServiceWorkload", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": kind,
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
        "spec": {
            "team": "payments",
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
            },
            **spec,
        },
    }


def request(
    obj: Mapping[str, Any], operation: str = "CREATE", old: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "uid": "r-1",
        "kind": {"group": names.GROUP, "version": names.VERSION, "kind": obj["kind"]},
        "namespace": "shop",
        "name": "web",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }


class FakeDryRun:
    """Records the pods it is asked to dry-run and answers with a fixed Status."""

    def __init__(self, answer: Mapping[str, Any] | None = None) -> None:
        self.answer = answer
        self.pods: list[tuple[str, Mapping[str, Any]]] = []

    async def __call__(self, namespace: str, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self.pods.append((namespace, copy.deepcopy(pod)))
        return self.answer


@pytest.mark.parametrize(
    ("pod_field", "workload_field"),
    [
        ("spec.containers[0].image", "spec.template.spec.containers[0].image"),
        ("spec.containers", "spec.template.spec.containers"),
        ("spec", "spec.template.spec"),
        ("metadata.labels", "spec.template.metadata.labels"),
        ("metadata.annotations[a/b]", "spec.template.metadata.annotations[a/b]"),
        ("metadata.name", "metadata.name"),
        ("metadata.ownerReferences[0]", "spec.template"),
        ("", "spec.template"),
        ("specification", "spec.template"),
    ],
)
def test_pod_fields_are_named_at_the_workload(pod_field: str, workload_field: str) -> None:
    assert templates.reroot(pod_field) == workload_field


async def test_a_template_without_image_is_refused_naming_the_workload_field() -> None:
    decision = await workloads.validate(request(workload()), FakeDryRun(MISSING_IMAGE))
    assert not decision.allowed
    assert (decision.code, decision.reason) == (422, "Invalid")
    assert decision.message.startswith("spec.template.spec.containers[0].image: Required value")
    assert MISSING_IMAGE["message"] in decision.message, "the API server's own words follow"


async def test_containers_as_a_string_is_refused_naming_the_field_and_the_types() -> None:
    decision = await workloads.validate(request(workload()), FakeDryRun(CONTAINERS_A_STRING))
    assert not decision.allowed
    assert decision.message.startswith(
        "spec.template.spec.containers: Invalid type: got string, expected []v1.Container"
    )


async def test_every_cause_is_named() -> None:
    status = copy.deepcopy(MISSING_IMAGE)
    status["details"]["causes"].append(
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "x y"',
            "field": "metadata.labels",
        }
    )
    decision = await workloads.validate(request(workload()), FakeDryRun(status))
    assert "spec.template.spec.containers[0].image: Required value; " in decision.message
    assert 'spec.template.metadata.labels: Invalid value: "x y"' in decision.message


async def test_a_refusal_without_a_field_names_the_template() -> None:
    status = {
        "code": 403,
        "reason": "Forbidden",
        "message": 'admission webhook "pods.validate.pilotfish.io" denied the request: '
        "gate gates.pilotfish.io/x is not declared by any GatePolicy",
    }
    decision = await workloads.validate(request(workload()), FakeDryRun(status))
    assert not decision.allowed
    assert decision.message.startswith("spec.template: invalid (")
    assert "gates.pilotfish.io/x is not declared" in decision.message


async def test_a_valid_template_is_admitted_and_dry_runs_the_operators_pod() -> None:
    fake = FakeDryRun(None)
    decision = await workloads.validate(request(workload(band="batch")), fake)
    assert decision.allowed
    ((namespace, pod),) = fake.pods
    assert namespace == "shop"
    meta = pod["metadata"]
    assert meta["namespace"] == "shop"
    assert meta["name"] == f"web-{templates.PLACEHOLDER_REVISION}-{templates.PLACEHOLDER_SUFFIX}"
    assert meta["labels"] == {
        "app": "web",
        LABEL_WORKLOAD: "web",
        LABEL_REVISION: templates.PLACEHOLDER_REVISION,
        names.LABEL_TEAM: "payments",
        names.LABEL_BAND: "batch",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": names.API_VERSION,
            "kind": "ServiceWorkload",
            "name": "web",
            "uid": "u-1",
            "controller": True,
        }
    ], "no blockOwnerDeletion: the webhooks may not set finalizers on workloads"
    assert pod["spec"] == workload()["spec"]["template"]["spec"]


async def test_a_batch_workloads_pod_is_owned_by_it_and_defaults_to_the_batch_band() -> None:
    fake = FakeDryRun(None)
    assert (await workloads.validate(request(workload("BatchWorkload")), fake)).allowed
    ((_, pod),) = fake.pods
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "BatchWorkload"
    assert pod["metadata"]["labels"][names.LABEL_BAND] == "batch"
    refused = await workloads.validate(
        request(workload("BatchWorkload")), FakeDryRun(MISSING_IMAGE)
    )
    assert "BatchWorkload's spec.template" in refused.message


async def test_a_create_before_the_uid_is_set_still_names_an_owner() -> None:
    obj = workload()
    del obj["metadata"]["uid"]
    fake = FakeDryRun(None)
    assert (await workloads.validate(request(obj), fake)).allowed
    assert fake.pods[0][1]["metadata"]["ownerReferences"][0]["uid"] == templates.PLACEHOLDER_UID


async def test_an_update_is_checked_only_when_the_template_changed() -> None:
    old = workload(replicas=2)
    scaled = workload(replicas=5)
    fake = FakeDryRun(MISSING_IMAGE)
    assert (await workloads.validate(request(scaled, "UPDATE", old), fake)).allowed
    assert fake.pods == []
    changed = workload(replicas=2)
    del changed["spec"]["template"]["spec"]["containers"][0]["image"]
    decision = await workloads.validate(request(changed, "UPDATE", old), fake)
    assert not decision.allowed and len(fake.pods) == 1


async def test_gate_policies_and_clusterless_reviews_make_no_call() -> None:
    fake = FakeDryRun(MISSING_IMAGE)
    policy = {"kind": "GatePolicy", "metadata": {"name": "p"}, "spec": {}}
    assert (await workloads.validate(request(policy), fake)).allowed
    assert fake.pods == []
    assert (await workloads.validate(request(workload()), None)).allowed


@pytest.mark.parametrize(
    "status",
    [
        {"code": 500, "reason": "InternalError", "message": 'failed calling webhook "x": EOF'},
        {"code": 504, "reason": "Timeout", "message": "the server was unable to respond"},
        {"code": 429, "reason": "TooManyRequests", "message": "try again later"},
        {
            "code": 403,
            "reason": "Forbidden",
            "message": 'pods is forbidden: User "system:serviceaccount:pilotfish-system:'
            'pilotfish-webhooks" cannot create resource "pods" in API group "" in the '
            'namespace "shop"',
        },
    ],
)
async def test_a_dry_run_that_cannot_be_done_fails_closed(status: dict[str, Any]) -> None:
    decision = await workloads.validate(request(workload()), FakeDryRun(status))
    assert not decision.allowed
    assert (decision.code, decision.reason) == (503, "ServiceUnavailable")
    assert decision.message.startswith("the ServiceWorkload's spec.template could not be checked")
    assert status["message"] in decision.message


async def test_a_name_clash_is_not_a_template_fault() -> None:
    clash = {"code": 409, "reason": "AlreadyExists", "message": 'pods "web-x" already exists'}
    assert (await workloads.validate(request(workload()), FakeDryRun(clash))).allowed


async def test_a_dry_run_that_does_not_answer_is_cut_off_and_denied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(templates, "DRY_RUN_SECONDS", 0.05)

    async def hangs(_namespace: str, _pod: Mapping[str, Any]) -> None:
        await asyncio.sleep(3600)

    decision = await workloads.validate(request(workload()), hangs)
    assert not decision.allowed and decision.code == 503
    assert "no answer within 0.05 s" in decision.message


async def test_a_dry_run_that_cannot_connect_is_denied() -> None:
    async def refused(_namespace: str, _pod: Mapping[str, Any]) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    decision = await workloads.validate(request(workload()), refused)
    assert not decision.allowed and decision.code == 503
    assert "ConnectionRefusedError" in decision.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("object", "nope"),
        ("object", {"kind": "ServiceWorkload", "metadata": {}, "spec": []}),
        ("object", {"kind": "ServiceWorkload", "spec": {"template": "x"}}),
        ("object", {"kind": "ServiceWorkload", "spec": {"template": {"spec": [1]}}}),
        ("object", {"kind": "ServiceWorkload", "spec": {"template": {"metadata": {"labels": 1}}}}),
    ],
)
async def test_malformed_objects_are_bad_requests(key: str, value: Any) -> None:
    req = request(workload())
    req[key] = value
    with pytest.raises(BadRequest, match=r"request\.object"):
        await workloads.validate(req, FakeDryRun(None))


async def test_an_update_needs_its_old_object() -> None:
    with pytest.raises(BadRequest, match=r"request\.oldObject must be an object"):
        await workloads.validate(request(workload(), "UPDATE", None), FakeDryRun(None))


def test_only_the_webhooks_own_dry_runs_are_template_checks() -> None:
    def pod_review(user: str, dry_run: bool) -> dict[str, Any]:
        return {"operation": "CREATE", "dryRun": dry_run, "userInfo": {"username": user}}

    assert templates.is_template_check(pod_review(WEBHOOKS_SA, True))
    assert not templates.is_template_check(pod_review(WEBHOOKS_SA, False))
    assert not templates.is_template_check(pod_review("alice", True))
    assert not templates.is_template_check(pod_review(names.SA_WEBHOOKS, True))
    other = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_OPERATOR}"
    assert not templates.is_template_check(pod_review(other, True))


class FullTeams:
    """A team whose production quota is used up; reservations must never be asked for."""

    def snapshot(self) -> TeamSnapshot:
        tq = {
            "metadata": {"name": "payments", "generation": 1, "resourceVersion": "1"},
            "spec": {"team": "payments", "bands": {"production": {"pods": 1}}},
            "status": {"used": {"production": {"pods": "1"}}},
        }
        return TeamSnapshot({"shop": {names.LABEL_TEAM: "payments"}}, (tq,))

    async def reserve(
        self,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: Admit,
        now: datetime,
    ) -> str | None:
        raise AssertionError("a dry run reserved quota")


def pod_create_review(pod: dict[str, Any], user: str, *, dry_run: bool) -> dict[str, Any]:
    return {
        "uid": "r-2",
        "kind": {"kind": "Pod"},
        "namespace": "shop",
        "operation": "CREATE",
        "object": pod,
        "dryRun": dry_run,
        "userInfo": {"username": user},
    }


async def test_a_full_quota_does_not_make_a_template_invalid() -> None:
    reviews = server.bind_reviews(StaticViews(GateView()), lambda: NOW, FullTeams())
    pod = templates.dry_run_pod(workload(), "shop")
    pod["metadata"]["labels"][names.LABEL_BAND] = "production"
    review = pod_create_review(pod, "alice", dry_run=True)
    tenant = await reviews["/validate/pods"](review)  # type: ignore[misc]
    assert not tenant.allowed and "production pods: 1 of 1 used" in tenant.message
    check = {**review, "userInfo": {"username": WEBHOOKS_SA}}
    assert (await reviews["/validate/pods"](check)).allowed  # type: ignore[misc]


async def test_the_webhooks_account_may_create_pods_only_as_a_dry_run() -> None:
    """Refused by the validating review itself, before any view or quota is consulted (the
    chart's policy covers only the namespaces the webhooks do not see)."""
    reviews = server.bind_reviews(StaticViews(GateView()), lambda: NOW, FullTeams())
    pod = templates.dry_run_pod(workload(), "shop")
    review = pod_create_review(pod, WEBHOOKS_SA, dry_run=False)
    real = await reviews["/validate/pods"](review)  # type: ignore[misc]
    assert not real.allowed
    assert real.message == (
        f"pod create in namespace shop refused for {WEBHOOKS_SA}: {names.SA_WEBHOOKS} may only "
        "create pods as a dry run (the check of workload templates)"
    )
    assert (await reviews["/validate/pods"]({**review, "dryRun": True})).allowed  # type: ignore[misc]
    # Only that very account: a tenant's account of the same name is judged like any other.
    same_name = {
        **review,
        "userInfo": {"username": f"system:serviceaccount:shop:{names.SA_WEBHOOKS}"},
    }
    assert templates.dry_run_only(same_name, WEBHOOKS_SA) is None
    assert templates.dry_run_only({**review, "operation": "UPDATE"}, WEBHOOKS_SA) is None


async def test_the_bound_workload_review_uses_the_injected_dry_run() -> None:
    fake = FakeDryRun(MISSING_IMAGE)
    reviews = server.bind_reviews(StaticViews(GateView()), dry_run=fake)
    decision = await reviews["/validate/workloads"](request(workload()))  # type: ignore[misc]
    assert not decision.allowed and len(fake.pods) == 1


async def test_the_real_dry_run_posts_a_bounded_dry_run_and_returns_the_status() -> None:
    api = FakeApi()
    dry_run = templates.dry_run_with(api, seconds=8)
    assert await dry_run("shop", {"kind": "Pod", "metadata": {"name": "web-dryrun"}}) is None
    (call,) = api.calls
    assert (call.method, call.path) == ("POST", "/api/v1/namespaces/shop/pods")
    assert call.params == {"dryRun": "All", "timeout": "8s"}
    assert call.request_timeout == 8
    assert api.obj("/api/v1/namespaces/shop/pods/web-dryrun") is None, "a dry run creates nothing"
    api.fail_next("POST", "/pods", 422, body=MISSING_IMAGE)
    assert await templates.dry_run_with(api)("shop", {}) == MISSING_IMAGE
    api.fail_next("POST", "/pods", 502)  # a proxy's answer: no Status body
    answer = await templates.dry_run_with(api)("shop", {})
    assert answer is not None and answer["code"] == 502
    assert set(answer) == {"code", "reason", "message"}
