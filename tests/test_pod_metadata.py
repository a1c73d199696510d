"""Pilotfish's labels and annotations on pods are fixed at creation: the list of keys, the
webhook's review of pod UPDATEs, and the chart's two guards (policy and webhook rule).

The policy's CEL runs in the API server only (e2e/test_tenant_forgery.py drives it); here
the rendered chart is held to `pilotfish.podmeta`, so the two guards cannot drift apart on a
key, the operator's name or the rule's words.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import gates, names, podmeta
from pilotfish.httpserver import BadRequest
from pilotfish.webhooks import podupdate, server
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from tests.test_chart_values import CHART, helm, needs_helm

OPERATOR = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_OPERATOR}"
TENANT = "tenant-a"
GATE = "gates.pilotfish.io/data"


def pod(labels: Mapping[str, str] | None = None, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "team-a",
            "labels": {"app": "web", names.LABEL_TEAM: "a", **(labels or {})},
            "annotations": {gates.ANNOTATION_RECORD: "{}", **annotations},
        },
        "spec": {"schedulingGates": [{"name": GATE}], "containers": [{"name": "c"}]},
    }


def update(
    old: dict[str, Any], new: dict[str, Any], user: str = TENANT, **extra: Any
) -> dict[str, Any]:
    return {
        "uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "UPDATE",
        "namespace": "team-a",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": new,
        "oldObject": old,
        **extra,
    }


def edited(change: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    old = pod()
    new = copy.deepcopy(old)
    change(new["metadata"])
    return old, new


# --- the keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "ours"),
    [
        (gates.ANNOTATION_RECORD, True),
        ("gates.pilotfish.io/released", True),
        (gates.LABEL_GATED, True),
        (names.LABEL_TEAM, True),
        (names.LABEL_BAND, True),
        (gates.LABEL_GANG, True),
        (names.ANNOTATION_EPOCH, True),
        ("pilotfish.io/workload", False),
        ("pilotfish.io/drain-requested-at", False),
        ("app", False),
        ("gates.pilotfish.io", False),
    ],
)
def test_which_keys_are_pilotfish_s(key: str, ours: bool) -> None:
    assert podmeta.is_pilotfish_key(key) is ours


def test_changes_name_each_key_and_how() -> None:
    old = {"labels": {names.LABEL_TEAM: "a", names.LABEL_BAND: "batch", "app": "x"}}
    new = {
        "labels": {names.LABEL_TEAM: "b", gates.LABEL_GANG: "solo", "app": "y"},
        "annotations": {"gates.pilotfish.io/released": "{}"},
    }
    assert [str(c) for c in podmeta.changes(old, new)] == [
        "label pilotfish.io/band removed",
        "label pilotfish.io/gang added",
        "label pilotfish.io/team changed",
        "annotation gates.pilotfish.io/released added",
    ]


# --- the webhook's review of UPDATEs -------------------------------------------------------


ATTACKS = [
    (
        lambda m: m["annotations"].update({gates.ANNOTATION_RECORD: '{"x": 1}'}),
        "annotation gates.pilotfish.io/record changed",
    ),
    (lambda m: m["labels"].update({gates.LABEL_GANG: "solo"}), "label pilotfish.io/gang added"),
    (lambda m: m["labels"].update({names.LABEL_TEAM: "b"}), "label pilotfish.io/team changed"),
    (lambda m: m["labels"].pop(names.LABEL_TEAM), "label pilotfish.io/team removed"),
    (
        lambda m: m["labels"].update({names.LABEL_BAND: "best-effort"}),
        "label pilotfish.io/band added",
    ),
    (
        lambda m: m["annotations"].update({"gates.pilotfish.io/released": "{}"}),
        "annotation gates.pilotfish.io/released added",
    ),
    (
        lambda m: m["annotations"].update({names.ANNOTATION_EPOCH: "7"}),
        "annotation pilotfish.io/epoch added",
    ),
    (lambda m: m.pop("annotations"), "annotation gates.pilotfish.io/record removed"),
]


@pytest.mark.parametrize(("change", "named"), ATTACKS)
def test_a_tenant_may_not_touch_pilotfish_keys(change: Any, named: str) -> None:
    d = podupdate.review(update(*edited(change)))
    assert not d.allowed and d.code == 403
    assert d.message == f"{named} by {TENANT}: {podmeta.RULE}"


@pytest.mark.parametrize(("change", "named"), ATTACKS)
def test_the_operator_may(change: Any, named: str) -> None:
    assert podupdate.review(update(*edited(change), user=OPERATOR)).allowed
    other = podupdate.Writers.of_namespace("elsewhere")
    assert not podupdate.review(update(*edited(change), user=OPERATOR), other).allowed


def test_everything_else_is_the_tenant_s() -> None:
    def own(m: dict[str, Any]) -> None:
        m["labels"]["app"] = "api"
        m["labels"]["pilotfish.io/workload"] = "w"
        m["annotations"]["example.com/note"] = "hi"
        m["labels"][names.LABEL_TEAM] = "a"  # the same value: no change

    assert podupdate.review(update(*edited(own))).allowed


@pytest.mark.parametrize(
    "request_",
    [
        update(
            *edited(lambda m: m["labels"].update({names.LABEL_TEAM: "b"})), subResource="status"
        ),
        {
            **update(*edited(lambda m: m["labels"].update({names.LABEL_TEAM: "b"}))),
            "operation": "CREATE",
        },
        {**update(pod(), pod()), "kind": {"group": "", "version": "v1", "kind": "Binding"}},
    ],
)
def test_only_updates_of_the_pod_itself_are_judged(request_: dict[str, Any]) -> None:
    assert podupdate.review(request_).allowed


def test_manual_release_may_be_recorded_only_with_a_gate_removal() -> None:
    old = pod()
    released = copy.deepcopy(old)
    released["spec"]["schedulingGates"] = []
    released["metadata"]["annotations"][gates.ANNOTATION_MANUAL_RELEASE] = '{"by": "on-call"}'
    assert podupdate.review(update(old, released, user="on-call")).allowed
    # The same annotation without the removal, or with anything else: refused.
    kept = copy.deepcopy(released)
    kept["spec"]["schedulingGates"] = old["spec"]["schedulingGates"]
    d = podupdate.review(update(old, kept, user="on-call"))
    assert not d.allowed and "annotation gates.pilotfish.io/manual-release added" in d.message
    both = copy.deepcopy(released)
    both["metadata"]["labels"][gates.LABEL_GANG] = "solo"
    d = podupdate.review(update(old, both, user="on-call"))
    assert not d.allowed and d.message.startswith("label pilotfish.io/gang added by on-call")


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({**update(pod(), pod()), "oldObject": None}, "request.oldObject"),
        ({**update(pod(), {"metadata": []})}, "request.object.metadata"),
        ({**update(pod(), {"metadata": {"labels": "x"}})}, "request.object.metadata.labels"),
        ({**update(pod(), {"spec": {"schedulingGates": [1]}})}, "schedulingGates"),
        ({**update(pod(), pod()), "userInfo": "x"}, "request.userInfo"),
    ],
)
def test_malformed_updates_are_bad_requests_naming_the_field(
    request_: dict[str, Any], field: str
) -> None:
    with pytest.raises(BadRequest, match=field.replace(".", r"\.")):
        podupdate.review(request_)


async def test_the_server_judges_updates_even_before_its_views_have_synced() -> None:
    class Unsynced:
        def snapshot(self) -> GateView | None:
            return None

    validate = server.bind_reviews(Unsynced())["/validate/pods"]
    attack = update(*edited(lambda m: m["labels"].update({gates.LABEL_GANG: "solo"})))
    d = validate(attack)
    got = d if isinstance(d, Decision) else await d
    assert not got.allowed and "label pilotfish.io/gang added" in got.message
    fine = validate(update(*edited(lambda m: m["labels"].update({"app": "x"}))))
    assert (fine if isinstance(fine, Decision) else await fine).allowed


# --- the chart -----------------------------------------------------------------------------


def render(template: str, *args: str) -> list[dict[str, Any]]:
    out = helm("template", "t", str(CHART), "-n", "pilotfish-system", "-s", template, *args).stdout
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


def variable(spec: Mapping[str, Any], name: str) -> str:
    return str(next(v["expression"] for v in spec["variables"] if v["name"] == name))


@needs_helm
@pytest.mark.parametrize("args", [(), ("--set-json", 'gates={"releaserGroups":[]}')])
def test_policy_guards_the_keys_of_podmeta(args: tuple[str, ...]) -> None:
    """The same keys, operator and words as `podmeta`, whoever the releasers are (they are
    pilotfish-gate-ownership's business)."""
    policy, binding = render("templates/pod-metadata-policy.yaml", *args)
    assert (policy["kind"], binding["kind"]) == (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    assert binding["spec"] == {
        "policyName": "pilotfish-pod-metadata",
        "validationActions": ["Deny"],
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    [skip] = spec["matchConditions"]
    assert skip["expression"] == f"request.userInfo.username != {json.dumps(OPERATOR)}"
    for name in ("labelChanges", "annotationChanges"):
        cel = variable(spec, name)
        assert cel.count(f"k.startsWith({json.dumps(podmeta.PREFIX)})") == 3
        assert cel.count(f"k in {json.dumps(list(podmeta.KEYS), separators=(',', ':'))}") == 3
    assert json.dumps(podmeta.MANUAL_RELEASE) in variable(spec, "annotationChanges")
    assert json.dumps(podmeta.MANUAL_RELEASE) not in variable(spec, "labelChanges")
    assert "groups" not in variable(spec, "manualRelease")
    [validation] = spec["validations"]
    assert validation["message"] == podmeta.RULE
    assert json.dumps(podmeta.RULE) in validation["messageExpression"]


@needs_helm
def test_the_validating_webhook_sees_updates_but_never_the_operator_s() -> None:
    [_, validating] = [
        d for d in render("templates/webhook-configurations.yaml") if "webhooks" in d
    ]
    hooks = {h["name"]: h for h in validating["webhooks"]}
    creates, updates = (
        hooks["pods.validate.pilotfish.io"],
        hooks["pod-updates.validate.pilotfish.io"],
    )
    assert creates["rules"][0]["operations"] == ["CREATE"]
    assert "matchConditions" not in creates  # CEL would convert every created pod
    assert updates["rules"][0]["operations"] == ["UPDATE"]
    assert updates["clientConfig"] == creates["clientConfig"]
    for hook in (creates, updates):
        assert hook["rules"][0]["resources"] == ["pods"]  # not pods/status
    [cond] = updates["matchConditions"]
    assert cond["expression"].startswith(f"request.userInfo.username != {json.dumps(OPERATOR)}")
    assert "object.metadata.labels" in cond["expression"]
    assert "object.metadata.annotations" in cond["expression"]


def test_a_denial_names_at_most_a_readable_number_of_keys() -> None:
    def many(m: dict[str, Any]) -> None:
        m["labels"].update({f"gates.pilotfish.io/k{i:03}": "x" for i in range(500)})

    d = podupdate.review(update(*edited(many)))
    assert not d.allowed
    assert d.message.startswith("label gates.pilotfish.io/k000 added, ")
    assert f" and {500 - podupdate.MAX_NAMED} more by {TENANT}: " in d.message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


def maybe(**fields: Any) -> Any:
    """An object with any of `fields`, or any JSON value at all in its place."""
    return JSON | st.fixed_dictionaries({}, optional=fields)


KEYED = st.dictionaries(st.sampled_from([*podmeta.KEYS, gates.ANNOTATION_RECORD, "app"]), JSON)
GATES = JSON | st.lists(maybe(name=JSON | st.just(GATE)), max_size=2)
OBJ = maybe(
    metadata=maybe(labels=JSON | KEYED, annotations=JSON | KEYED), spec=maybe(schedulingGates=GATES)
)


@settings(max_examples=400, deadline=None)
@given(
    obj=OBJ,
    old=OBJ,
    user_info=JSON | st.fixed_dictionaries({}, optional={"username": JSON}),
    kind=JSON,
)
def test_any_update_gets_a_decision_or_a_bad_request(
    obj: Any, old: Any, user_info: Any, kind: Any
) -> None:
    request = {"uid": "u", "operation": "UPDATE", "kind": kind, "userInfo": user_info}
    request |= {"object": obj, "oldObject": old}
    try:
        assert isinstance(podupdate.review(request), Decision)
    except BadRequest as e:
        assert "request." in str(e)
