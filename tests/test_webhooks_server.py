"""The admission webhooks' HTTPS server, exercised in-process without a cluster.

Bodies are shaped like kube-apiserver's AdmissionReview v1. The response builder is tested
for denials and patches before any webhook denies or patches, so the first rule that does
cannot get the wire format wrong.
"""

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from pilotfish.devcluster import pki
from pilotfish.webhooks import server
from pilotfish.webhooks.admission import Decision, build_response, encode_patch, parse_review
from pilotfish.webhooks.gatecache import StaticViews
from pilotfish.webhooks.gateview import GateView
from tests.servers import free_port, wait_listening

Client = TestClient[web.Request, web.Application]

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web-0", "namespace": "team-a", "labels": {"app": "web"}},
    "spec": {"containers": [{"name": "web", "image": "nginx"}]},
}


def review(uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002", operation: str = "CREATE") -> Any:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web-0",
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": POD,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def reviews_total(webhook: str, operation: str, decision: str) -> float:
    value = REGISTRY.get_sample_value(
        "pilotfish_webhooks_reviews_total",
        {"webhook": webhook, "operation": operation, "decision": decision},
    )
    return value or 0.0


def observed(webhook: str) -> float:
    value = REGISTRY.get_sample_value(
        "pilotfish_webhooks_review_duration_seconds_count", {"webhook": webhook}
    )
    return value or 0.0


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with TestClient(TestServer(server.make_app())) as test_client:
        yield test_client


async def test_mutate_pod_create_allows_and_echoes_uid(client: Client) -> None:
    before, timed = reviews_total("/mutate/pods", "CREATE", "allow"), observed("/mutate/pods")
    resp = await client.post("/mutate/pods", json=review(uid="uid-123"))
    assert resp.status == 200
    assert resp.content_type == "application/json"
    assert await resp.json() == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "uid-123", "allowed": True},  # no patch field when nothing changes
    }
    assert reviews_total("/mutate/pods", "CREATE", "allow") == before + 1
    assert observed("/mutate/pods") == timed + 1


@pytest.mark.parametrize("path", ["/validate/pods", "/validate/workloads"])
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
async def test_validating_webhooks_allow_for_now(client: Client, path: str, operation: str) -> None:
    before = reviews_total(path, operation, "allow")
    resp = await client.post(path, json=review(uid=f"{path}-{operation}", operation=operation))
    assert resp.status == 200
    body = await resp.json()
    assert body["response"] == {"uid": f"{path}-{operation}", "allowed": True}
    assert reviews_total(path, operation, "allow") == before + 1


def test_denial_builder() -> None:
    decision = Decision.deny("team-a's TeamQuota 'a' allows 8 GPUs in band production; 10 asked")
    assert decision.label == "deny"
    assert build_response("uid-9", decision) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "uid-9",
            "allowed": False,
            "status": {
                "code": 403,
                "reason": "Forbidden",
                "message": "team-a's TeamQuota 'a' allows 8 GPUs in band production; 10 asked",
            },
        },
    }


def test_patch_encoding() -> None:
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/schedulingGates", "value": []},
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "gates.pilotfish.io/x"}},
    ]
    decision = Decision.mutate(ops, warnings=["gated until x"])
    assert decision.label == "patch"
    response = build_response("uid-7", decision)["response"]
    assert response["uid"] == "uid-7"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"], validate=True)) == ops
    assert response["warnings"] == ["gated until x"]
    assert "status" not in response


@given(
    st.lists(
        st.fixed_dictionaries(
            {"op": st.sampled_from(["add", "remove", "replace", "test"]), "path": st.text()},
            optional={"value": st.text() | st.integers() | st.booleans() | st.none()},
        )
    )
)
def test_patch_encoding_round_trips(ops: list[dict[str, Any]]) -> None:
    assert json.loads(base64.b64decode(encode_patch(ops), validate=True)) == ops


def test_empty_patch_is_a_plain_allow() -> None:
    decision = Decision.mutate([])
    assert decision.label == "allow"
    assert build_response("u", decision)["response"] == {"uid": "u", "allowed": True}


