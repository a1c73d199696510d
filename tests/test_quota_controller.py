"""TeamQuota status: usage from pods, reservations settled or returned."""

from __future__ import annotations

import datetime
from fractions import Fraction
from typing import Any

from pilotfish.api.teamquota import SUMMARY_MAX_LENGTH, TeamQuotaStatus
from pilotfish.operators.quota import (
    RESERVATION_TTL_SECONDS,
    band_summary,
    desired_status,
    next_expiry,
)
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


def test_summary_per_band_is_held_against_the_limit_in_canonical_quantities() -> None:
    quota = tq(reservation("x", "500m", 1))
    quota["spec"]["bands"] = {
        "production": {"cpu": "2", "memory": "166429982720", "pods": 10},
        "batch": {},
    }
    running = pod("a", "1")
    running["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1073741824"
    status = desired_status(quota, [running, pod("b", "3750m", "batch")], NOW)
    assert status["summary"] == {
        # used (1 CPU, 1Gi, 1 pod) plus the reservation not counted yet (500m, 1 pod)
        "production": "cpu 1500m/2, memory 1Gi/155Gi, pods 2/10",
        "batch": "cpu 3750m/unlimited, memory 0/unlimited, pods 1/unlimited",
        "best-effort": "not granted",
    }
    # It is a valid status for the CRD's schema, column by column.
    parsed = TeamQuotaStatus.model_validate(status)
    assert parsed.summary.best_effort == "not granted"


def test_summary_of_a_band_not_granted_says_what_it_still_holds() -> None:
    # A band taken out of the spec while its pods run: they are not evicted, and say so.
    held = {"cpu": Fraction(1), "memory": Fraction(2**30), "pods": Fraction(1)}
    assert band_summary(None, held) == "not granted (holds cpu 1, memory 1Gi, pods 1)"


def test_summary_shows_gpus_and_extended_resources_only_when_limited_or_held() -> None:
    limits = {"cpu": Fraction(8), "gpus": Fraction(4), "example.com/fpga": Fraction(2)}
    held = {"cpu": Fraction(1, 2), "pods": Fraction(1), "example.com/nic": Fraction(1)}
    assert band_summary(limits, held) == (
        "cpu 500m/8, memory 0/unlimited, gpus 0/4, pods 1/unlimited, "
        "example.com/fpga 0/2, example.com/nic 1/unlimited"
    )
    assert "gpus" not in band_summary({"cpu": Fraction(1)}, {})


def test_summary_is_cut_short_within_the_schema_limit() -> None:
    limits = {f"example.com/{'r' * 50}{i:02}": Fraction(10**15) for i in range(32)}
    text = band_summary(limits, {})
    assert len(text) <= SUMMARY_MAX_LENGTH
    assert text.endswith(" ...")


def test_status_is_unchanged_when_nothing_changed_so_no_write_happens() -> None:
    quota = tq()
    first = desired_status(quota, [pod("a", "2")], NOW)
    again = desired_status({**quota, "status": first}, [pod("a", "2")], NOW)
    assert again == first
