"""A tenant with `edit` cannot forge what releases its gates or what it is charged.

Each attack seen in the field is tried as the `tenant` fixture (a user with only the built-in
`edit` role in the test namespace): rewriting the gate record, adding, changing or removing
the gang, team and band labels, adding a release mark. The API server refuses each, naming
the key: the chart's ValidatingAdmissionPolicy `pilotfish-pod-metadata` does, on its own
while the Pilotfish webhooks are down, and the validating webhook does on its own without
the policy. The operator's own updates still pass (a gated release completes, audited once,
even with the webhooks down), and a record forged with the operator's own identity, which
both guards let through, still releases nothing: the gate controller takes each gate's
terms from its GatePolicy and holds the gate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, wait_until
from e2e.test_gates_release import Gated, signal_gate, signals_crd
from pilotfish import gates, names, podmeta
from pilotfish.gates import PodGates
from pilotfish.operators.gates.model import ANNOTATION_RELEASED
from pilotfish.operators.gates.terms import REASON_UNTRUSTED

__all__ = ["signals_crd"]  # a fixture of the release suite, used here too

P = names.GATE_PREFIX
GATE = P + "data"
POLICY = "pilotfish-pod-metadata"
VAP_DENIAL = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
WEBHOOK_DENIAL = 'admission webhook "pod-updates.validate.pilotfish.io" denied the request: '
MERGE = "application/merge-patch+json"


@pytest.fixture
def g(env: Env, namespace: str) -> Iterator[Gated]:
    world = Gated(env, namespace)
    try:
        yield world
    finally:
        world.cleanup()


def message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])


def tenant_pod(tenant: Tenant, g: Gated, name: str, app: str = "forge") -> dict[str, Any]:
    """The tenant creates a pod; the mutating webhook gates it from the app's policy."""
    core = k8s.CoreV1Api(tenant.api)
    body = {
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example/forge:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }

    def create() -> bool:
        try:
            made = core.create_namespaced_pod(tenant.namespace, body)
        except ApiException as e:
            if e.status in (403, 503) or (e.status == 500 and "webhook" in str(e.body)):
                return False  # the webhooks are starting or have not seen the policy yet
            raise
        g.uids.add(made.metadata.uid)
        return GATE in [x.name for x in made.spec.scheduling_gates or []]

    wait_until(f"pod {name} admitted with {GATE}", create, timeout=60)
    return g.must(name)


def forged_record(pod: dict[str, Any]) -> str:
    """The pod's own record with its GateSignal gate turned into a Gang of one."""
    record = gates.read_record(pod)
    assert record is not None and GATE in record.gates
    gang = replace(record.gates[GATE], condition={"type": "Gang", "size": 1})
    return PodGates(record.created, {**record.gates, GATE: gang}).encode()


