"""prod_under_burst's bookkeeping: metric deltas, the audit log's per-pod times, the verdict,
and a BatchWorkload that never starts failing the run by name instead of measuring nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks.probes import batchworkload as bwl
from benchmarks.probes.scheduling import delta, histogram, reading, server_times, total
from benchmarks.prod_under_burst import verdict
from pilotfish.kube.rest import BATCHWORKLOADS, PODS
from pilotfish.workloads import LABEL_BATCH
from tests.fakeapi import FakeApi

PAGE = """# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 40
scheduler_schedule_attempts_total{profile="pilotfish-scheduler",result="scheduled"} 2
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 3
# TYPE bind_seconds histogram
bind_seconds_bucket{extension_point="Bind",le="0.1"} {a}
bind_seconds_bucket{extension_point="Bind",le="0.2"} {b}
bind_seconds_bucket{extension_point="Bind",le="+Inf"} {c}
bind_seconds_sum{extension_point="Bind"} {s}
bind_seconds_count{extension_point="Bind"} {c}
bind_seconds_bucket{extension_point="Filter",le="0.1"} 500
bind_seconds_bucket{extension_point="Filter",le="0.2"} 500
bind_seconds_bucket{extension_point="Filter",le="+Inf"} 500
bind_seconds_sum{extension_point="Filter"} 1
bind_seconds_count{extension_point="Filter"} 500
"""


def _page(a: int, b: int, c: int, s: float) -> str:
    return (
        PAGE.replace("{a}", str(a))
        .replace("{b}", str(b))
        .replace("{c}", str(c))
        .replace("{s}", str(s))
    )


def test_a_phase_counts_only_what_happened_during_it() -> None:
    before = reading(_page(10, 10, 10, 0.5))
    after = reading(_page(10, 60, 110, 20.5))
    d = delta(before, after)
    # 100 binds in the phase: 0 under 0.1 s, 50 under 0.2 s, the rest beyond the last bucket.
    assert histogram(d, "bind_seconds", extension_point="Bind") == {
        "count": 100,
        "mean_s": 0.2,
        "p50_le_s": 0.2,
        "p99_le_s": ">0.2",
    }
    assert total(after, "scheduler_schedule_attempts_total", result="scheduled") == 42


def _audit(namespace: str, name: str, sub: str | None, received: str, done: str) -> str:
    ref = {"resource": "pods", "namespace": namespace, "name": name}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "stage": "ResponseComplete",
            "verb": "create",
            "objectRef": ref,
            "requestReceivedTimestamp": received,
            "stageTimestamp": done,
        },
        separators=(",", ":"),
    )


def test_server_times_come_from_the_namespace_creates_and_bindings(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                _audit(
                    "burst",
                    "web-1",
                    None,
                    "2026-01-01T00:00:00.000000Z",
                    "2026-01-01T00:00:00.100000Z",
                ),
                _audit(
                    "burst",
                    "web-1",
                    "binding",
                    "2026-01-01T00:00:01.100000Z",
                    "2026-01-01T00:00:01.350000Z",
                ),
                _audit(
                    "other",
                    "web-2",
                    None,
                    "2026-01-01T00:00:00.000000Z",
                    "2026-01-01T00:00:00.100000Z",
                ),
            ]
        )
        + "\n"
    )
    t = server_times(log, "burst")
    assert set(t.created) == {"web-1"}
    assert t.bind_received["web-1"] - t.created["web-1"] == pytest.approx(1.0)
    assert t.bind_done["web-1"] - t.bind_received["web-1"] == pytest.approx(0.25)


def test_verdict_needs_both_the_ratio_and_the_absolute_line() -> None:
    assert verdict(0.1, 0.14) == {"p99_s": 0.14, "p99_over_idle": 1.4, "met": True}
    assert verdict(0.1, 0.2)["met"] is False  # 2x idle
    assert verdict(4.0, 5.5)["met"] is False  # within 1.5x, but over five seconds


async def _wait(pods: int, within: float) -> float:
    """A job that has created `pods` of its pods; wait for five of them."""
    api = FakeApi()
    api.put(BATCHWORKLOADS.path("burst", "etl"), bwl.body("etl", 10, bwl.TEAM, 5))
    for i in range(pods):
        api.put(
            PODS.path("burst", f"etl-{i}-0"),
            {"metadata": {"name": f"etl-{i}-0", "labels": {LABEL_BATCH: "etl"}}},
        )
    return await bwl.wait_started(api, "burst", "etl", 5, first_within=within, all_within=within)


def test_a_batchworkload_nothing_serves_fails_the_run_naming_it() -> None:
    with pytest.raises(bwl.NotStarted, match=r"burst/etl created no pods within 0s.*batchworkload"):
        asyncio.run(_wait(pods=0, within=0.0))


def test_a_batchworkload_that_stalls_says_how_far_it_got() -> None:
    with pytest.raises(bwl.NotStarted, match="created 2 of the 5 pods"):
        asyncio.run(_wait(pods=2, within=0.0))


def test_a_batchworkload_that_creates_its_head_start_lets_production_begin() -> None:
    assert asyncio.run(_wait(pods=5, within=1.0)) >= 0
