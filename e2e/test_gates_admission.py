"""Gated release at admission, against the real API server, scheduler and webhooks.

Gates go on at creation (the mutating webhook), undeclared or foreign gates are refused (the
validating webhook), the API server refuses gates added later, only pilotfish-operator and
the releaser group may remove Pilotfish gates (the chart's ValidatingAdmissionPolicy), and a
tenant's own ServiceAccount may raise the GateSignals of its namespace and of no other.

The webhooks see GatePolicies through a watch, so after creating one each test waits until a
dry-run pod creation shows it has arrived, as a careful user would, rather than sleeping.
Nothing here releases gates through the gate controller: that is another suite's business.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from e2e.teams import open_quota
from pilotfish import names
from pilotfish.gates import LABEL_GATED, PodGates, read_record
from pilotfish.timeutil import parse_time

GATE = "gates.pilotfish.io/data-ready"
VAP_RULE = (
    "only pilotfish-operator (or members of pilotfish:gate-releasers) may remove "
    "gates.pilotfish.io/ gates"
)
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


# --- helpers ---------------------------------------------------------------------------------


def gate_policy(
    name: str,
    gates: list[str],
    selector: dict[str, Any] | None = None,
    prefixes: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": selector if selector is not None else {},
        "gates": [
            {
                "name": g,
                "condition": {"type": "GateSignal", "signalName": "data-ready"},
                "timeoutSeconds": 3600,
            }
            for g in gates
        ],
    }
    if prefixes is not None:
        spec["allowedPrefixes"] = prefixes
    return {
        "apiVersion": names.API_VERSION,
        "kind": "GatePolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(env: Env, namespace: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, plural, body
    )
    return out


def pod_body(
    name: str, labels: dict[str, str] | None = None, gates: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "c",
                "image": "example/gated:1",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }
        ]
    }
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def as_dict(api: k8s.ApiClient, obj: Any) -> dict[str, Any]:
    """A model object from the client as the API's own camelCase dict."""
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


def gate_names(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def dry_run(env: Env, namespace: str, body: dict[str, Any]) -> dict[str, Any] | ApiException:
    """What creating `body` would give (admission included), without creating it."""
    try:
        created = k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, body, dry_run="All")
    except ApiException as e:
        return e
    return as_dict(env.api, created)


def wait_policy_seen(env: Env, namespace: str, body: dict[str, Any], gate: str) -> None:
    """Until the webhooks' view has a policy putting `gate` on pods like `body`."""

    def seen() -> bool:
        out = dry_run(env, namespace, body)
        return isinstance(out, dict) and gate in gate_names(out)

    wait_until(f"the webhooks to see the GatePolicy giving {gate}", seen, timeout=30)


def refused(call: Callable[[], Any]) -> ApiException:
    with pytest.raises(ApiException) as err:
        call()
    return err.value


def message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])


def tenant_client(env: Env, namespace: str, account: str) -> k8s.ApiClient:
    """A client authenticated as a tenant ServiceAccount (created here), by a bound token."""
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"audiences": [], "expirationSeconds": 3600}}
    ).status.token
    admin = env.api.configuration
    cfg = k8s.Configuration(
        host=admin.host,
        api_key={"BearerToken": token},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    cfg.ssl_ca_cert = admin.ssl_ca_cert
    cfg.verify_ssl = admin.verify_ssl
    return k8s.ApiClient(cfg)


def bind(
    env: Env, namespace: str, name: str, role: dict[str, str], subject: dict[str, str]
) -> None:
    k8s.RbacAuthorizationV1Api(env.api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", **role},
            "subjects": [subject],
        },
    )


def can(api: k8s.ApiClient, verb: str, resource: str, namespace: str, **attrs: str) -> bool:
    review = k8s.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "namespace": namespace,
                    **attrs,
                }
            }
        }
    )
    return bool(review.status.allowed)


@pytest.fixture
def other_namespace(env: Env, namespace: str) -> Iterator[str]:
    """A second tenant namespace, for isolation tests; deleted afterwards."""
    name = f"{namespace[:50]}-b{hashlib.sha1(namespace.encode()).hexdigest()[:4]}"
    core = k8s.CoreV1Api(env.api)
    core.create_namespace({"metadata": {"name": name, "labels": {names.LABEL_TEAM: "e2e-b"}}})
    wait_until(
        f"the default ServiceAccount in {name}",
        lambda: core.read_namespaced_service_account("default", name),
    )
    open_quota(env, "e2e-b", name)
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


