"""The batch gang gate in the gate controller's pure round: a BatchWorkload's first
`spec.gang` tasks go to the scheduler together or not at all, sized by the workload (matched
by the owner reference's uid), never by a pod, and through the same gang path as GatePolicy
gangs (quota for the gang as a whole, exactly-once completion of a begun release).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pilotfish import gates, names
from pilotfish.gates import GateRecord
from pilotfish.operators.gates.model import ANNOTATION_RELEASED, PodView, pod_view
from pilotfish.operators.gates.plan import Expire, Flag, Plan, RemoveGate
from tests.test_gates_builders import (
    NOW,
    condition,
    decide,
    of,
    pod,
    rec,
    released,
    signal,
    team_quota,
    ts,
    view,
    world,
)

GANG = gates.GANG_GATE
UID = "uid-train"


def gang_rec(workload: str = "train", deadline: float | None = None) -> GateRecord:
    """The record the mutating webhook writes for a task pod carrying the gang gate."""
    timeout = gates.GANG_TIMEOUT_SECONDS
    return GateRecord(
        policy=gates.GANG_POLICY,
        generation=0,
        condition=gates.gang_condition(workload),
        timeout_seconds=timeout,
        deadline=ts(timeout if deadline is None else deadline),
        on_expiry="Review",
    )


def quota_rec() -> GateRecord:
    return GateRecord(
        policy=gates.QUOTA_POLICY,
        generation=1,
        condition={"type": "Quota"},
        timeout_seconds=86400,
        deadline=ts(86400),
        on_expiry="Review",
    )


def task_pod(
    name: str,
    *,
    workload: str = "train",
    uid: str = UID,
    extra: dict[str, GateRecord] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    owner = (workload, uid) if uid else None
    return pod(name, {GANG: gang_rec(workload), **(extra or {})}, gang=workload, owner=owner, **kw)


def task(name: str, **kw: Any) -> PodView:
    return pod_view(task_pod(name, **kw))


def batch(name: str = "train", uid: str = UID, gang: Any = 3, ns: str = "team-a") -> dict[str, Any]:
    spec: dict[str, Any] = {"completions": 10, "parallelism": 10}
    if gang is not None:
        spec["gang"] = gang
    return {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "generation": 1},
        "spec": spec,
    }


def message(d: Plan, name: str) -> str:
    c = condition(d, name)
    assert c is not None, f"no State condition written for {name}"
    return c.message


# --- size from the BatchWorkload ------------------------------------------------------------


def test_all_members_present_and_ready_go_together() -> None:
    d = decide(world([task(n) for n in "abc"], batches=[batch(gang=3)]), NOW)
    assert released(d) == ["a", "b", "c"]
    evidence = {a.evidence for a in of(d, RemoveGate)}
    assert evidence == {"gang train: 3/3 pods present, 3 ready"}


def test_fewer_members_than_spec_gang_hold_and_say_how_many_exist() -> None:
    d = decide(world([task("a"), task("b")], batches=[batch(gang=3)]), NOW)
    assert of(d, RemoveGate) == []
    assert message(d, "a") == f"waiting for {GANG} (gang train: 2/3 pods present)"
    assert of(d, Flag) == [], "waiting for members is not a forgery"


def test_the_size_is_the_workloads_not_the_pods() -> None:
    """Two tasks of a workload whose spec.gang is 2 go; the same two under spec.gang 4 stay."""
    members = [task("a"), task("b")]
    assert released(decide(world(members, batches=[batch(gang=2)]), NOW)) == ["a", "b"]
    assert released(decide(world(members, batches=[batch(gang=4)]), NOW)) == []


def test_one_member_waiting_on_another_gate_holds_the_whole_gang() -> None:
    late = {"data": rec(signal="not-yet", policy="late")}
    members = [task("a"), task("b"), task("c", extra=late)]
    d = decide(world(members, signals=[signal("data")], batches=[batch(gang=3)]), NOW)
    assert of(d, RemoveGate) == []
    assert message(d, "a") == f"waiting for {GANG} (gang train: 2/3 pods ready)"
    assert "c waits for gates.pilotfish.io/data" in d.waiting["team-a/a"]


@pytest.mark.parametrize(
    ("batches", "says"),
    [
        ([], "gang train: BatchWorkload team-a/train not found"),
        (
            [batch(uid="uid-new")],
            "gang train: BatchWorkload team-a/train has uid uid-new, not the uid-train its pods "
            "are owned by",
        ),
        ([batch(gang=None)], "cannot size it: it has no spec.gang"),
        ([batch(gang=0)], "cannot size it: its spec.gang 0 is not a positive integer"),
        ([batch(gang="3")], "cannot size it: its spec.gang '3' is not a positive integer"),
        ([batch(ns="team-b")], "gang train: BatchWorkload team-a/train not found"),
    ],
)
def test_a_gang_its_workload_cannot_size_is_held_with_a_clear_verdict(
    batches: list[dict[str, Any]], says: str
) -> None:
    members = [task(n) for n in "abc"]
    d = decide(world(members, batches=batches), NOW)
    assert of(d, RemoveGate) == []
    assert says in message(d, "a")
    assert says in d.waiting["team-a/a"]
    assert of(d, Flag) == [], "held, not flagged: the workload may appear or be fixed"


# --- membership: owned by that very workload ------------------------------------------------


def test_a_pod_only_labelled_with_the_workloads_name_is_no_member() -> None:
    """A pod of the namespace carrying the gang label but not owned by the workload (its own
    GatePolicy gang of one, say) neither completes nor releases the workload's gang."""
    stranger = view("x", {"pgang": rec("Gang", size=1, policy="solo")}, gang="train")
    d = decide(world([task("a"), task("b"), stranger], batches=[batch(gang=3)]), NOW)
    assert released(d) == ["x"], "the stranger is its own policy's gang of one"
    assert message(d, "a") == f"waiting for {GANG} (gang train: 2/3 pods present)"


