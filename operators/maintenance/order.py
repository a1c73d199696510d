"""Which nodes drain now: the state of each node from API state, and the next ones to start.

A node's state is read back from its annotations every round, never from this process's
memory, so a restarted operator resumes where the API says it was: a node whose
`pilotfish.io/draining` annotation names this maintenance is Draining while it has pods to
move and Drained once it has none; every other node is Pending (or Failed, when it does not
exist). A node starts Draining in the round that cordons it (Cordoned if it has nothing to
move). At most `maxConcurrent` nodes drain at once (optionally one per zone); new ones start
in the order given or with the fewest production pods first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pilotfish.operators.maintenance.model import (
    ORDER_FEWEST_PRODUCTION,
    NodeView,
    Spec,
)
from pilotfish.operators.maintenance.reasons import (
    CORDONED,
    DRAINED,
    DRAINING,
    FAILED,
    PENDING,
)


@dataclass(frozen=True)
class NodeStart:
    """A node's state this round, and the cordon patch it needs, if any."""

    view: NodeView
    state: str
    message: str | None = None
    # Cordon: spec.unschedulable too (and cordoned-by), or only the draining annotation.
    cordon: bool = False
    set_unschedulable: bool = False


def is_ours(node: NodeView, nm: str) -> bool:
    return node.found and nm in (node.draining_by, node.cordoned_by)


def _held_elsewhere(node: NodeView, nm: str) -> str | None:
    if node.draining_by and node.draining_by != nm:
        return node.draining_by
    return None


def _recordon(node: NodeView, nm: str) -> tuple[bool, bool]:
    """A node of ours missing its cordon or its annotation (someone uncordoned it, or removed
    the annotation) gets the patch again; the node stays cordoned until the maintenance is
    deleted. Pilotfish takes the cordon over when it is the one that set it, or nobody has."""
    if node.unschedulable and node.draining_by == nm:
        return False, False
    return True, node.cordoned_by == nm or not node.unschedulable


def plan_nodes(nodes: Sequence[NodeView], spec: Spec, nm: str) -> list[NodeStart]:
    """Every node's state, in spec order: ours as the API says, then new starts."""
    out: dict[str, NodeStart] = {}
    candidates: list[NodeView] = []
    for node in nodes:
        other = _held_elsewhere(node, nm)
        if not node.found:
            out[node.name] = NodeStart(node, FAILED, f"node {node.name} not found")
        elif other is not None:
            out[node.name] = NodeStart(
                node, PENDING, f"waiting: node is being drained by NodeMaintenance {other}"
            )
        elif is_ours(node, nm):
            cordon, unschedulable = _recordon(node, nm)
            state = DRAINING if node.pods else DRAINED
            out[node.name] = NodeStart(node, state, None, cordon, unschedulable)
        else:
            candidates.append(node)

    active = [s for s in out.values() if s.state == DRAINING]
    zones = {s.view.zone for s in active}
    if spec.order == ORDER_FEWEST_PRODUCTION:
        # sorted() is stable: ties keep the order given.
        candidates = sorted(candidates, key=lambda n: n.production_pods)
    for node in candidates:
        if len(active) >= spec.max_concurrent:
            message = f"waiting: {len(active)} of maxConcurrent {spec.max_concurrent} draining"
        elif spec.one_per_zone and node.zone in zones:
            message = f"waiting: another node of zone {node.zone or '(none)'} is draining"
        else:
            # A node with nothing to move is only cordoned this round (Drained the next,
            # once the cordon is seen); one with pods starts draining at once.
            state = DRAINING if node.pods else CORDONED
            start = NodeStart(node, state, None, True, not node.unschedulable)
            out[node.name] = start
            active.append(start)
            zones.add(node.zone)
            continue
        out[node.name] = NodeStart(node, PENDING, message)
    return [out[n.name] for n in nodes]
