"""The Helm chart's values, schema and RBAC, checked without a cluster.

Pure Python: values.yaml against values.schema.json (with `jsonschema` when installed,
otherwise a small draft-07 subset validator below), and the RBAC rules read from the raw
template text. If a helm binary is around (PATH or the devcluster cache), the chart is also
linted and rendered.
"""

from __future__ import annotations

import copy
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pilotfish import names

CHART = Path(__file__).resolve().parent.parent / "charts" / "pilotfish"
TEMPLATES = CHART / "templates"
RBAC_KINDS = {"ClusterRole", "Role"}
RULE_KEYS = ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs")


def load_values() -> dict[str, Any]:
    data = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def load_schema() -> dict[str, Any]:
    data = json.loads((CHART / "values.schema.json").read_text())
    assert isinstance(data, dict)
    return data


# --- a small draft-07 subset validator, used only when jsonschema is not installed ---------

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "null": lambda v: v is None,
}
_KNOWN = {
    "$schema",
    "$ref",
    "title",
    "description",
    "definitions",
    "type",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
}


def _mini_errors(
    value: Any, schema: dict[str, Any], root: dict[str, Any], path: str
) -> Iterator[str]:
    unknown = set(schema) - _KNOWN
    assert not unknown, f"mini validator does not know {unknown}; install jsonschema or extend it"
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/definitions/"), ref
        yield from _mini_errors(value, root["definitions"][ref.split("/")[-1]], root, path)
        return
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            yield f"{path}: {value!r} is not of type {types}"
            return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: {value!r} is not one of {schema['enum']}"
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{path}: {value!r} is less than the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{path}: {value!r} is greater than the maximum {schema['maximum']}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            yield f"{path}: {value!r} is too short"
        if len(value) > schema.get("maxLength", len(value)):
            yield f"{path}: {value!r} is too long"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{path}: {value!r} does not match {schema['pattern']}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _mini_errors(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                yield f"{path}: {key!r} is a required property"
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                yield from _mini_errors(item, props[key], root, f"{path}.{key}")
            elif extra is False:
                yield f"{path}: additional property {key!r} is not allowed"
            elif isinstance(extra, dict):
                yield from _mini_errors(item, extra, root, f"{path}.{key}")


def schema_errors(values: Any, schema: dict[str, Any]) -> list[str]:
    """All validation errors of `values`; jsonschema's when installed, else the mini one."""
    try:
        jsonschema = importlib.import_module("jsonschema")
    except ImportError:
        return list(_mini_errors(values, schema, schema, "$"))
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)
    ]


def with_overrides(**dotted: Any) -> dict[str, Any]:
    """The default values with `a__b=value` overrides (like helm --set a.b=value)."""
    values = copy.deepcopy(load_values())
    for key, value in dotted.items():
        *parents, leaf = key.split("__")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


# --- values and schema ---------------------------------------------------------------------


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "pilotfish"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"
    assert chart["kubeVersion"] == ">=1.30.0-0"


def test_schema_is_draft7_and_closed_at_top_level() -> None:
    schema = load_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    assert set(load_values()) <= set(schema["properties"])


def test_default_values_validate() -> None:
    assert schema_errors(load_values(), load_schema()) == []


def test_default_values_are_the_documented_ones() -> None:
    values = load_values()
    assert values["local"] == {
        "enabled": False,
        "host": "127.0.0.1",
        "webhookPort": 16301,
        "extenderPort": 16300,
        "caBundle": "",
    }
    assert values["image"]["repository"] == "ghcr.io/pilotfish/pilotfish"
    assert values["image"]["tag"] == ""  # the template falls back to .Chart.AppVersion
    assert [values[c]["replicas"] for c in ("operator", "extender", "webhooks", "scheduler")] == [
        2,
        2,
        2,
        1,
    ]
    assert values["extender"]["weight"] == 5
    assert values["extender"]["ignorable"] is True
    assert values["scheduler"]["image"]["repository"] == "registry.k8s.io/kube-scheduler"
    assert values["scheduler"]["image"]["tag"] == "v1.36.3"
    assert values["metrics"]["serviceMonitor"]["enabled"] is False


def test_local_mode_values_validate() -> None:
    values = with_overrides(local__enabled=True, local__caBundle="Zm9v")
    assert schema_errors(values, load_schema()) == []


