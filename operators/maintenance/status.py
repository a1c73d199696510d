"""The status a round writes, and the Events its transitions post.

Events are derived by comparing with the status as read, not with this process's memory, so
a restart neither repeats nor loses one for a transition the status already records (a
status write that failed after the Event was posted repeats it once: harmless).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish.conditions import set_condition
from pilotfish.operators.maintenance.blockers import Blocker, NodeRound
from pilotfish.operators.maintenance.model import (
    Observed,
)
from pilotfish.operators.maintenance.order import NodeStart
from pilotfish.operators.maintenance.reasons import (
    BLOCKING,
    CONDITION_BLOCKED,
    CONDITION_COMPLETE,
    CORDONED,
    DRAINED,
    DRAINING,
    EVENT_COMPLETE,
    EVENT_DRAIN_BLOCKED,
    EVENT_DRAIN_STARTED,
    EVENT_NODE_DRAINED,
    FAILED,
    PENDING,
    PHASE_DONE,
    REASON_DRAIN_BLOCKED,
    REASON_DRAINED,
    REASON_IN_PROGRESS,
    REASON_NODES_FAILED,
    REASON_NOT_BLOCKED,
)

# Blockers listed per node: enough to name what holds it, bounded so a node of 110 pods
# cannot make the status large (the message counts the rest).
MAX_BLOCKERS: Final = 20


@dataclass(frozen=True)
class EventIntent:
    reason: str
    note: str
    type_: str = "Normal"


def _old_states(status: Mapping[str, Any]) -> dict[str, str]:
    nodes = status.get("nodes")
    entries = nodes if isinstance(nodes, list) else []
    return {str(n.get("name")): str(n.get("state")) for n in entries if isinstance(n, Mapping)}


def _old_condition(status: Mapping[str, Any], type_: str) -> str | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return str(c.get("status"))
    return None


def _node_entry(start: NodeStart, rnd: NodeRound | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": start.view.name, "state": start.state}
    if start.state == FAILED:
        entry["podsLeft"] = 0
    elif rnd is None:
        entry["podsLeft"] = len(start.view.pods)
    else:
        entry["podsLeft"] = rnd.pods_left
    message = start.message
    if rnd is not None:
        shown = rnd.blockers[:MAX_BLOCKERS]
        entry["blockers"] = [b.wire() for b in shown]
        parts = []
        if rnd.evict:
            parts.append(f"evicting {len(rnd.evict)} pods")
        if rnd.blockers:
            parts.append(f"{len(rnd.blockers)} pods waiting")
        if len(rnd.blockers) > len(shown):
            parts.append(f"{len(rnd.blockers) - len(shown)} not listed")
        message = ", ".join(parts) or None
    else:
        entry["blockers"] = []
    if message is not None:
        entry["message"] = message
    return entry


def _phase(states: Sequence[str]) -> str:
    if all(s == DRAINED for s in states):
        return PHASE_DONE
    if all(s in (DRAINED, FAILED) for s in states):
        return FAILED
    if any(s in (DRAINING, CORDONED, DRAINED) for s in states):
        return DRAINING
    return PENDING


def held_by(rnd: NodeRound) -> Blocker | None:
    """The blocker to name for a blocked node: one naming a budget when there is one."""
    holding = [b for b in rnd.blockers if b.reason in BLOCKING]
    return next((b for b in holding if b.budget), holding[0] if holding else None)


def _node_events(obs: Observed, starts: Sequence[NodeStart]) -> list[EventIntent]:
    before = _old_states(obs.status)
    why = f" ({obs.spec.reason})" if obs.spec.reason else ""
    events = []
    for start in starts:
        name, was = start.view.name, before.get(start.view.name)
        if start.state in (DRAINING, CORDONED) and was not in (DRAINING, CORDONED):
            note = f"draining node {name}, {len(start.view.pods)} pods{why}"
            events.append(EventIntent(EVENT_DRAIN_STARTED, note))
        if start.state == DRAINED and was != DRAINED:
            events.append(EventIntent(EVENT_NODE_DRAINED, f"node {name} drained{why}"))
    return events


def _conditions(
    obs: Observed,
    starts: Sequence[NodeStart],
    rounds: Mapping[str, NodeRound],
    overdue: Sequence[str],
) -> tuple[list[dict[str, Any]], list[EventIntent]]:
    raw = obs.status.get("conditions")
    conditions: list[Any] = raw if isinstance(raw, list) else []
    events: list[EventIntent] = []

    def condition(type_: str, value: str, reason: str, message: str) -> dict[str, Any]:
        return set_condition(conditions, type_, value, reason, message, obs.generation, obs.now)

    if overdue:
        blocker = held_by(rounds[overdue[0]])
        what = blocker.describe() if blocker else "no pod can be evicted"
        more = f" (and {len(overdue) - 1} more nodes)" if len(overdue) > 1 else ""
        seconds = obs.spec.blocked_after_seconds
        message = f"node {overdue[0]} blocked for {seconds:.0f}s or more{more}: {what}"
        blocked = condition(CONDITION_BLOCKED, "True", REASON_DRAIN_BLOCKED, message)
        if _old_condition(obs.status, CONDITION_BLOCKED) != "True":
            events.append(EventIntent(EVENT_DRAIN_BLOCKED, message, "Warning"))
    else:
        blocked = condition(CONDITION_BLOCKED, "False", REASON_NOT_BLOCKED, "no drain is blocked")

    total = len(starts)
    drained = sum(s.state == DRAINED for s in starts)
    failed = [s.view.name for s in starts if s.state == FAILED]
    so_far = f"{drained} of {total} nodes drained"
    if drained == total:
        message = f"all {total} nodes drained"
        complete = condition(CONDITION_COMPLETE, "True", REASON_DRAINED, message)
        if _old_condition(obs.status, CONDITION_COMPLETE) != "True":
            events.append(EventIntent(EVENT_COMPLETE, message))
    elif failed:
        message = f"{so_far}; failed: {', '.join(failed)}"
        complete = condition(CONDITION_COMPLETE, "False", REASON_NODES_FAILED, message)
    else:
        complete = condition(CONDITION_COMPLETE, "False", REASON_IN_PROGRESS, so_far)
    return [blocked, complete], events


def build(
    obs: Observed,
    starts: Sequence[NodeStart],
    rounds: Mapping[str, NodeRound],
    overdue: Sequence[str],
) -> tuple[dict[str, Any], list[EventIntent]]:
    """The wire status and the Events of the transitions since the status read, nodes'
    first. `overdue`: the nodes blocked for blockedAfterSeconds or longer, in spec order."""
    conditions, events = _conditions(obs, starts, rounds, overdue)
    states = [s.state for s in starts]
    status: dict[str, Any] = {
        "phase": _phase(states),
        "progress": f"{states.count(DRAINED)}/{len(states)}",
        "nodes": [_node_entry(s, rounds.get(s.view.name)) for s in starts],
        "conditions": conditions,
    }
    if obs.generation is not None:
        status["observedGeneration"] = obs.generation
    return status, [*_node_events(obs, starts), *events]
