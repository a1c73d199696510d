"""Quota amounts: exact quantities, requests of a pod, excess and its message."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import ledger, quota


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1e3", Fraction(1000)),
        ("1.5k", Fraction(1500)),
        ("100Mi", Fraction(100 * 2**20)),
        (3, Fraction(3)),
        ("10n", Fraction(1, 10**8)),
    ],
)
def test_parse_quantity(text: str | int, value: Fraction) -> None:
    assert quota.parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "5 m", "1Xi", "--1"])
def test_parse_quantity_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        quota.parse_quantity(bad)


@given(st.integers(min_value=1, max_value=10**6))
def test_hundred_milli_cores_sum_exactly(n: int) -> None:
    assert sum((quota.parse_quantity("10m") for _ in range(100)), Fraction(0)) == 1
    assert quota.parse_quantity(f"{n}m") * 1000 == n


def pod(cpu: str = "1", memory: str = "1Gi", gpus: int = 0, **extra: Any) -> dict[str, Any]:
    req: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        req["nvidia.com/gpu"] = gpus
    return {
        "metadata": {"name": "p", "labels": extra.get("labels", {})},
        "spec": {
            "containers": [{"name": "a", "resources": {"requests": req}}],
            **extra.get("spec", {}),
        },
        "status": extra.get("status", {}),
    }


def test_pod_requests_sum_containers_and_max_init() -> None:
    p = pod("1", "1Gi", gpus=2)
    p["spec"]["containers"].append({"name": "b", "resources": {"requests": {"cpu": "500m"}}})
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]
    r = quota.pod_requests(p)
    assert r == {"cpu": Fraction(4), "memory": Fraction(2**30), "gpus": Fraction(2), "pods": 1}


def test_excess_message_names_team_band_resource_and_amounts() -> None:
    limits = {"cpu": Fraction(100), "pods": Fraction(10)}
    used = {"cpu": Fraction(96), "pods": Fraction(3)}
    ask = {"cpu": Fraction(8), "pods": Fraction(1), "memory": Fraction(2**30)}
    (e,) = quota.excess(limits, used, ask)
    assert quota.describe("payments", "production", e) == (
        "team payments, production cpu: 96 of 100 used, pod asks 8"
    )
    assert quota.excess(limits, used, {"cpu": Fraction(4)}) == []


def test_usage_skips_gated_finished_and_deleting_pods() -> None:
    gated = pod(spec={"schedulingGates": [{"name": "gates.pilotfish.io/quota"}]})
    done = pod(status={"phase": "Succeeded"})
    deleting = pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    foreign_gate = pod(spec={"schedulingGates": [{"name": "example.com/x"}]})
    charges = map(ledger.charge_of, [pod("2"), gated, done, deleting, foreign_gate])
    assert ledger.used_of(charges) == {
        "batch": {"cpu": Fraction(3), "memory": Fraction(2 * 2**30), "pods": Fraction(2)}
    }


def test_band_limits_and_band_of_a_pod() -> None:
    tq = {"spec": {"team": "t", "bands": {"production": {"cpu": "10", "gpus": 2}}}}
    assert ledger.band_limits(tq, "production") == {"cpu": Fraction(10), "gpus": Fraction(2)}
    assert ledger.band_limits(tq, "batch") is None
    assert quota.pod_band(pod(labels={"pilotfish.io/band": "production"})) == "production"
    assert quota.pod_band(pod(spec={"priorityClassName": "pilotfish-best-effort"})) == "best-effort"
    assert quota.pod_band(pod()) == "batch"


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [
        ("cpu", Fraction(1, 2), "500m"),
        ("cpu", Fraction(96), "96"),
        ("memory", Fraction(4 * 2**30), "4Gi"),
        ("memory", Fraction(3 * 2**29), "1536Mi"),
        ("memory", Fraction(1500 * 10**6), "1500000000"),
        ("pods", Fraction(7), "7"),
    ],
)
def test_format_quantity(resource: str, value: Fraction, text: str) -> None:
    assert quota.format_quantity(resource, value) == text
