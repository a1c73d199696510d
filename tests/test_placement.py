"""A workload's placement as pod spec: affinity, nodeSelector, GPUs, spread; the template kept."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pilotfish import names
from pilotfish.api.serviceworkload import Placement
from pilotfish.podtemplate import (
    GPU,
    LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE,
    REQUIRED,
    placement_patch,
    pod_body,
    with_placement,
)
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

Obj = dict[str, Any]


def placement(**fields: Any) -> Placement:
    return Placement.model_validate(fields)


def terms(spec: Obj) -> list[Obj]:
    """The pod spec's required node selector terms; none when it has no required affinity."""
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms_: list[Obj] = (node.get(REQUIRED) or {}).get("nodeSelectorTerms") or []
    return terms_


def workload(placement_: Obj | None) -> Obj:
    spec: Obj = {"team": "payments", "band": "production"}
    if placement_ is not None:
        spec["placement"] = placement_
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
        "spec": spec,
    }


TEMPLATE: Obj = {
    "metadata": {"labels": {"app": "web"}},
    "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
}


def test_zones_node_selector_and_machine_class_become_required_node_constraints() -> None:
    patch = placement_patch(
        placement(zones=["zone-b"], nodeSelector={"disk": "ssd"}, machineClass="pf.gpu-8"), "web"
    )
    assert patch["nodeSelector"] == {"disk": "ssd"}
    assert terms(patch) == [
        {
            "matchExpressions": [
                {"key": names.LABEL_ZONE, "operator": "In", "values": ["zone-b"]},
                {"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": ["pf.gpu-8"]},
            ]
        }
    ]


def test_defaults_add_only_a_soft_zone_spread_over_the_revision() -> None:
    patch = placement_patch(Placement(), "web")
    assert patch == {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": names.LABEL_ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {LABEL_WORKLOAD: "web"}},
                "matchLabelKeys": [LABEL_REVISION],
            }
        ]
    }


def test_node_spread_uses_the_hostname() -> None:
    patch = placement_patch(placement(spread="node"), "web")
    assert patch["topologySpreadConstraints"][0]["topologyKey"] == LABEL_HOSTNAME


def test_gpus_become_requests_and_limits_of_the_first_container_only() -> None:
    spec = {
        "containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "1"}}},
            {"name": "b", "image": "i"},
        ]
    }
    out = with_placement(spec, placement_patch(placement(gpus=2), "web"))
    assert out["containers"][0]["resources"] == {
        "requests": {"cpu": "1", GPU: "2"},
        "limits": {GPU: "2"},
    }
    assert out["containers"][1] == {"name": "b", "image": "i"}


@pytest.mark.parametrize("kind", ["requests", "limits"])
def test_a_container_stating_its_own_gpus_keeps_them(kind: str) -> None:
    own = {"name": "a", "image": "i", "resources": {kind: {GPU: "4"}}}
    out = with_placement({"containers": [own]}, placement_patch(placement(gpus=1), "web"))
    assert out["containers"][0] == own


def test_node_selector_merges_and_a_clash_requires_both_values() -> None:
    spec = {"containers": [], "nodeSelector": {"disk": "hdd", "rack": "r1"}}
    patch = placement_patch(placement(nodeSelector={"disk": "ssd", "net": "fast"}), "web")
    out = with_placement(spec, patch)
    # The template's value stays and the placement's is required too: the pod cannot be
    # placed, and the scheduler says so, rather than one of them being dropped unseen.
    assert out["nodeSelector"] == {"disk": "hdd", "rack": "r1", "net": "fast"}
    assert terms(out) == [
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
    ]


def test_placement_is_anded_into_every_required_term_of_the_template() -> None:
    own_term_a = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    own_term_b = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
    spec = {
        "containers": [],
        "affinity": {
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [own_term_a, own_term_b]}},
            "podAntiAffinity": {"x": 1},
        },
    }
    out = with_placement(spec, placement_patch(placement(zones=["zone-a", "zone-c"]), "web"))
    zone = {"key": names.LABEL_ZONE, "operator": "In", "values": ["zone-a", "zone-c"]}
    assert terms(out) == [
        {"matchExpressions": [*own_term_a["matchExpressions"], zone]},
        {**own_term_b, "matchExpressions": [zone]},
    ]
    assert out["affinity"]["podAntiAffinity"] == {"x": 1}
    assert terms(spec) == [own_term_a, own_term_b]  # the template is not changed


