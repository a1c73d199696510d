"""Scheduling latency by band: how long pods waited from creation to being bound.

kube-scheduler's own latency metrics know nothing of bands, and a production pod waiting
behind batch is what Pilotfish's placement exists to prevent, so the operator times each
binding it sees happen: from the pod's creation to its PodScheduled condition turning True
(both stamped by the API server, so no clock skew enters), by the band the pod was admitted
in. Time held by scheduling gates is included: that wait is the pod's too
(`pilotfish_gates_release_age_seconds` shows it alone). Only bindings seen live count, not
pods already bound when the informer first lists them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pilotfish import metrics, quota
from pilotfish.kube import projections
from pilotfish.kube.informer import Obj
from pilotfish.kube.rest import PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.timeutil import parse_time_or_none

# Pods admitted in no band (outside Pilotfish's namespaces: system pods).
NO_BAND = "none"


def latency(pod: Obj) -> float | None:
    """Seconds from creation to PodScheduled True, or None when either stamp is missing."""
    created = parse_time_or_none((pod.get("metadata") or {}).get("creationTimestamp"))
    conditions: list[dict[str, Any]] = (pod.get("status") or {}).get("conditions") or []
    scheduled = next(
        (c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "True"),
        None,
    )
    bound = parse_time_or_none(scheduled.get("lastTransitionTime")) if scheduled else None
    if created is None or bound is None:
        return None
    return max(0.0, (bound - created).total_seconds())


def newly_bound(obj: Obj, old: Obj | None) -> bool:
    return (
        old is not None
        and not (old.get("spec") or {}).get("nodeName")
        and bool((obj.get("spec") or {}).get("nodeName"))
    )


class SchedulingLatencyObserver:
    def __init__(self, rt: Runtime) -> None:
        self.pods = rt.factory.informer(PODS, projection=projections.pod)
        self.pods.add_handler(self._on_pod)

    def _on_pod(self, kind: str, obj: Obj, old: Obj | None) -> None:
        if kind != "MODIFIED" or not newly_bound(obj, old):
            return
        seconds = latency(obj)
        if seconds is not None:
            band = quota.pod_band(obj, default=NO_BAND)
            metrics.SCHEDULING_LATENCY.labels(band).observe(seconds)

    async def run(self) -> None:
        """Nothing to reconcile: the informer's handler does the work."""
        await asyncio.Event().wait()


__all__ = ["SchedulingLatencyObserver"]
