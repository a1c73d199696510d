"""The pure decision, release phase: releases, order, gangs, quota accounting (expiry, the
State condition and wake-ups: `test_gates_expiry`)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import gates, names
from pilotfish.gates import GateRecord
from pilotfish.operators.gates.model import NodeView, Pacing, PodView, normalize_image
from pilotfish.operators.gates.pacing import Bucket
from pilotfish.operators.gates.plan import (
    RemoveGate,
)
from tests.test_gates_builders import (
    NOW,
    at,
    condition,
    decide,
    gate,
    of,
    rec,
    released,
    removed,
    reservation,
    signal,
    team_quota,
    view,
    world,
)

DATA = "gates.pilotfish.io/data"
QUOTA = "gates.pilotfish.io/quota"
GANG = "gates.pilotfish.io/gang"


# --- release -------------------------------------------------------------------------------


def test_gate_signal_ready_releases_the_pod() -> None:
    d = decide(world([view("p", {"data": rec()})], signals=[signal("data")]), NOW)
    [r] = of(d, RemoveGate)
    assert (r.pod.name, r.gate, r.final) == ("p", DATA, True)
    assert "GateSignal team-a/data Ready" in r.evidence
    assert condition(d, "p") is None, "the release is the gate patch alone"


def test_gate_signal_not_ready_keeps_the_gate_and_says_why() -> None:
    d = decide(world([view("p", {"data": rec()})], signals=[signal("data", "False")]), NOW)
    assert of(d, RemoveGate) == []
    c = condition(d, "p")
    assert c is not None
    assert (c.status, c.reason) == ("False", gates.STATE_GATED)
    assert c.message == f"waiting for {DATA} (GateSignal data not Ready)"


def test_met_gate_goes_at_once_while_another_still_holds_the_pod() -> None:
    """Removal in any order: the met gate is removed (not paced, the pod stays gated)."""
    p = view("p", {"data": rec(), "quota": rec("Quota")}, team="t")
    d = decide(
        world([p], signals=[signal("data")], pacing={"team-a": Pacing(max_in_flight=1)}), NOW
    )
    assert [(a.gate, a.final) for a in of(d, RemoveGate)] == [(DATA, False)]
    c = condition(d, "p")
    assert c is not None and c.message == f"waiting for {QUOTA} (team t has no TeamQuota)"


def test_last_gates_go_together_and_are_the_release() -> None:
    p = view("p", {"data": rec(), "quota": rec("Quota")}, team="t")
    q = team_quota("t", batch={"cpu": "4"})
    d = decide(world([p], signals=[signal("data")], quotas=[q]), NOW)
    assert [(a.gate, a.final) for a in of(d, RemoveGate)] == [(DATA, True), (QUOTA, True)]
    quota_ev = next(a.evidence for a in of(d, RemoveGate) if a.gate == QUOTA)
    assert quota_ev == "team t, batch: TeamQuota t: cpu 0/4 used, pod asks 1"


def test_gates_the_controller_does_not_own_are_never_removed() -> None:
    p = view("p", {"data": rec(), "mine": rec(owner="someone-else")}, unrecorded=["stray"])
    d = decide(world([p], signals=[signal("data")]), NOW)
    assert removed(d) == [("p", DATA)]
    c = condition(d, "p")
    assert c is not None and "not managed by the gate controller" in c.message


def test_other_owners_gates_are_left_and_reported() -> None:
    p = view("p", {"data": rec()}, other_gates=["example.com/warmup"])
    d = decide(world([p], signals=[signal("data")]), NOW)
    [r] = of(d, RemoveGate)
    assert (r.gate, r.final) == (DATA, True), "ours are all gone: released, as far as we go"
    # No condition: `kubectl pilotfish why` names the other owner's gate from the spec.
    assert condition(d, "p") is None


def test_finished_and_deleting_pods_are_left_alone() -> None:
    pods = [
        view("done", {"data": rec(deadline=-1)}, phase="Succeeded"),
        view("bye", {"data": rec(deadline=-1)}, deleting=True),
    ]
    d = decide(world(pods, signals=[signal("data")]), NOW)
    assert d.actions == ()


def test_held_by_pacing_the_gates_stay_all_on() -> None:
    """All conditions met but paced: nothing is removed, or the pod would leak to the
    scheduler past the pacing."""
    pods = [view(f"p{i}", {"data": rec(), "img": rec("Image")}, age=9 - i) for i in range(2)]
    pacing = {"team-a": Pacing(max_in_flight=1)}
    warm = NodeView("n1", True, frozenset({normalize_image("registry.example/app:1")}))
    d = decide(world(pods, signals=[signal("data")], pacing=pacing, nodes=[warm]), NOW)
    assert removed(d) == [("p0", DATA), ("p0", gate("img"))]
    c = condition(d, "p1")
    assert c is not None and "queued by the release pacing" in c.message


# --- order ---------------------------------------------------------------------------------


def one_at_a_time(
    pods: list[PodView], extra: Sequence[PodView] = (), rounds: int = 10
) -> list[str]:
    """Release order when the tenant may release one pod per round (1/s, a round a second)."""
    order: list[str] = []
    pacing = {"team-a": Pacing(releases_per_second=1.0)}
    buckets: dict[str, Bucket] = {}
    inflight: list[PodView] = list(extra)
    todo = list(pods)
    for i in range(rounds):
        d = decide(
            world([*todo, *inflight], signals=[signal("data")], pacing=pacing, buckets=buckets),
            at(i),
        )
        buckets = dict(d.buckets)
        now = released(d)
        order += now
        # A released pod stays in flight (released, not bound) under its own team.
        for p in todo:
            if p.name in now:
                inflight.append(view(p.name, None, team=p.labels.get(names.LABEL_TEAM), ns="x"))
        todo = [p for p in todo if p.name not in now]
    return order


def test_order_priority_first() -> None:
    pods = [
        view("old-low", {"data": rec()}, priority=0, age=500),
        view("new-high", {"data": rec()}, priority=100, age=1),
        view("mid", {"data": rec()}, priority=50, age=10),
    ]
    assert one_at_a_time(pods) == ["new-high", "mid", "old-low"]


def test_order_then_fair_share_between_teams() -> None:
    """Team a's pods are all older, but teams take turns by released-in-flight count."""
    pods = [view(f"a{i}", {"data": rec()}, team="a", age=100 - i) for i in range(3)] + [
        view(f"b{i}", {"data": rec()}, team="b", age=50 - i) for i in range(3)
    ]
    assert one_at_a_time(pods) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_fair_share_counts_what_is_already_in_flight() -> None:
    pods = [
        view("a-old", {"data": rec()}, team="a", age=100),
        view("b-new", {"data": rec()}, team="b"),
    ]
    busy = [view(f"a-busy{i}", None, team="a", ns="x") for i in range(2)]
    assert one_at_a_time(pods, busy)[0] == "b-new"