# --- gates at creation -----------------------------------------------------------------------


def test_gates_are_injected_at_creation_and_the_scheduler_never_binds(
    env: Env, namespace: str
) -> None:
    core = k8s.CoreV1Api(env.api)
    create(
        env,
        namespace,
        "gatepolicies",
        gate_policy("data", [GATE], {"matchLabels": {"app": "gated"}}),
    )
    wait_policy_seen(env, namespace, pod_body("probe", {"app": "gated"}), GATE)

    core.create_namespaced_pod(namespace, pod_body("gated", {"app": "gated"}))
    # Created after the gated pod, so by the time it is bound the scheduler has seen both.
    core.create_namespaced_pod(namespace, pod_body("control", {"app": "plain"}))

    pod = as_dict(env.api, core.read_namespaced_pod("gated", namespace))
    assert gate_names(pod) == [GATE]
    labels = pod["metadata"]["labels"]
    assert (labels["app"], labels[LABEL_GATED]) == ("gated", "true")
    record = read_record(pod)
    assert isinstance(record, PodGates)
    [(name, terms)] = record.gates.items()
    assert name == GATE
    assert (terms.policy, terms.generation, terms.owner) == ("data", 1, names.SA_OPERATOR)
    assert terms.condition == {"type": "GateSignal", "signalName": "data-ready"}
    assert (terms.timeout_seconds, terms.on_expiry) == (3600, "Fail")
    assert parse_time(terms.deadline) - parse_time(record.created) == timedelta(seconds=3600)
    created = parse_time(pod["metadata"]["creationTimestamp"])
    assert abs(parse_time(record.created) - created) <= timedelta(seconds=5)

    control = as_dict(env.api, core.read_namespaced_pod("control", namespace))
    assert gate_names(control) == []
    assert LABEL_GATED not in control["metadata"]["labels"]

    def bound() -> bool:
        return bool(core.read_namespaced_pod("control", namespace).spec.node_name)

    def reported_gated() -> bool:
        conds = core.read_namespaced_pod("gated", namespace).status.conditions or []
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "SchedulingGated"
            for c in conds
        )

    wait_until("the ungated control pod bound", bound, timeout=60)
    wait_until("the scheduler to report the pod SchedulingGated", reported_gated, timeout=60)
    assert core.read_namespaced_pod("gated", namespace).spec.node_name is None


def test_the_api_server_refuses_a_gate_added_after_creation(env: Env, namespace: str) -> None:
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(namespace, pod_body("plain"))

    def add_gate(gate: str) -> Callable[[], Any]:
        body = {"spec": {"schedulingGates": [{"name": gate}]}}
        return lambda: core.patch_namespaced_pod("plain", namespace, body, _content_type=SMP)

    for gate in ("example.com/late", GATE):
        err = refused(add_gate(gate))
        assert err.status == 422, err.body
        assert (
            f"spec.schedulingGates[0].name: Forbidden: only deletion is allowed, but found new "
            f"scheduling gate '{gate}'" in message(err)
        )
    assert gate_names(as_dict(env.api, core.read_namespaced_pod("plain", namespace))) == []


# --- what the validating webhook refuses -------------------------------------------------------


def test_an_undeclared_pilotfish_gate_is_refused_by_name(env: Env, namespace: str) -> None:
    core = k8s.CoreV1Api(env.api)
    err = refused(
        lambda: core.create_namespaced_pod(
            namespace, pod_body("sneaky", gates=["gates.pilotfish.io/sneaky", "example.com/own"])
        )
    )
    assert err.status == 403, err.body
    assert message(err) == (
        'admission webhook "pods.validate.pilotfish.io" denied the request: gate '
        f"gates.pilotfish.io/sneaky is not declared by any GatePolicy in namespace {namespace} "
        "that selects this pod (only GatePolicies may set gates.pilotfish.io/ gates)"
    )
    # A gate under a prefix nobody claims is the client's own business.
    core.create_namespaced_pod(namespace, pod_body("own", gates=["example.com/own"]))


