"""TeamQuota metrics: what each band holds against its limits, and nothing left behind."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from prometheus_client import REGISTRY

from pilotfish import ledger
from pilotfish.operators.quota.exported import QuotaMetrics


def quota(bands: dict[str, Any], used: dict[str, dict[str, Fraction]]) -> dict[str, Any]:
    return {
        "metadata": {"name": "shop"},
        "spec": {"team": "shop", "bands": bands},
        "status": {"used": ledger.used_field(used)},
    }


def held(band: str, resource: str) -> float | None:
    labels = {"team": "shop", "band": band, "resource": resource}
    return REGISTRY.get_sample_value("pilotfish_quota_held", labels)


def limit(band: str, resource: str) -> float | None:
    labels = {"team": "shop", "band": band, "resource": resource}
    return REGISTRY.get_sample_value("pilotfish_quota_limit", labels)


def test_held_and_limits_per_band_in_base_units() -> None:
    m = QuotaMetrics()
    used = {"production": {"cpu": Fraction(3, 2), "memory": Fraction(2**30), "pods": Fraction(3)}}
    m.export("shop", quota({"production": {"cpu": "4", "memory": "8Gi"}, "batch": {}}, used))
    try:
        assert held("production", "cpu") == 1.5
        assert held("production", "memory") == 2**30
        assert held("production", "pods") == 3
        assert limit("production", "cpu") == 4
        assert limit("production", "memory") == 8 * 2**30
        assert limit("production", "pods") is None  # not limited
        assert held("batch", "cpu") == 0  # granted, holding nothing
        assert limit("batch", "cpu") is None
        assert held("best-effort", "cpu") is None  # not granted
    finally:
        m.forget("shop")


def test_label_sets_that_went_away_are_removed() -> None:
    m = QuotaMetrics()
    used = {"production": {"cpu": Fraction(1), "gpus": Fraction(2)}}
    m.export("shop", quota({"production": {"cpu": "4", "gpus": "2"}}, used))
    assert held("production", "gpus") == 2 and limit("production", "gpus") == 2
    m.export("shop", quota({"production": {"cpu": "4"}}, {"production": {"cpu": Fraction(1)}}))
    assert held("production", "gpus") is None and limit("production", "gpus") is None
    assert held("production", "cpu") == 1
    m.forget("shop")
    assert held("production", "cpu") is None and limit("production", "cpu") is None
