"""Quota at admission: admit and reserve, refuse with amounts, gate batch; never over-admit."""

from __future__ import annotations

import datetime
from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pilotfish.ledger import Ledger
from pilotfish.webhooks.quota import QUOTA_GATE, Admit, Gate, Refuse, decide

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
TEAM_NS = {"pilotfish.io/team": "payments"}


def pod(cpu: str, name: str = "p", uid: str = "u1", gated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": QUOTA_GATE}]
    return {"metadata": {"name": name, "namespace": "shop", "uid": uid}, "spec": spec}


def tq(
    limit: str = "100", used: str | None = None, bands: tuple[str, ...] = ("production", "batch")
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if used:
        status["used"] = {b: {"cpu": used} for b in bands}
    return {
        "metadata": {"name": "payments", "resourceVersion": "5"},
        "spec": {"team": "payments", "bands": {b: {"cpu": limit} for b in bands}},
        "status": status,
    }


def test_within_quota_admits_and_reserves() -> None:
    out = decide(pod("8"), TEAM_NS, "production", [tq(used="90")], NOW)
    assert isinstance(out, Admit) and out.quota_name == "payments"
    assert out.reservation is not None
    assert out.reservation.wire() == {
        "pod": "shop/p",
        "uid": "u1",
        "band": "production",
        "resources": {"cpu": "8", "pods": 1},
        "time": "2026-01-01T00:00:00Z",
    }


def test_production_over_quota_is_refused_with_the_amounts() -> None:
    out = decide(pod("8"), TEAM_NS, "production", [tq(used="96")], NOW)
    assert out == Refuse("team payments, production cpu: 96 of 100 used, pod asks 8")


def test_batch_over_quota_is_gated_not_refused() -> None:
    out = decide(pod("8"), TEAM_NS, "batch", [tq(used="96")], NOW)
    assert out == Gate("team payments, batch cpu: 96 of 100 used, pod asks 8")
    assert decide(pod("8", gated=True), TEAM_NS, "batch", [tq(used="96")], NOW) == Admit(None, None)


def test_no_quota_for_the_band_means_no_running_in_it() -> None:
    out = decide(pod("1"), TEAM_NS, "best-effort", [tq()], NOW)
    assert isinstance(out, Refuse) and "team payments has no best-effort quota" in out.message
    assert isinstance(decide(pod("1"), TEAM_NS, "production", [], NOW), Refuse)


def test_pods_outside_teams_or_bands_are_not_governed() -> None:
    assert decide(pod("1"), {}, "production", [], NOW) == Admit(None, None)
    assert decide(pod("1"), TEAM_NS, None, [], NOW) == Admit(None, None)


def test_the_team_charged_is_the_namespace_s_whatever_the_pod_label_says() -> None:
    forged = pod("8")
    forged["metadata"]["labels"] = {"pilotfish.io/team": "search"}
    search = {**tq(used="0"), "metadata": {"name": "search"}, "spec": {"team": "search"}}
    out = decide(forged, TEAM_NS, "production", [tq(used="96"), search], NOW)
    assert out == Refuse("team payments, production cpu: 96 of 100 used, pod asks 8")
    assert decide(forged, {}, "production", [search], NOW) == Admit(None, None)


def test_a_band_without_limits_admits_and_reserves_nothing() -> None:
    unlimited = {
        "metadata": {"name": "payments"},
        "spec": {"team": "payments", "bands": {"batch": {}}},
    }
    assert decide(pod("1000"), TEAM_NS, "batch", [unlimited], NOW) == Admit("payments", None)


@given(
    st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=100),
)
def test_sequential_conditional_reservations_never_exceed_the_limit(
    asks: list[int], limit: int
) -> None:
    """What the API server's resourceVersion check enforces: each decision sees all earlier
    reservations, so the admitted total stays within the limit whatever the order."""
    current = tq(str(limit), bands=("production",))
    admitted = Fraction(0)
    for i, ask in enumerate(asks):
        out = decide(
            pod(str(ask), name=f"p{i}", uid=f"u{i}"), TEAM_NS, "production", [current], NOW
        )
        if isinstance(out, Admit):
            assert out.reservation is not None
            current = Ledger.of(current).with_reservations([out.reservation])
            admitted += ask
        else:
            assert isinstance(out, Refuse)
    assert admitted <= limit
    assert Ledger.of(current).held("production").get("cpu", Fraction(0)) == admitted


def test_reservations_count_and_a_pod_s_own_is_not_counted_twice() -> None:
    held = tq(used="90", bands=("production",))
    held["status"]["reservations"] = [
        {
            "pod": "shop/p",
            "uid": "u1",
            "band": "production",
            "resources": {"cpu": "8", "pods": 1},
            "time": "2026-01-01T00:00:00Z",
        }
    ]
    other = decide(pod("8", name="q", uid="u2"), TEAM_NS, "production", [held], NOW)
    assert other == Refuse("team payments, production cpu: 98 of 100 used, pod asks 8")
    # The same pod asked about again (a retried review) already holds its 8.
    assert isinstance(decide(pod("8"), TEAM_NS, "production", [held], NOW), Admit)


def test_the_reserved_sum_is_written_for_people_not_read() -> None:
    """Decisions sum `reservations`: a `reserved` field out of step cannot free room."""
    lying = tq(used="96", bands=("production",))
    lying["status"]["reserved"] = {"production": {"cpu": "0"}}
    assert isinstance(decide(pod("8"), TEAM_NS, "production", [lying], NOW), Refuse)
    lying["status"] = {"reserved": {"production": {"cpu": "100"}}}
    assert isinstance(decide(pod("8"), TEAM_NS, "production", [lying], NOW), Admit)