def test_the_templates_own_spread_over_the_same_key_wins() -> None:
    own = {"maxSkew": 3, "topologyKey": names.LABEL_ZONE, "whenUnsatisfiable": "DoNotSchedule"}
    spec = {"containers": [], "topologySpreadConstraints": [own]}
    out = with_placement(spec, placement_patch(Placement(), "web"))
    assert out["topologySpreadConstraints"] == [own]
    node = with_placement(spec, placement_patch(placement(spread="node"), "web"))
    assert [c["topologyKey"] for c in node["topologySpreadConstraints"]] == [
        names.LABEL_ZONE,
        LABEL_HOSTNAME,
    ]


def test_pod_body_applies_the_workloads_placement() -> None:
    sw = workload({"zones": ["zone-b"], "nodeSelector": {"disk": "ssd"}, "gpus": 1})
    spec = pod_body(sw, TEMPLATE, "abc", "web-abc-xyz12")["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert terms(spec)[0]["matchExpressions"][0]["values"] == ["zone-b"]
    assert spec["containers"][0]["resources"]["limits"] == {GPU: "1"}
    assert TEMPLATE["spec"] == {"containers": [{"name": "app", "image": "example/app:1"}]}


def test_a_workload_without_placement_gets_the_template_as_is() -> None:
    # A kind whose schema has no placement (or a body from before it was defaulted).
    assert pod_body(workload(None), TEMPLATE, "abc", "n")["spec"] == TEMPLATE["spec"]


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"zones": []}, "zones"),
        ({"zones": ["zone b"]}, "zones.0"),
        ({"machineClass": "-gpu"}, "machineClass"),
        ({"gpus": -1}, "gpus"),
        ({"spread": "rack"}, "spread"),
    ],
)
def test_a_placement_no_pod_could_carry_is_refused_naming_the_field(
    fields: Obj, where: str
) -> None:
    with pytest.raises(ValidationError) as e:
        Placement.model_validate(fields)
    assert where in str(e.value)


# --- every generated pod keeps the template's own containers and fields ---

label = st.from_regex(r"\A[a-z0-9]([a-z0-9.-]{0,8}[a-z0-9])?\Z")
labels = st.dictionaries(label, label, max_size=3)
expression = st.fixed_dictionaries(
    {"key": label, "operator": st.sampled_from(["In", "NotIn"]), "values": st.lists(label)}
)
quantity = st.sampled_from(["1", "2", "500m", "1Gi"])
resources = st.dictionaries(
    st.sampled_from(["requests", "limits"]),
    st.dictionaries(st.sampled_from(["cpu", "memory", GPU]), quantity, max_size=3),
    max_size=2,
)
container = st.fixed_dictionaries(
    {"name": label, "image": label},
    optional={"resources": resources, "args": st.lists(label, max_size=2)},
)
spread = st.fixed_dictionaries(
    {
        "maxSkew": st.integers(1, 3),
        "topologyKey": st.sampled_from([names.LABEL_ZONE, LABEL_HOSTNAME, "rack"]),
        "whenUnsatisfiable": st.sampled_from(["DoNotSchedule", "ScheduleAnyway"]),
    }
)
affinity = st.fixed_dictionaries(
    {},
    optional={
        "nodeAffinity": st.fixed_dictionaries(
            {
                REQUIRED: st.fixed_dictionaries(
                    {
                        "nodeSelectorTerms": st.lists(
                            st.fixed_dictionaries({"matchExpressions": st.lists(expression)}),
                            min_size=1,
                            max_size=2,
                        )
                    }
                )
            }
        ),
        "podAffinity": st.just({"preferredDuringSchedulingIgnoredDuringExecution": []}),
    },
)
pod_spec = st.fixed_dictionaries(
    {"containers": st.lists(container, min_size=1, max_size=3)},
    optional={
        "nodeSelector": labels,
        "affinity": affinity,
        "topologySpreadConstraints": st.lists(spread, max_size=2),
        "initContainers": st.lists(container, max_size=1),
        "terminationGracePeriodSeconds": st.integers(0, 30),
        "schedulingGates": st.just([{"name": "example.com/g"}]),
    },
)
placements = st.builds(
    Placement,
    zones=st.none() | st.lists(label, min_size=1, max_size=3, unique=True),
    node_selector=st.none() | labels,
    machine_class=st.none() | label,
    gpus=st.integers(0, 4),
    spread=st.sampled_from(["zone", "node"]),
)


