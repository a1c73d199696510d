"""A ServiceWorkload's status: replica counts, revisions and three conditions.

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

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pilotfish.api.serviceworkload import AVAILABLE, PROGRESSING, STALLED
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    REASON_PAUSED,
    Progress,
)
from pilotfish.operators.serviceworkload.rolling import Desired, PodState
from pilotfish.workloads import LABEL_WORKLOAD

# Reasons of the Available condition.
REASON_MIN_AVAILABLE: Final = "MinimumReplicasAvailable"
REASON_MIN_UNAVAILABLE: Final = "MinimumReplicasUnavailable"

Obj = dict[str, Any]


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


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> Obj:
    """One condition, keeping its lastTransitionTime when its status did not change."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    out: Obj = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


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
) -> Obj:
    """The status the workload should show, from the pods observed (not the expected ones)."""
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
        prog = ("False", REASON_DEADLINE_EXCEEDED, message)
        stalled = ("True", REASON_DEADLINE_EXCEEDED, message)
    else:
        message = f"rolling out revision {desired.update_revision}: {counts}"
        prog = ("True", REASON_IN_PROGRESS, message)
        stalled = ("False", REASON_IN_PROGRESS, "rollout making progress within its deadline")

    conditions = [
        set_condition(prev_conditions, AVAILABLE, *avail, avail_msg, generation, now_str),
        set_condition(prev_conditions, PROGRESSING, *prog, generation, now_str),
        set_condition(prev_conditions, STALLED, *stalled, generation, now_str),
    ]
    # Conditions other writers may have added are kept as they are.
    mine = {AVAILABLE, PROGRESSING, STALLED}
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
