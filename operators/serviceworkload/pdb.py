"""One PodDisruptionBudget per ServiceWorkload, so node drains respect the service's budget.

Named like the workload, selecting its pods by `pilotfish.io/workload`, owned by it (garbage-
collected with it). `maxUnavailable` is the strategy's, resolved against the replica count
the same way the rollout resolves it (a percentage rounds down), so that maintenance and a
rollout agree on how many pods may be down; it is re-derived on every sync, so scaling keeps
it right.

When the strategy allows 0 unavailable, the budget is 1 instead. A budget of 0 refuses every
eviction, so a maintenance drain would wait forever on every node running one of the pods;
with 1, drains proceed one pod at a time and the workload replaces each evicted pod at once
(the surge room exists precisely so replacements can start before old pods go). A rollout is
not bound by the PDB (it deletes, it does not evict) and keeps to 0 itself.

`unhealthyPodEvictionPolicy: AlwaysAllow`: a pod that is not Ready serves nothing, so the
budget never blocks evicting it; without this, one broken pod could block a node drain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pilotfish.kube.rest import Resource
from pilotfish.operators.serviceworkload.revisions import controlled_by
from pilotfish.operators.serviceworkload.rolling import Budget
from pilotfish.podtemplate import owner_reference
from pilotfish.workloads import LABEL_WORKLOAD

PDBS: Final = Resource("policy", "v1", "poddisruptionbudgets")

Obj = dict[str, Any]


def pdb_max_unavailable(budget: Budget) -> int:
    return max(1, budget.max_unavailable)


def desired_spec(name: str, budget: Budget) -> Obj:
    return {
        "selector": {"matchLabels": {LABEL_WORKLOAD: name}},
        "maxUnavailable": pdb_max_unavailable(budget),
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def pdb_body(sw: Mapping[str, Any], budget: Budget) -> Obj:
    meta = sw["metadata"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {LABEL_WORKLOAD: meta["name"]},
            "ownerReferences": [owner_reference(sw)],
        },
        "spec": desired_spec(meta["name"], budget),
    }


def pdb_patch(existing: Mapping[str, Any], spec: Mapping[str, Any]) -> list[Obj] | None:
    """JSON patch bringing our PDB to `spec`, only on the version read; None if it is."""
    current = existing.get("spec") or {}
    if all(current.get(k) == v for k, v in spec.items()):
        return None
    return [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": existing["metadata"]["resourceVersion"],
        },
        {"op": "replace", "path": "/spec", "value": {**current, **spec}},
    ]


def is_ours(existing: Mapping[str, Any], uid: str) -> bool:
    return controlled_by(existing, uid)