@pytest.mark.parametrize("port", [0, -1, 65536, 70000, "16301", 16301.5, True, None])
def test_local_mode_with_a_bad_webhook_port_is_rejected(port: Any) -> None:
    values = with_overrides(local__enabled=True, local__caBundle="Zm9v", local__webhookPort=port)
    errors = schema_errors(values, load_schema())
    assert errors
    assert any("webhookPort" in e for e in errors), errors


@pytest.mark.parametrize("port", [0, 65536, "16300"])
def test_bad_extender_port_is_rejected(port: Any) -> None:
    assert schema_errors(with_overrides(local__extenderPort=port), load_schema())


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"extender__weight": 0}, "weight"),
        ({"extender__weight": 101}, "weight"),
        ({"extender__weight": "5"}, "weight"),
        ({"extender__ignorable": "true"}, "ignorable"),
        ({"extender__ignorable": 1}, "ignorable"),
        ({"local__enabled": "yes"}, "enabled"),
        ({"operator__replicas": -1}, "replicas"),
        ({"webhooks__replicas": "2"}, "replicas"),
        ({"image__pullPolicy": "Sometimes"}, "pullPolicy"),
        ({"metrics__serviceMonitor__enabled": "false"}, "enabled"),
        ({"local__caBundle": "not base64!"}, "caBundle"),
    ],
)
def test_wrong_types_and_ranges_are_rejected(overrides: dict[str, Any], field: str) -> None:
    errors = schema_errors(with_overrides(**overrides), load_schema())
    assert errors
    assert any(field in e for e in errors), errors


def test_unknown_keys_are_rejected() -> None:
    schema = load_schema()
    assert schema_errors(with_overrides(replicaCount=3), schema)
    assert schema_errors(with_overrides(local__webhookport=16301), schema)
    assert schema_errors(with_overrides(extender__weigth=5), schema)


def test_mini_validator_agrees_on_the_cases_above() -> None:
    """The fallback must be exercised even where jsonschema exists."""
    schema = load_schema()
    assert list(_mini_errors(load_values(), schema, schema, "$")) == []
    bad = with_overrides(local__enabled=True, local__webhookPort=70000, extender__ignorable="x")
    errors = list(_mini_errors(bad, schema, schema, "$"))
    assert any("webhookPort" in e for e in errors)
    assert any("ignorable" in e for e in errors)
    assert list(_mini_errors(with_overrides(surprise=1), schema, schema, "$"))


# --- RBAC, from the raw template text --------------------------------------------------------


def _flow_items(text: str) -> list[str]:
    inner = text.strip()
    assert inner.startswith("[") and inner.endswith("]"), inner
    return [i.strip().strip("'\"") for i in inner[1:-1].split(",") if i.strip()]


