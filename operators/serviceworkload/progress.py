"""The progress deadline: a rollout that makes no progress for `progressDeadlineSeconds` is
reported Stalled (and Progressing=False), while the old pods keep serving.

The clock of "last progress" is re-derived from the API on every sync, never kept in memory
(so a restarted operator reaches the same verdict) and never polled: the controller wakes
the workload up at `deadline - now`. Progress is any of:

- the update revision became the update revision (its ControllerRevision's activation
  time: a new rollout, or an undo to an older revision);
- a pod of the update revision was created, became Ready, or became available;
- a pod was asked to drain (old pods leaving is progress too);
- the rollout was resumed: Progressing turns True again at that moment, and its
  lastTransitionTime counts, so a long pause does not stall the rollout at once.

While paused there is no deadline (Deployments do the same); a complete rollout has none.
Progress after a stall (a node was added, a pod finally became ready) clears the stall.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pilotfish.operators.serviceworkload.rolling import Desired, PodState

# Reasons of the Progressing and Stalled conditions.
REASON_COMPLETE: Final = "RolloutComplete"
REASON_IN_PROGRESS: Final = "RolloutInProgress"
REASON_PAUSED: Final = "RolloutPaused"
REASON_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"

State = Literal["complete", "progressing", "paused", "stalled"]


@dataclass(frozen=True)
class Progress:
    state: State
    last_progress_at: float
    deadline_at: float | None = None  # when a rollout still progressing will stall


def is_complete(pods: Sequence[PodState], desired: Desired, now: float) -> bool:
    """Every replica runs the update revision and is available, and nothing else is left:
    no pod of another revision and no pod still draining."""
    b = desired.budget
    active = [p for p in pods if p.active]
    if len(active) != b.replicas:
        return False
    if any(p.drain_requested_at is not None and p.counted and not p.terminating for p in pods):
        return False
    return all(
        p.revision == desired.update_revision and p.available(b.min_ready_seconds, now)
        for p in active
    )


def last_progress_at(
    pods: Iterable[PodState],
    desired: Desired,
    now: float,
    *,
    activated_at: float | None,
    progressing_since: float | None,
) -> float:
    """The latest moment the rollout moved (see the module docstring)."""
    min_ready = desired.budget.min_ready_seconds
    times = [t for t in (activated_at, progressing_since) if t is not None]
    for p in pods:
        if p.drain_requested_at is not None and p.counted:
            times.append(p.drain_requested_at)
        if p.revision != desired.update_revision or not p.counted:
            continue
        times.append(p.created_at)
        if p.ready_since is not None:
            times.append(p.ready_since)
            available_at = p.ready_since + min_ready
            if available_at <= now:
                times.append(available_at)
    return min(max(times, default=now), now)


def assess(
    *, complete: bool, paused: bool, last_progress: float, deadline_seconds: float, now: float
) -> Progress:
    if complete:
        return Progress("complete", last_progress)
    if paused:
        return Progress("paused", last_progress)
    deadline = last_progress + deadline_seconds
    if now >= deadline:
        return Progress("stalled", last_progress)
    return Progress("progressing", last_progress, deadline)