def test_a_recreated_workload_is_a_new_gang() -> None:
    """Pods of a deleted workload (old uid, not yet collected) are not members of the new
    workload of the same name, and are held: their workload is gone."""
    old = [task(n, uid="uid-old") for n in ("o1", "o2")]
    new = [task(n) for n in "ab"]
    d = decide(world([*old, *new], batches=[batch(gang=2)]), NOW)
    assert released(d) == ["a", "b"]
    assert "has uid uid-train, not the uid-old" in message(d, "o1")


def test_a_forged_owner_reference_only_holds_the_forgers_own_pod() -> None:
    """Owner references name objects of the pod's own namespace only (the garbage collector
    resolves them there), so a tenant of team-b copying team-a's workload name and uid into
    its pod's owner reference gets a pod that waits for a team-b/train that does not exist:
    team-a's gang neither counts it nor waits for it. Within one namespace the owner is the
    same team, which may edit its workload anyway; a pod forged there only joins (and can
    only hold) that team's own gang."""
    forged = task("x", ns="team-b")
    assert forged.namespace == "team-b" and forged.batch_owner == ("train", UID)
    two = [task("a"), task("b")]
    d = decide(world([*two, forged], batches=[batch(gang=3)]), NOW)
    assert of(d, RemoveGate) == [], "team-a's gang is still 2/3"
    assert message(d, "a") == f"waiting for {GANG} (gang train: 2/3 pods present)"
    assert "BatchWorkload team-b/train not found" in message(d, "x")
    d2 = decide(world([*two, task("c"), forged], batches=[batch(gang=3)]), NOW)
    assert released(d2) == ["a", "b", "c"], "and the forged pod does not hold it back"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda raw: raw["metadata"].pop("ownerReferences"),
            "the pod has no controller ownerReference to a BatchWorkload",
        ),
        (
            lambda raw: raw["metadata"]["ownerReferences"][0].update(name="other"),
            "its controller is other",
        ),
    ],
)
def test_an_owner_reference_changed_after_admission_holds_and_flags_the_pod(
    change: Any, why: str
) -> None:
    """An orphaned task (owner reference removed) has no workload to size its gang: held,
    flagged for a person, never released on the record's word."""
    raw = task_pod("c")
    change(raw)
    d = decide(world([task("a"), task("b"), pod_view(raw)], batches=[batch(gang=3)]), NOW)
    assert of(d, RemoveGate) == []
    [flag] = of(d, Flag)
    assert flag.pod.name == "c" and why in flag.why