def test_tenant_a_may_not_use_tenant_b_prefix(
    env: Env, namespace: str, other_namespace: str
) -> None:
    core = k8s.CoreV1Api(env.api)
    theirs = "teamb.example.com/ready"
    create(
        env,
        other_namespace,
        "gatepolicies",
        gate_policy("team-b", [theirs], {}, prefixes=["teamb.example.com/"]),
    )
    expected = (
        'admission webhook "pods.validate.pilotfish.io" denied the request: namespace '
        f"{namespace} may not use gate prefix teamb.example.com/ (gate {theirs}): it belongs "
        f"to GatePolicies in namespace {other_namespace}"
    )
    body = pod_body("borrower", gates=[theirs])

    def refused_by_prefix() -> bool:
        out = dry_run(env, namespace, body)
        return isinstance(out, ApiException) and message(out) == expected

    wait_until("the webhooks to see team B's GatePolicy", refused_by_prefix, timeout=30)
    err = refused(lambda: core.create_namespaced_pod(namespace, body))
    assert err.status == 403 and message(err) == expected

    # In its own namespace the same gate is fine, and the policy's copy is not added twice.
    core.create_namespaced_pod(other_namespace, pod_body("owner", gates=[theirs]))
    owned = as_dict(env.api, core.read_namespaced_pod("owner", other_namespace))
    assert gate_names(owned) == [theirs]
    record = read_record(owned)
    assert record is not None and list(record.gates) == [theirs]


# --- GateSignals: a tenant's own ServiceAccount, its own namespace -----------------------------


def test_a_tenant_service_account_raises_signals_in_its_namespace_only(
    env: Env, namespace: str, other_namespace: str
) -> None:
    custom = k8s.CustomObjectsApi(env.api)
    for ns in (namespace, other_namespace):
        create(
            env,
            ns,
            "gatesignals",
            {
                "apiVersion": names.API_VERSION,
                "kind": "GateSignal",
                "metadata": {"name": "data-ready"},
                "spec": {"description": "the nightly warehouse load is complete"},
            },
        )
    bind(
        env,
        namespace,
        "signaller-gatesignals",
        {"kind": "ClusterRole", "name": "pilotfish-gatesignal-writer"},
        {"kind": "ServiceAccount", "name": "signaller", "namespace": namespace},
    )
    api = tenant_client(env, namespace, "signaller")
    wait_until(
        "the RoleBinding to take effect",
        lambda: can(
            api, "patch", "gatesignals", namespace, group=names.GROUP, subresource="status"
        ),
        timeout=30,
    )
    tenant = k8s.CustomObjectsApi(api)
    ready = {
        "status": {
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "LoadComplete",
                    "message": "warehouse load 2030-01-01 finished",
                    "lastTransitionTime": "2030-01-01T00:00:00Z",
                }
            ],
        }
    }

    def raise_in(ns: str) -> Any:
        return tenant.patch_namespaced_custom_object_status(
            names.GROUP,
            names.VERSION,
            ns,
            "gatesignals",
            "data-ready",
            ready,
            _content_type=MERGE,
        )

    raise_in(namespace)
    signal = custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, "gatesignals", "data-ready"
    )
    [condition] = signal["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Ready",
        "True",
        "LoadComplete",
    )
    table = env.kubectl("get", "gs", "data-ready", "-n", namespace).stdout.split()
    assert table[:3] == ["NAME", "READY", "AGE"] and table[3:5] == ["data-ready", "True"], table
    # Its own namespace's signals it may also create; nothing in the other namespace, and
    # no pods anywhere (gates are never its to remove).
    tenant.create_namespaced_custom_object(
        names.GROUP,
        names.VERSION,
        namespace,
        "gatesignals",
        {"apiVersion": names.API_VERSION, "kind": "GateSignal", "metadata": {"name": "image-warm"}},
    )
    err = refused(lambda: raise_in(other_namespace))
    assert err.status == 403, err.body
    assert (
        f'cannot patch resource "gatesignals/status" in API group "pilotfish.io" in the '
        f'namespace "{other_namespace}"'
    ) in message(err)
    assert (
        refused(
            lambda: tenant.get_namespaced_custom_object(
                names.GROUP, names.VERSION, other_namespace, "gatesignals", "data-ready"
            )
        ).status
        == 403
    )
    assert not can(api, "patch", "pods", namespace)
    untouched = custom.get_namespaced_custom_object(
        names.GROUP, names.VERSION, other_namespace, "gatesignals", "data-ready"
    )
    assert not (untouched.get("status") or {}).get("conditions")


