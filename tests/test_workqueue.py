"""The work queue's promises: dedup, one worker per key, re-processing after done, backoff."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.kube.workqueue import RateLimiter, ShutDown, WorkQueue


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

    async def handle(key: int) -> None:
        if key in active:
            overlaps.append(key)
        active.add(key)
        await asyncio.sleep(0.001)
        q.add(key) if len(processed) < 200 else None
        processed.append(key)
        active.discard(key)
        if len(processed) >= 200:
            enough.set()

    for k in range(5):
        q.add(k)
    runner = asyncio.create_task(q.run(8, handle))
    await asyncio.wait_for(enough.wait(), 10)
    q.shut_down()
    await asyncio.wait_for(runner, 5)
    assert overlaps == []


async def test_failures_back_off_exponentially_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue("t", base_backoff=0.01, max_backoff=0.05)
    assert [q.add_rate_limited("a") for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    q.forget("a")
    assert q.backoff("a") == 0.01
    assert await asyncio.wait_for(q.get(), 1) == "a"


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
    q: WorkQueue[str] = WorkQueue("t", base_backoff=0.01)
    calls: list[str] = []
    succeeded = asyncio.Event()

    async def handle(key: str) -> None:
        calls.append(key)
        if len(calls) < 3:
            raise RuntimeError("transient")
        succeeded.set()

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
    now = [0.0]
    rl = RateLimiter(rate, burst, clock=lambda: now[0])
    granted = 0
    for step in steps:
        now[0] += step
        while rl.try_acquire():
            granted += 1
    assert granted <= burst + rate * now[0] + 1e-6