@pytest.mark.parametrize(
    "forged",
    [
        {"type": "Gang", "workload": "train", "size": 1},
        {"type": "Gang", "size": 1},
        {"type": "Quota"},
    ],
)
def test_a_batch_gang_record_not_of_the_rules_shape_is_untrusted(forged: dict[str, Any]) -> None:
    bad = GateRecord(
        policy=gates.GANG_POLICY,
        generation=0,
        condition=forged,
        timeout_seconds=60,
        deadline=ts(60),
    )
    raw = task_pod("a")
    raw["metadata"]["annotations"][gates.ANNOTATION_RECORD] = gates.PodGates(
        ts(0), {GANG: bad}
    ).encode()
    d = decide(world([pod_view(raw)], batches=[batch(gang=1)]), NOW)
    assert of(d, RemoveGate) == []
    [flag] = of(d, Flag)
    assert "is not a batch gang's" in flag.why


def test_the_batch_gang_rule_only_puts_the_gang_gate() -> None:
    other = gates.GANG_GATE.replace("gang", "other")
    raw = pod("a", {other: gang_rec()}, gang="train", owner=("train", UID))
    d = decide(world([pod_view(raw)], batches=[batch(gang=1)]), NOW)
    [flag] = of(d, Flag)
    assert f"a batch gang puts only {GANG}" in flag.why


# --- quota for the gang as a whole ---------------------------------------------------------


@pytest.mark.parametrize(("limit", "expect"), [("2", []), ("3", ["a", "b", "c"])])
def test_a_gang_over_quota_holds_as_a_whole(limit: str, expect: list[str]) -> None:
    members = [task(n, extra={gates.QUOTA_GATE: quota_rec()}, team="t") for n in "abc"]
    quotas = [team_quota("t", batch={"cpu": limit})]
    d = decide(world(members, quotas=quotas, batches=[batch(gang=3)]), NOW)
    assert released(d) == expect
    if not expect:
        assert "cpu" in message(d, "a")


# --- a begun release is finished -----------------------------------------------------------


def finished_member(name: str) -> PodView:
    """A member the gang released in an earlier round (its release recorded on it), which
    has run to completion since."""
    raw = task_pod(name, phase="Succeeded")
    raw["spec"]["schedulingGates"] = []
    entry = {"at": ts(-5), "evidence": "gang train: 3/3", "decidedFrom": "9", "actor": "x"}
    raw["metadata"]["annotations"][ANNOTATION_RELEASED] = json.dumps({GANG: entry})
    return pod_view(raw)


def test_a_release_interrupted_after_some_members_is_completed() -> None:
    """kill -9 after a's release was written; a's task then finished before the restarted
    controller looked. b and c still go: the gang's release was decided once already."""
    members = [finished_member("a"), task("b"), task("c")]
    d = decide(world(members, batches=[batch(gang=3)]), NOW)
    assert released(d) == ["b", "c"]
    assert {a.evidence for a in of(d, RemoveGate)} == {
        "gang train: its release began in an earlier round (1 of 3 released); releasing the rest"
    }


def test_without_a_recorded_release_a_finished_member_does_not_count() -> None:
    done = task("a", phase="Succeeded")
    d = decide(world([done, task("b"), task("c")], batches=[batch(gang=3)]), NOW)
    assert of(d, RemoveGate) == []


# --- expiry: a person is asked, nothing fails ----------------------------------------------


def test_a_gang_waiting_past_its_deadline_is_flagged_for_review_and_stays() -> None:
    raw = task_pod("a")
    raw["metadata"]["annotations"][gates.ANNOTATION_RECORD] = gates.PodGates(
        ts(0), {GANG: gang_rec(deadline=-1)}
    ).encode()
    d = decide(world([pod_view(raw)], batches=[batch(gang=2)]), NOW)
    [exp] = of(d, Expire)
    assert (exp.gate, exp.action) == (GANG, "Review")
    assert of(d, RemoveGate) == []
    assert "gang train: 1/2 pods present" in exp.evidence


def test_the_webhooks_default_terms_wait_a_day_then_review() -> None:
    assert gates.GANG_TIMEOUT_SECONDS == 24 * 3600
    assert gang_rec().on_expiry == "Review"
