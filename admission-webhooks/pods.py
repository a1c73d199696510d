"""Admission reviews of Pods: gates at creation (mutate), then the checks (validate).

The mutating review is where `GatePolicy` gates get added: `spec.schedulingGates` can only
be set at creation, so this is the one chance. The validating review runs after every
mutation, sees the final gates, and denies what breaks a rule in `podchecks` (band and
team quota checks join it there). Both are pure functions of the AdmissionRequest, a
GatePolicy snapshot and, for the record's deadlines, the time; the server supplies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from pilotfish.webhooks import gating
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.podchecks import PodAdmission, violations

STARTING: Final = (
    "pilotfish webhooks are starting: their view of GatePolicies has not synced with the "
    "API server yet, so the pod's gates cannot be decided; retry in a few seconds"
)


def starting() -> Decision:
    """Refuse while the view is not synced: admitting a pod without the gates it should have
    cannot be undone (gates are never added after creation)."""
    return Decision.deny(STARTING, code=503, reason="ServiceUnavailable")


def _pod_create(request: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """(namespace, pod) of a pod CREATE; None for anything else, which passes untouched."""
    kind = (request.get("kind") or {}).get("kind", "Pod")
    if request.get("operation") != "CREATE" or kind != "Pod":
        return None
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        return None
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
    return str(namespace), pod


def mutate(request: Mapping[str, Any], view: GateView, now: datetime) -> Decision:
    """Add every gate of every GatePolicy of the namespace that selects the pod."""
    found = _pod_create(request)
    if found is None:
        return Decision.mutate(())
    namespace, pod = found
    broken = view.broken_in(namespace)
    if broken:
        first = broken[0]
        return Decision.deny(
            f"GatePolicy {first.name} in namespace {namespace} cannot be read ({first.error}), "
            "so the gates of this namespace's pods cannot be decided; fix or delete the policy"
        )
    labels = (pod.get("metadata") or {}).get("labels") or {}
    policies = view.selecting(namespace, labels)
    if not policies:
        return Decision.mutate(gating.strip_patch(pod))
    if (pod.get("spec") or {}).get("nodeName"):
        # The API server refuses gates on a pod that names its node: it is bound already.
        return Decision.mutate(
            gating.strip_patch(pod),
            warnings=[
                f"not gated: the pod sets spec.nodeName, so the gates of GatePolicy "
                f"{policies[0].name} cannot hold it back"
            ],
        )
    plan = gating.plan(pod, policies, now)
    return Decision.mutate(gating.gate_patch(pod, plan, now), warnings=plan.warnings)


def validate(request: Mapping[str, Any], view: GateView) -> Decision:
    """Deny a pod that breaks any pod check, naming every gate and rule broken."""
    found = _pod_create(request)
    if found is None:
        return Decision.allow()
    namespace, pod = found
    broken = violations(PodAdmission(namespace, pod, view))
    return Decision.deny("; ".join(broken)) if broken else Decision.allow()
