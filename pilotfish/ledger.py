"""The one quota ledger: what a team's TeamQuota has handed out, and whether it may hand out more.

Admission, the quota controller, the gate controller and `kubectl pilotfish why` read a
TeamQuota through this module only, so they cannot disagree about what is free.

The ledger is the TeamQuota object itself:
- `status.used`: what the quota controller counted from the team's pods that hold quota;
- `status.reservations`: room handed out to one pod (by uid) that `used` does not count yet.
  `status.reserved` is their sum, written for people and printer columns; no decision
  reads it, every decision sums the list.
A band holds `used + reservations`; a request fits when that, the requester's own
reservation left out, plus what it asks stays within every limited resource.

Spending. Every spend of room is a reservation added by an update of the TeamQuota status
conditional on the resourceVersion the decision read (`pilotfish.reservations.Reserver`):
admission of a pod, and the gate controller's release of a pod whose last Pilotfish gate
it removes. The release writes a reservation, rather than only reading this ledger, because
admission and the gate controller are separate processes and the TeamQuota is the only
object both write that the API server orders: a release that only read would see the room
a finished pod freed, so would admission, and each would hand it out. Two spenders racing
for the same room through a conditional write cannot both win: the second gets a 409,
reads again and decides with the first one's reservation counted. A gang's members are
reserved in one write, so a gang holds all its room or none.

Settling (the quota controller alone, `settle`): a reservation is dropped in the same write
that counts its pod in `used`; when its pod finished or is being deleted; or when its pod
never appeared within RESERVATION_TTL_SECONDS of the controller first seeing the
reservation (measured on the controller's own monotonic clock, never by comparing another
process's wall-clock stamp). A pod that exists but is still behind Pilotfish gates keeps
its reservation: the gate controller reserves before it removes the last gate, and a pod
admitted behind a GatePolicy's gates was admitted against the quota and still holds it.

A reservation is per pod uid, and a check leaves the requester's own out, so asking again
for a pod that already holds its room (a release retried after a failed gate removal) never
counts it twice. Several TeamQuotas claiming one team are a misconfiguration; the first by
name is the team's ledger for every reader (`quota_for`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Literal

from pilotfish import names, quantity, timeutil
from pilotfish.quota import (
    Excess,
    Resources,
    add,
    band_resources,
    canonical,
    counts_against_quota,
    describe,
    excess,
    parse_band_resources,
    parse_quantity,
    pod_band,
    pod_requests,
    standing,
    usage_text,
)

# A reservation whose pod has not appeared by then was never created (the API server gives
# a create 60 s at most; admission is well inside that).
RESERVATION_TTL_SECONDS: Final = 60.0

ZERO: Final = Fraction(0)


# --- limits --------------------------------------------------------------------------------


def band_limits(quota: Mapping[str, Any], band: str) -> Resources | None:
    """The limits a TeamQuota object sets for `band`; None when it does not grant the band.

    An amount that is not a quantity (only an object stored before the CRD's pattern
    matched this parser could hold one) limits that resource to zero: the team's band admits
    none of it until the TeamQuota is fixed, and no other team's quota is affected.
    """
    spec_band = ((quota.get("spec") or {}).get("bands") or {}).get(band)
    if spec_band is None:
        return None
    out: Resources = {}
    for key in ("cpu", "memory", "gpus", "pods"):
        if spec_band.get(key) is not None:
            out[key] = _limit(spec_band[key])
    for k, v in (spec_band.get("extended") or {}).items():
        out[canonical(k)] = _limit(v)
    return out


def _limit(value: Any) -> Fraction:
    try:
        return parse_quantity(value)
    except quantity.QuantityError:
        return ZERO


# --- what pods hold ------------------------------------------------------------------------


PodState = Literal["counted", "held", "gone"]


@dataclass(frozen=True)
class Charge:
    """What one pod means to its team's ledger.

    `counted`: it holds quota and `used` counts it; `held`: it exists behind Pilotfish gates
    (admitted, or being released), so it holds quota only through its reservation, if any;
    `gone`: finished or being deleted, it holds nothing.
    """

    uid: str
    band: str
    requests: Resources
    state: PodState


def charge_of(pod: Mapping[str, Any]) -> Charge:
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or meta.get(
        "deletionTimestamp"
    ):
        state: PodState = "gone"
    else:
        state = "counted" if counts_against_quota(pod) else "held"
    try:
        requests = pod_requests(pod) if state != "gone" else {}
    except quantity.QuantityError:
        requests = {}  # admission refuses such a pod: it cannot be running
    return Charge(str(meta.get("uid") or ""), pod_band(pod), requests, state)


def used_of(charges: Iterable[Charge]) -> dict[str, Resources]:
    """Per band, the requests of the pods that hold quota: what `status.used` says."""
    out: dict[str, Resources] = {}
    for c in charges:
        if c.state == "counted":
            out[c.band] = add(out.get(c.band, {}), c.requests)
    return out


@dataclass(frozen=True)
class TeamCharges:
    """A team's pods as its ledger sees them: `used` (what `used_of` gives for them) and each
    pod's charge by uid. The quota controller keeps both as running sums per namespace
    (`operators/quota/model.py`), so a reconcile of a 30,000-pod team does not sum every pod
    again; `of` builds them from a list at once."""

    used: Mapping[str, Resources]
    by_uid: Mapping[str, Charge]

    @classmethod
    def of(cls, charges: Iterable[Charge]) -> TeamCharges:
        by_uid = {c.uid: c for c in charges}
        return cls(used_of(by_uid.values()), by_uid)


@dataclass(frozen=True)
class Reservation:
    """Room handed out to one pod that `used` does not count yet."""

    uid: str
    pod: str  # namespace/name, for people
    band: str
    resources: Resources
    time: str  # when it was reserved (metav1.Time), for people: settling never reads it

    def wire(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "uid": self.uid,
            "band": self.band,
            "resources": band_resources(self.resources),
            "time": self.time,
        }


def reservation_for(
    pod: Mapping[str, Any], band: str, resources: Resources, now: datetime.datetime
) -> Reservation:
    """The reservation of `pod` (its uid; a pod being created may have no name yet)."""
    meta = pod.get("metadata") or {}
    return Reservation(
        uid=str(meta.get("uid") or ""),
        pod=f"{meta.get('namespace', '')}/{meta.get('name') or meta.get('generateName', '')}",
        band=band,
        resources=dict(resources),
        time=timeutil.format_time(now),
    )


def _reservation(obj: Mapping[str, Any]) -> Reservation:
    return Reservation(
        uid=str(obj.get("uid") or ""),
        pod=str(obj.get("pod") or ""),
        band=str(obj.get("band") or ""),
        resources=parse_band_resources(obj.get("resources")),
        time=str(obj.get("time") or ""),
    )


def not_granted(team: str, band: str) -> str:
    return (
        f"team {team} has no {band} quota: no TeamQuota grants it the {band} band, "
        "and no team runs in a band nobody granted it"
    )


# --- the ledger ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """Whether `ask` fits the band: `held` is what the band holds besides it."""

    quota: str
    team: str
    band: str
    limits: Resources | None  # None: the TeamQuota does not grant the band
    held: Resources
    ask: Resources
    over: tuple[Excess, ...]

    @property
    def granted(self) -> bool:
        return self.limits is not None

    @property
    def admits(self) -> bool:
        return self.granted and not self.over

    def message(self) -> str:
        """Why it does not fit, in admission's words."""
        if not self.granted:
            return not_granted(self.team, self.band)
        return "; ".join(describe(self.team, self.band, e) for e in self.over)


