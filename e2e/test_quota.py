"""Bands and team quotas at admission, against the real API server and webhooks."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, run, wait_until
from e2e.teams import own_team
from pilotfish import names


def pod(name: str, band: str | None, cpu: str = "1", **spec: Any) -> dict[str, Any]:
    labels = {} if band is None else {names.LABEL_BAND: band}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example/x:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                }
            ],
            **spec,
        },
    }


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    """A team of its own for this test: its namespace label and a TeamQuota to fill."""
    with own_team(env, namespace) as name:
        yield name


def make_quota(env: Env, team: str, bands: dict[str, dict[str, Any]]) -> None:
    k8s.CustomObjectsApi(env.api).create_cluster_custom_object(
        names.GROUP,
        names.VERSION,
        "teamquotas",
        {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": team},
            "spec": {"team": team, "bands": bands},
        },
    )
    # Admission reads quotas from its informer: wait until a dry run sees this one.
    core = k8s.CoreV1Api(env.api)

    def seen() -> bool:
        try:
            core.create_namespaced_pod(
                namespace_of(env, team), pod("probe", "production", "1m"), dry_run="All"
            )
        except ApiException as e:
            return "no production quota" not in json.loads(e.body).get("message", "")
        return True

    if "production" in bands:
        wait_until(f"TeamQuota {team} visible to admission", seen, timeout=30)


def namespace_of(env: Env, team: str) -> str:
    nss = k8s.CoreV1Api(env.api).list_namespace(label_selector=f"{names.LABEL_TEAM}={team}")
    return str(nss.items[0].metadata.name)


def denial(exc: ApiException) -> str:
    return str(json.loads(exc.body)["message"])


def test_band_sets_the_priority_class_and_production_quota_denial_names_the_amounts(
    env: Env, namespace: str, team: str
) -> None:
    make_quota(env, team, {"production": {"cpu": "10"}})
    core = k8s.CoreV1Api(env.api)
    created = core.create_namespaced_pod(namespace, pod("first", "production", "8"))
    assert created.spec.priority_class_name == "pilotfish-production"
    assert created.spec.priority == 1000000
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, pod("second", "production", "8"))
    assert err.value.status == 403
    assert f"team {team}, production cpu: 8 of 10 used, pod asks 8" in denial(err.value)


def test_no_quota_for_a_band_means_no_pods_in_it(env: Env, namespace: str, team: str) -> None:
    make_quota(env, team, {"production": {"cpu": "10"}})
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, pod("be", "best-effort"))
    assert f"team {team} has no best-effort quota" in denial(err.value)


def test_priority_class_contradicting_the_band_is_refused(
    env: Env, namespace: str, team: str
) -> None:
    make_quota(env, team, {"production": {"cpu": "10"}, "batch": {"cpu": "10"}})
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(env.api).create_namespaced_pod(
            namespace, pod("sneaky", "batch", priorityClassName="pilotfish-production")
        )
    assert "contradicts the pod's band 'batch'" in denial(err.value)


def test_concurrent_creations_never_exceed_the_quota(env: Env, namespace: str, team: str) -> None:
    limit = 20
    make_quota(env, team, {"production": {"pods": limit}})
    core = k8s.CoreV1Api(env.api)

    def create(i: int) -> str:
        try:
            core.create_namespaced_pod(namespace, pod(f"p{i}", "production", "10m"))
        except ApiException as e:
            return denial(e)
        return "admitted"

    with ThreadPoolExecutor(max_workers=25) as pool:
        results = list(pool.map(create, range(100)))
    admitted = results.count("admitted")
    assert 0 < admitted <= limit, results
    refused = [r for r in results if r != "admitted"]
    expected = (f"team {team}, production pods", "being updated")
    assert all(any(e in r for e in expected) for r in refused), set(refused)
    live = core.list_namespaced_pod(namespace).items
    assert len(live) == admitted <= limit
    tq = k8s.CustomObjectsApi(env.api).get_cluster_custom_object(
        names.GROUP, names.VERSION, "teamquotas", team
    )

    def settled() -> bool:
        st = k8s.CustomObjectsApi(env.api).get_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", team
        )["status"]
        return bool(
            st.get("used", {}).get("production", {}).get("pods") == admitted
            and not st.get("reservations")
        )

    assert tq["spec"]["bands"]["production"]["pods"] == limit
    wait_until(
        "the quota operator to count every admitted pod and settle reservations",
        settled,
        timeout=60,
    )


def test_batch_over_quota_waits_gated_and_starts_as_quota_frees(
    env: Env, namespace: str, team: str
) -> None:
    make_quota(env, team, {"production": {"cpu": "1"}, "batch": {"cpu": "4"}})
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(namespace, pod("runs", "batch", "4"))
    wait_until(
        "the first batch pod counted in used",
        lambda: (
            k8s.CustomObjectsApi(env.api)
            .get_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", team)
            .get("status", {})
            .get("used", {})
            .get("batch", {})
            .get("cpu")
            == "4"  # a canonical quantity string, never a JSON number
        ),
        timeout=60,
    )
    waiting = core.create_namespaced_pod(namespace, pod("waits", "batch", "2"))
    gate_names = [g.name for g in waiting.spec.scheduling_gates or []]
    assert gate_names == ["gates.pilotfish.io/quota-available"]
    plugin = Path(sys.executable).parent / "kubectl-pilotfish"
    why = run([str(plugin), "--kubeconfig", str(env.kubeconfig), "why", "waits", "-n", namespace])
    assert f"team {team}, batch cpu: 4 of 4 used, pod asks 2" in why.stdout, why.stdout
    core.delete_namespaced_pod("runs", namespace, grace_period_seconds=0)

    def released() -> bool:
        p = core.read_namespaced_pod("waits", namespace)
        return not p.spec.scheduling_gates and p.status.phase == "Running"

    wait_until("the gated batch pod released and running once quota freed", released, timeout=90)
