"""Batch backs off while the API server's queues grow: while production is active, the
controller's own pod writes answered or shown late slow every job's creates before the next
production pod comes; with production dormant a job keeps the pace of its binds."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pilotfish import metrics
from pilotfish.kube.rest import PODS
from pilotfish.operators.batchworkload.apidelay import (
    BASE_HISTORY_SECONDS,
    CURRENT_WINDOW_SECONDS,
    MIN_RATE,
    TARGET_SECONDS,
    DelayPaced,
    QueueingDelay,
    next_rate,
)
from pilotfish.operators.batchworkload.production import ACTIVE_SECONDS, ARRIVAL_WINDOW_SECONDS
from pilotfish.timeutil import FakeClock
from tests.batch_harness import KEY, NS, Cluster, World, batch, production_pod, start


def test_queueing_is_the_recent_median_over_the_least_lag_of_the_history() -> None:
    d = QueueingDelay()
    assert d.queueing(0.0) is None  # nothing written yet: no signal
    d.sample(0.0, 0.004)
    d.sample(0.5, 0.010)
    assert d.queueing(0.5) == 0.003  # median of 0.004 and 0.010, over the base 0.004
    for at in (10.0, 10.1, 10.2):
        d.sample(at, 0.3)
    assert math.isclose(d.queueing(10.2) or 0.0, 0.296)
    quiet = 10.2 + CURRENT_WINDOW_SECONDS + 0.1
    assert d.queueing(quiet) is None  # nothing recent
    d.sample(quiet, -0.001)  # seen before its answer came back: no lag, and no queueing
    assert d.queueing(quiet) == 0.0
    late = BASE_HISTORY_SECONDS + 60.0
    d.sample(late, 0.2)  # the old base has aged out: a lag lasting that long is the base
    assert d.queueing(late) == 0.0


def test_the_rate_rises_without_a_queue_falls_beyond_the_target_and_holds_at_it() -> None:
    assert math.isclose(next_rate(100.0, 0.0, 1.0, 1000.0), 150.0)
    assert math.isclose(next_rate(100.0, 2 * TARGET_SECONDS, 1.0, 1000.0), 25.0)
    assert math.isclose(next_rate(100.0, 10.0, 1.0, 1000.0), 25.0)  # at most x0.25 a second
    assert math.isclose(next_rate(100.0, TARGET_SECONDS, 1.0, 1000.0), 100.0)
    assert next_rate(100.0, None, 1.0, 1000.0) == 100.0  # no signal: unchanged
    assert next_rate(100.0, 0.0, 1.0, 120.0) == 120.0  # never above the ceiling
    assert next_rate(MIN_RATE, 1.0, 1.0, 1000.0) == MIN_RATE  # never below the floor


@given(
    rate=st.floats(MIN_RATE, 1000.0),
    q1=st.floats(0.0, 5.0),
    q2=st.floats(0.0, 5.0),
    dt=st.floats(0.0, 10.0),
    ceiling=st.floats(0.0, 2000.0),
)
def test_more_queueing_never_allows_more_and_the_rate_stays_in_bounds(
    rate: float, q1: float, q2: float, dt: float, ceiling: float
) -> None:
    lo, hi = sorted((q1, q2))
    assert next_rate(rate, hi, dt, ceiling) <= next_rate(rate, lo, dt, ceiling)
    r = next_rate(rate, lo, dt, ceiling)
    assert MIN_RATE <= r <= max(ceiling, MIN_RATE)


def test_no_cap_until_the_queueing_first_passes_the_target_then_from_the_bind_rate() -> None:
    paced = DelayPaced(0.0)
    assert paced.update(0.5, None, 40.0) is None
    assert paced.update(1.0, TARGET_SECONDS / 2, 40.0) is None
    assert paced.update(1.5, 2 * TARGET_SECONDS, 40.0) == 40.0
    assert (paced.update(2.5, 2 * TARGET_SECONDS, 40.0) or 0.0) < 40.0


async def world(*, production_active: bool) -> World:
    w = await start(Cluster(), FakeClock(), create=batch(completions=20_000, parallelism=20_000))
    if production_active:  # a production pod came and was placed; its arrival window passed
        w.api.put(PODS.path(NS, "web-1"), production_pod("web-1", nodeName="kwok-1"))
        await w.api.settle()
        w.clock.advance(ARRIVAL_WINDOW_SECONDS + 1)
    return w


async def bind_all(w: World) -> None:
    for p in w.api.unbound():
        w.api.bind(p["metadata"]["name"])


async def quiet(w: World, rounds: int) -> list[float]:
    """Every write seen at once; the scheduler binds everything each half second."""
    rates = []
    for _ in range(rounds):
        await bind_all(w)
        w.clock.advance(0.5)
        await w.converge()
        rates.append(w.api.status()["pacing"]["createRate"])
    return rates


async def lagging(w: World, rounds: int) -> list[int]:
    """The API server's queues grow: each write shows 0.5 s after it returned. Returns
    the creates of each round."""
    created = []
    for _ in range(rounds):
        await bind_all(w)
        before = len(w.api.creates())
        async with w.api.lag():
            await w.ctrl.reconcile(KEY)
            w.clock.advance(0.5)
        await w.api.settle()
        created.append(len(w.api.creates()) - before)
    return created


async def test_while_production_is_active_a_job_slows_when_its_writes_show_late() -> None:
    w = await world(production_active=True)
    try:
        await quiet(w, 6)
        pacing = w.api.status()["pacing"]
        assert pacing["createRate"] == 0 and pacing["apiQueueingSeconds"] == 0  # no cap yet
        binding = pacing["bindsPerSecond"]
        assert binding > 20

        created = await lagging(w, 6)
        pacing = w.api.status()["pacing"]
        assert pacing["apiQueueingSeconds"] > TARGET_SECONDS
        slowed = pacing["createRate"]
        assert 0 < slowed < binding / 2, pacing
        assert created[-1] <= math.ceil(slowed), created
        hist = metrics.OWN_WRITES_VISIBLE.labels("batchworkload-pods")
        assert hist._sum.get() > 0  # the lags the job paced on, as a metric too

        rates = await quiet(w, 12)  # the queues drained
        assert rates[-1] > 2 * min(rates), rates  # back up, x1.5 a second
        assert len(w.api.creates()) < 20_000  # still creating: the rate was what held it

        w.clock.advance(ACTIVE_SECONDS)  # no production for ten minutes: the cap goes
        await quiet(w, 2)
        assert w.api.status()["pacing"]["createRate"] == 0
    finally:
        await w.stop()


async def test_with_production_dormant_a_job_keeps_the_pace_of_its_binds() -> None:
    w = await world(production_active=False)
    try:
        await quiet(w, 6)
        binding = w.api.status()["pacing"]["bindsPerSecond"]
        created = await lagging(w, 6)
        pacing = w.api.status()["pacing"]
        assert pacing["createRate"] == 0, pacing  # no cap: batch has the control plane
        assert sum(created[-2:]) > binding / 2, created
    finally:
        await w.stop()
