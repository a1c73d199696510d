"""Batch keeps headroom at the API server: its creates slow down when their answers do.

Pacing to the bind rate (`pacing`) and yielding to production once it arrives
(`production`) both act after the fact: the first production pods of a burst arrive into
whatever backlog batch built up before, and on a small control plane a job placing 90 pods/s
keeps the API server's CPU saturated, so those first pods wait several times their idle
created→bound time (`benchmarks/prod_under_burst`: the slowest production pods were the first
ones, 0.3-1.0 s against 0.1 s idle). So batch watches the one signal it has of the API
server's queue, the round trip of its own creates, and slows before that queue builds: when
the median of the last creates is well above the fastest seen recently (`congested`), the
batch controller's creates per second are cut multiplicatively; while they are not, the cap
grows back additively and is lifted once it no longer binds (TCP Vegas's rule, on creates).

The cap is one for the whole controller (the API server is one), shared among the jobs
creating. All times are on the monotonic clock of this process.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Final

from pilotfish import metrics

RECENT: Final = 16  # creates the current latency is the median of
BASELINE_SECONDS: Final = 120.0  # the fastest create of this long is the uncongested figure
CONGESTED_FACTOR: Final = 3.0
CONGESTED_MARGIN_SECONDS: Final = 0.03
ADJUST_SECONDS: Final = 1.0  # the cap moves at most once per this long
DECREASE: Final = 0.7
INCREASE_SHARE: Final = 0.25
MIN_INCREASE: Final = 2.0
MIN_RATE: Final = 5.0
UNCAP_FACTOR: Final = 2.0  # a cap this far above the bind rate no longer binds: lifted


def congested(recent: float, baseline: float) -> bool:
    """Whether creates answering in `recent` seconds (median) against `baseline` (the fastest
    seen) show a queue at the API server: both several times and some milliseconds slower,
    so a fast server's jitter of a few milliseconds is not read as one."""
    return recent > max(CONGESTED_FACTOR * baseline, baseline + CONGESTED_MARGIN_SECONDS)


def next_cap(cap: float | None, is_congested: bool, reference_rate: float) -> float | None:
    """The creates/s cap after one adjustment. `reference_rate`: the controller's bind rate,
    what an uncapped controller is creating at in steady state."""
    if is_congested:
        start = cap if cap is not None else reference_rate
        return max(MIN_RATE, DECREASE * start)
    if cap is None:
        return None
    raised = cap + max(MIN_INCREASE, INCREASE_SHARE * cap)
    if raised > UNCAP_FACTOR * reference_rate + MIN_INCREASE * 5:
        return None
    return raised


class CreateCongestion:
    """The batch controller's create round trips and the creates/s cap they imply."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=RECENT)
        # (time, latency) of the creates faster than every later one: the minimum over the
        # baseline window is the first entry still inside it.
        self._fastest: deque[tuple[float, float]] = deque()
        self._cap: float | None = None
        self._adjusted: float | None = None
        # Creates answered since the last adjustment: a cap is moved only on answers that
        # came after the previous move, so one slow spell is not cut for again and again.
        self._fresh = 0

    def observed(self, seconds: float, now: float) -> None:
        """One create's round trip, answered at `now`."""
        metrics.BATCH_CREATE_SECONDS.observe(seconds)
        self._recent.append(seconds)
        self._fresh += 1
        while self._fastest and self._fastest[-1][1] >= seconds:
            self._fastest.pop()
        self._fastest.append((now, seconds))

    def baseline(self, now: float) -> float | None:
        while self._fastest and self._fastest[0][0] < now - BASELINE_SECONDS:
            self._fastest.popleft()
        return self._fastest[0][1] if self._fastest else None

    def recent(self) -> float | None:
        return statistics.median(self._recent) if self._recent else None

    def cap(self, now: float, binds_per_second: float) -> float | None:
        """Creates per second the controller may make now (None: no cap)."""
        if self._adjusted is not None and now - self._adjusted < ADJUST_SECONDS:
            return self._cap
        baseline, recent = self.baseline(now), self.recent()
        if baseline is None or recent is None or self._fresh < RECENT // 2:
            return self._cap
        self._adjusted, self._fresh = now, 0
        self._cap = next_cap(self._cap, congested(recent, baseline), binds_per_second)
        metrics.BATCH_CONGESTION_CAP.set(self._cap or 0.0)
        return self._cap
