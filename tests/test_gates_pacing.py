"""Release pacing with a fake clock: the rate per tenant and the in-flight cap."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish.gates import GateRecord
from pilotfish.operators.gates.model import Pacing, PodView, namespace_pacing
from pilotfish.operators.gates.pacing import Bucket, bucket_for, burst_for, in_flight_allows
from pilotfish.operators.gates.plan import Plan, RemoveGate
from tests.test_gates_builders import NOW, at, decide, rec, signal, view, world


def released(d: Plan) -> list[str]:
    return sorted({a.pod.name for a in d.actions if isinstance(a, RemoveGate) and a.final})


def ready_pods(n: int, ns: str = "team-a") -> list[PodView]:
    recs: dict[str, GateRecord] = {"data": rec()}
    return [view(f"p{i:02d}", recs, ns=ns, age=100 - i) for i in range(n)]


def test_bucket_refills_at_rate_up_to_burst() -> None:
    b = Bucket.full(2.0, 0.0)
    assert b.burst == 2 and b.tokens == 2
    b = b.take(2, 0.0)
    assert not b.available(0.0)
    assert b.ready_at(0.0) == 0.5
    assert b.available(0.5)
    assert b.refill(100.0).tokens == 2  # never more than the burst


def test_gang_may_overdraw_and_the_debt_delays_the_next_release() -> None:
    b = Bucket.full(1.0, 0.0).take(4, 0.0)  # a gang of 4 against a burst of 1
    assert b.tokens == -3
    assert b.ready_at(0.0) == 4


@pytest.mark.parametrize(("rate", "burst"), [(0.5, 1), (1.0, 1), (2.5, 2), (50.0, 50)])
def test_burst_is_one_second_of_releases_at_least_one(rate: float, burst: int) -> None:
    assert burst_for(rate) == burst


def test_rate_change_keeps_earned_tokens_clipped_to_new_burst() -> None:
    old = Bucket.full(10.0, 0.0)
    new = bucket_for(Pacing(releases_per_second=1.0), old, 0.0)
    assert new is not None and new.rate == 1.0 and new.tokens == 1.0
    assert bucket_for(Pacing(max_in_flight=3), old, 0.0) is None


@pytest.mark.parametrize(
    ("cap", "in_flight", "n", "ok"),
    [
        (None, 100, 5, True),
        (3, 2, 1, True),
        (3, 3, 1, False),
        (3, 2, 2, False),
        (3, 0, 5, True),  # a gang bigger than the cap goes when nothing else is in flight
        (3, 1, 5, False),
    ],
)
def test_in_flight_cap(cap: int | None, in_flight: int, n: int, ok: bool) -> None:
    assert in_flight_allows(Pacing(max_in_flight=cap), in_flight, n) is ok


def test_namespace_pacing_takes_the_tightest_of_all_policies() -> None:
    def policy(name: str, ns: str, **pacing: float) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": ns}, "spec": {"pacing": pacing}}

    out = namespace_pacing(
        [
            policy("a", "x", releasesPerSecond=5, maxInFlight=10),
            policy("b", "x", releasesPerSecond=2),
            policy("c", "y", maxInFlight=4),
            {"metadata": {"name": "d", "namespace": "z"}, "spec": {}},
        ]
    )
    assert out["x"] == Pacing(2.0, 10, ("a", "b"))
    assert out["y"] == Pacing(None, 4, ("c",))
    assert "z" not in out


def test_release_rate_with_a_fake_clock() -> None:
    """2 releases/s: a burst of 2, then one every half second, never faster."""
    pods = ready_pods(6)
    pacing = {"team-a": Pacing(releases_per_second=2.0)}
    buckets: dict[str, Bucket] = {}
    out: list[tuple[float, list[str]]] = []
    gone: set[str] = set()
    for t in (0.0, 0.1, 0.5, 0.6, 1.0, 1.5):
        todo = [p for p in pods if p.name not in gone]
        w = world(todo, signals=[signal("data")], pacing=pacing, buckets=buckets)
        d = decide(w, at(t))
        buckets = dict(d.buckets)
        names = released(d)
        gone |= set(names)
        out.append((t, names))
    assert out == [
        (0.0, ["p00", "p01"]),
        (0.1, []),
        (0.5, ["p02"]),
        (0.6, []),
        (1.0, ["p03"]),
        (1.5, ["p04"]),
    ]


def test_held_by_rate_wakes_up_when_the_next_token_is_due() -> None:
    pods = ready_pods(3)
    pacing = {"team-a": Pacing(releases_per_second=0.5)}
    d = decide(world(pods, signals=[signal("data")], pacing=pacing), NOW)
    assert released(d) == ["p00"]
    assert d.wake_after == 2


def test_in_flight_cap_counts_released_pods_not_yet_bound() -> None:
    ready = ready_pods(4)
    in_flight = [view("old1", None, age=500), view("old2", None, age=500, node="kwok-1")]
    pacing = {"team-a": Pacing(max_in_flight=2)}
    d = decide(world([*ready, *in_flight], signals=[signal("data")], pacing=pacing), NOW)
    # old1 is released and unbound (1 in flight), old2 is bound: one slot left, for p00.
    assert released(d) == ["p00"]
    held = d.waiting["team-a/p01"]
    assert "maxInFlight 2" in held and "2 released pods not yet bound" in held


def test_pacing_is_per_tenant() -> None:
    a, b = ready_pods(3, "ns-a"), ready_pods(3, "ns-b")
    sigs = [signal("data", ns="ns-a"), signal("data", ns="ns-b")]
    d = decide(world([*a, *b], signals=sigs, pacing={"ns-a": Pacing(max_in_flight=1)}), NOW)
    got = sorted(a.pod.key for a in d.actions if isinstance(a, RemoveGate))
    assert got == ["ns-a/p00", "ns-b/p00", "ns-b/p01", "ns-b/p02"]


# Up to 30 rounds of 60 pods an example: past hypothesis's 200 ms on a loaded machine.
@settings(deadline=None)
@given(
    rate=st.floats(min_value=0.2, max_value=20.0),
    steps=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=30),
)
def test_releases_never_exceed_burst_plus_rate_times_elapsed(
    rate: float, steps: list[float]
) -> None:
    pods = ready_pods(60)
    pacing = {"team-a": Pacing(releases_per_second=rate)}
    buckets: dict[str, Bucket] = {}
    t = 0.0
    gone: set[str] = set()
    for dt in steps:
        t += dt
        d = decide(
            world(
                [p for p in pods if p.name not in gone],
                signals=[signal("data")],
                pacing=pacing,
                buckets=buckets,
            ),
            NOW + datetime.timedelta(seconds=t),
        )
        buckets = dict(d.buckets)
        gone |= set(released(d))
        assert len(gone) <= burst_for(rate) + rate * t + 1e-6
