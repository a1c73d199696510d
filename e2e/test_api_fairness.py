"""API Priority and Fairness and the batch account, against the real API server.

The API server names, in every response, the FlowSchema and priority level it classified the
request into (X-Kubernetes-PF-FlowSchema-UID, X-Kubernetes-PF-PriorityLevel-UID), before
authorization: so a refused request is classified too. Each test makes requests as one
identity (the operator's own token, the batch account through the operator's impersonation,
a tenant holding `edit`) and compares those headers with the uids of the chart's objects.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, unplaced_pod, wait_until
from pilotfish import names

pytestmark = pytest.mark.e2e

NS = names.SYSTEM_NAMESPACE
BATCH = names.service_account_user(NS, names.SA_BATCH)
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
SCHEMA_HEADER = "x-kubernetes-pf-flowschema-uid"
LEVEL_HEADER = "x-kubernetes-pf-prioritylevel-uid"
# Who am I: any authenticated identity may ask, so it shows classification and identity.
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SELF_REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def call(
    api: k8s.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    query: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """(status, lower-cased headers, decoded body) of one request, refusals included."""
    kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
    params = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list((query or {}).items()),
        header_params={"Accept": "application/json", "Content-Type": kind},
        body=body,
        auth_settings=["BearerToken"],
    )
    try:
        resp = api.call_api(*params)
        resp.read()
        status, headers, raw = resp.status, resp.getheaders(), resp.data
    except ApiException as e:
        status, headers, raw = e.status, e.headers or {}, e.body
    decoded = json.loads(raw) if raw else None
    return status, {k.lower(): v for k, v in dict(headers).items()}, decoded


def uid(env: Env, kind: str, name: str) -> str:
    status, _, obj = call(env.api, "GET", f"{FLOWCONTROL}/{kind}/{name}")
    assert status == 200, (kind, name, obj)
    return str(obj["metadata"]["uid"])


def classified(headers: dict[str, str]) -> tuple[str | None, str | None]:
    return headers.get(SCHEMA_HEADER), headers.get(LEVEL_HEADER)


def expect(env: Env, schema: str, level: str) -> tuple[str, str]:
    return uid(env, "flowschemas", schema), uid(env, "prioritylevelconfigurations", level)


def as_user(api: k8s.ApiClient, user: str, group: str | None = None) -> k8s.ApiClient:
    """`api`'s own credentials, every request made as `user` (and `group`, if given)."""
    api.set_default_header("Impersonate-User", user)
    if group:
        api.set_default_header("Impersonate-Group", group)
    return api


def admin_as(env: Env, user: str) -> k8s.ApiClient:
    """A fresh admin client (not the session's shared one) impersonating `user`."""
    return as_user(k8s_config.new_client_from_config(config_file=str(env.kubeconfig)), user)


@pytest.fixture
def batch(env: Env) -> k8s.ApiClient:
    """The operator's credentials impersonating pilotfish-batch, as Runtime.batch_rest does."""
    return as_user(env.component_api("operator"), BATCH)


def test_the_levels_and_schemas_exist_and_point_at_each_other(env: Env) -> None:
    levels = {
        "pilotfish-production",
        "pilotfish-batch",
        "pilotfish-tenants",
        "pilotfish-tenant-pods",
    }
    for level in levels:
        uid(env, "prioritylevelconfigurations", level)
    schemas = {
        "pilotfish-production": "pilotfish-production",
        "pilotfish-batch": "pilotfish-batch",
        "pilotfish-batch-submissions": "pilotfish-batch",
        "pilotfish-tenants": "pilotfish-tenants",
        "pilotfish-tenant-pods": "pilotfish-tenant-pods",
    }

    def not_dangling(name: str) -> bool:
        _, _, obj = call(env.api, "GET", f"{FLOWCONTROL}/flowschemas/{name}")
        conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
        return conditions.get("Dangling") == "False"

    for name, level in schemas.items():
        _, _, obj = call(env.api, "GET", f"{FLOWCONTROL}/flowschemas/{name}")
        assert obj["spec"]["priorityLevelConfiguration"]["name"] == level
        wait_until(f"FlowSchema {name} not dangling", functools.partial(not_dangling, name), 30)


@pytest.mark.parametrize("component", ["operator", "webhooks", "extender"])
def test_pilotfish_components_are_in_the_production_level(env: Env, component: str) -> None:
    want = expect(env, "pilotfish-production", "pilotfish-production")
    status, headers, review = call(env.component_api(component), "POST", WHOAMI, SELF_REVIEW)
    assert status == 201, review
    assert review["status"]["userInfo"]["username"] == names.service_account_user(
        NS, names.COMPONENT_ACCOUNTS[component]
    )
    assert classified(headers) == want


