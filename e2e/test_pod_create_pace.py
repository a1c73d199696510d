"""Each team's pace of pod creates, kept by the admission webhooks, against the real API server.

A ServiceAccount of a fresh team (the built-in service-accounts FlowSchema puts it in
workload-low, whose many seats let its concurrent creates all reach the webhooks) creates
pods from many threads at once. The webhooks run with this environment's settings (by
default 20 a second, burst 200, a create held at most 2 s and 16 held at once): past the
burst the team's creates are held for their turn and, beyond what may wait, refused with
429, Retry-After and a message naming the team; a refused create leaves nothing behind, and
what got through stays within the burst plus the rate.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, unplaced_pod
from e2e.teams import open_quota, own_team
from pilotfish import names
from pilotfish.webhooks import createpace

pytestmark = pytest.mark.e2e

CREATES = 600
THREADS = 48
# What the local webhooks run with: they inherit this process's environment.
SETTINGS = createpace.PaceSettings.from_env()


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    with own_team(env, namespace) as name:
        open_quota(env, name, namespace)
        yield name


def service_account_client(env: Env, namespace: str) -> k8s.ApiClient:
    """The admin's credentials impersonating ServiceAccount `bot` of `namespace`, bound to
    `edit` there, with a connection per thread."""
    user = names.service_account_user(namespace, "bot")
    k8s.RbacAuthorizationV1Api(env.api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "edit-bot"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": namespace}],
        },
    )
    config = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(env.kubeconfig), client_configuration=config)
    config.connection_pool_maxsize = THREADS
    api = k8s.ApiClient(config)
    api.set_default_header("Impersonate-User", user)
    return api


def test_a_teams_flood_is_paced_and_the_excess_refused_with_retry_after(
    env: Env, namespace: str, team: str
) -> None:
    core = k8s.CoreV1Api(service_account_client(env, namespace))
    lock = threading.Lock()
    created: list[str] = []
    refusals: list[tuple[int, str, str, str | None]] = []

    def create(i: int) -> None:
        name = f"flood-{i}"
        try:
            core.create_namespaced_pod(namespace, unplaced_pod(name))
        except ApiException as e:
            body = json.loads(e.body or "{}")
            retry = (e.headers or {}).get("Retry-After")
            with lock:
                refusals.append((e.status, body.get("reason", ""), body.get("message", ""), retry))
            return
        with lock:
            created.append(name)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(create, range(CREATES)))
    elapsed = time.monotonic() - started

    assert refusals, f"{CREATES} creates from {THREADS} threads in {elapsed:.1f}s: none refused"
    kinds = Counter((status, reason) for status, reason, _, _ in refusals)
    assert set(kinds) == {(429, "TooManyRequests")}, kinds
    for _, _, message, retry in refusals:
        assert f"team {team} is creating pods faster than its pace" in message, message
        assert retry is not None and int(retry) >= 1, "the API server answers Retry-After"
    # What got through stays within the burst plus the rate (and the creates still held
    # when the clock stopped), and exactly those pods exist: a refusal leaves nothing.
    bound = SETTINGS.burst + SETTINGS.per_second * elapsed + SETTINGS.max_held
    assert len(created) <= bound, (len(created), elapsed)
    live = {p.metadata.name for p in k8s.CoreV1Api(env.api).list_namespaced_pod(namespace).items}
    assert live == set(created)
