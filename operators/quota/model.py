"""What the quota controller reads: each pod's charge, indexed by namespace, and the teams.

The shared pod informer keeps the process-wide pod projection; this index keeps only the
ledger's view of each pod (`pilotfish.ledger.Charge`: uid, band, requests, state) and each
namespace's `used` as a running sum, so a reconcile costs the team's namespaces, not its
pods: summing a 30,000-pod team on every reconcile took half the operator's CPU in the scale
benchmark (py-spy), starving the batch controller.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterable, Mapping
from typing import Any

from pilotfish import names
from pilotfish.kube.informer import object_key
from pilotfish.ledger import ZERO, Charge, TeamCharges, charge_of
from pilotfish.quota import Resources, add


class _Namespace:
    """One namespace's charges by pod key and by uid, and `used` kept as a running sum:
    Fractions are exact, so adding a pod's requests and taking them away again leaves the
    sum as it was, and a resource summed back to zero is dropped (the status leaves zeros
    out)."""

    def __init__(self) -> None:
        self.by_key: dict[str, Charge] = {}
        self.by_uid: dict[str, Charge] = {}
        self.used: dict[str, Resources] = {}

    def put(self, key: str, after: Charge | None) -> Charge | None:
        before = self.by_key.pop(key, None)
        if before is not None:
            self.by_uid.pop(before.uid, None)
            self._count(before, -1)
        if after is not None:
            self.by_key[key] = after
            self.by_uid[after.uid] = after
            self._count(after, 1)
        return before

    def _count(self, c: Charge, sign: int) -> None:
        if c.state != "counted":
            return
        band = dict(self.used.get(c.band, {}))
        for r, v in c.requests.items():
            total = band.get(r, ZERO) + sign * v
            if total:
                band[r] = total
            else:
                band.pop(r, None)
        if band:
            self.used[c.band] = band
        else:
            self.used.pop(c.band, None)


class ChargeIndex:
    def __init__(self) -> None:
        self._by_namespace: dict[str, _Namespace] = {}

    def apply(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """Account for one pod event; True when the pod's charge changed."""
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        key = object_key(dict(pod))
        charges = self._by_namespace.setdefault(ns, _Namespace())
        after = None if kind == "DELETED" else charge_of(pod)
        before = charges.put(key, after)
        if not charges.by_key:
            del self._by_namespace[ns]
        return before != after

    def team(self, namespaces: Iterable[str]) -> TeamCharges:
        """The charges of the pods in `namespaces`, without walking them: `used` adds up one
        running sum per namespace, uids are looked up namespace by namespace."""
        found = [
            self._by_namespace[ns] for ns in sorted(set(namespaces)) if ns in self._by_namespace
        ]
        used: dict[str, Resources] = {}
        for n in found:
            for band, resources in n.used.items():
                used[band] = add(used.get(band, {}), resources)
        return TeamCharges(used, ChainMap(*(n.by_uid for n in found)))


def team_of_namespace(namespace: Mapping[str, Any] | None) -> str | None:
    """The team a namespace's pods are charged to: its `pilotfish.io/team` label (only the
    platform may label a namespace; never the pod's own label)."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    team = labels.get(names.LABEL_TEAM)
    return team if isinstance(team, str) and team else None


def team_of_quota(tq: Mapping[str, Any]) -> str:
    return str((tq.get("spec") or {}).get("team") or "")
