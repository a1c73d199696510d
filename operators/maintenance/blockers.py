"""Which pods of the draining nodes to evict this round, and what holds each of the others.

One pass over the pods of every draining node, in node order, spending two shared
allowances as it goes: each PodDisruptionBudget's `disruptionsAllowed` (the API server is
still the judge; this only keeps a round from asking for evictions it is sure to refuse)
and each surge-first workload's Ready pods beyond its replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pilotfish.operators.maintenance.budgets import BudgetView
from pilotfish.operators.maintenance.model import (
    NodeView,
    PodRef,
    PodView,
    Spec,
)
from pilotfish.operators.maintenance.reasons import (
    BLOCKER_BATCH,
    BLOCKER_BUDGET,
    BLOCKER_LOCAL_STORAGE,
    BLOCKER_REFUSED,
    BLOCKER_SURGE,
    BLOCKER_TERMINATING,
    BLOCKING,
)
from pilotfish.operators.maintenance.surge import Key, SurgeView


@dataclass(frozen=True)
class Blocker:
    pod: str
    reason: str
    budget: str | None
    message: str

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"pod": self.pod, "reason": self.reason, "message": self.message}
        if self.budget is not None:
            out["budget"] = self.budget
        return out

    def describe(self) -> str:
        """For a condition or an Event: names the pod and, when known, the budget."""
        budget = f", budget {self.budget}" if self.budget else ""
        return f"pod {self.pod} ({self.reason}{budget}): {self.message}"


@dataclass(frozen=True)
class NodeRound:
    """One draining node's round: its evictions and the pods it still waits for."""

    node: str
    evict: tuple[PodRef, ...]
    blockers: tuple[Blocker, ...]
    pods_left: int
    # No eviction except retries of refused ones, and something holds it: the node is
    # blocked (its clock runs in the controller).
    blocked: bool
    wake_after: float | None  # a batch task's deadline


@dataclass
class _Allowance:
    budgets: dict[str, int]
    surge: Mapping[Key, SurgeView]
    taken: dict[Key, set[str]] = field(default_factory=dict)

    def surge_blocker(self, pod: PodView) -> Blocker | None:
        if pod.workload is None or pod.at_most_one or pod.workload not in self.surge:
            return None
        view = self.surge[pod.workload]
        stays = view.ready - self.taken.get(pod.workload, set()) - {pod.key}
        if len(stays) >= view.replicas:
            return None
        ns, name = pod.workload
        return Blocker(
            pod.key,
            BLOCKER_SURGE,
            None,
            f"ServiceWorkload {ns}/{name} would keep {len(stays)} of {view.replicas} replicas "
            "Ready; waiting for a replacement to be Ready elsewhere",
        )

    def budget_blocker(self, pod: PodView, views: Mapping[str, BudgetView]) -> Blocker | None:
        if len(pod.budgets) > 1:
            listed = ", ".join(pod.budgets)
            return Blocker(
                pod.key,
                BLOCKER_BUDGET,
                pod.budgets[0],
                f"selected by more than one budget ({listed}): the API server refuses to "
                "evict it until only one selects it",
            )
        for key in pod.budgets:
            if self.budgets.get(key, 0) <= 0:
                view = views.get(key)
                why = (view.why if view else "") or (
                    f"budget {key} allows no more disruption this round"
                )
                return Blocker(pod.key, BLOCKER_BUDGET, key, why)
        return None

    def take(self, pod: PodView) -> None:
        for key in pod.budgets:
            self.budgets[key] = self.budgets.get(key, 0) - 1
        if pod.workload is not None:
            self.taken.setdefault(pod.workload, set()).add(pod.key)


def _held(
    pod: PodView,
    node: NodeView,
    spec: Spec,
    allowance: _Allowance,
    budgets: Mapping[str, BudgetView],
) -> tuple[Blocker | None, float | None]:
    """The pod's blocker, if any, and when a time-based one lifts."""
    if pod.terminating:
        return Blocker(pod.key, BLOCKER_TERMINATING, None, "evicted, still stopping"), None
    if pod.local_storage and not spec.allow_local_storage:
        return Blocker(
            pod.key,
            BLOCKER_LOCAL_STORAGE,
            None,
            "has emptyDir volumes, lost on eviction; set allowLocalStorage to evict it",
        ), None
    if pod.batch:
        deadline = spec.batch_task_deadline_seconds
        left = deadline - (node.draining_for or 0.0)
        if left > 0:
            # Worded without the time left, so the status does not change every round.
            return Blocker(
                pod.key,
                BLOCKER_BATCH,
                None,
                f"a BatchWorkload task, evicted {deadline:.0f}s after the node began draining "
                "unless it finishes first",
            ), left
    blocker = allowance.budget_blocker(pod, budgets) or allowance.surge_blocker(pod)
    return blocker, None


def plan_node(
    node: NodeView,
    spec: Spec,
    allowance: _Allowance,
    budgets: Mapping[str, BudgetView],
) -> NodeRound:
    evict: list[PodRef] = []
    blockers: list[Blocker] = []
    fresh = 0
    wake: float | None = None
    for pod in sorted(node.pods, key=lambda p: p.key):
        blocker, lifts = _held(pod, node, spec, allowance, budgets)
        if lifts is not None:
            wake = lifts if wake is None else min(wake, lifts)
        if blocker is not None:
            blockers.append(blocker)
            continue
        allowance.take(pod)
        evict.append(pod.ref)
        if pod.refusal is None:
            fresh += 1
        else:
            # Tried again (the controller paces retries), but reported: a budget whose status
            # allows a disruption the API server keeps refusing is a wait nobody sees otherwise.
            blockers.append(
                Blocker(pod.key, BLOCKER_REFUSED, pod.refusal.budget, pod.refusal.message)
            )
    blocked = fresh == 0 and any(b.reason in BLOCKING for b in blockers)
    return NodeRound(node.name, tuple(evict), tuple(blockers), len(node.pods), blocked, wake)


def plan_pods(
    nodes: Sequence[NodeView],
    spec: Spec,
    budgets: Mapping[str, BudgetView],
    surge: Mapping[Key, SurgeView],
) -> list[NodeRound]:
    """The round of each draining node, in the order given; allowances are shared, so an
    earlier node in the order gets the budget first."""
    allowance = _Allowance({k: b.allowed for k, b in budgets.items()}, surge)
    return [plan_node(n, spec, allowance, budgets) for n in nodes]