def attacks(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(the key the denial must name, the merge patch) of every attack."""
    labels = pod["metadata"].get("labels") or {}
    other_team = "someone-else" if labels.get(names.LABEL_TEAM) != "someone-else" else "x"
    return [
        (gates.ANNOTATION_RECORD, {"annotations": {gates.ANNOTATION_RECORD: forged_record(pod)}}),
        (gates.LABEL_GANG, {"labels": {gates.LABEL_GANG: "solo"}}),
        (names.LABEL_TEAM, {"labels": {names.LABEL_TEAM: other_team}}),
        (names.LABEL_BAND, {"labels": {names.LABEL_BAND: "best-effort"}}),
        (gates.LABEL_GATED, {"labels": {gates.LABEL_GATED: None}}),
        (
            ANNOTATION_RELEASED,
            {
                "annotations": {
                    ANNOTATION_RELEASED: json.dumps(
                        {GATE: {"at": "2001-01-01T00:00:00Z", "evidence": "trust me"}}
                    )
                }
            },
        ),
    ]


def try_patch(api: k8s.ApiClient, ns: str, name: str, meta: dict[str, Any]) -> ApiException:
    with pytest.raises(ApiException) as err:
        k8s.CoreV1Api(api).patch_namespaced_pod(name, ns, {"metadata": meta}, _content_type=MERGE)
    assert err.value.status == 403, err.value.body
    return err.value


def refused_naming(tenant: Tenant, g: Gated, name: str, denial: str) -> Callable[[], bool]:
    """Every attack refused by `denial` (the policy's or the webhook's), naming its key."""

    def check() -> bool:
        pod = g.must(name)
        for key, meta in attacks(pod):
            text = message(try_patch(tenant.api, tenant.namespace, name, meta))
            if denial not in text:
                return False
            assert f" {key} " in text and f"by {tenant.user}:" in text, text
            assert "are fixed at creation; only pilotfish-operator may change them" in text
        return True

    return check


def pilotfish_keys(pod: dict[str, Any]) -> dict[str, dict[str, str]]:
    meta = pod["metadata"]
    return {
        part: {k: v for k, v in (meta.get(part) or {}).items() if podmeta.is_pilotfish_key(k)}
        for part in ("labels", "annotations")
    }


def unchanged(g: Gated, name: str, before: dict[str, Any]) -> None:
    assert pilotfish_keys(g.must(name)) == pilotfish_keys(before)


# --- the attacks ---------------------------------------------------------------------------


def test_every_attack_is_refused_at_the_api_server_naming_the_key(
    g: Gated, tenant: Tenant, signals_crd: None
) -> None:
    g.policy("forge", [signal_gate("data", "never")])
    g.signal("never", ready=False)
    pod = tenant_pod(tenant, g, "p")
    assert refused_naming(tenant, g, "p", VAP_DENIAL)()
    unchanged(g, "p", pod)
    # kubectl, as a person would type it: the same words.
    out = tenant.kubectl("label", "pod", "p", f"{gates.LABEL_GANG}=solo", check=False)
    assert out.returncode != 0
    assert f"label {gates.LABEL_GANG} added by {tenant.user}" in out.stderr, out.stderr
    out = tenant.kubectl("annotate", "pod", "p", f"{names.ANNOTATION_EPOCH}=9", check=False)
    assert f"annotation {names.ANNOTATION_EPOCH} added" in out.stderr, out.stderr
    # What is the tenant's own stays the tenant's.
    tenant.kubectl("label", "pod", "p", "tier=web")
    tenant.kubectl("annotate", "pod", "p", "example.com/note=hello")
    assert g.must("p")["metadata"]["labels"]["tier"] == "web"
    # Nothing moved: the gate is still held, waiting on the policy's signal.
    g.wait_state("p", gates.STATE_GATED, "GateSignal never not Ready")
    assert g.held("p") == [GATE]


def test_the_policy_alone_refuses_while_the_webhooks_are_down_and_releases_go_on(
    g: Gated, tenant: Tenant, signals_crd: None
) -> None:
    """With the webhooks killed, the policy still refuses every attack, and the operator's
    own writes are not held up: a gated release completes, with one audit line."""
    env = g.env
    env.require_local()
    g.policy("forge", [signal_gate("data", "go")])
    g.signal("go", ready=False)
    pod = tenant_pod(tenant, g, "p")
    g.wait_state("p", gates.STATE_GATED, "GateSignal go not Ready")
    env.kill("pilotfish-webhooks")
    try:
        assert refused_naming(tenant, g, "p", VAP_DENIAL)()
        unchanged(g, "p", pod)
        g.signal("go", ready=True)
        g.wait_running("p")
        assert g.held("p") == []
    finally:
        env.restart("pilotfish-webhooks")
    released = wait_until(
        "the audit line", lambda: [r for r in g.audit_lines() if r["decision"] == "released"]
    )
    assert [(r["pod"], r["gate"]) for r in released] == [(f"{g.ns}/p", GATE)]


def test_the_webhook_alone_refuses_without_the_policy(
    g: Gated, tenant: Tenant, signals_crd: None
) -> None:
    adm = k8s.AdmissionregistrationV1Api(g.env.api)
    binding = adm.read_validating_admission_policy_binding(POLICY)
    keep = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {
            "name": POLICY,
            "labels": binding.metadata.labels,
            "annotations": binding.metadata.annotations,
        },
        "spec": g.env.api.sanitize_for_serialization(binding.spec),
    }
    g.policy("forge", [signal_gate("data", "never")])
    pod = tenant_pod(tenant, g, "p")
    adm.delete_validating_admission_policy_binding(POLICY)
    try:
        wait_until(
            "the webhook's own denials", refused_naming(tenant, g, "p", WEBHOOK_DENIAL), timeout=30
        )
        unchanged(g, "p", pod)
    finally:
        adm.create_validating_admission_policy_binding(keep)
    wait_until("the policy's denials again", refused_naming(tenant, g, "p", VAP_DENIAL), 30)


# --- the operator --------------------------------------------------------------------------


def test_the_operator_may_and_a_record_it_forged_still_releases_nothing(
    g: Gated, tenant: Tenant, signals_crd: None
) -> None:
    """The operator's identity passes both guards. Even a record forged with it (the field
    report's rewrite: GateSignal to a Gang of one, label gang=solo) releases nothing: the
    controller takes the gate's terms from the GatePolicy, holds it and flags the pod."""
    g.policy("forge", [signal_gate("data", "never")])
    g.signal("never", ready=False)
    pod = tenant_pod(tenant, g, "p")
    g.wait_state("p", gates.STATE_GATED, "GateSignal never not Ready")
    operator = k8s.CoreV1Api(g.env.component_api("operator"))
    operator.patch_namespaced_pod(
        "p",
        g.ns,
        {
            "metadata": {
                "labels": {gates.LABEL_GANG: "solo"},
                "annotations": {gates.ANNOTATION_RECORD: forged_record(pod)},
            }
        },
        _content_type=MERGE,
    )
    held = g.wait_state("p", REASON_UNTRUSTED, "record does not match its GatePolicy")
    assert held["status"] == "False" and '{"size":1,"type":"Gang"}' in held["message"]
    assert g.held("p") == [GATE]
    assert g.must("p")["metadata"]["labels"][gates.LABEL_REVIEW] == "required"
    [event] = wait_until("the Warning Event", lambda: g.events(REASON_UNTRUSTED), timeout=30)
    assert event["type"] == "Warning" and GATE in event["note"]
    if g.env.layout is not None:
        assert g.audit_lines() == []
