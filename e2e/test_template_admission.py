"""Workload templates checked at admission, as a tenant with `edit`, against the real API server.

The workloads webhook dry-runs the pod a ServiceWorkload or BatchWorkload template makes;
a template the API server would refuse is refused when it is written, naming the workload's
own field, instead of being stored and looping on FailedCreate. The dry run is the webhooks'
only way to create a pod: their ServiceAccount's own token cannot create a real one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from e2e.teams import own_team
from e2e.test_serviceworkload import ready_pods, template
from pilotfish import names

SW = "serviceworkloads"
BW = "batchworkloads"


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    """The namespace's own team (set by the platform, as an admin), with no quota yet."""
    with own_team(env, namespace) as name:
        yield name


def grant(env: Env, namespace: str, team: str, production: dict[str, Any]) -> None:
    """A TeamQuota for the team's production band, once admission has seen it."""
    k8s.CustomObjectsApi(env.api).create_cluster_custom_object(
        names.GROUP,
        names.VERSION,
        "teamquotas",
        {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": team},
            "spec": {"team": team, "bands": {"production": production}},
        },
    )
    probe = {
        "metadata": {"name": "probe", "labels": {names.LABEL_BAND: "production"}},
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}]},
    }

    def seen() -> bool:
        try:
            k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            return "no production quota" not in message(e)
        return True

    wait_until(f"TeamQuota {team} visible to admission", seen, timeout=30)


def workload(kind: str, name: str, team: str, tpl: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"team": team, "template": tpl}
    if kind == "ServiceWorkload":
        spec["replicas"] = 2
    else:
        spec["completions"] = 1
    return {
        "apiVersion": names.API_VERSION,
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def without_image() -> dict[str, Any]:
    tpl = template()
    del tpl["spec"]["containers"][0]["image"]
    return tpl


def message(e: ApiException) -> str:
    return str(json.loads(e.body).get("message", ""))


def create(tenant: Tenant, plural: str, body: dict[str, Any]) -> None:
    k8s.CustomObjectsApi(tenant.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, tenant.namespace, plural, body
    )


def refused(tenant: Tenant, plural: str, body: dict[str, Any]) -> str:
    """Create as the tenant, expect a refusal by the workloads webhook; its message."""
    with pytest.raises(ApiException) as err:
        create(tenant, plural, body)
    assert err.value.status == 422, err.value.body
    text = message(err.value)
    assert 'admission webhook "workloads.validate.pilotfish.io" denied the request' in text
    return text


def stored(tenant: Tenant, plural: str, name: str) -> bool:
    try:
        k8s.CustomObjectsApi(tenant.api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, tenant.namespace, plural, name
        )
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def test_service_workload_without_image_is_refused_naming_the_field(
    tenant: Tenant, team: str
) -> None:
    body = workload("ServiceWorkload", "noimage", team, without_image())
    text = refused(tenant, SW, body)
    assert "spec.template.spec.containers[0].image: Required value" in text
    assert "is invalid: spec.containers[0].image: Required value" in text, "the API's own words"
    assert not stored(tenant, SW, "noimage")
    # A server-side dry run of the workload itself gets the same answer.
    res = tenant.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False
    )
    assert res.returncode != 0
    assert "spec.template.spec.containers[0].image: Required value" in res.stderr


def test_containers_as_a_string_is_refused_naming_the_field(tenant: Tenant, team: str) -> None:
    tpl = template()
    tpl["spec"]["containers"] = "example/app:1"
    text = refused(tenant, SW, workload("ServiceWorkload", "stringly", team, tpl))
    assert "spec.template.spec.containers: Invalid type: got string" in text
    assert not stored(tenant, SW, "stringly")


