"""The maintenance recording's figures: Ready counts that leave out terminating pods, budget
violations, nodes held by the drain, at-most-one copies, surge-before-eviction, refused
evictions from metrics and kubectl output, and the JSON object's verdict. Samples are
written by hand as the API would answer."""

from __future__ import annotations

import argparse
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from benchmarks.probes import maintenance as probe
from pilotfish import names
from pilotfish.workloads import LABEL_WORKLOAD

NS = "bench"
WEB = f"{NS}/web"


def pod(
    name: str,
    node: str,
    ready: bool = True,
    deleting: bool = False,
    phase: str = "Running",
    workload: str | None = "web",
    epoch: int | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {}}
    if workload:
        meta["labels"][LABEL_WORKLOAD] = workload
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    if epoch is not None:
        meta["annotations"] = {names.ANNOTATION_EPOCH: str(epoch)}
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node(name: str, cordoned_by: str | None = None, unschedulable: bool = False) -> Any:
    annotations = {}
    if cordoned_by:
        annotations = {
            names.ANNOTATION_CORDONED_BY: cordoned_by,
            names.ANNOTATION_DRAINING: cordoned_by,
        }
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"unschedulable": True} if unschedulable or cordoned_by else {},
    }


def nm(phase: str, **states: str) -> dict[str, Any]:
    return {
        "status": {"phase": phase, "nodes": [{"name": n, "state": s} for n, s in states.items()]}
    }


def test_a_terminating_pod_is_not_ready_but_still_live() -> None:
    s = probe.sample(0, [pod("a", "n1", deleting=True), pod("b", "n2")], [])
    assert s.ready(WEB) == 1
    assert len(s.live(WEB)) == 2
    done = probe.sample(0, [pod("a", "n1", phase="Failed"), pod("b", "n2", ready=False)], [])
    assert (done.ready(WEB), len(done.live(WEB))) == (0, 1)


def test_budget_violations_name_the_sample_and_the_workload() -> None:
    samples = [
        probe.sample(1.0, [pod("a", "n1"), pod("b", "n2"), pod("c", "n3")], []),
        probe.sample(1.5, [pod("a", "n1", deleting=True), pod("b", "n2"), pod("c", "n3")], []),
        probe.sample(2.0, [pod("a", "n1", deleting=True), pod("b", "n2", deleting=True)], []),
    ]
    assert probe.budget_violations(samples[:2], {WEB: 2}) == []
    assert probe.budget_violations(samples, {WEB: 2}) == ["t=2.0 bench/web: 0 Ready < 2"]
    assert probe.fewest_ready(samples, WEB) == 0
    assert probe.fewest_ready([], WEB) is None


def test_holding_nodes_are_the_maintenances_cordoned_nodes_with_live_pods() -> None:
    nodes = [node("n1", "m"), node("n2", "m"), node("n3", unschedulable=True), node("n4")]
    pods = [pod("a", "n1"), pod("b", "n3"), pod("c", "n4"), pod("d", "n2", phase="Succeeded")]
    s = probe.sample(0, pods, nodes)
    assert probe.holding_nodes(s, "m") == {"n1"}  # n2's pod finished; n3 is someone else's
    two = probe.sample(1, [*pods, pod("e", "n2")], nodes)
    assert probe.most_holding([s, two], "m") == 2
    assert probe.most_holding([s, two], "other") == 0


def test_in_flight_counts_the_maintenances_own_cordoned_and_draining_states() -> None:
    samples = [
        probe.sample(0, [], [], nm("Draining", n1="Draining", n2="Pending")),
        probe.sample(1, [], [], nm("Draining", n1="Drained", n2="Cordoned", n3="Draining")),
        probe.sample(2, [], [], None),
    ]
    assert probe.most_in_flight(samples) == 2
    assert samples[0].phase == "Draining" and samples[2].phase is None


def test_most_live_counts_a_stopping_at_most_one_copy() -> None:
    old, new = pod("a", "n1", deleting=True, epoch=1), pod("b", "n2", ready=False, epoch=2)
    moved = [probe.sample(0, [old], []), probe.sample(1, [pod("b", "n2", epoch=2)], [])]
    assert probe.most_live(moved, WEB) == 1
    assert probe.most_live([probe.sample(2, [old, new], [])], WEB) == 2
    assert probe.sample(0, [old], []).pods[0].epoch == 1


