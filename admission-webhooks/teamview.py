"""The webhooks' view of namespaces and TeamQuotas, for bands and quota at pod admission.

Like the GatePolicy view, it is read from informers, never fetched per review; the only call
a review makes is the quota reservation itself (`reserve`), a write conditional on the
TeamQuota's resourceVersion. Until both informers have listed, pod reviews are refused: a
pod admitted without its quota check would hold capacity nobody granted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol

from pilotfish import metrics
from pilotfish.kube.informer import Informer
from pilotfish.kube.rest import NAMESPACES, TEAMQUOTAS, ApiError, Rest
from pilotfish.webhooks import quota as quota_rules

log = logging.getLogger(__name__)

# Attempts at a reservation before the pod is refused as "quota busy": each conflict means
# another pod's reservation landed first, and the next attempt decides with it counted.
RESERVE_ATTEMPTS: Final = 8


@dataclass(frozen=True)
class TeamSnapshot:
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    quotas: tuple[Mapping[str, Any], ...] = ()

    def labels_of(self, namespace: str) -> Mapping[str, str]:
        return self.namespace_labels.get(namespace, {})


class TeamSource(Protocol):
    """Where reviews get namespaces and quotas (None: not synced, refuse) and reserve."""

    def snapshot(self) -> TeamSnapshot | None: ...

    async def reserve(
        self,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: quota_rules.Admit,
        now: datetime,
    ) -> str | None: ...


class TeamCache:
    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self.namespaces = Informer(rest, NAMESPACES)
        self.quotas = Informer(rest, TEAMQUOTAS)
        # Reservations against one TeamQuota are written one at a time by this process, each
        # from the object the previous write returned: concurrent admissions then queue here
        # instead of all but one losing a resourceVersion race at the API server (conflicts
        # remain possible across webhook replicas and with the quota operator).
        self._locks: dict[str, asyncio.Lock] = {}
        self._latest: dict[str, Mapping[str, Any]] = {}

    def synced(self) -> bool:
        return self.namespaces.synced.is_set() and self.quotas.synced.is_set()

    def snapshot(self) -> TeamSnapshot | None:
        if not self.synced():
            return None
        labels = {
            str(o["metadata"]["name"]): dict(o["metadata"].get("labels") or {})
            for o in self.namespaces.store.values()
        }
        return TeamSnapshot(labels, tuple(self.quotas.store.values()))

    async def run(self) -> None:
        await asyncio.gather(self.namespaces.run(), self.quotas.run())

    async def reserve(
        self,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: quota_rules.Admit,
        now: datetime,
    ) -> str | None:
        """Write the reservation; None when it holds, else why the pod must be refused.

        Starts from the informer's copy (usually current); on a conflict re-reads the
        TeamQuota and decides again, so a pod admitted here has been counted against every
        reservation that landed before it.
        """
        name = str(first.quota_name)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            return await self._reserve_locked(name, pod, namespace_labels, band, first, now)

    async def _reserve_locked(
        self,
        name: str,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: quota_rules.Admit,
        now: datetime,
    ) -> str | None:
        tq = _newest(self._latest.get(name), self.quotas.get(name))
        # Decide again from the newest copy this process knows: the informer's may predate a
        # reservation this process wrote a moment ago.
        decision: quota_rules.Outcome = (
            quota_rules.decide(pod, namespace_labels, band, [tq], now) if tq else first
        )
        fresh = False
        for _ in range(RESERVE_ATTEMPTS):
            if not isinstance(decision, quota_rules.Admit):
                if fresh or tq is None:
                    return decision.message
                # Refuse only on the API server's current copy: the cached one may still hold
                # reservations the quota operator has since settled.
                tq = self._latest[name] = await self.rest.get(TEAMQUOTAS.path(name=name))
                decision = quota_rules.decide(pod, namespace_labels, band, [tq], now)
                fresh = True
                continue
            if decision.reservation is None or tq is None:
                return None
            body = quota_rules.with_reservation(tq, decision.reservation)
            path = TEAMQUOTAS.path(name=name, sub="status")
            try:
                self._latest[name] = await self.rest.replace(path, body)
                return None
            except ApiError as e:
                if not e.conflict:
                    raise
                metrics.WEBHOOK_QUOTA_CONFLICTS.inc()
            tq = self._latest[name] = await self.rest.get(TEAMQUOTAS.path(name=name))
            decision = quota_rules.decide(pod, namespace_labels, band, [tq], now)
            fresh = True
        log.warning("quota reservation kept conflicting", extra={"quota": first.quota_name})
        return (
            f"TeamQuota {first.quota_name} is being updated by many admissions at once; "
            "retry the request"
        )


def _newest(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The later of two copies of one object by resourceVersion (etcd revisions, which
    increase), or whichever exists."""
    if a is None or b is None:
        return a or b

    def rv(o: Mapping[str, Any]) -> int:
        try:
            return int((o.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            return 0

    return a if rv(a) >= rv(b) else b