def test_priority_beats_fair_share() -> None:
    pods = [
        view("a-high", {"data": rec()}, team="a", priority=100),
        view("b-low", {"data": rec()}, team="b", age=100),
    ]
    busy = [view(f"a-busy{i}", None, team="a", ns="x") for i in range(3)]
    assert one_at_a_time(pods, busy) == ["a-high", "b-low"]


def test_order_then_age() -> None:
    pods = [view(f"p{age}", {"data": rec()}, age=age) for age in (5, 50, 20)]
    assert one_at_a_time(pods) == ["p50", "p20", "p5"]


# --- gangs ---------------------------------------------------------------------------------


def gang_pod(name: str, ready: bool = True, size: int = 3, **kw: Any) -> PodView:
    """A gang member; one not ready waits on another signal, so another policy gated it."""
    sig, policy = ("data", "policy") if ready else ("not-yet", "policy-not-yet")
    gated = {"data": rec(signal=sig, policy=policy), "gang": rec("Gang", size=size, policy=policy)}
    return view(name, gated, gang="g", **kw)


@pytest.mark.parametrize(
    ("members", "expect"),
    [
        ([gang_pod("a"), gang_pod("b"), gang_pod("c")], ["a", "b", "c"]),
        ([gang_pod("a"), gang_pod("b"), gang_pod("c", ready=False)], []),
        ([gang_pod("a"), gang_pod("b")], []),  # 2 of 3 exist
        # A member released earlier (no gate left) counts as present and ready.
        ([gang_pod("a"), gang_pod("b"), view("c", None, gang="g")], ["a", "b"]),
        # A finished member does not count.
        ([gang_pod("a"), gang_pod("b"), gang_pod("c", phase="Failed")], []),
    ],
)
def test_gang_all_or_nothing(members: list[PodView], expect: list[str]) -> None:
    d = decide(world(members, signals=[signal("data")]), NOW)
    assert released(d) == expect
    gang_removals = sorted(a.pod.name for a in of(d, RemoveGate) if a.gate == GANG)
    assert gang_removals == expect


