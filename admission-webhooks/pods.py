"""Admission reviews of Pods: gates at creation (mutate), then the checks (validate).

The mutating review is where `GatePolicy` gates get added: `spec.schedulingGates` can only
be set at creation, so this is the one chance. The validating review runs after every
mutation, sees the final gates, and denies what breaks a rule in `podchecks` (band and
team quota checks join it there). Both are pure functions of the AdmissionRequest, a
GatePolicy snapshot and, for the record's deadlines, the time; the server supplies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import jsonpatch

from pilotfish import quota
from pilotfish.gates import GateRecord
from pilotfish.names import SA_OPERATOR
from pilotfish.timeutil import format_time
from pilotfish.webhooks import bands, gating
from pilotfish.webhooks import quota as quota_rules
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.patches import Op
from pilotfish.webhooks.podchecks import PodAdmission, violations
from pilotfish.webhooks.teamview import TeamSnapshot

# The record of the quota gate names this instead of a GatePolicy: the team quota rule put it.
QUOTA_POLICY: Final = "(team quota)"
QUOTA_GATE_TIMEOUT_SECONDS: Final = 24 * 3600

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


@dataclass(frozen=True)
class Reserve:
    """Admit once this reservation is written (the server's one write, conditional)."""

    pod: Mapping[str, Any]
    namespace_labels: Mapping[str, str]
    band: str
    admit: quota_rules.Admit


def _band(pod: Mapping[str, Any], team: TeamSnapshot, namespace: str) -> bands.BandChoice | None:
    return bands.resolve(pod, team.labels_of(namespace))


def quota_gate_record(now: datetime, generation: int) -> GateRecord:
    """The terms of the quota gate: released when the team's quota has room; a person looks
    at a pod that waited a day rather than have it fail silently."""
    return GateRecord(
        policy=QUOTA_POLICY,
        generation=generation,
        condition={"type": "Quota"},
        timeout_seconds=QUOTA_GATE_TIMEOUT_SECONDS,
        deadline=format_time(now + timedelta(seconds=QUOTA_GATE_TIMEOUT_SECONDS)),
        on_expiry="Review",
        owner=SA_OPERATOR,
    )


def mutate(
    request: Mapping[str, Any],
    view: GateView,
    now: datetime,
    team: TeamSnapshot | None = None,
    scheduler_name: str | None = None,
) -> Decision:
    """Band (priority class, scheduler), the quota gate for batch over quota, then every
    gate of every GatePolicy of the namespace that selects the pod.

    Each step's JSON patch is computed on the pod as the previous steps left it, because
    the API server applies the ops in order (two steps both creating `metadata.labels` on a
    pod without labels would otherwise erase each other's).
    """
    found = _pod_create(request)
    if found is None:
        return Decision.mutate(())
    namespace, pod = found
    team = team or TeamSnapshot()
    ops: list[Op] = []
    choice = _band(pod, team, namespace)
    if choice is not None and bands.problem(pod, choice) is None:
        ops += bands.patch(pod, choice, scheduler_name)
        pod = jsonpatch.apply_patch(pod, ops)
    broken = view.broken_in(namespace)
    if broken:
        first = broken[0]
        return Decision.deny(
            f"GatePolicy {first.name} in namespace {namespace} cannot be read ({first.error}), "
            "so the gates of this namespace's pods cannot be decided; fix or delete the policy"
        )
    labels = (pod.get("metadata") or {}).get("labels") or {}
    policies = view.selecting(namespace, labels)
    extra: dict[str, GateRecord] = {}
    warnings: list[str] = []
    if choice is not None and choice.band == "batch":
        outcome = quota_rules.decide(pod, team.labels_of(namespace), "batch", team.quotas, now)
        if isinstance(outcome, quota_rules.Gate):
            tq = quota_rules.quota_for(
                quota.pod_team(pod, team.labels_of(namespace)) or "", team.quotas
            )
            generation = int(((tq or {}).get("metadata") or {}).get("generation") or 0)
            extra[quota_rules.QUOTA_GATE] = quota_gate_record(now, generation)
            warnings.append(f"waiting for quota: {outcome.message}")
    if (policies or extra) and (pod.get("spec") or {}).get("nodeName"):
        # The API server refuses gates on a pod that names its node: it is bound already.
        return Decision.mutate(
            [*ops, *gating.strip_patch(pod)],
            warnings=[
                "not gated: the pod sets spec.nodeName, so the gates of "
                + (f"GatePolicy {policies[0].name}" if policies else "the team quota")
                + " cannot hold it back"
            ],
        )
    if not policies and not extra:
        return Decision.mutate([*ops, *gating.strip_patch(pod)])
    plan = gating.plan(pod, policies, now, extra=extra)
    return Decision.mutate(
        [*ops, *gating.gate_patch(pod, plan, now)], warnings=[*warnings, *plan.warnings]
    )


def validate(
    request: Mapping[str, Any], view: GateView, team: TeamSnapshot | None = None
) -> Decision:
    """Deny a pod that breaks any pod check or its band rule, naming every gate and rule."""
    found = _pod_create(request)
    if found is None:
        return Decision.allow()
    namespace, pod = found
    broken = violations(PodAdmission(namespace, pod, view))
    choice = _band(pod, team or TeamSnapshot(), namespace)
    problem = bands.problem(pod, choice) if choice is not None else None
    if problem:
        broken.append(problem)
    return Decision.deny("; ".join(broken)) if broken else Decision.allow()


def quota_verdict(
    request: Mapping[str, Any], team: TeamSnapshot, now: datetime
) -> Decision | Reserve:
    """For a pod that passed `validate`: deny beyond its team's quota (naming the amounts),
    else admit once its reservation is written (`Reserve`); a dry run reserves nothing."""
    found = _pod_create(request)
    if found is None:
        return Decision.allow()
    namespace, pod = found
    choice = _band(pod, team, namespace)
    if choice is None:
        return Decision.allow()
    ns_labels = team.labels_of(namespace)
    outcome = quota_rules.decide(pod, ns_labels, choice.band, team.quotas, now)
    if not isinstance(outcome, quota_rules.Admit):
        return Decision.deny(outcome.message)
    if outcome.reservation is None or request.get("dryRun"):
        return Decision.allow()
    return Reserve(pod, ns_labels, choice.band, outcome)
