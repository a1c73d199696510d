"""Batch backs off while the API server's queues grow, before production arrives into them.

Yielding to production once it is seen (`production`) comes late: by the time the operator
sees a production pod, a job creating at the scheduler's bind rate has already filled the
API server's queues, and the first production pods wait behind them (`prod_under_burst`:
the first six to eight pods 0.2-0.6 s against 0.01 s idle, the rest at idle level once
the yield engaged). So batch keeps the queues short all the time, as LEDBAT does for a
background transfer: it measures the queueing delay it causes and creates slower when that
delay passes a small target, faster while it stays under it. Only while production is
active (`production.ACTIVE_SECONDS`): the headroom costs batch a third of its pace or more on
a small machine (`batch_job`, target 30 ms: 10.7 pods/s against the Job controller's 31;
target 100 ms: 25 against 32.5), which is worth paying only when production may come.

Two delays, both on this process's monotonic clock, each as its recent median over its
base (the least seen over the last `BASE_HISTORY_SECONDS`, in bins, as LEDBAT keeps its
base delay: the part no queue adds, which a longer queue cannot inflate); the queueing is
the larger:
- a task pod create's round trip: the API server's write path (admission, APF, etcd). Every
  writer's requests, the scheduler's bindings and a production owner's creates among them,
  wait in the same server;
- how much later than it returned the pod informer shows each of the controller's own pod
  writes (`OwnWrites.on_visible`): the API server's watch fan-out, through which a pod's
  events reach the scheduler and every other watcher.

The rate (per job; every job reads the same delays, so jobs share the room): multiplied by
`exp(gain * off_target * dt)`, off_target = (TARGET - queueing) / TARGET within [-1, 1]: up
to x1.5 a second with no queue, down to x0.25 a second at twice the target. Never above
`CEILING_GAIN` times the job's bind rate (an allowance the job does not use must not grow
without bound, to be spent at once when it does) nor below `MIN_RATE`, so a job always
progresses.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Final

TARGET_SECONDS: Final = 0.03
CURRENT_WINDOW_SECONDS: Final = 1.0
BASE_HISTORY_SECONDS: Final = 300.0
BASE_BIN_SECONDS: Final = 30.0
UP_PER_SECOND: Final = math.log(1.5)
DOWN_PER_SECOND: Final = math.log(4.0)
LEAST_CEILING: Final = 10.0
MIN_RATE: Final = 5.0  # creates/s: a job always progresses, as under the yield
CEILING_GAIN: Final = 2.0
MAX_STEP_SECONDS: Final = 2.0
MAX_SAMPLES: Final = 5_000


class QueueingDelay:
    """One latency of the whole controller (one API server behind all jobs), sampled."""

    def __init__(self) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._bins: deque[tuple[float, float]] = deque()  # (bin start, least lag in it)

    def sample(self, now: float, lag: float) -> None:
        lag = max(0.0, lag)
        self._recent.append((now, lag))
        start = now - now % BASE_BIN_SECONDS
        if self._bins and self._bins[-1][0] == start:
            self._bins[-1] = (start, min(self._bins[-1][1], lag))
        else:
            self._bins.append((start, lag))
        while self._bins and self._bins[0][0] < now - BASE_HISTORY_SECONDS:
            self._bins.popleft()

    def queueing(self, now: float) -> float | None:
        """The recent median over the base (None: no sample recently)."""
        while self._recent and self._recent[0][0] < now - CURRENT_WINDOW_SECONDS:
            self._recent.popleft()
        if not self._recent or not self._bins:
            return None
        base = min(lag for _, lag in self._bins)
        return max(0.0, statistics.median(lag for _, lag in self._recent) - base)


def next_rate(rate: float, queueing: float | None, dt: float, ceiling: float) -> float:
    """The job's creates per second after `dt` seconds at `queueing` (None: unchanged)."""
    if queueing is not None:
        off = max(-1.0, min(1.0, (TARGET_SECONDS - queueing) / TARGET_SECONDS))
        gain = UP_PER_SECOND if off > 0 else DOWN_PER_SECOND
        rate *= math.exp(gain * off * min(max(dt, 0.0), MAX_STEP_SECONDS))
    return max(MIN_RATE, min(max(ceiling, MIN_RATE), rate))


def ceiling(binds_per_second: float) -> float:
    """The most a job's delay-paced rate may be: twice what it binds (at least `LEAST_CEILING`,
    so a job binding nothing yet may still create)."""
    return max(LEAST_CEILING, CEILING_GAIN * binds_per_second)


def larger(*delays: float | None) -> float | None:
    """The largest known queueing delay (None: none known)."""
    known = [d for d in delays if d is not None]
    return max(known) if known else None


class DelayPaced:
    """One job's delay-paced creates per second: none (no cap) until the queueing first
    passes the target, as TCP's slow start runs until its first loss (a job on a quiet
    control plane starts at the pace the in-flight limit allows); then from the rate the
    job was binding at, up and down by `next_rate`."""

    def __init__(self, now: float) -> None:
        self.rate: float | None = None
        self.at = now

    def update(self, now: float, queueing: float | None, binds_per_second: float) -> float | None:
        if self.rate is None:
            if queueing is not None and queueing > TARGET_SECONDS:
                self.rate = max(MIN_RATE, binds_per_second)
        else:
            self.rate = next_rate(self.rate, queueing, now - self.at, ceiling(binds_per_second))
        self.at = now
        return self.rate