def test_gang_waits_and_names_the_member_it_waits_for() -> None:
    members = [gang_pod("a"), gang_pod("b"), gang_pod("c", ready=False)]
    d = decide(world(members, signals=[signal("data")]), NOW)
    # The met data gates go now (the gang gate still holds each pod back).
    assert sorted(a.pod.name for a in of(d, RemoveGate)) == ["a", "b"]
    c = condition(d, "a")
    assert c is not None and f"{GANG} (gang g: 2/3 pods ready)" in c.message
    assert "c waits for gates.pilotfish.io/data" in d.waiting["team-a/a"]


@pytest.mark.parametrize(("limit", "expect"), [("2", []), ("3", ["a", "b", "c"])])
def test_gang_quota_is_checked_for_the_whole_gang(limit: str, expect: list[str]) -> None:
    members = [
        view(n, {"gang": rec("Gang", size=3), "quota": rec("Quota")}, gang="g", team="t")
        for n in "abc"
    ]
    d = decide(world(members, quotas=[team_quota("t", batch={"cpu": limit})]), NOW)
    assert released(d) == expect


def test_gang_larger_than_the_in_flight_cap_still_goes_when_nothing_is_in_flight() -> None:
    members = [gang_pod(n) for n in "abc"]
    d = decide(
        world(members, signals=[signal("data")], pacing={"team-a": Pacing(max_in_flight=2)}), NOW
    )
    assert released(d) == ["a", "b", "c"]


# --- quota ---------------------------------------------------------------------------------


def test_quota_counts_releases_within_one_round() -> None:
    pods = [view(f"p{i}", {"quota": rec("Quota")}, team="t", age=10 - i) for i in range(5)]
    d = decide(world(pods, quotas=[team_quota("t", batch={"cpu": "3"})]), NOW)
    assert released(d) == ["p0", "p1", "p2"]
    assert "cpu 3/3 used, pod asks 1" in d.waiting["team-a/p3"]


def test_quota_reads_the_ledger_used_and_reserved_but_not_the_pods_own_reservation() -> None:
    """What is free comes from the one quota ledger: what the quota controller counted
    (`used`) plus the room reserved for pods it does not count yet; a pod that holds a
    reservation (admitted with one) is not counted twice against itself."""
    pods = [
        view("new", {"quota": rec("Quota")}, team="t"),
        view("finished", None, team="t", cpu="2", phase="Succeeded"),
        view("still-gated", {"data": rec()}, team="t", cpu="2"),
    ]
    used = {"batch": {"cpu": "1", "pods": 1}}
    held = [reservation("uid-other", cpu="2", pods=1)]
    d = decide(
        world(pods, quotas=[team_quota("t", batch={"cpu": "4"}, used=used, reservations=held)]), NOW
    )
    assert released(d) == ["new"]
    ev = next(a.evidence for a in of(d, RemoveGate) if a.gate == QUOTA)
    assert "cpu 3/4 used, pod asks 1" in ev
    full = team_quota("t", batch={"cpu": "3"}, used=used, reservations=held)
    assert released(decide(world(pods, quotas=[full]), NOW)) == []
    own = [*held, reservation("uid-new", cpu="1", pods=1)]
    mine = team_quota("t", batch={"cpu": "4"}, used=used, reservations=own)
    assert released(decide(world(pods, quotas=[mine]), NOW)) == ["new"]


