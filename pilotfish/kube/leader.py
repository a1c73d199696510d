"""Leader election on a coordination.k8s.io Lease, the way client-go's leaderelection does it.

Three durations, with client-go's names and kube-controller-manager's defaults:
- `lease_duration` (15 s): how long a candidate waits after it last saw the lease record
  change before it may take the lease over;
- `renew_deadline` (10 s): how long the holder keeps retrying renewals through API errors
  before it stops leading;
- `retry_period` (2 s): the pause between attempts, for holder and candidates alike.

`retry_period + renew_deadline < lease_duration` is the safety margin: a holder cut off from
the API stops acting before any candidate may start. An outage shorter than the renew
deadline costs nothing; a 60 s one loses the lease (the process exits and is restarted
fresh), and the first candidate to reach the API afterwards leads.

A lease's age is measured from when THIS process saw its record change, on this process's
monotonic clock (client-go's `observedTime`). The holder's `renewTime` is never compared
with anything: another machine's wall clock may be hours off, and this machine's may jump.
A holder that keeps renewing changes the record every retry period, so it is never taken
over, whatever its `renewTime` says; a silent one is taken over a whole lease after this
process first saw its last record.

The one shortcut is a restart in place: a record holding this process's identity, written
by an earlier run on the same machine since its last boot (the same pod, or the same host in
local mode). Each write stamps the lease with the writer's boot id and monotonic time
(`ANNOTATION_CLOCK`); on the same boot that is the clock this process reads, so the earlier
run's last renewal is exactly as old as that clock says. A restart after an outage then
leads as soon as the API is back, while a restart right after a crash still waits until the
crashed run's last renewal is a lease old (its writes in flight can no longer land). A stamp
from another boot or machine, or none, is worth nothing: the full lease from observation.

Every write is an update carrying the resourceVersion it was decided from, so two candidates
that read the same expired lease cannot both win. The decision itself is a pure function.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp

from pilotfish.kube.rest import LEASES, ApiError, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock, format_micro_time

log = logging.getLogger("pilotfish.leader")

LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
# Candidates wait retry_period * (1 + JITTER * U[0,1)) between attempts so that replicas
# restarted together do not all write at once. client-go uses 1.2; 0.5 keeps a returning
# API's first successful attempt within 3 s.
JITTER = 0.5

# "<boot id> <monotonic seconds>" of the write that produced the lease's current record.
ANNOTATION_CLOCK: Final = "pilotfish.io/lease-clock"
BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")

# What an attempt may fail with while the API is away, restarting or overloaded; all retried.
TRANSIENT: tuple[type[Exception], ...] = (
    ApiError,
    OSError,
    TimeoutError,
    aiohttp.ClientError,
    ValueError,
)


class Verdict(enum.Enum):
    CREATE = "create"  # no lease object yet
    RENEW = "renew"  # this process holds it
    TAKE_OVER = "take-over"  # released, or its holder was silent for a whole lease
    WAIT = "wait"  # someone else holds a live lease


class Outcome(enum.Enum):
    LEADING = "leading"
    HELD_ELSEWHERE = "held-elsewhere"
    LOST_RACE = "lost-race"  # another writer got in between our read and our write


@dataclass(frozen=True)
class LeaseRecord:
    """The lease's spec, as client-go's LeaderElectionRecord: what "changed" compares."""

    holder: str
    duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_seconds,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            out["acquireTime"] = self.acquire_time
        if self.renew_time:
            out["renewTime"] = self.renew_time
        return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def record_of(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    acquire, renew = spec.get("acquireTime"), spec.get("renewTime")
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=_int(spec.get("leaseDurationSeconds")),
        acquire_time=acquire if isinstance(acquire, str) else None,
        renew_time=renew if isinstance(renew, str) else None,
        transitions=_int(spec.get("leaseTransitions")),
    )


def decide(record: LeaseRecord | None, identity: str, *, ours: bool, silent_for: float) -> Verdict:
    """What to do with the lease as read.

    `ours`: this process wrote exactly this record (it leads, or led until a moment ago).
    `silent_for`: how long the record has gone unchanged, as this process measures it.
    """
    if record is None:
        return Verdict.CREATE
    if ours and record.holder == identity:
        return Verdict.RENEW
    if not record.holder:
        return Verdict.TAKE_OVER
    return Verdict.TAKE_OVER if silent_for >= record.duration_seconds else Verdict.WAIT


def boot_id() -> str:
    """This machine's boot id: monotonic times are comparable between processes exactly
    when they share it (CLOCK_MONOTONIC counts from boot). "" when unknown: no shortcut."""
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return ""


def clock_stamp(boot: str, monotonic: float) -> str:
    return f"{boot} {monotonic:.6f}"


def stamp_age(obj: Mapping[str, Any], boot: str, monotonic: float) -> float | None:
    """Seconds since the write that stamped `obj`, if it was stamped on this boot; else None
    (another machine, an earlier boot, no stamp or a malformed one)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_CLOCK) if isinstance(annotations, Mapping) else None
    if not boot or not isinstance(value, str):
        return None
    stamped_boot, _, seconds = value.partition(" ")
    if stamped_boot != boot:
        return None
    try:
        written = float(seconds)
    except ValueError:
        return None
    return monotonic - written if math.isfinite(written) else None


