"""The reclaim benchmark's figures: a node's batch figure read back, CPU used from kwok's
usage annotations, a spike's give-back from a recording, and the JSON object's verdict.
Objects are written by hand as the API would answer."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from benchmarks.probes import reclaim as probe
from pilotfish import names

USAGE = "kwok.x-k8s.io/usage-cpu"


def node(
    name: str,
    batch_cpu: str | None = "4000",
    state: str = "Measured",
    cpu: str = "8",
) -> dict[str, Any]:
    alloc: dict[str, str] = {"cpu": cpu, "memory": "40Gi"}
    if batch_cpu is not None:
        alloc[names.BATCH_CPU] = batch_cpu
        alloc[names.BATCH_MEMORY] = str(20 * 1024**3)
    detail = {"cpu": {"p95": "3200m", "margin": "800m", "batch": "4"}, "state": state}
    return {
        "metadata": {"name": name, "annotations": {names.ANNOTATION_RECLAIM: json.dumps(detail)}},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": names.CONDITION_BATCH_CAPACITY,
                    "status": "True" if state == "Measured" else "False",
                    "reason": state,
                    "message": "figures",
                },
            ],
        },
    }


def pod(
    name: str,
    node_name: str | None,
    band: str = "batch",
    usage: str | None = "1",
    batch_cpu: int | None = None,
    phase: str = "Running",
    deleting: bool = False,
    containers: int = 1,
    disrupted: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "labels": {names.LABEL_BAND: band},
        "annotations": {USAGE: usage} if usage is not None else {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    requests = {names.BATCH_CPU: str(batch_cpu)} if batch_cpu is not None else {"cpu": "1"}
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}", "resources": {"requests": requests}} for i in range(containers)
        ]
    }
    if node_name:
        spec["nodeName"] = node_name
    conditions = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "conditions": conditions}}


def test_a_node_figure_is_read_from_status_annotation_and_condition() -> None:
    f = probe.node_figure(node("n1"))
    assert (f.cpu, f.capacity_cpu, f.memory) == (4000, 4000, 20 * 1024**3)
    assert (f.allocatable_cpu, f.allocatable_memory) == (8000, 40 * 1024**3)
    assert f.measured
    assert f.shown("cpu", "p95") == 3200 and f.shown("cpu", "batch") == 4000
    assert f.shown("cpu", "missing") is None and f.shown("memory", "p95") is None
    stale = probe.node_figure(node("n2", batch_cpu=None, state="PrometheusUnavailable"))
    assert (stale.cpu, stale.measured, stale.reason) == (None, False, "PrometheusUnavailable")


def test_cpu_used_counts_running_bound_pods_per_container_by_band() -> None:
    nodes = [node("n1"), node("n2")]
    pods = [
        pod("prod", "n1", band="production", usage="3200m"),
        pod("two", "n1", usage="500m", containers=2),  # kwok: the annotation per container
        pod("bare", "n2", usage=None),  # kwok's default: 1m per container
        pod("pending", None),
        pod("leaving", "n2", deleting=True),
        pod("done", "n2", phase="Succeeded"),
        pod("elsewhere", "n9", usage="4"),
    ]
    u = probe.utilisation(nodes, pods)
    assert u.capacity_cores == 16
    assert u.production_cores == 3.2
    assert u.batch_cores == 1.001
    assert (u.batch_pods, u.pending_batch_pods) == (2, 1)
    assert u.as_json()["used_over_capacity"] == round(4.201 / 16, 4)


def test_batch_allocated_sums_live_batch_requests_on_the_node() -> None:
    pods = [
        pod("a", "n1", batch_cpu=900),
        pod("b", "n1", batch_cpu=900, deleting=True),
        pod("c", "n2", batch_cpu=900),
        pod("prod", "n1", band="production"),
    ]
    assert probe.allocated(pods, "n1") == 900


def spike_samples() -> tuple[list[probe.Sample], float]:
    """n1 spiked at t=10 (to 1600m): reduced at 14, one task evicted at 16, down to 1700m
    (within 2 % of 8 cores) at 18 with two tasks still there, fits at 20; n2 untouched."""
    prod = [pod("p1", "n1", band="production"), pod("p2", "n2", band="production")]

    def at(t: float, n1_cpu: str, n1_tasks: int) -> probe.Sample:
        tasks = [pod(f"t{i}", "n1", batch_cpu=900) for i in range(n1_tasks)]
        tasks.append(pod("other", "n2", batch_cpu=900))
        return probe.sample(t, [node("n1", n1_cpu), node("n2")], tasks, prod)

    samples = [
        at(9, "4000", 4),
        at(12, "4000", 4),
        at(14, "3000", 4),
        at(16, "2400", 3),
        at(18, "1700", 2),
        at(20, "1700", 1),
    ]
    return samples, 10.0


def test_give_back_times_each_step_from_the_spike() -> None:
    samples, spike_at = spike_samples()
    got = probe.give_back(samples, {"n1": 1600}, spike_at)
    assert (got["to_reduced_s"], got["to_first_eviction_s"], got["to_fits_s"]) == (4, 6, 10)
    assert got["batch_evicted_on_spiked"] == 3
    assert got["batch_left_other_nodes"] == 0
    assert got["production_evictions"] == 0
    assert got["figure_before_cores"] == {"n1": 4.0}
    assert got["figure_after_cores"] == {"n1": 1.7}


def test_give_back_not_seen_is_none_and_production_touched_is_counted() -> None:
    samples, spike_at = spike_samples()
    touched = probe.sample(
        21,
        [node("n1", "4000"), node("n2")],
        [pod(f"t{i}", "n1", batch_cpu=900) for i in range(4)],
        [pod("p1", "n1", band="production", disrupted=True)],
    )
    got = probe.give_back([samples[0], touched], {"n1": 1600}, spike_at)
    assert (got["to_reduced_s"], got["to_first_eviction_s"], got["to_fits_s"]) == (None,) * 3
    assert got["production_evictions"] == 2  # one marked for disruption, one gone
    assert got["batch_left_other_nodes"] == 1  # n2's task is gone too
    assert "error" in probe.give_back(samples[:1], {"n1": 1600}, spike_at)


def test_verdict_judges_the_spike_in_cycles() -> None:
    spike = {"to_reduced_s": 12.0, "to_first_eviction_s": 14.0, "to_fits_s": 70.0}
    ok = probe.verdict(0.84, {**spike, "production_evictions": 0}, 15.0, 0.6)
    assert ok["met"] and ok["figures"]["spike_to_fits_cycles"] == round(70 / 15, 2)
    slow = probe.verdict(0.84, {**spike, "to_reduced_s": 16.0, "production_evictions": 0}, 15, 0.6)
    assert not slow["met"] and not slow["checks"]["spike_to_reduced_cycles"]
    lost = probe.verdict(0.84, {**spike, "production_evictions": 0}, 15, 0.6, production_lost=1)
    assert not lost["checks"]["production_evictions"]
    low = probe.verdict(0.5, {**spike, "production_evictions": 0}, 15, 0.6)
    assert not low["checks"]["used_over_capacity_on"]
    none = probe.verdict(None, {}, 15, 0.6)
    assert not any(none["checks"].values())
    assert Fraction(none["figures"]["production_pods_lost_whole_run"]) == 0
