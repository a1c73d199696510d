"""Production first: while a production pod waits for placement, no batch pod is created.

Pacing batch to the scheduler's bind rate still uses the whole control plane's throughput
(on a small cluster, the API server's CPU): production pods created meanwhile wait many
times their idle created→bound time. So batch yields on its own: the pod informer the batch
controller already has shows every pod, and this keeps the production pods waiting for
placement right now (band label `production` or the production PriorityClass; not bound,
not gated, not ended, not being deleted). While any is waiting, every BatchWorkload holds
its creates (deletes and status writes go on); when the last one binds, every held job is
synced at once.

Holding while a pod waits is not enough on its own: on a busy control plane a production pod
binds in about the time the operator takes to see it, so the hold rarely engages, and the
job's creates keep the API server's CPU saturated while production keeps arriving. So batch
also yields to production's *arrival*: for `ARRIVAL_WINDOW_SECONDS` after a new production
pod was first seen (its creation event, whether or not the scheduler has bound it by then:
by the time the operator sees it, it often has), every job creates at most `YIELD_SHARE` of
the bind rate it had before it yielded (at least `MIN_YIELD_RATE`/s, so it still
progresses), leaving the rest of the control plane to production (`prod_under_burst`: a job
capped at ~20 creates/s kept production's p99 within 1.1x of idle, against 13x paced to the
bind rate).

Production that arrived in the last `ACTIVE_SECONDS` is *active*: it is likely to come again
(rollouts go in steps, scale-ups in waves), so every job keeps the API server's queues short
meanwhile (`apidelay`), at the cost of its own pace. With production dormant a job goes at
the pace the scheduler binds, and the first production pods that come then wait for the
backlog to drain before the yield has helped (`prod_under_burst`: 0.2-0.6 s at 200 nodes,
within the five-second promise).

A waiting pod counts only for `MAX_WAIT_SECONDS` after this process first saw it (on the
monotonic clock): one unschedulable production pod must not stop batch forever. Its first
sighting is kept while it stays unplaced, so a relist or an update does not restart it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pilotfish import names

MAX_WAIT_SECONDS: Final = 30.0
ARRIVAL_WINDOW_SECONDS: Final = 10.0
ACTIVE_SECONDS: Final = 600.0
YIELD_SHARE: Final = 0.25
MIN_YIELD_RATE: Final = 5.0
PRODUCTION: Final = "production"
PRODUCTION_CLASS: Final = names.PRIORITY_CLASS[PRODUCTION]


def is_production(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return (meta.get("labels") or {}).get(names.LABEL_BAND) == PRODUCTION or spec.get(
        "priorityClassName"
    ) == PRODUCTION_CLASS


def arriving_pod(pod: Mapping[str, Any]) -> bool:
    """A production pod the scheduler is placing now, or has just placed: not started (not
    Running, not ended), not gated, not being deleted. Seen in its creation event or as its
    last gate goes, it is an arrival; a pod already running when the informer first lists it
    (a restart) is not."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return (
        is_production(pod)
        and phase in (None, "", "Pending")
        and not spec.get("schedulingGates")
        and not meta.get("deletionTimestamp")
    )


def fresh_sighting(kind: str, pod: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """The event that may show an arrival: the pod's creation, or its last gate removed."""
    if kind == "ADDED":
        return True
    was_gated = bool(((old or {}).get("spec") or {}).get("schedulingGates"))
    return was_gated and not (pod.get("spec") or {}).get("schedulingGates")


def waiting_for_placement(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return (
        is_production(pod)
        and not spec.get("nodeName")
        and not spec.get("schedulingGates")
        and phase not in ("Succeeded", "Failed")
        and not meta.get("deletionTimestamp")
    )


class ProductionWaiting:
    """The production pods waiting for placement, by key, with when each was first seen."""

    def __init__(self, max_wait: float = MAX_WAIT_SECONDS) -> None:
        self.max_wait = max_wait
        self._since: dict[str, float] = {}
        self._last_arrival: float | None = None

    def observe(
        self, key: str, pod: Mapping[str, Any] | None, now: float, *, fresh: bool = False
    ) -> bool:
        """Account one pod event (`pod` None: deleted; `fresh`: see `fresh_sighting`). True
        when the pod stopped waiting and no other waits any more: the moment held jobs go
        on."""
        if fresh and pod is not None and arriving_pod(pod):
            self._last_arrival = now
        if pod is not None and waiting_for_placement(pod):
            if key not in self._since:
                self._since[key] = now
                self._last_arrival = now
            return False
        if self._since.pop(key, None) is None:
            return False
        return self.count(now) == 0

    def count(self, now: float) -> int:
        return sum(1 for at in self._since.values() if now - at < self.max_wait)

    def until_aged_out(self, now: float) -> float | None:
        """Seconds until the last waiting pod stops counting (None: none counts now)."""
        ages = [at + self.max_wait - now for at in self._since.values() if now - at < self.max_wait]
        return max(ages) if ages else None

    def arriving(self, now: float) -> bool:
        """Whether a production pod arrived (was first seen new, or waiting) within the
        arrival window."""
        return self._last_arrival is not None and now - self._last_arrival < ARRIVAL_WINDOW_SECONDS

    def active(self, now: float) -> bool:
        """Whether production arrived within `ACTIVE_SECONDS`: batch keeps headroom."""
        return self._last_arrival is not None and now - self._last_arrival < ACTIVE_SECONDS


def yield_rate(unyielded_binds_per_second: float) -> float:
    """Creates per second a job may make while production arrives, from the bind rate it
    had before yielding (its own yielded rate would spiral down to the minimum)."""
    return max(MIN_YIELD_RATE, YIELD_SHARE * unyielded_binds_per_second)
