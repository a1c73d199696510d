"""What the node lifecycle controller reads of a node, parsed once from the informer's dict.

Only the Ready condition and the taints matter to it; the process-wide node projection
(`pilotfish.kube.projections.node`) keeps at least these, and this view is all `decide` sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
OWNED_KEYS: Final = frozenset({TAINT_NOT_READY, TAINT_UNREACHABLE})
OWNED_EFFECT: Final = "NoSchedule"

Taint = Mapping[str, Any]


@dataclass(frozen=True)
class NodeView:
    name: str
    resource_version: str
    ready: str  # "True", "False" or "Unknown" (also when the condition is absent)
    taints: tuple[Taint, ...]
    # Whether spec.taints exists at all: a JSON patch must `add` it, not `replace` it.
    has_taints: bool


def ready_status(node: Mapping[str, Any]) -> str:
    """The node's Ready condition status: "True", "False" or "Unknown" (also when absent)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status", "Unknown"))
    return "Unknown"


def owned(taint: Taint) -> bool:
    """A taint this controller manages; NoExecute taints of the same keys are eviction's."""
    return taint.get("key") in OWNED_KEYS and taint.get("effect") == OWNED_EFFECT


def node_view(node: Mapping[str, Any]) -> NodeView:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    return NodeView(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        ready=ready_status(node),
        taints=tuple(dict(t) for t in spec.get("taints") or []),
        has_taints="taints" in spec,
    )
