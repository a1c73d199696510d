"""Valid Pilotfish objects for tests, and the API server's schema semantics to judge them by.

`schema_errors` and `apply_defaults` re-implement, for the subset of OpenAPI the generated
CRDs use, what the API server does with a structural schema: validate types and value
constraints, and fill in defaults. That lets unit tests check, without a cluster, that the
pydantic models and the CRD YAML accept the same objects and default them the same way.
CEL rules are not evaluated here; their Python twins are tested through the models.
"""

import copy
import re
from datetime import datetime
from typing import Any

from hypothesis import strategies as st

from pilotfish.api.base import QUANTITY_PATTERN
from pilotfish.names import API_VERSION

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def schema_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """What the API server's schema validation would reject in value (CEL aside).

    Fields the schema does not describe are reported too: the API server would silently
    prune them, which for an object Python built means the model and the CRD disagree.
    """
    errors: list[str] = []
    _validate(schema, value, path or "<root>", errors, root=True)
    return errors


def go_regex(pattern: str) -> str:
    """pattern as Python must spell it to match like Go's RE2 (the API server's engine).

    Go's `$` matches only at the very end; Python's also matches before a final newline.
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + r"\Z"
    return pattern


def _type_ok(expected: str, value: Any) -> bool:
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    raise AssertionError(f"unknown type {expected}")


def _validate(
    node: dict[str, Any], value: Any, path: str, errors: list[str], *, root: bool = False
) -> None:
    if node.get("x-kubernetes-int-or-string"):
        if not (_type_ok("integer", value) or isinstance(value, str)):
            errors.append(f"{path}: must be an integer or a string")
            return
    elif "type" in node and not _type_ok(node["type"], value):
        errors.append(f"{path}: must be of type {node['type']}")
        return
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{path}: {value!r} not in {node['enum']}")
    if _type_ok("number", value):
        if "minimum" in node:
            low = node["minimum"]
            if value < low or (node.get("exclusiveMinimum") and value == low):
                errors.append(f"{path}: {value} below minimum {low}")
        if "maximum" in node:
            high = node["maximum"]
            if value > high or (node.get("exclusiveMaximum") and value == high):
                errors.append(f"{path}: {value} above maximum {high}")
    if isinstance(value, str):
        if "pattern" in node and not re.search(go_regex(node["pattern"]), value):
            errors.append(f"{path}: {value!r} does not match {node['pattern']}")
        if len(value) > node.get("maxLength", len(value)):
            errors.append(f"{path}: longer than {node['maxLength']}")
        if len(value) < node.get("minLength", 0):
            errors.append(f"{path}: shorter than {node['minLength']}")
        if node.get("format") == "date-time" and not _RFC3339.match(value):
            errors.append(f"{path}: {value!r} is not RFC 3339")
    if isinstance(value, list):
        _validate_list(node, value, path, errors)
    if isinstance(value, dict):
        _validate_object(node, value, path, errors, root=root)


def _validate_list(node: dict[str, Any], value: list[Any], path: str, errors: list[str]) -> None:
    if len(value) > node.get("maxItems", len(value)):
        errors.append(f"{path}: more than {node['maxItems']} items")
    if len(value) < node.get("minItems", 0):
        errors.append(f"{path}: fewer than {node['minItems']} items")
    list_type = node.get("x-kubernetes-list-type")
    if list_type == "set" and len({repr(v) for v in value}) != len(value):
        errors.append(f"{path}: duplicate values in a set")
    if list_type == "map":
        keys = node["x-kubernetes-list-map-keys"]
        seen = [tuple(repr(item.get(k)) for k in keys) for item in value if isinstance(item, dict)]
        if len(set(seen)) != len(seen):
            errors.append(f"{path}: duplicate keys in a list map")
    for i, item in enumerate(value):
        _validate(node["items"], item, f"{path}[{i}]", errors)


def _validate_object(
    node: dict[str, Any], value: dict[str, Any], path: str, errors: list[str], *, root: bool
) -> None:
    if len(value) > node.get("maxProperties", len(value)):
        errors.append(f"{path}: more than {node['maxProperties']} properties")
    for name in node.get("required", []):
        if name not in value:
            errors.append(f"{path}.{name}: required")
    props: dict[str, Any] = node.get("properties", {})
    extra = node.get("additionalProperties")
    for name, sub in value.items():
        sub_path = f"{path}.{name}"
        if root and name == "metadata":
            continue  # the API server's own ObjectMeta schema applies
        if name in props:
            _validate(props[name], sub, sub_path, errors)
        elif isinstance(extra, dict):
            _validate(extra, sub, sub_path, errors)
        elif not node.get("x-kubernetes-preserve-unknown-fields"):
            errors.append(f"{sub_path}: unknown field (the API server would prune it)")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """value with the schema's defaults filled in, as the API server does on every request.

    Defaults apply to absent fields of present objects, and a default is itself defaulted
    (so `default: {}` brings in the nested fields' defaults).
    """
    value = copy.deepcopy(value)
    _default(schema, value)
    return value


def _default(node: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        props: dict[str, Any] = node.get("properties", {})
        for name, sub in props.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default(sub, value[name])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for name, sub_value in value.items():
                if name not in props:
                    _default(extra, sub_value)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value:
            _default(node["items"], item)


# --- valid objects ---------------------------------------------------------------------

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "web"}},
    "spec": {"containers": [{"name": "app", "image": "registry.example/web:1"}]},
}


def obj(
    kind: str, spec: dict[str, Any], *, namespaced: bool = True, **extra: Any
) -> dict[str, Any]:
    """A whole object as it would be sent to the API server."""
    metadata: dict[str, Any] = {"name": "example"}
    if namespaced:
        metadata["namespace"] = "team-a"
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec, **extra}


def service_workload_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"team": "payments", "template": copy.deepcopy(TEMPLATE)}
    spec.update(overrides)
    return spec


def batch_workload_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "team": "payments",
        "completions": 10,
        "template": copy.deepcopy(TEMPLATE),
    }
    spec.update(overrides)
    return spec


def gate(name: str = "gates.pilotfish.io/data-ready", **overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "condition": {"type": "GateSignal", "signalName": "data-ready"},
        "timeoutSeconds": 600,
    }
    out.update(overrides)
    return out


def gate_policy_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "web"}}, "gates": [gate()]}
    spec.update(overrides)
    return spec


def team_quota_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "team": "payments",
        "bands": {"production": {"cpu": "100", "memory": "400Gi", "pods": 200}},
    }
    spec.update(overrides)
    return spec


def node_maintenance_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodes": ["node-a", "node-b"]}
    spec.update(overrides)
    return spec


# --- hypothesis strategies of valid wire objects -----------------------------------------

dns_labels = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z")
bands = st.sampled_from(["production", "batch", "best-effort"])
quantities = st.one_of(
    st.integers(min_value=0, max_value=10**12),
    st.from_regex(QUANTITY_PATTERN, fullmatch=True).filter(lambda s: len(s) < 40),
)
percents = st.integers(min_value=0, max_value=100).map(lambda n: f"{n}%")
int_or_percent = st.one_of(st.integers(min_value=0, max_value=20), percents)
timestamps = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
    lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ")
)
labels = st.dictionaries(dns_labels, dns_labels, max_size=3)
templates = labels.map(lambda ls: {"metadata": {"labels": ls}, "spec": TEMPLATE["spec"]})


def is_zero(v: int | str) -> bool:
    return v == 0 or (isinstance(v, str) and int(v[:-1]) == 0)


rollout_strategies = st.fixed_dictionaries(
    {},
    optional={
        "maxSurge": int_or_percent,
        "maxUnavailable": int_or_percent,
        "progressDeadlineSeconds": st.integers(min_value=1, max_value=10**6),
        "minReadySeconds": st.integers(min_value=0, max_value=3600),
        "paused": st.booleans(),
        "revisionHistoryLimit": st.integers(min_value=0, max_value=100),
    },
).filter(lambda s: not (is_zero(s.get("maxSurge", 1)) and is_zero(s.get("maxUnavailable", 0))))

conditions = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["Available", "Progressing", "Stalled", "Complete"]),
            "status": st.sampled_from(["True", "False", "Unknown"]),
            "reason": st.from_regex(r"\A[A-Z][A-Za-z]{0,15}\Z"),
            "lastTransitionTime": timestamps,
        },
        optional={"message": st.text(max_size=20), "observedGeneration": st.integers(0, 100)},
    ),
    max_size=3,
    unique_by=lambda c: c["type"],
)


def _replicas_allowed(spec: dict[str, object]) -> bool:
    """The CRD's rule: an at-most-one workload has replicas 0 or 1."""
    replicas = spec.get("replicas", 1)
    return not (spec.get("atMostOne") and isinstance(replicas, int) and replicas > 1)


service_workload_specs = st.fixed_dictionaries(
    {"team": dns_labels, "template": templates},
    optional={
        "replicas": st.integers(min_value=0, max_value=1000),
        "band": bands,
        "atMostOne": st.booleans(),
        "strategy": rollout_strategies,
        "placement": st.fixed_dictionaries(
            {},
            optional={
                "zones": st.lists(dns_labels, min_size=1, max_size=3, unique=True),
                "nodeSelector": labels,
                "gpus": st.integers(min_value=0, max_value=8),
                "spread": st.sampled_from(["zone", "node"]),
            },
        ),
        "service": st.fixed_dictionaries(
            {
                "ports": st.lists(
                    st.fixed_dictionaries(
                        {"name": dns_labels, "port": st.integers(1, 65535)},
                        optional={
                            "targetPort": st.one_of(st.integers(1, 65535), dns_labels),
                            "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
                        },
                    ),
                    min_size=1,
                    max_size=3,
                    unique_by=lambda p: p["name"],
                )
            }
        ),
    },
).filter(_replicas_allowed)

service_workload_statuses = st.fixed_dictionaries(
    {},
    optional={
        "replicas": st.integers(0, 100),
        "readyReplicas": st.integers(0, 100),
        "availableReplicas": st.integers(0, 100),
        "updatedReplicas": st.integers(0, 100),
        "observedGeneration": st.integers(0, 100),
        "currentRevision": dns_labels,
        "updateRevision": dns_labels,
        "selector": st.just("app=web"),
        "conditions": conditions,
    },
)


@st.composite
def batch_workload_specs(draw: st.DrawFn) -> dict[str, Any]:
    completions = draw(st.integers(min_value=1, max_value=1000))
    parallelism = draw(st.integers(min_value=1, max_value=100))
    spec: dict[str, Any] = {
        "team": draw(dns_labels),
        "template": draw(templates),
        "completions": completions,
    }
    if draw(st.booleans()) or parallelism != 1:
        spec["parallelism"] = parallelism
    if draw(st.booleans()):
        spec["gang"] = draw(st.integers(min_value=1, max_value=min(completions, parallelism)))
    optional = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "band": bands,
                "backoffLimit": st.integers(min_value=0, max_value=100),
                "creationRate": st.one_of(
                    st.integers(min_value=1, max_value=1000),
                    st.floats(min_value=0.001, max_value=1000.0),
                ),
            },
        )
    )
    spec.update(optional)
    return spec


