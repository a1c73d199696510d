"""The whole decision for one node, in mode pilotfish: a pure function of the node, its pods,
how long this process has heard nothing from its lease, and its zone's brake verdict.

Phases, by silence `s` (on this process's monotonic clock) against the settings:
`s < unreachable_after`: only the taints that follow Ready (and lifting our NoExecute
taint from a node that came back); `s >= unreachable_after`: lost (`unreachable`);
`s >= unreachable_after + eviction_wait` and the brake lets it go: `eviction`. The plan
says when to look again (`requeue_after`): the next threshold, or a short recheck while a
brake holds the node. A node whose lease this process never saw is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from pilotfish.nodesilence import SilenceSettings
from pilotfish.operators.nodelifecycle.decide import TaintPlan, decide
from pilotfish.operators.nodelifecycle.eviction import Evict, evictions
from pilotfish.operators.nodelifecycle.model import NodeView, PodView
from pilotfish.operators.nodelifecycle.unreachable import (
    NodeStatusPlan,
    PodCondition,
    node_unknown,
    pods_not_ready,
)

# While a brake holds a node (or another zone's state may change the verdict), look again
# this often; events (a renewal, a pod change) come sooner.
BRAKE_RECHECK: Final = 10.0
# A lost node whose pods are all dealt with: look again this often all the same.
LOST_RECHECK: Final = 30.0
# Wake a hair after a threshold, not a hair before it (timer and clock rounding).
EPSILON: Final = 0.01


@dataclass(frozen=True)
class Verdict:
    """The zone brake as it applies to one node now."""

    braked: bool = False
    may_evict: bool = True
    release_at: float | None = None  # monotonic time the braked zone may let a node go


@dataclass(frozen=True)
class NodePlan:
    node: str
    lost: bool
    node_status: NodeStatusPlan | None = None
    taints: TaintPlan | None = None
    not_ready: tuple[PodCondition, ...] = ()
    evict: tuple[Evict, ...] = ()
    requeue_after: float | None = None
    held: bool = False  # due for eviction, held back by the zone brake
    braked: bool = False

    @property
    def writes(self) -> bool:
        return bool(self.node_status or self.taints or self.not_ready or self.evict)


def plan_node(
    node: NodeView,
    pods: tuple[PodView, ...],
    silent_for: float | None,
    settings: SilenceSettings,
    verdict: Verdict,
    now_mono: float,
    now_wall: str,
    renewed: bool = True,
) -> NodePlan:
    """`renewed`: this process has seen the node's lease renew (not only its first copy);
    until then a NoExecute taint a lost node carries is left, so a restarted process does
    not lift it from a node that is still silent."""
    if silent_for is None:
        return NodePlan(node.name, lost=False, taints=decide(node))
    unreachable_at = settings.unreachable_after
    evict_at = settings.unreachable_after + settings.eviction_wait
    if silent_for < unreachable_at:
        return NodePlan(
            node.name,
            lost=False,
            taints=decide(node, lost=False if renewed else None, now=now_wall),
            requeue_after=unreachable_at - silent_for + EPSILON,
        )
    status = node_unknown(node, silent_for, unreachable_at, now_wall)
    # The taints follow the Ready condition: decided once the Unknown written is seen.
    taints = None if status else decide(node, lost=True, now=now_wall)
    not_ready = pods_not_ready(node, pods, verdict.braked, now_wall)
    lost = NodePlan(
        node.name,
        lost=True,
        braked=verdict.braked,
        node_status=status,
        taints=taints,
        not_ready=not_ready,
    )
    if silent_for < evict_at:
        return replace(lost, requeue_after=min(evict_at - silent_for + EPSILON, LOST_RECHECK))
    if not verdict.may_evict:
        wait = BRAKE_RECHECK
        if verdict.release_at is not None:
            wait = min(wait, max(verdict.release_at - now_mono, 0.0) + EPSILON)
        return replace(lost, requeue_after=wait, held=True)
    evict = evictions(node, pods, silent_for, now_wall)
    evicted = {e.pod.key for e in evict}  # a terminating pod is out of rotation anyway
    return replace(
        lost,
        not_ready=tuple(c for c in not_ready if c.pod.key not in evicted),
        evict=evict,
        requeue_after=BRAKE_RECHECK if verdict.braked else LOST_RECHECK,
    )
