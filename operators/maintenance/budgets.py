"""PodDisruptionBudgets as the planner reads them: what each allows now and whom it selects.

Selection is `LabelSelector.matches`, the one implementation webhooks and operators share;
policy/v1 semantics: an empty selector selects every pod of the budget's namespace, a null
one selects none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pilotfish.api.base import LabelSelector


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def key_of(obj: Mapping[str, Any]) -> str:
    meta = meta_of(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


@dataclass(frozen=True)
class BudgetView:
    key: str
    allowed: int  # disruptions allowed now; 0 while the budget's status is stale
    why: str  # why it allows none, for the blocker's message


def budget_view(pdb: Mapping[str, Any]) -> BudgetView:
    """How many evictions the budget allows now. The API server refuses every eviction while
    the disruption controller has not processed the budget's current generation, so neither
    does the planner count on one."""
    key = key_of(pdb)
    status = pdb.get("status") or {}
    generation = meta_of(pdb).get("generation")
    observed = status.get("observedGeneration")
    allowed = status.get("disruptionsAllowed")
    if not isinstance(allowed, int) or (generation is not None and observed != generation):
        return BudgetView(key, 0, f"budget {key} has not been computed yet")
    why = "" if allowed > 0 else f"budget {key} allows no disruption now"
    return BudgetView(key, max(0, allowed), why)


@dataclass(frozen=True)
class Selector:
    namespace: str
    key: str
    selector: LabelSelector | None  # None: selects nothing


def selectors(pdbs: Sequence[Mapping[str, Any]]) -> list[Selector]:
    out = []
    for pdb in pdbs:
        raw = (pdb.get("spec") or {}).get("selector")
        try:
            # policy/v1: an empty selector selects every pod of the namespace, a null one none.
            selector = None if raw is None else LabelSelector.model_validate(raw)
        except ValidationError:
            selector = None  # one the API server would refuse; nothing it selects is known
        out.append(Selector(str(meta_of(pdb).get("namespace", "")), key_of(pdb), selector))
    return out


def budgets_of(pod: Mapping[str, Any], selectors: Sequence[Selector]) -> tuple[str, ...]:
    meta = meta_of(pod)
    namespace = meta.get("namespace", "")
    labels = dict(meta.get("labels") or {})
    return tuple(
        s.key
        for s in selectors
        if s.namespace == namespace and s.selector is not None and s.selector.matches(labels)
    )