gate_conditions = st.one_of(
    st.fixed_dictionaries({"type": st.just("GateSignal"), "signalName": dns_labels}),
    st.just({"type": "Quota"}),
    st.fixed_dictionaries(
        {"type": st.just("Image")}, optional={"minNodes": st.integers(min_value=1, max_value=9)}
    ),
    st.fixed_dictionaries({"type": st.just("Gang"), "size": st.integers(1, 64)}),
)


@st.composite
def gates(draw: st.DrawFn, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": prefix + draw(dns_labels),
        "condition": draw(gate_conditions),
        "timeoutSeconds": draw(st.integers(min_value=1, max_value=10**6)),
    }
    on_expiry = draw(st.sampled_from([None, "Fail", "Retry", "Review"]))
    if on_expiry is not None:
        out["onExpiry"] = on_expiry
    if on_expiry == "Retry" and draw(st.booleans()):
        initial = draw(st.integers(min_value=1, max_value=600))
        out["retry"] = {
            "initialBackoffSeconds": initial,
            "maxBackoffSeconds": draw(st.integers(min_value=initial, max_value=3600)),
        }
    return out


@st.composite
def gate_policy_specs(draw: st.DrawFn) -> dict[str, Any]:
    prefixes = draw(
        st.one_of(
            st.none(),
            st.lists(
                dns_labels.map(lambda d: f"{d}.example.com/"), min_size=1, max_size=3, unique=True
            ),
        )
    )
    usable = prefixes or ["gates.pilotfish.io/"]
    spec: dict[str, Any] = {
        "selector": draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "matchLabels": labels,
                    "matchExpressions": st.lists(
                        st.one_of(
                            st.fixed_dictionaries(
                                {
                                    "key": dns_labels,
                                    "operator": st.sampled_from(["In", "NotIn"]),
                                    "values": st.lists(dns_labels, min_size=1, max_size=3),
                                }
                            ),
                            st.fixed_dictionaries(
                                {
                                    "key": dns_labels,
                                    "operator": st.sampled_from(["Exists", "DoesNotExist"]),
                                }
                            ),
                        ),
                        max_size=3,
                    ),
                },
            )
        ),
        "gates": draw(
            st.lists(
                st.sampled_from(usable).flatmap(gates),
                min_size=1,
                max_size=4,
                unique_by=lambda g: g["name"],
            )
        ),
    }
    if prefixes is not None:
        spec["allowedPrefixes"] = prefixes
    pacing = draw(
        st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {},
                optional={
                    "releasesPerSecond": st.floats(min_value=0.01, max_value=1000.0),
                    "maxInFlight": st.integers(min_value=1, max_value=1000),
                },
            ),
        )
    )
    if pacing is not None:
        spec["pacing"] = pacing
    return spec


