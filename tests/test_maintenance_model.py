"""What the maintenance planner reads of the wire objects (`observe`), and the status shape
the CRD accepts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pilotfish.api.nodemaintenance import NodeMaintenance, NodeMaintenanceStatus
from pilotfish.kube import projections
from pilotfish.operators.maintenance import model
from pilotfish.operators.maintenance.budgets import BudgetView
from pilotfish.operators.maintenance.model import Refusal
from pilotfish.operators.maintenance.surge import surge_first
from tests.drain_planner_harness import (
    NM,
    batch_pod,
    nm,
    node,
    observed,
    ours,
    pdb,
    pod,
    ref,
    sw_pod,
    workload,
)


def test_spec_defaults_match_the_crd() -> None:
    spec = NodeMaintenance.model_validate(nm(["a"])).spec
    parsed = model.parse_spec({"nodes": ["a"]})
    assert parsed == model.Spec(
        nodes=("a",),
        max_concurrent=spec.max_concurrent,
        one_per_zone=spec.one_per_zone,
        order=spec.order,
        blocked_after_seconds=float(spec.blocked_after_seconds),
        batch_task_deadline_seconds=float(spec.batch_task_deadline_seconds),
        allow_local_storage=spec.allow_local_storage,
    )


def test_a_malformed_spec_field_reads_as_its_default() -> None:
    parsed = model.parse_spec(
        {"nodes": ["a", "a", "b"], "maxConcurrent": 0, "order": "Random", "onePerZone": "yes"}
    )
    assert parsed.nodes == ("a", "b")
    assert parsed.max_concurrent == 1
    assert parsed.order == model.ORDER_GIVEN and parsed.one_per_zone is False


def test_nodes_in_spec_order_with_their_annotations_and_zone() -> None:
    obs = observed(
        nm(["n2", "gone", "n1"]),
        [node("n1", zone="z1"), ours("n2", zone="z2")],
    )
    assert [n.name for n in obs.nodes] == ["n2", "gone", "n1"]
    n2, gone, n1 = obs.nodes
    assert n2.found and n2.unschedulable and n2.draining_by == NM and n2.cordoned_by == NM
    assert n2.zone == "z2" and n1.zone == "z1" and n1.draining_by is None
    assert not gone.found
    assert obs.generation == 4 and obs.name == NM


def test_pods_the_drain_leaves_alone_are_not_seen() -> None:
    pods = [
        pod("ds", "n1", owner="DaemonSet"),
        pod("static", "n1", mirror=True),
        pod("done", "n1", phase="Succeeded"),
        pod("web", "n1", labels={"pilotfish.io/band": "production"}),
        pod("gone", "n1", terminating=True),
    ]
    (n1,) = observed(nm(["n1"]), [ours("n1")], pods).nodes
    assert [p.ref.name for p in n1.pods] == ["web", "gone"]
    assert n1.production_pods == 1
    assert [p.terminating for p in n1.pods] == [False, True]


def test_local_storage_survives_the_pod_projection() -> None:
    projected = projections.pod(pod("cache", "n1", empty_dir=True))
    plain = projections.pod(pod("web", "n1"))
    (n1,) = observed(nm(["n1"]), [ours("n1")], [projected, plain]).nodes
    assert [p.local_storage for p in n1.pods] == [True, False]


def test_pod_kinds_and_budgets() -> None:
    pods = [
        sw_pod("api-0", "n1", "api", labels={"app": "api"}),
        pod("fake", "n1", labels={"pilotfish.io/workload": "api"}),  # no controller ref
        batch_pod("task", "n1"),
        sw_pod("db-0", "n1", "db", epoch=True),
    ]
    budgets = [pdb("api", 1, match={"app": "api"}), pdb("other-ns", 1, namespace="b", selector={})]
    a = pods[0]
    refusal = Refusal("team-a/api", "429")
    obs = observed(nm(["n1"]), [ours("n1")], pods, pdbs=budgets, refused={ref(a): refusal})
    api, fake, task, db = obs.nodes[0].pods
    assert api.workload == ("team-a", "api") and api.budgets == ("team-a/api",)
    assert api.refusal == refusal and fake.refusal is None
    assert fake.workload is None
    assert task.batch and not api.batch
    assert db.at_most_one and not api.at_most_one
    assert obs.budgets["team-a/api"] == BudgetView("team-a/api", 1, "")


def test_a_null_selector_selects_nothing_and_an_empty_one_everything() -> None:
    budgets = [pdb("none", 1, selector=None), pdb("all", 1, selector={})]
    budgets[0]["spec"]["selector"] = None
    obs = observed(nm(["n1"]), [ours("n1")], [pod("p", "n1")], pdbs=budgets)
    assert obs.nodes[0].pods[0].budgets == ("team-a/all",)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"replicas": 1, "max_unavailable": 1}, True),
        ({"replicas": 3}, True),
        ({"replicas": 3, "max_surge": 0, "max_unavailable": 1}, False),
        ({"replicas": 4, "max_unavailable": "25%"}, False),
        ({"replicas": 3, "max_unavailable": "25%"}, True),
        ({"replicas": 1, "at_most_one": True}, False),
    ],
)
def test_surge_first_workloads(spec: dict[str, Any], expected: bool) -> None:
    assert surge_first(workload("w", **spec)) is expected


def test_ready_replicas_counted_for_a_surge_exclude_other_maintenances() -> None:
    pods = [sw_pod("w-0", "n1", "web")]
    elsewhere = [
        sw_pod("w-1", "n5", "web"),
        sw_pod("w-2", "n6", "web"),  # on another maintenance's node
        sw_pod("w-3", "n7", "web", ready=False),
        sw_pod("w-4", "n7", "web", terminating=True),
    ]
    nodes = [ours("n1"), node("n6", unschedulable=True, draining="other")]
    obs = observed(nm(["n1"]), nodes, pods, workloads=[workload("web", 3)], extra_pods=elsewhere)
    view = obs.surge[("team-a", "web")]
    assert view.replicas == 3
    assert view.ready == {"team-a/w-0", "team-a/w-1"}


def test_workloads_that_may_lose_a_replica_have_no_surge_view() -> None:
    pods = [sw_pod("w-0", "n1", "web")]
    wl = workload("web", 3, max_surge=0, max_unavailable=1)
    assert observed(nm(["n1"]), [ours("n1")], pods, workloads=[wl]).surge == {}


def test_clocks_come_from_the_controller() -> None:
    obs = observed(
        nm(["n1"]),
        [ours("n1")],
        draining_for={"n1": 12.5, "other": 1.0},
        blocked_for={"n1": 3.0},
    )
    assert obs.nodes[0].draining_for == 12.5 and obs.nodes[0].blocked_for == 3.0


# --- the status shape ---------------------------------------------------------------------


def status(**overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "phase": "Draining",
        "progress": "1/2",
        "nodes": [
            {"name": "n1", "state": "Drained", "podsLeft": 0},
            {
                "name": "n2",
                "state": "Draining",
                "podsLeft": 1,
                "blockers": [
                    {
                        "pod": "team-a/web-1",
                        "reason": "DisruptionBudget",
                        "budget": "team-a/web",
                        "message": "budget team-a/web allows no disruption now",
                    }
                ],
            },
        ],
    }
    out.update(overrides)
    return out


def test_a_status_round_trips() -> None:
    parsed = NodeMaintenanceStatus.model_validate(status())
    dumped = parsed.model_dump(by_alias=True, exclude_none=True)
    assert dumped["nodes"][1]["blockers"][0]["budget"] == "team-a/web"
    assert dumped["nodes"][0]["blockers"] == []


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"progress": "half"}, "progress\n  String should match pattern"),
        ({"phase": "Paused"}, "phase\n  Input should be 'Pending', 'Draining', 'Done' or 'Failed'"),
        (
            {"nodes": [{"name": "n1", "state": "Gone"}]},
            "nodes.0.state\n  Input should be 'Pending', 'Cordoned', 'Draining', 'Drained' or "
            "'Failed' [type=literal_error, input_value='Gone'",
        ),
        (
            {"nodes": [{"name": "n1", "state": "Pending"}, {"name": "n1", "state": "Pending"}]},
            "duplicate entry with name='n1'",
        ),
        (
            {"nodes": [{"name": "n1", "state": "Draining", "podsLeft": -1}]},
            "nodes.0.podsLeft\n  Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_status_names_the_field_the_value_and_the_rule(
    overrides: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValidationError) as excinfo:
        NodeMaintenanceStatus.model_validate(status(**overrides))
    assert fragment in str(excinfo.value)


def test_a_bad_spec_names_the_field_the_value_and_the_rule() -> None:
    with pytest.raises(ValidationError) as excinfo:
        NodeMaintenance.model_validate(nm(["n1"], blockedAfterSeconds=0))
    text = str(excinfo.value)
    assert "spec.blockedAfterSeconds" in text
    assert "greater than or equal to 1" in text and "input_value=0" in text
