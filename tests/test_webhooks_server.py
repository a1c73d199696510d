"""The admission webhooks' HTTPS server, exercised in-process without a cluster.

Bodies are shaped like kube-apiserver's AdmissionReview v1. The response builder is tested
for denials and patches before any webhook denies or patches, so the first rule that does
cannot get the wire format wrong.
"""

import asyncio
import base64
import json
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

from pilotfish import httpserver
from pilotfish.devcluster import pki
from pilotfish.webhooks import server
from pilotfish.webhooks.admission import Decision, build_response, encode_patch, parse_review
from pilotfish.webhooks.gatecache import StaticViews
from pilotfish.webhooks.gateview import GateView
from tests.servers import (
    client_tls,
    dev_pki,
    free_port,
    impatient_tls_server,
    seconds_until_closed,
    server_tls,
    serving,
)

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
            # As the API server sends them: no old object on CREATE, no object on DELETE.
            "object": None if operation == "DELETE" else POD,
            "oldObject": None if operation == "CREATE" else POD,
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
    (
        _envelope(apiVersion="admission.k8s.io/v1beta1"),
        "apiVersion: must be 'admission.k8s.io/v1', got string 'admission.k8s.io/v1beta1'",
    ),
    (_envelope(kind="Pod"), "kind: must be 'AdmissionReview', got string 'Pod'"),
    (_envelope(request=None), "request: must be an object, got null"),
    (_envelope(request_uid=""), "request.uid: String should have at least 1 character"),
    (_envelope(request_uid=7), "request.uid: must be a string, got integer 7"),
    (_envelope(request_operation="PATCH"), "request.operation: must be 'CREATE', 'UPDATE'"),
    (_envelope(request_dryRun="no"), "request.dryRun: must be a boolean, got string 'no'"),
    ("[" * 65 + "]" * 65, "nests arrays and objects 65 levels deep; at most 64"),
    ('{"apiVersion": NaN}', "NaN is not a JSON number"),
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


# A sound envelope around a Pod Pilotfish cannot read: a denial naming the field, which the
# API server shows verbatim (a 400 would read as "failed calling webhook").
MALFORMED_PODS: list[tuple[dict[str, Any], str]] = [
    (
        {**POD, "metadata": {"labels": {"app": 7}}},
        "request.object.metadata.labels.app: must be a string, got integer 7",
    ),
    (
        {"spec": {"containers": [{"resources": {"requests": []}}]}},
        "request.object.spec.containers[0].resources.requests: must be an object, got array",
    ),
]


@pytest.mark.parametrize(("pod", "message"), MALFORMED_PODS)
@pytest.mark.parametrize("path", ["/mutate/pods", "/validate/pods"])
async def test_a_malformed_pod_is_denied_naming_the_field(
    client: Client, path: str, pod: dict[str, Any], message: str
) -> None:
    before = reviews_total(path, "unknown", "invalid")
    resp = await client.post(
        path, data=_envelope(request_object=pod), headers={"Content-Type": "application/json"}
    )
    assert resp.status == 200
    answer = (await resp.json())["response"]
    assert answer["uid"] == review()["request"]["uid"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 400
    assert message in answer["status"]["message"]
    assert reviews_total(path, "unknown", "invalid") == before + 1


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


async def test_serve_over_mutual_tls_with_the_dev_pki(tmp_path: Path) -> None:
    certs = dev_pki(tmp_path)
    # A fixed, empty GatePolicy view: no API server behind this server.
    views = StaticViews(GateView())

    async def start(port: int) -> None:
        await server.serve(
            "127.0.0.1",
            port,
            str(certs.cert("webhooks")),
            str(certs.key("webhooks")),
            client_ca=str(certs.ca_cert),
            views=views,
        )

    async with serving(start) as port:
        base = f"https://127.0.0.1:{port}"
        # The API server's webhook client certificate is served.
        connector = aiohttp.TCPConnector(ssl=client_tls(certs, "webhook-client"))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with session.post(f"{base}/mutate/pods", json=review(uid="tls-1")) as resp:
                assert resp.status == 200
                assert (await resp.json())["response"] == {"uid": "tls-1", "allowed": True}
        # Without a client certificate, or with one from another CA, or with a serving
        # certificate of the right CA (no clientAuth usage): refused in the handshake,
        # so no review, dry run or not, is ever read.
        stranger = pki.ensure(tmp_path / "other")
        refused = [
            client_tls(certs, None),
            client_tls(stranger, "webhook-client"),
            client_tls(certs, "webhooks"),
        ]
        refused[1].load_verify_locations(cafile=str(certs.ca_cert))
        for context in refused:
            connector = aiohttp.TCPConnector(ssl=context)
            async with aiohttp.ClientSession(connector=connector) as session:
                with pytest.raises(aiohttp.ClientError):
                    async with session.post(f"{base}/validate/pods", json=review()) as resp:
                        await resp.read()
        # The server really presents its certificate: not trusted without the CA.
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(f"{base}/healthz")


async def test_health_port_answers_probes_without_a_certificate(tmp_path: Path) -> None:
    certs = dev_pki(tmp_path)
    health = free_port()

    async def start(port: int) -> None:
        await server.serve(
            "127.0.0.1",
            port,
            str(certs.cert("webhooks")),
            str(certs.key("webhooks")),
            client_ca=str(certs.ca_cert),
            health_port=health,
            views=StaticViews(GateView()),
        )

    async with serving(start, health), aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with session.get(f"http://127.0.0.1:{health}{path}") as resp:
                assert resp.status == 200, path
        # Only probes: no review is served on the plain port.
        async with session.post(f"http://127.0.0.1:{health}/validate/pods", json=review()) as resp:
            assert resp.status == 404


async def test_half_sent_requests_are_closed_after_the_head_deadline(tmp_path: Path) -> None:
    certs = dev_pki(tmp_path)
    start = impatient_tls_server(server.make_app(), certs, "webhooks")
    async with serving(start) as port:
        context = client_tls(certs)
        head = b"POST /validate/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        for sent in (b"", b"POS", head):
            assert await seconds_until_closed(port, sent, context, limit=5) < 3, sent
        # A whole request on the same kind of connection is answered, not cut off.
        body = json.dumps(review()).encode()
        whole = head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(whole)
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_a_slow_body_gets_408_and_the_connection_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpserver, "BODY_TIMEOUT", 0.5)
    certs = dev_pki(tmp_path)
    app = server.make_app()

    async def start(port: int) -> None:
        await httpserver.run_until_cancelled(
            app, "127.0.0.1", port, name="webhooks", ssl_context=server_tls(certs, "webhooks")
        )

    async with serving(start) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_tls(certs))
        writer.write(
            b"POST /validate/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        async with asyncio.timeout(5):
            assert (await reader.readline()).startswith(b"HTTP/1.1 408")
            while await reader.read(65536):
                pass  # then the server hangs up
        writer.close()


async def test_an_oversized_body_gets_413(client: Client) -> None:
    resp = await client.post(
        "/validate/pods",
        data=b"x" * (server.MAX_BODY_BYTES + 1),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 413
