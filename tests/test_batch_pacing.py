"""Pacing: a job never has more unbound pods than its limit, the limit follows the bind
rate, creates start slow and stop at the first refusal, and `creationRate` holds."""

from __future__ import annotations

from typing import Any

from pilotfish.api.batchworkload import BatchWorkload
from pilotfish.operators.batchworkload.decide import decide
from pilotfish.operators.batchworkload.model import Observed, Pace, Task
from pilotfish.operators.batchworkload.pacing import (
    BACKOFF_MAX_SECONDS,
    MAX_IN_FLIGHT,
    MAX_SYNC_PERIOD_SECONDS,
    MIN_IN_FLIGHT,
    BindRate,
    backoff_seconds,
    in_flight_limit,
    slow_start,
)
from pilotfish.timeutil import FakeClock
from tests.batch_harness import Cluster, World, batch, start


async def world(spec: dict[str, Any]) -> World:
    return await start(Cluster(), FakeClock(), create=spec)


def test_the_limit_is_the_bind_rate_over_a_few_seconds_within_bounds() -> None:
    assert in_flight_limit(0.0) == MIN_IN_FLIGHT
    assert in_flight_limit(50.0) == 100  # 2 s of binds: headroom left for production
    assert in_flight_limit(10_000.0) == MAX_IN_FLIGHT
    assert in_flight_limit(50.0, sync_period=0.5) == 125  # plus one sync's worth
    assert in_flight_limit(50.0, sync_period=60.0) == 50 * (2 + MAX_SYNC_PERIOD_SECONDS)
    rate = BindRate(started=0.0)
    for i in range(100):
        rate.bound(5.0 + i * 0.05)  # 100 binds between 5 s and 10 s
    assert rate.per_second(10.0) == 10.0
    assert rate.per_second(30.0) == 0.0  # nothing within the window any more


def test_slow_syncs_do_not_spiral_the_pace_down() -> None:
    # A job that syncs every `period` seconds creates what its limit leaves room for; the
    # pods bind `latency` seconds after creation. Its bind rate is what it created per
    # period. With the sync period in the limit the pace grows to the cap however slowly
    # the API answers; with 2 s of binds alone it decayed to the floor once syncs took >2 s.
    for period in (0.5, 1.0, 2.5, 4.0):
        latency = 0.2
        rate = 10.0
        for _ in range(20):
            unbound = rate * latency
            room = max(0.0, in_flight_limit(rate, period) - unbound)
            rate = room / period
        assert rate * (2 + period) >= MAX_IN_FLIGHT, period


