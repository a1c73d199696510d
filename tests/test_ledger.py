"""The one quota ledger: what a TeamQuota holds, what fits, what settling keeps."""

from __future__ import annotations

import datetime
from fractions import Fraction
from typing import Any

import pytest

from pilotfish import ledger
from pilotfish.ledger import Charge, Ledger, Reservation, gate_condition, settle
from pilotfish.reservations import Release, release_decision

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
CPU = "cpu"


def res(uid: str, cpu: int, band: str = "batch") -> dict[str, Any]:
    return {
        "pod": f"ns/{uid}",
        "uid": uid,
        "band": band,
        "resources": {"cpu": str(cpu), "pods": 1},
        "time": "2026-01-01T00:00:00Z",
    }


def tq(
    limit: int | None = 10,
    used: int = 0,
    reservations: tuple[dict[str, Any], ...] = (),
    *,
    name: str = "t",
    team: str = "t",
) -> dict[str, Any]:
    bands: dict[str, Any] = {"production": {"cpu": "4"}}
    if limit is not None:
        bands["batch"] = {"cpu": str(limit)}
    status: dict[str, Any] = {"reservations": list(reservations)}
    if used:
        status["used"] = {"batch": {"cpu": str(used), "pods": 1}}
        # A stale or hand-written `reserved` sum is never what decisions read.
        status["reserved"] = {"batch": {"cpu": "999"}}
    return {
        "metadata": {"name": name, "resourceVersion": "5"},
        "spec": {"team": team, "bands": bands},
        "status": status,
    }


def cpu(n: int | Fraction) -> dict[str, Fraction]:
    return {CPU: Fraction(n), "pods": Fraction(1)}


# --- reading -------------------------------------------------------------------------------


def test_held_is_used_plus_the_reservations_list_never_the_reserved_field() -> None:
    book = Ledger.of(tq(used=3, reservations=(res("a", 2), res("b", 1, "production"))))
    assert book.held("batch")[CPU] == 5
    assert book.held("production")[CPU] == 1
    assert book.held("batch", excluding={"a"})[CPU] == 3
    assert book.room("batch") == {CPU: Fraction(5)}
    assert book.room("best-effort") is None, "a band not granted has no room at all"


def test_room_never_goes_below_zero_when_a_band_is_over() -> None:
    # A TeamQuota lowered under what already runs: running pods are not evicted.
    assert Ledger.of(tq(limit=2, used=5)).room("batch") == {CPU: Fraction(0)}


def test_check_names_what_does_not_fit_and_leaves_the_requester_out() -> None:
    book = Ledger.of(tq(used=6, reservations=(res("me", 3),)))
    c = book.check("batch", cpu(3))
    assert not c.admits
    assert c.message() == "team t, batch cpu: 9 of 10 used, pod asks 3"
    again = book.check("batch", cpu(3), excluding={"me"})
    assert again.admits, "a pod asking again for the room it holds is not counted twice"
    assert book.check("batch", cpu(1), spent=cpu(4)).over, "what a round spent counts"


def test_a_band_left_out_grants_nothing() -> None:
    c = Ledger.of(tq(limit=None)).check("batch", cpu(1))
    assert not c.granted and not c.admits
    assert "team t has no batch quota" in c.message()


def test_with_reservations_replaces_a_pod_s_earlier_one_and_keeps_the_sum() -> None:
    book = Ledger.of(tq(reservations=(res("a", 2), res("b", 1))))
    new = Reservation("a", "ns/a", "batch", cpu(4), "2026-01-01T00:00:01Z")
    written = book.with_reservations([new])
    assert [r["uid"] for r in written["status"]["reservations"]] == ["b", "a"]
    assert written["status"]["reserved"] == {"batch": {"cpu": "5", "pods": 2}}
    assert written["metadata"]["resourceVersion"] == "5", "conditional on what was read"
    assert Ledger.of(written).held("batch")[CPU] == 5


def test_reservation_for_a_pod_being_created_without_a_name() -> None:
    pod = {"metadata": {"generateName": "web-", "namespace": "shop", "uid": "u1"}}
    r = ledger.reservation_for(pod, "batch", cpu(1), NOW)
    assert r.wire() == {
        "pod": "shop/web-",
        "uid": "u1",
        "band": "batch",
        "resources": {"cpu": "1", "pods": 1},
        "time": "2026-01-01T00:00:00Z",
    }