# --- removing Pilotfish gates: the operator and the releasers only -----------------------------


def test_a_tenant_may_not_remove_a_pilotfish_gate_but_a_releaser_may(
    env: Env, namespace: str
) -> None:
    core = k8s.CoreV1Api(env.api)
    own = "example.com/own-check"
    create(
        env,
        namespace,
        "gatepolicies",
        gate_policy("data", [GATE], {"matchLabels": {"app": "gated"}}),
    )
    wait_policy_seen(env, namespace, pod_body("probe", {"app": "gated"}), GATE)
    core.create_namespaced_pod(namespace, pod_body("held", {"app": "gated"}, gates=[own]))
    assert gate_names(as_dict(env.api, core.read_namespaced_pod("held", namespace))) == [own, GATE]

    # A tenant ServiceAccount that may patch its namespace's pods.
    k8s.RbacAuthorizationV1Api(env.api).create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-editor"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
        },
    )
    bind(
        env,
        namespace,
        "deployer-pods",
        {"kind": "Role", "name": "pod-editor"},
        {"kind": "ServiceAccount", "name": "deployer", "namespace": namespace},
    )
    # The on-call group gets the same RBAC; membership only lifts the admission policy.
    bind(
        env,
        namespace,
        "releasers-pods",
        {"kind": "Role", "name": "pod-editor"},
        {
            "kind": "Group",
            "name": "pilotfish:gate-releasers",
            "apiGroup": "rbac.authorization.k8s.io",
        },
    )
    api = tenant_client(env, namespace, "deployer")
    wait_until("the RoleBinding to take effect", lambda: can(api, "patch", "pods", namespace))
    tenant = k8s.CoreV1Api(api)

    def remove(gate: str) -> Any:
        return tenant.patch_namespaced_pod(
            "held",
            namespace,
            {"spec": {"schedulingGates": [{"name": gate, "$patch": "delete"}]}},
            _content_type=SMP,
        )

    # Its own prefix's gate the tenant may remove; the Pilotfish gate it may not.
    remove(own)
    err = refused(lambda: remove(GATE))
    assert err.status == 403, err.body
    assert message(err) == (
        f"pods \"held\" is forbidden: ValidatingAdmissionPolicy 'pilotfish-gate-ownership' with "
        f"binding 'pilotfish-gate-ownership' denied request: gate {GATE} cannot be removed by "
        f"system:serviceaccount:{namespace}:deployer: {VAP_RULE}"
    )
    assert gate_names(as_dict(env.api, core.read_namespaced_pod("held", namespace))) == [GATE]

    # On call, in the releasers group, may (the `kubectl pilotfish gates release` path).
    patch = json.dumps({"spec": {"schedulingGates": [{"name": GATE, "$patch": "delete"}]}})
    args = ("-n", namespace, "patch", "pod", "held", "--type=strategic", "-p", patch)
    env.kubectl(*args, "--as=on-call", "--as-group=pilotfish:gate-releasers")
    assert gate_names(as_dict(env.api, core.read_namespaced_pod("held", namespace))) == []
    wait_until(
        "the released pod bound",
        lambda: core.read_namespaced_pod("held", namespace).spec.node_name,
        timeout=60,
    )


def test_pilotfish_operator_removes_pilotfish_gates(env: Env, namespace: str) -> None:
    """The operator's own ServiceAccount token (a host process in local mode) passes the
    policy: it is the one identity the gate controller runs as."""
    operator = k8s.CoreV1Api(env.component_api("operator"))
    core = k8s.CoreV1Api(env.api)
    create(env, namespace, "gatepolicies", gate_policy("data", [GATE], {}))
    wait_policy_seen(env, namespace, pod_body("probe"), GATE)
    core.create_namespaced_pod(namespace, pod_body("held"))
    assert gate_names(as_dict(env.api, core.read_namespaced_pod("held", namespace))) == [GATE]
    operator.patch_namespaced_pod(
        "held",
        namespace,
        {"spec": {"schedulingGates": [{"name": GATE, "$patch": "delete"}]}},
        _content_type=SMP,
    )
    assert gate_names(as_dict(env.api, core.read_namespaced_pod("held", namespace))) == []
