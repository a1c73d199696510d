"""The webhooks' view of namespaces and TeamQuotas, for bands and quota at pod admission.

Like the GatePolicy view, it is read from informers, never fetched per review; the only call
a review makes is the quota reservation itself (`reserve`), a write conditional on the
TeamQuota's resourceVersion. Until both informers have listed, pod reviews are refused: a
pod admitted without its quota check would hold capacity nobody granted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pilotfish import metrics
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import NAMESPACES, TEAMQUOTAS
from pilotfish.ledger import Ledger, Reservation
from pilotfish.reservations import Refused, Reserver
from pilotfish.webhooks import quota as quota_rules

log = logging.getLogger(__name__)


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
    def __init__(self, factory: InformerFactory) -> None:
        self.rest = rest = factory.rest
        self.namespaces = factory.informer(NAMESPACES)
        self.quotas = factory.informer(TEAMQUOTAS)
        # The one way to spend quota (`pilotfish.reservations`), from this process's view.
        self.reserver = Reserver(
            rest, self.quotas, "webhooks-quota", on_conflict=metrics.WEBHOOK_QUOTA_CONFLICTS.inc
        )

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

    async def reserve(
        self,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: quota_rules.Admit,
        now: datetime,
    ) -> str | None:
        """Write the reservation; None when it holds, else why the pod must be refused.

        Decides again on the newest TeamQuota this process knows (the informer's copy may
        predate a reservation written a moment ago), and again after every conflict, so a
        pod admitted here has been counted against every reservation that landed before it.
        """

        def spend(book: Ledger) -> Sequence[Reservation] | str:
            decision = quota_rules.decide(pod, namespace_labels, band, [book.source], now)
            if not isinstance(decision, quota_rules.Admit):
                return decision.message
            return [] if decision.reservation is None else [decision.reservation]

        result = await self.reserver.reserve(str(first.quota_name), spend)
        return result.message if isinstance(result, Refused) else None