@dataclass(frozen=True)
class Ledger:
    name: str
    team: str
    resource_version: str
    limits: Mapping[str, Resources | None]  # per band; None: not granted
    used: Mapping[str, Resources]
    reservations: tuple[Reservation, ...]
    source: Mapping[str, Any] = field(compare=False, repr=False)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Ledger:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        used_wire = status.get("used") or {}
        return cls(
            name=str(meta.get("name") or ""),
            team=str((obj.get("spec") or {}).get("team") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            limits={band: band_limits(obj, band) for band in names.BANDS},
            used={b: parse_band_resources(used_wire.get(b)) for b in names.BANDS},
            reservations=tuple(_reservation(r) for r in status.get("reservations") or []),
            source=obj,
        )

    def holds(self, uid: str) -> bool:
        return any(r.uid == uid for r in self.reservations)

    def reserved(self, band: str, excluding: Collection[str] = ()) -> Resources:
        total: Resources = {}
        for r in self.reservations:
            if r.band == band and r.uid not in excluding:
                total = add(total, r.resources)
        return total

    def held(self, band: str, excluding: Collection[str] = ()) -> Resources:
        """What the band holds: used plus reserved (leaving out the pods in `excluding`)."""
        return add(self.used.get(band, {}), self.reserved(band, excluding))

    def room(self, band: str) -> Resources | None:
        """What is still free per limited resource (never below zero); None: not granted."""
        limits = self.limits.get(band)
        if limits is None:
            return None
        held = self.held(band)
        return {r: max(ZERO, lim - held.get(r, ZERO)) for r, lim in limits.items()}

    def check(
        self,
        band: str,
        ask: Mapping[str, Fraction],
        *,
        excluding: Collection[str] = (),
        spent: Mapping[str, Fraction] | None = None,
    ) -> Check:
        """May `ask` be handed out? `excluding`: the requesters' uids (their own reservations
        are what they ask again); `spent`: what the caller handed out since it read this."""
        limits = self.limits.get(band)
        held = add(self.held(band, excluding), spent or {})
        over = tuple(excess(limits, held, ask)) if limits is not None else ()
        return Check(self.name, self.team, band, limits, held, dict(ask), over)

    def with_reservations(self, new: Sequence[Reservation]) -> dict[str, Any]:
        """The TeamQuota with `new` added (a pod's earlier reservation replaced), as the
        body of the conditional status update."""
        uids = {r.uid for r in new}
        kept = [r for r in self.reservations if r.uid not in uids]
        status = dict(self.source.get("status") or {})
        status.update(reservation_fields([*kept, *new]))
        return {**self.source, "status": status}


def quota_for(team: str, quotas: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The team's TeamQuota (by name order if several claim the team: the first)."""
    mine = sorted(
        (q for q in quotas if (q.get("spec") or {}).get("team") == team),
        key=lambda q: str((q.get("metadata") or {}).get("name") or ""),
    )
    return mine[0] if mine else None


def read_part(obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """What of a TeamQuota the ledger reads (spec, used, reservations): a reader that acts
    when room appears must look again when this changes, and may ignore other writes."""
    status = obj.get("status") or {}
    return obj.get("spec"), status.get("used"), status.get("reservations")


def ledger_for(team: str, quotas: Iterable[Mapping[str, Any]]) -> Ledger | None:
    tq = quota_for(team, quotas)
    return None if tq is None else Ledger.of(tq)


def reservation_fields(reservations: Sequence[Reservation]) -> dict[str, Any]:
    """`reservations` and `reserved` in wire form: `reserved` is always their sum."""
    reserved: dict[str, Resources] = {}
    for r in reservations:
        reserved[r.band] = add(reserved.get(r.band, {}), r.resources)
    return {
        "reserved": {b: band_resources(v) for b, v in sorted(reserved.items())},
        "reservations": [r.wire() for r in reservations],
    }


def used_field(used: Mapping[str, Resources]) -> dict[str, Any]:
    """`used` in wire form: a band that holds nothing is left out."""
    return {b: band_resources(v) for b, v in sorted(used.items()) if band_resources(v)}


# --- settling ------------------------------------------------------------------------------


def settle(
    ledger: Ledger, charges: Mapping[str, Charge], expired: Callable[[str], bool]
) -> tuple[Reservation, ...]:
    """The reservations still owed, given the team's pods by uid and which reservations of
    pods not seen have outlived the TTL (`expired(uid)`, measured by the caller)."""
    kept = []
    for r in ledger.reservations:
        c = charges.get(r.uid)
        if c is None:
            if not expired(r.uid):
                kept.append(r)  # not created yet, or not seen yet: it may still come
        elif c.state == "held":
            kept.append(r)  # behind Pilotfish gates: admitted or being released, holds it
        # counted: `used` counts it in this very write; gone: it never will be
    return tuple(kept)


# --- the gate controller's quota condition -------------------------------------------------


@dataclass(frozen=True)
class GateQuota:
    """The Quota condition: (satisfied, evidence, summary) as the gate controller words it.

    `evidence` is exact and moves with usage (Events, audit); `summary` changes only when
    the reason does (the pod condition message)."""

    satisfied: bool
    evidence: str
    summary: str = ""


def gate_condition(
    team: str | None,
    band: str,
    ask: Mapping[str, Fraction],
    quotas: Iterable[Ledger],
    *,
    spent: Mapping[str, Fraction] | None = None,
    excluding: Collection[str] = (),
) -> GateQuota:
    """May the pods of one release (`ask`, their uids `excluding`) take room in `band`?

    The same check admission makes, on the same ledger: the team's TeamQuota, used plus
    reserved, plus `spent` (what this round released already). The release itself then
    reserves through `pilotfish.reservations`, which checks again against the version it
    writes to; this verdict only decides what to try.
    """
    if not team:
        return GateQuota(
            False,
            "pod has no team (label pilotfish.io/team on the pod or its namespace)",
            "no team",
        )
    mine = sorted((q for q in quotas if q.team == team), key=lambda q: q.name)
    if not mine:
        return GateQuota(False, f"team {team} has no TeamQuota", f"team {team} has no TeamQuota")
    ledger = mine[0]
    c = ledger.check(band, ask, excluding=excluding, spent=spent)
    head = f"team {team}, {band}: TeamQuota {ledger.name}"
    if c.limits is None:
        return GateQuota(
            False, f"{head} does not grant the {band} band", f"team {team} has no {band} quota"
        )
    if c.over:
        return GateQuota(
            False,
            f"{head}: " + "; ".join(usage_text(e) for e in c.over),
            f"quota of team {team}, band {band} full on "
            + ", ".join(sorted(e.resource for e in c.over)),
        )
    shown = "; ".join(usage_text(e) for e in standing(c.limits, c.held, c.ask))
    return GateQuota(True, f"{head}: {shown or 'no limits'}")
