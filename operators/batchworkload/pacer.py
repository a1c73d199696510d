"""The batch controller's pacing state, one for all its jobs: each job's bind rate and
`creationRate` bucket, and the production pods batch yields to. `pace` turns them into one
sync's `Pace`.

The rules are in `pacing` (in-flight limit, bucket) and `production` (hold and yield); this
keeps their per-job state and combines them: the job's creates per second are the lesser of
`creationRate` and its yield while production arrives.
"""

from __future__ import annotations

from pilotfish.operators.batchworkload.model import Pace
from pilotfish.operators.batchworkload.pacing import BindRate, TokenBucket, in_flight_limit
from pilotfish.operators.batchworkload.production import ProductionWaiting, yield_rate


class Pacer:
    def __init__(self) -> None:
        self.rates: dict[str, BindRate] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.production = ProductionWaiting()
        # Each job's bind rate when production began arriving: what its yield is a share of.
        self.unyielded_rate: dict[str, float] = {}

    def bound(self, job: str, now: float, latency: float | None = None) -> None:
        self.rates.setdefault(job, BindRate(now)).bound(now, latency)

    def pace(
        self,
        job: str,
        now: float,
        *,
        creation_rate: float | None,
        sync_period: float,
    ) -> Pace:
        """`creation_rate`: the job's spec.creationRate (None: unset); `sync_period`: its
        smoothed seconds between syncs."""
        binds = self.rates.setdefault(job, BindRate(now))
        rate = binds.per_second(now)
        limit = in_flight_limit(rate, sync_period, binds.shortest_latency(now))
        held = self.production.count(now)
        held_wait = self.production.until_aged_out(now)
        yielded: float | None = None
        if self.production.arriving(now):
            yielded = yield_rate(self.unyielded_rate.setdefault(job, rate))
            creation_rate = _least(creation_rate, yielded)
        else:
            self.unyielded_rate.pop(job, None)
        if creation_rate is None:
            self.buckets.pop(job, None)
            return Pace(limit, rate, held=held, held_wait=held_wait)
        bucket = self.buckets.setdefault(job, TokenBucket(creation_rate, now))
        room = bucket.room(now, creation_rate)
        return Pace(limit, rate, room, bucket.wait(), held, held_wait, yielded or 0.0)

    def created(self, job: str, count: int) -> None:
        bucket = self.buckets.get(job)
        if bucket is not None:
            bucket.take(count)

    def forget(self, job: str) -> None:
        self.rates.pop(job, None)
        self.buckets.pop(job, None)
        self.unyielded_rate.pop(job, None)


def _least(rate: float | None, other: float) -> float:
    return other if rate is None else min(rate, other)
