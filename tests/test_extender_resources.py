"""What the extender reads from pods and nodes: quantities, effective requests, band, workload.

These are the numbers every filter and score compares, so each rule kube-scheduler applies
(rounding up, sidecars, init containers, overhead) is pinned by a row here.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.extender import resources
from tests.test_extender_builders import pod


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("2Gi", Fraction(2 * 2**30)),
        ("128974848", Fraction(128974848)),
        ("129e6", Fraction(129_000_000)),
        ("1E3", Fraction(1000)),
        ("123Mi", Fraction(123 * 2**20)),
        ("1k", Fraction(1000)),
        ("100u", Fraction(1, 10_000)),
        (".5", Fraction(1, 2)),
        (8, Fraction(8)),
        (0.25, Fraction(1, 4)),
        ("", Fraction(0)),
        ("lots", Fraction(0)),
        ("1Zi", Fraction(0)),
        (None, Fraction(0)),
        (True, Fraction(0)),
        (float("nan"), Fraction(0)),
    ],
)
def test_quantity(value: Any, expected: Fraction) -> None:
    assert resources.quantity(value) == expected


def test_cpu_rounds_up_to_millicores_and_memory_to_bytes() -> None:
    assert resources.milli("100u") == 1  # the scheduler's MilliValue rounds up
    assert resources.milli("0.0015") == 2
    assert resources.whole("1.5") == 2
    assert resources.milli("2") == 2000


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "m", "k", "Mi", "Gi"]))
def test_quantity_round_trips_integers_with_suffixes(number: int, suffix: str) -> None:
    scales: dict[str, Fraction] = {
        "": Fraction(1),
        "m": Fraction(1, 1000),
        "k": Fraction(1000),
        "Mi": Fraction(2**20),
        "Gi": Fraction(2**30),
    }
    scale = scales[suffix]
    assert resources.quantity(f"{number}{suffix}") == number * scale


def _spec(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, **extra}
    if init is not None:
        spec["initContainers"] = init
    return spec


def c(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": requests}, **extra}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(_spec([c("1", "1Gi"), c("500m", "512Mi")]), (1500, 1536 * 2**20), id="sum"),
        pytest.param(_spec([c("1")], [c("4")]), (4000, 0), id="init-larger-wins"),
        pytest.param(_spec([c("3")], [c("2")]), (3000, 0), id="containers-larger-win"),
        pytest.param(
            # A sidecar runs beside everything after it: 1 (app) + 1 (sidecar) = 2 vs 1+3.
            _spec([c("1")], [c("1", restartPolicy="Always"), c("3")]),
            (4000, 0),
            id="sidecar-adds-to-later-init",
        ),
        pytest.param(
            _spec([c("2")], [c("1", restartPolicy="Always"), c("1")]),
            (3000, 0),
            id="sidecar-adds-to-containers",
        ),
        pytest.param(_spec([c("1")], overhead={"cpu": "250m"}), (1250, 0), id="overhead"),
        pytest.param(
            _spec([c("1", "1Gi")], resources={"requests": {"cpu": "3"}}),
            (3000, 2**30),
            id="pod-level-cpu",
        ),
        pytest.param(
            _spec([{"name": "c", "resources": {"limits": {"cpu": "2"}}}]),
            (2000, 0),
            id="limits-stand-in",
        ),
        pytest.param(_spec([{"name": "c"}]), (0, 0), id="no-resources"),
    ],
)
def test_pod_requests_like_the_scheduler(spec: dict[str, Any], expected: tuple[int, int]) -> None:
    requests = resources.pod_requests(spec)
    assert (requests.get("cpu", 0), requests.get("memory", 0)) == expected


def test_pod_requests_keep_gpus_and_batch_resources() -> None:
    spec = _spec(
        [
            {
                "name": "c",
                "resources": {
                    "requests": {
                        resources.GPU: "2",
                        names.BATCH_CPU: "1500",
                        "example.com/other": "1",
                    }
                },
            }
        ]
    )
    assert resources.pod_requests(spec) == {resources.GPU: 2, names.BATCH_CPU: 1500}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"band": "batch", "priority_class": "pilotfish-production"}, "batch"),
        ({"band": "gold", "priority_class": "pilotfish-batch"}, "batch"),
        ({"priority_class": "pilotfish-production"}, "production"),
        ({"priority_class": "pilotfish-best-effort", "priority": 10**9}, "best-effort"),
        ({"priority_class": "system-cluster-critical", "priority": 2_000_000_000}, "production"),
        ({"priority": 1_000_000}, "production"),
        ({"priority": 999_999}, "batch"),
        ({"priority": 100_000}, "batch"),
        ({"priority": 99_999}, "best-effort"),
        ({}, "best-effort"),
    ],
)
def test_band_label_then_class_then_priority(kw: dict[str, Any], expected: str) -> None:
    assert resources.band(pod("p", **kw)) == expected


def test_workload_label_then_controller() -> None:
    assert resources.workload(pod("p", workload="web", namespace="ns")) == "ns/web"
    owned = pod("p")
    owned["metadata"]["ownerReferences"] = [
        {"kind": "Node", "uid": "not-a-controller"},
        {"kind": "ReplicaSet", "uid": "rs-1", "controller": True},
    ]
    assert resources.workload(owned) == "owner:rs-1"
    assert resources.workload(pod("p")) is None


def test_machine_class_annotation_then_label() -> None:
    p = pod("p", machine_class="pf.gpu-8")
    assert resources.machine_class(p) == "pf.gpu-8"
    p["metadata"]["labels"][resources.LABEL_MACHINE_CLASS] = "pf.other"
    assert resources.machine_class(p) == "pf.gpu-8"
    del p["metadata"]["annotations"][resources.LABEL_MACHINE_CLASS]
    assert resources.machine_class(p) == "pf.other"
    assert resources.machine_class(pod("q")) is None


def test_start_time_falls_back_to_creation() -> None:
    assert resources.start_time(pod("p", start="2026-01-01T00:00:10Z")) == 1767225610.0
    assert resources.start_time(pod("p", start=None)) == 1767139200.0
    assert resources.timestamp("yesterday") == 0.0
