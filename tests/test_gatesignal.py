"""GateSignal: the model, its generated CRD, and what "raised" means.

The outside system that owns a signal writes only its status, so the status schema is the
contract with that system: standard conditions keyed by type, Ready among them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pilotfish import names
from pilotfish.api import ALL_KINDS, GatePolicy, GateSignal, crdgen
from pilotfish.api.gatesignal import READY
from tests import builders

ROOT = Path(__file__).resolve().parents[1]


def committed(directory: Path) -> dict[str, Any]:
    text = (ROOT / directory / crdgen.file_name(GateSignal)).read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def condition(type_: str = READY, status: str = "True", **extra: Any) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": "LoadComplete",
        "message": "warehouse load finished",
        "lastTransitionTime": "2030-01-01T00:00:00Z",
        **extra,
    }


def signal(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    wire = builders.obj("GateSignal", spec)
    if status is not None:
        wire["status"] = status
    return wire


# --- the CRD ------------------------------------------------------------------------------


def test_registered_after_gate_policy_and_generated() -> None:
    kinds = list(ALL_KINDS)
    assert kinds.index(GateSignal) == kinds.index(GatePolicy) + 1
    # Only this kind's files: other kinds may be mid-edit in a shared checkout.
    assert [p for p in crdgen.check(ROOT) if p.name == crdgen.file_name(GateSignal)] == []
    a, b = (committed(d) for d in crdgen.OUTPUT_DIRS)
    assert a == b == crdgen.crd_manifest(GateSignal)


def test_names_scope_and_subresources() -> None:
    crd = committed(crdgen.OUTPUT_DIRS[0])
    assert crd["metadata"]["name"] == f"gatesignals.{names.GROUP}"
    spec = crd["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "GateSignal",
        "listKind": "GateSignalList",
        "plural": "gatesignals",
        "singular": "gatesignal",
        "shortNames": ["gs"],
        "categories": [names.CATEGORY],
    }
    [version] = spec["versions"]
    assert version["name"] == names.VERSION
    # Status is its own subresource: a writer bound to gatesignals/status alone cannot edit
    # the spec, and one bound to gatesignals alone cannot raise the signal.
    assert version["subresources"] == {"status": {}}


def test_printer_columns_point_into_the_schema() -> None:
    [version] = committed(crdgen.OUTPUT_DIRS[0])["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == [
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    assert all(c["description"] for c in columns)
    conditions = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "conditions"
    ]
    # The filter relies on conditions being keyed by type, with a string status.
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["properties"]["status"]["type"] == "string"


def test_schema_is_structural_and_documented() -> None:
    schema = crdgen.openapi_schema(GateSignal)
    assert crdgen.structural_problems(schema) == []
    spec = schema["properties"]["spec"]
    assert spec["default"] == {}  # `kubectl create` of a bare signal needs no spec
    assert spec["properties"] == {
        "description": {
            "type": "string",
            "maxLength": 1024,
            "description": spec["properties"]["description"]["description"],
        }
    }
    assert set(schema["properties"]["status"]["properties"]) == {
        "conditions",
        "observedGeneration",
    }
    assert "required" not in schema or "spec" not in schema["required"]


# --- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "ready"),
    [
        (None, False),  # never written: holds its gates
        ({}, False),
        ({"conditions": [condition(status="True")]}, True),
        ({"conditions": [condition(status="False")]}, False),
        ({"conditions": [condition(status="Unknown")]}, False),
        ({"conditions": [condition("Degraded", "True")]}, False),
        ({"conditions": [condition("Degraded", "False"), condition(READY, "True")]}, True),
    ],
)
def test_is_ready_only_when_ready_is_true(status: dict[str, Any] | None, ready: bool) -> None:
    assert GateSignal.model_validate(signal(status)).is_ready() is ready


def test_a_bare_signal_is_valid_and_defaults_like_the_api_server() -> None:
    wire = builders.obj("GateSignal", {})
    del wire["spec"]
    model = GateSignal.model_validate(wire)
    schema = crdgen.openapi_schema(GateSignal)
    assert builders.apply_defaults(schema, wire) == model.model_dump(
        by_alias=True, exclude_none=True
    )


@pytest.mark.parametrize(
    ("wire", "field"),
    [
        (signal(description="x" * 1025), "spec.description: longer than 1024"),
        (signal({"conditions": [condition(status="Yes")]}), "conditions[0].status: 'Yes'"),
        (signal({"conditions": [condition(reason="")]}), "conditions[0].reason: shorter"),
        (signal({"conditions": [condition(), condition()]}), "duplicate keys"),
        (signal({"observedGeneration": -1}), "observedGeneration: -1 below minimum"),
    ],
)
def test_bad_signals_are_refused_by_model_and_schema(wire: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError):
        GateSignal.model_validate(wire)
    errors = builders.schema_errors(crdgen.openapi_schema(GateSignal), wire)
    assert errors
    assert any(field in e for e in errors), errors


statuses = st.fixed_dictionaries(
    {},
    optional={
        "observedGeneration": st.integers(0, 100),
        "conditions": builders.conditions.map(
            lambda cs: [{**c, "type": READY} if i == 0 else c for i, c in enumerate(cs)]
        ).filter(lambda cs: len({c["type"] for c in cs}) == len(cs)),
    },
)
specs = st.fixed_dictionaries({}, optional={"description": st.text(max_size=40)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, status=st.one_of(st.none(), statuses))
def test_model_and_schema_accept_and_default_alike(
    spec: dict[str, Any], status: dict[str, Any] | None
) -> None:
    schema = crdgen.openapi_schema(GateSignal)
    wire = signal(status, **spec)
    assert builders.schema_errors(schema, wire) == []
    model = GateSignal.model_validate(wire)
    dumped = model.model_dump(by_alias=True, exclude_none=True)
    assert builders.apply_defaults(schema, wire) == dumped
    assert GateSignal.model_validate(dumped) == model
