"""Batch slows when the API server answers its creates slowly, and speeds back up after.

The rule is pure (`congested`, `next_cap`); `CreateCongestion` keeps the round trips; the
controller test drives the real BatchWorkload controller on the fake API, whose pod creates
are made to take longer on the fake clock, and reads the cap off the job's status.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import metrics
from pilotfish.cli.whybatch import explain_batch
from pilotfish.operators.batchworkload.congestion import (
    ADJUST_SECONDS,
    BASELINE_SECONDS,
    DECREASE,
    MIN_RATE,
    RECENT,
    CreateCongestion,
    congested,
    next_cap,
)
from pilotfish.timeutil import FakeClock
from tests.batch_harness import Cluster, batch, start

FAST = 0.004
SLOW = 0.2


def test_a_queue_is_several_times_and_some_milliseconds_slower() -> None:
    assert not congested(0.008, 0.004)  # jitter of a fast server
    assert not congested(0.03, 0.004)  # 7x, but within the margin
    assert congested(0.1, 0.004)
    assert not congested(0.25, 0.1)  # 2.5x of a slow baseline
    assert congested(0.31, 0.1)


def test_a_cap_is_cut_when_congested_and_grows_back_until_lifted() -> None:
    assert next_cap(None, False, 50.0) is None  # nothing to lift
    cut = next_cap(None, True, 50.0)
    # From the rate it was creating at:
    assert cut is not None and cut == pytest.approx(DECREASE * 50.0)
    assert next_cap(cut, True, 50.0) == pytest.approx(DECREASE * DECREASE * 50.0)
    assert next_cap(6.0, True, 50.0) == MIN_RATE  # never below the floor
    grown = next_cap(cut, False, 50.0)
    assert grown is not None and grown > cut
    cap: float | None = cut
    for _ in range(40):
        cap = next_cap(cap, False, 50.0)
        if cap is None:
            break
    assert cap is None  # far above what binds: no longer a cap


@given(
    st.lists(st.tuples(st.booleans(), st.floats(0.0, 500.0)), min_size=1, max_size=50),
)
def test_a_cap_is_never_below_the_floor(steps: list[tuple[bool, float]]) -> None:
    cap: float | None = None
    for is_congested, rate in steps:
        cap = next_cap(cap, is_congested, rate)
        assert cap is None or cap >= MIN_RATE
        if is_congested:
            assert cap is not None


def test_the_baseline_is_the_fastest_create_of_the_window() -> None:
    c = CreateCongestion()
    c.observed(0.01, 0.0)
    c.observed(0.005, 1.0)
    c.observed(0.02, 2.0)
    assert c.baseline(3.0) == 0.005
    assert c.baseline(BASELINE_SECONDS + 1.5) == 0.02  # the fast one aged out
    assert c.baseline(BASELINE_SECONDS + 3.0) is None


def test_the_cap_moves_only_on_fresh_answers_and_at_most_once_a_period() -> None:
    c = CreateCongestion()
    now = 0.0
    for _ in range(RECENT):
        now += 0.01
        c.observed(FAST, now)
    assert c.cap(now, 40.0) is None
    for _ in range(RECENT):
        now += ADJUST_SECONDS / 8
        c.observed(SLOW, now)
    first = c.cap(now, 40.0)
    assert first is not None and first == pytest.approx(DECREASE * 40.0)
    assert c.cap(now + ADJUST_SECONDS / 2, 40.0) == first  # not within the period
    # The period is over, but no create answered since the cut: nothing new is known.
    assert c.cap(now + 2 * ADJUST_SECONDS, 40.0) == first
    for _ in range(RECENT // 2):
        c.observed(SLOW, now + 2 * ADJUST_SECONDS)
    assert c.cap(now + 3 * ADJUST_SECONDS, 40.0) == pytest.approx(DECREASE * first)


class SlowCreates(Cluster):
    """Pod creates take `latency` seconds of the fake clock to be answered (0 while fast:
    creates made concurrently would otherwise add up each other's)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.latency = 0.0

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if method == "POST" and path.endswith("/pods"):
            self.clock.advance(self.latency)
        return await super().request(method, path, **kw)


async def test_slow_creates_cap_the_job_and_fast_ones_lift_the_cap() -> None:
    clock = FakeClock()
    api = SlowCreates(clock)
    w = await start(api, clock, create=batch(completions=600, parallelism=600))

    async def second() -> int:
        """One second of the cluster: every pod bound, the job synced; creates made."""
        before = len(api.creates())
        for name in api.creates():
            if (
                not (api.obj(f"/api/v1/namespaces/ns/pods/{name}") or {})
                .get("spec", {})
                .get("nodeName")
            ):
                api.bind(name)
        clock.advance(1.0)
        await w.converge()
        return len(api.creates()) - before

    try:
        for _ in range(4):  # fast answers: paced by binds only, no cap
            await second()
        assert w.api.status()["pacing"]["congestionRate"] == 0
        uncapped = await second()
        assert uncapped > 2 * MIN_RATE
        api.latency = SLOW  # the API server's queue builds
        made = [await second() for _ in range(6)]
        pacing = w.api.status()["pacing"]
        assert pacing["congestionRate"] > 0
        assert made[-1] < uncapped / 2
        assert metrics.BATCH_CONGESTION_CAP._value.get() == pacing["congestionRate"]
        says = " ".join(explain_batch(w.api.bw(), clock.now()))
        assert "the API server answers creates slowly" in says
        api.latency = 0.0  # caught up
        for _ in range(40):
            await second()
            if w.api.status()["pacing"]["congestionRate"] == 0:
                break
        assert w.api.status()["pacing"]["congestionRate"] == 0
    finally:
        await w.stop()
