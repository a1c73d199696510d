"""The API models: what they accept, what they reject and why, and what they default.

Every invalid case is also run against the generated CRD schema: a case the schema alone
rejects must be rejected there too, and a case only a CEL rule rejects must pass the schema
(so the CEL rule, mirrored in Python, is what guards it on the API server).
"""

import re
from datetime import UTC, datetime
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pilotfish import names
from pilotfish.api import (
    ALL_KINDS,
    BatchWorkload,
    GatePolicy,
    NodeMaintenance,
    Resource,
    ServiceWorkload,
    TeamQuota,
    crdgen,
)
from pilotfish.api.base import (
    QUANTITY_PATTERN,
    Band,
    Condition,
    LabelSelector,
    ObjectMeta,
    PodTemplate,
)
from pilotfish.api.gatepolicy import Gate, GateCondition, GatePolicySpec
from pilotfish.api.serviceworkload import (
    ServiceWorkloadSpec,
    ServiceWorkloadStatus,
    Strategy,
)
from pilotfish.api.teamquota import BandResources
from tests import builders
from tests.builders import (
    batch_workload_spec,
    gate,
    gate_policy_spec,
    node_maintenance_spec,
    service_workload_spec,
    team_quota_spec,
)


def wire(kind: type[Resource], spec: dict[str, Any]) -> dict[str, Any]:
    return builders.obj(kind.__name__, spec, namespaced=kind.crd.namespaced)


