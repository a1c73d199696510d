"""How fast a job's pods go to the scheduler: paced to what it has been placing.

A 100,000-task job created as fast as the API accepts puts 100,000 pods in the scheduler's
queue at once; production pods then wait behind them (the scheduler pops by priority, but
every pod costs a cycle and an informer event everywhere). So a job may have at most `limit`
created-but-unbound pods (gated ones included), and the limit follows the job's measured
bind rate: `binds/s * (HORIZON_SECONDS + the job's sync period)`, within [MIN_IN_FLIGHT,
MAX_IN_FLIGHT]. A scheduler placing 100 pods/s keeps ~250 of the job's pods queued when the
job syncs every 0.5 s: enough never to run dry between syncs, and only 2 s of backlog beyond
one sync's worth in front of a production pod the scheduler gets meanwhile (with 3 s, batch
kept the control plane saturated; production's own hold is `production`). The sync period is
in the formula because a sync can only create what the limit leaves room for: with `binds/s
* 2 s` alone, a job whose syncs took longer than 2 s (a loaded API server answering its
writes slowly) created less each period than it had bound the period before, and its pace
spiralled down to MIN_IN_FLIGHT per sync (3,000 tasks at 5 pods/s while the scheduler bound
12/s for a Job, `benchmarks/batch_job` on a loaded machine). The limit grows while pods bind
faster than the horizon, so it stays well above an unloaded scheduler's created→bound time
(~0.2 s). One placing none (a full cluster) keeps MIN_IN_FLIGHT, enough to notice capacity
coming back. All durations are on the monotonic clock.

A pod in flight for longer than the horizon spirals the pace down the same way (Little's
law: a job binding r pods/s whose pods take L s to bind holds r·L in flight; a limit of
r·2 s < r·L lets it bind only 2/L of what it did, sync after sync): at 1,000 nodes the last
jobs of `benchmarks/scale` fell to 0.3 pods/s. So the allowance is at least LATENCY_GAIN
times the *shortest* created→bound time of the window, as seen by this process: the part
of the latency no queue adds (BBR's min-RTT reasoning), which a longer queue cannot inflate,
so the limit keeps room for the pipeline and no more than as much again for a queue.

Also here: `creationRate` (a token bucket) and the retry backoff of a failed index (the Job
controller's: base * 2^(failures-1), capped at six minutes).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

# The bind rate is measured over the last WINDOW_SECONDS of binds.
WINDOW_SECONDS: Final = 10.0
HORIZON_SECONDS: Final = 2.0
MIN_IN_FLIGHT: Final = 10
MAX_IN_FLIGHT: Final = 400
MAX_SYNC_PERIOD_SECONDS: Final = 5.0
LATENCY_GAIN: Final = 2.0
# Binds remembered per job at most (the window at a very high bind rate).
MAX_SAMPLES: Final = 20_000

BACKOFF_BASE_SECONDS: Final = 10.0
BACKOFF_MAX_SECONDS: Final = 360.0


class BindRate:
    """Binds of one job's pods seen by the pod informer, over a sliding window, each with
    its created→bound time when this process saw the pod unbound first (else None)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self._binds: deque[tuple[float, float | None]] = deque(maxlen=MAX_SAMPLES)

    def bound(self, at: float, latency: float | None = None) -> None:
        self._binds.append((at, latency))

    def _trim(self, now: float) -> None:
        while self._binds and self._binds[0][0] < now - WINDOW_SECONDS:
            self._binds.popleft()

    def per_second(self, now: float) -> float:
        self._trim(now)
        if not self._binds:
            return 0.0
        # A job younger than the window is measured over its own age (at least one second,
        # so the first bind is not read as a huge rate).
        span = max(1.0, min(WINDOW_SECONDS, now - self.started))
        return len(self._binds) / span

    def shortest_latency(self, now: float) -> float:
        """The window's shortest created→bound time (0 with none measured)."""
        self._trim(now)
        return min((lat for _, lat in self._binds if lat is not None), default=0.0)


def in_flight_limit(binds_per_second: float, sync_period: float = 0.0, latency: float = 0.0) -> int:
    """`sync_period`: seconds between the job's syncs, smoothed (its part is capped, so one
    long pause does not open the gates wide); `latency`: the shortest created→bound time
    of the window."""
    horizon = HORIZON_SECONDS + min(max(sync_period, 0.0), MAX_SYNC_PERIOD_SECONDS)
    allowance = max(horizon, LATENCY_GAIN * max(latency, 0.0))
    wanted = math.ceil(binds_per_second * allowance)
    return max(MIN_IN_FLIGHT, min(MAX_IN_FLIGHT, wanted))


class TokenBucket:
    """`creationRate` creates per second, with a burst of one second's worth (at least 1)."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.tokens = self.burst
        self.last = now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def room(self, now: float, rate: float) -> int:
        if rate != self.rate:
            self.rate, self.burst = rate, max(1.0, rate)
        self._refill(now)
        return int(self.tokens)

    def wait(self) -> float:
        """Seconds until one more create is allowed (after `room`)."""
        return max(0.0, (1.0 - (self.tokens - int(self.tokens))) / self.rate)

    def take(self, n: int) -> None:
        self.tokens -= n


def backoff_seconds(failures: int, base: float = BACKOFF_BASE_SECONDS) -> float:
    """Wait before the next attempt of an index that failed `failures` times (≥ 1)."""
    exponent = min(max(failures, 1) - 1, 32)
    return float(min(BACKOFF_MAX_SECONDS, base * 2**exponent))


def slow_start(total: int, cap: int, first: int = 1) -> list[int]:
    """Batch sizes for `total` creates: 1, 2, 4, ... (each at most `cap`), as the Job and
    ReplicaSet controllers do, so a template the API refuses costs one call, not `total`.

    `first` carries the doubling over from the job's last sync when every create of it
    succeeded: the template has been proven, and restarting at 1 every sync would make a
    long job's creation a chain of round trips per sync (the scheduler then runs dry)."""
    out: list[int] = []
    batch = max(1, min(first, cap))
    while total > 0:
        size = min(batch, total, cap)
        out.append(size)
        total -= size
        batch *= 2
    return out
