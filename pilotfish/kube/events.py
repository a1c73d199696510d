"""events.k8s.io/v1 Events, written so that a busy controller cannot flood the API server.

Callers pass reason constants declared at the top of their own module (`GateReleased`,
...); this module only knows how to write them well:

- Series: the same event (same object, reason, action, type and note) repeated within
  `series_window` becomes one Event whose `series.count` grows, patched at most once per
  `series_interval`, as client-go's event recorder does. A controller that re-decides the
  same thing every round therefore costs one write per interval, not one per round.
- Spam filter: each regarded object gets a token bucket (`burst` events, refilled one per
  `refill_seconds`); events beyond it are dropped and counted, never queued without bound.
- Best effort: an Event that cannot be written is logged and counted; it never fails the
  reconcile that emitted it (the audit log and conditions are the durable record).
- Off the hot path: controllers `post` to the process's one `EventPoster`, which queues
  (bounded: beyond `capacity` an Event is dropped and counted) and writes from one task, so
  a slow or failing Events API never slows a reconcile.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiohttp

from pilotfish import metrics
from pilotfish.kube.rest import EVENTS, MERGE_PATCH, ApiError, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock, format_micro_time

log = logging.getLogger("pilotfish.events")

EventType = Literal["Normal", "Warning"]
NOTE_MAX: Final = 1024


def object_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The `regarding` reference of an Event about `obj` (a raw dict from the API)."""
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion") or "v1",
        "kind": obj.get("kind") or "Pod",
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    return {k: v for k, v in ref.items() if v}


@dataclass
class _Series:
    name: str
    namespace: str
    count: int
    first: float  # monotonic: windows and intervals are elapsed time
    last_observed: datetime.datetime  # wall: written into the Event
    last_written: float
    written_count: int


@dataclass
class _Allowance:
    tokens: float
    at: float  # monotonic


class EventRecorder:
    def __init__(
        self,
        rest: Rest,
        controller: str,
        instance: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        series_window: float = 600.0,
        series_interval: float = 30.0,
        burst: int = 25,
        refill_seconds: float = 300.0,
        max_tracked: int = 4096,
    ) -> None:
        self.rest = rest
        self.controller = controller  # reportingController, e.g. pilotfish.io/gates
        self.instance = instance[:128]  # reportingInstance: this process
        self.clock = clock
        self.series_window = series_window
        self.series_interval = series_interval
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.max_tracked = max_tracked
        self._series: OrderedDict[tuple[str, ...], _Series] = OrderedDict()
        self._allowance: OrderedDict[str, _Allowance] = OrderedDict()

    def _allowed(self, uid: str, now: float) -> bool:
        a = self._allowance.pop(uid, None) or _Allowance(float(self.burst), now)
        elapsed = max(0.0, now - a.at)
        a = _Allowance(min(float(self.burst), a.tokens + elapsed / self.refill_seconds), now)
        ok = a.tokens >= 1.0
        if ok:
            a.tokens -= 1.0
        self._allowance[uid] = a
        while len(self._allowance) > self.max_tracked:
            self._allowance.popitem(last=False)
        return ok

    async def emit(
        self,
        regarding: Mapping[str, Any],
        reason: str,
        note: str,
        *,
        action: str,
        type_: EventType = "Normal",
    ) -> str | None:
        """Record one occurrence; returns what was written: "created", "series", "pending"
        (counted, written with a later occurrence), "dropped" or None on failure."""
        return await self.emit_reference(
            object_reference(regarding), reason, note, action=action, type_=type_
        )

    async def emit_reference(
        self,
        ref: dict[str, Any],
        reason: str,
        note: str,
        *,
        action: str,
        type_: EventType = "Normal",
    ) -> str | None:
        """`emit` for an Event whose `regarding` reference is already made."""
        now = self.clock.now()
        mono = self.clock.monotonic()
        note = note[:NOTE_MAX]
        key = (
            str(ref.get("namespace", "")),
            str(ref.get("uid") or ref.get("name")),
            reason,
            action,
            type_,
            note,
        )
        series = self._series.get(key)
        if series and mono - series.first <= self.series_window:
            self._series.move_to_end(key)
            series.count += 1
            series.last_observed = now
            if mono - series.last_written < self.series_interval:
                metrics.EVENTS.labels(self.controller, reason, "pending").inc()
                return "pending"
            return await self._write_series(key, series, ref, reason, note, action, type_, now)
        if not self._allowed(key[1], mono):
            metrics.EVENTS.labels(self.controller, reason, "dropped").inc()
            return "dropped"
        return await self._create(key, ref, reason, note, action, type_, now)

    async def _create(
        self,
        key: tuple[str, ...],
        ref: dict[str, Any],
        reason: str,
        note: str,
        action: str,
        type_: EventType,
        now: datetime.datetime,
    ) -> str | None:
        ns = str(ref.get("namespace") or "default")
        digest = hashlib.sha1("\0".join(key).encode()).hexdigest()[:8]
        name = f"{str(ref.get('name', 'object'))[:200]}.{int(now.timestamp() * 1e6):x}{digest}"
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "eventTime": format_micro_time(now),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "note": note,
            "type": type_,
            "regarding": ref,
        }
        try:
            await self.rest.create(EVENTS.path(ns), body)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
            metrics.EVENTS.labels(self.controller, reason, "failed").inc()
            log.warning("event not written", extra={"event": name, "error": str(e)})
            return None
        mono = self.clock.monotonic()
        self._series[key] = _Series(name, ns, 1, mono, now, mono, 1)
        while len(self._series) > self.max_tracked:
            self._series.popitem(last=False)
        metrics.EVENTS.labels(self.controller, reason, "created").inc()
        return "created"

    async def _write_series(
        self,
        key: tuple[str, ...],
        series: _Series,
        ref: dict[str, Any],
        reason: str,
        note: str,
        action: str,
        type_: EventType,
        now: datetime.datetime,
    ) -> str | None:
        patch = {"series": {"count": series.count, "lastObservedTime": format_micro_time(now)}}
        try:
            await self.rest.patch(EVENTS.path(series.namespace, series.name), patch, MERGE_PATCH)
        except ApiError as e:
            if e.not_found:  # the Event expired (TTL) or was deleted: start a new one
                del self._series[key]
                return await self._create(key, ref, reason, note, action, type_, now)
            metrics.EVENTS.labels(self.controller, reason, "failed").inc()
            log.warning("event series not updated", extra={"event": series.name, "error": str(e)})
            return None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            metrics.EVENTS.labels(self.controller, reason, "failed").inc()
            log.warning("event series not updated", extra={"event": series.name, "error": str(e)})
            return None
        series.last_written = self.clock.monotonic()
        series.written_count = series.count
        metrics.EVENTS.labels(self.controller, reason, "series").inc()
        return "series"


