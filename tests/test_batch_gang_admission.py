"""The batch gang gate at admission: a pod carrying it is a BatchWorkload's gang task (its
controller owner reference and its gang label name the workload) and gets the gate's record;
any other pod carrying it is refused naming the gate and the rule.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
import pytest

from pilotfish import gates, names, timeutil
from pilotfish.gates import read_record, scheduling_gates
from pilotfish.webhooks import pods
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.quota import QUOTA_GATE
from pilotfish.webhooks.teamview import TeamSnapshot
from tests import builders

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
GANG = gates.GANG_GATE
RULE = (
    f"gate {GANG} is the batch gang gate: only task pods of a BatchWorkload carry it (a "
    "controller ownerReference of kind BatchWorkload, apiVersion pilotfish.io/v1alpha1, and "
    "label pilotfish.io/gang set to that BatchWorkload's name)"
)


def owner_ref(kind: str = "BatchWorkload", name: str = "train", **kw: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": names.API_VERSION,
        "kind": kind,
        "name": name,
        "uid": "uid-train",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    ref.update(kw)
    return ref


def task(
    *,
    refs: list[dict[str, Any]] | None = None,
    gang: str | None = "train",
    gated: bool = True,
    cpu: str = "1",
    app: str = "train",
) -> dict[str, Any]:
    """A gang task as the batch operator creates it."""
    labels = {"app": app, "pilotfish.io/batchworkload": "train", "pilotfish.io/task-index": "0"}
    if gang is not None:
        labels[gates.LABEL_GANG] = gang
    meta: dict[str, Any] = {
        "name": "train-0-0",
        "namespace": "shop",
        "uid": "u1",
        "labels": labels,
        "ownerReferences": [owner_ref()] if refs is None else refs,
    }
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]
    }
    if gated:
        spec["schedulingGates"] = [{"name": GANG}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def request(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": "r",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "shop",
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:pilotfish-system:pilotfish-batch"},
        "object": obj,
    }


def team(used: str = "0") -> TeamSnapshot:
    tq = {
        "metadata": {"name": "payments", "generation": 3, "resourceVersion": "7"},
        "spec": {"team": "payments", "bands": {"batch": {"cpu": "10"}}},
        "status": {"used": {"batch": {"cpu": used}}},
    }
    return TeamSnapshot({"shop": {names.LABEL_TEAM: "payments"}}, (tq,))


def policy(gates_: list[dict[str, Any]], selector: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = builders.obj("GatePolicy", {"selector": selector or {}, "gates": gates_})
    obj["metadata"] = {"name": "nightly", "namespace": "shop", "generation": 4}
    return obj


def admitted(
    obj: dict[str, Any], view: GateView | None = None, snapshot: TeamSnapshot | None = None
) -> tuple[dict[str, Any], Decision]:
    view = view or GateView()
    decision = pods.mutate(request(obj), view, NOW, snapshot, "pilotfish-scheduler")
    assert decision.allowed, decision.message
    out: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(obj), list(decision.patch))
    checked = pods.validate(request(out), view, snapshot, "pilotfish-scheduler")
    assert checked.allowed, checked.message
    return out, decision


def test_a_gang_task_gets_the_gang_record() -> None:
    pod, _ = admitted(task(), snapshot=team())
    assert scheduling_gates(pod) == [GANG], "kept, not added twice"
    record = read_record(pod)
    assert record is not None
    [(gate, entry)] = record.gates.items()
    assert gate == GANG
    assert entry.policy == gates.GANG_POLICY
    assert entry.condition == {"type": "Gang", "workload": "train"}
    assert entry.owner == names.SA_OPERATOR
    assert (entry.timeout_seconds, entry.on_expiry) == (24 * 3600, "Review")
    assert entry.deadline == timeutil.format_time(NOW + timedelta(days=1))
    assert pod["metadata"]["labels"][gates.LABEL_GATED] == "true"


def test_outside_tenant_namespaces_too() -> None:
    """Without a team view (tools, system namespaces) the gang rule still applies."""
    pod, _ = admitted(task())
    record = read_record(pod)
    assert record is not None and record.gates[GANG].policy == gates.GANG_POLICY


REFUSED = [
    ("no owner", task(refs=[]), "this pod has no controller ownerReference to a BatchWorkload"),
    (
        "owned by a Job",
        task(refs=[owner_ref("Job", apiVersion="batch/v1")]),
        "this pod has no controller ownerReference to a BatchWorkload",
    ),
    (
        "owner not the controller",
        task(refs=[owner_ref(controller=False)]),
        "this pod has no controller ownerReference to a BatchWorkload",
    ),
    (
        "another apiVersion",
        task(refs=[owner_ref(apiVersion="pilotfish.io/v2")]),
        "this pod has no controller ownerReference to a BatchWorkload",
    ),
    ("no gang label", task(gang=None), "this pod has no pilotfish.io/gang label"),
    ("empty gang label", task(gang=""), "this pod has no pilotfish.io/gang label"),
    (
        "another workload's gang",
        task(gang="other"),
        "this pod's pilotfish.io/gang is 'other' but its controller is BatchWorkload 'train'",
    ),
]


@pytest.mark.parametrize(("obj", "why"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_any_other_pod_carrying_the_gate_is_refused_naming_gate_and_rule(
    obj: dict[str, Any], why: str
) -> None:
    decision = pods.mutate(request(obj), GateView(), NOW, team(), "pilotfish-scheduler")
    assert not decision.allowed
    assert decision.message == f"{RULE}; {why}"
    # The validating review says the same of a pod that reached it unmutated.
    checked = pods.validate(request(obj), GateView(), team(), "pilotfish-scheduler")
    assert not checked.allowed and f"{RULE}; {why}" in checked.message


def test_a_forged_gang_record_does_not_get_a_pod_past_validation() -> None:
    """A record claiming the batch gang on a pod without the shape: refused, whatever the
    record says (the mutating webhook would also have overwritten it)."""
    obj = task(refs=[])
    record = pods.gang_gate_record("train", NOW)
    obj["metadata"]["annotations"] = {
        gates.ANNOTATION_RECORD: gates.PodGates("x", {GANG: record}).encode()
    }
    checked = pods.validate(request(obj), GateView(), team(), "pilotfish-scheduler")
    assert not checked.allowed and RULE in checked.message


def test_a_task_without_the_gate_is_not_judged_by_the_gang_rule() -> None:
    pod, _ = admitted(task(gated=False, refs=[]), snapshot=team())
    assert scheduling_gates(pod) == []


def test_the_batch_gang_wins_over_a_policy_declaring_the_same_gate_name() -> None:
    view = GateView.from_objects(
        [policy([builders.gate(GANG, condition={"type": "Gang", "size": 2})])]
    )
    pod, decision = admitted(task(), view, team())
    record = read_record(pod)
    assert record is not None and record.gates[GANG].policy == gates.GANG_POLICY
    assert (
        f"gate {GANG} is put on this pod by Pilotfish ((batch gang)); the declaration of "
        "GatePolicy nightly does not apply to it"
    ) in decision.warnings


def test_a_policy_gate_of_that_name_on_other_pods_is_still_the_policys() -> None:
    """A GatePolicy may name one of its gates gates.pilotfish.io/gang; on the pods it gates
    (which do not carry it at creation) it keeps the policy's terms."""
    view = GateView.from_objects(
        [policy([builders.gate(GANG, condition={"type": "Gang", "size": 2})])]
    )
    plain = task(gated=False, refs=[], gang="g1")
    pod, _ = admitted(plain, view, team())
    record = read_record(pod)
    assert scheduling_gates(pod) == [GANG]
    assert record is not None and record.gates[GANG].policy == "nightly"
    assert record.gates[GANG].condition == {"type": "Gang", "size": 2}


def test_a_gang_task_over_quota_waits_behind_both_gates() -> None:
    pod, decision = admitted(task(cpu="8"), snapshot=team(used="6"))
    assert scheduling_gates(pod) == [GANG, QUOTA_GATE]
    record = read_record(pod)
    assert record is not None
    assert record.gates[QUOTA_GATE].policy == gates.QUOTA_POLICY
    assert record.gates[GANG].policy == gates.GANG_POLICY
    assert any(w.startswith("waiting for quota:") for w in decision.warnings)


def test_a_gang_task_within_quota_is_reserved_at_admission() -> None:
    """Held behind the gang gate it keeps the room it was admitted with: the gang waits for
    its members, not for quota it already holds."""
    pod, _ = admitted(task(cpu="2"), snapshot=team(used="6"))
    assert scheduling_gates(pod) == [GANG]
    verdict = pods.quota_verdict(request(pod), team(used="6"), NOW)
    assert isinstance(verdict, pods.Reserve)
