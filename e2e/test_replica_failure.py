"""Refused pod creates show in a ServiceWorkload's status and in `kubectl get sw`.

Two refusals the API server really sends: the team quota webhook's (a 2-CPU production
quota and 6 replicas of 500m) and the API server's own ResourceQuota admission (`pods: 1`,
set by the admin in the namespace). Each is a ReplicaFailure condition carrying the API
server's text while it lasts, Progressing stops claiming progress, and the condition goes
away once creates succeed again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from e2e.teams import own_team
from pilotfish import names
from pilotfish.workloads import LABEL_WORKLOAD

PLURAL = "serviceworkloads"
# Refusals back the workload off in the work queue (per key, doubling from 5 ms); raising
# the quota is no event for the controller, so the next try comes at the end of a backoff.
CLEAR_TIMEOUT = 150.0


def template(cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "example/app:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": 5,
        },
    }


def custom(env: Env) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(env.api)


def create_sw(env: Env, ns: str, team: str, replicas: int, cpu: str) -> None:
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": "web"},
        "spec": {
            "team": team,
            "band": "production",
            "replicas": replicas,
            "template": template(cpu),
        },
    }
    custom(env).create_namespaced_custom_object(names.GROUP, names.VERSION, ns, PLURAL, body)


def conditions(env: Env, ns: str) -> dict[str, dict[str, Any]]:
    sw = custom(env).get_namespaced_custom_object(names.GROUP, names.VERSION, ns, PLURAL, "web")
    return {c["type"]: c for c in (sw.get("status") or {}).get("conditions") or []}


def failure_with(env: Env, ns: str, reason: str) -> dict[str, dict[str, Any]] | None:
    got = conditions(env, ns)
    failure = got.get("ReplicaFailure") or {}
    if failure.get("status") == "True" and failure.get("reason") == reason:
        return got
    return None


def cleared(env: Env, ns: str, replicas: int) -> dict[str, dict[str, Any]] | None:
    got = conditions(env, ns)
    if got.get("ReplicaFailure", {}).get("status") == "True":
        return None
    pods = k8s.CoreV1Api(env.api).list_namespaced_pod(ns, label_selector=LABEL_WORKLOAD)
    return got if len(pods.items) == replicas else None


def get_sw_row(env: Env, ns: str) -> str:
    return env.kubectl("-n", ns, "get", "sw", "web").stdout


def assert_not_claiming_progress(got: dict[str, dict[str, Any]]) -> None:
    progressing = got["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "ReplicaFailure"), got
    assert not any("making progress" in c.get("message", "") for c in got.values()), got


def set_production_cpu(env: Env, team: str, cpu: str | None) -> None:
    body = {"spec": {"team": team, "bands": {"production": {} if cpu is None else {"cpu": cpu}}}}
    try:
        custom(env).create_cluster_custom_object(
            names.GROUP,
            names.VERSION,
            "teamquotas",
            {"apiVersion": names.API_VERSION, "kind": "TeamQuota", "metadata": {"name": team}}
            | body,
        )
    except ApiException as e:
        if e.status != 409:
            raise
        custom(env).patch_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", team, body
        )


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    with own_team(env, namespace) as name:
        yield name


def wait_quota_seen(env: Env, ns: str, team: str) -> None:
    """Admission reads TeamQuotas from its informer: wait until a dry run is charged to it."""
    probe = {
        "metadata": {"name": "probe", "labels": {names.LABEL_BAND: "production"}},
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}]},
    }

    def seen() -> bool:
        try:
            k8s.CoreV1Api(env.api).create_namespaced_pod(ns, probe, dry_run="All")
        except ApiException as e:
            if e.status == 403 and "no production quota" in str(e.body):
                return False
            raise
        return True

    wait_until(f"TeamQuota {team} visible to admission", seen, timeout=30)


def test_over_quota_is_a_replica_failure_with_the_quota_text_until_raised(
    env: Env, namespace: str, team: str
) -> None:
    set_production_cpu(env, team, "2")
    wait_quota_seen(env, namespace, team)
    create_sw(env, namespace, team, replicas=6, cpu="500m")

    got = wait_until(
        "ReplicaFailure QuotaExceeded",
        lambda: failure_with(env, namespace, "QuotaExceeded"),
        timeout=60,
    )
    message = got["ReplicaFailure"]["message"]
    assert f"team {team}, production cpu: " in message, message
    assert "used, pod asks 500m" in message, message
    assert_not_claiming_progress(got)
    assert "QuotaExceeded" in get_sw_row(env, namespace)

    set_production_cpu(env, team, "4")
    got = wait_until(
        "creates to succeed and ReplicaFailure to clear",
        lambda: cleared(env, namespace, 6),
        timeout=CLEAR_TIMEOUT,
    )
    assert got["Progressing"]["status"] == "True", got
    assert "QuotaExceeded" not in get_sw_row(env, namespace)


def test_a_create_the_api_server_forbids_is_failed_create(env: Env, namespace: str) -> None:
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}
    )
    wait_until(
        "the ResourceQuota's status",
        lambda: (core.read_namespaced_resource_quota("one-pod", namespace).status.hard or {}).get(
            "pods"
        ),
        timeout=60,
    )
    create_sw(env, namespace, "e2e", replicas=2, cpu="10m")

    got = wait_until(
        "ReplicaFailure FailedCreate",
        lambda: failure_with(env, namespace, "FailedCreate"),
        timeout=60,
    )
    message = got["ReplicaFailure"]["message"]
    assert "forbidden: exceeded quota: one-pod" in message, message
    assert_not_claiming_progress(got)
    assert "FailedCreate" in get_sw_row(env, namespace)

    core.delete_namespaced_resource_quota("one-pod", namespace)
    wait_until(
        "creates to succeed and ReplicaFailure to clear",
        lambda: cleared(env, namespace, 2),
        timeout=CLEAR_TIMEOUT,
    )
    assert "FailedCreate" not in get_sw_row(env, namespace)
