"""The rollout planner: from the pods a ServiceWorkload has to the actions that move it on.

One pure function, `plan`, decides scaling and rolling out together, because the budget is
one invariant over both: at every moment

- never more than `replicas + maxSurge` pods that are not terminated (Failed/Succeeded),
  counting pods that are draining or being deleted until they are gone, and counting pods
  the controller asked for but has not seen yet;
- never a drain or delete that takes the number of *available* pods (Ready for
  `minReadySeconds`, not draining, not being deleted) below `replicas - maxUnavailable`.

The rules are Kubernetes' Deployment controller's (`pkg/controller/deployment/rolling.go`),
restated for pods instead of ReplicaSets:

- create pods of the update revision while fewer than `replicas` exist, never beyond the
  surge room `replicas + maxSurge - counted`;
- take old pods down in two passes: unhealthy ones (not available; removing them costs no
  availability) up to `all - minAvailable - newUnavailable`, so pods that may still become
  available are not thrown away while the new ones are not there yet; then available ones,
  only as many as `available - minAvailable`;
- a template that never becomes ready therefore stops after its surge: with maxUnavailable 0
  no available old pod can go, so the rollout holds at `replicas + maxSurge` with every old
  pod serving.

Taking a pod down is a drain (annotation, `pilotfish.workloads`) and a delete once drained.
A pod no Service routes to (the workload has no `service`, or the pod has no IP and so is in
no EndpointSlice) has nothing to drain and is deleted at once: waiting for the endpoints
controller to confirm a slice write that never involved the pod would only slow the rollout.

Paused (`strategy.paused`): the rollout stands where it is, the replica count does not.
Like a Deployment, a paused workload keeps scaling and replaces pods that fail or vanish; the
new pods run the *stable* revision (the last one fully rolled out), not the update revision,
because pausing is how people stop a version from spreading, and a replacement must not
spread it. A scale-down while paused likewise takes pods of other revisions first.

Mid-rollout (old pods still serving), at most `maxSurge + maxUnavailable` pods of the update
revision may be unproven (not available) at once, and pods lost meanwhile (failed, evicted,
deleted by someone) are refilled with the stable revision. A Deployment gets the same
behaviour from its old ReplicaSet keeping its own count; without it, old pods dying during a
stalled rollout would be replaced by pods that never become ready, and the service would
shrink (even with every old pod gone, the update revision has not proven itself until the
rollout completes). Refills go up to `replicas - maxUnavailable` (the availability floor),
not beyond: pods above the floor that are not available yet are what step 4b takes down.
A new workload (nothing stable yet), or one whose rollout completed, fills up at once.

Failed (and Succeeded) pods no longer run: they do not count, are replaced like missing pods
and deleted without a drain (nothing serves from them). Pods evicted from a lost node (the
node lifecycle controller's DisruptionTarget, or upstream's taint manager's) are Terminating
until the node returns, which may be never: they do not count either, so their replacements
start at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from pilotfish.workloads import DRAIN_TIMEOUT_SECONDS, PROPAGATION_SECONDS

# Why a pod is deleted (event reasons).
DELETE_FAILED: Final = "PodFailed"  # phase Failed/Succeeded: replaced, nothing to drain
DELETE_DRAINED: Final = "PodDrained"  # out of rotation for PROPAGATION_SECONDS
DELETE_DRAIN_TIMEOUT: Final = "DrainTimedOut"  # nobody confirmed within DRAIN_TIMEOUT_SECONDS
DELETE_NOT_SERVING: Final = "PodNotServing"  # in no EndpointSlice: deleted without a drain


@dataclass(frozen=True)
class PodState:
    """What the planner needs to know about one pod; times are seconds since the epoch."""

    name: str
    revision: str
    created_at: float
    scheduled: bool = False
    running: bool = False
    ready_since: float | None = None  # when Ready last became True; None while not Ready
    terminated: bool = False  # phase Failed or Succeeded: its containers are gone
    terminating: bool = False  # deletionTimestamp set: counted until it is gone
    drain_requested_at: float | None = None
    drained_at: float | None = None
    has_address: bool = False  # has a pod IP, so it may be in an EndpointSlice
    # The scheduler's reason while it cannot place the pod (PodScheduled False, Unschedulable).
    unschedulable: str | None = None
    # Evicted from a lost node (terminating, DisruptionTarget for a lost node): it stays
    # Terminating until the node returns, and no longer serves, so it is not counted.
    lost: bool = False

    @property
    def counted(self) -> bool:
        """Counts toward the surge bound: exists, has not terminated and was not evicted
        from a lost node (its replacement starts at once, as a ReplicaSet's would)."""
        return not (self.terminated or self.lost)

    @property
    def active(self) -> bool:
        """Counted and staying: neither draining nor being deleted."""
        return not (self.terminated or self.terminating or self.drain_requested_at is not None)

    def available_at(self, min_ready_seconds: float) -> float | None:
        """When this pod is (or will be) available, if it stays Ready; None if never now."""
        if not self.active or self.ready_since is None:
            return None
        return self.ready_since + min_ready_seconds

    def available(self, min_ready_seconds: float, now: float) -> bool:
        at = self.available_at(min_ready_seconds)
        return at is not None and at <= now


@dataclass(frozen=True)
class Budget:
    """A strategy resolved against a replica count."""

    replicas: int
    max_surge: int
    max_unavailable: int
    min_ready_seconds: float = 0.0

    @property
    def max_pods(self) -> int:
        return self.replicas + self.max_surge

    @property
    def min_available(self) -> int:
        return max(0, self.replicas - self.max_unavailable)


def scaled(value: int | str, total: int, *, round_up: bool) -> int:
    """An int-or-percent against `total`, as Kubernetes' GetScaledValueFromIntOrPercent."""
    if isinstance(value, int):
        return value
    percent = int(value.rstrip("%"))
    return math.ceil(total * percent / 100) if round_up else (total * percent) // 100


def resolve_budget(
    replicas: int, max_surge: int | str, max_unavailable: int | str, min_ready_seconds: float = 0
) -> Budget:
    """Surge rounds up and unavailability down, like Deployments; if both come out 0 (only
    possible with percentages, the CRD refuses two literal zeros) unavailability becomes 1,
    as Deployments do, or no rollout could ever make progress."""
    surge = scaled(max_surge, replicas, round_up=True)
    unavailable = scaled(max_unavailable, replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return Budget(replicas, surge, unavailable, float(min_ready_seconds))


@dataclass(frozen=True)
class Desired:
    """What the workload asks for, as the planner needs it."""

    budget: Budget
    update_revision: str
    stable_revision: str | None = None  # last fully rolled-out revision (used while paused)
    paused: bool = False
    drain: bool = True  # pods are behind a Service: they leave rotation before they stop


@dataclass(frozen=True)
class Create:
    revision: str
    count: int


@dataclass(frozen=True)
class Drain:
    pod: str


@dataclass(frozen=True)
class Delete:
    pod: str
    reason: str


Action = Create | Drain | Delete


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    # The earliest moment the plan would change with no event: a pod becoming available
    # (Ready for minReadySeconds), a drained pod's propagation time, a drain's timeout.
    wake_at: float | None = None

    @property
    def creates(self) -> int:
        return sum(a.count for a in self.actions if isinstance(a, Create))

    @property
    def drains(self) -> tuple[str, ...]:
        return tuple(a.pod for a in self.actions if isinstance(a, Drain))

    @property
    def deletes(self) -> tuple[str, ...]:
        return tuple(a.pod for a in self.actions if isinstance(a, Delete))


def drain_due(pod: PodState, drain: bool) -> float | None:
    """When a draining pod may be deleted; None when it is not draining.

    The contract of `pilotfish.workloads`: PROPAGATION_SECONDS after the endpoints controller
    recorded the slice write, or DRAIN_TIMEOUT_SECONDS after the request without an answer.
    A pod no Service routes to is due at once (see the module docstring).
    """
    if pod.drain_requested_at is None:
        return None
    if not drain or not pod.has_address:
        return pod.drain_requested_at
    timeout = pod.drain_requested_at + DRAIN_TIMEOUT_SECONDS
    if pod.drained_at is None:
        return timeout
    return min(pod.drained_at + PROPAGATION_SECONDS, timeout)


def victim_order(min_ready_seconds: float, now: float) -> Callable[[PodState], tuple[object, ...]]:
    """Which pods to take down first: not available before available (so the availability
    budget is spent last), then ReplicaSet's ranking: unscheduled before scheduled, pending
    before running, not ready before ready, the most recently ready first, the newest first."""

    def key(p: PodState) -> tuple[object, ...]:
        return (
            p.available(min_ready_seconds, now),
            p.scheduled,
            p.running,
            p.ready_since is not None,
            -(p.ready_since or 0.0),
            -p.created_at,
            p.name,
        )

    return key


def plan(pods: Sequence[PodState], desired: Desired, now: float) -> Plan:
    """The next actions for one workload. Pure: the same inputs give the same plan."""
    b = desired.budget
    min_ready = b.min_ready_seconds
    actions: list[Action] = []
    wakes: list[float] = []

    # 1. Terminated pods: replaced below (they do not count), deleted now without a drain.
    actions.extend(
        Delete(p.name, DELETE_FAILED) for p in pods if p.terminated and not p.terminating
    )

    # 2. Draining pods: deleted once the drain is done, else woken up when it will be.
    for p in pods:
        if p.terminated or p.terminating:
            continue
        due = drain_due(p, desired.drain)
        if due is None:
            continue
        if due <= now:
            drained = p.drained_at is not None and p.drained_at + PROPAGATION_SECONDS <= now
            reason = (
                DELETE_NOT_SERVING
                if not desired.drain or not p.has_address
                else DELETE_DRAINED
                if drained
                else DELETE_DRAIN_TIMEOUT
            )
            actions.append(Delete(p.name, reason))
        else:
            wakes.append(due)

    counted = sum(1 for p in pods if p.counted)
    active = [p for p in pods if p.active]
    for p in active:
        at = p.available_at(min_ready)
        if at is not None and at > now:
            wakes.append(at)
    available = sum(1 for p in active if p.available(min_ready, now))
    new = [p for p in active if p.revision == desired.update_revision]
    old = [p for p in active if p.revision != desired.update_revision]
    rolling = not desired.paused

    # 3. Creates, never beyond the surge room.
    room = b.max_pods - counted
    stable = desired.stable_revision or desired.update_revision
    creates = refills = 0
    if rolling:
        creates = max(0, min(b.replicas - len(new), room))
        if stable != desired.update_revision:
            # Mid-rollout (the stable revision is not the update one yet): no more unproven
            # new pods than the budget's own slack; pods lost meanwhile (failed, evicted) are
            # refilled with the stable revision, as an old ReplicaSet would refill itself, so
            # a stalled rollout keeps its old pods serving.
            unproven = sum(1 for p in new if not p.available(min_ready, now))
            creates = min(creates, max(0, b.max_surge + b.max_unavailable - unproven))
            new_available = len(new) - unproven
            # Up to the availability floor only: refilling beyond it would hand 4b pods it
            # may take down again (unhealthy old pods), a create/delete ping-pong.
            refills = max(0, min(b.min_available - new_available - len(old), room - creates))
        if creates:
            actions.append(Create(desired.update_revision, creates))
        if refills:
            actions.append(Create(stable, refills))
    else:
        refills = max(0, min(b.replicas - len(active), room))
        if refills:
            actions.append(Create(stable, refills))

    # 4. Pods to take down; `spare` is how many *available* pods may still go.
    spare = available - b.min_available
    chosen: list[PodState] = []
    order = victim_order(min_ready, now)

    def take(p: PodState) -> bool:
        nonlocal spare
        if p.available(min_ready, now):
            if spare <= 0:
                return False
            spare -= 1
        chosen.append(p)
        return True

    # 4a. More pods of the update revision than replicas (a scale-down).
    for p in sorted(new, key=order)[: max(0, len(new) - b.replicas)]:
        if not take(p):
            break
    if rolling:
        # 4b. Old pods: unhealthy ones first, bounded so that pods that may still become
        # available are kept while the new ones are not available yet; then available ones
        # within the availability budget.
        kept_new = [p for p in new if p not in chosen]
        new_unavailable = sum(1 for p in kept_new if not p.available(min_ready, now)) + creates
        all_pods = len(active) - len(chosen) + creates + refills
        max_scaled_down = all_pods - b.min_available - new_unavailable
        unhealthy = sorted((p for p in old if not p.available(min_ready, now)), key=order)
        chosen.extend(unhealthy[: max(0, max_scaled_down)])
        for p in sorted((p for p in old if p.available(min_ready, now)), key=order):
            if not take(p):
                break
    else:
        # 4c. Paused: only a scale-down, of revisions other than the stable one first.
        rest = [p for p in active if p not in chosen]
        excess = len(rest) - b.replicas
        paused_order = sorted(
            rest, key=lambda p: (p.available(min_ready, now), p.revision == stable, order(p))
        )
        for p in paused_order[: max(0, excess)]:
            if not take(p):
                break

    for p in chosen:
        if desired.drain and p.has_address:
            actions.append(Drain(p.name))
        else:
            actions.append(Delete(p.name, DELETE_NOT_SERVING))
    return Plan(tuple(actions), min(wakes) if wakes else None)
