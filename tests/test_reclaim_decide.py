"""The pure reclaim figure, write decision and eviction order, on hand-made nodes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from fractions import Fraction

from pilotfish import names
from pilotfish.operators.reclaim import reasons
from pilotfish.operators.reclaim.apply import status_patch
from pilotfish.operators.reclaim.decide import decide, give_back, measured
from pilotfish.operators.reclaim.model import (
    CPU,
    MEMORY,
    BatchPod,
    NodeInputs,
    Reserved,
    current_figure,
    usage_from,
)
from pilotfish.operators.reclaim.settings import ReclaimSettings
from pilotfish.promql import Sample

NOW = "2026-01-01T00:00:00Z"
S = ReclaimSettings("http://p")
GI = 1024**3


def inputs(
    current: Mapping[str, int | None] | None = None,
    age: float | None = 5.0,
    reason: str | None = None,
    pods: tuple[BatchPod, ...] = (),
) -> NodeInputs:
    conditions = (
        ()
        if reason is None
        else ({"type": names.CONDITION_BATCH_CAPACITY, "status": "True", "reason": reason},)
    )
    return NodeInputs(
        name="n",
        uid="u",
        resource_version="7",
        allocatable={CPU: Fraction(8000), MEMORY: Fraction(16 * GI)},
        current=dict(current or {CPU: None, MEMORY: None}),
        reserved=(
            Reserved(
                "ns/web",
                "production",
                {CPU: Fraction(5600), MEMORY: Fraction(8 * GI)},
                {CPU: Fraction(3200), MEMORY: Fraction(4 * GI)},
            ),
        ),
        batch_pods=pods,
        age=age,
        conditions=conditions,
        annotation=None if reason is None else "{}",
    )


def test_the_design_s_example() -> None:
    assert measured(Fraction(8000), Fraction(5600), Fraction(3200), Fraction(800)) == (4000, 1600)
    d = decide(inputs(), None, S, NOW)
    assert (d.state, d.write, d.figures[CPU].batch, d.figures[CPU].reclaimed) == (
        reasons.MEASURED,
        True,
        4000,
        1600,
    )
    assert d.event is None  # a first measurement is no transition


def test_the_status_patch_carries_figure_condition_annotation_and_version() -> None:
    d = decide(inputs(), None, S, NOW)
    body = status_patch(d, "7")
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["status"]["capacity"] == body["status"]["allocatable"]
    assert body["status"]["allocatable"][names.BATCH_CPU] == "4000"
    assert body["status"]["conditions"][0]["type"] == names.CONDITION_BATCH_CAPACITY
    figures = json.loads(body["metadata"]["annotations"][names.ANNOTATION_RECLAIM])
    assert figures["cpu"]["batch"] == "4" and figures["memory"]["p95"] == "4Gi"


def test_within_the_threshold_nothing_is_written() -> None:
    near = {CPU: 4100, MEMORY: 11166914969 - 100}
    d = decide(inputs(near, reason=reasons.MEASURED), None, S, NOW)
    assert not d.write and d.effective == near
    far = {CPU: 4200, MEMORY: 11166914969}  # 200m > 160m
    assert decide(inputs(far, reason=reasons.MEASURED), None, S, NOW).write


def test_a_state_change_is_written_and_posted_once() -> None:
    cur = {CPU: 4000, MEMORY: 11166914969}
    d = decide(inputs(cur, age=500, reason=reasons.MEASURED), None, S, NOW)
    assert d.write and d.state == reasons.METRICS_STALE and d.effective[CPU] == 2000
    assert d.event is not None and d.event[0] == reasons.EVENT_STALE
    again = decide(
        inputs({CPU: 2000, MEMORY: 1}, age=500, reason=reasons.METRICS_STALE), None, S, NOW
    )
    assert again.event is None
    back = decide(inputs(cur, reason=reasons.METRICS_STALE), None, S, NOW)
    assert back.event is not None and back.event[0] == reasons.EVENT_RECOVERED
    assert back.condition["status"] == "True"


def test_prometheus_down_wins_over_fresh_ages() -> None:
    d = decide(inputs({CPU: 4000, MEMORY: 0}), "timeout: no answer within 10s", S, NOW)
    assert d.state == reasons.PROMETHEUS_UNAVAILABLE
    assert "timeout: no answer within 10s" in d.condition["message"]
    assert d.condition["status"] == "False"


def pod(name: str, band: str, started: float, cpu: int, memory: int = 0) -> BatchPod:
    return BatchPod(
        "ns", name, f"uid-{name}", band, started, {CPU: Fraction(cpu), MEMORY: Fraction(memory)}
    )


def test_give_back_order_band_then_newest_then_largest() -> None:
    pods = [
        pod("old", "batch", 10, 1000),
        pod("new-small", "batch", 30, 500),
        pod("new-large", "batch", 30, 2000),
        pod("be", "best-effort", 0, 100),
    ]
    a = {CPU: Fraction(8000), MEMORY: Fraction(GI)}
    chosen = give_back(pods, {CPU: 1000, MEMORY: GI}, a)
    assert [p.name for p in chosen] == ["be", "new-large", "new-small"]
    assert give_back(pods, {CPU: 3600, MEMORY: GI}, a) == ()


def test_give_back_passes_over_pods_that_do_not_help() -> None:
    pods = [pod("cpu-only", "best-effort", 50, 1000, 0), pod("mem", "batch", 1, 0, GI)]
    a = {CPU: Fraction(8000), MEMORY: Fraction(4 * GI)}
    chosen = give_back(pods, {CPU: 8000, MEMORY: 0}, a)
    assert [p.name for p in chosen] == ["mem"]


def test_samples_and_figures_are_read_exactly() -> None:
    u = usage_from(
        [Sample({"node": "n", "namespace": "ns", "pod": "p"}, 3.2)],
        [Sample({"node": "n", "namespace": "ns", "pod": "p"}, float("nan"))],
        [Sample({"node": "n"}, 4.0), Sample({}, 1.0)],
    )
    assert u.p95[CPU] == {("n", "ns", "p"): Fraction(3200)}
    assert u.p95[MEMORY] == {} and u.age == {"n": 4.0}
    status = {
        "allocatable": {names.BATCH_CPU: "4k", names.BATCH_MEMORY: "1Gi"},
        "capacity": {names.BATCH_CPU: "4000", names.BATCH_MEMORY: "2Gi"},
    }
    assert current_figure(status) == {CPU: 4000, MEMORY: None}  # disagreeing: rewritten