def test_the_second_scheduler_is_production_and_kube_scheduler_keeps_workload_high(
    env: Env,
) -> None:
    second = admin_as(env, names.service_account_user(NS, names.SA_SCHEDULER))
    _, headers, _ = call(second, "GET", "/api/v1/nodes", query={"limit": "1"})
    assert classified(headers) == expect(env, "pilotfish-production", "pilotfish-production")
    kube_scheduler = admin_as(env, "system:kube-scheduler")
    _, headers, _ = call(kube_scheduler, "GET", "/api/v1/nodes", query={"limit": "1"})
    assert classified(headers) == expect(env, "kube-scheduler", "workload-high")


def test_the_operator_impersonates_the_batch_account_with_its_fixed_groups(
    batch: k8s.ApiClient,
) -> None:
    """No right on groups is granted: the API server gives an impersonated ServiceAccount
    its groups itself."""
    status, _, review = call(batch, "POST", WHOAMI, SELF_REVIEW)
    assert status == 201, review
    info = review["status"]["userInfo"]
    assert info["username"] == BATCH
    assert {
        "system:serviceaccounts",
        f"system:serviceaccounts:{NS}",
        "system:authenticated",
    } <= set(info["groups"])


def test_the_batch_account_runs_a_task_pod_in_the_batch_level(
    env: Env, batch: k8s.ApiClient, namespace: str
) -> None:
    want = expect(env, "pilotfish-batch", "pilotfish-batch")
    name = f"task-{uuid.uuid4().hex[:6]}"
    path = f"/api/v1/namespaces/{namespace}/pods"
    status, headers, created = call(batch, "POST", path, unplaced_pod(name))
    assert status == 201, created
    assert classified(headers) == want
    status, headers, _ = call(batch, "GET", f"{path}/{name}")
    assert (status, classified(headers)) == (200, want)
    # The tracking finalizer goes on and comes off with a patch, as the batch controller does.
    patch = {"metadata": {"finalizers": ["pilotfish.io/e2e-tracking"]}}
    status, _, patched = call(batch, "PATCH", f"{path}/{name}", patch)
    assert status == 200, patched
    status, _, patched = call(batch, "PATCH", f"{path}/{name}", {"metadata": {"finalizers": None}})
    assert status == 200, patched
    status, headers, _ = call(batch, "DELETE", f"{path}/{name}")
    assert (status, classified(headers)) == (200, want)


def test_the_batch_account_has_nothing_beyond_its_verbs(
    env: Env, batch: k8s.ApiClient, namespace: str
) -> None:
    def refused(method: str, path: str, body: Any = None, **query: str) -> dict[str, Any]:
        status, _, err = call(batch, method, path, body, query or None)
        assert status == 403, (method, path, err)
        assert BATCH in err["message"], err
        return dict(err)

    refused("GET", f"/api/v1/namespaces/{namespace}/pods")  # lists come from the operator
    refused("DELETE", f"/apis/{names.API_VERSION}/teamquotas/e2e")
    refused("GET", f"/api/v1/namespaces/{namespace}/secrets")
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    refused("POST", "/api/v1/namespaces/kube-system/configmaps", configmap)
    # RBAC grants pods everywhere; the API server's policy refuses them in system namespaces.
    err = refused(
        "POST", "/api/v1/namespaces/kube-system/pods", unplaced_pod("intruder"), dryRun="All"
    )
    assert "may not create or change pods" in err["message"]


@pytest.mark.parametrize(
    "user",
    [
        names.service_account_user(NS, names.SA_WEBHOOKS),
        names.service_account_user(NS, names.SA_OPERATOR + "-other"),
        names.service_account_user("default", names.SA_BATCH),  # same name, other namespace
        "tenant-someone",
        "system:admin",
    ],
)
def test_the_operator_may_impersonate_no_one_else(env: Env, user: str) -> None:
    api = as_user(env.component_api("operator"), user)
    status, _, err = call(api, "GET", "/api/v1/nodes", query={"limit": "1"})
    assert status == 403, err
    assert "impersonate" in err["message"], err


def test_the_operator_may_not_add_groups_to_the_batch_account(env: Env) -> None:
    api = as_user(env.component_api("operator"), BATCH, "system:masters")
    status, _, err = call(api, "GET", "/api/v1/nodes", query={"limit": "1"})
    assert status == 403, err
    assert "groups" in err["message"], err


