"""The work queue every controller runs on: client-go's workqueue semantics, for asyncio.

- A key waits in the queue at most once, however often it is added (deduplication).
- A key is never handed to two workers at once; added again while being processed, it is
  processed again after `done` (so no change is lost and no two workers race on one key).
- `add_after` schedules a wake-up (`deadline - now`, never a polling loop); the earliest
  pending wake-up per key wins.
- The reconciler returns a `Result` and the queue alone decides what follows (client-go's
  `processNextWorkItem`): DONE and `requeue_after` forget the key's failures; RETRY and an
  exception back it off through `ControllerRateLimiter`. A controller never keeps a retry
  policy of its own, so one process has one.

Plus a token-bucket `RateLimiter` for API writes, because no Python Kubernetes client limits
its own rate.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from pilotfish import metrics
from pilotfish.timeutil import SYSTEM_CLOCK, Clock

K = TypeVar("K", bound=Hashable)
log = logging.getLogger("pilotfish.workqueue")


class ShutDown(Exception):
    pass


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of the queue: nothing more (DONE), a visit after `after`
    seconds (a wait that is not a failure: a deadline, a cache catching up), or a retry with
    backoff (`retry`: a conflict, a refusal that may pass later)."""

    after: float | None = None
    retry: bool = False
    why: str = ""


DONE: Final = Result()
RETRY: Final = Result(retry=True, why="retry")


def requeue_after(seconds: float, why: str = "") -> Result:
    return Result(after=max(0.0, seconds), why=why)


def retry(why: str) -> Result:
    return Result(retry=True, why=why)


def round_refused(
    controller: str, key: str, refusals: Sequence[str], create_errors: Sequence[str]
) -> Result | None:
    """RETRY for a round whose conditional writes were refused (counted and logged: the
    next round decides again from what the refusal proved stale) or whose creates failed;
    None when neither happened and the round's own result stands."""
    if refusals:
        metrics.OPERATOR_CONFLICTS.labels(controller).inc(len(refusals))
        log.info(
            "conditional writes refused; deciding again",
            extra={"controller": controller, "workload": key, "refused": list(refusals[:5])},
        )
        return retry(refusals[0])
    if create_errors:
        return retry(f"pod creates failed: {create_errors[0]}")
    return None


Reconcile = Callable[[K], Awaitable[Result]]

# client-go's DefaultControllerRateLimiter: per item 5 ms doubling to 1000 s, and the whole
# queue at most 10 retries a second after a burst of 100.
BACKOFF_BASE: Final = 0.005
BACKOFF_MAX: Final = 1000.0
BUCKET_RATE: Final = 10.0
BUCKET_BURST: Final = 100


class ControllerRateLimiter(Generic[K]):
    """The later of a per-key exponential backoff and a global token bucket's next slot: one
    failing key backs off alone, while many failing keys together (an API outage) cannot
    retry faster than the bucket allows."""

    def __init__(
        self,
        clock: Clock = SYSTEM_CLOCK,
        *,
        base: float = BACKOFF_BASE,
        cap: float = BACKOFF_MAX,
        rate: float = BUCKET_RATE,
        burst: int = BUCKET_BURST,
    ) -> None:
        self.clock = clock
        self.base, self.cap, self.rate, self.burst = base, cap, rate, burst
        self._failures: dict[K, int] = {}
        self._tokens = float(burst)
        self._last = clock.monotonic()

    def when(self, key: K) -> float:
        """The delay before `key`'s next try, counting this failure."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        item = float(min(self.cap, self.base * 2 ** min(n, 64)))
        return max(item, self._reserve())

    def _reserve(self) -> float:
        now = self.clock.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        limiter: ControllerRateLimiter[K] | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.limiter: ControllerRateLimiter[K] = limiter or ControllerRateLimiter(clock)
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._wake = asyncio.Event()
        self._shutdown = False

    def __len__(self) -> int:
        """Keys waiting to be processed (not counting those in flight or scheduled later)."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return len(self._processing)

    def scheduled(self, key: K) -> float | None:
        """Seconds until `key`'s pending wake-up, if one is scheduled."""
        timer = self._timers.get(key)
        return None if timer is None else max(0.0, timer[0] - self.clock.monotonic())

    def add(self, key: K) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wake.set()
            metrics.OPERATOR_QUEUE_DEPTH.labels(self.name).set(len(self._queue))

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        due = self.clock.monotonic() + delay
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

    def failures(self, key: K) -> int:
        return self.limiter.failures(key)

    async def get(self) -> K:
        while not self._queue:
            if self._shutdown:
                raise ShutDown(self.name)
            self._wake.clear()
            await self._wake.wait()
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        metrics.OPERATOR_QUEUE_DEPTH.labels(self.name).set(len(self._queue))
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

    def settle(self, key: K, result: Result) -> float | None:
        """Apply a reconcile's result; returns the delay scheduled, if any."""
        if result.retry:
            metrics.OPERATOR_RETRIES.labels(self.name).inc()
            delay = self.limiter.when(key)
            self.add_after(key, delay)
            return delay
        self.limiter.forget(key)
        if result.after is not None:
            self.add_after(key, result.after)
        return result.after

    async def process_one(self, reconcile: Reconcile[K]) -> K:
        """Take one key, reconcile it and settle the result (a worker's one step)."""
        key = await self.get()
        try:
            result = await reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            metrics.OPERATOR_RECONCILE_ERRORS.labels(self.name).inc()
            delay = self.settle(key, RETRY)
            log.exception(
                "reconcile failed; requeued",
                extra={"queue": self.name, "key": str(key), "retry_in": delay},
            )
        else:
            self.settle(key, DONE if result is None else result)
        finally:
            self.done(key)
        return key

    async def run(self, workers: int, reconcile: Reconcile[K]) -> None:
        """Process keys with `workers` concurrent workers until shut down."""

        async def worker() -> None:
            while True:
                try:
                    await self.process_one(reconcile)
                except ShutDown:
                    return

        await asyncio.gather(*(worker() for _ in range(workers)))


class RateLimiter:
    """Token bucket: at most `rate` acquisitions per second on average, bursts up to `burst`."""

    def __init__(self, rate: float, burst: int, clock: Clock = SYSTEM_CLOCK) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._last = clock.monotonic()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock.monotonic()
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
