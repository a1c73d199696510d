"""Leader election on a coordination.k8s.io Lease, with conditional writes only.

Every acquire and renew is an update carrying the resourceVersion it was decided from, so two
candidates that read the same expired lease cannot both win. The decision is a pure function
of (lease, identity, now) so its rules are unit-tested without a cluster.

Timing (the same rule as client-go's leaderelection): a holder renews every `renew_seconds`;
a candidate takes over only after `lease_seconds` without a renewal; a holder that could not
renew within `lease_seconds` stops leading *before* anyone else may take over, by exiting.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from pilotfish.timeutil import parse_time, utcnow

log = logging.getLogger("pilotfish.leader")

Clock = Callable[[], datetime.datetime]


class Verdict(enum.Enum):
    CREATE = "create"  # no lease object yet
    RENEW = "renew"  # we hold it
    TAKE_OVER = "take-over"  # its holder went silent for a full lease
    WAIT = "wait"  # someone else holds a live lease


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    renew_time: datetime.datetime | None
    duration_seconds: int
    transitions: int
    resource_version: str | None


def view(obj: dict[str, Any] | None) -> LeaseView | None:
    if obj is None:
        return None
    spec = obj.get("spec") or {}
    rt = spec.get("renewTime")
    return LeaseView(
        holder=spec.get("holderIdentity"),
        renew_time=parse_time(rt) if rt else None,
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
    )


def decide(lease: LeaseView | None, identity: str, now: datetime.datetime) -> Verdict:
    if lease is None:
        return Verdict.CREATE
    if lease.holder == identity:
        return Verdict.RENEW
    if not lease.holder or lease.renew_time is None:
        return Verdict.TAKE_OVER
    expires = lease.renew_time + datetime.timedelta(seconds=lease.duration_seconds)
    return Verdict.TAKE_OVER if now >= expires else Verdict.WAIT


def _micro(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    api: client.ApiClient
    namespace: str
    name: str
    identity: str
    lease_seconds: int = 15
    renew_seconds: float = 5.0
    clock: Clock = utcnow

    async def _read(self) -> dict[str, Any] | None:
        coord = client.CoordinationV1Api(self.api)
        try:
            resp = await coord.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        data: dict[str, Any] = await resp.json()
        return data

    async def try_acquire_or_renew(self) -> bool | None:
        """One round: read, decide, write conditionally.

        True: we hold the lease. False: another identity holds a live lease. None: our write
        lost a race (conflict); the next round re-reads and decides again.
        """
        now = self.clock()
        obj = await self._read()
        lease = view(obj)
        verdict = decide(lease, self.identity, now)
        if verdict is Verdict.WAIT:
            return False
        coord = client.CoordinationV1Api(self.api)
        transitions = (lease.transitions if lease else 0) + (verdict is Verdict.TAKE_OVER)
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }
        if verdict is not Verdict.RENEW:
            spec["acquireTime"] = _micro(now)
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            if verdict is Verdict.CREATE:
                await coord.create_namespaced_lease(self.namespace, body)
            else:
                assert obj is not None and lease is not None
                body["metadata"]["resourceVersion"] = lease.resource_version
                if verdict is Verdict.RENEW:
                    spec["acquireTime"] = (obj.get("spec") or {}).get("acquireTime") or _micro(now)
                await coord.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as e:
            if e.status in (409, 422):  # someone else wrote first: decide again next round
                return None
            raise
        if verdict is not Verdict.RENEW:
            log.info("acquired leadership", extra={"lease": self.name, "identity": self.identity})
        return True

    async def acquire(self) -> None:
        """Block until this process leads."""
        while True:
            try:
                if await self.try_acquire_or_renew():
                    return
            except ApiException as e:
                log.warning(
                    "lease read/write failed", extra={"lease": self.name, "status": e.status}
                )
            await asyncio.sleep(self.renew_seconds)

    async def hold(self) -> None:
        """Renew until renewals fail for a whole lease; then return: the caller stops leading."""
        last_ok = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                ok = await self.try_acquire_or_renew()
            except (ApiException, OSError, TimeoutError) as e:
                log.warning("lease renewal failed", extra={"lease": self.name, "error": str(e)})
                ok = None
            now = asyncio.get_running_loop().time()
            if ok:
                last_ok = now
            elif ok is False or now - last_ok >= self.lease_seconds - self.renew_seconds:
                log.error("lost leadership", extra={"lease": self.name, "identity": self.identity})
                return
