"""The names the maintenance controller writes: node states, blocker reasons, Events and
conditions (status values and Event reasons are API: dashboards and alerts match on them)."""

from __future__ import annotations

from typing import Final

from pilotfish.api.nodemaintenance import BLOCKED, COMPLETE

# Node states (status.nodes[].state) and phases (status.phase).
PENDING: Final = "Pending"
CORDONED: Final = "Cordoned"
DRAINING: Final = "Draining"
DRAINED: Final = "Drained"
FAILED: Final = "Failed"
PHASE_DONE: Final = "Done"

# Why a pod is still on its node (status.nodes[].blockers[].reason).
BLOCKER_BUDGET: Final = "DisruptionBudget"
BLOCKER_SURGE: Final = "WaitingForSurge"
BLOCKER_BATCH: Final = "BatchTaskRunning"
BLOCKER_LOCAL_STORAGE: Final = "LocalStorage"
BLOCKER_REFUSED: Final = "EvictionRefused"
BLOCKER_TERMINATING: Final = "Terminating"
# The blockers that hold a drain indefinitely: a node held only by these, with no eviction
# in the round, is blocked (and reported once blockedAfterSeconds have passed). A batch task
# waits a bounded time and a terminating pod is already leaving: neither counts.
BLOCKING: Final = frozenset({BLOCKER_BUDGET, BLOCKER_SURGE, BLOCKER_LOCAL_STORAGE, BLOCKER_REFUSED})

# Events on the NodeMaintenance.
EVENT_DRAIN_STARTED: Final = "DrainStarted"
EVENT_NODE_DRAINED: Final = "NodeDrained"
EVENT_DRAIN_BLOCKED: Final = "DrainBlocked"
EVENT_COMPLETE: Final = "MaintenanceComplete"

# Conditions and their reasons.
CONDITION_BLOCKED: Final = BLOCKED
CONDITION_COMPLETE: Final = COMPLETE
REASON_DRAIN_BLOCKED: Final = "DrainBlocked"
REASON_NOT_BLOCKED: Final = "NotBlocked"
REASON_DRAINED: Final = "Drained"
REASON_IN_PROGRESS: Final = "InProgress"
REASON_NODES_FAILED: Final = "NodesFailed"
