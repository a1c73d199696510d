"""GatePolicy status, decided: the pure decision and the views it reads.

The decision gets views built from plain dicts, so each rule (gated count, validity, when
not to write) is one small test; the gated-pod index is fed informer events by hand.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pilotfish import gates
from pilotfish.conditions import CONDITION_MESSAGE_MAX
from pilotfish.operators.gatepolicy.decide import (
    CONDITION_VALID,
    REASON_GATE_CONFLICT,
    REASON_UNREADABLE,
    REASON_VALID,
    decide,
    validity,
)
from pilotfish.operators.gatepolicy.model import GatedPods, PolicyView, holds, policy_view
from pilotfish.timeutil import format_time
from tests.builders import gate, gate_policy_spec

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=5)
NS = "team-a"


def policy(name: str = "p", spec: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "GatePolicy",
        "metadata": {
            "name": name,
            "namespace": NS,
            "generation": 3,
            "resourceVersion": "rv-7",
            **meta,
        },
        "spec": spec if spec is not None else gate_policy_spec(),
    }


def with_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "status": status}


def view(name: str = "p", spec: dict[str, Any] | None = None) -> PolicyView:
    return policy_view(policy(name, spec))


# --- views --------------------------------------------------------------------------------


def test_policy_view_fills_defaults_so_equal_terms_compare_equal() -> None:
    explicit = view(spec=gate_policy_spec(gates=[gate(onExpiry="Fail")]))
    implicit = view()
    assert explicit.gates == implicit.gates
    assert implicit.gates["gates.pilotfish.io/data-ready"] == {
        "condition": {"type": "GateSignal", "signalName": "data-ready"},
        "timeoutSeconds": 600,
        "onExpiry": "Fail",
    }
    assert (implicit.generation, implicit.resource_version, implicit.error) == (3, "rv-7", "")


def test_policy_view_says_where_an_unreadable_policy_is_wrong() -> None:
    bad = view(spec=gate_policy_spec(gates=[gate(timeoutSeconds=0)]))
    assert bad.gates == {}
    assert bad.error.startswith("spec.gates.0.timeoutSeconds: "), bad.error
    assert "greater than or equal to 1" in bad.error


def pod(
    name: str,
    held: dict[str, str],
    recorded: dict[str, str] | None = None,
    *,
    phase: str = "Pending",
    deleting: bool = False,
    namespace: str = NS,
) -> dict[str, Any]:
    """A pod with scheduling gates `held` (gate -> policy) and a record of `recorded` (the
    gates it was created with; `held` when not given)."""
    record = gates.PodGates(
        "2026-03-01T11:00:00Z",
        {
            g: gates.GateRecord(p, 1, {"type": "GateSignal"}, 60, "2026-03-01T11:01:00Z")
            for g, p in (recorded if recorded is not None else held).items()
        },
    )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "annotations": {gates.ANNOTATION_RECORD: record.encode()},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-03-01T11:30:00Z"
    return {
        "metadata": meta,
        "spec": {"schedulingGates": [{"name": g} for g in held]},
        "status": {"phase": phase},
    }


A, B = "gates.pilotfish.io/a", "gates.pilotfish.io/b"


def test_a_pod_holds_the_policies_of_the_gates_still_on_it() -> None:
    assert holds(pod("x", {A: "p", B: "q"})) == {(NS, "p"), (NS, "q")}
    # Gate b released: only a's policy is still holding the pod.
    assert holds(pod("x", {A: "p"}, {A: "p", B: "q"})) == {(NS, "p")}
    assert holds(pod("x", {}, {A: "p"})) == frozenset()


@pytest.mark.parametrize(
    "gone",
    [
        {"phase": "Succeeded"},
        {"phase": "Failed"},
        {"deleting": True},
    ],
)
def test_a_finished_or_deleted_pod_holds_nothing(gone: dict[str, Any]) -> None:
    assert holds(pod("x", {A: "p"}, **gone)) == frozenset()


def test_a_gate_without_a_record_or_a_bad_record_holds_for_no_policy() -> None:
    unrecorded = pod("x", {A: "p"}, {})
    assert holds(unrecorded) == frozenset()
    forged = pod("x", {A: "p"})
    forged["metadata"]["annotations"][gates.ANNOTATION_RECORD] = "{not json"
    assert holds(forged) == frozenset()
    assert holds({"metadata": {"name": "plain", "namespace": NS}}) == frozenset()


def test_gated_pods_follows_every_change_of_every_pod() -> None:
    index = GatedPods()
    index.observe("ADDED", pod("x", {A: "p", B: "q"}), None)
    index.observe("ADDED", pod("y", {A: "p"}), None)
    index.observe("ADDED", pod("z", {A: "p"}, namespace="team-b"), None)
    assert (index.count(NS, "p"), index.count(NS, "q"), index.count("team-b", "p")) == (2, 1, 1)
    index.observe("SYNC", pod("y", {A: "p"}), None)  # a resync counts nothing twice
    assert index.count(NS, "p") == 2
    index.observe("MODIFIED", pod("x", {B: "q"}, {A: "p", B: "q"}), None)
    assert (index.count(NS, "p"), index.count(NS, "q")) == (1, 1)
    index.observe("MODIFIED", pod("x", {}, {A: "p", B: "q"}), None)
    index.observe("DELETED", pod("y", {A: "p"}), None)
    assert (index.count(NS, "p"), index.count(NS, "q")) == (0, 0)
    assert index.count("team-b", "p") == 1


# --- validity -----------------------------------------------------------------------------


def test_a_readable_policy_without_conflicts_is_valid() -> None:
    v = validity(view("b"), [view("a", gate_policy_spec(gates=[gate(A)]))])
    assert (v.valid, v.reason) == (True, REASON_VALID)


def test_an_unreadable_policy_says_where_and_what_admission_does() -> None:
    v = validity(view(spec=gate_policy_spec(gates=[gate(timeoutSeconds=0)])), [])
    assert (v.valid, v.reason) == (False, REASON_UNREADABLE)
    assert v.message.startswith("cannot be read (spec.gates.0.timeoutSeconds: ")
    assert "admission refuses new pods in namespace team-a" in v.message


def test_a_gate_declared_first_elsewhere_with_other_terms_is_a_conflict() -> None:
    first = view("a", gate_policy_spec(gates=[gate(A, timeoutSeconds=30)]))
    mine = view("b", gate_policy_spec(gates=[gate(A, timeoutSeconds=60, onExpiry="Review")]))
    v = validity(mine, [first])
    assert (v.valid, v.reason) == (False, REASON_GATE_CONFLICT)
    assert v.message == (
        f'gate {A} is also declared by GatePolicy a with other terms (onExpiry "Review" '
        'here, "Fail" in a, timeoutSeconds 60 here, 30 in a); for pods both select, the '
        "terms of a apply (the first by name wins)"
    )
    # The first by name is unaffected: its terms are the ones in force.
    assert validity(first, [mine]).valid


def test_the_same_gate_with_the_same_terms_or_from_a_later_policy_is_no_conflict() -> None:
    same = view("a", gate_policy_spec(gates=[gate(A, onExpiry="Fail")]))
    assert validity(view("b", gate_policy_spec(gates=[gate(A)])), [same]).valid
    later = view("c", gate_policy_spec(gates=[gate(A, timeoutSeconds=5)]))
    assert validity(view("b", gate_policy_spec(gates=[gate(A)])), [later]).valid


def test_an_unreadable_earlier_policy_declares_nothing() -> None:
    broken = view("a", gate_policy_spec(gates=[gate(A, timeoutSeconds=0)]))
    assert validity(view("b", gate_policy_spec(gates=[gate(A)])), [broken]).valid


# --- the decision -------------------------------------------------------------------------


def test_a_new_policy_gets_its_whole_status() -> None:
    plan = decide(view(), [], 4, NOW)
    assert plan is not None
    assert (plan.namespace, plan.name, plan.resource_version) == (NS, "p", "rv-7")
    assert plan.status == {
        "observedGeneration": 3,
        "gatedPods": 4,
        "conditions": [
            {
                "type": CONDITION_VALID,
                "status": "True",
                "reason": REASON_VALID,
                "message": "the policy's gates go on the pods it selects as written",
                "lastTransitionTime": format_time(NOW),
                "observedGeneration": 3,
            }
        ],
    }


def test_nothing_is_written_while_nothing_changed() -> None:
    plan = decide(view(), [], 4, NOW)
    assert plan is not None
    current = policy_view(with_status(policy(), dict(plan.status)))
    assert decide(current, [], 4, LATER) is None


def test_a_changed_count_is_written_and_the_transition_time_kept() -> None:
    first = decide(view(), [], 4, NOW)
    assert first is not None
    current = policy_view(with_status(policy(), dict(first.status)))
    plan = decide(current, [], 1, LATER)
    assert plan is not None and plan.status["gatedPods"] == 1
    assert plan.status["conditions"][0]["lastTransitionTime"] == format_time(NOW)


def test_turning_invalid_moves_the_transition_time_and_keeps_other_conditions() -> None:
    other = {"type": "Other", "status": "True", "reason": "X", "lastTransitionTime": "t"}
    first = decide(view("b", gate_policy_spec(gates=[gate(A)])), [], 0, NOW)
    assert first is not None
    status = {**first.status, "conditions": [other, *first.status["conditions"]]}
    current = policy_view(with_status(policy("b", gate_policy_spec(gates=[gate(A)])), status))
    rival = view("a", gate_policy_spec(gates=[gate(A, timeoutSeconds=1)]))
    plan = decide(current, [rival], 0, LATER)
    assert plan is not None
    kept, valid = plan.status["conditions"]
    assert kept == other
    assert (valid["status"], valid["reason"]) == ("False", REASON_GATE_CONFLICT)
    assert valid["lastTransitionTime"] == format_time(LATER)


def test_a_new_generation_is_observed() -> None:
    first = decide(view(), [], 0, NOW)
    assert first is not None
    edited = policy_view(with_status(policy(generation=4), dict(first.status)))
    plan = decide(edited, [], 0, LATER)
    assert plan is not None
    assert plan.status["observedGeneration"] == 4
    assert plan.status["conditions"][0]["observedGeneration"] == 4


def test_a_tenant_s_long_conflicts_are_cut_to_the_condition_bound() -> None:
    """The message quotes the tenant's terms (16 gates, 253-character signal names): its
    length is the condition's bound, not the tenant's."""

    def gates_with(signal: str) -> list[dict[str, Any]]:
        return [
            gate(f"gates.pilotfish.io/g{i}", condition={"type": "GateSignal", "signalName": signal})
            for i in range(16)
        ]

    first = view("a", gate_policy_spec(gates=gates_with("x" * 253)))
    mine = view("b", gate_policy_spec(gates=gates_with("y" * 253)))
    assert len(validity(mine, [first]).message) > 4 * CONDITION_MESSAGE_MAX
    plan = decide(mine, [first], 0, NOW)
    assert plan is not None
    [valid] = [c for c in plan.status["conditions"] if c["type"] == CONDITION_VALID]
    assert valid["reason"] == REASON_GATE_CONFLICT
    assert len(valid["message"]) == CONDITION_MESSAGE_MAX