def rbac_rule_fields(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, key, items) of every apiGroups/resources/verbs/... list in `text`."""
    lines = text.splitlines()
    key_re = re.compile(r"^(\s*)(?:-\s+)?(" + "|".join(RULE_KEYS) + r")\s*:\s*(.*?)\s*(#.*)?$")
    for n, line in enumerate(lines):
        m = key_re.match(line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        if rest:
            yield n + 1, key, _flow_items(rest)
            continue
        items = []
        for follow in lines[n + 1 :]:
            item = re.match(r"^(\s*)-\s+(.*?)\s*$", follow)
            if not item or len(item.group(1)) < indent:
                break
            items.append(item.group(2).strip("'\""))
        yield n + 1, key, items


def template_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(TEMPLATES.glob("*")) if p.is_file()}


def test_no_rbac_rule_uses_a_wildcard() -> None:
    found = 0
    for name, text in template_texts().items():
        if "rules:" not in text:  # RBAC (and admission) rules only, not container resources
            continue
        if name == "flowcontrol.yaml":  # FlowSchema rules classify requests, grant nothing
            continue
        for line, key, items in rbac_rule_fields(text):
            found += 1
            assert items, f"{name}:{line}: empty {key}"
            for item in items:
                assert "*" not in item, f"{name}:{line}: {key} names {item!r} (least privilege)"
    # Sanity: the scan really saw the rules (operator alone has 17).
    assert found > 60


def _strip_template(text: str) -> str:
    """Raw template -> YAML: drop comments and directive-only lines, stub inline actions."""
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", text, flags=re.DOTALL)
    kept = [line for line in text.splitlines() if not re.fullmatch(r"\s*\{\{.*\}\}\s*", line)]
    return re.sub(r"\{\{.*?\}\}", "TEMPLATED", "\n".join(kept))


def rbac_rules(filename: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(kind, namespace) of each Role/ClusterRole in one template file -> its rules."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(_strip_template((TEMPLATES / filename).read_text())):
        if isinstance(doc, dict) and doc.get("kind") in RBAC_KINDS:
            meta = doc["metadata"]
            out[(doc["kind"], f"{meta.get('namespace', '')}/{meta['name']}")] = doc["rules"]
    return out


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_operator_rbac_is_least_privilege() -> None:
    roles = rbac_rules("rbac-operator.yaml")
    cluster = grants(roles[("ClusterRole", "/TEMPLATED")])
    groups = {g for g, _, _ in cluster}
    resources = {r for _, r, _ in cluster}
    assert "secrets" not in resources
    assert ("", "nodes", "delete") not in cluster
    assert not groups & {"rbac.authorization.k8s.io", "admissionregistration.k8s.io"}
    for kind in ("serviceworkloads", "batchworkloads", "teamquotas"):
        assert ("pilotfish.io", kind, "patch") in cluster
        assert ("pilotfish.io", f"{kind}/status", "update") in cluster
        assert ("pilotfish.io", f"{kind}/finalizers", "update") in cluster
    # GatePolicy: read, and the conditional status patch; never the tenant's spec.
    policy = {(r, v) for g, r, v in cluster if g == "pilotfish.io" and r.startswith("gatepol")}
    assert policy == {("gatepolicies", v) for v in ("get", "list", "watch")} | {
        ("gatepolicies/status", "patch")
    }
    # NodeMaintenance: kopf's watch, its finalizer and annotations (patch), the status
    # patch; never an update of the object, never a delete.
    maintenance = {(r, v) for g, r, v in cluster if g == "pilotfish.io" and r.startswith("nodemai")}
    assert maintenance == {("nodemaintenances", v) for v in ("get", "list", "watch", "patch")} | {
        ("nodemaintenances/status", "patch"),
        ("nodemaintenances/finalizers", "update"),
    }
    assert ("", "nodes", "patch") in cluster
    assert ("policy", "poddisruptionbudgets", "watch") in cluster
    assert ("", "events", "create") not in cluster, "Events are events.k8s.io/v1 only"
    assert "customresourcedefinitions" not in resources
    assert ("", "pods/eviction", "create") in cluster
    assert ("discovery.k8s.io", "endpointslices", "delete") in cluster
    # Leases: none in the main role; its own in the release namespace, read-only in
    # kube-node-lease, and the at-most-one identity Leases (tenant namespaces) through a
    # ClusterRole of their own that grants nothing else.
    assert "leases" not in resources
    node_leases = grants(roles[("Role", "kube-node-lease/TEMPLATED-node-leases")])
    assert {v for _, _, v in node_leases} == {"get", "list", "watch"}
    identity = grants(roles[("ClusterRole", "/TEMPLATED-identity-leases")])
    assert {(g, r) for g, r, _ in identity} == {("coordination.k8s.io", "leases")}
    assert ("", "nodes/status", "patch") in cluster and ("", "pods/status", "patch") in cluster


def test_extender_rbac_is_read_nodes_and_pods_plus_events() -> None:
    (rules,) = rbac_rules("rbac-extender.yaml").values()
    assert grants(rules) == {
        (g, r, v) for g, r in (("", "nodes"), ("", "pods")) for v in ("get", "list", "watch")
    } | {(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")}


def test_webhooks_rbac_writes_only_teamquota_status_events_and_dry_run_pods() -> None:
    (rules,) = rbac_rules("rbac-webhooks.yaml").values()
    writes = {(g, r) for g, r, v in grants(rules) if v not in {"get", "list", "watch"}}
    assert writes == {
        ("pilotfish.io", "teamquotas/status"),
        ("", "events"),
        ("events.k8s.io", "events"),
        ("", "pods"),  # create, dry runs only (webhooks-dryrun-policy.yaml)
    }
    policy = (TEMPLATES / "webhooks-dryrun-policy.yaml").read_text()
    assert "request.dryRun == true" in policy and "pilotfish.webhooks.name" in policy
    # Bound where the pod webhooks do not look; where they do, the webhook refuses itself.
    binding = policy.split("kind: ValidatingAdmissionPolicyBinding")[1]
    label, disabled = names.LABEL_WEBHOOKS, names.WEBHOOKS_DISABLED
    assert f"namespaceSelector:\n      matchLabels:\n        {label}: {disabled}" in binding
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert f"- key: {label}\n    operator: NotIn\n    values: [{disabled}]" in helpers


def test_scheduler_lease_role_is_limited_to_its_own_lease() -> None:
    (rules,) = rbac_rules("rbac-scheduler.yaml").values()
    for rule in rules:
        assert rule["resources"] == ["leases"]
        assert set(rule["verbs"]) <= {"get", "create", "update"}
        if set(rule["verbs"]) != {"create"}:
            assert rule["resourceNames"] == ["TEMPLATED"]  # pilotfish.schedulerName
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    assert f'define "pilotfish.schedulerName" -}}}}{names.SCHEDULER_NAME}{{{{' in helpers


def test_chart_uses_the_well_known_names() -> None:
    text = "\n".join(template_texts().values())
    for account in (names.SA_OPERATOR, names.SA_EXTENDER, names.SA_WEBHOOKS, names.SA_SCHEDULER):
        assert account in text
    for component in names.COMPONENT_ACCOUNTS:
        assert f'"{component}"' in (TEMPLATES / "serviceaccounts.yaml").read_text()
    priority = (TEMPLATES / "priorityclasses.yaml").read_text()
    for band, pclass in names.PRIORITY_CLASS.items():
        assert f"name: {pclass}" in priority
        assert f"pilotfish.io/band={band}" in priority


# --- helm, when a binary exists ---------------------------------------------------------------


def find_helm() -> str | None:
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    cache = os.environ.get("PILOTFISH_CACHE", str(Path.home() / ".cache" / "pilotfish"))
    found = sorted(glob.glob(os.path.join(cache, "*", "bin", "helm")))
    return found[-1] if found else None


HELM = find_helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary (PATH or devcluster cache)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/pilotfish-helm/cache"}
    env |= {"HELM_CONFIG_HOME": "/tmp/pilotfish-helm/config"}
    env |= {"HELM_DATA_HOME": "/tmp/pilotfish-helm/data"}
    result = subprocess.run(
        [HELM, *args], capture_output=True, text=True, env=env, check=False, timeout=120
    )
    if check:
        assert result.returncode == 0, result.stderr + result.stdout
    return result


def render(*sets: str) -> list[dict[str, Any]]:
    args = ["template", "t", str(CHART), "-n", names.SYSTEM_NAMESPACE]
    for s in sets:
        args += ["--set", s]
    docs = yaml.safe_load_all(helm(*args).stdout)
    return [d for d in docs if isinstance(d, dict)]


def kinds_and_names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


@needs_helm
def test_helm_lint() -> None:
    helm("lint", str(CHART))
    helm("lint", str(CHART), "--set", "local.enabled=true", "--set", "local.caBundle=Zm9v")


@needs_helm
def test_helm_template_default() -> None:
    docs = render()
    objects = kinds_and_names(docs)
    for deployment in ("pilotfish-operator", "pilotfish-extender", "pilotfish-webhooks"):
        assert ("Deployment", deployment) in objects
    assert ("Deployment", names.SCHEDULER_NAME) in objects
    assert ("Secret", "pilotfish-webhooks-tls") in objects
    for pclass in names.PRIORITY_CLASS.values():
        assert ("PriorityClass", pclass) in objects
    (mutating,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert mutating["webhooks"][0]["clientConfig"]["service"]["name"] == "pilotfish-webhooks"
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    scheduler = yaml.safe_load(config["data"]["config.yaml"])
    extender, gpus = scheduler["extenders"]
    assert extender["urlPrefix"] == "https://pilotfish-extender.pilotfish-system.svc:443"
    assert extender["tlsConfig"]["certFile"] == "/etc/pilotfish-scheduler-tls/tls.crt"
    assert gpus["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]
    assert extender["weight"] == 5
    assert extender["ignorable"] is True


@needs_helm
def test_helm_template_local_mode() -> None:
    docs = render("local.enabled=true", "local.caBundle=Zm9v")
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Deployment", "Service", "Secret", "PodDisruptionBudget"}
    for d in docs:
        if d["kind"].endswith("WebhookConfiguration"):
            for hook in d["webhooks"]:
                assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:16301/")
                assert hook["clientConfig"]["caBundle"] == "Zm9v"


@needs_helm
def test_helm_local_mode_requires_a_ca_bundle_and_a_valid_port() -> None:
    base = ("template", "t", str(CHART), "-n", names.SYSTEM_NAMESPACE)
    args = (*base, "--set", "local.enabled=true")
    missing = helm(*args, check=False)
    assert missing.returncode != 0
    assert "local.caBundle" in missing.stderr
    bad_port = helm(
        *args, "--set", "local.caBundle=Zm9v", "--set", "local.webhookPort=70000", check=False
    )
    assert bad_port.returncode != 0
    assert "webhookPort" in bad_port.stderr


# --- least privilege at run time: listeners, system namespaces --------------------------------

# Built-in kinds whose objects make pods; a Pilotfish account may make none in system namespaces.
POD_MAKERS = {
    ("", "pods"),
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
}


@needs_helm
def test_every_listener_binds_to_the_pod_ip() -> None:
    containers = [
        c
        for d in render()
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert {c["name"] for c in containers} == {"operator", "extender", "webhooks", "kube-scheduler"}
    flags = {"operator": "--metrics-host", "kube-scheduler": "--bind-address"}
    for c in containers:
        env = {e["name"]: e for e in c.get("env") or []}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, c["name"]
        assert f"{flags.get(c['name'], '--host')}=$(POD_IP)" in c["args"], (c["name"], c["args"])
        assert not any("0.0.0.0" in str(a) for a in c["args"]), c["name"]


def _policy(docs: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name
    ]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == name
    ]
    return policy, binding


@needs_helm
@pytest.mark.parametrize("local", [False, True])
def test_pilotfish_accounts_may_not_make_pods_in_system_namespaces(local: bool) -> None:
    docs = render(*(("local.enabled=true", "local.caBundle=Zm9v") if local else ()))
    policy, binding = _policy(docs, "pilotfish-system-namespaces")
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (selector,) = spec["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert (selector["key"], selector["operator"]) == ("kubernetes.io/metadata.name", "In")
    assert set(selector["values"]) == {
        "kube-system",
        "kube-public",
        "kube-node-lease",
        names.SYSTEM_NAMESPACE,
    }
    (who,) = spec["matchConditions"]
    for sa in (*names.COMPONENT_ACCOUNTS.values(), names.SA_SCHEDULER):
        assert f'"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{sa}"' in who["expression"]
    covered = {
        (group, resource)
        for rule in spec["matchConstraints"]["resourceRules"]
        if {"CREATE", "UPDATE"} <= set(rule["operations"])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert POD_MAKERS | {("", "pods/ephemeralcontainers")} <= covered
    # Whatever pod-making write RBAC grants any Pilotfish account is refused there.
    for filename in ("rbac-operator.yaml", "rbac-extender.yaml", "rbac-webhooks.yaml"):
        for rules in rbac_rules(filename).values():
            for group, resource, verb in grants(rules):
                if verb in {"create", "update", "patch"} and (group, resource) in POD_MAKERS:
                    assert (group, resource) in covered, (filename, group, resource)
    (check,) = spec["validations"]
    assert check["reason"] == "Forbidden"
    for part in ("request.userInfo.username", "request.namespace", "request.operation"):
        assert part in check["messageExpression"]
    assert "may not create or change pods" in check["message"]


@needs_helm
def test_tenants_edit_their_workloads_through_the_built_in_roles_but_never_quotas() -> None:
    """`edit`/`admin` gain Pilotfish's namespaced kinds by aggregation, `view` reads them;
    neither touches TeamQuotas (the platform's) or any status a controller writes."""
    roles = {
        d["metadata"]["name"]: d
        for d in render()
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith("pilotfish-tenant-")
    }
    edit, view = roles["pilotfish-tenant-edit"], roles["pilotfish-tenant-view"]
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    edits = grants(edit["rules"])
    assert ("pilotfish.io", "serviceworkloads", "create") in edits
    assert ("pilotfish.io", "serviceworkloads/scale", "patch") in edits
    for group, resource, verb in edits | grants(view["rules"]):
        assert group == "pilotfish.io"
        assert not resource.startswith("teamquotas"), (resource, verb)
        assert not (resource.endswith("/status") and verb not in ("get", "list", "watch"))
