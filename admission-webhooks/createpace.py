"""Each team's pace of pod creations, kept at admission: a token bucket per team.

Why at admission: API Priority and Fairness bounds how many of a team's pod creates the API
server works on at once, not how many it finishes a second, and every created pod costs the
API server, etcd and every pod watcher (both schedulers, kube-controller-manager, kwok or
the kubelets, Pilotfish's informers) CPU that no FlowSchema governs. On a small control plane
one team's client flooding raw pods at the two seats it is given still took the cores from
every other team's writes (docs/ARCHITECTURE.md, section 8). A create refused here never
reaches etcd or a watcher.

How: a create that finds no token is *held* for up to `max_hold` until one comes. The held
request keeps its seat in the team's APF level (`pilotfish-tenant-pods`, which never
borrows), so the team's further creates queue inside the API server, costing nothing, and
the team's creates per second settle at the bucket's rate with no refusals and no retries.
A create whose token is further away than `max_hold` is refused with 429 and the seconds
until it would have one (`retryAfterSeconds`, which the API server sends as Retry-After and
client-go waits out).

Who is paced: every create of a pod in a tenant namespace, whatever its band, sent by the
team's own identities: its people and its ServiceAccounts (a team's runaway controller).
Not paced: Pilotfish's own operator and batch accounts (production's pods come from the
operator and must never wait here, and a BatchWorkload's creates are paced already by what
the scheduler places), kube-controller-manager's controllers (a Job's or a ReplicaSet's
pods), whose creates its own client rate limit bounds for the whole cluster and whose
objects a team writes one at a time, and the cluster's administrators (group
system:masters, whom API Priority and Fairness exempts too).

The decision (`take`) is a pure function of the bucket, the time and the settings; the time
is this process's monotonic clock. Each webhook replica keeps its own buckets, so the chart
gives each replica its share of the team's rate.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import metrics, podmeta
from pilotfish.webhooks import tenancy
from pilotfish.webhooks.admission import Decision

RATE_ENV: Final = "PILOTFISH_TEAM_POD_CREATES_PER_SECOND"
BURST_ENV: Final = "PILOTFISH_TEAM_POD_CREATES_BURST"
# kube-controller-manager's default client rate (--kube-api-qps 20): one team's raw creates no
# faster than the built-in controllers make every Job's and ReplicaSet's pods. On two cores,
# three runs kept another team's write p99 at 1.05-1.43x of idle, against 1.44x at 25 a
# second (benchmarks/api_fairness.py; docs/ARCHITECTURE.md section 8).
DEFAULT_PER_SECOND: Final = 20.0
DEFAULT_BURST: Final = 200
# Below the pod webhooks' timeoutSeconds (5 s in the chart), with room for the review itself.
MAX_HOLD_SECONDS: Final = 2.0
# Creates of one team held at once, per replica: each holds a seat of the API server, and a
# team's ServiceAccounts sit in the built-in workload-low level with many, which a team's
# held creates must not fill. Beyond it a create that would wait is refused at once.
MAX_HELD: Final = 16
# kube-controller-manager, as itself or (--use-service-account-credentials) as one
# ServiceAccount per controller in kube-system.
CONTROLLER_MANAGER: Final = "system:kube-controller-manager"
CONTROL_PLANE_ACCOUNTS: Final = "system:serviceaccount:kube-system:"
ADMINISTRATORS: Final = "system:masters"
# Buckets kept before the full ones (which say nothing a new bucket would not) are dropped.
PRUNE_ABOVE: Final = 1024


@dataclass(frozen=True)
class PaceSettings:
    """`per_second` 0: no pacing at all."""

    per_second: float = DEFAULT_PER_SECOND
    burst: int = DEFAULT_BURST
    max_hold: float = MAX_HOLD_SECONDS
    max_held: int = MAX_HELD

    def __post_init__(self) -> None:
        if self.per_second < 0 or not math.isfinite(self.per_second):
            raise ValueError(f"{RATE_ENV}={self.per_second!r}: must be a number >= 0")
        if self.burst < 1:
            raise ValueError(f"{BURST_ENV}={self.burst!r}: must be a whole number >= 1")

    @property
    def enabled(self) -> bool:
        return self.per_second > 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PaceSettings:
        """The chart's values for this replica; a bad value raises ValueError naming the
        variable, the value and the rule, before anything is served."""
        rate = environ.get(RATE_ENV) or ""
        burst = environ.get(BURST_ENV) or ""
        try:
            per_second = float(rate) if rate else DEFAULT_PER_SECOND
        except ValueError:
            raise ValueError(f"{RATE_ENV}={rate!r}: must be a number >= 0") from None
        if burst and not burst.isdecimal():  # what int() reads ("²" is a digit, not decimal)
            raise ValueError(f"{BURST_ENV}={burst!r}: must be a whole number >= 1")
        return cls(per_second, int(burst) if burst else DEFAULT_BURST)


@dataclass(frozen=True)
class Bucket:
    """Tokens (negative: creates held for tokens still to come) as of monotonic `at`."""

    tokens: float
    at: float


@dataclass(frozen=True)
class Hold:
    """Admit after `seconds` (0: at once); the bucket is charged already."""

    seconds: float


@dataclass(frozen=True)
class Throttle:
    """Refuse: the next token is `retry_after` seconds away, more than a create may wait."""

    retry_after: float


def tokens_at(bucket: Bucket | None, now: float, settings: PaceSettings) -> float:
    """The bucket's tokens at `now`: refilled at the rate, never above the burst; a team
    seen for the first time starts full."""
    burst = float(settings.burst)
    if bucket is None:
        return burst
    return min(burst, bucket.tokens + max(0.0, now - bucket.at) * settings.per_second)


def take(
    bucket: Bucket | None, now: float, settings: PaceSettings, held: int = 0
) -> tuple[Bucket, Hold | Throttle]:
    """One create's turn, with `held` of the team's creates waiting already: the bucket
    after it, and whether it waits or is refused (a refused create takes nothing). Tokens
    below zero are creates held for tokens to come, so each later create waits behind them."""
    tokens = tokens_at(bucket, now, settings)
    wait = max(0.0, (1.0 - tokens) / settings.per_second)
    if wait > settings.max_hold or (wait > 0 and held >= settings.max_held):
        return Bucket(tokens, now), Throttle(wait)
    return Bucket(tokens - 1.0, now), Hold(wait)


def throttled(who: str, settings: PaceSettings, retry_after: float) -> Decision:
    """429 naming who is paced (`team X` or `namespace Y`), the pace this replica keeps and
    when to retry (the API server's Retry-After)."""
    seconds = max(1, math.ceil(retry_after))
    return Decision.deny(
        f"{who} is creating pods faster than its pace allows ({settings.per_second:g} a "
        f"second with a burst of {settings.burst} at this webhook replica); retry in "
        f"{seconds}s (BatchWorkloads and ServiceWorkloads are paced by Pilotfish and never "
        "refused here)",
        code=429,
        reason="TooManyRequests",
        retry_after=seconds,
    )


def team_creator(user: str, groups: Iterable[str]) -> bool:
    """Whether a create by `user` (in `groups`) is the team's own (paced), not the control
    plane's or an administrator's."""
    if user == CONTROLLER_MANAGER or user.startswith(CONTROL_PLANE_ACCOUNTS):
        return False
    return ADMINISTRATORS not in groups


class CreatePace:
    """The buckets of one webhook replica, by team, and the wait a held create sleeps."""

    def __init__(
        self,
        settings: PaceSettings,
        exempt: frozenset[str],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.exempt = exempt
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[str, Bucket] = {}
        self._held: dict[str, int] = {}
        self._pruned_at = float("-inf")

    @classmethod
    def from_env(cls, namespace: str) -> CreatePace:
        """Pilotfish's operator and batch accounts in `namespace` are never paced."""
        return cls(PaceSettings.from_env(), podmeta.pilotfish_creators(namespace))

    def key(self, request: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> str | None:
        """Who a create is paced as, `team X` (its namespace's team) or `namespace Y` (a
        namespace without one); None for a create that is not paced."""
        if not self.settings.enabled or request.get("dryRun"):
            return None
        if request.get("operation") != "CREATE" or request.get("subResource"):
            return None
        namespace = str(request.get("namespace") or "")
        if not namespace or not tenancy.is_tenant(namespace):
            return None
        info = request.get("userInfo") or {}
        user = str(info.get("username") or "")
        if user in self.exempt or not team_creator(user, info.get("groups") or ()):
            return None
        team = tenancy.namespace_team(namespace_labels)
        return f"team {team}" if team else f"namespace {namespace}"

    async def admit(
        self, request: Mapping[str, Any], namespace_labels: Mapping[str, str]
    ) -> Decision | None:
        """None: go on (after holding, when the team's bucket was empty); else the 429."""
        team = self.key(request, namespace_labels)
        if team is None:
            return None
        now = self._clock()
        held = self._held.get(team, 0)
        bucket, outcome = take(self._buckets.get(team), now, self.settings, held)
        self._store(team, bucket, now)
        if isinstance(outcome, Throttle):
            metrics.WEBHOOK_POD_CREATES_THROTTLED.inc()
            return throttled(team, self.settings, outcome.retry_after)
        metrics.WEBHOOK_POD_CREATE_HOLD_SECONDS.observe(outcome.seconds)
        if outcome.seconds > 0:
            self._held[team] = held + 1
            try:
                await self._sleep(outcome.seconds)
            finally:
                self._held[team] -= 1
                if not self._held[team]:
                    del self._held[team]
        return None

    def tracked(self) -> int:
        """Buckets kept (bounded by PRUNE_ABOVE plus those not yet full)."""
        return len(self._buckets)

    def held(self, who: str) -> int:
        """Creates of `who` (a `key`) waiting for their turn now."""
        return self._held.get(who, 0)

    def _store(self, who: str, bucket: Bucket, now: float) -> None:
        """Keep `who`'s bucket; past PRUNE_ABOVE, drop the full ones (a new bucket starts
        full: they say nothing). Not on every create: a scan at most once per time a bucket
        takes to refill, so a thousand busy namespaces do not make each review walk them."""
        self._buckets[who] = bucket
        if len(self._buckets) <= PRUNE_ABOVE or now - self._pruned_at < self._refill_seconds:
            return
        self._pruned_at = now
        full = self.settings.burst
        idle = [k for k, b in self._buckets.items() if tokens_at(b, now, self.settings) >= full]
        for k in idle:
            del self._buckets[k]

    @property
    def _refill_seconds(self) -> float:
        """From the lowest a bucket goes (every held create charged) back to full."""
        return (self.settings.burst + self.settings.max_held) / self.settings.per_second
