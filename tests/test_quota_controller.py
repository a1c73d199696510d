"""TeamQuota status: usage from pods, reservations settled or returned."""

from __future__ import annotations

import datetime
from fractions import Fraction
from typing import Any

from pilotfish.operators.quota import RESERVATION_TTL_SECONDS, desired_status, next_expiry
from pilotfish.quota import band_resources

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def ago(seconds: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(uid: str, cpu: str, band: str = "production", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": uid,
            "namespace": "ns",
            "uid": uid,
            "labels": {"pilotfish.io/team": "t", "pilotfish.io/band": band},
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": phase},
    }


def reservation(uid: str, cpu: str, age: float) -> dict[str, Any]:
    return {
        "pod": f"ns/{uid}",
        "uid": uid,
        "band": "production",
        "resources": {"cpu": cpu, "pods": 1},
        "time": ago(age),
    }


def tq(*reservations: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "t", "generation": 3},
        "spec": {"team": "t", "bands": {"production": {"cpu": "10"}}},
        "status": {"reservations": list(reservations)},
    }


def test_used_counts_running_pods_per_band() -> None:
    status = desired_status(
        tq(),
        [pod("a", "2"), pod("b", "500m"), pod("c", "1", "batch"), pod("d", "4", phase="Succeeded")],
        NOW,
    )
    assert status["used"] == {
        "batch": {"cpu": "1", "pods": 1},
        "production": {"cpu": "2500m", "pods": 2},
    }
    assert status["observedGeneration"] == 3


def test_reservation_of_a_counted_pod_is_dropped_in_the_same_write() -> None:
    status = desired_status(
        tq(reservation("a", "2", 1), reservation("x", "1", 1)), [pod("a", "2")], NOW
    )
    assert [r["uid"] for r in status["reservations"]] == ["x"]
    assert status["reserved"] == {"production": {"cpu": "1", "pods": 1}}
    assert status["used"]["production"]["cpu"] == "2"


def test_reservation_of_a_pod_never_created_is_returned_after_the_ttl() -> None:
    old = reservation("gone", "1", RESERVATION_TTL_SECONDS + 1)
    fresh = reservation("soon", "1", 5)
    status = desired_status(tq(old, fresh), [], NOW)
    assert [r["uid"] for r in status["reservations"]] == ["soon"]
    assert next_expiry({"status": status}, NOW) == RESERVATION_TTL_SECONDS - 5


def test_quantities_are_exact_canonical_strings_in_status() -> None:
    assert band_resources(
        {
            "cpu": Fraction(3, 2),
            "example.com/fpga": Fraction(2),
            "gpus": Fraction(1),
            "memory": Fraction(3 * 2**29),
            "pods": Fraction(0),
        }
    ) == {"cpu": "1500m", "memory": "1536Mi", "gpus": 1, "extended": {"example.com/fpga": "2"}}
    # Below the nano-unit the API server rounds up; so does Pilotfish.
    assert band_resources({"cpu": Fraction(1, 3)}) == {"cpu": "333333334n"}


def test_absurd_usage_is_written_saturated_and_never_as_a_json_number() -> None:
    beyond = Fraction(10) ** 400  # what a sum of bombs could reach without saturation
    written = band_resources({"cpu": beyond, "memory": beyond, "gpus": beyond, "pods": beyond})
    assert written == {
        "cpu": "9223372036854775808",
        "memory": "8Ei",
        "gpus": 2**63 - 1,
        "pods": 2**63 - 1,
    }
