"""Release pacing per tenant: a token bucket driven by an explicit instant, and the in-flight cap.

The bucket is a value, not an object with a clock: `decide` takes the buckets of the last
round and returns the new ones, so a test drives time by passing instants and nothing sleeps.
Instants are seconds on the process's monotonic clock (`Clock.monotonic`): pacing is elapsed
time, and a wall-clock step must neither release a burst nor stall a tenant.
It is the only state the controller keeps that the API does not have; losing it (restart)
costs at most one burst, never a wrong release, because the in-flight cap is re-derived
from the pods themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pilotfish.operators.gates.model import Pacing


@dataclass(frozen=True)
class Bucket:
    """Tokens refill at `rate` per second up to `burst`. A gang may take more tokens than
    there are (the balance goes negative), so a gang larger than the burst still releases
    all together; the debt then delays the next release."""

    rate: float
    burst: float
    tokens: float
    at: float  # monotonic seconds

    @classmethod
    def full(cls, rate: float, now: float) -> Bucket:
        burst = burst_for(rate)
        return cls(rate, burst, burst, now)

    def refill(self, now: float) -> Bucket:
        elapsed = max(0.0, now - self.at)
        return replace(self, tokens=min(self.burst, self.tokens + elapsed * self.rate), at=now)

    def available(self, now: float) -> bool:
        return self.refill(now).tokens >= 1.0

    def take(self, n: int, now: float) -> Bucket:
        b = self.refill(now)
        return replace(b, tokens=b.tokens - n)

    def ready_at(self, now: float) -> float:
        """When the next token is there (now if one already is)."""
        b = self.refill(now)
        if b.tokens >= 1.0:
            return now
        return now + (1.0 - b.tokens) / self.rate


def burst_for(rate: float) -> float:
    """One second's worth of releases, at least one: a policy of 0.5/s releases one pod every
    two seconds, one of 50/s at most 50 at once."""
    return float(max(1, math.floor(rate)))


def bucket_for(pacing: Pacing | None, previous: Bucket | None, now: float) -> Bucket | None:
    """The bucket for a tenant under its current pacing (None: rate unlimited). A changed
    rate keeps the tokens already earned, clipped to the new burst."""
    rate = pacing.releases_per_second if pacing else None
    if rate is None:
        return None
    if previous is None:
        return Bucket.full(rate, now)
    if previous.rate != rate:
        burst = burst_for(rate)
        return Bucket(rate, burst, min(previous.refill(now).tokens, burst), now)
    return previous


def in_flight_allows(pacing: Pacing | None, in_flight: int, n: int) -> bool:
    """May `n` more pods be released while `in_flight` are released but not yet bound?
    A unit larger than the cap goes when nothing else is in flight (else a gang bigger
    than maxInFlight could never be released)."""
    cap = pacing.max_in_flight if pacing else None
    if cap is None:
        return True
    return in_flight + n <= cap or (in_flight == 0 and n > cap)