def test_decision_invariants() -> None:
    with pytest.raises(ValueError, match="say why"):
        Decision.deny("")
    with pytest.raises(ValueError, match="patch"):
        Decision(allowed=False, message="no", code=403, patch=({"op": "remove", "path": "/x"},))
    with pytest.raises(ValueError, match="error code"):
        Decision.deny("no", code=200)


async def test_a_denying_review_reaches_the_wire() -> None:
    def deny_all(request: Mapping[str, Any]) -> Decision:
        return Decision.deny(f"{request['namespace']} may not do that")

    app = server.make_app({"/validate/pods": deny_all})
    before = reviews_total("/validate/pods", "CREATE", "deny")
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/validate/pods", json=review(uid="d-1"))
        assert resp.status == 200
        body = await resp.json()
    assert body["response"]["uid"] == "d-1"
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"] == "team-a may not do that"
    assert reviews_total("/validate/pods", "CREATE", "deny") == before + 1


async def test_a_bug_in_a_review_is_a_500_so_failure_policy_decides() -> None:
    def broken(request: Mapping[str, Any]) -> Decision:
        raise KeyError("spec")

    before = reviews_total("/mutate/pods", "CREATE", "error")
    async with TestClient(TestServer(server.make_app({"/mutate/pods": broken}))) as client:
        resp = await client.post("/mutate/pods", json=review())
    assert resp.status == 500
    assert reviews_total("/mutate/pods", "CREATE", "error") == before + 1


def _envelope(**changes: Any) -> str:
    body = review()
    for key, value in changes.items():
        if key.startswith("request_"):
            body["request"][key.removeprefix("request_")] = value
        else:
            body[key] = value
    return json.dumps(body)


GARBAGE: list[tuple[bytes | str, str]] = [
    (b"", "empty"),
    (b"<xml/>", "not valid JSON"),
    ("[]", "must be a JSON object"),
    (_envelope(apiVersion="admission.k8s.io/v1beta1"), "apiVersion must be"),
    (_envelope(kind="Pod"), "kind must be"),
    (_envelope(request=None), "request is missing"),
    (_envelope(request_uid=""), "request.uid is missing"),
    (_envelope(request_uid=7), "request.uid is missing"),
    (_envelope(request_operation="PATCH"), "request.operation must be one of"),
]


@pytest.mark.parametrize(("body", "message"), GARBAGE)
async def test_not_an_admission_review_gets_400(
    client: Client, body: bytes | str, message: str
) -> None:
    before = reviews_total("/mutate/pods", "unknown", "invalid")
    resp = await client.post(
        "/mutate/pods", data=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    assert message in await resp.text()
    assert reviews_total("/mutate/pods", "unknown", "invalid") == before + 1


def test_parse_review_returns_the_request() -> None:
    request = parse_review(review(uid="x"))
    assert request["uid"] == "x"
    assert request["object"] == POD


async def test_healthz_and_metrics(client: Client) -> None:
    await client.post("/validate/pods", json=review())
    health = await client.get("/healthz")
    assert health.status == 200
    resp = await client.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    assert "pilotfish_webhooks_reviews_total{" in text
    assert "pilotfish_webhooks_review_duration_seconds_bucket" in text


async def test_serve_over_https_with_a_throwaway_ca(tmp_path: Path) -> None:
    certs = pki.ensure(tmp_path)
    ca_file, cert_file, key_file = certs.ca_cert, certs.cert("webhooks"), certs.key("webhooks")
    port = free_port()
    # A fixed, empty GatePolicy view: no API server behind this server.
    views = StaticViews(GateView())
    task = asyncio.create_task(
        server.serve("127.0.0.1", port, str(cert_file), str(key_file), views=views)
    )
    try:
        await wait_listening(task, port)
        trusting = ssl.create_default_context(cafile=str(ca_file))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting)) as session:
            base = f"https://127.0.0.1:{port}"
            async with session.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with session.post(f"{base}/mutate/pods", json=review(uid="tls-1")) as resp:
                assert resp.status == 200
                assert (await resp.json())["response"] == {"uid": "tls-1", "allowed": True}
        # The same server is not trusted without the CA: it really presents that certificate.
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(f"https://127.0.0.1:{port}/healthz")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
