"""One sync's decision for a BatchWorkload: observed snapshot in, `Plan` out. Pure.

1. record: every terminal pod's outcome is added to what the status recorded (a success
   by its index; a failure or disruption once, by the pod's uid in `recordedPods`);
2. end: Complete, Failed (BackoffLimitExceeded, FailedIndexes) or running;
3. removals: pods whose outcome the new status shows lose the tracking finalizer and are
   deleted, except a failed index's last pod, which stays until its replacement exists
   (its failure count is read from it); a stopped job (suspended, ended) stops its pods.
   No finalizer stays on a pod whose replacement cannot be created: a suspended job's
   failed pods lose it (and stay, for their failure count), and in a namespace being
   deleted every task pod loses it (the namespace controller deletes them);
4. creates: indexes with no live pod and an outcome the *observed* status already shows,
   lowest first, within parallelism, the pacing limit and `creationRate`; a failed index
   after its backoff; the gang, while not released, all at once. None while a production
   pod waits for placement (`production`) or the namespace is being deleted;
5. status, computed last from what was observed.

The apply step writes the status first and only then removes finalizers, so an outcome is
in the API before the pod that proves it can go: a restart at any point neither loses nor
repeats one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish.indexranges import IndexSet
from pilotfish.operators.batchworkload.model import (
    Durable,
    Event,
    Memo,
    Observed,
    Task,
    durable_of,
)
from pilotfish.operators.batchworkload.pacing import BACKOFF_BASE_SECONDS, backoff_seconds
from pilotfish.operators.batchworkload.status import End, Recorded, compute_status, job_end

Obj = dict[str, Any]

# Creates per sync at most, as the Job controller's MaxPodCreateDeletePerSync.
MAX_CREATES_PER_SYNC: Final = 500
# Recorded terminal pods a job keeps (for `kubectl logs` and `describe`, as a Job keeps its
# pods) before one deletecollection takes them: kube-controller-manager's PodGC threshold.
# Deleting each as it is recorded was a delete and a watch event per task during the run
# (batch_job: 6.0 writes per task against the Job controller's 5.5); kept, they go when the
# job ends, or in batches of this many while a larger job runs.
RETAIN_RECORDED_PODS: Final = 12_500


@dataclass(frozen=True)
class Removal:
    """Take the tracking finalizer off a pod (a patch testing `finalizers`), then delete it."""

    name: str
    uid: str
    finalizers: tuple[str, ...]
    delete: bool
    why: str
    terminal: bool = True  # Succeeded or Failed: nothing left to stop on its node


@dataclass(frozen=True)
class Create:
    index: int
    attempt: int
    failures: int
    gang: bool
    replaces: Removal | None = None  # the index's previous pod, removed once this one exists


@dataclass(frozen=True)
class StatusWrite:
    resource_version: str
    status: Obj
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Plan:
    key: str
    bw: Obj
    status: StatusWrite | None
    removals: tuple[Removal, ...]
    creates: tuple[Create, ...]  # the gang's first, as one batch
    gang_size: int  # how many of `creates` are the gang
    wake_after: float | None
    end: End
    unbound: int
    memory: dict[int, Memo] = field(default_factory=dict)  # the controller keeps it
    # Pods labelled for the deletecollection still there that go now: send it (again).
    collect: tuple[Removal, ...] = ()
    # Whether the pods this round labels go in this round's deletecollection too (else they
    # are kept, recorded, until RETAIN_RECORDED_PODS or the job's end).
    collect_labelled: bool = True
    held: bool = False  # creates were held for production

    @property
    def summary(self) -> dict[str, int]:
        return {"creates": len(self.creates), "removals": len(self.removals)}


def _removal(t: Task, why: str, *, delete: bool = True) -> Removal:
    return Removal(t.name, t.uid, t.finalizers, delete, why, t.terminal)


def record(o: Observed, d: Durable) -> Recorded:
    """A pod being deleted while it runs (evicted, preempted, deleted by someone) is
    recorded at once, not when it ends: its end is settled, and a kubelet that never
    reports one (kwok) must not leave it held by the finalizer forever."""
    spec = o.model.spec
    n = spec.completions
    counting = not (d.is_true("Complete") or d.is_true("Failed") or spec.suspend)
    completed, failed_indexes = d.completed, d.failed_indexes
    failed, disrupted = d.failed, d.disrupted
    recorded = set(d.recorded)
    for t in sorted(o.tasks, key=lambda t: (t.index, t.attempt)):
        if t.phase == "Succeeded":
            if t.index < n and t.index not in completed and t.index not in failed_indexes:
                completed = completed.add(t.index)
        elif (t.phase == "Failed" or t.terminating) and t.tracked and t.uid not in recorded:
            if not counting:
                continue
            recorded.add(t.uid)
            if t.disrupted:
                disrupted += 1
                continue
            failed += 1
            limit = spec.backoff_limit_per_index
            if limit is not None and t.failures + 1 > limit and t.index not in completed:
                failed_indexes = failed_indexes.add(t.index)
    existing = {t.uid for t in o.tasks}
    return Recorded(completed, failed_indexes, failed, disrupted, frozenset(recorded & existing))


@dataclass
class _Ready:
    index: int
    attempt: int
    failures: int
    replaces: Removal | None


def remember(o: Observed, r: Recorded, by_index: dict[int, list[Task]]) -> dict[int, Memo]:
    """What the next attempt of each retrying index needs once its last pod is gone."""
    settled = r.completed.union(r.failed_indexes)
    memory = {i: m for i, m in o.memory.items() if i not in settled and i not in by_index}
    for index, tasks in by_index.items():
        latest = tasks[-1]
        if index in settled or not (latest.phase == "Failed" or latest.terminating):
            continue
        counted = latest.uid in r.recorded and not latest.disrupted
        since = o.failed_at.get(latest.uid, o.mono) if counted else None
        memory[index] = Memo(latest.attempt, latest.failures + counted, since)
    return memory


def decide(o: Observed, *, backoff_base: float = BACKOFF_BASE_SECONDS) -> Plan:
    spec = o.model.spec
    n = spec.completions
    d = durable_of(o.previous_status)
    r = record(o, d)
    end = job_end(o, d, r)
    stopping = end.outcome != "running" or spec.suspend
    gone = o.namespace_terminating
    held = not stopping and not gone and o.pace.held > 0
    no_creates = stopping or gone or held

    by_index: dict[int, list[Task]] = {}
    for t in sorted(o.tasks, key=lambda t: (t.index, t.attempt)):
        by_index.setdefault(t.index, []).append(t)
    settled = r.completed.union(r.failed_indexes)

    def needs_replacement(index: int) -> bool:
        return index < n and index not in settled and end.outcome == "running"

    removals: list[Removal] = []
    collect: list[Removal] = []
    for index, tasks in by_index.items():
        latest = tasks[-1]
        for t in tasks:
            if gone:
                if t.tracked:
                    removals.append(_removal(t, "namespace terminating", delete=False))
                continue
            if t.collectable and not t.tracked:
                if not t.terminating:
                    collect.append(_removal(t, "recorded"))
                continue
            if t.live:
                if stopping or not needs_replacement(index):
                    if not t.terminating:
                        removals.append(_removal(t, "stopped"))
                    elif t.tracked:
                        removals.append(_removal(t, "stopped", delete=False))
                elif t.terminating and t.tracked and t.uid in r.recorded:
                    removals.append(_removal(t, "recorded", delete=False))
                continue
            keep = t is latest and t.phase == "Failed" and needs_replacement(index)
            if keep and spec.suspend:  # no replacement while suspended: nothing held
                if t.tracked:
                    removals.append(_removal(t, "suspended", delete=False))
            elif not keep:
                removals.append(_removal(t, "recorded"))

    live = [t for t in o.tasks if t.live]
    busy = {t.index for t in live}
    unbound = sum(1 for t in o.tasks if t.unbound)
    waits: list[float] = []

    def backing_off(failures: int, since: float | None) -> bool:
        if since is None:
            return False
        due = since + backoff_seconds(failures, backoff_base)
        if o.mono < due:
            waits.append(due - o.mono)
            return True
        return False

    def ready(index: int) -> _Ready | None:
        tasks = by_index.get(index)
        if not tasks:
            m = o.memory.get(index)
            if m is None:
                return _Ready(index, 0, 0, None)
            return (
                None
                if backing_off(m.failures, m.since)
                else _Ready(index, m.attempt + 1, m.failures, None)
            )
        if index in busy or not needs_replacement(index):
            return None
        latest = tasks[-1]
        if latest.phase != "Failed":
            return None
        if latest.tracked and latest.uid not in d.recorded:
            return None  # its outcome is recorded first; the replacement the sync after
        counted = latest.uid in d.recorded and not latest.disrupted
        failures = latest.failures + (1 if counted else 0)
        since = o.failed_at.get(latest.uid, o.mono) if counted else None
        if backing_off(failures, since):
            return None
        return _Ready(index, latest.attempt + 1, failures, _removal(latest, "replaced"))

    creates: list[Create] = []
    gang = spec.gang or 0
    released = (
        gang == 0
        or any(t.index < gang and not t.gang_gated for t in o.tasks)
        or settled.count_below(gang) > 0
    )
    slots = spec.parallelism - len(live)
    if not no_creates and not released:
        members = [m for m in (ready(i) for i in range(gang)) if m is not None]
        if members and len(members) <= slots:
            creates += [Create(m.index, m.attempt, m.failures, True, m.replaces) for m in members]
    gang_size = len(creates)
    budget = min(
        slots - gang_size,
        o.pace.limit - unbound - gang_size,
        MAX_CREATES_PER_SYNC,
        o.pace.rate_room if o.pace.rate_room is not None else MAX_CREATES_PER_SYNC,
    )
    skip_below = gang if not released else 0
    if not no_creates and budget > 0:
        for index in _candidates(by_index, settled, n, skip_below):
            m = ready(index)
            if m is None:
                continue
            creates.append(Create(m.index, m.attempt, m.failures, False, m.replaces))
            if len(creates) - gang_size >= budget:
                if o.pace.rate_room is not None and o.pace.rate_wait is not None:
                    waits.append(o.pace.rate_wait)
                break
    elif not no_creates and o.pace.rate_room == 0 and o.pace.rate_wait is not None:
        waits.append(o.pace.rate_wait)
    if held and o.pace.held_wait is not None:
        waits.append(o.pace.held_wait)

    labelling = sum(1 for r in removals if r.delete and r.terminal)
    due = (
        stopping
        or gone
        or bool(collect)  # labelled live pods: stopped, their grace period starts now
        or any(r.delete and not r.terminal for r in removals)
        or len(o.retained) + labelling >= RETAIN_RECORDED_PODS
    )
    if due:
        collect += [Removal(name, uid, (), True, "recorded") for name, uid in o.retained]

    pending = len({i for i in busy if i < n and i not in settled})
    waiting = max(0, n - settled.count_below(n) - pending)
    active = sum(1 for t in live if not t.terminating)
    status, events = compute_status(
        o, d, r, end, active=active, waiting=waiting, unbound=unbound, held=held
    )
    write = None
    if status != dict(o.previous_status):
        write = StatusWrite(o.resource_version, status, events)
    return Plan(
        key=o.key,
        bw=o.bw,
        status=write,
        removals=tuple(removals),
        creates=tuple(creates),
        gang_size=gang_size,
        wake_after=min(waits) if waits and not stopping else None,
        end=end,
        unbound=unbound,
        memory=remember(o, r, by_index),
        collect=tuple(collect),
        collect_labelled=due,
        held=held,
    )


def _candidates(
    by_index: dict[int, list[Task]], settled: IndexSet, n: int, skip_below: int
) -> Iterator[int]:
    """Indexes that may need a pod, lowest first: those with pods (retries) merged with the
    ones never created (lazily: a 100,000-task job pays for what it takes)."""
    retries = sorted(i for i in by_index if skip_below <= i < n and i not in settled)
    fresh = (i for i in settled.missing_below(n) if i >= skip_below and i not in by_index)
    return heapq.merge(retries, fresh)
