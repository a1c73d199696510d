"""Decide: the taint list a node should carry. Pure.

Ready False → `not-ready:NoSchedule`, Ready Unknown or absent → `unreachable:NoSchedule`,
Ready True → neither. With `lost` given (mode pilotfish), `unreachable:NoExecute` (with
timeAdded) is there exactly while the node's lease is silent past the unreachable timeout;
with `lost` None (upstream mode, or a node whose lease was never seen) NoExecute taints
stay as they are. Every other taint (other owners') is kept as it is, in its order; the
owned ones go last, sorted, so the same node always yields the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pilotfish.operators.nodelifecycle.model import (
    EVICT_EFFECT,
    OWNED_EFFECT,
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    NodeView,
    evicting,
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
        return [f"{t['key']}:{t['effect']}" for t in self.taints if owned(t) or evicting(t)]


def wanted_keys(ready: str) -> set[str]:
    if ready == "True":
        return set()
    return {TAINT_NOT_READY if ready == "False" else TAINT_UNREACHABLE}


def decide(node: NodeView, lost: bool | None = None, now: str = "") -> TaintPlan | None:
    """The write that makes the node's taints follow its Ready status (and, with `lost`,
    its lease silence); None when they do. `now` stamps a NoExecute taint's timeAdded."""
    want = wanted_keys(node.ready)
    have = {str(t["key"]) for t in node.taints if owned(t)}
    has_evict = any(evicting(t) for t in node.taints)
    manage_evict = lost is not None and lost != has_evict
    if have == want and not manage_evict:
        return None
    kept = [dict(t) for t in node.taints if not owned(t) and not (manage_evict and evicting(t))]
    added: list[dict[str, Any]] = [{"key": k, "effect": OWNED_EFFECT} for k in sorted(want)]
    if manage_evict and lost:
        added.append({"key": TAINT_UNREACHABLE, "effect": EVICT_EFFECT, "timeAdded": now})
    return TaintPlan(
        node=node.name,
        from_version=node.resource_version,
        taints=tuple(kept + added),
        add_field=not node.has_taints,
    )
