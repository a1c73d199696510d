"""The drain planner: what to cordon and evict now, and the status to write. Pure.

`decide(observe(...))` is the whole decision of one round; the controller applies the plan
(cordon patches, then evictions, then the status) and times the blocked nodes. Everything
the plan depends on is in `Observed`, so a test builds any situation from dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pilotfish import names
from pilotfish.operators.maintenance.blockers import NodeRound, plan_pods
from pilotfish.operators.maintenance.model import (
    Observed,
    PodRef,
)
from pilotfish.operators.maintenance.order import plan_nodes
from pilotfish.operators.maintenance.reasons import (
    BLOCKER_BATCH,
    BLOCKER_BUDGET,
    BLOCKER_LOCAL_STORAGE,
    BLOCKER_REFUSED,
    BLOCKER_SURGE,
    BLOCKER_TERMINATING,
    CONDITION_BLOCKED,
    CONDITION_COMPLETE,
    CORDONED,
    DRAINED,
    DRAINING,
    EVENT_COMPLETE,
    EVENT_DRAIN_BLOCKED,
    EVENT_DRAIN_STARTED,
    EVENT_NODE_DRAINED,
    FAILED,
    PENDING,
    PHASE_DONE,
    REASON_DRAIN_BLOCKED,
    REASON_DRAINED,
    REASON_IN_PROGRESS,
    REASON_NODES_FAILED,
    REASON_NOT_BLOCKED,
)
from pilotfish.operators.maintenance.status import EventIntent, build

__all__ = [
    "BLOCKER_BATCH",
    "BLOCKER_BUDGET",
    "BLOCKER_LOCAL_STORAGE",
    "BLOCKER_REFUSED",
    "BLOCKER_SURGE",
    "BLOCKER_TERMINATING",
    "CONDITION_BLOCKED",
    "CONDITION_COMPLETE",
    "CORDONED",
    "DRAINED",
    "DRAINING",
    "EVENT_COMPLETE",
    "EVENT_DRAIN_BLOCKED",
    "EVENT_DRAIN_STARTED",
    "EVENT_NODE_DRAINED",
    "FAILED",
    "PENDING",
    "PHASE_DONE",
    "REASON_DRAINED",
    "REASON_DRAIN_BLOCKED",
    "REASON_IN_PROGRESS",
    "REASON_NODES_FAILED",
    "REASON_NOT_BLOCKED",
    "Cordon",
    "EventIntent",
    "Plan",
    "decide",
    "owns_cordon",
    "release",
]


@dataclass(frozen=True)
class Cordon:
    """One conditional patch: the draining annotation, and with set_unschedulable also
    `spec.unschedulable: true` and the cordoned-by annotation. False: someone else had
    cordoned the node already; they keep the cordon, Pilotfish never lifts it."""

    node: str
    set_unschedulable: bool


@dataclass(frozen=True)
class Plan:
    cordon: tuple[Cordon, ...]
    evict: tuple[PodRef, ...]
    status: dict[str, Any]  # the whole wire status, camelCase
    events: tuple[EventIntent, ...]  # only for transitions since the status read
    blocked_nodes: frozenset[str]  # blocked now; the controller times them (blocked_for)
    requeue_after: float | None  # seconds until the soonest time-based change


def decide(obs: Observed) -> Plan:
    starts = plan_nodes(obs.nodes, obs.spec, obs.name)
    draining = [s.view for s in starts if s.state == DRAINING]
    rounds: dict[str, NodeRound] = {
        r.node: r for r in plan_pods(draining, obs.spec, obs.budgets, obs.surge)
    }
    threshold = obs.spec.blocked_after_seconds
    blocked = [s.view for s in starts if s.view.name in rounds and rounds[s.view.name].blocked]
    overdue = [n.name for n in blocked if (n.blocked_for or 0.0) >= threshold]
    status, events = build(obs, starts, rounds, overdue)

    waits = [r.wake_after for r in rounds.values() if r.wake_after is not None]
    waits += [threshold - (n.blocked_for or 0.0) for n in blocked if n.name not in overdue]
    return Plan(
        cordon=tuple(Cordon(s.view.name, s.set_unschedulable) for s in starts if s.cordon),
        evict=tuple(p for r in rounds.values() for p in r.evict),
        status=status,
        events=tuple(events),
        blocked_nodes=frozenset(n.name for n in blocked),
        requeue_after=min(waits) if waits else None,
    )


def _annotations(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return (node.get("metadata") or {}).get("annotations") or {}


def owns_cordon(nm_name: str, node: Mapping[str, Any]) -> bool:
    """Whether releasing the node lifts its cordon (`spec.unschedulable: false`): only when
    this maintenance set it."""
    return _annotations(node).get(names.ANNOTATION_CORDONED_BY) == nm_name


def release(nm_name: str, nodes: Mapping[str, Mapping[str, Any] | None]) -> tuple[str, ...]:
    """The nodes to release when the maintenance is deleted, in the order given: every node
    whose draining or cordoned-by annotation names it. Both annotations go from each; the
    cordon goes only from those `owns_cordon` says it set."""
    return tuple(
        name
        for name, node in nodes.items()
        if node is not None
        and nm_name
        in (
            _annotations(node).get(names.ANNOTATION_DRAINING),
            _annotations(node).get(names.ANNOTATION_CORDONED_BY),
        )
    )