def test_batch_workload_with_a_bad_template_is_refused_and_a_good_one_accepted(
    tenant: Tenant, team: str
) -> None:
    tpl = template()
    tpl["spec"]["restartPolicy"] = "Sometimes"
    text = refused(tenant, BW, workload("BatchWorkload", "bad", team, tpl))
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Sometimes"' in text
    assert "BatchWorkload's spec.template" in text
    good = copy.deepcopy(tpl)
    good["spec"]["restartPolicy"] = "Never"
    create(tenant, BW, workload("BatchWorkload", "good", team, good))
    assert stored(tenant, BW, "good")


def test_valid_service_workload_is_accepted_and_runs(env: Env, tenant: Tenant, team: str) -> None:
    grant(env, tenant.namespace, team, {})
    create(tenant, SW, workload("ServiceWorkload", "web", team, template()))
    wait_until(
        "2 ready replicas", lambda: len(ready_pods(env, tenant.namespace, "web")) == 2, timeout=120
    )
    api = k8s.CustomObjectsApi(tenant.api)
    # A change of the template is checked again; a scale is not a template change.
    broken = [{"op": "remove", "path": "/spec/template/spec/containers/0/image"}]
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            tenant.namespace,
            SW,
            "web",
            broken,
            _content_type="application/json-patch+json",
        )
    assert "spec.template.spec.containers[0].image: Required value" in message(err.value)
    api.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, tenant.namespace, SW, "web", {"spec": {"replicas": 3}}
    )
    wait_until(
        "3 ready replicas", lambda: len(ready_pods(env, tenant.namespace, "web")) == 3, timeout=120
    )


def test_a_team_at_its_quota_can_still_create_a_valid_service_workload(
    env: Env, tenant: Tenant, team: str
) -> None:
    grant(env, tenant.namespace, team, {"pods": 1})
    core = k8s.CoreV1Api(env.api)

    def pod(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {names.LABEL_BAND: "production"}},
            "spec": {"containers": [{"name": "c", "image": "example/x:1"}]},
        }

    core.create_namespaced_pod(tenant.namespace, pod("filler"))
    with pytest.raises(ApiException) as full:
        core.create_namespaced_pod(tenant.namespace, pod("more"), dry_run="All")
    assert "production pods: 1 of 1 used" in message(full.value)
    create(tenant, SW, workload("ServiceWorkload", "waits", team, template()))
    assert stored(tenant, SW, "waits")
    # ... while its template is still checked.
    text = refused(tenant, SW, workload("ServiceWorkload", "broken", team, without_image()))
    assert "spec.template.spec.containers[0].image: Required value" in text


def test_the_webhooks_account_can_only_dry_run_pods(env: Env, namespace: str) -> None:
    core = k8s.CoreV1Api(env.component_api("webhooks"))
    pod = {
        "metadata": {"name": "escape"},
        "spec": {"containers": [{"name": "c", "image": "example/x:1"}]},
    }
    rule = f"{names.SA_WEBHOOKS} may only create pods as a dry run"
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, pod)
    assert err.value.status == 403
    text = message(err.value)
    assert 'admission webhook "pods.validate.pilotfish.io" denied the request' in text
    assert rule in text
    # Where the webhooks do not look, the chart's policy refuses it.
    k8s.CoreV1Api(env.api).patch_namespace(
        namespace, {"metadata": {"labels": {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED}}}
    )

    def refused_by_the_policy() -> bool:
        try:
            core.create_namespaced_pod(namespace, pod)
        except ApiException as e:
            found = message(e)
            return "ValidatingAdmissionPolicy 'pilotfish-webhooks-dry-run-only'" in found
        raise AssertionError("the webhooks' account created a real pod")

    wait_until("the policy to refuse in an unwebhooked namespace", refused_by_the_policy, 30)
    with pytest.raises(ApiException) as system:
        core.create_namespaced_pod("kube-system", pod)
    assert system.value.status == 403
    assert core.create_namespaced_pod(namespace, pod, dry_run="All").metadata.name == "escape"
    assert not core.list_namespaced_pod(namespace).items
