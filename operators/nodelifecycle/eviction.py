"""Eviction: the ordinary pods of a node lost for the eviction wait are deleted so that their
controllers replace them elsewhere. Pure.

Each pod first gets DisruptionTarget=True (reason `workloads.DISRUPTION_NODE_LOST`): on a
silent node the delete leaves it Terminating until the machine returns, and that condition
is what tells every controller not to count it (ReplicaSets and the ServiceWorkload
controller replace it at once; the batch operator recreates it without counting a failure).
Never evicted: at-most-one pods (`pilotfish.io/epoch`; the ServiceWorkload controller
releases them once their identity's lease has surely expired), DaemonSet pods (they belong
on that node) and mirror pods (the kubelet's). Finished pods run nothing and are left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pilotfish.conditions import set_condition
from pilotfish.operators.nodelifecycle.model import DISRUPTION_TARGET, NodeView, PodView
from pilotfish.workloads import DISRUPTION_NODE_LOST

EVICTION_REASON: Final = DISRUPTION_NODE_LOST


@dataclass(frozen=True)
class Evict:
    """Mark `pod` (unless it already carries a DisruptionTarget) and delete it by uid."""

    pod: PodView
    condition: dict[str, Any] | None  # None: already marked


def evictions(
    node: NodeView, pods: tuple[PodView, ...], silent_for: float, now: str
) -> tuple[Evict, ...]:
    message = (
        f"evicted by Pilotfish: node {node.name} has been silent for {silent_for:.0f}s; "
        "the pod is replaced elsewhere and removed once the node returns"
    )
    out = []
    for pod in pods:
        if not pod.evictable or pod.terminating or pod.terminal:
            continue
        cond = None
        if not pod.disrupted:
            cond = set_condition(
                [], DISRUPTION_TARGET, "True", DISRUPTION_NODE_LOST, message, None, now
            )
        out.append(Evict(pod, cond))
    return tuple(out)


def kept(pods: tuple[PodView, ...]) -> list[str]:
    """The pods of a lost node that eviction leaves where they are, for the log and Event."""
    return [p.key for p in pods if not p.evictable and not p.terminal and not p.terminating]
