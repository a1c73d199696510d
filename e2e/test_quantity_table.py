"""One quantity language: the real API server, the CRD pattern and Pilotfish's parser agree.

The strings of tests/test_quantity.py's table (and a few more) go to the API server twice,
as dry runs: as a pod's CPU request in a namespace the webhooks skip (so only
ParseQuantity and pod validation judge it), and as a TeamQuota band's CPU (the CRD pattern
judges it, then the TeamQuota webhook the magnitude). Every disagreement is listed at once.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env
from pilotfish import names, quantity
from tests.test_quantity import TABLE, crd_accepts, in_crd_language

# More strings for the pattern's edges.
EXTRA = [
    "100",
    "2.5Ti",
    "1e18",
    "1e000000000000000005",
    "1e0000000000000000000000005",
    "1e4294967296",
    "1e18446744073709551615",
    "0.000000001",
    "+.5",
    "5.m",
    "1e0",
    "1Ei",
    "1P",
    "1e+1.5",
    "1.5e",
    "e5",
    "1" * 70,
    "0" * 63 + "1",
    "1" + "0" * 64,
]
STRINGS = [text for text, _, _ in TABLE if text] + EXTRA


def stalls_the_api_server(text: str) -> bool:
    """ParseQuantity computes a power of ten for an exponent far below -9 (as it reads it:
    modulo 2**32), which takes it seconds for `1e-99999999`: such strings stay in the unit
    tests, where no API server has to compute them."""
    exponent = _exponent(text)
    if exponent is None or not -(2**63) <= exponent < 2**63:
        return False
    return (exponent + 2**31) % 2**32 - 2**31 < -1000


def _exponent(text: str) -> int | None:
    found = re.search(r"[eE]([+-]?[0-9]+)$", text)
    return int(found.group(1)) if found else None


assert not [text for text in STRINGS if stalls_the_api_server(text)]


@pytest.fixture(scope="module")
def skipped_namespace(env: Env) -> Iterator[str]:
    """A namespace the webhooks skip: only the API server judges pods there."""
    name = f"e2e-quantities-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(env.api)
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"pilotfish.io/webhooks": "disabled"}}}
    )
    yield name
    core.delete_namespace(name)


def pod_outcome(env: Env, namespace: str, cpu: str) -> tuple[bool, str]:
    """(accepted, the request as stored, or the refusal)."""
    body = {
        "metadata": {"name": "q"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]
        },
    }
    try:
        raw = k8s.CoreV1Api(env.api).create_namespaced_pod(
            namespace, body, dry_run="All", _preload_content=False
        )
    except ApiException as e:
        assert e.status in (400, 422), e.body
        return False, str(json.loads(e.body).get("message"))
    stored = json.loads(raw.data)["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    return True, str(stored)


def teamquota_outcome(env: Env, cpu: str | int) -> tuple[str, str]:
    """("ok" | "schema" | "webhook", message): who refused a TeamQuota granting `cpu`."""
    name = f"q{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": name},
        "spec": {"team": name, "bands": {"batch": {"cpu": cpu}}},
    }
    try:
        k8s.CustomObjectsApi(env.api).create_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", body, dry_run="All"
        )
    except ApiException as e:
        message = str(json.loads(e.body).get("message"))
        assert e.status == 422, e.body
        if "teamquotas.validate.pilotfish.io" in message:
            return "webhook", message
        assert "spec.bands.batch.cpu" in message, message
        return "schema", message
    return "ok", ""


def parsed(text: str) -> int | None:
    try:
        return quantity.nanos(text)
    except quantity.QuantityError:
        return None


def exact(text: str) -> bool:
    """Whether the API server keeps the value itself: it reads exponents as int32, so a
    larger one wraps, and it caps binary-SI values at 2^63-1 where Pilotfish saturates."""
    value = parsed(text)
    wraps = abs(_exponent(text) or 0) >= 2**31
    return value is not None and abs(value) <= quantity.MAX_NANOS and not wraps


def canonical(text: str) -> bool:
    """Canonical for Pilotfish and a whole number of millicores, which the API server keeps
    as written (it rounds a pod's CPU up to 1m, so `100u` is stored as `1m`)."""
    return quantity.canonicalize(text) == text and quantity.nanos(text) % 10**6 == 0


def test_pods_accept_exactly_what_pilotfish_parses(env: Env, skipped_namespace: str) -> None:
    wrong = []
    for text in STRINGS:
        # A pod's JSON decoder trims spaces around the string (not escaped whitespace such
        # as \n) before parsing it; the stored form is canonical.
        value = parsed(text.strip(" "))
        accepted, stored = pod_outcome(env, skipped_namespace, text)
        if accepted != (value is not None and value >= 0):  # pods refuse negative requests
            wrong.append(f"{text!r}: API server {'accepts' if accepted else 'refuses'} ({stored})")
        elif accepted and parsed(stored) is None:
            wrong.append(f"{text!r}: stored as {stored!r}, which Pilotfish cannot read")
        elif accepted and exact(text) and quantity.milli(stored) != quantity.milli(text.strip(" ")):
            wrong.append(f"{text!r}: stored as {stored!r}, Pilotfish reads {value} nano-units")
        elif accepted and exact(text) and canonical(text) and stored != text:
            wrong.append(f"{text!r} is canonical for Pilotfish, the API server wrote {stored!r}")
    assert wrong == [], "\n".join(wrong)


def test_teamquotas_accept_exactly_the_pattern_and_refuse_the_absurd(env: Env) -> None:
    wrong = []
    for text in STRINGS:
        assert crd_accepts(text) == in_crd_language(text), text
        value = parsed(text)
        if not in_crd_language(text):
            expected = "schema"
        elif value is not None and quantity.is_beyond(quantity.parse(text)):
            expected = "webhook"
        else:
            expected = "ok"
        got, message = teamquota_outcome(env, text)
        if got != expected:
            wrong.append(f"{text!r}: expected {expected}, got {got} ({message})")
        elif got == "webhook" and f"spec.bands.batch.cpu: {text} is beyond" not in message:
            wrong.append(f"{text!r}: the webhook's denial does not name the field: {message}")
    assert wrong == [], "\n".join(wrong)


def test_teamquota_integers_stop_at_int64(env: Env) -> None:
    """A JSON integer beyond int64 is a float to the API server, refused by the schema: an
    integer amount is never beyond the bound."""
    assert teamquota_outcome(env, quantity.MAX)[0] == "ok"
    assert teamquota_outcome(env, 10**20)[0] == "schema"
