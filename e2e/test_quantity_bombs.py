"""Quantity bombs: absurd amounts are refused by name, and where admission does not apply
they cost the operator and the extender nothing (health within 1 s throughout).

`cpu: 1e10000000` is a pod the API server accepts (it stores `10e9999999`); computing its
value exactly once froze the operator, the extender and the webhooks, and its TeamQuota
usage could no longer be written. A TeamQuota amount the CRD pattern admitted but
Pilotfish could not read stopped gate releases for everyone.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from e2e.teams import open_quota
from pilotfish import names, quantity
from pilotfish.devcluster import supervisor

BOMBS = ("1e10000000", "1e400")
SAMPLE_SECONDS = 15.0


def pod(name: str, cpu: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "example/x:1", "resources": {"requests": {"cpu": cpu}}}
        ]
    }
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def a_node(env: Env) -> str:
    return str(k8s.CoreV1Api(env.api).list_node().items[0].metadata.name)


def denial(exc: ApiException) -> str:
    return str(json.loads(exc.body)["message"])


def teamquota(name: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": name},
        "spec": {"team": name, "bands": {"batch": {"cpu": cpu}}},
    }


@pytest.mark.parametrize("bound", [False, True], ids=["scheduled", "nodeName"])
@pytest.mark.parametrize("cpu", BOMBS)
def test_a_tenants_bomb_is_refused_naming_the_field(
    env: Env, tenant: Tenant, cpu: str, bound: bool
) -> None:
    body = pod("bomb", cpu, a_node(env) if bound else None)
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(tenant.api).create_namespaced_pod(tenant.namespace, body)
    assert refused.value.status == 403
    message = denial(refused.value)
    # The review sees the API server's form of the value: 10e9999999, 10e399.
    assert "spec.containers[0].resources.requests.cpu: 10e" in message, message
    assert "is beyond the largest quantity Pilotfish accepts (9223372036854775807" in message


def test_a_teamquota_the_parser_cannot_read_is_refused_by_the_api_server(env: Env) -> None:
    api = k8s.CustomObjectsApi(env.api)
    name = f"q{uuid.uuid4().hex[:8]}"
    with pytest.raises(ApiException) as refused:
        api.create_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", teamquota(name, "1e1.5")
        )
    assert refused.value.status == 422
    message = denial(refused.value)
    assert "spec.bands.batch.cpu" in message
    assert "should match" in message, message


def test_an_absurd_teamquota_is_refused_by_the_webhook_naming_the_field(env: Env) -> None:
    api = k8s.CustomObjectsApi(env.api)
    name = f"q{uuid.uuid4().hex[:8]}"
    with pytest.raises(ApiException) as refused:
        api.create_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", teamquota(name, "1e100000")
        )
    assert refused.value.status == 422
    message = denial(refused.value)
    assert 'admission webhook "teamquotas.validate.pilotfish.io" denied the request' in message
    assert f"TeamQuota {name}: spec.bands.batch.cpu: 1e100000 is beyond" in message
    # An update to the same amount is refused too.
    api.create_cluster_custom_object(
        names.GROUP, names.VERSION, "teamquotas", teamquota(name, "10")
    )
    try:
        with pytest.raises(ApiException) as updated:
            api.patch_cluster_custom_object(
                names.GROUP,
                names.VERSION,
                "teamquotas",
                name,
                {"spec": {"bands": {"batch": {"cpu": "1e100000"}}}},
            )
        assert "spec.bands.batch.cpu: 1e100000 is beyond" in denial(updated.value)
    finally:
        api.delete_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", name)


@pytest.fixture
def unreviewed(env: Env) -> Iterator[tuple[str, str]]:
    """(namespace, team): a team namespace the webhooks skip (the platform's own kind), with
    a TeamQuota, so the quota operator and the extender see what admission never judged."""
    team = f"t{uuid.uuid4().hex[:8]}"
    namespace = f"e2e-unreviewed-{team}"
    core = k8s.CoreV1Api(env.api)
    labels = {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED, names.LABEL_TEAM: team}
    core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
    custom = k8s.CustomObjectsApi(env.api)
    body = teamquota(team, "100")
    body["spec"]["bands"] = {band: {} for band in names.BANDS}
    custom.create_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", body)
    wait_until(
        f"the default ServiceAccount in {namespace}",
        lambda: core.read_namespaced_service_account("default", namespace),
    )
    try:
        yield namespace, team
    finally:
        core.delete_namespace(namespace)
        custom.delete_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", team)


def sample_health(env: Env, seconds: float) -> list[str]:
    """Ask the operator and the extender for /healthz, 1 s allowed each, for `seconds`;
    every late or failed answer."""
    checks = {
        name: env.host_process(name).health for name in ("pilotfish-operator", "pilotfish-extender")
    }
    late: list[str] = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        for name, health in checks.items():
            asked = time.monotonic()
            if not supervisor.healthy(health, timeout=1.0):
                late.append(f"{name} at {elapsed:.1f}s ({time.monotonic() - asked:.2f}s)")
        time.sleep(0.2)
    return late


def extender_answers(env: Env, outcome: str) -> float:
    """How many scheduler calls the extender answered with `outcome` (ok, error, ...)."""
    text = supervisor.fetch(env.host_process("pilotfish-extender").health, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("pilotfish_extender_requests_total{") and f'outcome="{outcome}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_bombs_where_admission_does_not_apply_cost_nothing(
    env: Env, tenant: Tenant, unreviewed: tuple[str, str]
) -> None:
    env.require_local()
    namespace, team = unreviewed
    errors, answered = extender_answers(env, "error"), extender_answers(env, "ok")
    core = k8s.CoreV1Api(env.api)
    open_quota(env, "e2e", tenant.namespace)
    node = a_node(env)
    for i, cpu in enumerate(BOMBS):
        core.create_namespaced_pod(namespace, pod(f"bomb-{i}", cpu))
        core.create_namespaced_pod(namespace, pod(f"bound-bomb-{i}", cpu, node))

    def tenant_pod_bound() -> str:
        tenant_core = k8s.CoreV1Api(tenant.api)
        tenant_core.create_namespaced_pod(tenant.namespace, pod("normal", "100m"))
        bound_to: str = wait_until(
            "the tenant's pod bound beside the bombs",
            lambda: tenant_core.read_namespaced_pod("normal", tenant.namespace).spec.node_name,
            timeout=SAMPLE_SECONDS,
        )
        return bound_to

    with ThreadPoolExecutor(max_workers=1) as pool:
        bound = pool.submit(tenant_pod_bound)
        late = sample_health(env, SAMPLE_SECONDS)
        assert bound.result()
    assert late == []

    # The team's usage is written, as a canonical string the API server reads back.
    def used_cpu() -> Any:
        tq = k8s.CustomObjectsApi(env.api).get_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", team
        )
        return ((tq.get("status") or {}).get("used") or {}).get("batch", {}).get("cpu")

    written = wait_until("the bombs counted in the TeamQuota's usage", used_cpu, timeout=30)
    assert written == str(quantity.SATURATED)
    # The scheduler's calls meanwhile (the tenant's pod, with the bound bombs in the
    # extender's view) got answers, never an error.
    assert extender_answers(env, "ok") > answered
    assert extender_answers(env, "error") == errors
