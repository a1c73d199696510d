"""The pure parts of benchmarks/scale.py: what a sample reads from the operator's and the
scheduler's metrics and from /proc, how the pods are split into workloads, and which figures
a sweep flags as growing faster than the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.probes import scale as sc
from benchmarks.probes.scheduling import reading

OPERATOR_PAGE = """\
# TYPE pilotfish_operator_queue_depth gauge
pilotfish_operator_queue_depth{controller="serviceworkload"} 7.0
pilotfish_operator_queue_depth{controller="batchworkload"} 3.0
# TYPE pilotfish_batch_pods_created_total counter
pilotfish_batch_pods_created_total{outcome="ok"} 400.0
pilotfish_batch_pods_created_total{outcome="refused"} 12.0
# TYPE pilotfish_rollout_pod_actions_total counter
pilotfish_rollout_pod_actions_total{action="create",outcome="ok"} 200.0
pilotfish_rollout_pod_actions_total{action="create",outcome="failed"} 5.0
pilotfish_rollout_pod_actions_total{action="delete",outcome="ok"} 9.0
"""

SCHEDULER_PAGE = """\
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 590
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 40
scheduler_schedule_attempts_total{profile="other",result="scheduled"} 10
"""

PROC_STATUS = """\
Name:\tpython
VmPeak:\t  900000 kB
VmHWM:\t  307200 kB
VmRSS:\t  204800 kB
Threads:\t4
"""


def test_created_pods_count_only_successful_creates_of_both_controllers() -> None:
    assert sc.pods_created(reading(OPERATOR_PAGE)) == 600


def test_queue_depths_are_per_controller() -> None:
    assert sc.queue_depths(reading(OPERATOR_PAGE)) == {"batchworkload": 3, "serviceworkload": 7}


def test_scheduled_counts_every_profile_and_no_failed_attempt() -> None:
    assert sc.scheduled(reading(SCHEDULER_PAGE)) == 600


def test_process_figures_read_rss_and_its_peak_from_proc_status() -> None:
    assert sc.process_figures(12.345, PROC_STATUS) == {
        "cpu_seconds": 12.35,
        "rss_mb": 200.0,
        "peak_rss_mb": 300.0,
    }
    assert sc.process_figures(None, None) == {
        "cpu_seconds": None,
        "rss_mb": None,
        "peak_rss_mb": None,
    }


def test_used_is_cpu_spent_between_readings_with_the_last_peak() -> None:
    before = {"etcd": {"cpu_seconds": 10.0, "peak_rss_mb": 50.0}}
    after = {
        "etcd": {"cpu_seconds": 14.5, "peak_rss_mb": 80.0},
        "kwok": {"cpu_seconds": 3.0, "peak_rss_mb": 20.0},  # not seen before: unknown spend
    }
    assert sc.used(before, after) == {
        "etcd": {"cpu_seconds": 4.5, "peak_rss_mb": 80.0},
        "kwok": {"cpu_seconds": None, "peak_rss_mb": 20.0},
    }


@pytest.mark.parametrize(
    ("total", "per", "parts"),
    [(10_000, 100, [100] * 100), (250, 100, [100, 100, 50]), (7, 100, [7]), (0, 100, [])],
)
def test_split_keeps_every_pod_in_parts_of_at_most_per(
    total: int, per: int, parts: list[int]
) -> None:
    assert sc.split(total, per) == parts
    assert sum(sc.split(total, per)) == total


def test_a_serviceworkload_belongs_to_the_team_with_its_replicas() -> None:
    body = sc.service("web-3", "team-a", 40)
    assert body["kind"] == "ServiceWorkload"
    assert body["spec"]["replicas"] == 40
    assert body["spec"]["team"] == "team-a"
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]


def run(figures: dict[str, Any], processes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"figures": figures, "processes": processes or {}}


def test_flat_figures_keep_numbers_and_process_costs_only() -> None:
    flat = sc.flat_figures(
        run(
            {
                "all_bound_s": 60,
                "bound_per_second": 500.0,
                "extender_filter_p99_le_s": ">10.0",
                "ok": True,
                "lag": None,
            },
            {"etcd": {"cpu_seconds": 5.0, "peak_rss_mb": 70.0}},
        )
    )
    assert flat == {"all_bound_s": 60.0, "etcd.cpu_seconds": 5.0, "etcd.peak_rss_mb": 70.0}


def test_growth_flags_a_figure_growing_faster_than_the_cluster_only() -> None:
    runs = [
        (500, {"linear": 20.0, "quadratic": 40.0, "flat": 1.0}),
        (250, {"linear": 10.0, "quadratic": 10.0, "flat": 1.0}),  # out of order on purpose
        (1000, {"linear": 40.0, "quadratic": 160.0, "flat": 1.0}),
    ]
    grown = sc.growth(runs)
    flagged = {(g["figure"], g["from_nodes"], g["to_nodes"]) for g in grown if g["super_linear"]}
    assert flagged == {("quadratic", 250, 500), ("quadratic", 500, 1000)}
    quad = next(g for g in grown if g["figure"] == "quadratic" and g["from_nodes"] == 250)
    assert quad["ratio"] == 4.0
    assert quad["size_ratio"] == 2.0
    assert {(g["from_nodes"], g["to_nodes"]) for g in grown} == {(250, 500), (500, 1000)}


def test_growth_within_tolerance_is_not_flagged_and_noise_is_skipped() -> None:
    just = 2 * (1 + sc.GROWTH_TOLERANCE) * 0.99
    grown = sc.growth([(20, {"a": 1.0, "tiny": 0.0}), (40, {"a": just, "tiny": 0.5})])
    assert [g["figure"] for g in grown] == ["a"]
    assert not grown[0]["super_linear"]


def test_growth_compares_only_figures_both_sizes_have() -> None:
    grown = sc.growth([(20, {"a": 1.0}), (40, {"b": 9.0})])
    assert grown == []


def test_series_are_columns_with_every_controller_seen() -> None:
    samples = [
        sc.Sample(1.0, 10, 5, 120.0, {"gates": 1}),
        sc.Sample(3.0, 20, 18, None, {"gates": 0, "quota": 2}),
    ]
    s = sc.series(samples)
    assert s["t_s"] == [1.0, 3.0]
    assert s["created"] == [10, 20]
    assert s["bound"] == [5, 18]
    assert s["operator_rss_mb"] == [120.0, None]
    assert s["queue_depth"] == {"gates": [1, 0], "quota": [0, 2]}
