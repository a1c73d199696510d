"""GatePolicy status, written by the operator: how many pods its gates hold, and whether the
policy is valid, with why not.

Everything a tenant does here it does as the namespace's tenant (`edit` only): it writes
the policies and the pods; the status is the operator's alone.

Run: PILOTFISH_E2E_PORT_OFFSET=10000 .venv/bin/python -m pytest e2e/test_gatepolicy_status.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from pilotfish import names

pytestmark = pytest.mark.e2e

GATE = "gates.pilotfish.io/data-ready"
PLURAL = "gatepolicies"
STATUS_TIMEOUT = 45.0  # the status timer's 10 s, plus watches and the operator's start


def policy(name: str, timeout_seconds: int = 3600) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "GatePolicy",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "batch"}},
            "gates": [
                {
                    "name": GATE,
                    "condition": {"type": "GateSignal", "signalName": "data-ready"},
                    "timeoutSeconds": timeout_seconds,
                }
            ],
        },
    }


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "batch"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example/batch:1",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def status_of(env: Env, namespace: str, name: str) -> dict[str, Any]:
    obj = custom(env.api).get_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, PLURAL, name
    )
    return dict(obj.get("status") or {})


def valid_of(env: Env, namespace: str, name: str) -> dict[str, Any]:
    conditions = status_of(env, namespace, name).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Valid"), {})


def wait_status(env: Env, namespace: str, name: str, **want: Any) -> dict[str, Any]:
    def matches() -> dict[str, Any] | None:
        status = status_of(env, namespace, name)
        return status if all(status.get(k) == v for k, v in want.items()) else None

    return wait_until(f"GatePolicy {name} status {want}", matches, timeout=STATUS_TIMEOUT)


def wait_valid(env: Env, namespace: str, name: str, status: str, reason: str) -> dict[str, Any]:
    def matches() -> dict[str, Any] | None:
        valid = valid_of(env, namespace, name)
        return valid if (valid.get("status"), valid.get("reason")) == (status, reason) else None

    return wait_until(
        f"GatePolicy {name} Valid={status} ({reason})", matches, timeout=STATUS_TIMEOUT
    )


def gates_of(core: k8s.CoreV1Api, namespace: str, name: str) -> list[str]:
    return [g.name for g in core.read_namespaced_pod(name, namespace).spec.scheduling_gates or []]


def test_gated_pods_follow_the_tenants_pods(env: Env, tenant: Tenant) -> None:
    ns = tenant.namespace
    custom(tenant.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, policy("hold")
    )
    wait_status(env, ns, "hold", gatedPods=0, observedGeneration=1)
    assert wait_valid(env, ns, "hold", "True", "Valid")["observedGeneration"] == 1

    core = k8s.CoreV1Api(tenant.api)

    def admitted_gated(name: str) -> bool:
        """Create `name` once the webhooks see the policy (until then it comes ungated)."""
        core.create_namespaced_pod(ns, pod(name))
        if GATE in gates_of(core, ns, name):
            return True
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        wait_until(f"{name} gone", lambda: not _exists(core, ns, name), timeout=30)
        return False

    wait_until("a first pod admitted with the policy's gate", lambda: admitted_gated("b-0"))
    for i in (1, 2):
        core.create_namespaced_pod(ns, pod(f"b-{i}"))
        assert GATE in gates_of(core, ns, f"b-{i}")
    core.create_namespaced_pod(ns, {**pod("other"), "metadata": {"name": "other"}})
    wait_status(env, ns, "hold", gatedPods=3)

    core.delete_namespaced_pod("b-1", ns, grace_period_seconds=0)
    wait_status(env, ns, "hold", gatedPods=2)

    # The count is the operator's word: the tenant may read status but not write it.
    with pytest.raises(ApiException) as refused:
        custom(tenant.api).patch_namespaced_custom_object_status(
            names.GROUP, names.VERSION, ns, PLURAL, "hold", {"status": {"gatedPods": 0}}
        )
    assert refused.value.status == 403
    assert status_of(env, ns, "hold")["gatedPods"] == 2


def _exists(core: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def test_an_invalid_policy_says_why(env: Env, tenant: Tenant) -> None:
    """Two policies declare the same gate with other terms: for pods both select, the first
    by name governs, so the second says its terms are not in force, and which differ."""
    ns = tenant.namespace
    api = custom(tenant.api)
    api.create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, policy("a-first", timeout_seconds=60)
    )
    api.create_namespaced_custom_object(names.GROUP, names.VERSION, ns, PLURAL, policy("b-second"))
    conflict = wait_valid(env, ns, "b-second", "False", "GateConflict")
    assert conflict["message"] == (
        f"gate {GATE} is also declared by GatePolicy a-first with other terms "
        "(timeoutSeconds 3600 here, 60 in a-first); for pods both select, the terms of "
        "a-first apply (the first by name wins)"
    ), conflict
    wait_valid(env, ns, "a-first", "True", "Valid")
    shown = tenant.kubectl("get", "gatepolicies", "b-second", "--no-headers").stdout.split()
    assert shown[3] == "False", f"NAME GATES GATED VALID AGE: {shown}"

    same_terms = {"spec": policy("b-second", timeout_seconds=60)["spec"]}
    api.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, PLURAL, "b-second", same_terms
    )
    fixed = wait_valid(env, ns, "b-second", "True", "Valid")
    assert fixed["observedGeneration"] == 2
    wait_status(env, ns, "b-second", observedGeneration=2)