@dataclass(frozen=True)
class _Posted:
    """A queued Event. It keeps the reference, not the object: controllers post the whole
    object a write returned, and while the one writer falls behind (a rollout of thousands
    of pods) the queue would keep every one of them alive (measured: ~25 MB for 2,500
    created pods, never returned to the system)."""

    controller: str
    regarding: dict[str, Any]  # object_reference of the object posted about
    reason: str
    note: str
    action: str
    type_: EventType


class EventPoster:
    """The process's one writer of Events: one recorder (series, spam filter) per reporting
    controller, fed from a bounded queue by `post` and drained by `run`."""

    def __init__(
        self, rest: Rest, instance: str, clock: Clock = SYSTEM_CLOCK, *, capacity: int = 10_000
    ) -> None:
        self.rest = rest
        self.instance = instance
        self.clock = clock
        self._recorders: dict[str, EventRecorder] = {}
        self._queue: asyncio.Queue[_Posted] = asyncio.Queue(maxsize=capacity)

    def recorder(self, controller: str) -> EventRecorder:
        rec = self._recorders.get(controller)
        if rec is None:
            rec = EventRecorder(self.rest, controller, self.instance, clock=self.clock)
            self._recorders[controller] = rec
        return rec

    def scoped(self, controller: str) -> ControllerEvents:
        """The poster as one controller uses it: Events reported by `controller`."""
        self.recorder(controller)
        return ControllerEvents(self, controller)

    def post(
        self,
        controller: str,
        regarding: Mapping[str, Any],
        reason: str,
        note: str,
        *,
        action: str,
        type_: EventType = "Normal",
    ) -> None:
        posted = _Posted(controller, object_reference(regarding), reason, note, action, type_)
        try:
            self._queue.put_nowait(posted)
            metrics.EVENTS_QUEUED.set(self._queue.qsize())
        except asyncio.QueueFull:
            metrics.EVENTS.labels(controller, reason, "dropped").inc()

    async def _write(self, p: _Posted) -> None:
        metrics.EVENTS_QUEUED.set(self._queue.qsize())
        await self.recorder(p.controller).emit_reference(
            p.regarding, p.reason, p.note, action=p.action, type_=p.type_
        )

    async def flush(self) -> None:
        """Write everything posted so far (short-lived processes, tests)."""
        while not self._queue.empty():
            await self._write(self._queue.get_nowait())

    async def run(self) -> None:
        while True:
            p = await self._queue.get()
            try:
                await self._write(p)
            except Exception:
                log.exception("event not written", extra={"reason": p.reason})


@dataclass(frozen=True)
class ControllerEvents:
    poster: EventPoster
    controller: str

    def post(
        self,
        regarding: Mapping[str, Any],
        reason: str,
        note: str,
        *,
        action: str,
        type_: EventType = "Normal",
    ) -> None:
        self.poster.post(self.controller, regarding, reason, note, action=action, type_=type_)