def test_quota_for_picks_the_first_by_name_for_every_reader() -> None:
    a, b = tq(name="b-quota"), tq(name="a-quota")
    assert ledger.quota_for("t", [a, b]) is b
    assert ledger.quota_for("other", [a, b]) is None


# --- pods and settling ---------------------------------------------------------------------


def pod(uid: str, cpu_: int, *, gated: bool = False, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": str(cpu_)}}}]
    }
    if gated:
        spec["schedulingGates"] = [{"name": "gates.pilotfish.io/quota-available"}]
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_charge_of_a_pod() -> None:
    assert ledger.charge_of(pod("a", 2)) == Charge("a", "batch", cpu(2), "counted")
    assert ledger.charge_of(pod("g", 2, gated=True)).state == "held"
    assert ledger.charge_of(pod("d", 2, phase="Succeeded")).state == "gone"
    leaving = pod("l", 2)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert ledger.charge_of(leaving).state == "gone"
    foreign = pod("f", 1)
    foreign["spec"]["schedulingGates"] = [{"name": "example.com/x"}]
    assert ledger.charge_of(foreign).state == "counted", "only Pilotfish's gates hold a pod"
    assert ledger.used_of(
        map(ledger.charge_of, [pod("a", 2), pod("b", 1), pod("g", 5, gated=True)])
    ) == {"batch": {CPU: Fraction(3), "pods": Fraction(2)}}


def test_settle_keeps_what_is_still_owed() -> None:
    book = Ledger.of(
        tq(reservations=tuple(res(u, 1) for u in ("counted", "gated", "gone", "new", "old")))
    )
    charges = {
        c.uid: c
        for c in map(
            ledger.charge_of,
            [pod("counted", 1), pod("gated", 1, gated=True), pod("gone", 1, phase="Failed")],
        )
    }
    kept = settle(book, charges, expired=lambda uid: uid == "old")
    # counted: `used` counts it now; gated: it holds its room until released; gone: nothing;
    # new: its pod may still appear; old: its pod never did.
    assert [r.uid for r in kept] == ["gated", "new"]


# --- the gate controller's condition -------------------------------------------------------


@pytest.mark.parametrize(
    ("quota", "ask", "ok", "says"),
    [
        (tq(used=6), 2, True, "team t, batch: TeamQuota t: cpu 6/10 used, pod asks 2"),
        (tq(used=6, reservations=(res("x", 3),)), 2, False, "cpu 9/10 used, pod asks 2"),
        (tq(limit=None), 1, False, "TeamQuota t does not grant the batch band"),
        (tq(team="other"), 1, False, "team t has no TeamQuota"),
    ],
)
def test_gate_condition_counts_reservations(
    quota: dict[str, Any], ask: int, ok: bool, says: str
) -> None:
    v = gate_condition("t", "batch", cpu(ask), [Ledger.of(quota)])
    assert v.satisfied is ok
    assert says in v.evidence


def test_gate_condition_summary_is_stable_while_usage_moves() -> None:
    a = gate_condition("t", "batch", cpu(2), [Ledger.of(tq(used=9))])
    b = gate_condition("t", "batch", cpu(2), [Ledger.of(tq(used=10))])
    assert a.evidence != b.evidence
    assert a.summary == b.summary == "quota of team t, band batch full on cpu"
    assert gate_condition("", "batch", cpu(1), []).summary == "no team"


def test_a_gang_is_reserved_together_or_not_at_all() -> None:
    gang = [Release(u, f"ns/{u}", "batch", cpu(3)) for u in ("a", "b", "c")]
    spend = release_decision(gang, "2026-01-01T00:00:00Z")
    assert spend(Ledger.of(tq(used=2))) == "team t, batch cpu: 2 of 10 used, pod asks 9"
    out = spend(Ledger.of(tq(used=1)))
    assert not isinstance(out, str) and [r.uid for r in out] == ["a", "b", "c"]
    # A member already holding its room (a release retried) is not reserved again.
    out = spend(Ledger.of(tq(used=1, reservations=(res("a", 3),))))
    assert not isinstance(out, str) and [r.uid for r in out] == ["b", "c"]
    unlimited = tq()
    unlimited["spec"]["bands"]["batch"] = {}
    assert spend(Ledger.of(unlimited)) == [], "a band without limits needs no reservation"
