"""The TeamQuotas as metrics: what each team's band holds against its limits.

Exported from the status this controller keeps (or is about to write), so the dashboard's
quota panels and `kubectl get teamquota` agree. Label sets of a TeamQuota that went away, or
of a resource a band no longer holds or limits, are removed rather than left at their last
value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

from pilotfish import metrics, names
from pilotfish.ledger import Ledger

# Always exported per granted band, like the summary shows them; others when held or limited.
ALWAYS: tuple[str, ...] = ("cpu", "memory", "pods")

Labels = tuple[str, str, str]  # team, band, resource


class QuotaMetrics:
    def __init__(self) -> None:
        self.held: dict[str, set[Labels]] = {}  # TeamQuota name -> label sets of HELD
        self.limits: dict[str, set[Labels]] = {}

    def export(self, name: str, tq: Mapping[str, Any]) -> None:
        book = Ledger.of(tq)
        held: set[Labels] = set()
        limited: set[Labels] = set()
        for band in names.BANDS:
            limits = book.limits.get(band)
            if limits is None:
                continue  # not granted: nothing to hold against
            amounts = book.held(band)
            for resource in {*ALWAYS, *limits, *(r for r, v in amounts.items() if v)}:
                labels = (book.team, band, resource)
                metrics.QUOTA_HELD.labels(*labels).set(float(amounts.get(resource, 0)))
                held.add(labels)
                if resource in limits:
                    metrics.QUOTA_LIMIT.labels(*labels).set(float(limits[resource]))
                    limited.add(labels)
        self._prune(metrics.QUOTA_HELD, self.held.get(name, set()) - held)
        self._prune(metrics.QUOTA_LIMIT, self.limits.get(name, set()) - limited)
        self.held[name], self.limits[name] = held, limited

    def forget(self, name: str) -> None:
        self._prune(metrics.QUOTA_HELD, self.held.pop(name, set()))
        self._prune(metrics.QUOTA_LIMIT, self.limits.pop(name, set()))

    @staticmethod
    def _prune(gauge: Gauge, gone: set[Labels]) -> None:
        for labels in gone:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
