"""Decide: the taint list a node should carry for its Ready status. Pure.

Ready False → `not-ready:NoSchedule`, Ready Unknown or absent → `unreachable:NoSchedule`,
Ready True → neither. Every other taint (other owners', and NoExecute taints of the same
keys) is kept as it is, in its order; the owned ones go last, sorted, so the same node
always yields the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pilotfish.operators.nodelifecycle.model import (
    OWNED_EFFECT,
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    NodeView,
    owned,
)


@dataclass(frozen=True)
class TaintPlan:
    """Set the node's full taint list, valid only on the version it was decided from."""

    node: str
    from_version: str
    taints: tuple[dict[str, Any], ...]
    add_field: bool  # spec.taints is absent: the patch adds it

    @property
    def owned_keys(self) -> list[str]:
        return [str(t["key"]) for t in self.taints if owned(t)]


def wanted_keys(ready: str) -> set[str]:
    if ready == "True":
        return set()
    return {TAINT_NOT_READY if ready == "False" else TAINT_UNREACHABLE}


def decide(node: NodeView) -> TaintPlan | None:
    """The write that makes the node's taints follow its Ready status; None when they do."""
    want = wanted_keys(node.ready)
    have = {str(t["key"]) for t in node.taints if owned(t)}
    if have == want:
        return None
    kept = [dict(t) for t in node.taints if not owned(t)]
    added = [{"key": k, "effect": OWNED_EFFECT} for k in sorted(want)]
    return TaintPlan(
        node=node.name,
        from_version=node.resource_version,
        taints=tuple(kept + added),
        add_field=not node.has_taints,
    )
