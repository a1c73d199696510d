"""Wiring: the shared TeamQuota, pod and namespace informers, the queue, and
reconcile = observe → decide → apply, keyed by TeamQuota name.

A pod event re-enqueues the TeamQuotas of its namespace's team only when the pod's charge
changed; a namespace whose team label moves re-enqueues both teams' quotas.

Some writes are made at once: a pod started without a reservation must be counted in a
resource its band limits before anyone hands that room out again, and a reservation must be
settled while its pod is there to be counted (settled after the pod is gone, it would look
like one whose pod never appeared and wait out its TTL). Any other write, with the
reservations unchanged (pods ended, or pods started in what no limit bounds: an unlimited
band's pod count), waits until `min_write_interval` (1 s) has passed since the TeamQuota's
last write and takes everything that changed meanwhile: a batch job ending tasks by the
dozen per second, or a team creating raw pods in an unlimited band, otherwise costs the API
server a TeamQuota update per pod (and every TeamQuota watcher an event). Waiting there is
safe, as no decision reads what it changes: the ledger holds more than it needs to until
then, never less, where a limit exists.

While a status write of ours is not yet in the informer, the cached TeamQuota is older than
what we wrote: reconcile waits for it (the event that shows the write re-enqueues it).

The age of a reservation is measured from when this controller first saw it, on its own
monotonic clock: comparing the reservation's wall-clock stamp, written by another process,
with this machine's clock would expire it early or late by their skew. A restart therefore
gives every reservation of a pod not seen a fresh TTL, which only ever over-counts.
"""

from __future__ import annotations

from typing import Final

from pilotfish.kube import projections
from pilotfish.kube.informer import Obj
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import NAMESPACES, PODS, TEAMQUOTAS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, Result, WorkQueue, requeue_after
from pilotfish.ledger import Ledger
from pilotfish.names import BANDS
from pilotfish.operators.quota.apply import CONTROLLER, apply
from pilotfish.operators.quota.decide import decide, next_expiry
from pilotfish.operators.quota.exported import QuotaMetrics
from pilotfish.operators.quota.model import ChargeIndex, team_of_namespace, team_of_quota

WORKERS: Final = 2
# A write not yet seen: look again after this, in case the event that shows it is lost
# (OwnWrites' own expiry bounds the wait).
UNSETTLED_RECHECK: Final = 5.0
# Wake a little after a reservation runs out, never just before it.
EXPIRY_SLACK: Final = 0.1
MIN_WRITE_INTERVAL_SECONDS: Final = 1.0


def may_wait(tq: Obj, status: Obj) -> bool:
    """Whether writing `status` may wait for the next interval: it keeps `tq`'s reservations
    as they are and raises nothing a band limits. Room returned, and usage of what no limit
    bounds (an unlimited band's pods, a resource its band leaves out), change no decision
    of admission or the gate controller; usage of a limited resource does."""
    before, after = Ledger.of(tq), Ledger.of({**tq, "status": status})
    if before.reservations != after.reservations:
        return False
    for band in BANDS:
        limits = after.limits.get(band) or {}
        was, now = before.held(band), after.held(band)
        if any(
            amount > was.get(resource, 0) and resource in limits for resource, amount in now.items()
        ):
            return False
    return True


class QuotaController:
    def __init__(
        self,
        rt: Runtime,
        workers: int = WORKERS,
        min_write_interval: float = MIN_WRITE_INTERVAL_SECONDS,
    ) -> None:
        self.rt = rt
        self.workers = workers
        self.min_write_interval = min_write_interval
        self.last_write: dict[str, float] = {}  # TeamQuota name -> monotonic time
        self.quotas = rt.factory.informer(TEAMQUOTAS)
        self.pods = rt.factory.informer(PODS, projection=projections.pod)
        self.namespaces = rt.factory.informer(NAMESPACES)
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        self.writes = OwnWrites(CONTROLLER, rt.clock, on_settled=self.queue.add)
        self.writes.watch(self.quotas)
        self.charges = ChargeIndex()
        self.exported = QuotaMetrics()
        # TeamQuota name -> reservation uid -> monotonic time this controller first saw it.
        self.first_seen: dict[str, dict[str, float]] = {}
        self.quotas.add_handler(self._on_quota)
        self.pods.add_handler(self._on_pod)
        self.namespaces.add_handler(self._on_namespace)

    # handlers

    def _on_quota(self, _kind: str, obj: Obj, _old: Obj | None) -> None:
        self.queue.add(str(obj["metadata"]["name"]))

    def _on_pod(self, kind: str, obj: Obj, _old: Obj | None) -> None:
        if self.charges.apply(kind, obj):
            ns = self.namespaces.get(str(obj["metadata"].get("namespace") or ""))
            self._enqueue_team(team_of_namespace(ns))

    def _on_namespace(self, kind: str, obj: Obj, old: Obj | None) -> None:
        before, after = team_of_namespace(old), team_of_namespace(obj)
        if before != after or kind in ("ADDED", "DELETED"):
            self._enqueue_team(before)
            self._enqueue_team(after)

    def _enqueue_team(self, team: str | None) -> None:
        if team is None:
            return
        for name, tq in self.quotas.store.items():
            if team_of_quota(tq) == team:
                self.queue.add(name)

    # reconcile

    def _namespaces_of(self, team: str) -> list[str]:
        return [
            str(ns["metadata"]["name"])
            for ns in self.namespaces.store.values()
            if team_of_namespace(ns) == team
        ]

    def _ages(self, name: str, tq: Obj) -> dict[str, float]:
        now = self.rt.clock.monotonic()
        before = self.first_seen.get(name, {})
        seen = {r.uid: before.get(r.uid, now) for r in Ledger.of(tq).reservations}
        if seen:
            self.first_seen[name] = seen
        else:
            self.first_seen.pop(name, None)
        return {uid: now - at for uid, at in seen.items()}

    async def reconcile(self, name: str) -> Result:
        if not self.writes.settled(name):
            return requeue_after(UNSETTLED_RECHECK, "own status write not yet observed")
        tq = self.quotas.get(name)
        if tq is None:
            self.first_seen.pop(name, None)
            self.last_write.pop(name, None)
            self.exported.forget(name)
            return DONE
        charges = self.charges.team(self._namespaces_of(team_of_quota(tq)))
        ages = self._ages(name, tq)
        plan = decide(tq, charges, ages)
        self.exported.export(name, tq if plan is None else {**tq, "status": plan.status})
        if plan is not None:
            now = self.rt.clock.monotonic()
            since = now - self.last_write.get(name, now - self.min_write_interval)
            if since < self.min_write_interval and may_wait(tq, plan.status):
                return requeue_after(self.min_write_interval - since, "coalescing status writes")
            self.last_write[name] = now
        result = DONE if plan is None else await apply(self.rt.rest, self.writes, tq, plan)
        wake = next_expiry(tq if plan is None else {"status": plan.status}, charges, ages)
        if result.retry or wake is None:
            return result
        return requeue_after(wake + EXPIRY_SLACK, "a reservation of a pod not seen runs out")

    async def run(self) -> None:
        await self.rt.factory.wait_synced()
        await self.queue.run(self.workers, self.reconcile)
