"""TeamQuota usage: recompute `status.used` from pods and settle admission's reservations.

Admission reserves quota in `status.reservations` with a resourceVersion-conditional write,
so concurrent pod creations are linearised by the API server (as the built-in quota
admission does). This controller closes the loop: a reservation whose pod is now counted in
`used` is dropped in the same write that counts it, and one whose pod never appeared (the
create failed after admission, or was a later webhook's denial) is returned after
RESERVATION_TTL_SECONDS. `used + reserved` therefore never under-counts what runs.

It also writes `summary`: per band one line of held/limit amounts, the only form a printer
column (a JSONPath, which cannot join fields) can show in `kubectl get teamquota`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, Final

from pilotfish import metrics, names, quota
from pilotfish.api.teamquota import SUMMARY_MAX_LENGTH
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.rest import NAMESPACES, PODS, TEAMQUOTAS, ApiError, Rest
from pilotfish.kube.workqueue import WorkQueue
from pilotfish.timeutil import parse_time as _time

log = logging.getLogger("pilotfish.quota")

CONTROLLER: Final = "quota"
# A reservation whose pod has not appeared by then was never created (the API server gives a
# create 60 s at most; admission is well inside that).
RESERVATION_TTL_SECONDS: Final = 60.0
RESYNC_SECONDS: Final = 60.0
# Shown for every band, limited or not; GPUs and extended resources only when limited or held.
ALWAYS_SHOWN: Final = ("cpu", "memory", "pods")


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


def summaries(
    tq: Obj, used: dict[str, quota.Resources], reserved: dict[str, quota.Resources]
) -> dict[str, str]:
    """`summary` per band, from what admission counts: used plus reserved."""
    return {
        band: band_summary(
            quota.band_limits(tq, band),
            quota.add(used.get(band, {}), reserved.get(band, {})),
        )
        for band in names.BANDS
    }


def desired_status(tq: Obj, team_pods: Iterable[Obj], now: datetime.datetime) -> dict[str, Any]:
    """The TeamQuota's status as it should be, from the team's pods and current reservations."""
    pods = list(team_pods)
    seen = {(p.get("metadata") or {}).get("uid") for p in pods}
    used: dict[str, quota.Resources] = {}
    for p in pods:
        if quota.counts_against_quota(p):
            band = quota.pod_band(p)
            used[band] = quota.add(used.get(band, {}), quota.pod_requests(p))
    status = tq.get("status") or {}
    kept = [
        r
        for r in status.get("reservations") or []
        if r.get("uid") not in seen
        and (now - _time(r["time"])).total_seconds() < RESERVATION_TTL_SECONDS
    ]
    reserved: dict[str, quota.Resources] = {}
    for r in kept:
        reserved[r["band"]] = quota.add(
            reserved.get(r["band"], {}), quota.parse_band_resources(r.get("resources"))
        )
    return {
        **status,
        "observedGeneration": (tq.get("metadata") or {}).get("generation"),
        "used": {b: quota.band_resources(v) for b, v in sorted(used.items())},
        "reserved": {b: quota.band_resources(v) for b, v in sorted(reserved.items())},
        "reservations": kept,
        "summary": summaries(tq, used, reserved),
    }


def next_expiry(tq: Obj, now: datetime.datetime) -> float | None:
    """Seconds until the oldest reservation runs out, so the controller wakes then."""
    times = [_time(r["time"]) for r in (tq.get("status") or {}).get("reservations") or []]
    if not times:
        return None
    return max(0.0, RESERVATION_TTL_SECONDS - (now - min(times)).total_seconds())


class QuotaController:
    def __init__(self, rest: Rest, workers: int = 2, clock: Any = None) -> None:
        self.rest = rest
        self.workers = workers
        self.clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self.quotas = Informer(rest, TEAMQUOTAS, resync_seconds=RESYNC_SECONDS)
        self.pods = Informer(rest, PODS)
        self.namespaces = Informer(rest, NAMESPACES)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER)
        self.quotas.add_handler(lambda _k, obj, _o: self.queue.add(obj["metadata"]["name"]))
        self.pods.add_handler(lambda _k, obj, _o: self._pod_changed(obj))

    def _team_of(self, pod: Obj) -> str | None:
        ns = self.namespaces.get(pod["metadata"].get("namespace", ""))
        return quota.pod_team(pod, ((ns or {}).get("metadata") or {}).get("labels"))

    def _pod_changed(self, pod: Obj) -> None:
        team = self._team_of(pod)
        for tq in self.quotas.store.values():
            if (tq.get("spec") or {}).get("team") == team:
                self.queue.add(tq["metadata"]["name"])

    async def sync(self, name: str) -> None:
        tq = self.quotas.get(name)
        if tq is None:
            return
        team = (tq.get("spec") or {}).get("team")
        team_pods = [p for p in self.pods.store.values() if self._team_of(p) == team]
        now = self.clock()
        status = desired_status(tq, team_pods, now)
        wake = next_expiry({"status": status}, now)
        if wake is not None:
            self.queue.add_after(name, wake + 0.1)
        if status == (tq.get("status") or {}):
            return
        body = {**tq, "status": status}
        try:
            await self.rest.replace(TEAMQUOTAS.path(name=name, sub="status"), body)
        except ApiError as e:
            if e.not_found:
                return
            if e.conflict:  # admission reserved meanwhile: decide again from the newer copy
                metrics.OPERATOR_CONFLICTS.labels(CONTROLLER).inc()
                self.queue.add_rate_limited(name)
                return
            metrics.OPERATOR_RECONCILE_ERRORS.labels(CONTROLLER).inc()
            raise

    async def run(self) -> None:
        await asyncio.gather(
            self.quotas.run(),
            self.pods.run(),
            self.namespaces.run(),
            self.queue.run(self.workers, self.sync),
        )