def test_quota_refusal_holds_later_pods_of_the_same_team_and_band() -> None:
    """A big pod first in line is not starved by smaller ones behind it; other teams go."""
    pods = [
        view("big", {"quota": rec("Quota")}, team="t", cpu="4", priority=10),
        view("small", {"quota": rec("Quota")}, team="t", cpu="1"),
        view("other-team", {"quota": rec("Quota")}, team="u", cpu="1"),
    ]
    q = [team_quota("t", batch={"cpu": "3"}), team_quota("u", batch={"cpu": "3"})]
    d = decide(world(pods, quotas=q), NOW)
    assert released(d) == ["other-team"]
    assert d.waiting["team-a/small"].startswith("queued behind team-a/big")


POD_SPECS = st.lists(
    st.tuples(
        st.integers(1, 4),  # cpu
        st.sampled_from(["t", "u"]),
        st.sampled_from(["batch", "production"]),
        st.integers(0, 3),  # priority
        st.booleans(),  # in a gang of two
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=200, deadline=None)
@given(
    specs=POD_SPECS,
    limits=st.fixed_dictionaries(
        {(t, b): st.integers(0, 12) for t in ("t", "u") for b in ("batch", "production")}
    ),
    used=st.fixed_dictionaries(
        {(t, b): st.integers(0, 8) for t in ("t", "u") for b in ("batch", "production")}
    ),
    pod_limit=st.integers(1, 8),
)
def test_property_quota_is_never_over_released(
    specs: list[tuple[int, str, str, int, bool]],
    limits: dict[tuple[str, str], int],
    used: dict[tuple[str, str], int],
    pod_limit: int,
) -> None:
    pods = []
    for i, (cpu, team, band, prio, ganged) in enumerate(specs):
        gated: dict[str, GateRecord] = {"quota": rec("Quota")}
        if ganged:
            gated["gang"] = rec("Gang", size=2)
        pods.append(
            view(
                f"p{i}",
                gated,
                cpu=str(cpu),
                team=team,
                band=band,
                priority=prio,
                gang=f"{team}-{band}" if ganged else None,
                age=i,
            )
        )
    quotas = [
        team_quota(
            t,
            None,
            used={b: {"cpu": str(used[(t, b)]), "pods": 1} for b in ("batch", "production")},
            batch={"cpu": str(limits[(t, "batch")]), "pods": pod_limit},
            production={"cpu": str(limits[(t, "production")]), "pods": pod_limit},
        )
        for t in ("t", "u")
    ]
    d = decide(world(pods, quotas=quotas), NOW)
    by_name = {p.name: p for p in pods}
    for t in ("t", "u"):
        for b in ("batch", "production"):
            out = [
                by_name[n]
                for n in released(d)
                if by_name[n].labels[names.LABEL_TEAM] == t and by_name[n].band == b
            ]
            cpu_out = sum((p.requests["cpu"] for p in out), Fraction(0))
            if out:
                assert used[(t, b)] + cpu_out <= limits[(t, b)]
                assert 1 + len(out) <= pod_limit
    # Gangs are all or nothing.
    for g in {p.gang for p in pods if p.gang}:
        members = [p.name for p in pods if p.gang == g]
        got = [n for n in members if n in released(d)]
        assert got == [] or (len(members) >= 2 and got == members)
