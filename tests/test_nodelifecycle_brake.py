"""The zone brake: a partition-sized silence keeps its pods serving and evicts nothing for
the hold, then at most one node a minute; every zone braked evicts nothing; a single silent
node is a machine failure. The controller over the in-memory API, and the pure rule under
hypothesis."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.nodesilence import MODE_UPSTREAM, SilenceSettings
from pilotfish.operators.nodelifecycle.brake import (
    BrakeRule,
    ZoneBrake,
    may_evict,
    partitioned,
    release,
    zone_braked,
)
from tests.nodelifecycle_harness import Cluster, metric, start

A, B = "unit-brake-a", "unit-brake-b"
ZONE_A = tuple(f"a{i}" for i in range(6))
ZONE_B = tuple(f"b{i}" for i in range(4))


async def two_zones(settings: SilenceSettings | None = None) -> Cluster:
    c = await start(settings=settings)
    for n in ZONE_A:
        c.add_node(n, A)
        c.add_pod(f"p-{n}", n)
    for n in ZONE_B:
        c.add_node(n, B)
        c.add_pod(f"p-{n}", n)
    c.renew(*ZONE_A, *ZONE_B)
    await c.sweep()
    return c


@pytest.fixture
async def partition() -> AsyncIterator[Cluster]:
    """a0 and a1 (2 of 6 in zone a) go silent 5 s apart; b0 (1 of 4 in zone b) at once."""
    c = await two_zones()
    await c.at(5, renewing=(*ZONE_A[1:], *ZONE_B[1:]))
    yield c
    await c.stop()


ALIVE = (*ZONE_A[2:], *ZONE_B[1:])


async def test_two_of_six_brake_the_zone_one_of_four_does_not(partition: Cluster) -> None:
    c = partition
    await c.at(35, renewing=ALIVE)  # a0 and b0 40 s silent, a1 35 s
    assert c.ready(c.node("a0"))[0] == "Unknown", "a braked node is still marked"
    assert c.ready(c.pod("p-a0"))[0] == "True", "its pods keep Ready (and their endpoints)"
    assert c.ready(c.pod("p-b0")) == ("False", "NodeUnreachable"), "1 of 4: a machine failure"
    assert metric("pilotfish_nodelifecycle_zone_brake", zone=A) == 1
    assert metric("pilotfish_nodelifecycle_zone_brake", zone=B) in (None, 0)
    await c.at(5, renewing=ALIVE)  # a1 lost too
    assert c.ready(c.pod("p-a1"))[0] == "True"
    notes = {e["regarding"]["name"]: e["note"] for e in await c.events("ZoneBrake")}
    assert set(notes) == {"a0", "a1"}
    assert "2 of 6" in notes["a0"] and "300s" in notes["a0"]

    await c.at(60, renewing=ALIVE)  # 105 s since a0 went silent
    assert c.evicted("p-b0"), "the single failure is evicted on time"
    assert not c.evicted("p-a0") and not c.evicted("p-a1"), "no eviction while braked"
    # The brake engaged at 40 s: held until 340 s, then one node per minute.
    await c.at(339.9 - 105, renewing=ALIVE)
    assert not c.evicted("p-a0") and not c.evicted("p-a1")
    await c.at(0.1, renewing=ALIVE)
    assert [c.evicted("p-a0"), c.evicted("p-a1")] == [True, False], "one node let go"
    await c.at(59.8, renewing=ALIVE)
    assert not c.evicted("p-a1"), "at most one node a minute"
    await c.at(0.2, renewing=ALIVE)
    assert c.evicted("p-a1")
    for n in ALIVE:
        assert not c.evicted(f"p-{n}")


async def test_a_partition_heals_node_by_node_without_evicting_the_last_ones(
    partition: Cluster,
) -> None:
    """The first lease to resume does not lift the brake: the zone stays braked until every
    node of it is back, and a node still silent meanwhile is held like the others."""
    c = partition
    await c.at(40, renewing=ALIVE)
    assert c.ready(c.pod("p-a0"))[0] == "True"
    await c.at(10, renewing=(*ALIVE, "a1"))  # a1 is back; a0 is still silent
    assert metric("pilotfish_nodelifecycle_zone_brake", zone=A) == 1
    assert c.ready(c.pod("p-a0"))[0] == "True", "still braked: its pods keep serving"
    await c.at(50, renewing=(*ALIVE, "a1"))  # a0 silent 105 s: past its eviction, but held
    assert not c.evicted("p-a0") and not c.evicted("p-a1")
    await c.at(5, renewing=(*ALIVE, "a0", "a1"))  # a0 back too: the brake lifts
    assert metric("pilotfish_nodelifecycle_zone_brake", zone=A) == 0
    assert not c.evicted("p-a0")


async def test_a_node_still_silent_in_a_braked_zone_goes_after_the_hold(
    partition: Cluster,
) -> None:
    c = partition
    await c.at(40, renewing=ALIVE)  # braked at 40 s: held until 340 s
    await c.at(10, renewing=(*ALIVE, "a1"))
    await c.at(289.8, renewing=(*ALIVE, "a1"))
    assert not c.evicted("p-a0")
    await c.at(0.3, renewing=(*ALIVE, "a1"))
    assert c.evicted("p-a0") and not c.evicted("p-a1")


async def test_every_zone_braked_evicts_nothing() -> None:
    c = await two_zones()
    silent = ("a0", "a1", "b0", "b1")
    alive = tuple(n for n in (*ZONE_A, *ZONE_B) if n not in silent)
    for _ in range(100):  # 1000 s
        await c.at(10, renewing=alive)
    for n in silent:
        assert not c.evicted(f"p-{n}")
        assert c.ready(c.pod(f"p-{n}"))[0] == "True"
    assert "every zone is braked" in (await c.events("ZoneBrake"))[-1]["note"]
    await c.stop()


async def test_upstream_mode_reports_the_brake_and_writes_nothing() -> None:
    c = await two_zones(SilenceSettings(mode=MODE_UPSTREAM))
    writes = c.node_writes()
    await c.at(45, renewing=(*ZONE_A[2:], *ZONE_B))
    assert c.node_writes() == writes == 0
    assert {e["regarding"]["name"] for e in await c.events("ZoneBrake")} == {"a0", "a1"}
    assert metric("pilotfish_nodelifecycle_zone_brake", zone=A) == 1
    await c.stop()


# --- the pure rule ----------------------------------------------------------------------

RULE = BrakeRule()
onsets = st.lists(st.floats(0, 600, allow_nan=False), max_size=20)


def brute_force(ts: list[float], size: int, rule: BrakeRule) -> bool:
    counts = [sum(1 for u in ts if t <= u <= t + rule.window) for t in ts]
    best = max(counts, default=0)
    return best >= rule.min_nodes and best > rule.fraction * size


@given(onsets, st.integers(1, 200))
def test_partitioned_is_the_window_rule(ts: list[float], size: int) -> None:
    assert partitioned(ts, size, RULE) == brute_force(ts, size, RULE)


@given(onsets, st.floats(0, 600, allow_nan=False), st.integers(1, 200))
def test_one_more_silence_never_lifts_the_brake(ts: list[float], t: float, size: int) -> None:
    if partitioned(ts, size, RULE):
        assert partitioned([*ts, t], size, RULE)
        assert partitioned(ts, max(1, size - 1), RULE)


@given(st.floats(0, 600, allow_nan=False), st.integers(1, 10_000))
def test_a_single_silent_node_never_brakes(t: float, size: int) -> None:
    assert not zone_braked([1000.0, None, 3.0], size, 40, t)
    assert not partitioned([t], size, RULE)


@given(st.integers(1, 200), st.integers(0, 200))
def test_simultaneous_silence_brakes_above_a_tenth_and_two(size: int, silent: int) -> None:
    silent = min(silent, size)
    braked = zone_braked([45.0] * silent + [1.0] * (size - silent), size, 40, 1000)
    assert braked == (silent >= 2 and silent > size / 10)


@given(st.lists(st.floats(0, 2000, allow_nan=False), max_size=60), st.booleans())
def test_releases_wait_for_the_hold_then_one_a_minute(times: list[float], every: bool) -> None:
    state = ZoneBrake()
    state.update(True, 0.0)
    released: list[float] = []
    for i, t in enumerate(sorted(times)):
        node = f"n{i}"
        if may_evict(state, node, t, every, RULE):
            release(state, node, t)
            released.append(t)
    if every:
        assert released == []
    assert all(t >= RULE.hold for t in released)
    assert all(b - a >= RULE.interval for a, b in itertools.pairwise(released))
