"""Team quota at pod admission: admit and reserve, refuse with the amounts, or gate batch.

Pure decisions; the webhook server does the one write (the reservation in the TeamQuota's
status, conditional on the resourceVersion the decision was made from) and on conflict asks
again with the fresher TeamQuota, which is what makes admission linearizable: of two pods
racing for the last room, the second decision sees the first one's reservation.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import gates, quota, timeutil

# The gate a batch pod over its team's quota waits behind; the gate controller releases it
# when the quota has room again.
QUOTA_GATE: Final = "gates.pilotfish.io/quota-available"


@dataclass(frozen=True)
class Admit:
    """Within quota: admit, and reserve `reservation` (None: nothing to reserve)."""

    quota_name: str | None
    reservation: dict[str, Any] | None


@dataclass(frozen=True)
class Refuse:
    message: str


@dataclass(frozen=True)
class Gate:
    """Batch over quota: admit behind QUOTA_GATE instead of refusing."""

    message: str


Outcome = Admit | Refuse | Gate


def quota_for(team: str, quotas: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The team's TeamQuota (by name order if several claim the team: the first)."""
    mine = sorted(
        (q for q in quotas if (q.get("spec") or {}).get("team") == team),
        key=lambda q: str(q["metadata"]["name"]),
    )
    return mine[0] if mine else None


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
        return Admit(None, None)  # waits behind the quota gate: holds no quota yet
    tq = quota_for(team, quotas)
    limits = quota.band_limits(tq, band) if tq else None
    if tq is None or limits is None:
        return Refuse(
            f"team {team} has no {band} quota: no TeamQuota grants it the {band} "
            "band, and no team runs in a band nobody granted it"
        )
    status = tq.get("status") or {}
    used = quota.add(
        quota.parse_band_resources((status.get("used") or {}).get(band)),
        quota.parse_band_resources((status.get("reserved") or {}).get(band)),
    )
    ask = quota.pod_requests(pod)
    over = quota.excess(limits, used, ask)
    if over:
        message = "; ".join(quota.describe(team, band, e) for e in over)
        return Gate(message) if band == "batch" else Refuse(message)
    if not limits:
        # The band is granted without limits: nothing can be exceeded, so nothing needs
        # reserving (and admissions need not queue on the TeamQuota's status).
        return Admit(str(tq["metadata"]["name"]), None)
    meta = pod.get("metadata") or {}
    reservation = {
        "pod": f"{meta.get('namespace', '')}/{meta.get('name') or meta.get('generateName', '')}",
        "uid": meta.get("uid", ""),
        "band": band,
        "resources": quota.band_resources(ask),
        "time": timeutil.format_time(now),
    }
    return Admit(str(tq["metadata"]["name"]), reservation)


def with_reservation(tq: Mapping[str, Any], reservation: dict[str, Any]) -> dict[str, Any]:
    """The TeamQuota with `reservation` added to its status (reservations and their sum)."""
    status = dict(tq.get("status") or {})
    band = reservation["band"]
    reserved = dict(status.get("reserved") or {})
    reserved[band] = quota.band_resources(
        quota.add(
            quota.parse_band_resources(reserved.get(band)),
            quota.parse_band_resources(reservation["resources"]),
        )
    )
    status["reserved"] = reserved
    status["reservations"] = [
        *[r for r in status.get("reservations") or [] if r.get("uid") != reservation["uid"]],
        reservation,
    ]
    return {**tq, "status": status}
