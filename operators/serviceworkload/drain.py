"""Planned maintenance, seen from a ServiceWorkload: surge before the drain evicts.

A node being drained carries `pilotfish.io/draining` (set by the maintenance controller with
the cordon). A *surge-first* workload (its resolved strategy allows 0 unavailable, or it has
a single replica, and it is not at-most-one) must not lose a serving pod to the drain: its
PodDisruptionBudget allows 1 (see `pdb`), so the maintenance controller itself waits until
evicting the pod still leaves `replicas` Ready pods (blocker WaitingForSurge). This module is
the other half of that contract: the workload keeps `replicas + extra` pods, `extra` being
its pods on draining nodes (capped, below), so the replacements start (elsewhere: the node
is cordoned) while the old pods still serve, and nothing here ever deletes an old pod. Once
the drain evicts one, it is no longer counted in `extra` and the count is back at
`replicas` with no deletion.

At most `max(1, maxSurge)` surges exist at a time, the room a rollout gets: a workload with
two pods on one draining node and `maxSurge: 1` gets one surge; once it is Ready the drain
may evict one old pod (that still leaves `replicas` Ready), and the next surge follows.

A workload that allows unavailability needs nothing here: its budget lets the drain evict
one pod at a time and the planner replaces it at once. At-most-one workloads are never
surged: two copies must never run, so the fencing path replaces an evicted pod with the next
epoch once the old one is gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pilotfish.api.serviceworkload import ServiceWorkload
from pilotfish.operators.serviceworkload.rolling import Budget, Desired, PodState


def surge_first(model: ServiceWorkload, budget: Budget) -> bool:
    """Its pods get a replacement Ready elsewhere before the drain evicts them."""
    spec = model.spec
    return not spec.at_most_one and (spec.replicas == 1 or budget.max_unavailable == 0)


def node_of(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def drain_extra(
    pods: Sequence[Mapping[str, Any]],
    states: Sequence[PodState],
    budget: Budget,
    draining: frozenset[str],
) -> int:
    """How many pods above `replicas` the workload keeps while nodes it runs on drain: its
    staying pods (not terminating, not leaving for a rollout) on draining nodes, at most
    `max(1, maxSurge)`, and none beyond `replicas` (pods a scale-down is removing anyway:
    a workload scaled to 0 keeps nothing)."""
    if not draining:
        return 0
    on = sum(1 for p, s in zip(pods, states, strict=True) if s.active and node_of(p) in draining)
    return min(on, budget.replicas, max(1, budget.max_surge))


def with_extra(desired: Desired, extra: int) -> Desired:
    """The planner's target while draining: `replicas + extra`, the same surge room on top."""
    if extra == 0:
        return desired
    b = desired.budget
    return dataclasses.replace(desired, budget=dataclasses.replace(b, replicas=b.replicas + extra))


def complete_while_draining(
    pods: Sequence[PodState], desired: Desired, extra: int, now: float
) -> bool:
    """A rolled-out workload stays complete while it keeps drain surges: every staying pod
    runs the update revision, `replicas` of them are available, nothing is leaving for a
    rollout, and only the drain's surges are above `replicas`. A drain is not a rollout,
    and must neither start a progress deadline nor announce a completion when it ends."""
    if extra == 0:
        return False
    b = desired.budget
    active = [p for p in pods if p.active]
    if not b.replicas <= len(active) <= b.replicas + extra:
        return False
    if any(p.drain_requested_at is not None and p.counted and not p.terminating for p in pods):
        return False
    if any(p.revision != desired.update_revision for p in active):
        return False
    return sum(1 for p in active if p.available(b.min_ready_seconds, now)) >= b.replicas
