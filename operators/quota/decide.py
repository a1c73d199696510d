"""Decide (pure): the TeamQuota status as it should be, from the team's pods and ledger.

Status is computed last, from what was observed: `used` from the pods' charges, the
reservations still owed (`pilotfish.ledger.settle`), their sum, and the summary line per
band. A plan is returned only when that differs from the status observed, so a quiet team
costs no writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from pilotfish import ledger, names, quota
from pilotfish.api.teamquota import SUMMARY_MAX_LENGTH
from pilotfish.ledger import RESERVATION_TTL_SECONDS, Ledger, TeamCharges

# Shown for every band, limited or not; GPUs and extended resources only when limited or held.
ALWAYS_SHOWN: Final = ("cpu", "memory", "pods")


@dataclass(frozen=True)
class StatusPlan:
    """Replace the status of TeamQuota `name`, valid only on version `from_version`."""

    name: str
    from_version: str
    status: dict[str, Any]


def band_summary(limits: quota.Resources | None, held: quota.Resources) -> str:
    """ "cpu 1/2, memory 1Gi/4Gi, pods 1/10": what the band holds against its limits, in
    the API server's canonical quantities."""
    fmt = quota.format_quantity
    if limits is None:
        holds = ", ".join(f"{r} {fmt(r, v)}" for r, v in sorted(held.items()) if v)
        return "not granted" + (f" (holds {holds})" if holds else "")
    shown = [*ALWAYS_SHOWN]
    if "gpus" in limits or held.get("gpus"):
        shown.insert(2, "gpus")
    shown += sorted(r for r in {*limits, *held} if r not in shown and r != "gpus")
    text = ", ".join(
        f"{r} {fmt(r, held.get(r, Fraction(0)))}/"
        + (fmt(r, limits[r]) if r in limits else "unlimited")
        for r in shown
        if r in ALWAYS_SHOWN or r in limits or held.get(r)
    )
    if len(text) > SUMMARY_MAX_LENGTH:
        text = text[: SUMMARY_MAX_LENGTH - 4] + " ..."
    return text


def desired_status(
    tq: Mapping[str, Any], charges: TeamCharges, ages: Mapping[str, float]
) -> dict[str, Any]:
    """The TeamQuota's status from the team's pods; `ages`: seconds since this controller
    first saw each reservation (a reservation of a pod not seen expires by it)."""
    book = Ledger.of(tq)
    used = dict(charges.used)
    kept = ledger.settle(
        book, charges.by_uid, lambda uid: ages.get(uid, 0.0) >= RESERVATION_TTL_SECONDS
    )
    after = dataclasses.replace(book, used=used, reservations=kept)
    return {
        **(tq.get("status") or {}),
        "observedGeneration": (tq.get("metadata") or {}).get("generation"),
        "used": ledger.used_field(used),
        **ledger.reservation_fields(kept),
        "summary": {b: band_summary(after.limits[b], after.held(b)) for b in names.BANDS},
    }


def decide(
    tq: Mapping[str, Any], charges: TeamCharges, ages: Mapping[str, float]
) -> StatusPlan | None:
    status = desired_status(tq, charges, ages)
    if status == (tq.get("status") or {}):
        return None
    meta = tq.get("metadata") or {}
    return StatusPlan(str(meta.get("name")), str(meta.get("resourceVersion") or ""), status)


def next_expiry(
    tq: Mapping[str, Any], charges: TeamCharges, ages: Mapping[str, float]
) -> float | None:
    """Seconds until the first reservation of a pod not seen runs out, so the controller
    wakes then (a reservation of a pod that exists waits for the pod, not the clock)."""
    left = [
        max(0.0, RESERVATION_TTL_SECONDS - ages.get(r.uid, 0.0))
        for r in Ledger.of(tq).reservations
        if r.uid not in charges.by_uid
    ]
    return min(left) if left else None
