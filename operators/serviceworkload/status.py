"""A ServiceWorkload's status: replica counts, revisions and its conditions.

- Available: at least `replicas - maxUnavailable` pods are available (Ready for
  minReadySeconds, not draining): the service is within its budget. This is what
  `kubectl wait --for=condition=Available` waits for.
- Progressing: True while a rollout moves within its deadline (RolloutInProgress) and once
  it is complete (RolloutComplete, as Deployments keep Progressing=True with
  NewReplicaSetAvailable); Unknown while paused (RolloutPaused); False once the deadline
  passed without progress (ProgressDeadlineExceeded).
- Stalled: True only when the progress deadline passed (ProgressDeadlineExceeded), else
  False with the same reason as Progressing. It is the kstatus name for "will not get
  there by itself", which generic tools (Flux, kpt, cli-utils) understand.
- ReplicaFailure: present, and True, only while the last pod create of this generation was
  refused (as the Deployment controller's): reason QuotaExceeded when the team quota refused
  it, FailedCreate for any other refusal, message the API server's own. While it is True
  Progressing does not claim progress (False, reason ReplicaFailure) until the deadline
  turns it into a stall; the condition goes away with the first create that succeeds.

- AtMostOne (only for `atMostOne: true`, set by the fencing phase, `atmostone`): True
  while the identity is held (Held, with the holder and its epoch) or not needed (NoReplicas);
  False while a pod on a silent node may still run (WaitingForLeaseExpiry, with the pod, its
  node and when it is released), while a replaced pod stops (Replacing), or when the Lease's
  name is someone else's (LeaseNotOwned).

Counts: `replicas` is every pod that is neither terminated nor being deleted (draining pods
included: they still run); `readyReplicas`, `availableReplicas` and `updatedReplicas` leave
draining pods out, because they are leaving rotation. `currentRevision` is the last revision
fully rolled out (the stable one); `updateRevision` the current template's. Both are the
revision hashes, which are also the pods' `pilotfish.io/revision` label. `selector` is the
label selector string the scale subresource hands to `kubectl scale` and autoscalers.

A condition's lastTransitionTime changes only when its status does (metav1.Condition), so
a status that did not change is byte-identical and not written again.
"""

from __future__ import annotations

import datetime
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish.api.serviceworkload import AVAILABLE, PROGRESSING, STALLED
from pilotfish.conditions import set_condition
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    REASON_PAUSED,
    Progress,
)
from pilotfish.operators.serviceworkload.rolling import Desired, PodState
from pilotfish.timeutil import format_time
from pilotfish.workloads import LABEL_WORKLOAD

# Reasons of the Available condition.
REASON_MIN_AVAILABLE: Final = "MinimumReplicasAvailable"
REASON_MIN_UNAVAILABLE: Final = "MinimumReplicasUnavailable"

REPLICA_FAILURE: Final = "ReplicaFailure"
# Present, and True, while the scheduler has tried and cannot place some of the workload's
# pods: a placement nothing satisfies says so here, with the scheduler's (and the
# extender's) own words, instead of leaving the pods silently Pending.
PODS_UNSCHEDULABLE: Final = "PodsUnschedulable"
REASON_UNSCHEDULABLE: Final = "Unschedulable"
# Reasons of the ReplicaFailure condition (and of Progressing while it is True).
REASON_FAILED_CREATE: Final = "FailedCreate"
REASON_QUOTA_EXCEEDED: Final = "QuotaExceeded"
REASON_REPLICA_FAILURE: Final = "ReplicaFailure"

# The team quota's denials, as the pod webhook words them (pilotfish.quota.describe: "team
# payments, production cpu: 96 of 100 used, pod asks 8"; pilotfish.webhooks.quota.decide:
# "team payments has no production quota: ..."). The API server quotes them inside its own
# text, so they are searched for, not matched whole.
QUOTA_DENIAL: Final = re.compile(
    r"team \S+, \S+ \S+: \S+ of \S+ used, pod asks \S+|team \S+ has no \S+ quota: "
)

Obj = dict[str, Any]


@dataclass(frozen=True)
class ReplicaFailure:
    """The last refused pod create of one generation of a workload."""

    generation: int | None
    reason: str
    message: str


def replica_failure(generation: int | None, message: str) -> ReplicaFailure:
    """What a refused create means for status: a quota refusal or any other FailedCreate."""
    reason = REASON_QUOTA_EXCEEDED if QUOTA_DENIAL.search(message) else REASON_FAILED_CREATE
    return ReplicaFailure(generation, reason, message)


def selector(name: str) -> str:
    return f"{LABEL_WORKLOAD}={name}"


def stable_revision(
    pods: Sequence[PodState], previous: str | None, update: str, complete: bool
) -> str:
    """The last fully rolled-out revision; without a record, the one most pods run."""
    if complete:
        return update
    if previous:
        return previous
    counts = Counter(p.revision for p in pods if p.active)
    return counts.most_common(1)[0][0] if counts else update


def transition_time(conditions: Sequence[Mapping[str, Any]], type_: str, status: str) -> str | None:
    """lastTransitionTime of a condition if it currently has `status`."""
    for c in conditions:
        if c.get("type") == type_ and c.get("status") == status:
            t = c.get("lastTransitionTime")
            return str(t) if t else None
    return None


