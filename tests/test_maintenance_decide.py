"""The drain planner: which nodes start, which pods go now, what holds the rest, and the
status, conditions and Events a round produces (pure: built from wire dicts)."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish import names
from pilotfish.api.nodemaintenance import NodeMaintenanceStatus
from pilotfish.operators.maintenance import decide as d
from pilotfish.operators.maintenance.model import Refusal
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


def plan(*args: Any, **kw: Any) -> d.Plan:
    out = d.decide(observed(*args, **kw))
    # Whatever the round, the status is one the CRD accepts.
    NodeMaintenanceStatus.model_validate(out.status)
    return out


def entry(p: d.Plan, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in p.status["nodes"] if n["name"] == name)
    return found


def blocker(p: d.Plan, node_name: str, pod_name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        b for b in entry(p, node_name)["blockers"] if b["pod"].endswith("/" + pod_name)
    )
    return found


def reasons(p: d.Plan) -> list[str]:
    return [e.reason for e in p.events]


def condition(p: d.Plan, type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in p.status["conditions"] if c["type"] == type_)
    return found


# --- nodes: cordon, order, concurrency ----------------------------------------------------


def test_a_pending_node_is_cordoned_and_drained_in_the_same_round() -> None:
    a = pod("a", "n1")
    p = plan(nm(["n1"]), [node("n1")], [a])
    assert p.cordon == (d.Cordon("n1", True),)
    assert p.evict == (ref(a),)
    assert entry(p, "n1")["state"] == d.DRAINING
    assert p.status["phase"] == "Draining" and p.status["progress"] == "0/1"
    assert p.status["observedGeneration"] == 4
    assert reasons(p) == [d.EVENT_DRAIN_STARTED]


def test_an_empty_node_is_cordoned_then_drained() -> None:
    p = plan(nm(["n1", "n2"]), [node("n1"), node("n2")], [pod("b", "n2")])
    assert p.cordon == (d.Cordon("n1", True),)
    assert entry(p, "n1")["state"] == d.CORDONED
    # It holds its slot (maxConcurrent 1) until the next round finds it drained.
    assert entry(p, "n2")["state"] == d.PENDING
    assert reasons(p) == [d.EVENT_DRAIN_STARTED]
    p = plan(nm(["n1", "n2"], status=p.status), [ours("n1"), node("n2")], [pod("b", "n2")])
    assert entry(p, "n1")["state"] == d.DRAINED
    assert reasons(p) == [d.EVENT_NODE_DRAINED, d.EVENT_DRAIN_STARTED]


def test_a_node_someone_else_cordoned_is_only_annotated() -> None:
    p = plan(nm(["n1"]), [node("n1", unschedulable=True)], [pod("a", "n1")])
    assert p.cordon == (d.Cordon("n1", False),)


def test_max_concurrent_nodes_start_in_the_order_given() -> None:
    nodes = [node(n) for n in ("n3", "n1", "n2")]
    pods = [pod(f"p{n}", n["metadata"]["name"]) for n in nodes]
    p = plan(nm(["n3", "n1", "n2"], maxConcurrent=2), nodes, pods)
    assert [c.node for c in p.cordon] == ["n3", "n1"]
    assert entry(p, "n2")["state"] == d.PENDING
    assert "maxConcurrent 2" in entry(p, "n2")["message"]
    assert {r.node for r in p.evict} == {"n3", "n1"}


def test_draining_nodes_hold_their_slots_until_drained() -> None:
    nodes = [ours("n1"), node("n2")]
    p = plan(nm(["n1", "n2"]), nodes, [pod("a", "n1"), pod("b", "n2")])
    assert p.cordon == () and entry(p, "n2")["state"] == d.PENDING
    # n1 empty: drained, and n2 starts in the same round.
    p = plan(nm(["n1", "n2"]), nodes, [pod("b", "n2")])
    assert entry(p, "n1")["state"] == d.DRAINED
    assert p.cordon == (d.Cordon("n2", True),)
    assert reasons(p) == [d.EVENT_NODE_DRAINED, d.EVENT_DRAIN_STARTED]


def test_one_per_zone_skips_to_a_node_of_another_zone() -> None:
    nodes = [node("a1", zone="a"), node("a2", zone="a"), node("b1", zone="b")]
    pods = [pod(f"p-{n}", n) for n in ("a1", "a2", "b1")]
    p = plan(nm(["a1", "a2", "b1"], maxConcurrent=3, onePerZone=True), nodes, pods)
    assert [c.node for c in p.cordon] == ["a1", "b1"]
    assert "zone a" in entry(p, "a2")["message"]


def test_fewest_production_pods_first_keeps_the_given_order_on_ties() -> None:
    prod = {names.LABEL_BAND: "production"}
    nodes = [node(n) for n in ("busy", "tie1", "tie2")]
    pods = [
        pod("p1", "busy", labels=prod),
        pod("p2", "busy", labels=prod),
        pod("p3", "tie1", labels=prod),
        pod("p4", "tie2", labels=prod),
        pod("batch", "tie2", labels={names.LABEL_BAND: "batch"}),
    ]
    spec = nm(["busy", "tie1", "tie2"], order="FewestProductionFirst", maxConcurrent=2)
    p = plan(spec, nodes, pods)
    assert [c.node for c in p.cordon] == ["tie1", "tie2"]


def test_a_missing_node_fails_and_the_rest_still_drain() -> None:
    p = plan(nm(["gone", "n1"]), [ours("n1")], [])
    assert entry(p, "gone")["state"] == d.FAILED
    assert "not found" in entry(p, "gone")["message"]
    assert entry(p, "n1")["state"] == d.DRAINED
    assert p.status["phase"] == "Failed"
    assert condition(p, d.CONDITION_COMPLETE)["reason"] == d.REASON_NODES_FAILED


def test_a_node_another_maintenance_drains_waits_and_names_it() -> None:
    other = node("n1", unschedulable=True, draining="kernel-patch")
    p = plan(nm(["n1", "n2"]), [other, node("n2")], [pod("a", "n1"), pod("b", "n2")])
    assert entry(p, "n1")["state"] == d.PENDING
    assert "NodeMaintenance kernel-patch" in entry(p, "n1")["message"]
    assert [c.node for c in p.cordon] == ["n2"] and [r.node for r in p.evict] == ["n2"]


def test_an_uncordoned_node_of_ours_is_cordoned_again() -> None:
    uncordoned = node("n1", draining=NM, cordoned_by=NM)
    p = plan(nm(["n1"]), [uncordoned], [pod("a", "n1")])
    assert p.cordon == (d.Cordon("n1", True),)
    assert entry(p, "n1")["state"] == d.DRAINING


# --- pods: what is evicted, what is left alone, what blocks -------------------------------


def test_daemonset_mirror_and_finished_pods_are_left_alone() -> None:
    pods = [
        pod("ds", "n1", owner="DaemonSet"),
        pod("static", "n1", owner="Node", mirror=True),
        pod("done", "n1", phase="Succeeded"),
        pod("failed", "n1", phase="Failed"),
    ]
    p = plan(nm(["n1"]), [ours("n1")], pods)
    assert p.evict == ()
    assert entry(p, "n1") == {"name": "n1", "state": d.DRAINED, "podsLeft": 0, "blockers": []}
    assert p.status["phase"] == "Done"
    assert condition(p, d.CONDITION_COMPLETE)["status"] == "True"
    assert reasons(p) == [d.EVENT_NODE_DRAINED, d.EVENT_COMPLETE]


def test_a_budget_is_spent_across_nodes_in_node_order() -> None:
    app = {"app": "web"}
    pods = [pod("w1", "n1", labels=app), pod("w2", "n2", labels=app), pod("w3", "n2", labels=app)]
    budget = pdb("web", 2, match=app)
    p = plan(nm(["n1", "n2"], maxConcurrent=2), [ours("n1"), ours("n2")], pods, pdbs=[budget])
    assert [r.name for r in p.evict] == ["w1", "w2"]
    held = blocker(p, "n2", "w3")
    assert held["reason"] == d.BLOCKER_BUDGET and held["budget"] == "team-a/web"
    # n2 evicted w2 this round: progress, not blocked.
    assert p.blocked_nodes == frozenset()


def test_a_budget_of_zero_blocks_and_names_itself() -> None:
    app = {"app": "web"}
    p = plan(
        nm(["n1"]), [ours("n1")], [pod("w1", "n1", labels=app)], pdbs=[pdb("web", 0, match=app)]
    )
    assert p.evict == ()
    held = blocker(p, "n1", "w1")
    assert held == {
        "pod": "team-a/w1",
        "reason": d.BLOCKER_BUDGET,
        "budget": "team-a/web",
        "message": "budget team-a/web allows no disruption now",
    }
    assert p.blocked_nodes == {"n1"}
    assert p.requeue_after == 300.0
    assert condition(p, d.CONDITION_BLOCKED)["status"] == "False"


@pytest.mark.parametrize("stale", [True, False], ids=["old-generation", "no-status"])
def test_a_budget_not_yet_computed_allows_nothing(stale: bool) -> None:
    app = {"app": "web"}
    budget = pdb("web", 3 if stale else None, match=app, stale=stale)
    p = plan(nm(["n1"]), [ours("n1")], [pod("w1", "n1", labels=app)], pdbs=[budget])
    assert p.evict == ()
    assert "not been computed" in blocker(p, "n1", "w1")["message"]


def test_budgets_select_by_namespace_and_expressions() -> None:
    expr = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}
    budgets = [
        pdb("web", 0, selector=expr),
        pdb("everything-elsewhere", 0, namespace="team-b", selector={}),
    ]
    pods = [pod("w", "n1", labels={"app": "web"}), pod("x", "n1", labels={"app": "api"})]
    p = plan(nm(["n1"]), [ours("n1")], pods, pdbs=budgets)
    assert [r.name for r in p.evict] == ["x"]


def test_a_pod_under_two_budgets_is_not_evicted() -> None:
    app = {"app": "web"}
    budgets = [pdb("a", 5, match=app), pdb("b", 5, selector={})]
    p = plan(nm(["n1"]), [ours("n1")], [pod("w", "n1", labels=app)], pdbs=budgets)
    assert p.evict == ()
    assert "more than one budget" in blocker(p, "n1", "w")["message"]


def test_a_single_replica_workload_waits_for_its_surge_replacement() -> None:
    old = sw_pod("api-old", "n1", "api")
    workloads = [workload("api", 1)]
    p = plan(nm(["n1"]), [ours("n1")], [old], workloads=workloads)
    assert p.evict == ()
    assert blocker(p, "n1", "api-old")["reason"] == d.BLOCKER_SURGE
    assert p.blocked_nodes == {"n1"}

    starting = sw_pod("api-new", "n9", "api", ready=False)
    p = plan(nm(["n1"]), [ours("n1")], [old], workloads=workloads, extra_pods=[starting])
    assert p.evict == ()

    ready = sw_pod("api-new", "n9", "api")
    p = plan(nm(["n1"]), [ours("n1")], [old], workloads=workloads, extra_pods=[ready])
    assert p.evict == (ref(old),)


def test_a_replacement_on_another_maintenance_s_node_does_not_count() -> None:
    old = sw_pod("api-old", "n1", "api")
    elsewhere = sw_pod("api-new", "n9", "api")
    nodes = [ours("n1"), node("n9", unschedulable=True, draining="other")]
    p = plan(nm(["n1"]), nodes, [old], workloads=[workload("api", 1)], extra_pods=[elsewhere])
    assert p.evict == ()


def test_surge_first_pods_leave_one_at_a_time_while_replicas_stay_ready() -> None:
    # maxUnavailable 0 with 3 replicas, two of them on the node and one surge Ready.
    pods = [sw_pod("w1", "n1", "web"), sw_pod("w2", "n1", "web")]
    others = [sw_pod("w3", "n5", "web"), sw_pod("w-surge", "n6", "web")]
    p = plan(nm(["n1"]), [ours("n1")], pods, workloads=[workload("web", 3)], extra_pods=others)
    assert [r.name for r in p.evict] == ["w1"]
    assert blocker(p, "n1", "w2")["reason"] == d.BLOCKER_SURGE


def test_a_workload_that_tolerates_unavailability_is_not_surged() -> None:
    pods = [sw_pod("w1", "n1", "web"), sw_pod("w2", "n1", "web")]
    wl = workload("web", 3, max_surge=0, max_unavailable=1)
    p = plan(nm(["n1"]), [ours("n1")], pods, workloads=[wl])
    assert [r.name for r in p.evict] == ["w1", "w2"]


def test_percent_strategies_resolve_against_replicas() -> None:
    # 25% of 3 rounds down to 0 unavailable: surge-first.
    wl = workload("web", 3, max_surge="25%", max_unavailable="25%")
    p = plan(nm(["n1"]), [ours("n1")], [sw_pod("w1", "n1", "web")], workloads=[wl])
    assert p.evict == ()


def test_an_at_most_one_pod_is_evicted_without_a_surge() -> None:
    single = sw_pod("db-0", "n1", "db", epoch=True)
    wl = workload("db", 1, at_most_one=True)
    p = plan(nm(["n1"]), [ours("n1")], [single], workloads=[wl])
    assert p.evict == (ref(single),)


def test_a_batch_task_may_finish_until_its_deadline() -> None:
    task = batch_pod("task-0", "n1")
    spec = nm(["n1"], batchTaskDeadlineSeconds=600)
    p = plan(spec, [ours("n1")], [task], draining_for={"n1": 420.0})
    assert p.evict == ()
    assert blocker(p, "n1", "task-0")["reason"] == d.BLOCKER_BATCH
    assert p.requeue_after == pytest.approx(180.0)
    # A bounded wait: not a blocked drain.
    assert p.blocked_nodes == frozenset()

    p = plan(spec, [ours("n1")], [task], draining_for={"n1": 600.0})
    assert p.evict == (ref(task),)


def test_a_batch_task_on_a_node_just_started_gets_the_whole_deadline() -> None:
    p = plan(nm(["n1"], batchTaskDeadlineSeconds=60), [node("n1")], [batch_pod("t", "n1")])
    assert p.evict == () and p.requeue_after == 60.0


def test_local_storage_needs_the_opt_in() -> None:
    scratch = pod("cache", "n1", empty_dir=True)
    p = plan(nm(["n1"]), [ours("n1")], [scratch])
    assert blocker(p, "n1", "cache")["reason"] == d.BLOCKER_LOCAL_STORAGE
    assert p.blocked_nodes == {"n1"}
    p = plan(nm(["n1"], allowLocalStorage=True), [ours("n1")], [scratch])
    assert p.evict == (ref(scratch),)


def test_a_refused_eviction_is_retried_and_reported() -> None:
    a = pod("a", "n1")
    refusal = Refusal("team-a/web", "Cannot evict pod as it would violate the budget.")
    p = plan(nm(["n1"]), [ours("n1")], [a], refused={ref(a): refusal})
    assert p.evict == (ref(a),)
    assert blocker(p, "n1", "a") == {
        "pod": "team-a/a",
        "reason": d.BLOCKER_REFUSED,
        "budget": "team-a/web",
        "message": refusal.message,
    }
    assert p.blocked_nodes == {"n1"}


def test_a_terminating_pod_is_waited_for_without_blocking() -> None:
    p = plan(nm(["n1"]), [ours("n1")], [pod("a", "n1", terminating=True)])
    assert p.evict == ()
    assert entry(p, "n1")["podsLeft"] == 1
    assert blocker(p, "n1", "a")["reason"] == d.BLOCKER_TERMINATING
    assert p.blocked_nodes == frozenset() and p.requeue_after is None


# --- blocked: condition, Event, requeue ---------------------------------------------------


def blocked_round(blocked_for: float, status: dict[str, Any] | None = None) -> d.Plan:
    app = {"app": "web"}
    return plan(
        nm(["n1"], blockedAfterSeconds=120, status=status),
        [ours("n1")],
        [pod("w1", "n1", labels=app)],
        pdbs=[pdb("web", 0, match=app)],
        blocked_for={"n1": blocked_for},
    )


def test_a_drain_blocked_long_enough_gets_the_condition_and_one_event() -> None:
    early = blocked_round(100.0)
    assert condition(early, d.CONDITION_BLOCKED)["status"] == "False"
    assert early.requeue_after == pytest.approx(20.0)
    assert d.EVENT_DRAIN_BLOCKED not in reasons(early)

    late = blocked_round(120.0, status=early.status)
    cond = condition(late, d.CONDITION_BLOCKED)
    assert cond["status"] == "True" and cond["reason"] == d.REASON_DRAIN_BLOCKED
    assert "team-a/web" in cond["message"] and "team-a/w1" in cond["message"]
    events = [e for e in late.events if e.reason == d.EVENT_DRAIN_BLOCKED]
    assert len(events) == 1 and events[0].type_ == "Warning"
    assert "team-a/web" in events[0].note and "team-a/w1" in events[0].note
    assert late.requeue_after is None

    again = blocked_round(500.0, status=late.status)
    assert condition(again, d.CONDITION_BLOCKED)["status"] == "True"
    assert reasons(again) == []
    assert condition(again, d.CONDITION_BLOCKED)["lastTransitionTime"] == cond["lastTransitionTime"]


def test_events_only_on_transitions_since_the_status_read() -> None:
    first = plan(nm(["n1"]), [node("n1")], [pod("a", "n1")])
    assert reasons(first) == [d.EVENT_DRAIN_STARTED]
    second = plan(nm(["n1"], status=first.status), [ours("n1")], [pod("a", "n1")])
    assert reasons(second) == []
    done = plan(nm(["n1"], status=second.status), [ours("n1")], [])
    assert reasons(done) == [d.EVENT_NODE_DRAINED, d.EVENT_COMPLETE]
    assert reasons(plan(nm(["n1"], status=done.status), [ours("n1")], [])) == []


def test_blockers_listed_per_node_are_bounded() -> None:
    pods = [pod(f"cache-{i}", "n1", empty_dir=True) for i in range(30)]
    p = plan(nm(["n1"]), [ours("n1")], pods)
    assert len(entry(p, "n1")["blockers"]) == 20
    assert entry(p, "n1")["podsLeft"] == 30
    assert "10 not listed" in entry(p, "n1")["message"]


# --- release on deletion ------------------------------------------------------------------


def test_release_names_every_node_this_maintenance_marked() -> None:
    nodes: dict[str, dict[str, Any] | None] = {
        "mine": ours("mine"),
        "annotated": node("annotated", unschedulable=True, draining=NM),
        "theirs": node("theirs", unschedulable=True, draining="other", cordoned_by="other"),
        "plain": node("plain"),
        "gone": None,
    }
    assert d.release(NM, nodes) == ("mine", "annotated")
    assert d.owns_cordon(NM, ours("mine"))
    assert not d.owns_cordon(NM, node("annotated", unschedulable=True, draining=NM))
