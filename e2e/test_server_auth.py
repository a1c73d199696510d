"""Only the API server calls the webhooks and only kube-scheduler calls the extender.

Against the local control plane: the webhooks and the extender refuse, in the TLS handshake,
any client without a certificate signed by the cluster's CA, so a tenant who reaches their
ports cannot post a review that reserves quota or a placement call that records an assumed
placement; with a certificate they answer. Pods are still admitted (the API server presents
its webhook client certificate) and placed through the extender (kube-scheduler presents
its own), and a request sent by halves is cut off within the head deadline.

Run: PILOTFISH_E2E_PORT_OFFSET=5000 .venv/bin/python -m pytest e2e/test_server_auth.py -q
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, Tenant, wait_until
from e2e.teams import own_team
from e2e.test_quota import make_quota
from e2e.test_quota import pod as quota_pod
from pilotfish import httpserver, names
from pilotfish.devcluster import pki
from tests.servers import seconds_until_closed

# The servers' head deadline plus room for a loaded two-core machine.
CLOSED_WITHIN = httpserver.HEADER_TIMEOUT + 5


def ports(env: Env) -> dict[str, int]:
    env.require_local()
    assert env.spec is not None
    return {"webhooks": env.spec.ports.webhooks, "extender": env.spec.ports.extender}


def certs(env: Env) -> pki.Pki:
    return env.require_local().pki


def call(
    url: str, body: Any | None, context: ssl.SSLContext, timeout: float = 10
) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def refused(url: str, body: Any, context: ssl.SSLContext) -> bool:
    """True when the TLS handshake (or the connection right after it) is refused."""
    try:
        call(url, body, context)
    except (urllib.error.URLError, ssl.SSLError, ConnectionError):
        return True
    return False


def no_certificate(env: Env) -> ssl.SSLContext:
    """What a tenant has: the cluster CA (it is in every pod's ServiceAccount), no cert."""
    return ssl.create_default_context(cafile=str(certs(env).ca_cert))


def review(namespace: str, obj: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "mallory", "groups": ["system:authenticated"]},
            "object": {**obj, "metadata": {**obj["metadata"], "namespace": namespace}},
            "dryRun": dry_run,
        },
    }


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    """A team of its own with a production quota of 2 CPUs: a reservation would show."""
    with own_team(env, namespace) as name:
        make_quota(env, name, {"production": {"cpu": "2"}})
        yield name


def reserved(env: Env, team: str) -> Any:
    tq = k8s.CustomObjectsApi(env.api).get_cluster_custom_object(
        names.GROUP, names.VERSION, "teamquotas", team
    )
    status = tq.get("status") or {}
    return status.get("reservations") or [], (status.get("reserved") or {}).get("production")


def test_a_forged_review_is_refused_without_a_client_certificate(
    env: Env, namespace: str, team: str, tenant: Tenant
) -> None:
    url = f"https://127.0.0.1:{ports(env)['webhooks']}/validate/pods"
    # A production pod taking the team's whole quota: a real review would reserve 2 CPUs.
    forged = review(namespace, quota_pod("forged", "production", "2"), dry_run=False)
    before = reserved(env, team)
    stranger = pki.client_context(pki.ensure(env.require_local().root / "stranger-pki"))
    stranger.load_verify_locations(cafile=str(certs(env).ca_cert))
    for context in (no_certificate(env), stranger):
        assert refused(url, forged, context)
    assert reserved(env, team) == before
    # The tenant's real pod is not held back by a phantom reservation.
    created = k8s.CoreV1Api(tenant.api).create_namespaced_pod(
        namespace, quota_pod("real", "production", "2")
    )
    assert created.metadata.name == "real"


def test_with_the_right_certificate_a_review_is_answered_and_a_dry_run_reserves_nothing(
    env: Env, namespace: str, team: str
) -> None:
    url = f"https://127.0.0.1:{ports(env)['webhooks']}/validate/pods"
    before = reserved(env, team)
    body = review(namespace, quota_pod("dry", "production", "2"), dry_run=True)
    status, text = call(url, body, pki.client_context(certs(env), "webhook-client"))
    assert status == 200, text
    answer = json.loads(text)["response"]
    assert answer["uid"] == body["request"]["uid"]
    assert answer["allowed"] is True
    assert reserved(env, team) == before, "a dry run must never reserve quota"


def extender_calls(env: Env, verb: str) -> float:
    url = f"https://127.0.0.1:{ports(env)['extender']}/metrics"
    status, text = call(url, None, pki.client_context(certs(env)))
    assert status == 200
    prefix = f'pilotfish_extender_requests_total{{outcome="ok",verb="{verb}"}} '
    return sum(
        float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix)
    )


def test_the_extender_answers_only_a_client_with_a_certificate(env: Env) -> None:
    url = f"https://127.0.0.1:{ports(env)['extender']}/filter"
    body = {"Pod": quota_pod("x", "production", "1m"), "NodeNames": ["nowhere"]}
    assert refused(url, body, no_certificate(env))
    status, text = call(url, body, pki.client_context(certs(env), "kube-scheduler"))
    assert status == 200, text
    assert json.loads(text)["Error"] == ""


def test_pods_are_admitted_and_placed_through_both_authenticated_calls(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    before = extender_calls(env, "prioritize")
    created = k8s.CoreV1Api(tenant.api).create_namespaced_pod(
        namespace, quota_pod("placed", "production", "10m")
    )
    # The mutating webhook answered (the API server authenticated): the band's class is set
    # and the pod goes to the scheduler that calls the extender.
    assert created.spec.priority_class_name == names.PRIORITY_CLASS["production"]
    assert created.spec.scheduler_name == names.SCHEDULER_NAME
    core = k8s.CoreV1Api(env.api)
    wait_until(
        "the pod bound",
        lambda: core.read_namespaced_pod("placed", namespace).spec.node_name,
        timeout=60,
    )
    # kube-scheduler reached the extender over TLS (ignorable: had the handshake failed it
    # would have placed the pod alone, without a call).
    assert extender_calls(env, "prioritize") > before


@pytest.mark.parametrize("server", ["webhooks", "extender"])
def test_a_half_sent_request_is_closed_within_the_bound(env: Env, server: str) -> None:
    port = ports(env)[server]
    context = pki.client_context(certs(env))
    head = b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/js"
    started = time.monotonic()
    took = asyncio.run(seconds_until_closed(port, head, context, limit=CLOSED_WITHIN + 30))
    assert took < CLOSED_WITHIN, f"{server} held a half-sent request {took:.1f} s"
    # Nor does a connection that never finishes the TLS handshake hold a slot for long.
    plain = asyncio.run(seconds_until_closed(port, b"\x16\x03\x01", None, limit=CLOSED_WITHIN + 30))
    assert plain < httpserver.TLS_HANDSHAKE_TIMEOUT + 5
    assert time.monotonic() - started < 2 * CLOSED_WITHIN
