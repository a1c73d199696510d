"""A BatchWorkload's status, computed from what the sync observed (never from what it is
about to do), and the Events its transitions are announced with.

Counters and index sets come from `record` (the outcomes the pods show, added to what the
status already recorded); `active`, `waiting` and `pacing` from the pods as observed. The
job's end is final: once Complete or Failed is True it stays so, whatever pods come and go.
Conditions are built with `set_condition`, so an unchanged status is byte-identical and
not written again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from pilotfish.api.batchworkload import (
    COMPLETE,
    FAILED,
    REASON_BACKOFF_LIMIT,
    REASON_COMPLETED,
    REASON_FAILED_INDEXES,
    REASON_RESUMED,
    REASON_SUSPENDED,
    SUSPENDED,
)
from pilotfish.conditions import set_condition
from pilotfish.indexranges import IndexSet
from pilotfish.operators.batchworkload.model import Durable, Event, Observed

Obj = dict[str, Any]

EVENT_STARTED: Final = "Started"
EVENT_COMPLETED: Final = "Completed"
EVENT_FAILED: Final = "Failed"

Outcome = Literal["running", "complete", "failed"]


@dataclass(frozen=True)
class Recorded:
    """The durable part of the next status: what the status had plus the new outcomes."""

    completed: IndexSet
    failed_indexes: IndexSet
    failed: int
    disrupted: int
    recorded: frozenset[str]


@dataclass(frozen=True)
class End:
    outcome: Outcome
    reason: str = ""
    message: str = ""


def job_end(o: Observed, d: Durable, r: Recorded) -> End:
    spec = o.model.spec
    n = spec.completions
    ends: tuple[tuple[str, Outcome], ...] = ((COMPLETE, "complete"), (FAILED, "failed"))
    for type_, outcome in ends:
        c = d.condition(type_)
        if c is not None and c.get("status") == "True":
            return End(outcome, str(c.get("reason")), str(c.get("message") or ""))
    done = r.completed.count_below(n)
    failed_indexes = r.failed_indexes.count_below(n)
    if done >= n:
        return End("complete", REASON_COMPLETED, f"all {n} tasks succeeded")
    limit = spec.failures_tolerated
    if limit is not None and r.failed > limit:
        return End(
            "failed",
            REASON_BACKOFF_LIMIT,
            f"{r.failed} task failures, more than backoffLimit {limit}",
        )
    if failed_indexes and done + failed_indexes >= n:
        return End(
            "failed",
            REASON_FAILED_INDEXES,
            f"{failed_indexes} indexes failed more than backoffLimitPerIndex "
            f"{spec.backoff_limit_per_index} times: {r.failed_indexes.format()[:200]}",
        )
    return End("running")


def compute_status(
    o: Observed,
    d: Durable,
    r: Recorded,
    end: End,
    *,
    active: int,
    waiting: int,
    unbound: int,
    held: bool = False,
) -> tuple[Obj, tuple[Event, ...]]:
    spec = o.model.spec
    gen = o.generation
    prev = list(d.conditions)
    events: list[Event] = []
    conditions: list[Obj] = []

    def cond(type_: str, status: str, reason: str, message: str) -> None:
        conditions.append(set_condition(prev, type_, status, reason, message, gen, o.now))

    if end.outcome == "complete":
        cond(COMPLETE, "True", end.reason, end.message)
        if not d.is_true(COMPLETE):
            events.append(Event(EVENT_COMPLETED, end.message, "Complete"))
    elif end.outcome == "failed":
        cond(FAILED, "True", end.reason, end.message)
        if not d.is_true(FAILED):
            events.append(Event(EVENT_FAILED, f"{end.reason}: {end.message}", "Fail", "Warning"))
    if spec.suspend and end.outcome == "running":
        note = "suspended: no pods are created and running ones are deleted"
        cond(SUSPENDED, "True", REASON_SUSPENDED, note)
        if not d.is_true(SUSPENDED):
            events.append(Event(REASON_SUSPENDED, note, "Suspend"))
    elif d.condition(SUSPENDED) is not None:
        note = "resumed"
        cond(SUSPENDED, "False", REASON_RESUMED, note)
        if d.is_true(SUSPENDED):
            events.append(Event(REASON_RESUMED, note, "Resume"))
    mine = {COMPLETE, FAILED, SUSPENDED}
    conditions += [dict(c) for c in prev if c.get("type") not in mine]

    start = d.start_time
    if start is None and not spec.suspend:
        start = o.now
        events.insert(0, Event(EVENT_STARTED, f"started {spec.completions} tasks", "Start"))
    completion = d.completion_time
    if end.outcome == "complete" and completion is None:
        completion = o.now
    status: Obj = {
        "observedGeneration": gen,
        "active": active,
        "succeeded": r.completed.count(),
        "failed": r.failed,
        "disrupted": r.disrupted,
        "completedIndexes": r.completed.format(),
        "failedIndexes": r.failed_indexes.format(),
        "recordedPods": sorted(r.recorded),
        "waiting": waiting,
        "startTime": start,
        "completionTime": completion,
        "conditions": conditions,
    }
    if end.outcome == "running":
        status["pacing"] = {
            "inFlight": unbound,
            "limit": o.pace.limit,
            "bindsPerSecond": round(o.pace.binds_per_second, 1),
            "heldForProduction": o.pace.held if held else 0,
            "yieldRate": round(o.pace.yield_rate, 1),
            "createRate": round(o.pace.allowed, 1),
            "apiQueueingSeconds": round(o.pace.queueing, 3),
        }
    return {k: v for k, v in status.items() if v is not None}, tuple(events)