def compute_status(
    *,
    name: str,
    generation: int | None,
    pods: Sequence[PodState],
    desired: Desired,
    progress: Progress,
    current_revision: str,
    previous: Mapping[str, Any] | None,
    deadline_seconds: int,
    now: float,
    now_str: str,
    failure: ReplicaFailure | None = None,
) -> Obj:
    """The status the workload should show, from the pods observed (never the round's plan)
    and the last create refusal seen (`failure`; None once a create succeeded)."""
    b = desired.budget
    min_ready = b.min_ready_seconds
    present = [p for p in pods if p.counted and not p.terminating]
    active = [p for p in present if p.active]
    ready = sum(1 for p in active if p.ready_since is not None)
    available = sum(1 for p in active if p.available(min_ready, now))
    updated = [p for p in active if p.revision == desired.update_revision]
    updated_available = sum(1 for p in updated if p.available(min_ready, now))
    old = len(active) - len(updated)
    prev_conditions = (previous or {}).get("conditions") or []

    if available >= b.min_available:
        avail = ("True", REASON_MIN_AVAILABLE)
    else:
        avail = ("False", REASON_MIN_UNAVAILABLE)
    avail_msg = (
        f"{available} of {b.replicas} replicas available (at least {b.min_available} needed)"
    )

    counts = (
        f"{len(updated)} of {b.replicas} replicas updated, {updated_available} available, "
        f"{old} of other revisions"
    )
    if progress.state == "complete":
        failure = None  # every replica exists: nothing is left to create
        prog = ("True", REASON_COMPLETE, f"revision {desired.update_revision} rolled out: {counts}")
        stalled = ("False", REASON_COMPLETE, "rollout complete")
    elif progress.state == "paused":
        prog = ("Unknown", REASON_PAUSED, f"rollout paused: {counts}")
        stalled = ("False", REASON_PAUSED, "rollout paused: no progress deadline while paused")
    elif progress.state == "stalled":
        message = (
            f"no progress for {deadline_seconds}s rolling out revision "
            f"{desired.update_revision}: {counts}; {available} available pods keep serving"
        )
        if failure is not None:
            message += f"; pod creates refused: {failure.message}"
        prog = ("False", REASON_DEADLINE_EXCEEDED, message)
        stalled = ("True", REASON_DEADLINE_EXCEEDED, message)
    elif failure is not None:
        prog = (
            "False",
            REASON_REPLICA_FAILURE,
            f"pod creates refused ({failure.reason}), rolling out revision "
            f"{desired.update_revision}: {counts}",
        )
        stalled = (
            "False",
            REASON_REPLICA_FAILURE,
            f"pod creates refused; stalled if nothing moves for {deadline_seconds}s",
        )
    else:
        message = f"rolling out revision {desired.update_revision}: {counts}"
        prog = ("True", REASON_IN_PROGRESS, message)
        stalled = ("False", REASON_IN_PROGRESS, "rollout making progress within its deadline")

    conditions = [
        set_condition(prev_conditions, AVAILABLE, *avail, avail_msg, generation, now_str),
        set_condition(prev_conditions, PROGRESSING, *prog, generation, now_str),
        set_condition(prev_conditions, STALLED, *stalled, generation, now_str),
    ]
    if failure is not None:
        f = ("True", failure.reason, failure.message)
        conditions.append(set_condition(prev_conditions, REPLICA_FAILURE, *f, generation, now_str))
    unplaced = [p for p in active if not p.scheduled and p.unschedulable]
    if unplaced:
        u = (
            "True",
            REASON_UNSCHEDULABLE,
            f"{len(unplaced)} of {len(active)} pods cannot be placed; "
            f"{unplaced[0].name}: {unplaced[0].unschedulable}",
        )
        conditions.append(
            set_condition(prev_conditions, PODS_UNSCHEDULABLE, *u, generation, now_str)
        )
    # Conditions other writers may have added are kept as they are.
    mine = {AVAILABLE, PROGRESSING, STALLED, REPLICA_FAILURE, PODS_UNSCHEDULABLE}
    conditions += [dict(c) for c in prev_conditions if c.get("type") not in mine]
    status: Obj = {
        "observedGeneration": generation,
        "replicas": len(present),
        "readyReplicas": ready,
        "availableReplicas": available,
        "updatedReplicas": len(updated),
        "currentRevision": current_revision,
        "updateRevision": desired.update_revision,
        "selector": selector(name),
        "conditions": conditions,
    }
    return {k: v for k, v in status.items() if v is not None}


def put_condition(
    status: Obj,
    type_: str,
    state: str,
    reason: str,
    message: str,
    generation: int | None,
    at: datetime.datetime,
) -> None:
    """Set one condition a later phase decides (at-most-one) in a computed `status`."""
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    new = set_condition(conditions, type_, state, reason, message, generation, format_time(at))
    status["conditions"] = [c for c in conditions if c.get("type") != type_] + [new]


def drop_condition(status: Obj, type_: str) -> None:
    status["conditions"] = [
        c
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") != type_
    ]
