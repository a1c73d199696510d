"""The one write that spends quota: reservations added to a TeamQuota, conditionally.

Admission (a pod being created) and the gate controller (a pod whose last Pilotfish gate it
is about to remove) spend room only here, by an update of the TeamQuota status that carries
the resourceVersion the decision was made from. The API server applies it only if nobody
wrote the TeamQuota in between, which is what makes every spend see every earlier one
(`pilotfish.ledger` says why the release writes too). On a 409 the TeamQuota is read again
and the decision made again, from the fresher ledger.

Spends against one TeamQuota are group-committed by a process: while one write is in flight
the spends that arrive queue, and the next write decides them one after another against
the ledger (each seeing the ones accepted before it) and carries all that fit in one
conditional update, each from the object the previous write returned while the informer
has not shown it yet (`OwnWrites` decides when the informer is fresh again). Concurrent
admissions then cost one round trip per batch instead of one each, and none loses a
resourceVersion race inside the process. Conflicts remain possible between processes
(webhook replicas, the gate controller, the quota controller settling): the whole batch is
decided again from the fresher copy.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from pilotfish import timeutil
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import TEAMQUOTAS, ApiError, Rest
from pilotfish.ledger import Ledger, Reservation, quota_for
from pilotfish.quota import Resources, add
from pilotfish.timeutil import SYSTEM_CLOCK, Clock

log = logging.getLogger("pilotfish.reservations")

# Attempts before a spend is given up as "quota busy": each conflict means another spend
# landed first, and the next attempt decides with it counted.
RESERVE_ATTEMPTS: Final = 8

# What to add to the ledger (empty: nothing needs holding), or why the spend is refused.
Decide = Callable[[Ledger], Sequence[Reservation] | str]


@dataclass(frozen=True)
class Reserved:
    """The spend holds; `quota` is the TeamQuota as written (None: nothing was written)."""

    quota: Mapping[str, Any] | None


@dataclass(frozen=True)
class Refused:
    message: str


class Reserver:
    """Spends quota through one TeamQuota informer, one own-writes tracker and the API."""

    def __init__(
        self,
        rest: Rest,
        quotas: Informer,
        name: str,
        clock: Clock = SYSTEM_CLOCK,
        *,
        on_conflict: Callable[[], None] = lambda: None,
        attempts: int = RESERVE_ATTEMPTS,
    ) -> None:
        self.rest = rest
        self.quotas = quotas
        self.on_conflict = on_conflict
        self.attempts = attempts
        self.tracker = OwnWrites(name, clock)
        self.tracker.watch(quotas)
        # The object a write returned (or a read found), kept only while the tracker says
        # the informer has not shown that version: the body the next decision starts from.
        self._pending: dict[str, Obj] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, list[_Spend]] = {}

    def ledgers(self) -> list[Ledger]:
        """Every TeamQuota as this process knows it, its own pending spends included: what
        a decision round reads, so it does not plan on room it has just handed out."""
        out = []
        for name in sorted(self.quotas.store):
            tq = self.current(name)
            if tq is not None:
                out.append(Ledger.of(tq))
        return out

    async def release(
        self, team: str, pods: Sequence[Release], now: datetime.datetime
    ) -> Reserved | Refused:
        """Reserve for `pods` of `team` before their last gate is removed; remove it only
        on Reserved. A team without a TeamQuota has nothing to hold against: Reserved."""
        tq = quota_for(team, (q for n in self.quotas.store if (q := self.current(n))))
        if tq is None:
            return Reserved(None)
        name = str(tq["metadata"]["name"])
        return await self.reserve(name, release_decision(pods, timeutil.format_time(now)))

    def current(self, name: str) -> Mapping[str, Any] | None:
        """The newest TeamQuota this process knows without asking the API server."""
        if self.tracker.fresh(name):
            self._pending.pop(name, None)
            return self.quotas.get(name)
        return self._pending.get(name) or self.quotas.get(name)

    async def reserve(self, name: str, decide: Decide) -> Reserved | Refused:
        """Decide from the current TeamQuota `name` and write what `decide` adds.

        A refusal made from the cache is confirmed on the API server's current copy first:
        the cached one may still hold reservations the quota controller has since settled.
        """
        answer: asyncio.Future[Reserved | Refused] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(name, []).append((decide, answer))
        async with self._locks.setdefault(name, asyncio.Lock()):
            batch = self._waiting.pop(name, [])
            if batch:  # else an earlier holder committed this spend with its own batch
                try:
                    await self._commit(name, batch)
                except BaseException as e:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
        return await answer

    async def _commit(self, name: str, batch: list[_Spend]) -> None:
        tq = self.current(name)
        fresh = False
        for _ in range(self.attempts):
            if tq is None:
                if fresh:
                    refused = Refused(f"TeamQuota {name} was deleted; no quota grants this pod")
                    _answer(batch, [refused] * len(batch))
                    return
                tq, fresh = await self._read(name), True
                continue
            verdicts, adds = _decide_all(tq, batch)
            if not fresh and any(isinstance(v, Refused) for v in verdicts):
                tq, fresh = await self._read(name), True  # refused from the cache: confirm
                continue
            if not adds:
                _answer(batch, [v or Reserved(None) for v in verdicts])
                return
            body = Ledger.of(tq).with_reservations(adds)
            try:
                written = await self.rest.replace(TEAMQUOTAS.path(name=name, sub="status"), body)
            except ApiError as e:
                if e.not_found:  # deleted since the cache saw it
                    tq, fresh = None, True
                    continue
                if not e.conflict:
                    raise
                self.on_conflict()
                tq, fresh = await self._read(name), True
                continue
            self._remember(name, written)
            _answer(batch, [v or Reserved(written) for v in verdicts])
            return
        log.warning("quota reservation kept conflicting", extra={"quota": name})
        busy = Refused(
            f"TeamQuota {name} is being updated by many admissions at once; retry the request"
        )
        _answer(batch, [busy] * len(batch))

    async def _read(self, name: str) -> Obj | None:
        try:
            got = await self.rest.get(TEAMQUOTAS.path(name=name))
        except ApiError as e:
            if e.not_found:
                return None
            raise
        self._remember(name, got)
        return got

    def _remember(self, name: str, obj: Obj) -> None:
        """Newer than the informer's copy until the informer shows this very version (which
        a read may find it showing already)."""
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv and rv == ((self.quotas.get(name) or {}).get("metadata") or {}).get(
            "resourceVersion"
        ):
            self._pending.pop(name, None)
            return
        self._pending[name] = obj
        self.tracker.wrote(name, obj)


_Spend = tuple[Decide, "asyncio.Future[Reserved | Refused]"]


def _decide_all(
    tq: Mapping[str, Any], batch: Sequence[_Spend]
) -> tuple[list[Reserved | Refused | None], list[Reservation]]:
    """Each spend of the batch decided in turn, against the ledger with the ones accepted
    before it added: per spend a verdict (None: accepted, it holds what it adds once the
    write lands), and everything added."""
    verdicts: list[Reserved | Refused | None] = []
    adds: list[Reservation] = []
    for decide, _ in batch:
        book = Ledger.of(Ledger.of(tq).with_reservations(adds)) if adds else Ledger.of(tq)
        outcome = decide(book)
        if isinstance(outcome, str):
            verdicts.append(Refused(outcome))
        elif not outcome:
            verdicts.append(Reserved(None))
        else:
            verdicts.append(None)
            adds.extend(outcome)
    return verdicts, adds


def _answer(batch: Sequence[_Spend], verdicts: Sequence[Reserved | Refused]) -> None:
    for (_, fut), verdict in zip(batch, verdicts, strict=True):
        if not fut.done():
            fut.set_result(verdict)


@dataclass(frozen=True)
class Release:
    """A pod about to leave its last Pilotfish gate: from then on it holds quota."""

    uid: str
    pod: str  # namespace/name
    band: str
    requests: Mapping[str, Fraction]


def release_decision(pods: Sequence[Release], now_text: str) -> Decide:
    """The spend of a release: the pods' room, reserved together (a gang holds all or none).

    A pod that already holds a reservation (admitted with one, or a release retried after
    its gate removal failed) needs nothing more. A band granted without limits needs no
    reservation, as at admission; a band the TeamQuota does not grant releases nothing.
    """

    def spend(book: Ledger) -> Sequence[Reservation] | str:
        owed = [p for p in pods if not book.holds(p.uid)]
        uids = {p.uid for p in pods}
        out: list[Reservation] = []
        for band in sorted({p.band for p in owed}):
            mine = [p for p in owed if p.band == band]
            ask: Resources = {}
            for p in mine:
                ask = add(ask, p.requests)
            check = book.check(band, ask, excluding=uids)
            if not check.admits:
                return check.message()
            if check.limits:
                out.extend(
                    Reservation(p.uid, p.pod, band, dict(p.requests), now_text) for p in mine
                )
        return out

    return spend
