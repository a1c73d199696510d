"""The chart's fencing policy (templates/fencing-policy.yaml) against `pilotfish.fencing`: the
same rule, words, label, annotation and epoch pattern; ConfigMaps and Leases, plus the values'
own resources. What the API server makes of it is e2e/test_fencing.py's.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from pilotfish import fencing
from tests.test_chart_values import CHART, helm, needs_helm


def render(*args: str) -> list[dict[str, Any]]:
    out = helm("template", "t", str(CHART), "-s", "templates/fencing-policy.yaml", *args).stdout
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


def test_the_policy_says_the_library_s_rule_and_pattern() -> None:
    text = (CHART / "templates" / "fencing-policy.yaml").read_text()
    assert json.dumps(fencing.RULE) in text.replace("{{- $rule := ", "").replace(" }}", "")
    assert f'$pattern := "{fencing.EPOCH_PATTERN}"' in text
    assert f'$label := "{fencing.LABEL_FENCED}"' in text
    assert f'$key := "{fencing.ANNOTATION_EPOCH}"' in text
    assert fencing.POLICY == "pilotfish-fencing"


@needs_helm
def test_the_policy_renders() -> None:
    policy, binding = render()
    assert (policy["kind"], binding["kind"]) == (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == fencing.POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    match = spec["matchConstraints"]
    assert match["objectSelector"] == {"matchLabels": {fencing.LABEL_FENCED: "true"}}
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in match["resourceRules"]] == [
        ([""], ["configmaps"], ["CREATE", "UPDATE"]),
        (["coordination.k8s.io"], ["leases"], ["CREATE", "UPDATE"]),
    ]
    field = "metadata.annotations[pilotfish.io/epoch]"
    checks = spec["validations"]
    assert len(checks) == 4 and {c["reason"] for c in checks} == {"Forbidden"}
    for check in checks:
        assert check["message"].endswith(fencing.RULE)
        if "messageExpression" in check:
            assert json.dumps(fencing.RULE) in check["messageExpression"]
    said = " ".join(c.get("messageExpression", c["message"]) for c in checks)
    for words in ("cannot be ", f"{field} is missing", "is not an integer", "is lower than"):
        assert words in said


@needs_helm
def test_a_user_adds_their_own_resources() -> None:
    extra = '{"resources":[{"apiGroup":"example.com","resource":"shardmaps"}]}'
    policy, _ = render("--set-json", f"fencing={extra}")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[-1] == {
        "apiGroups": ["example.com"],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["shardmaps"],
    }
