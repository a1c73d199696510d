"""The pure parts of benchmarks/api_fairness.py: how the flood is split, what a flood pod is,
and how the figure is taken (never invented when a phase measured nothing)."""

from __future__ import annotations

import pytest

from benchmarks import apf_metrics
from benchmarks.api_fairness import PORT_OFFSET, ratio, team_users
from benchmarks.common import latency_summary as summary
from benchmarks.pod_flood import FLOOD_LABEL, HOLD_GATE, flood_plan, flood_pod, retry_after
from benchmarks.probes.steady_writes import slowest_of
from pilotfish.kube.rest import ApiError


@pytest.mark.parametrize(
    ("pods", "procs", "clients", "users"), [(10_000, 4, 64, 16), (1000, 3, 32, 5), (7, 4, 2, 1)]
)
def test_the_flood_plan_creates_every_pod_once_with_every_client_and_user(
    pods: int, procs: int, clients: int, users: int
) -> None:
    team = team_users("team-a", users)
    plan = flood_plan(pods, procs, clients, team)
    indexes = [i for part in plan for i in part["indexes"]]
    assert sorted(indexes) == list(range(pods))
    assert sum(part["concurrency"] for part in plan) == clients
    assert all(part["concurrency"] >= 1 and part["users"] for part in plan)
    assert {u for part in plan for u in part["users"]} == set(team)
    assert len(plan) <= procs


def test_team_users_are_distinct_and_named_after_their_team() -> None:
    users = team_users("team-a", 3)
    assert users == ["team-a-user-0", "team-a-user-1", "team-a-user-2"]


def test_a_flood_pod_is_held_by_its_own_gate_and_labelled_for_clean_up() -> None:
    pod = flood_pod("a-1")
    assert pod["metadata"] == {"name": "a-1", "labels": {FLOOD_LABEL: "true"}}
    assert pod["spec"]["schedulingGates"] == [{"name": HOLD_GATE}]
    assert not HOLD_GATE.startswith("gates.pilotfish.io/")  # nothing of Pilotfish releases it


def test_summary_uses_observed_values() -> None:
    values = [0.01 * i for i in range(1, 101)]
    s = summary(values)
    assert s["count"] == 100
    assert s["p50_s"] == 0.5
    assert s["p99_s"] == 0.99
    assert s["max_s"] == 1.0
    assert summary([]) == {"count": 0, "p50_s": None, "p90_s": None, "p99_s": None, "max_s": None}


def test_the_ratio_is_flood_over_idle_and_none_without_a_measurement() -> None:
    assert ratio(0.3, 0.2) == 1.5
    assert ratio(None, 0.2) is None
    assert ratio(0.3, None) is None
    assert ratio(0.3, 0.0) is None


def test_the_default_port_offset_stays_away_from_the_e2e_suites() -> None:
    assert PORT_OFFSET == 14000


WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
TENANTS = {"flow_schema": "pilotfish-tenants", "priority_level": "pilotfish-tenants"}


def metric(name: str, value: float, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value}"


METRICS = "\n".join(
    [
        f"# HELP {WAIT} [BETA] Length of time a request spent waiting in its queue",
        metric(f"{WAIT}_sum", 1.5, execute="true", **TENANTS),
        metric(f"{WAIT}_count", 10, execute="true", **TENANTS),
        metric(f"{WAIT}_count", 2, execute="false", **TENANTS),
        metric(f"{WAIT}_count", 7, flow_schema="global-default", priority_level="global-default"),
        metric("apiserver_flowcontrol_rejected_requests_total", 2, reason="queue-full", **TENANTS),
        metric(
            "apiserver_flowcontrol_nominal_limit_seats", 221, priority_level="pilotfish-tenants"
        ),
        metric("apiserver_flowcontrol_nominal_limit_seats", 50, priority_level="catch-all"),
        metric(f"{WAIT}_bucket", 99, le="0.1", **TENANTS),
    ]
)


def test_apf_metrics_sum_counters_per_level_and_keep_seat_gauges() -> None:
    levels = ("pilotfish-tenants", "global-default")
    before = apf_metrics.parse(METRICS, levels)
    assert before["pilotfish-tenants"] == {
        "wait_seconds": 1.5,
        "requests": 12.0,
        "rejected": 2.0,
        "nominal_seats": 221.0,
    }
    assert before["global-default"] == {"requests": 7.0}
    assert "catch-all" not in before
    after = apf_metrics.parse(METRICS.replace(" 10\n", " 30\n"), levels)
    change = apf_metrics.delta(before, after)
    assert change["pilotfish-tenants"]["requests"] == 20.0  # counters: the difference
    assert change["pilotfish-tenants"]["nominal_seats"] == 221.0  # gauges: as read at the end
    assert change["global-default"]["requests"] == 0.0


def test_the_flood_waits_out_a_429s_retry_after_as_client_go_does() -> None:
    assert retry_after(ApiError(429, "TooManyRequests", "slow down", retry_after=3)) == 3.0
    assert retry_after(ApiError(429, "Unknown", "Too many requests")) is None
    assert retry_after(ApiError(503, "ServiceUnavailable", "x", retry_after=3)) is None


def test_the_slowest_writes_are_named_with_when_they_were_sent() -> None:
    assert slowest_of([0.1, 0.5, 0.2], [10.0, 11.0, 12.0], count=2) == [[11.0, 0.5], [12.0, 0.2]]