def test_slow_start_doubles_and_backoff_doubles_to_a_cap() -> None:
    assert slow_start(20, 100) == [1, 2, 4, 8, 5]
    assert slow_start(100, 16) == [1, 2, 4, 8, 16, 16, 16, 16, 16, 5]
    assert [backoff_seconds(n, 10.0) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert backoff_seconds(30, 10.0) == BACKOFF_MAX_SECONDS


async def test_unbound_pods_never_exceed_the_limit_and_it_grows_with_binds() -> None:
    w = await world(batch(completions=2000, parallelism=2000))
    try:
        for _ in range(3):  # nothing binds: the job stays at the minimum
            await w.converge()
            w.clock.advance(1)
        assert len(w.api.unbound()) == MIN_IN_FLIGHT
        assert w.api.status()["pacing"]["inFlight"] == MIN_IN_FLIGHT
        limits = []
        for _ in range(16):  # the scheduler binds everything each half second
            for p in w.api.unbound():
                w.api.bind(p["metadata"]["name"])
            w.clock.advance(0.5)
            await w.converge()
            pacing = w.api.status()["pacing"]
            limit = pacing["limit"]
            limits.append(limit)
            # The limit follows the sync period too, so it may be lower now than at the
            # sync that created these pods, but never above what the bind rate allows.
            most = in_flight_limit(pacing["bindsPerSecond"], MAX_SYNC_PERIOD_SECONDS)
            assert len(w.api.unbound()) <= most and limit <= MAX_IN_FLIGHT
        assert limits[-1] > 4 * MIN_IN_FLIGHT
        assert w.api.status()["pacing"]["bindsPerSecond"] > 0
    finally:
        await w.stop()


async def test_a_refused_create_costs_one_call() -> None:
    w = await world(batch(completions=50, parallelism=50))
    try:
        w.api.fail_next("POST", "/pods", 403)
        result = await w.step()
        assert result.retry
        assert len(w.api.creates()) == 1
        assert "FailedCreate" in {e["reason"] for e in await w.events()}
        await w.converge()
        assert len(w.api.live()) == MIN_IN_FLIGHT
    finally:
        await w.stop()


async def test_creation_rate_caps_creates_per_second() -> None:
    w = await world(batch(completions=100, parallelism=100, creationRate=2.0))
    try:
        result = await w.converge()
        assert len(w.api.creates()) == 2
        assert result.after is not None and 0 < result.after <= 1.1
        w.clock.advance(1.0)
        await w.converge()
        assert len(w.api.creates()) == 4
    finally:
        await w.stop()


def observed(
    spec: dict[str, Any], status: dict[str, Any], tasks: list[Task], limit: int
) -> Observed:
    bw = batch(**spec)
    bw["metadata"] |= {"uid": "u1", "resourceVersion": "7", "generation": 1}
    bw["status"] = status
    return Observed(
        key="ns/job",
        bw=bw,
        model=BatchWorkload.model_validate(bw),
        tasks=tuple(tasks),
        pace=Pace(limit=limit, binds_per_second=0.0),
        now="2026-01-01T00:00:00Z",
        mono=100.0,
    )


def task(index: int, phase: str = "Running", *, bound: bool = True) -> Task:
    return Task(
        name=f"job-{index}-0",
        uid=f"uid-{index}",
        index=index,
        attempt=0,
        failures=0,
        phase=phase,
        bound=bound,
        gang_gated=False,
        finalizers=("pilotfish.io/batch-tracking",),
        terminating=False,
        disrupted=False,
    )


def test_a_hundred_thousand_task_job_takes_the_lowest_missing_indexes() -> None:
    """Half done with stragglers: the sync picks the lowest indexes with no pod, as many as
    the limit allows, and its status stays a few bytes."""
    status = {"completedIndexes": "0-49999,50003-59999", "succeeded": 59997}
    tasks = [task(50_000), task(60_000, bound=False), task(60_001, "Succeeded")]
    plan = decide(observed({"completions": 100_000, "parallelism": 100_000}, status, tasks, 5))
    assert [c.index for c in plan.creates] == [50_001, 50_002, 60_002, 60_003]  # 5 - 1 unbound
    assert plan.status is not None
    written = plan.status.status
    assert written["completedIndexes"] == "0-49999,50003-59999,60001"
    assert written["succeeded"] == 59_998
    assert written["waiting"] == 100_000 - 59_998 - 2
    assert len(str(written)) < 1_000


async def test_syncs_of_a_busy_job_are_coalesced_but_not_its_completion() -> None:
    w = await start(
        Cluster(), FakeClock(), sync_interval=10.0, create=batch(completions=4, parallelism=4)
    )
    try:
        await w.step()
        assert len(w.api.live()) == 4
        writes = len(w.api.writes())
        w.api.bind("job-0-0")
        result = await w.step()
        assert result.after is not None and 9.0 < result.after <= 10.0
        assert len(w.api.writes()) == writes  # nothing written between syncs
        w.api.run_all()  # the last tasks succeed: the job may be complete, synced now
        await w.step()
        assert w.api.condition("Complete") == ("True", "Completed")
    finally:
        await w.stop()


def test_slow_start_carries_over_from_a_sync_whose_creates_all_succeeded() -> None:
    assert slow_start(20, 100, first=8) == [8, 12]
    assert slow_start(3, 100, first=0) == [1, 2]
    assert slow_start(50, 16, first=64) == [16, 16, 16, 2]


async def test_the_next_sync_starts_where_a_clean_one_left_off_and_a_refusal_resets() -> None:
    w = await world(batch(completions=100, parallelism=100))
    key = "ns/job"
    try:
        await w.step()
        made = len(w.api.creates())
        assert made > 1
        assert w.ctrl.executor.next_batch[key] > 1  # proven: no restart at 1
        for p in w.api.live():
            w.api.bind(p["metadata"]["name"])
        w.api.fail_next("POST", "/pods", 422)
        w.clock.advance(5.0)
        await w.step()
        # The sync's first batch went out whole (carried over, not 1) and met the refusal.
        assert len(w.api.creates()) - made > 1
        assert key not in w.ctrl.executor.next_batch  # back to 1
    finally:
        await w.stop()


def test_pods_in_flight_longer_than_the_horizon_do_not_spiral_the_pace_down() -> None:
    # Little's law: pods that take `latency` s to bind keep rate * latency in flight. With
    # 2 s of binds (plus a sync) as the whole allowance, a 5 s latency cut the rate to 2.5/5
    # of itself each round, down to the floor (benchmarks/scale's last jobs at 0.3 pods/s);
    # with the shortest latency in the allowance the pace holds or grows.
    period, latency = 0.5, 5.0
    for allowed in (0.0, latency):
        rate = 40.0
        for _ in range(30):
            rate = in_flight_limit(rate, period, allowed) / latency
        if allowed:
            assert rate >= 40.0
        else:
            assert rate <= MIN_IN_FLIGHT / latency


def test_the_window_remembers_its_shortest_measured_latency() -> None:
    rate = BindRate(started=0.0)
    assert rate.shortest_latency(1.0) == 0.0
    rate.bound(1.0, None)  # bound before this process saw it unbound: not measured
    rate.bound(2.0, 3.0)
    rate.bound(3.0, 1.5)
    rate.bound(4.0, 2.0)
    assert rate.shortest_latency(4.0) == 1.5
    assert rate.shortest_latency(13.5) == 2.0  # the 1.5 s bind left the 10 s window
    assert in_flight_limit(10.0, 0.5, 4.0) == 80  # 2 x 4 s beats 2.5 s


async def test_a_scheduler_slower_than_the_horizon_still_gets_a_growing_pipeline() -> None:
    # Every pod binds 5 s after it is created (a busy scheduler's steady latency): the
    # controller measures that from its informer and keeps 2 x 5 s of binds in flight, so
    # the rate climbs; with 2.5 s of binds it would stay at the floor, MIN_IN_FLIGHT / 5 s.
    w = await world(batch(completions=20_000, parallelism=20_000))
    try:
        born: dict[str, float] = {}
        for _ in range(120):  # a minute of half-second syncs
            now = w.clock.monotonic()
            for p in w.api.unbound():
                name = p["metadata"]["name"]
                if now - born.setdefault(name, now) >= 5.0:
                    w.api.bind(name)
            w.clock.advance(0.5)
            await w.converge()
        pacing = w.api.status()["pacing"]
        assert pacing["bindsPerSecond"] > 5 * MIN_IN_FLIGHT / 5.0
        assert len(w.api.unbound()) <= MAX_IN_FLIGHT
    finally:
        await w.stop()