def without_gpu(resources_: Obj) -> Obj:
    return {k: {r: q for r, q in v.items() if r != GPU} for k, v in resources_.items()}


@given(pod_spec, placements)
def test_every_pod_keeps_the_templates_own_containers_and_fields(
    spec: Obj, place: Placement
) -> None:
    before = copy.deepcopy(spec)
    out = with_placement(spec, placement_patch(place, "web"))
    assert spec == before  # the template is never changed in place

    # Containers: same names, images and fields; only the first may gain GPU resources.
    assert len(out["containers"]) == len(spec["containers"])
    first, *rest = out["containers"]
    assert rest == spec["containers"][1:]
    assert {k: v for k, v in first.items() if k != "resources"} == {
        k: v for k, v in spec["containers"][0].items() if k != "resources"
    }
    own = spec["containers"][0].get("resources") or {}
    if any(GPU in (own.get(k) or {}) for k in ("requests", "limits")) or not place.gpus:
        assert first.get("resources") == spec["containers"][0].get("resources")
    else:
        assert without_gpu(first["resources"]) == without_gpu({"requests": {}, "limits": {}, **own})
        assert first["resources"]["requests"][GPU] == first["resources"]["limits"][GPU]

    # Fields placement does not touch are the template's, untouched.
    touched = {"containers", "nodeSelector", "affinity", "topologySpreadConstraints"}
    assert {k: v for k, v in out.items() if k not in touched} == {
        k: v for k, v in spec.items() if k not in touched
    }
    # The template's own node selection and spread all still hold.
    for key, value in (spec.get("nodeSelector") or {}).items():
        assert out["nodeSelector"][key] == value
    own_spread = spec.get("topologySpreadConstraints") or []
    assert out.get("topologySpreadConstraints", [])[: len(own_spread)] == own_spread
    own_affinity = spec.get("affinity") or {}
    for k, v in own_affinity.items():
        if k != "nodeAffinity":
            assert out["affinity"][k] == v
    own_terms = terms(spec)
    if own_terms:
        got = terms(out)
        assert len(got) == len(own_terms)
        for mine, theirs in zip(got, own_terms, strict=True):
            n = len(theirs["matchExpressions"])
            assert mine["matchExpressions"][:n] == theirs["matchExpressions"]

    # And so does every constraint of the placement.
    selected = dict(out.get("nodeSelector") or {})
    required = [e for t in terms(out) for e in t["matchExpressions"]]
    for key, value in (place.node_selector or {}).items():
        assert selected.get(key) == value or {"key": key, "operator": "In", "values": [value]} in (
            required
        )
    if place.zones:
        for term in terms(out):
            assert {"key": names.LABEL_ZONE, "operator": "In", "values": place.zones} in term[
                "matchExpressions"
            ]


def test_a_batch_workloads_placement_applies_as_a_services_does() -> None:
    bw = workload({"zones": ["zone-c"], "spread": "node"})
    bw["kind"] = "BatchWorkload"
    spec = pod_body(bw, TEMPLATE, "abc", "job-abc-xyz12", "batch")["spec"]
    assert terms(spec)[0]["matchExpressions"][0]["values"] == ["zone-c"]
    assert [c["topologyKey"] for c in spec["topologySpreadConstraints"]] == [LABEL_HOSTNAME]
