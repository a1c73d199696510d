"""The batch controller's pacing state, one for all its jobs: each job's bind rate and
`creationRate` bucket, and the production pods batch yields to. `pace` turns them into one
sync's `Pace`.

The rules are in `pacing` (in-flight limit, bucket), `apidelay` (backing off while the API
server's queues grow) and `production` (hold and yield); this keeps their per-job state and
combines them: the job's creates per second are the least of `creationRate`, its
delay-paced rate while production is active and its yield while production arrives.
"""

from __future__ import annotations

from pilotfish.operators.batchworkload.apidelay import DelayPaced, QueueingDelay, larger
from pilotfish.operators.batchworkload.model import Pace
from pilotfish.operators.batchworkload.pacing import BindRate, TokenBucket, in_flight_limit
from pilotfish.operators.batchworkload.production import ProductionWaiting, yield_rate


class Pacer:
    def __init__(self) -> None:
        self.rates: dict[str, BindRate] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.production = ProductionWaiting()
        self.write_delay = QueueingDelay()  # task pod creates' round trips
        self.watch_delay = QueueingDelay()  # own pod writes returned → seen by the informer
        self.delay_paced: dict[str, DelayPaced] = {}
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
        queueing = larger(self.write_delay.queueing(now), self.watch_delay.queueing(now))
        paced: float | None = None
        if self.production.active(now):
            paced = self.delay_paced.setdefault(job, DelayPaced(now)).update(now, queueing, rate)
        else:
            self.delay_paced.pop(job, None)
        allowed = _least(creation_rate, paced)
        yielded: float | None = None
        if self.production.arriving(now):
            yielded = yield_rate(self.unyielded_rate.setdefault(job, rate))
            allowed = _least(allowed, yielded)
        else:
            self.unyielded_rate.pop(job, None)
        if allowed is None:
            self.buckets.pop(job, None)
            return Pace(limit, rate, held=held, held_wait=held_wait, queueing=queueing or 0.0)
        bucket = self.buckets.setdefault(job, TokenBucket(allowed, now))
        room = bucket.room(now, allowed)
        return Pace(
            limit,
            rate,
            room,
            bucket.wait(),
            held,
            held_wait,
            yielded or 0.0,
            allowed=allowed,
            queueing=queueing or 0.0,
        )

    def answered(self, now: float, seconds: float) -> None:
        """A task pod create came back after `seconds`."""
        self.write_delay.sample(now, seconds)

    def seen(self, now: float, lag: float) -> None:
        """One of the controller's own pod writes showed in its informer `lag` s after it
        returned."""
        self.watch_delay.sample(now, lag)

    def created(self, job: str, count: int) -> None:
        bucket = self.buckets.get(job)
        if bucket is not None:
            bucket.take(count)

    def forget(self, job: str) -> None:
        self.rates.pop(job, None)
        self.buckets.pop(job, None)
        self.unyielded_rate.pop(job, None)
        self.delay_paced.pop(job, None)


def _least(rate: float | None, other: float | None) -> float | None:
    if rate is None or other is None:
        return other if rate is None else rate
    return min(rate, other)