band_resources = st.fixed_dictionaries(
    {},
    optional={
        "cpu": quantities,
        "memory": quantities,
        "gpus": st.integers(min_value=0, max_value=64),
        "pods": st.integers(min_value=0, max_value=10**5),
        "extended": st.dictionaries(
            dns_labels.map(lambda d: f"example.com/{d}"), quantities, max_size=2
        ),
    },
)
bands_objects = st.fixed_dictionaries(
    {},
    optional={"production": band_resources, "batch": band_resources, "best-effort": band_resources},
)
team_quota_specs = st.fixed_dictionaries({"team": dns_labels}, optional={"bands": bands_objects})
team_quota_statuses = st.fixed_dictionaries(
    {},
    optional={"used": bands_objects, "reserved": bands_objects, "conditions": conditions},
)

node_names = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z][a-z0-9]{0,5})?\Z")
node_maintenance_specs = st.fixed_dictionaries(
    {"nodes": st.lists(node_names, min_size=1, max_size=5, unique=True)},
    optional={
        "maxConcurrent": st.integers(min_value=1, max_value=10),
        "onePerZone": st.booleans(),
        "order": st.sampled_from(["Given", "FewestProductionFirst"]),
        "blockedAfterSeconds": st.integers(min_value=1, max_value=10**6),
        "batchTaskDeadlineSeconds": st.integers(min_value=0, max_value=10**6),
        "allowLocalStorage": st.booleans(),
        "reason": st.text(max_size=30),
    },
)
_blockers = st.fixed_dictionaries(
    {
        "pod": st.tuples(dns_labels, dns_labels).map("/".join),
        "reason": st.sampled_from(["DisruptionBudget", "WaitingForSurge", "Terminating"]),
    },
    optional={
        "budget": st.tuples(dns_labels, dns_labels).map("/".join),
        "message": st.text(max_size=20),
    },
)
_node_progress = st.fixed_dictionaries(
    {
        "name": node_names,
        "state": st.sampled_from(["Pending", "Cordoned", "Draining", "Drained", "Failed"]),
    },
    optional={
        "podsLeft": st.integers(0, 200),
        "blockers": st.lists(_blockers, max_size=2, unique_by=lambda b: b["pod"]),
        "message": st.text(max_size=20),
    },
)
node_maintenance_statuses = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from(["Pending", "Draining", "Done", "Failed"]),
        "progress": st.tuples(st.integers(0, 99), st.integers(0, 99)).map(
            lambda t: f"{t[0]}/{t[1]}"
        ),
        "nodes": st.lists(_node_progress, max_size=3, unique_by=lambda n: n["name"]),
        "observedGeneration": st.integers(0, 100),
        "conditions": conditions,
    },
)
