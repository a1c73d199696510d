"""The Helm chart against the real API server, and the least privilege of its identities."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env
from pilotfish import names
from pilotfish.devcluster import cluster

CHART = str(cluster.chart_dir())


def test_helm_lint(env: Env) -> None:
    res = env.helm("lint", CHART, "--strict")
    assert "0 chart(s) failed" in res.stdout, res.stdout


@pytest.mark.parametrize("local", [False, True], ids=["in-cluster", "local-mode"])
def test_rendered_chart_is_accepted_by_the_api_server(env: Env, local: bool) -> None:
    extra = ["--set", "local.enabled=true", "--set", "local.caBundle=Zm9v"] if local else []
    rendered = env.helm("template", "pilotfish", CHART, "-n", names.SYSTEM_NAMESPACE, *extra).stdout
    kinds = {
        line.split(":", 1)[1].strip() for line in rendered.splitlines() if line.startswith("kind:")
    }
    assert {
        "ServiceAccount",
        "ClusterRole",
        "PriorityClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    } <= kinds
    assert ("Deployment" in kinds) is not local, "local mode runs the parts as host processes"
    # Each object is validated whole by the API server (dry run): created where it does not
    # exist yet, replaced where the local install already has it, so no merge with the live
    # object can hide an invalid field.
    dyn = dynamic.DynamicClient(env.api)
    checked = 0
    for doc in yaml.safe_load_all(rendered):
        if not doc:
            continue
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = doc["metadata"].get("namespace", names.SYSTEM_NAMESPACE) if res.namespaced else None
        try:
            res.create(body=doc, namespace=ns, dry_run="All")
        except ApiException as e:
            if e.status != 409:
                raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {e.body}") from e
            live = res.get(name=doc["metadata"]["name"], namespace=ns)
            doc["metadata"]["resourceVersion"] = live.metadata.resourceVersion
            res.replace(body=doc, namespace=ns, dry_run="All")
        checked += 1
    assert checked >= 20


def test_values_schema_rejects_a_bad_port(env: Env) -> None:
    res = env.helm(
        "template", "pilotfish", CHART, "--set", "local.webhookPort=notaport", check=False
    )
    assert res.returncode != 0
    assert "webhookPort" in res.stderr, res.stderr


def test_local_mode_install_is_deployed(env: Env) -> None:
    env.require_local()
    res = env.helm("status", cluster.RELEASE, "-n", names.SYSTEM_NAMESPACE, "-o", "json")
    status = json.loads(res.stdout)
    assert status["info"]["status"] == "deployed"
    assert status["config"]["local"]["enabled"] is True
    scheduling = k8s.SchedulingV1Api(env.api)
    values = {b: scheduling.read_priority_class(names.PRIORITY_CLASS[b]).value for b in names.BANDS}
    assert values["production"] > values["batch"] > values["best-effort"]


def _allowed(
    api: k8s.ApiClient,
    verb: str,
    resource: str,
    group: str = "",
    namespace: str | None = "default",
    subresource: str | None = None,
) -> bool:
    review = k8s.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "namespace": namespace,
                    "subresource": subresource,
                }
            }
        }
    )
    return bool(review.status.allowed)


# (component, verb, resource, group, subresource, expected)
RBAC_CASES = [
    ("extender", "list", "nodes", "", None, True),
    ("extender", "watch", "pods", "", None, True),
    ("extender", "create", "pods", "", None, False),
    ("extender", "get", "secrets", "", None, False),
    ("extender", "patch", "nodes", "", None, False),
    ("webhooks", "list", "pods", "", None, True),
    ("webhooks", "patch", "teamquotas", names.GROUP, "status", True),
    ("webhooks", "delete", "pods", "", None, False),
    ("webhooks", "get", "secrets", "", None, False),
    ("webhooks", "create", "clusterrolebindings", "rbac.authorization.k8s.io", None, False),
    ("operator", "create", "pods", "", None, True),
    ("operator", "create", "pods", "", "eviction", True),
    ("operator", "patch", "serviceworkloads", names.GROUP, "status", True),
    ("operator", "create", "endpointslices", "discovery.k8s.io", None, True),
    ("operator", "get", "secrets", "", None, False),
    ("operator", "delete", "nodes", "", None, False),
    ("operator", "create", "clusterrolebindings", "rbac.authorization.k8s.io", None, False),
    (
        "operator",
        "update",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        None,
        False,
    ),
]


@pytest.mark.parametrize(("component", "verb", "resource", "group", "sub", "expected"), RBAC_CASES)
def test_component_rbac_is_least_privilege(
    env: Env, component: str, verb: str, resource: str, group: str, sub: str | None, expected: bool
) -> None:
    api = env.component_api(component)
    cluster_scoped = resource in {
        "nodes",
        "clusterrolebindings",
        "mutatingwebhookconfigurations",
        "teamquotas",
    }
    ns = None if cluster_scoped else "default"
    assert _allowed(api, verb, resource, group, ns, sub) is expected


def test_components_run_as_their_service_accounts(env: Env) -> None:
    for component, sa in names.COMPONENT_ACCOUNTS.items():
        api = env.component_api(component)
        review = k8s.AuthenticationV1Api(api).create_self_subject_review({})
        assert (
            review.status.user_info.username
            == f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{sa}"
        )
