"""Unreachable: a node whose lease has been silent for the unreachable timeout is marked so,
and its pods leave rotation. Pure.

The node's Ready condition becomes Unknown (reason NodeStatusUnknown, as upstream writes it),
which the taint rule turns into `unreachable:NoSchedule`; the silence rule adds
`unreachable:NoExecute`. Each pod on it that reports Ready gets Ready=False (reason
NodeUnreachable), so the endpoints controller drops it at once, unless the zone is braked:
a partitioned zone keeps serving. Pods without a Ready condition are already out of rotation
and are left alone; so are finished pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pilotfish.conditions import set_condition
from pilotfish.operators.nodelifecycle.model import NodeView, PodView
from pilotfish.workloads import POD_REASON_NODE_UNREACHABLE

REASON_NODE_STATUS_UNKNOWN: Final = "NodeStatusUnknown"
REASON_POD_NODE_UNREACHABLE: Final = POD_REASON_NODE_UNREACHABLE


@dataclass(frozen=True)
class NodeStatusPlan:
    """Merge `condition` into the node's status, valid only on the version decided from."""

    node: str
    from_version: str
    condition: dict[str, Any]


@dataclass(frozen=True)
class PodCondition:
    """Merge `condition` into the pod's status, valid only on the version decided from."""

    pod: PodView
    condition: dict[str, Any]


def silence_note(silent_for: float, unreachable_after: float) -> str:
    return (
        f"no lease renewal seen for {silent_for:.0f}s "
        f"(a node is unreachable after {unreachable_after:.0f}s of silence)"
    )


def node_unknown(
    node: NodeView, silent_for: float, unreachable_after: float, now: str
) -> NodeStatusPlan | None:
    """Ready=Unknown for a lost node; None when its Ready already says Unknown."""
    if node.ready == "Unknown":
        return None
    message = f"Pilotfish: {silence_note(silent_for, unreachable_after)}"
    cond = set_condition([], "Ready", "Unknown", REASON_NODE_STATUS_UNKNOWN, message, None, now)
    return NodeStatusPlan(node.name, node.resource_version, cond)


def pods_not_ready(
    node: NodeView, pods: tuple[PodView, ...], braked: bool, now: str
) -> tuple[PodCondition, ...]:
    """Ready=False for the pods of a lost node that still say Ready (none while braked)."""
    if braked:
        return ()
    message = f"node {node.name} is unreachable: its lease stopped renewing"
    out = []
    for pod in pods:
        if pod.terminal or pod.ready in (None, "False"):
            continue
        cond = set_condition([], "Ready", "False", REASON_POD_NODE_UNREACHABLE, message, None, now)
        out.append(PodCondition(pod, cond))
    return tuple(out)
