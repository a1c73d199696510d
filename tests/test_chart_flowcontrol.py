"""API Priority and Fairness in the chart, and the batch controller's own identity.

The FlowSchemas must classify as docs/ARCHITECTURE.md says: the control plane's built-in
schemas first, Pilotfish's production path in its own level, the batch account and every
BatchWorkload submission in the batch level per namespace, tenants' writes per namespace. The
batch account holds exactly the verbs the batch controller needs, and the operator may
impersonate that one account and nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pilotfish import names
from pilotfish.cli.main import parser
from pilotfish.operators import runner
from tests.test_chart_values import (
    CHART,
    grants,
    helm,
    load_schema,
    needs_helm,
    render,
    schema_errors,
    with_overrides,
)

NS = names.SYSTEM_NAMESPACE
BATCH_USER = f"system:serviceaccount:{NS}:{names.SA_BATCH}"
LOCAL = ("local.enabled=true", "local.caBundle=Zm9v")
# The built-in schemas whose precedence Pilotfish's must not take (upstream's suggested and
# mandatory configuration): exempt, probes, leader election, endpoint-controller, nodes,
# kube-controller-manager, kube-scheduler, kube-system-service-accounts.
LAST_BUILT_IN_SYSTEM_PRECEDENCE = 900
SERVICE_ACCOUNTS_PRECEDENCE = 9000
GLOBAL_DEFAULT_PRECEDENCE = 9900


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def subjects(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for rule in schema["spec"]["rules"] for s in rule["subjects"]]


# --- values --------------------------------------------------------------------------------


def test_flow_control_and_the_batch_account_are_on_by_default() -> None:
    values = with_overrides()
    assert values["flowControl"]["enabled"] is True
    assert values["batchAccount"]["enabled"] is True
    levels = values["flowControl"]
    # Tenants' pods get the smallest nominal share, then batch; production the largest.
    kinds = ("production", "batch", "tenants", "tenantPods")
    shares = {k: levels[k]["nominalConcurrencyShares"] for k in kinds}
    assert shares["tenantPods"] < shares["batch"] < shares["tenants"] < shares["production"]
    # Neither tenants' level borrows: a flood gets its own seats and no more.
    assert levels["tenants"]["borrowingLimitPercent"] == 0
    assert levels["tenantPods"]["borrowingLimitPercent"] == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"flowControl__enabled": "yes"}, "enabled"),
        ({"flowControl__batch__lendablePercent": 101}, "lendablePercent"),
        ({"flowControl__batch__handSize": 0}, "handSize"),
        ({"flowControl__tenants__queues": 0}, "queues"),
        ({"flowControl__tenants__borrowingLimitPercent": "50"}, "borrowingLimitPercent"),
        ({"flowControl__production__nominalConcurrencyShares": -1}, "nominalConcurrencyShares"),
        ({"flowControl__batch__queueLength": 10}, "queueLength"),
        ({"batchAccount__enabled": 1}, "enabled"),
        ({"batchAccount__name": "other"}, "name"),
    ],
)
def test_bad_flow_control_values_are_rejected_naming_the_field(
    overrides: dict[str, Any], field: str
) -> None:
    errors = schema_errors(with_overrides(**overrides), load_schema())
    assert any(field in e for e in errors), errors


def test_no_borrowing_cap_is_allowed() -> None:
    values = with_overrides(flowControl__batch__borrowingLimitPercent=None)
    assert schema_errors(values, load_schema()) == []


# --- rendered objects ----------------------------------------------------------------------


@needs_helm
@pytest.mark.parametrize("local", [False, True])
def test_levels_and_schemas_classify_as_designed(local: bool) -> None:
    docs = render(*(LOCAL if local else ()))
    levels = of_kind(docs, "PriorityLevelConfiguration")
    schemas = of_kind(docs, "FlowSchema")
    assert set(levels) == {
        "pilotfish-production",
        "pilotfish-batch",
        "pilotfish-tenants",
        "pilotfish-tenant-pods",
    }
    for level in levels.values():
        assert level["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
        assert level["spec"]["type"] == "Limited"
        limited = level["spec"]["limited"]
        assert limited["limitResponse"]["type"] == "Queue"
        queuing = limited["limitResponse"]["queuing"]
        assert 1 <= queuing["handSize"] <= queuing["queues"]
    assert levels["pilotfish-batch"]["spec"]["limited"]["nominalConcurrencyShares"] == 5
    # A team's flood never borrows other levels' idle seats.
    assert levels["pilotfish-tenants"]["spec"]["limited"]["borrowingLimitPercent"] == 0
    by_level = {n: s["spec"]["priorityLevelConfiguration"]["name"] for n, s in schemas.items()}
    assert by_level == {
        "pilotfish-production": "pilotfish-production",
        "pilotfish-batch": "pilotfish-batch",
        "pilotfish-batch-submissions": "pilotfish-batch",
        "pilotfish-tenants": "pilotfish-tenants",
        "pilotfish-tenant-pods": "pilotfish-tenant-pods",
    }
    precedence = {n: s["spec"]["matchingPrecedence"] for n, s in schemas.items()}
    # The control plane's own schemas (kube-scheduler keeps workload-high) win over ours...
    assert min(precedence.values()) > LAST_BUILT_IN_SYSTEM_PRECEDENCE
    # ...Pilotfish's accounts and BatchWorkload submissions are carved out before the
    # ServiceAccount catch-all; tenants' writes before global-default, after every other one.
    for name in ("pilotfish-production", "pilotfish-batch", "pilotfish-batch-submissions"):
        assert precedence[name] < SERVICE_ACCOUNTS_PRECEDENCE, name
    assert precedence["pilotfish-batch-submissions"] < precedence["pilotfish-tenants"]
    # A tenant's pod write is carved out of its other writes, so it must be matched first.
    pods = precedence["pilotfish-tenant-pods"]
    assert SERVICE_ACCOUNTS_PRECEDENCE < pods < precedence["pilotfish-tenants"]
    assert SERVICE_ACCOUNTS_PRECEDENCE < precedence["pilotfish-tenants"] < GLOBAL_DEFAULT_PRECEDENCE
    distinguisher = {n: s["spec"]["distinguisherMethod"]["type"] for n, s in schemas.items()}
    assert distinguisher == {
        "pilotfish-production": "ByUser",
        "pilotfish-batch": "ByNamespace",
        "pilotfish-batch-submissions": "ByNamespace",
        "pilotfish-tenants": "ByNamespace",
        "pilotfish-tenant-pods": "ByNamespace",
    }


@needs_helm
def test_production_schema_holds_exactly_the_component_accounts_of_the_release() -> None:
    schemas = of_kind(render(), "FlowSchema")
    production = subjects(schemas["pilotfish-production"])
    assert {(s["kind"], s["serviceAccount"]["namespace"]) for s in production} == {
        ("ServiceAccount", NS)
    }
    assert {s["serviceAccount"]["name"] for s in production} == {
        names.SA_OPERATOR,
        names.SA_EXTENDER,
        names.SA_WEBHOOKS,
        names.SA_SCHEDULER,
    }
    (batch,) = subjects(schemas["pilotfish-batch"])
    assert batch["serviceAccount"] == {"name": names.SA_BATCH, "namespace": NS}
    # Another release namespace moves every subject with it.
    other = of_kind(render_in("platform"), "FlowSchema")
    assert {s["serviceAccount"]["namespace"] for s in subjects(other["pilotfish-production"])} == {
        "platform"
    }


def render_in(namespace: str, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "t", str(CHART), "-n", namespace]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if isinstance(d, dict)]


@needs_helm
def test_submissions_and_tenant_writes_are_writes_of_namespaced_objects() -> None:
    schemas = of_kind(render(), "FlowSchema")
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for name in ("pilotfish-batch-submissions", "pilotfish-tenants", "pilotfish-tenant-pods"):
        (rule,) = schemas[name]["spec"]["rules"]
        assert rule["subjects"] == [{"kind": "Group", "group": {"name": "system:authenticated"}}]
        (resources,) = rule["resourceRules"]
        assert set(resources["verbs"]) == writes, name
        assert resources["namespaces"] == ["*"]
        assert not resources.get("clusterScope"), name
        assert "nonResourceRules" not in rule
    (submissions,) = schemas["pilotfish-batch-submissions"]["spec"]["rules"][0]["resourceRules"]
    assert (submissions["apiGroups"], submissions["resources"]) == (
        ["pilotfish.io"],
        ["batchworkloads"],
    )
    (pods,) = schemas["pilotfish-tenant-pods"]["spec"]["rules"][0]["resourceRules"]
    assert (pods["apiGroups"], pods["resources"]) == ([""], ["pods"])


@needs_helm
def test_flow_control_can_be_switched_off_and_tuned() -> None:
    off = render("flowControl.enabled=false")
    assert not of_kind(off, "FlowSchema") and not of_kind(off, "PriorityLevelConfiguration")
    tuned = of_kind(
        render(
            "flowControl.batch.nominalConcurrencyShares=3",
            "flowControl.batch.borrowingLimitPercent=null",
        ),
        "PriorityLevelConfiguration",
    )
    limited = tuned["pilotfish-batch"]["spec"]["limited"]
    assert limited["nominalConcurrencyShares"] == 3
    assert "borrowingLimitPercent" not in limited  # no cap


# --- the batch account ----------------------------------------------------------------------


def _operator_args(docs: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == names.SA_OPERATOR
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


@needs_helm
@pytest.mark.parametrize("local", [False, True])
def test_the_batch_account_has_exactly_the_batch_controllers_verbs(local: bool) -> None:
    docs = render(*(LOCAL if local else ()))
    accounts = of_kind(docs, "ServiceAccount")
    assert accounts[names.SA_BATCH]["automountServiceAccountToken"] is False  # no pod runs as it
    assert accounts[names.SA_OPERATOR]["automountServiceAccountToken"] is True
    roles = of_kind(docs, "ClusterRole")
    assert grants(roles[names.SA_BATCH]["rules"]) == {
        ("", "pods", "create"),
        ("", "pods", "get"),
        ("", "pods", "delete"),
        ("", "pods", "deletecollection"),  # a sync's recorded pods, in one request
        ("", "pods", "patch"),
        ("pilotfish.io", "batchworkloads", "get"),
        ("pilotfish.io", "batchworkloads/status", "get"),
        ("pilotfish.io", "batchworkloads/status", "patch"),
        ("pilotfish.io", "batchworkloads/status", "update"),
        # No endpoint: lets its pods carry a blockOwnerDeletion ownerReference.
        ("pilotfish.io", "batchworkloads/finalizers", "update"),
    }
    binding = of_kind(docs, "ClusterRoleBinding")[names.SA_BATCH]
    assert binding["roleRef"]["name"] == names.SA_BATCH
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": names.SA_BATCH, "namespace": NS}
    ]


@needs_helm
def test_the_operator_may_impersonate_the_batch_account_and_nothing_else() -> None:
    docs = render()
    impersonating = [
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"), rule)
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for rule in d["rules"]
        if "impersonate" in rule["verbs"] or "*" in rule["verbs"]
    ]
    assert impersonating == [
        (
            "Role",
            "pilotfish-operator-impersonate-batch",
            NS,
            {
                "apiGroups": [""],
                "resources": ["serviceaccounts"],
                "resourceNames": [names.SA_BATCH],
                "verbs": ["impersonate"],
            },
        )
    ]
    bindings = of_kind(docs, "RoleBinding")
    binding = bindings["pilotfish-operator-impersonate-batch"]
    assert binding["metadata"]["namespace"] == NS
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "pilotfish-operator-impersonate-batch",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": names.SA_OPERATOR, "namespace": NS}
    ]
    assert _operator_args(docs)[-2:] == ["--batch-account", names.SA_BATCH]


@needs_helm
def test_switching_the_batch_account_off_removes_it_and_tells_the_operator() -> None:
    docs = render("batchAccount.enabled=false")
    assert names.SA_BATCH not in of_kind(docs, "ServiceAccount")
    assert names.SA_BATCH not in of_kind(docs, "ClusterRole")
    assert "pilotfish-operator-impersonate-batch" not in of_kind(docs, "Role")
    assert _operator_args(docs)[-1] == "--no-batch-account"


@needs_helm
def test_the_batch_account_may_not_make_pods_in_system_namespaces() -> None:
    for docs in (render(), render("batchAccount.enabled=false")):
        (policy,) = [
            d
            for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"] == "pilotfish-system-namespaces"
        ]
        (who,) = policy["spec"]["matchConditions"]
        assert f'"{BATCH_USER}"' in who["expression"]


# --- the operator process -------------------------------------------------------------------


def test_the_operator_writes_batch_as_the_batch_account_of_its_namespace_by_default() -> None:
    args = parser().parse_args(["operator"])
    assert args.batch_account == names.SA_BATCH
    assert runner.batch_user(None, args.batch_account) == BATCH_USER
    assert runner.batch_user("platform", args.batch_account) == (
        f"system:serviceaccount:platform:{names.SA_BATCH}"
    )
    named = parser().parse_args(["operator", "--batch-account", "bulk"])
    assert runner.batch_user(None, named.batch_account) == f"system:serviceaccount:{NS}:bulk"


def test_the_batch_account_can_be_switched_off() -> None:
    args = parser().parse_args(["operator", "--no-batch-account"])
    assert args.batch_account is None
    assert runner.batch_user(None, args.batch_account) is None
    assert runner.batch_user(None, "") is None
    with pytest.raises(SystemExit):
        parser().parse_args(["operator", "--no-batch-account", "--batch-account", "x"])
