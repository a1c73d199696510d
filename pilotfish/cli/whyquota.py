"""The quota layer of `kubectl pilotfish why`: where the pod's band stands in its team's
TeamQuota, with amounts in the API server's canonical form."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, TextIO

from pilotfish import ledger, quota
from pilotfish.kube.rest import NAMESPACES, TEAMQUOTAS, ApiError, Rest


def quota_sentence(
    pod: dict[str, Any], team: str | None, teamquota: dict[str, Any] | None
) -> str | None:
    """The quota layer, with amounts: where the pod's band stands in its team's TeamQuota.

    Admission counts `used + reserved` against the band's limits (the same arithmetic as
    `pilotfish.ledger`). A pod not yet admitted is told which resource holds it back and by
    how much; an admitted one is already in that sum, so it is told what it holds and what
    the others use, never a total with itself taken out and called "used".
    """
    band = quota.pod_band(pod, default="")
    if not team or not band:
        return None
    book = None if teamquota is None else ledger.Ledger.of(teamquota)
    limits = None if book is None else book.limits.get(band)
    if book is None or limits is None:
        return f"Quota: team {team} has no TeamQuota granting the {band} band."
    used = book.held(band)
    asks = quota.pod_requests(pod)
    name = book.name
    fmt = quota.format_quantity
    if quota.counts_against_quota(pod):
        if not limits:
            holds = ", ".join(f"{r} {fmt(r, v)}" for r, v in sorted(asks.items()) if v)
            return (
                f"Quota (TeamQuota {name}): the {band} band limits nothing; this pod holds {holds}."
            )
        held = [
            _held_text(band, r, asks.get(r, Fraction(0)), used.get(r, Fraction(0)), limit)
            for r, limit in sorted(limits.items())
        ]
        return f"Quota (TeamQuota {name}): " + ". ".join(held) + "."
    over = quota.excess(limits, used, asks)
    if over:
        return f"Quota (TeamQuota {name}): " + "; ".join(
            quota.describe(team, band, e) for e in over
        )
    room = ", ".join(
        f"{r} {fmt(r, used.get(r, Fraction(0)))} of {fmt(r, lim)}"
        for r, lim in sorted(limits.items())
    )
    return f"Quota (TeamQuota {name}): within the {band} band's limits ({room} used)."


def _held_text(band: str, resource: str, holds: Fraction, total: Fraction, limit: Fraction) -> str:
    """ "production cpu: this pod holds 1; others use 1 of 2" for an admitted pod; `total`
    includes the pod (the operator may not have counted it yet, hence never below zero)."""
    fmt = quota.format_quantity
    others = max(total - holds, Fraction(0))
    text = (
        f"{band} {resource}: this pod holds {fmt(resource, holds)}; others use "
        f"{fmt(resource, others)} of {fmt(resource, limit)}"
    )
    if holds + others > limit:
        text += f" ({fmt(resource, holds + others - limit)} over the limit together)"
    return text


async def quota_layer(rest: Rest, pod: dict[str, Any], namespace: str, err: TextIO) -> str | None:
    """Read what the quota layer needs (namespace labels, the team's TeamQuota); a caller
    without the right to read them is told so rather than given a wrong answer."""
    try:
        ns = await rest.request("GET", NAMESPACES.path(name=namespace))
        team = quota.pod_team(pod, (ns.get("metadata") or {}).get("labels"))
        if not team or not quota.pod_band(pod, default=""):
            return None
        quotas, _ = await rest.list_pages(TEAMQUOTAS.path())
    except ApiError as e:
        print(f"warning: cannot read the team quota ({e.status} {e.message})", file=err)
        return None
    mine = sorted(
        (q for q in quotas if (q.get("spec") or {}).get("team") == team),
        key=lambda q: str(q["metadata"]["name"]),
    )
    return quota_sentence(pod, team, mine[0] if mine else None)