def test_surge_before_eviction() -> None:
    old = f"{NS}/a"
    surged = [
        probe.sample(0, [pod("a", "n1")], []),
        probe.sample(1, [pod("a", "n1"), pod("b", "n2", ready=False)], []),
        probe.sample(2, [pod("a", "n1"), pod("b", "n2")], []),
        probe.sample(3, [pod("a", "n1", deleting=True), pod("b", "n2")], []),
    ]
    assert probe.surge_before_eviction(surged, WEB, old) is None
    evicted_first = [
        probe.sample(0, [pod("a", "n1")], []),
        probe.sample(1, [pod("a", "n1", deleting=True), pod("b", "n2", ready=False)], []),
    ]
    assert probe.surge_before_eviction(evicted_first, WEB, old) == (
        "t=1.0: bench/a terminating, none Ready"
    )
    gone = [probe.sample(0, [pod("a", "n1")], []), probe.sample(1, [], [])]
    assert probe.surge_before_eviction(gone, WEB, old) == "t=1.0: bench/a gone, none Ready"
    assert probe.surge_before_eviction(surged[:3], WEB, old) == "bench/a was never seen leaving"


def exposition(refused: int | None) -> str:
    registry = CollectorRegistry()
    c = Counter("pilotfish_maintenance_evictions", "Evictions.", ["result"], registry=registry)
    c.labels("evicted").inc(7)
    if refused is not None:
        c.labels("refused").inc(refused)
    return generate_latest(registry).decode()


def test_refused_evictions_from_the_operators_metrics() -> None:
    assert probe.refused_evictions(exposition(3)) == 3
    assert probe.refused_evictions(exposition(None)) == 0  # the counter exists, none refused
    assert probe.refused_evictions("# TYPE other_total counter\nother_total 4\n") is None
    labelled = 'pilotfish_maintenance_evictions_total{result="refused",node="n\\"1"} 2.0\n'
    assert probe.refused_evictions(labelled) == 2


def test_kubectl_refusals_are_counted_from_its_output() -> None:
    line = (
        'error when evicting pods/"web-1" -n "bench" (will retry after 5s): '
        f"{probe.KUBECTL_REFUSED}.\n"
    )
    assert probe.kubectl_refusals("evicting pod bench/web-1\n" + line * 3) == 3
    assert probe.kubectl_refusals("node/n1 drained\n") == 0


def test_pods_on_counts_live_pods_of_the_nodes() -> None:
    s = probe.sample(0, [pod("a", "n1"), pod("b", "n1", phase="Failed"), pod("c", "n2")], [])
    assert probe.pods_on(s, ["n1"]) == 1
    assert probe.pods_on(s, ["n1", "n2"]) == 2


def test_result_ratio_and_verdict() -> None:
    inputs = vars(argparse.Namespace(nodes=100))
    met = probe.result(inputs, {"seconds": 30.0, "violations": 0}, {"seconds": 120.0}, 0.3)
    assert (met["ratio"], met["violations"], met["met"]) == (0.25, 0, True)
    slow = probe.result(inputs, {"seconds": 60.0, "violations": 0}, {"seconds": 120.0}, 0.3)
    assert (slow["ratio"], slow["met_by_figure"]["ratio"], slow["met"]) == (0.5, False, False)
    broken = probe.result(inputs, {"seconds": 30.0, "violations": 2}, {"seconds": 120.0}, 0.3)
    assert (broken["violations"], broken["met"]) == (2, False)
    failed = probe.result(inputs, {"error": "TimeoutError"}, {"seconds": 120.0}, 0.3)
    assert (failed["ratio"], failed["met"]) == (None, False)


def test_a_budget_allows_only_once_its_status_is_of_its_spec() -> None:
    def pdb(generation: int, observed: int, allowed: int) -> dict[str, Any]:
        return {
            "metadata": {"generation": generation},
            "status": {"observedGeneration": observed, "disruptionsAllowed": allowed},
        }

    assert probe.budget_allows(pdb(1, 1, 1), 1)
    assert not probe.budget_allows(pdb(1, 1, 0), 1)
    assert not probe.budget_allows(pdb(2, 1, 1), 1)  # not processed yet: the API refuses
    assert not probe.budget_allows({"metadata": {"generation": 1}}, 1)


def test_a_budget_the_disruption_controller_could_not_sync() -> None:
    def pdb(reason: str) -> dict[str, Any]:
        cond = {"type": "DisruptionAllowed", "status": "False", "reason": reason}
        return {"status": {"conditions": [cond]}}

    assert probe.budget_sync_failed(pdb("SyncFailed"))
    assert not probe.budget_sync_failed(pdb("InsufficientPods"))
    assert not probe.budget_sync_failed({})
