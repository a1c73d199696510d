"""Team quota at pod admission: admit and reserve, refuse with the amounts, or gate batch.

Pure decisions on the one ledger (`pilotfish.ledger`); the webhook server spends through
`pilotfish.reservations` (the reservation in the TeamQuota's status, conditional on the
resourceVersion the decision was made from) and on conflict decides again with the fresher
TeamQuota, which is what makes admission linearizable: of two pods racing for the last room,
the second decision sees the first one's reservation.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import gates, ledger, quota
from pilotfish.ledger import Reservation, quota_for

__all__ = ["QUOTA_GATE", "Admit", "Gate", "Outcome", "Refuse", "decide", "quota_for"]

# The gate a batch pod over its team's quota waits behind; the gate controller releases it
# when the quota has room again.
QUOTA_GATE: Final = "gates.pilotfish.io/quota-available"


@dataclass(frozen=True)
class Admit:
    """Within quota: admit, and reserve `reservation` (None: nothing to reserve)."""

    quota_name: str | None
    reservation: Reservation | None


@dataclass(frozen=True)
class Refuse:
    message: str


@dataclass(frozen=True)
class Gate:
    """Batch over quota: admit behind QUOTA_GATE instead of refusing."""

    message: str


Outcome = Admit | Refuse | Gate


def decide(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    band: str | None,
    quotas: Iterable[Mapping[str, Any]],
    now: datetime.datetime,
) -> Outcome:
    team = quota.pod_team(pod, namespace_labels)
    if team is None or band is None:
        # Not a team's pod (its namespace has no team label; the pod's own label counts for
        # nothing): bands and quotas do not apply.
        return Admit(None, None)
    if any(g == QUOTA_GATE for g in gates.scheduling_gates(pod)):
        return Admit(None, None)  # waits behind the quota gate: the release reserves for it
    book = ledger.ledger_for(team, quotas)
    if book is None:
        return Refuse(ledger.not_granted(team, band))
    ask = quota.pod_requests(pod)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    check = book.check(band, ask, excluding={uid})
    if not check.granted:
        return Refuse(check.message())
    if check.over:
        return Gate(check.message()) if band == "batch" else Refuse(check.message())
    if not check.limits:
        # The band is granted without limits: nothing can be exceeded, so nothing needs
        # reserving (and admissions need not queue on the TeamQuota's status).
        return Admit(book.name, None)
    return Admit(book.name, ledger.reservation_for(pod, band, ask, now))
