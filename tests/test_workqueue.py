"""The work queue's promises: dedup, one worker per key, re-processing after done, and
retries decided by the queue alone from the reconcile's Result."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.kube.workqueue import (
    DONE,
    RETRY,
    ControllerRateLimiter,
    RateLimiter,
    Result,
    ShutDown,
    WorkQueue,
    requeue_after,
    retry,
)
from pilotfish.timeutil import FakeClock


async def test_duplicate_adds_wait_once() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"


async def test_key_readded_while_processing_is_processed_again_after_done() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    key = await q.get()
    q.add("a")  # a change arrives while a worker holds "a"
    assert len(q) == 0, "must not be handed to a second worker now"
    q.done(key)
    assert len(q) == 1
    assert await q.get() == "a"


async def test_never_two_workers_on_one_key() -> None:
    q: WorkQueue[int] = WorkQueue("t")
    active: set[int] = set()
    overlaps: list[int] = []
    processed: list[int] = []
    enough = asyncio.Event()

    async def handle(key: int) -> Result:
        if key in active:
            overlaps.append(key)
        active.add(key)
        await asyncio.sleep(0.001)
        q.add(key) if len(processed) < 200 else None
        processed.append(key)
        active.discard(key)
        if len(processed) >= 200:
            enough.set()
        return DONE

    for k in range(5):
        q.add(k)
    runner = asyncio.create_task(q.run(8, handle))
    await asyncio.wait_for(enough.wait(), 10)
    q.shut_down()
    await asyncio.wait_for(runner, 5)
    assert overlaps == []


async def test_a_key_failing_six_times_backs_off_longer_each_time() -> None:
    """The reconcile fails six times (three exceptions, three RETRY results): each retry waits
    twice as long as the last, as the queue and not the handler decides; success forgets."""
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("t", clock=clock)
    outcomes: list[Result | Exception] = [RETRY, RuntimeError("x"), RETRY, RuntimeError("y")]
    outcomes += [retry("conflict"), RuntimeError("z"), DONE]

    async def reconcile(key: str) -> Result:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    delays: list[float | None] = []
    q.add("a")
    for _ in range(6):
        await q.process_one(reconcile)
        delays.append(q.scheduled("a"))
        clock.advance(delays[-1] or 0)
        q._fire("a")  # the timer's due time on the fake clock
    assert delays == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16])
    assert q.failures("a") == 6
    await q.process_one(reconcile)
    assert q.failures("a") == 0 and q.scheduled("a") is None, "success forgets the failures"


async def test_a_normal_return_does_not_forget_a_retry() -> None:
    """The old rule (a handler that returned normally reset the backoff) made a conflicting
    write retry every 50 ms forever: RETRY must keep counting."""
    q: WorkQueue[str] = WorkQueue("t", clock=FakeClock())

    async def reconcile(key: str) -> Result:
        return RETRY

    for _ in range(3):
        q.add("a")
        await q.process_one(reconcile)
        q._fire("a")
    assert q.failures("a") == 3


async def test_requeue_after_is_a_wait_not_a_failure() -> None:
    q: WorkQueue[str] = WorkQueue("t", clock=FakeClock())
    q.add("a")

    async def fails(key: str) -> Result:
        raise RuntimeError("x")

    async def waits(key: str) -> Result:
        return requeue_after(30)

    await q.process_one(fails)
    q._fire("a")
    await q.process_one(waits)
    assert q.failures("a") == 0
    assert q.scheduled("a") == pytest.approx(30)


def test_per_key_backoff_caps_at_1000_seconds() -> None:
    limiter: ControllerRateLimiter[str] = ControllerRateLimiter(FakeClock())
    delays = [limiter.when("a") for _ in range(30)]
    assert delays[0] == 0.005 and delays[-1] == 1000.0
    assert all(b >= a for a, b in itertools.pairwise(delays))


def test_many_failing_keys_are_held_to_the_global_bucket() -> None:
    """An outage that fails every key at once: after a burst of 100, retries are spaced at
    10 a second whatever each key's own backoff says."""
    limiter: ControllerRateLimiter[int] = ControllerRateLimiter(FakeClock())
    delays = [limiter.when(k) for k in range(300)]
    assert delays[:100] == [0.005] * 100
    assert delays[199] == pytest.approx(10.0)
    assert delays[299] == pytest.approx(20.0)


async def test_add_after_keeps_the_earliest_wakeup() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add_after("a", 10)
    q.add_after("a", 0.01)
    q.add_after("a", 5)
    assert await asyncio.wait_for(q.get(), 1) == "a"
    q.done("a")
    q.shut_down()
    with pytest.raises(ShutDown):
        await q.get()


async def test_handler_error_requeues_with_backoff() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    calls: list[str] = []
    succeeded = asyncio.Event()

    async def handle(key: str) -> Result:
        calls.append(key)
        if len(calls) < 3:
            raise RuntimeError("transient")
        succeeded.set()
        return DONE

    q.add("a")
    runner = asyncio.create_task(q.run(1, handle))
    await asyncio.wait_for(succeeded.wait(), 5)
    await asyncio.sleep(0)  # let the worker record the success
    assert q.failures("a") == 0, "success resets the backoff"
    q.shut_down()
    await asyncio.wait_for(runner, 1)


@given(
    st.floats(min_value=1, max_value=1000),
    st.integers(min_value=1, max_value=50),
    st.lists(st.floats(min_value=0, max_value=2), max_size=50),
)
def test_rate_limiter_never_exceeds_burst_plus_rate_times_elapsed(
    rate: float, burst: int, steps: list[float]
) -> None:
    clock = FakeClock(monotonic_start=0.0)
    rl = RateLimiter(rate, burst, clock=clock)
    granted = 0
    for step in steps:
        clock.advance(step)
        while rl.try_acquire():
            granted += 1
    assert granted <= burst + rate * clock.monotonic() + 1e-6