# (kind, spec, fragment of the Python error, rejected by CEL only)
INVALID: list[tuple[str, type[Resource], dict[str, Any], str, bool]] = [
    # ServiceWorkload
    ("sw-no-team", ServiceWorkload, {"template": builders.TEMPLATE}, "team", False),
    ("sw-no-template", ServiceWorkload, {"team": "payments"}, "template", False),
    ("sw-negative-replicas", ServiceWorkload, service_workload_spec(replicas=-1), "0", False),
    ("sw-string-replicas", ServiceWorkload, service_workload_spec(replicas="3"), "integer", False),
    ("sw-bool-replicas", ServiceWorkload, service_workload_spec(replicas=True), "integer", False),
    ("sw-bad-band", ServiceWorkload, service_workload_spec(band="gold"), "production", False),
    ("sw-team-upper", ServiceWorkload, service_workload_spec(team="Payments"), "pattern", False),
    ("sw-team-long", ServiceWorkload, service_workload_spec(team="a" * 64), "63", False),
    (
        "sw-template-no-spec",
        ServiceWorkload,
        service_workload_spec(template={"metadata": {}}),
        "spec",
        False,
    ),
    (
        "sw-both-zero",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": 0, "maxUnavailable": 0}),
        "maxSurge and maxUnavailable cannot both be 0",
        True,
    ),
    (
        "sw-both-zero-percent",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": "0%", "maxUnavailable": "00%"}),
        "the rollout could never make progress",
        True,
    ),
    (
        "sw-surge-zero-by-default-unavailable",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": 0}),
        "cannot both be 0",
        True,
    ),
    (
        "sw-surge-not-percent",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": "25"}),
        "pattern",
        False,
    ),
    (
        "sw-surge-float",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": 1.5}),
        "integer",
        False,
    ),
    (
        "sw-zero-deadline",
        ServiceWorkload,
        service_workload_spec(strategy={"progressDeadlineSeconds": 0}),
        "1",
        False,
    ),
    (
        "sw-bad-spread",
        ServiceWorkload,
        service_workload_spec(placement={"spread": "rack"}),
        "zone",
        False,
    ),
    (
        "sw-negative-gpus",
        ServiceWorkload,
        service_workload_spec(placement={"gpus": -1}),
        "0",
        False,
    ),
    (
        "sw-duplicate-zones",
        ServiceWorkload,
        service_workload_spec(placement={"zones": ["a", "a"]}),
        "duplicate",
        False,
    ),
    (
        "sw-port-zero",
        ServiceWorkload,
        service_workload_spec(service={"ports": [{"name": "http", "port": 0}]}),
        "1",
        False,
    ),
    (
        "sw-port-too-big",
        ServiceWorkload,
        service_workload_spec(service={"ports": [{"name": "http", "port": 65536}]}),
        "65535",
        False,
    ),
    (
        "sw-bad-protocol",
        ServiceWorkload,
        service_workload_spec(service={"ports": [{"name": "h", "port": 80, "protocol": "HTTP"}]}),
        "TCP",
        False,
    ),
    (
        "sw-duplicate-port-names",
        ServiceWorkload,
        service_workload_spec(
            service={"ports": [{"name": "h", "port": 80}, {"name": "h", "port": 81}]}
        ),
        "duplicate",
        False,
    ),
    (
        "sw-no-ports",
        ServiceWorkload,
        service_workload_spec(service={"ports": []}),
        "at least 1",
        False,
    ),
    # BatchWorkload
    (
        "bw-no-completions",
        BatchWorkload,
        {"team": "a", "template": builders.TEMPLATE},
        "completions",
        False,
    ),
    ("bw-zero-completions", BatchWorkload, batch_workload_spec(completions=0), "1", False),
    ("bw-zero-parallelism", BatchWorkload, batch_workload_spec(parallelism=0), "1", False),
    ("bw-negative-backoff", BatchWorkload, batch_workload_spec(backoffLimit=-1), "0", False),
    ("bw-zero-rate", BatchWorkload, batch_workload_spec(creationRate=0), "0", False),
    ("bw-zero-gang", BatchWorkload, batch_workload_spec(gang=0), "1", False),
    (
        "bw-huge-completions",
        BatchWorkload,
        batch_workload_spec(completions=1_000_001),
        "1000000",
        False,
    ),
    (
        "bw-huge-parallelism",
        BatchWorkload,
        batch_workload_spec(parallelism=100_001),
        "100000",
        False,
    ),
    (
        "bw-huge-gang",
        BatchWorkload,
        batch_workload_spec(completions=5000, parallelism=5000, gang=1001),
        "1000",
        False,
    ),
    (
        "bw-gang-above-completions",
        BatchWorkload,
        batch_workload_spec(completions=4, parallelism=8, gang=5),
        "gang cannot exceed completions",
        True,
    ),
    (
        "bw-gang-above-parallelism",
        BatchWorkload,
        batch_workload_spec(completions=10, parallelism=2, gang=3),
        "gang cannot exceed parallelism",
        True,
    ),
    # GatePolicy
    (
        "gp-no-gates",
        GatePolicy,
        gate_policy_spec(gates=[]),
        "at least 1",
        False,
    ),
    (
        "gp-no-selector",
        GatePolicy,
        {"gates": [gate()]},
        "selector",
        False,
    ),
    (
        "gp-gate-without-prefix",
        GatePolicy,
        gate_policy_spec(gates=[gate(name="data-ready")]),
        "pattern",
        False,
    ),
    (
        "gp-gate-outside-allowed-prefixes",
        GatePolicy,
        gate_policy_spec(gates=[gate(name="gates.other.io/data-ready")]),
        "every gate name must start with one of allowedPrefixes",
        True,
    ),
    (
        "gp-gate-outside-custom-prefixes",
        GatePolicy,
        gate_policy_spec(allowedPrefixes=["team-a.example.com/"]),
        "allowedPrefixes",
        True,
    ),
    (
        "gp-duplicate-gate-names",
        GatePolicy,
        gate_policy_spec(gates=[gate(), gate()]),
        "duplicate entry with name='gates.pilotfish.io/data-ready'",
        False,
    ),
    (
        "gp-prefix-without-slash",
        GatePolicy,
        gate_policy_spec(allowedPrefixes=["gates.pilotfish.io"]),
        "pattern",
        False,
    ),
    (
        "gp-no-prefixes",
        GatePolicy,
        gate_policy_spec(allowedPrefixes=[]),
        "at least 1",
        False,
    ),
    (
        "gp-zero-timeout",
        GatePolicy,
        gate_policy_spec(gates=[gate(timeoutSeconds=0)]),
        "1",
        False,
    ),
    (
        "gp-no-timeout",
        GatePolicy,
        gate_policy_spec(
            gates=[
                {
                    "name": "gates.pilotfish.io/x",
                    "condition": {"type": "Quota"},
                }
            ]
        ),
        "timeoutSeconds",
        False,
    ),
    (
        "gp-bad-expiry",
        GatePolicy,
        gate_policy_spec(gates=[gate(onExpiry="Ignore")]),
        "Fail",
        False,
    ),
    (
        "gp-bad-condition-type",
        GatePolicy,
        gate_policy_spec(gates=[gate(condition={"type": "Webhook"})]),
        "GateSignal",
        False,
    ),
    (
        "gp-signal-without-name",
        GatePolicy,
        gate_policy_spec(gates=[gate(condition={"type": "GateSignal"})]),
        "signalName is required when type is GateSignal",
        True,
    ),
    (
        "gp-signal-name-on-quota",
        GatePolicy,
        gate_policy_spec(gates=[gate(condition={"type": "Quota", "signalName": "x"})]),
        "signalName is required when type is GateSignal and not allowed otherwise",
        True,
    ),
    (
        "gp-gang-without-size",
        GatePolicy,
        gate_policy_spec(gates=[gate(condition={"type": "Gang"})]),
        "size is required when type is Gang",
        True,
    ),
    (
        "gp-min-nodes-on-gang",
        GatePolicy,
        gate_policy_spec(gates=[gate(condition={"type": "Gang", "size": 2, "minNodes": 1})]),
        "minNodes is only allowed when type is Image",
        True,
    ),
    (
        "gp-retry-without-retry-expiry",
        GatePolicy,
        gate_policy_spec(gates=[gate(retry={"initialBackoffSeconds": 5})]),
        "retry is only used when onExpiry is Retry",
        True,
    ),
    (
        "gp-retry-backoff-inverted",
        GatePolicy,
        gate_policy_spec(
            gates=[
                gate(
                    onExpiry="Retry",
                    retry={"initialBackoffSeconds": 60, "maxBackoffSeconds": 30},
                )
            ]
        ),
        "initialBackoffSeconds cannot exceed maxBackoffSeconds",
        True,
    ),
    (
        "gp-retry-initial-above-default-max",
        GatePolicy,
        gate_policy_spec(gates=[gate(onExpiry="Retry", retry={"initialBackoffSeconds": 601})]),
        "initialBackoffSeconds cannot exceed maxBackoffSeconds",
        True,
    ),
    (
        "gp-zero-rate",
        GatePolicy,
        gate_policy_spec(pacing={"releasesPerSecond": 0}),
        "0",
        False,
    ),
    (
        "gp-zero-in-flight",
        GatePolicy,
        gate_policy_spec(pacing={"maxInFlight": 0}),
        "1",
        False,
    ),
    (
        "gp-in-without-values",
        GatePolicy,
        gate_policy_spec(selector={"matchExpressions": [{"key": "app", "operator": "In"}]}),
        "values must be non-empty for In and NotIn",
        True,
    ),
    (
        "gp-exists-with-values",
        GatePolicy,
        gate_policy_spec(
            selector={"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}
        ),
        "empty for Exists and DoesNotExist",
        True,
    ),
    (
        "gp-bad-operator",
        GatePolicy,
        gate_policy_spec(selector={"matchExpressions": [{"key": "a", "operator": "Gt"}]}),
        "In",
        False,
    ),
    # TeamQuota
    ("tq-no-team", TeamQuota, {"bands": {}}, "team", False),
    (
        "tq-negative-cpu",
        TeamQuota,
        team_quota_spec(bands={"batch": {"cpu": "-1"}}),
        "pattern",
        False,
    ),
    (
        "tq-negative-int-memory",
        TeamQuota,
        team_quota_spec(bands={"batch": {"memory": -5}}),
        "0",
        False,
    ),
    (
        "tq-bad-unit",
        TeamQuota,
        team_quota_spec(bands={"production": {"memory": "4GB"}}),
        "pattern",
        False,
    ),
    (
        "tq-float-cpu",
        TeamQuota,
        team_quota_spec(bands={"production": {"cpu": 0.5}}),
        "integer",
        False,
    ),
    (
        "tq-negative-pods",
        TeamQuota,
        team_quota_spec(bands={"production": {"pods": -1}}),
        "0",
        False,
    ),
    (
        "tq-bad-extended",
        TeamQuota,
        team_quota_spec(bands={"batch": {"extended": {"example.com/fpga": "lots"}}}),
        "pattern",
        False,
    ),
    # NodeMaintenance
    ("nm-no-nodes", NodeMaintenance, {"nodes": []}, "at least 1", False),
    ("nm-duplicate-nodes", NodeMaintenance, {"nodes": ["a", "a"]}, "duplicate", False),
    ("nm-bad-node-name", NodeMaintenance, {"nodes": ["Node_A"]}, "pattern", False),
    ("nm-zero-concurrency", NodeMaintenance, node_maintenance_spec(maxConcurrent=0), "1", False),
    (
        "nm-unknown-order",
        NodeMaintenance,
        node_maintenance_spec(order="Random"),
        "'Given' or 'FewestProductionFirst'",
        False,
    ),
    (
        "nm-zero-blocked-after",
        NodeMaintenance,
        node_maintenance_spec(blockedAfterSeconds=0),
        "greater than or equal to 1",
        False,
    ),
    (
        "nm-negative-batch-deadline",
        NodeMaintenance,
        node_maintenance_spec(batchTaskDeadlineSeconds=-1),
        "greater than or equal to 0",
        False,
    ),
    (
        "nm-string-one-per-zone",
        NodeMaintenance,
        node_maintenance_spec(onePerZone="yes"),
        "valid boolean",
        False,
    ),
]


@pytest.mark.parametrize(
    ("kind", "spec", "fragment", "cel_only"),
    [pytest.param(*case[1:], id=case[0]) for case in INVALID],
)
def test_invalid_specs_are_rejected(
    kind: type[Resource], spec: dict[str, Any], fragment: str, cel_only: bool
) -> None:
    obj = wire(kind, spec)
    with pytest.raises(ValidationError) as excinfo:
        kind.model_validate(obj)
    assert fragment in str(excinfo.value)

    schema_errors = builders.schema_errors(crdgen.openapi_schema(kind), obj)
    if cel_only:
        assert schema_errors == [], "the schema rejects it before CEL runs"
    else:
        assert schema_errors, "the CRD schema accepts what the model rejects"


VALID: list[tuple[str, type[Resource], dict[str, Any]]] = [
    ("sw-minimal", ServiceWorkload, service_workload_spec()),
    ("sw-zero-replicas", ServiceWorkload, service_workload_spec(replicas=0)),
    (
        "sw-percent-strategy",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": "25%", "maxUnavailable": "25%"}),
    ),
    (
        "sw-surge-zero-unavailable-one",
        ServiceWorkload,
        service_workload_spec(strategy={"maxSurge": 0, "maxUnavailable": 1}),
    ),
    (
        "sw-named-target-port",
        ServiceWorkload,
        service_workload_spec(
            service={"ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
        ),
    ),
    (
        "sw-full-placement",
        ServiceWorkload,
        service_workload_spec(
            placement={
                "zones": ["zone-a", "zone-b"],
                "nodeSelector": {"disk": "ssd"},
                "gpus": 8,
                "spread": "node",
            },
            atMostOne=True,
        ),
    ),
    ("bw-minimal", BatchWorkload, batch_workload_spec()),
    (
        "bw-gang-equal-to-both",
        BatchWorkload,
        batch_workload_spec(completions=8, parallelism=8, gang=8),
    ),
    ("bw-fractional-rate", BatchWorkload, batch_workload_spec(creationRate=0.5)),
    ("bw-best-effort", BatchWorkload, batch_workload_spec(band="best-effort")),
    ("gp-minimal", GatePolicy, gate_policy_spec()),
    ("gp-select-all", GatePolicy, gate_policy_spec(selector={})),
    (
        "gp-every-condition-type",
        GatePolicy,
        gate_policy_spec(
            gates=[
                gate("gates.pilotfish.io/signal"),
                gate("gates.pilotfish.io/quota", condition={"type": "Quota"}),
                gate("gates.pilotfish.io/image", condition={"type": "Image", "minNodes": 3}),
                gate("gates.pilotfish.io/gang", condition={"type": "Gang", "size": 4}),
            ]
        ),
    ),
    (
        "gp-retry",
        GatePolicy,
        gate_policy_spec(
            gates=[gate(onExpiry="Retry", retry={"initialBackoffSeconds": 5})],
            pacing={"releasesPerSecond": 0.5, "maxInFlight": 10},
        ),
    ),
    (
        "gp-custom-prefixes",
        GatePolicy,
        gate_policy_spec(
            allowedPrefixes=["team-a.example.com/", names.GATE_PREFIX],
            gates=[gate("team-a.example.com/ready"), gate()],
        ),
    ),
    (
        "gp-expressions",
        GatePolicy,
        gate_policy_spec(
            selector={
                "matchExpressions": [
                    {"key": "app", "operator": "In", "values": ["a", "b"]},
                    {"key": "pilotfish.io/team", "operator": "Exists"},
                ]
            }
        ),
    ),
    ("tq-minimal", TeamQuota, {"team": "payments"}),
    (
        "tq-every-band",
        TeamQuota,
        team_quota_spec(
            bands={
                "production": {"cpu": 100, "memory": "400Gi", "gpus": 8, "pods": 200},
                "batch": {"cpu": "1500m", "memory": "1.5e9", "extended": {"example.com/fpga": 2}},
                "best-effort": {"pods": 0},
            }
        ),
    ),
    ("nm-minimal", NodeMaintenance, node_maintenance_spec()),
    (
        "nm-full",
        NodeMaintenance,
        node_maintenance_spec(
            maxConcurrent=3,
            onePerZone=True,
            order="FewestProductionFirst",
            blockedAfterSeconds=60,
            batchTaskDeadlineSeconds=0,
            allowLocalStorage=True,
            reason="kernel",
            nodes=["n1.zone-a"],
        ),
    ),
]


@pytest.mark.parametrize(("kind", "spec"), [pytest.param(*case[1:], id=case[0]) for case in VALID])
def test_valid_specs_are_accepted(kind: type[Resource], spec: dict[str, Any]) -> None:
    obj = wire(kind, spec)
    kind.model_validate(obj)
    assert builders.schema_errors(crdgen.openapi_schema(kind), obj) == []


DEFAULTS: list[tuple[type[Resource], dict[str, Any], dict[str, Any]]] = [
    (
        ServiceWorkload,
        service_workload_spec(),
        {
            "replicas": 1,
            "band": "production",
            "atMostOne": False,
            "placement": {"gpus": 0, "spread": "zone"},
            "strategy": {
                "maxSurge": 1,
                "maxUnavailable": 0,
                "progressDeadlineSeconds": 600,
                "minReadySeconds": 0,
                "paused": False,
                "revisionHistoryLimit": 10,
            },
        },
    ),
    (
        ServiceWorkload,
        service_workload_spec(service={"ports": [{"name": "dns", "port": 53}]}),
        {"service": {"ports": [{"name": "dns", "port": 53, "protocol": "TCP"}]}},
    ),
    (
        BatchWorkload,
        batch_workload_spec(),
        {"band": "batch", "parallelism": 1},
    ),
    (
        GatePolicy,
        gate_policy_spec(),
        {
            "allowedPrefixes": [names.GATE_PREFIX],
            "gates": [{**gate(), "onExpiry": "Fail"}],
        },
    ),
    (
        GatePolicy,
        gate_policy_spec(gates=[gate(onExpiry="Retry", retry={})]),
        {
            "gates": [
                {
                    **gate(),
                    "onExpiry": "Retry",
                    "retry": {"initialBackoffSeconds": 10, "maxBackoffSeconds": 600},
                }
            ]
        },
    ),
    (TeamQuota, {"team": "payments"}, {"bands": {}}),
    (
        NodeMaintenance,
        node_maintenance_spec(),
        {
            "maxConcurrent": 1,
            "onePerZone": False,
            "order": "Given",
            "blockedAfterSeconds": 300,
            "batchTaskDeadlineSeconds": 600,
            "allowLocalStorage": False,
        },
    ),
]


@pytest.mark.parametrize(("kind", "spec", "expected"), DEFAULTS)
def test_defaults_are_applied(
    kind: type[Resource], spec: dict[str, Any], expected: dict[str, Any]
) -> None:
    dumped = kind.model_validate(wire(kind, spec)).model_dump(by_alias=True, exclude_none=True)
    for key, value in expected.items():
        assert dumped["spec"][key] == value, key
    # The API server fills in the same values.
    defaulted = builders.apply_defaults(crdgen.openapi_schema(kind), wire(kind, spec))
    assert defaulted == dumped


# --- building and parsing objects -------------------------------------------------------


def test_build_in_python_dump_for_the_api_server() -> None:
    sw = ServiceWorkload(
        metadata=ObjectMeta(name="checkout", namespace="team-payments"),
        spec=ServiceWorkloadSpec(
            team="payments",
            replicas=1,
            template=PodTemplate(spec={"containers": [{"name": "app", "image": "x"}]}),
            strategy=Strategy(max_surge="25%", max_unavailable=0),
            at_most_one=True,
        ),
    )
    body = sw.model_dump(by_alias=True, exclude_none=True)
    assert body["apiVersion"] == names.API_VERSION
    assert body["kind"] == "ServiceWorkload"
    assert body["metadata"] == {"name": "checkout", "namespace": "team-payments"}
    assert body["spec"]["atMostOne"] is True
    assert body["spec"]["strategy"]["maxSurge"] == "25%"
    assert "status" not in body
    assert builders.schema_errors(crdgen.openapi_schema(ServiceWorkload), body) == []


def test_parse_an_object_from_the_api_server() -> None:
    server_obj = builders.obj("ServiceWorkload", service_workload_spec(replicas=2))
    server_obj["metadata"].update(
        uid="0b6c",
        resourceVersion="42",
        generation=3,
        creationTimestamp="2024-05-01T10:00:00Z",
        labels={names.LABEL_TEAM: "payments"},
        managedFields=[{"manager": "kubectl", "operation": "Apply"}],
    )
    server_obj["status"] = {
        "replicas": 2,
        "readyReplicas": 1,
        "observedGeneration": 3,
        "selector": "app=web",
        "conditions": [
            {
                "type": "Available",
                "status": "False",
                "reason": "MinimumReplicasUnavailable",
                "message": "1 of 2 ready",
                "lastTransitionTime": "2024-05-01T10:00:05Z",
            }
        ],
    }
    sw = ServiceWorkload.model_validate(server_obj)
    assert sw.metadata.generation == 3
    assert sw.metadata.creation_timestamp == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert sw.status is not None
    assert sw.status.ready_replicas == 1
    available = sw.status.condition("Available")
    assert available is not None and available.reason == "MinimumReplicasUnavailable"
    assert sw.status.condition("Progressing") is None

    dumped = sw.model_dump(by_alias=True, exclude_none=True)
    # Fields Pilotfish does not model survive the round trip; times stay RFC 3339 strings.
    assert dumped["metadata"]["managedFields"] == server_obj["metadata"]["managedFields"]
    assert dumped["metadata"]["creationTimestamp"] == "2024-05-01T10:00:00Z"
    assert dumped["status"]["conditions"][0]["lastTransitionTime"] == "2024-05-01T10:00:05Z"


def test_unknown_fields_are_ignored_like_other_clients_do() -> None:
    spec = service_workload_spec(futureField={"x": 1})
    sw = ServiceWorkload.model_validate(wire(ServiceWorkload, spec))
    assert "futureField" not in sw.model_dump(by_alias=True)["spec"]


def test_template_keeps_every_pod_field() -> None:
    template = {
        "metadata": {"labels": {"app": "web"}, "annotations": {"a": "b"}, "finalizers": ["x"]},
        "spec": {"containers": [{"name": "c", "image": "i"}], "priorityClassName": "p"},
    }
    sw = ServiceWorkload.model_validate(
        wire(ServiceWorkload, service_workload_spec(template=template))
    )
    assert sw.model_dump(by_alias=True, exclude_none=True)["spec"]["template"] == template


def test_times_are_written_in_utc() -> None:
    eastern = datetime.fromisoformat("2024-05-01T12:00:00+02:00")
    condition = Condition(type="Ready", status="True", reason="Ok", last_transition_time=eastern)
    assert condition.model_dump(by_alias=True)["lastTransitionTime"] == "2024-05-01T10:00:00Z"
    with pytest.raises(ValidationError, match="timezone"):
        Condition.model_validate(
            {
                "type": "R",
                "status": "True",
                "reason": "Ok",
                "lastTransitionTime": "2024-05-01T10:00",
            }
        )


def test_condition_reasons_are_camel_case_identifiers() -> None:
    base = {"type": "Ready", "status": "True", "lastTransitionTime": "2024-05-01T10:00:00Z"}
    Condition.model_validate({**base, "reason": "QuotaExceeded"})
    for bad in ("", "quota exceeded", "1Reason"):
        with pytest.raises(ValidationError):
            Condition.model_validate({**base, "reason": bad})


def test_status_conditions_are_unique_by_type() -> None:
    condition = {
        "type": "Available",
        "status": "True",
        "reason": "Ok",
        "lastTransitionTime": "2024-05-01T10:00:00Z",
    }
    with pytest.raises(ValidationError, match="duplicate entry with type='Available'"):
        ServiceWorkloadStatus.model_validate({"conditions": [condition, condition]})


def test_python_names_are_snake_case_and_wire_names_camel_case() -> None:
    gate_obj = Gate(
        name="gates.pilotfish.io/ready",
        condition=GateCondition(type="GateSignal", signal_name="ready"),
        timeout_seconds=60,
        on_expiry="Review",
    )
    assert gate_obj.model_dump(by_alias=True, exclude_none=True) == {
        "name": "gates.pilotfish.io/ready",
        "condition": {"type": "GateSignal", "signalName": "ready"},
        "timeoutSeconds": 60,
        "onExpiry": "Review",
    }
    spec = GatePolicySpec.model_validate({"selector": {}, "gates": [gate_obj.model_dump()]})
    assert spec.gates == [gate_obj]


def test_constants_agree_with_names() -> None:
    assert get_args(Band) == names.BANDS
    for kind in ALL_KINDS:
        instance_fields = kind.model_fields
        assert instance_fields["api_version"].default == names.API_VERSION
        assert instance_fields["kind"].default == kind.__name__
        assert kind.crd.name.endswith("." + names.GROUP)


def test_kind_and_api_version_are_checked() -> None:
    obj = wire(NodeMaintenance, node_maintenance_spec())
    with pytest.raises(ValidationError):
        NodeMaintenance.model_validate({**obj, "kind": "TeamQuota"})
    with pytest.raises(ValidationError):
        NodeMaintenance.model_validate({**obj, "apiVersion": "pilotfish.io/v1"})


def test_bands_are_looked_up_by_label_value() -> None:
    tq = TeamQuota.model_validate(
        wire(
            TeamQuota,
            team_quota_spec(bands={"best-effort": {"pods": 5}, "production": {"cpu": "1"}}),
        )
    )
    assert tq.spec.bands.for_band("best-effort") == BandResources(pods=5)
    assert tq.spec.bands.for_band("production") == BandResources(cpu="1")
    assert tq.spec.bands.for_band("batch") is None
    assert "best-effort" in tq.model_dump(by_alias=True, exclude_none=True)["spec"]["bands"]


def exprs(key: str, operator: str, *values: str) -> dict[str, Any]:
    req: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        req["values"] = list(values)
    return {"matchExpressions": [req]}


SELECTOR_CASES: list[tuple[dict[str, Any], dict[str, str], bool]] = [
    ({}, {}, True),
    ({}, {"app": "web"}, True),
    ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
    ({"matchLabels": {"app": "web"}}, {"app": "db"}, False),
    ({"matchLabels": {"app": "web"}}, {}, False),
    (exprs("app", "In", "a", "b"), {"app": "b"}, True),
    (exprs("app", "In", "a"), {}, False),
    (exprs("app", "NotIn", "a"), {}, True),
    (exprs("app", "NotIn", "a"), {"app": "a"}, False),
    (exprs("app", "Exists"), {"app": ""}, True),
    (exprs("app", "Exists"), {}, False),
    (exprs("app", "DoesNotExist"), {}, True),
    (exprs("app", "DoesNotExist"), {"app": "x"}, False),
    ({"matchLabels": {"tier": "fe"}, **exprs("app", "Exists")}, {"tier": "fe"}, False),
]


@pytest.mark.parametrize(("selector", "labels", "expected"), SELECTOR_CASES)
def test_label_selector_matches(
    selector: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is expected


# --- properties -------------------------------------------------------------------------

_QUANTITY = re.compile(builders.go_regex(QUANTITY_PATTERN))


@given(st.one_of(st.text(alphabet="0123456789.+-eEinumkKMGTPi ", max_size=8), st.text(max_size=6)))
def test_quantity_strings_accepted_exactly_when_the_crd_pattern_matches(text: str) -> None:
    spec = team_quota_spec(bands={"batch": {"memory": text}})
    try:
        TeamQuota.model_validate(wire(TeamQuota, spec))
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == bool(_QUANTITY.search(text))


@given(builders.int_or_percent, builders.int_or_percent)
def test_strategy_rule_rejects_exactly_the_all_zero_pairs(surge: Any, unavailable: Any) -> None:
    both_zero = builders.is_zero(surge) and builders.is_zero(unavailable)
    try:
        Strategy(max_surge=surge, max_unavailable=unavailable)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted is not both_zero


@given(builders.service_workload_specs)
def test_round_trip_is_stable(spec: dict[str, Any]) -> None:
    once = ServiceWorkload.model_validate(wire(ServiceWorkload, spec))
    twice = ServiceWorkload.model_validate(once.model_dump(by_alias=True, exclude_none=True))
    assert twice == once
    assert twice.model_dump(by_alias=True) == once.model_dump(by_alias=True)