def test_a_tenant_may_not_impersonate_the_batch_account(env: Env, tenant: Tenant) -> None:
    """`edit` grants impersonating ServiceAccounts of the tenant's own namespace; never
    Pilotfish's."""
    review = k8s.AuthorizationV1Api(env.api).create_subject_access_review(
        {
            "spec": {
                "user": tenant.user,
                "groups": ["system:authenticated"],
                "resourceAttributes": {
                    "verb": "impersonate",
                    "resource": "serviceaccounts",
                    "name": names.SA_BATCH,
                    "namespace": NS,
                },
            }
        }
    )
    assert review.status.allowed is False


def test_tenant_writes_submissions_and_pods_each_queue_in_their_own_level(
    env: Env, tenant: Tenant
) -> None:
    path = f"/api/v1/namespaces/{tenant.namespace}/configmaps"
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}
    status, headers, created = call(tenant.api, "POST", path, configmap)
    assert status == 201, created
    assert classified(headers) == expect(env, "pilotfish-tenants", "pilotfish-tenants")
    # Reads are not tenants' writes: the built-in global-default keeps them.
    status, headers, _ = call(tenant.api, "GET", f"{path}/settings")
    assert status == 200
    assert classified(headers) == expect(env, "global-default", "global-default")
    # A BatchWorkload submission, whatever admission then says of it, queues with batch.
    job = {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": "etl"},
        "spec": {"completions": 1, "template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    bw_path = f"/apis/{names.API_VERSION}/namespaces/{tenant.namespace}/batchworkloads"
    _, headers, _ = call(tenant.api, "POST", bw_path, job, {"dryRun": "All"})
    assert classified(headers) == expect(env, "pilotfish-batch-submissions", "pilotfish-batch")
    # A pod is the costly write: a tenant's pod writes queue in their own small level.
    pods_path = f"/api/v1/namespaces/{tenant.namespace}/pods"
    _, headers, _ = call(tenant.api, "POST", pods_path, unplaced_pod("raw"), {"dryRun": "All"})
    assert classified(headers) == expect(env, "pilotfish-tenant-pods", "pilotfish-tenant-pods")


def test_the_batch_controller_writes_its_task_pods_as_the_batch_account(
    env: Env, tenant: Tenant
) -> None:
    """The operator process is wired to the batch account (`--batch-account`, the default):
    the API server's audit log shows each task pod created by the operator acting as
    pilotfish-batch, so those writes were queued in the batch level."""
    job = {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": "apf-probe"},
        "spec": {
            "team": "e2e",  # the namespace fixture's team
            "band": "batch",
            "completions": 2,
            "parallelism": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "task",
                            "image": "example/task:1",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                }
            },
        },
    }
    path = f"/apis/{names.API_VERSION}/namespaces/{tenant.namespace}/batchworkloads"
    audit_log = env.require_local().logs / "audit.log"
    start = audit_log.stat().st_size  # a namespace of the same name may have lived before
    status, _, created = call(tenant.api, "POST", path, job)
    assert status == 201, created["message"]

    def task_pod_creates() -> list[dict[str, Any]]:
        found = []
        with audit_log.open("rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()
        for line in lines:
            if tenant.namespace not in line or '"create"' not in line:
                continue
            event = json.loads(line)
            ref = event.get("objectRef", {})
            is_pod = ref.get("resource") == "pods" and not ref.get("subresource")
            task = str(ref.get("name", "")).startswith("apf-probe-")  # NAME-<index>-<attempt>
            real = "dryRun" not in event.get("requestURI", "")  # not the webhooks' dry runs
            if is_pod and task and real and event.get("stage") == "ResponseComplete":
                found.append(event)
        return found if len(found) >= 2 else []

    creates = wait_until("the batch controller's task pod creates", task_pod_creates, timeout=60)
    for event in creates:
        assert event["user"]["username"] == names.service_account_user(NS, names.SA_OPERATOR)
        assert event["impersonatedUser"]["username"] == BATCH
        assert event["responseStatus"]["code"] == 201

    def complete() -> bool:  # leave a finished job behind, not one creating pods
        _, _, obj = call(tenant.api, "GET", f"{path}/apf-probe")
        conditions = obj.get("status", {}).get("conditions", [])
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    wait_until("the probe job to complete", complete, timeout=60)


@pytest.fixture(autouse=True)
def _local_only(env: Env) -> Iterator[None]:
    env.require_local()  # component tokens exist on the local control plane only
    yield
