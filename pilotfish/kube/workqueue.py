"""A de-duplicating work queue with the semantics of client-go's workqueue, for asyncio.

- A key waits in the queue at most once, however often it is added (deduplication).
- A key is never handed to two workers at once; added again while being processed, it is
  processed again after `done` (so no change is lost and no two workers race on one key).
- `add_after` schedules a wake-up (`deadline - now`, never a polling loop); the earliest
  pending wake-up per key wins.
- `add_rate_limited` backs a failing key off exponentially; `forget` resets it on success.

Plus a token-bucket `RateLimiter`, because no Python Kubernetes client limits its own rate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger("pilotfish.workqueue")


class ShutDown(Exception):
    pass


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        base_backoff: float = 0.05,
        max_backoff: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.clock = clock
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._wake = asyncio.Event()
        self._shutdown = False

    def __len__(self) -> int:
        """Keys waiting to be processed (not counting those in flight or scheduled later)."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return len(self._processing)

    def add(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wake.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        due = self.clock() + delay
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        handle = asyncio.get_running_loop().call_later(delay, self._fire, key)
        self._timers[key] = (due, handle)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def backoff(self, key: K) -> float:
        """The delay the next `add_rate_limited(key)` will use."""
        n = self._failures.get(key, 0)
        return float(min(self.max_backoff, self.base_backoff * (2**n)))

    def add_rate_limited(self, key: K) -> float:
        delay = self.backoff(key)
        self._failures[key] = self._failures.get(key, 0) + 1
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        while not self._queue:
            if self._shutdown:
                raise ShutDown(self.name)
            self._wake.clear()
            await self._wake.wait()
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake.set()

    def shut_down(self) -> None:
        self._shutdown = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._wake.set()

    async def run(self, workers: int, handle: Callable[[K], Awaitable[None]]) -> None:
        """Process keys with `workers` concurrent workers until shut down.

        A handler that raises is logged and its key re-queued with backoff; one that returns
        normally resets the key's backoff. Handlers schedule their own later wake-ups.
        """

        async def worker() -> None:
            while True:
                try:
                    key = await self.get()
                except ShutDown:
                    return
                try:
                    await handle(key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    delay = self.add_rate_limited(key)
                    log.exception(
                        "handler failed; requeued",
                        extra={"queue": self.name, "key": str(key), "retry_in": delay},
                    )
                else:
                    self.forget(key)
                finally:
                    self.done(key)

        await asyncio.gather(*(worker() for _ in range(workers)))


class RateLimiter:
    """Token bucket: at most `rate` acquisitions per second on average, bursts up to `burst`."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def try_acquire(self) -> bool:
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def wait_time(self) -> float:
        """Seconds until one token is available (0 if one is now)."""
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate)

    async def acquire(self) -> None:
        async with self._lock:
            # Sleeps exactly until the next token is due, not a polling interval.
            while not self.try_acquire():  # noqa: ASYNC110
                await asyncio.sleep(self.wait_time())
