"""The generated CRDs: committed, structural, and in agreement with the models.

No cluster here, so the API server's rules are checked by walking the schemas; what only an
API server can judge (CEL compilation and cost) is left to the e2e suite.
"""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.api import (
    ALL_KINDS,
    BatchWorkload,
    GatePolicy,
    GateSignal,
    NodeMaintenance,
    Resource,
    ServiceWorkload,
    TeamQuota,
    crdgen,
)
from tests import builders

ROOT = Path(__file__).resolve().parents[1]


def schema_of(kind: type[Resource]) -> dict[str, Any]:
    return crdgen.openapi_schema(kind)


def committed(kind: type[Resource], directory: Path = crdgen.OUTPUT_DIRS[0]) -> dict[str, Any]:
    text = (ROOT / directory / crdgen.file_name(kind)).read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node that describes a value, with a readable path."""
    yield path or "<root>", node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}[*]")


# --- the committed files --------------------------------------------------------------


def test_committed_crds_match_the_models() -> None:
    drift = crdgen.check(ROOT)
    assert drift == [], "CRD YAML differs from pilotfish/api; run `make crds`: " + ", ".join(
        str(p.relative_to(ROOT)) for p in drift
    )


def test_chart_and_crds_folder_hold_the_same_bytes() -> None:
    for kind in ALL_KINDS:
        a, b = (ROOT / d / crdgen.file_name(kind) for d in crdgen.OUTPUT_DIRS)
        assert a.read_bytes() == b.read_bytes()


def test_check_names_each_drifting_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "charts" / "pilotfish").mkdir(parents=True)
    assert crdgen.main(["--root", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 0
    capsys.readouterr()

    edited = tmp_path / "charts/pilotfish/crds" / crdgen.file_name(GatePolicy)
    edited.write_text(edited.read_text() + "# hand edit\n")
    stale = tmp_path / "crds" / "oldkinds.pilotfish.io.yaml"
    stale.write_text(crdgen.HEADER + "kind: CustomResourceDefinition\n")
    missing = tmp_path / "crds" / crdgen.file_name(TeamQuota)
    missing.unlink()

    assert set(crdgen.check(tmp_path)) == {edited, stale, missing}
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for path in (edited, stale, missing):
        assert str(path.relative_to(tmp_path)) in err

    # Regenerating repairs all three and leaves files that are not ours alone.
    foreign = tmp_path / "crds" / "other.pilotfish.io.yaml"
    foreign.write_text("# someone else's\n")
    crdgen.write(tmp_path)
    assert crdgen.check(tmp_path) == []
    assert not stale.exists()
    assert foreign.exists()


def test_main_refuses_a_root_without_the_chart(tmp_path: Path) -> None:
    assert crdgen.main(["--root", str(tmp_path)]) == 2
    assert not (tmp_path / "crds").exists()


def test_output_is_deterministic() -> None:
    assert crdgen.rendered() == crdgen.rendered()
    for kind, text in zip(ALL_KINDS, crdgen.rendered().values(), strict=True):
        assert text.startswith(crdgen.HEADER)
        docs = list(yaml.safe_load_all(text))
        assert docs == [crdgen.crd_manifest(kind)]


# --- CRD metadata -----------------------------------------------------------------------

NAMES = {
    ServiceWorkload: ("serviceworkloads", "sw", "Namespaced"),
    BatchWorkload: ("batchworkloads", "bw", "Namespaced"),
    GatePolicy: ("gatepolicies", "gp", "Namespaced"),
    GateSignal: ("gatesignals", "gs", "Namespaced"),
    TeamQuota: ("teamquotas", "tq", "Cluster"),
    NodeMaintenance: ("nodemaintenances", "nm", "Cluster"),
}


def test_every_kind_has_a_crd() -> None:
    assert set(NAMES) == set(ALL_KINDS)


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.__name__)
def test_names_scope_and_version(kind: type[Resource]) -> None:
    plural, short, scope = NAMES[kind]
    crd = committed(kind)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{plural}.{names.GROUP}"
    spec = crd["spec"]
    assert spec["group"] == names.GROUP
    assert spec["scope"] == scope
    assert spec["names"] == {
        "kind": kind.__name__,
        "listKind": f"{kind.__name__}List",
        "plural": plural,
        "singular": kind.__name__.lower(),
        "shortNames": [short],
        "categories": [names.CATEGORY],
    }
    [version] = spec["versions"]
    assert version["name"] == names.VERSION
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"]["status"] == {}


def test_short_names_are_unique() -> None:
    shorts = [n for k in ALL_KINDS for n in k.crd.short_names]
    assert len(shorts) == len(set(shorts))


def test_service_workload_scale_subresource() -> None:
    [version] = committed(ServiceWorkload)["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["replicas"]["type"] == "integer"
    assert schema["properties"]["status"]["properties"]["replicas"]["type"] == "integer"
    assert schema["properties"]["status"]["properties"]["selector"]["type"] == "string"


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k is not ServiceWorkload])
def test_only_service_workload_scales(kind: type[Resource]) -> None:
    [version] = committed(kind)["spec"]["versions"]
    assert "scale" not in version["subresources"]


COLUMNS = {
    ServiceWorkload: [
        ("Team", ".spec.team"),
        ("Band", ".spec.band"),
        ("Desired", ".spec.replicas"),
        ("Ready", ".status.readyReplicas"),
        ("Available", ".status.availableReplicas"),
        ("Up-to-date", ".status.updatedReplicas"),
        ("Failure", '.status.conditions[?(@.type=="ReplicaFailure")].reason'),
        ("Age", ".metadata.creationTimestamp"),
    ],
    BatchWorkload: [
        ("Team", ".spec.team"),
        ("Band", ".spec.band"),
        ("Status", '.status.conditions[?(@.status=="True")].type'),
        ("Succeeded", ".status.succeeded"),
        ("Completions", ".spec.completions"),
        ("Active", ".status.active"),
        ("Waiting", ".status.waiting"),
        ("Failed", ".status.failed"),
        ("In-flight", ".status.pacing.inFlight"),
        ("Limit", ".status.pacing.limit"),
        ("Age", ".metadata.creationTimestamp"),
    ],
    GatePolicy: [
        ("Gates", ".spec.gates[*].name"),
        ("Gated", ".status.gatedPods"),
        ("Valid", '.status.conditions[?(@.type=="Valid")].status'),
        ("Age", ".metadata.creationTimestamp"),
    ],
    GateSignal: [
        ("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        ("Age", ".metadata.creationTimestamp"),
    ],
    TeamQuota: [
        ("Team", ".spec.team"),
        ("Production", ".status.summary.production"),
        ("Batch", ".status.summary.batch"),
        ("Best-Effort", ".status.summary.best-effort"),
        ("Age", ".metadata.creationTimestamp"),
    ],
    NodeMaintenance: [
        ("Phase", ".status.phase"),
        ("Progress", ".status.progress"),
        ("Blocked", '.status.conditions[?(@.type=="Blocked")].status'),
        ("Age", ".metadata.creationTimestamp"),
    ],
}


def _schema_at(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    node = schema
    # A filter such as [?(@.type=="Ready")] selects list items, like [*].
    for part in re.sub(r"\[\?\(.*?\)\]", "[*]", json_path).lstrip(".").split("."):
        many = part.endswith("[*]")
        found = node.get("properties", {}).get(part.removesuffix("[*]"))
        if found is None:
            return None
        node = found["items"] if many else found
    return node


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.__name__)
def test_printer_columns(kind: type[Resource]) -> None:
    [version] = committed(kind)["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"]) for c in columns] == COLUMNS[kind]
    schema = version["schema"]["openAPIV3Schema"]
    for column in columns:
        assert column["description"]
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        target = _schema_at(schema, column["jsonPath"])
        assert target is not None, f"{column['jsonPath']} is not in the schema"
        expected = {"integer": "integer", "string": "string"}[column["type"]]
        # An array column (the node list) prints as JSON text.
        assert target["type"] in (expected, "array")


# --- structural schemas ---------------------------------------------------------------

FORBIDDEN_KEYS = {"$ref", "$defs", "definitions", "title", "allOf", "oneOf", "not", "nullable"}


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.__name__)
def test_schema_is_structural(kind: type[Resource]) -> None:
    [version] = committed(kind)["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    assert crdgen.structural_problems(schema) == []

    assert schema["type"] == "object"
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert "additionalProperties" not in schema
    for path, node in walk(schema):
        assert not FORBIDDEN_KEYS & set(node), path
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        assert "type" in node or int_or_string or preserve, f"{path}: untyped"
        if "anyOf" in node:
            assert int_or_string, f"{path}: anyOf outside int-or-string"
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
        if "default" in node:
            assert node["default"] is not None, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("type") == "object" and not preserve and "properties" not in node:
            assert "additionalProperties" in node or path == ".metadata", f"{path}: empty"
    # Every field, however deep, explains itself for `kubectl explain`.
    for path, node in walk(schema):
        for name, sub in node.get("properties", {}).items():
            if f"{path}.{name}" != "<root>.metadata":
                assert sub.get("description"), f"{path}.{name}: no description"


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.__name__)
def test_defaults_are_valid_values(kind: type[Resource]) -> None:
    # The API server rejects a CRD whose defaults fail their own schema.
    for path, node in walk(schema_of(kind)):
        if "default" in node:
            value = builders.apply_defaults(node, node["default"])
            assert builders.schema_errors(node, value, path) == []


def test_pod_templates_are_opaque_objects() -> None:
    for kind in (ServiceWorkload, BatchWorkload):
        template = schema_of(kind)["properties"]["spec"]["properties"]["template"]
        assert template["type"] == "object"
        assert template["x-kubernetes-preserve-unknown-fields"] is True
        assert template["x-kubernetes-embedded-resource"] is False
        assert set(template["properties"]) == {"metadata", "spec"}
        assert template["required"] == ["spec"]


def test_quantities_are_int_or_string_with_the_quantity_pattern() -> None:
    band = schema_of(TeamQuota)["properties"]["spec"]["properties"]["bands"]["properties"]
    for name in names.BANDS:
        props = band[name]["properties"]
        for node in (props["cpu"], props["memory"], props["extended"]["additionalProperties"]):
            assert node["x-kubernetes-int-or-string"] is True
            assert node["pattern"].startswith("^")
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]


def test_cel_rules_are_where_the_models_put_them() -> None:
    sw = schema_of(ServiceWorkload)["properties"]["spec"]["properties"]["strategy"]
    [rule] = sw["x-kubernetes-validations"]
    assert "maxSurge" in rule["message"] and "maxUnavailable" in rule["message"]
    assert "never make progress" in rule["message"]

    bw = schema_of(BatchWorkload)["properties"]["spec"]
    assert any("gang <= self.completions" in r["rule"] for r in bw["x-kubernetes-validations"])

    gp = schema_of(GatePolicy)["properties"]["spec"]
    [prefix_rule] = gp["x-kubernetes-validations"]
    assert "allowedPrefixes" in prefix_rule["rule"]
    gates = gp["properties"]["gates"]
    # Gate names are unique as list-map keys: the API server rejects duplicates and
    # server-side apply merges gates by name.
    assert gates["x-kubernetes-list-type"] == "map"
    assert gates["x-kubernetes-list-map-keys"] == ["name"]
    assert gp["properties"]["allowedPrefixes"]["default"] == [names.GATE_PREFIX]


def test_generator_refuses_unstructural_models() -> None:
    from pydantic import Field

    from pilotfish.api.base import CrdInfo

    class Bad(Resource):
        """A kind with an untagged union, which no structural schema can express."""

        crd = CrdInfo("bads", ("bad",), "Namespaced", ())
        spec: int | list[int] = Field(description="Either.")

    with pytest.raises(crdgen.SchemaError, match="union"):
        crdgen.openapi_schema(Bad)


# --- models and CRDs agree on real objects ----------------------------------------------

KIND_CASES = [
    pytest.param(kind, specs, statuses, id=kind.__name__)
    for kind, specs, statuses in (
        (ServiceWorkload, builders.service_workload_specs, builders.service_workload_statuses),
        (BatchWorkload, builders.batch_workload_specs(), st.just({})),
        (GatePolicy, builders.gate_policy_specs(), st.just({})),
        (TeamQuota, builders.team_quota_specs, builders.team_quota_statuses),
        (NodeMaintenance, builders.node_maintenance_specs, builders.node_maintenance_statuses),
    )
]


@pytest.mark.parametrize(("kind", "specs", "statuses"), KIND_CASES)
def test_models_and_schema_accept_and_default_alike(
    kind: type[Resource], specs: st.SearchStrategy[Any], statuses: st.SearchStrategy[Any]
) -> None:
    schema = schema_of(kind)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spec=specs, status=st.one_of(st.none(), statuses))
    def check(spec: dict[str, Any], status: dict[str, Any] | None) -> None:
        extra = {} if status is None else {"status": status}
        wire = builders.obj(kind.__name__, spec, namespaced=kind.crd.namespaced, **extra)
        assert builders.schema_errors(schema, wire) == []

        model = kind.model_validate(wire)
        dumped = model.model_dump(by_alias=True, exclude_none=True)
        # What the API server stores (the object with the schema's defaults) is what Python
        # sees: same defaults on both sides, no field either side drops.
        assert builders.apply_defaults(schema, wire) == dumped
        assert builders.schema_errors(schema, dumped) == []
        assert kind.model_validate(dumped) == model

    check()


EXAMPLES = sorted((ROOT / "examples").glob("**/*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    kinds = {k.__name__: k for k in ALL_KINDS}
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if not doc or doc.get("apiVersion") != names.API_VERSION:
            continue
        kind = kinds[doc["kind"]]
        assert builders.schema_errors(schema_of(kind), doc) == []
        kind.model_validate(doc)
