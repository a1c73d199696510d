"""What the quota controller reads: each pod's charge, indexed by namespace, and the teams.

The shared pod informer keeps the process-wide pod projection; this index keeps only the
ledger's view of each pod (`pilotfish.ledger.Charge`: uid, band, requests, state), so a
reconcile reads the team's namespaces instead of walking every pod of the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pilotfish import names
from pilotfish.kube.informer import object_key
from pilotfish.ledger import Charge, charge_of


class ChargeIndex:
    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, Charge]] = {}

    def apply(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """Account for one pod event; True when the pod's charge changed."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        key = object_key(dict(pod))
        charges = self._by_namespace.setdefault(ns, {})
        before = charges.get(key)
        if kind == "DELETED":
            charges.pop(key, None)
            if not charges:
                del self._by_namespace[ns]
            return before is not None
        after = charge_of(pod)
        charges[key] = after
        return before != after

    def charges(self, namespaces: Iterable[str]) -> Iterator[Charge]:
        for ns in namespaces:
            yield from self._by_namespace.get(ns, {}).values()


def team_of_namespace(namespace: Mapping[str, Any] | None) -> str | None:
    """The team a namespace's pods are charged to: its `pilotfish.io/team` label (only the
    platform may label a namespace; never the pod's own label)."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    team = labels.get(names.LABEL_TEAM)
    return team if isinstance(team, str) and team else None


def team_of_quota(tq: Mapping[str, Any]) -> str:
    return str((tq.get("spec") or {}).get("team") or "")
