"""Admission reviews of Pods: team, band and gates at creation (mutate), then the checks
(validate) and the team quota (quota_verdict).

The mutating review is where a pod gets its team (from its namespace, `tenancy`), its band
(`bands`) and its `GatePolicy` gates: `spec.schedulingGates` can only be set at creation, so
this is the one chance. The validating review runs after every mutation, sees the final
pod, and denies what breaks a rule in `podchecks`, `tenancy` or `bands`. All are pure
functions of the AdmissionRequest, a GatePolicy snapshot, a team snapshot and, for the
record's deadlines, the time; the server supplies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from pilotfish import gates, quota
from pilotfish.gates import GateRecord
from pilotfish.names import BANDS, SA_OPERATOR
from pilotfish.timeutil import format_time
from pilotfish.webhooks import bands, gating, quantities, reclaim, tenancy, tolerations
from pilotfish.webhooks import quota as quota_rules
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.patches import Steps
from pilotfish.webhooks.podchecks import PodAdmission, violations
from pilotfish.webhooks.teamview import TeamSnapshot
from pilotfish.webhooks.tenancy import ForeignSchedulers, TenantPolicy

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


def gang_gate_record(workload: str, now: datetime) -> GateRecord:
    """The terms of the batch gang gate of a task of BatchWorkload `workload`: released with
    the rest of its gang, whose size the gate controller reads from the workload; waiting
    long is flagged for a person, never failed (`gates.GANG_TIMEOUT_SECONDS`)."""
    return GateRecord(
        policy=gates.GANG_POLICY,
        generation=0,
        condition=gates.gang_condition(workload),
        timeout_seconds=gates.GANG_TIMEOUT_SECONDS,
        deadline=format_time(now + timedelta(seconds=gates.GANG_TIMEOUT_SECONDS)),
        on_expiry="Review",
        owner=SA_OPERATOR,
    )


def tenant_problems(
    pod: Mapping[str, Any],
    namespace: str,
    team: TeamSnapshot | None,
    policy: TenantPolicy,
    *,
    mutating: bool,
) -> list[str]:
    """Every tenancy and band rule the pod breaks (none outside tenant namespaces).

    Without a team view (tools and tests without a cluster) teams and bands are not judged;
    the node, scheduler and priority class rules need no view and always are.
    """
    if not tenancy.is_tenant(namespace):
        return []
    out = tenancy.spec_problems(pod, namespace, policy, mutating=mutating)
    foreign_class = bands.class_problem(pod, namespace)
    if team is not None:
        labels = team.labels_of(namespace)
        out.append(tenancy.team_problem(pod, namespace, labels) or "")
        if foreign_class is None:  # else that already says what is wrong with the band
            out.append(bands.problem(pod, bands.resolve(pod, namespace, labels)) or "")
    return [p for p in [*out, foreign_class] if p]


def _tenant_patch(
    steps: Steps, namespace: str, team: TeamSnapshot | None, policy: TenantPolicy
) -> bands.BandChoice | None:
    """Add the team label, the band (label and class) and the scheduler to `steps`, for a pod
    that broke no rule; the band, None when bands are not judged."""
    if not tenancy.is_tenant(namespace):
        return None
    choice = None
    if team is not None:
        labels = team.labels_of(namespace)
        steps.add(tenancy.team_patch(steps.obj, labels))
        choice = bands.resolve(steps.obj, namespace, labels)
        steps.add(bands.patch(steps.obj, choice))
    steps.add(tenancy.scheduler_patch(steps.obj, policy))
    return choice


def reclaim_plan(
    pod: Mapping[str, Any], namespace: str, team: TeamSnapshot | None, default: bool
) -> tuple[list[str], tuple[str, reclaim.Setting] | None]:
    """What breaks the reclaim rules, and (band, setting) to patch by: tenant pods judged
    with a team view only, like bands."""
    if team is None or not tenancy.is_tenant(namespace):
        return [], None
    labels = team.labels_of(namespace)
    found = reclaim.setting(namespace, labels, default)
    if isinstance(found, str):
        return [found], None
    band = bands.resolve(pod, namespace, labels).band
    if band not in BANDS:
        return [], None  # the band rules refuse it already
    return reclaim.problems(pod, namespace, band, found), (band, found)


def mutate(
    request: Mapping[str, Any],
    view: GateView,
    now: datetime,
    team: TeamSnapshot | None = None,
    scheduler_name: str | None = None,
    *,
    foreign_schedulers: ForeignSchedulers = "refuse",
    eviction_wait: float = tolerations.DEFAULT_EVICTION_WAIT,
    reclaim_default: bool = False,
) -> Decision:
    """Team and band (label, priority class, scheduler), the lost-node tolerations
    (`tolerations`, from `eviction_wait`), reclaim (`reclaim`: batch cpu/memory moved onto
    reclaimed capacity where it is on, `reclaim_default` where no label says), the quota
    gate for batch over quota, then every gate of every GatePolicy of the namespace that
    selects the pod.

    A pod breaking a tenancy or band rule is refused here already: the API server would
    otherwise reject the patched pod with a less helpful message (gates on a pod naming its
    node) before the validating review could say why. Each step's JSON patch is computed on
    the pod as the previous steps left it, because the API server applies the ops in order
    (two steps both creating `metadata.labels` on a pod without labels would otherwise erase
    each other's).
    """
    found = _pod_create(request)
    if found is None:
        return Decision.mutate(())
    namespace, pod = found
    policy = TenantPolicy(scheduler_name, foreign_schedulers)
    refused = tenant_problems(pod, namespace, team, policy, mutating=True)
    refused += quantities.pod_problems(pod)
    gang = gates.batch_gang_problem(pod)
    if gang:
        refused.append(gang)
    reclaim_refused, reclaim_by = reclaim_plan(pod, namespace, team, reclaim_default)
    refused += reclaim_refused
    if refused:
        return Decision.deny("; ".join(refused))
    steps = Steps(pod)
    choice = _tenant_patch(steps, namespace, team, policy)
    steps.add(tolerations.patch(steps.obj, namespace, eviction_wait))
    if reclaim_by is not None:
        # Before the quota decision below: it charges the pod as translated (the same).
        steps.add(reclaim.patch(steps.obj, *reclaim_by))
    ops, pod = steps.ops, steps.obj
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
    owner = gates.batch_owner(pod)
    if gates.GANG_GATE in gates.scheduling_gates(pod) and owner is not None:
        # batch_gang_problem accepted it above: a BatchWorkload's gang task
        extra[gates.GANG_GATE] = gang_gate_record(owner[0], now)
    if team is not None and choice is not None and choice.band == "batch":
        ns_labels = team.labels_of(namespace)
        outcome = quota_rules.decide(pod, ns_labels, "batch", team.quotas, now)
        if isinstance(outcome, quota_rules.Gate):
            tq = quota_rules.quota_for(quota.pod_team(pod, ns_labels) or "", team.quotas)
            generation = int(((tq or {}).get("metadata") or {}).get("generation") or 0)
            extra[quota_rules.QUOTA_GATE] = quota_gate_record(now, generation)
            warnings.append(f"waiting for quota: {outcome.message}")
    if (policies or extra) and (pod.get("spec") or {}).get("nodeName"):
        # Only outside tenant namespaces (tenants may not name a node): the API server
        # refuses gates on a pod that names its node, it is bound already.
        return Decision.mutate(
            [*ops, *gating.strip_patch(pod)],
            warnings=[
                "not gated: the pod sets spec.nodeName, so the gates of "
                + (
                    f"GatePolicy {policies[0].name}"
                    if policies
                    else "the team quota"
                    if quota_rules.QUOTA_GATE in extra
                    else "the batch gang"
                )
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
    request: Mapping[str, Any],
    view: GateView,
    team: TeamSnapshot | None = None,
    scheduler_name: str | None = None,
) -> Decision:
    """Deny a pod that breaks any pod check, tenancy or band rule, naming every one.

    It sees the pod after every mutating webhook, so a rule a later mutation broke (another
    webhook rewriting the scheduler, say) is caught here.
    """
    found = _pod_create(request)
    if found is None:
        return Decision.allow()
    namespace, pod = found
    broken = violations(PodAdmission(namespace, pod, view))
    policy = TenantPolicy(scheduler_name)
    broken += tenant_problems(pod, namespace, team, policy, mutating=False)
    return Decision.deny("; ".join(broken)) if broken else Decision.allow()


def quota_verdict(
    request: Mapping[str, Any], team: TeamSnapshot | None, now: datetime
) -> Decision | Reserve:
    """For a pod that passed `validate`: deny beyond its team's quota (naming the amounts),
    else admit once its reservation is written (`Reserve`); a dry run reserves nothing."""
    found = _pod_create(request)
    if found is None or team is None:
        return Decision.allow()
    namespace, pod = found
    if not tenancy.is_tenant(namespace):
        return Decision.allow()
    ns_labels = team.labels_of(namespace)
    choice = bands.resolve(pod, namespace, ns_labels)
    outcome = quota_rules.decide(pod, ns_labels, choice.band, team.quotas, now)
    if not isinstance(outcome, quota_rules.Admit):
        return Decision.deny(outcome.message)
    if outcome.reservation is None or request.get("dryRun"):
        return Decision.allow()
    return Reserve(pod, ns_labels, choice.band, outcome)