class LeaseStore(Protocol):
    """Where the lease lives: one object, read and written whole, conditionally."""

    async def get(self) -> dict[str, Any] | None: ...

    async def create(
        self, spec: dict[str, Any], annotations: Mapping[str, str]
    ) -> dict[str, Any]: ...

    async def replace(
        self, spec: dict[str, Any], annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RestLeaseStore:
    rest: Rest
    namespace: str
    name: str

    def _body(
        self, spec: dict[str, Any], annotations: Mapping[str, str], resource_version: str | None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "annotations": dict(annotations),
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def get(self) -> dict[str, Any] | None:
        try:
            return await self.rest.get(LEASES.path(self.namespace, self.name))
        except ApiError as e:
            if e.not_found:
                return None
            raise

    async def create(self, spec: dict[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
        return await self.rest.create(
            LEASES.path(self.namespace), self._body(spec, annotations, None)
        )

    async def replace(
        self, spec: dict[str, Any], annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]:
        return await self.rest.replace(
            LEASES.path(self.namespace, self.name),
            self._body(spec, annotations, resource_version),
        )


@dataclass
class LeaderElector:
    store: LeaseStore
    identity: str
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD
    clock: Clock = SYSTEM_CLOCK
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    jitter: Callable[[], float] = random.random
    # This machine's boot id, for the restart-in-place shortcut; "" disables it.
    boot: str = field(default_factory=boot_id)
    _observed: LeaseRecord | None = field(default=None, init=False)
    _observed_at: float = field(default=0.0, init=False)
    # Records this process sent or got back from a write: a record it finds that is one of
    # these is its own, even when the answer to that write was lost.
    _ours: deque[LeaseRecord] = field(default_factory=lambda: deque(maxlen=8), init=False)
    _renewed_at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not (
            0 < self.retry_period < self.renew_deadline
            and self.retry_period + self.renew_deadline < self.lease_duration
        ):
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline and "
                "retry period + renew deadline < lease duration, "
                f"got retry period {self.retry_period:g}s, renew deadline "
                f"{self.renew_deadline:g}s, lease duration {self.lease_duration:g}s"
            )

    @property
    def observed(self) -> LeaseRecord | None:
        return self._observed

    def _observe(self, record: LeaseRecord, now: float) -> None:
        if record != self._observed:
            self._observed, self._observed_at = record, now

    def _silent_for(self, record: LeaseRecord, obj: Mapping[str, Any], now: float) -> float:
        """How long the record has gone unchanged: since this process first saw it, or, for
        a record of this identity stamped on this boot, since it was written (never less)."""
        observed = now - self._observed_at
        if record.holder != self.identity:
            return observed
        written = stamp_age(obj, self.boot, now)
        return observed if written is None else max(observed, written)

    async def try_acquire_or_renew(self) -> Outcome:
        """One round: read, decide, write conditionally."""
        obj = await self.store.get()
        now = self.clock.monotonic()
        if obj is None:
            return await self._write(None, None)
        record = record_of(obj)
        self._observe(record, now)
        verdict = decide(
            record,
            self.identity,
            ours=record in self._ours,
            silent_for=self._silent_for(record, obj, now),
        )
        if verdict is Verdict.WAIT:
            return Outcome.HELD_ELSEWHERE
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        return await self._write(record, rv)

    async def _write(self, old: LeaseRecord | None, resource_version: str | None) -> Outcome:
        stamp = format_micro_time(self.clock.now())
        annotations = {ANNOTATION_CLOCK: clock_stamp(self.boot, self.clock.monotonic())}
        same_holder = old is not None and old.holder == self.identity
        new = LeaseRecord(
            holder=self.identity,
            duration_seconds=math.ceil(self.lease_duration),
            acquire_time=(old.acquire_time if same_holder and old else None) or stamp,
            renew_time=stamp,
            transitions=(old.transitions if old else 0) + (1 if old and not same_holder else 0),
        )
        self._ours.append(new)
        try:
            if old is None or resource_version is None:
                written = await self.store.create(new.spec(), annotations)
            else:
                written = await self.store.replace(new.spec(), annotations, resource_version)
        except ApiError as e:
            if e.conflict:
                return Outcome.LOST_RACE
            raise
        back = record_of(written)
        self._ours.append(back)
        self._observe(back, self.clock.monotonic())
        if old is None or old not in self._ours:
            log.info(
                "acquired leadership",
                extra={"identity": self.identity, "previous": old.holder if old else None},
            )
        return Outcome.LEADING

    async def _attempt(self, within: float) -> Outcome | None:
        """One round bounded by `within` seconds: a hung API counts as a failed round."""
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), within)
        except TRANSIENT as e:
            error = f"{type(e).__name__}: {e}" if str(e) else f"no answer within {within:.1f}s"
            log.warning("lease round failed", extra={"identity": self.identity, "error": error})
            return None

    async def acquire(self) -> None:
        """Block until this process leads, retrying through any API error."""
        while True:
            started = self.clock.monotonic()
            if await self._attempt(self.renew_deadline) is Outcome.LEADING:
                self._renewed_at = started
                return
            await self.sleep(self.retry_period * (1 + JITTER * self.jitter()))

    async def hold(self) -> str:
        """Renew every retry period; return why leadership ended: another holder is seen, or
        a renewal cycle failed for the whole renew deadline. The caller must stop acting.

        A cycle starts a retry period after the last successful renewal began and, as in
        client-go, retries until the renew deadline from there; failed rounds are retried
        every quarter retry period, so an outage shorter than the renew deadline (less that
        quarter) never costs the lease. The deadline counts from when the last successful
        renewal was sent, not answered, so a slow answer cannot stretch it: the holder stops
        `lease_duration - retry_period - renew_deadline` (3 s) before a candidate may start.
        """
        if self._renewed_at is None:
            raise RuntimeError("hold() before acquire()")
        while True:
            await self.sleep(self.retry_period)
            deadline = self._renewed_at + self.retry_period + self.renew_deadline
            while True:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    return self._lost(f"no renewal succeeded for {self.renew_deadline:g}s")
                started = self.clock.monotonic()
                outcome = await self._attempt(remaining)
                if outcome is Outcome.LEADING:
                    self._renewed_at = started
                    break
                if outcome is Outcome.HELD_ELSEWHERE:
                    holder = self._observed.holder if self._observed else "?"
                    return self._lost(f"the lease is now held by {holder}")
                await self.sleep(
                    max(0.0, min(self.retry_period / 4, deadline - self.clock.monotonic()))
                )

    def _lost(self, why: str) -> str:
        log.error("lost leadership", extra={"identity": self.identity, "reason": why})
        return why
